#include "logits.h"

#include "cpu.h"
#include "vec-math.h"

#include <algorithm>
#include <cmath>
#include <limits>

// Why native: numpy's argpartition took 1.2 ms a row on average over a beam search (6.3 ms on a row whose
// 50 257 text logits the timestamp rule had set to -inf: introselect degrades on equal keys), and the
// float64 log-sum-exp beside it another 0.1 ms; a beam-5 step scans 5 rows (2026-12-01, AMD EPYC Zen 4).
// Here one scalar pass keeps the k best and one vector pass sums the exponentials: ~40 us a row.
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

}  // namespace

void top_logprobs(const float * row, int64_t n_vocab, int k, int32_t * ids, double * logprobs, double * log_norm) {
    // best[0..k) sorted by logit, descending; ids in order of arrival break ties (strict >).
    float best[64];
    const int kk = std::min<int64_t>(k, n_vocab);
    for (int j = 0; j < kk; ++j) {
        best[j] = -std::numeric_limits<float>::infinity();
        ids[j] = j;
    }
    for (int64_t i = 0; i < n_vocab; ++i) {
        const float v = row[i];
        if (!(v > best[kk - 1])) continue;  // also skips NaN
        int j = kk - 1;
        for (; j > 0 && v > best[j - 1]; --j) {
            best[j] = best[j - 1];
            ids[j] = ids[j - 1];
        }
        best[j] = v;
        ids[j] = static_cast<int32_t>(i);
    }
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
