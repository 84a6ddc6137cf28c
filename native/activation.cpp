#include "activation.h"

#include "cpu.h"

#include "vec-math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

// x86-64 builds target the baseline ISA (SSE2) unless GGML_NATIVE-style flags are given: the hot loop is
// compiled for AVX-512 and AVX2 as well, and gelu_erf_op runs the widest that kernel_isa() allows (cpu.h),
// so a capped CPU level runs no wider code. Elsewhere (arm64: NEON is the baseline) the plain loop
// vectorises as it is.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AURAL_X86_CLONES 1
#endif

namespace aural {

namespace {

// y = GELU(x) elementwise. erfc(|z|), z = x / sqrt 2, by Abramowitz & Stegun 7.1.26 (absolute error
// <= 1.5e-7): t = 1 / (1 + p|z|), erfc = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^-z^2. Then
// 1 + erf(z) = 2 - erfc for x >= 0 and erfc for x < 0, which keeps the small negative tail exact instead
// of cancelling 1 - 0.99999. Largest error against a double-precision GELU over [-12, 12]: 4.2e-7 at
// x = 3.1 (one f32 ulp there); libm's erff in the same formula: 4.5e-7.
inline __attribute__((always_inline)) void gelu_erf_span(float * y, const float * x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float z = std::fabs(v) * 0.707106781f;
        const float t = 1.0f / (1.0f + 0.3275911f * z);
        const float poly =
            t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
        // Past z^2 = 80 (|x| > 12.6) the tail is below 1e-35: make it 0 rather than let the product reach the
        // subnormal range, where the next matrix product's FMAs take microcode assists (3x slower encoder).
        const float erfc = z * z < 80.0f ? poly * exp_neg(z * z) : 0.0f;
        y[i] = 0.5f * v * (v >= 0.0f ? 2.0f - erfc : erfc);
    }
}

#ifdef AURAL_X86_CLONES
__attribute__((target("avx512f"))) void gelu_erf_avx512(float * y, const float * x, int64_t n) {
    gelu_erf_span(y, x, n);
}
__attribute__((target("avx2,fma"))) void gelu_erf_avx2(float * y, const float * x, int64_t n) {
    gelu_erf_span(y, x, n);
}
#endif

void gelu_erf_widest(float * y, const float * x, int64_t n) {
#ifdef AURAL_X86_CLONES
    if (kernel_isa() >= isa::avx512) return gelu_erf_avx512(y, x, n);
    if (kernel_isa() >= isa::avx2) return gelu_erf_avx2(y, x, n);
#endif
    gelu_erf_span(y, x, n);
}

// ggml custom op: thread ith of nth takes one contiguous span of the elements, in whole cache lines.
void gelu_erf_op(ggml_tensor * dst, const ggml_tensor * a, int ith, int nth, void * /*userdata*/) {
    const int64_t n = ggml_nelements(a);
    const int64_t per = ((n + nth - 1) / nth + 15) / 16 * 16;
    const int64_t begin = std::min(n, per * ith), end = std::min(n, begin + per);
    gelu_erf_widest(static_cast<float *>(dst->data) + begin, static_cast<const float *>(a->data) + begin, end - begin);
}

}  // namespace

ggml_tensor * gelu_erf(ggml_context * ctx, ggml_tensor * x, bool simd) {
    if (!simd || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x)) {
        return ggml_gelu_erf(ctx, x);
    }
    return ggml_map_custom1(ctx, x, gelu_erf_op, GGML_N_TASKS_MAX, nullptr);
}

}  // namespace aural
