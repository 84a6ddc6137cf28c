// What a decoding step needs from one row of decoder logits, on the host: Whisper's logit rules applied to
// it, then its k most probable tokens and their log-probabilities (a greedy step: k = 1; a beam-search
// step: k = beams + 1 per beam).
//
//   logit_rules rules;  // filled once per window from the decoding options (bindings: LogitRules)
//   rules.check();      // throws std::invalid_argument on an id outside the vocabulary
//   apply_rules(rules, sampled, n_sampled, row);           // row: n_vocab f32, masked in place
//   top_logprobs(row, n_vocab, k, ids, logprobs, &log_norm);
//
// Pure functions of their arguments, safe from any thread. log_norm = log sum_i e^row[i], so any token's
// log-probability is row[t] - log_norm; -inf when every logit is -inf (ids then hold the first k tokens).
// Ties keep the lower token id first, so the result does not depend on the order of a selection algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace aural {

// Whisper's logit filters, in openai-whisper's order (ref: decoding.py SuppressBlank, SuppressTokens,
// ApplyTimestampRules): each sets forbidden tokens' logits to -inf given the tokens sampled so far in the
// window (the prompt excluded).
struct logit_rules {
    int64_t n_vocab = 0;
    std::vector<int32_t> blank;       // forbidden while nothing is sampled (space and end of text); empty: off
    std::vector<int32_t> suppressed;  // forbidden at every step
    bool timestamps = false;          // the timestamp grammar below, on the ids that follow:
    int32_t eot = -1;                 // end of text; text tokens are the ids below it
    int32_t timestamp_begin = -1;     // <|0.00|>; every id from here on is a timestamp
    int32_t no_timestamps = -1;       // <|notimestamps|>, never sampled
    int32_t max_initial_timestamp = -1;  // the first timestamp's highest index (<|0.00|> = 0); < 0: no cap

    void check() const;
};

// With timestamps on (ref: ApplyTimestampRules): timestamps come in pairs (after a lone one only a
// timestamp or end of text, after a pair only text), never decrease, and a segment after a pair is longer
// than zero; the first sampled token is a timestamp no later than max_initial_timestamp; and when the
// timestamps together are likelier than the best text token, a timestamp is sampled. That last rule
// compares log-sum-exp of the timestamp logits (sum_exp's rounding, ~2.4e-6 relative) with the best text
// logit: the softmax normaliser cancels on both sides, so no pass over the vocabulary's log-probabilities.
void apply_rules(const logit_rules & rules, const int32_t * sampled, size_t n_sampled, float * row);

// ids, logprobs: k entries each, best first; 1 <= k <= 64, k <= n_vocab.
void top_logprobs(const float * row, int64_t n_vocab, int k, int32_t * ids, double * logprobs, double * log_norm);

}  // namespace aural
