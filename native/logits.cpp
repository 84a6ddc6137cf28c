#include "logits.h"

#include "cpu.h"
#include "vec-math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

// Why native: numpy's argpartition took 1.2 ms a row on average over a beam search (6.3 ms on a row whose
// 50 257 text logits the timestamp rule had set to -inf: introselect degrades on equal keys), and the
// float64 log-sum-exp beside it another 0.1 ms; a beam-5 step scans 5 rows (2026-12-01, AMD EPYC Zen 4).
// The rules were NumPy too until 2026-12-02: ~60 us a row in a dozen array calls, which with the Python
// around them made 0.35 ms of a greedy token and 1.5 ms of a beam-5 step on a Zen 2 (bench/results/
// peers-tiny.en-native-zen2.md). Here the rules are a few masked ranges, one vector pass finds the best
// text logit, a blocked pass keeps the k best and one vector pass sums the exponentials.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AURAL_X86_CLONES 1
#endif

namespace aural {

namespace {

// sum_i e^(x_i - top). The exponentials are f32 (exp_neg: a few f32 ulp each). They are added in f32 vector
// lanes over blocks of 256 (16 terms per AVX-512 lane, 32 per AVX2 lane) and the blocks in f64, so the
// rounding of the sum stays within about 40 f32 ulp (~2.4e-6 relative) however long the vocabulary: a
// log-probability error of that size, against the gaps of ~1e-2 and more that decide between beams.
// A logit more than 87 below the top (or -inf) adds e^-87 ~ 1.6e-38 instead of 0 (exp_neg's clamp):
// under 1e-33 over the vocabulary, against a sum of at least 1 (the top term).
inline __attribute__((always_inline)) double sum_exp_span(const float * x, int64_t n, float top) {
    constexpr int64_t block = 256;
    double sum = 0.0;
    for (int64_t begin = 0; begin < n; begin += block) {
        const int64_t end = std::min(n, begin + block);
        float part = 0.0f;
        // The reduction clause lets the compiler add in vector lanes (-fopenmp-simd: the pragma alone, no
        // OpenMP run time); IEEE order would otherwise keep the loop scalar. (An f64 accumulator here does
        // not vectorise with GCC 12: the f32-to-f64 widening in a reduction.)
#pragma omp simd reduction(+ : part)
        for (int64_t i = begin; i < end; ++i) {
            part += exp_neg(top - x[i]);
        }
        sum += part;
    }
    return sum;
}

#ifdef AURAL_X86_CLONES
__attribute__((target("avx512f"))) double sum_exp_avx512(const float * x, int64_t n, float top) {
    return sum_exp_span(x, n, top);
}
__attribute__((target("avx2,fma"))) double sum_exp_avx2(const float * x, int64_t n, float top) {
    return sum_exp_span(x, n, top);
}
#endif

double sum_exp_widest(const float * x, int64_t n, float top) {
#ifdef AURAL_X86_CLONES
    if (kernel_isa() >= isa::avx512) return sum_exp_avx512(x, n, top);
    if (kernel_isa() >= isa::avx2) return sum_exp_avx2(x, n, top);
#endif
    return sum_exp_span(x, n, top);
}

// max_i x_i, -inf for n = 0; a NaN never wins (the comparison keeps the running maximum, as MAXPS does).
inline __attribute__((always_inline)) float max_span(const float * x, int64_t n) {
    float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
    for (int64_t i = 0; i < n; ++i) {
        top = x[i] > top ? x[i] : top;
    }
    return top;
}

#ifdef AURAL_X86_CLONES
__attribute__((target("avx512f"))) float max_avx512(const float * x, int64_t n) { return max_span(x, n); }
__attribute__((target("avx2,fma"))) float max_avx2(const float * x, int64_t n) { return max_span(x, n); }
#endif

float max_widest(const float * x, int64_t n) {
#ifdef AURAL_X86_CLONES
    if (kernel_isa() >= isa::avx512) return max_avx512(x, n);
    if (kernel_isa() >= isa::avx2) return max_avx2(x, n);
#endif
    return max_span(x, n);
}

// Keeps the kk best of x[0..n) in best/ids (sorted descending, ids in order of arrival break ties: strict >).
// Blocks of 64 whose maximum does not beat the k-th best so far are skipped after one vector pass: past the
// first blocks that is nearly all of them, so the scan runs at the vector max's speed.
inline __attribute__((always_inline)) void keep_best_span(const float * x, int64_t n, int kk, float * best,
                                                         int32_t * ids) {
    constexpr int64_t block = 64;
    for (int64_t begin = 0; begin < n; begin += block) {
        const int64_t end = std::min(n, begin + block);
        if (!(max_span(x + begin, end - begin) > best[kk - 1])) continue;
        for (int64_t i = begin; i < end; ++i) {
            const float v = x[i];
            if (!(v > best[kk - 1])) continue;  // also skips NaN
            int j = kk - 1;
            for (; j > 0 && v > best[j - 1]; --j) {
                best[j] = best[j - 1];
                ids[j] = ids[j - 1];
            }
            best[j] = v;
            ids[j] = static_cast<int32_t>(i);
        }
    }
}

#ifdef AURAL_X86_CLONES
__attribute__((target("avx512f"))) void keep_best_avx512(const float * x, int64_t n, int kk, float * best,
                                                         int32_t * ids) {
    keep_best_span(x, n, kk, best, ids);
}
__attribute__((target("avx2,fma"))) void keep_best_avx2(const float * x, int64_t n, int kk, float * best,
                                                       int32_t * ids) {
    keep_best_span(x, n, kk, best, ids);
}
#endif

void keep_best(const float * x, int64_t n, int kk, float * best, int32_t * ids) {
#ifdef AURAL_X86_CLONES
    if (kernel_isa() >= isa::avx512) return keep_best_avx512(x, n, kk, best, ids);
    if (kernel_isa() >= isa::avx2) return keep_best_avx2(x, n, kk, best, ids);
#endif
    keep_best_span(x, n, kk, best, ids);
}

// x[begin..end) = -inf, the range clamped to [0, n).
void forbid(float * x, int64_t n, int64_t begin, int64_t end) {
    begin = std::max<int64_t>(begin, 0);
    end = std::min(end, n);
    if (begin < end) std::fill(x + begin, x + end, -std::numeric_limits<float>::infinity());
}

}  // namespace

void logit_rules::check() const {
    if (n_vocab <= 0) throw std::invalid_argument("logit rules: the vocabulary is empty");
    auto in_vocab = [this](int32_t id) { return id >= 0 && id < n_vocab; };
    for (const auto * ids : {&blank, &suppressed}) {
        if (!std::all_of(ids->begin(), ids->end(), in_vocab)) {
            throw std::invalid_argument("logit rules: a forbidden token id is outside the vocabulary");
        }
    }
    const bool grammar_ok =
        in_vocab(eot) && in_vocab(timestamp_begin) && in_vocab(no_timestamps) && eot < timestamp_begin;
    if (timestamps && !grammar_ok) {
        throw std::invalid_argument("logit rules: end of text, <|notimestamps|> and <|0.00|> must be vocabulary "
                                    "ids, with end of text before the timestamps");
    }
}

void apply_rules(const logit_rules & r, const int32_t * sampled, size_t n_sampled, float * row) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const int64_t n = r.n_vocab;
    if (n_sampled == 0) {
        for (int32_t id : r.blank) row[id] = neg_inf;
    }
    for (int32_t id : r.suppressed) row[id] = neg_inf;
    if (!r.timestamps) return;
    const int32_t ts = r.timestamp_begin;
    row[r.no_timestamps] = neg_inf;
    const bool last_was_ts = n_sampled >= 1 && sampled[n_sampled - 1] >= ts;
    const bool penultimate_was_ts = n_sampled < 2 || sampled[n_sampled - 2] >= ts;
    if (last_was_ts) {
        if (penultimate_was_ts) {
            forbid(row, n, ts, n);  // a pair just closed: text must follow
        } else {
            forbid(row, n, 0, r.eot);  // a lone timestamp: close the pair or end
        }
    }
    // Timestamps never decrease, so the last one sampled is the latest. A lone one may be repeated to
    // close its pair; after a pair the next must be strictly later.
    for (size_t i = n_sampled; i-- > 0;) {
        if (sampled[i] >= ts) {
            forbid(row, n, ts, last_was_ts && !penultimate_was_ts ? sampled[i] : sampled[i] + 1);
            break;
        }
    }
    if (n_sampled == 0) {
        forbid(row, n, 0, ts);
        if (r.max_initial_timestamp >= 0) forbid(row, n, int64_t{ts} + r.max_initial_timestamp + 1, n);
    }
    const float best_stamp = max_widest(row + ts, n - ts);
    if (!(best_stamp > neg_inf)) return;  // no timestamp allowed: nothing to compare
    const double stamps = static_cast<double>(best_stamp) + std::log(sum_exp_widest(row + ts, n - ts, best_stamp));
    if (stamps > static_cast<double>(max_widest(row, ts))) forbid(row, n, 0, ts);
}

void top_logprobs(const float * row, int64_t n_vocab, int k, int32_t * ids, double * logprobs, double * log_norm) {
    float best[64];
    const int kk = std::min<int64_t>(k, n_vocab);
    for (int j = 0; j < kk; ++j) {
        best[j] = -std::numeric_limits<float>::infinity();
        ids[j] = j;
    }
    keep_best(row, n_vocab, kk, best, ids);
    const float top = best[0];
    if (!std::isfinite(top)) {
        *log_norm = -std::numeric_limits<double>::infinity();
        std::fill(logprobs, logprobs + kk, -std::numeric_limits<double>::infinity());
        return;
    }
    const double norm = static_cast<double>(top) + std::log(sum_exp_widest(row, n_vocab, top));
    *log_norm = norm;
    for (int j = 0; j < kk; ++j) {
        logprobs[j] = static_cast<double>(best[j]) - norm;
    }
}

}  // namespace aural
