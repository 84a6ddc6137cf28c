// The k most probable tokens of rows of logits and their log-probabilities: what a beam-search step (k =
// beams + 1 per beam) and a greedy step (k = 1) need from the vocabulary, in one pass each, on the host.
//
//   top_logprobs(row, n_vocab, k, ids, logprobs, &log_norm);  // row: n_vocab f32, already filtered
//
// Pure function of its arguments, safe from any thread. log_norm = log sum_i e^row[i], so any token's
// log-probability is row[t] - log_norm; -inf when every logit is -inf (ids then hold the first k tokens).
// Ties keep the lower token id first, so the result does not depend on the order of a selection algorithm.
#pragma once

#include <cstdint>

namespace aural {

// ids, logprobs: k entries each, best first; 1 <= k <= n_vocab.
void top_logprobs(const float * row, int64_t n_vocab, int k, int32_t * ids, double * logprobs, double * log_norm);

}  // namespace aural
