#include "transpose.h"

#include "cpu.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AURAL_TRANSPOSE_KERNEL 1
#endif

namespace aural {

#if AURAL_TRANSPOSE_KERNEL
namespace {

#define AURAL_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

// Rows r[0..8) of an 8 x 8 tile, transposed in registers (unpacks within 128-bit lanes, then across lanes).
AURAL_AVX2_F16C inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

AURAL_AVX2_F16C inline void store8(float * p, __m256 v) { _mm256_storeu_ps(p, v); }
AURAL_AVX2_F16C inline void store8(ggml_fp16_t * p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i *>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
AURAL_AVX2_F16C inline void store1(float * p, float v) { *p = v; }
AURAL_AVX2_F16C inline void store1(ggml_fp16_t * p, float v) {
    *p = static_cast<ggml_fp16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}

// Output rows [i0, i1) of y [b, a] (row i: column i of x), y's rows `ld` elements apart: 8 rows at a time
// while 8 are left, then one by one (a window of n_ctx positions transposed back: n_ctx need not be a
// multiple of 8).
template <class T>
AURAL_AVX2_F16C void transpose_rows(const char * x, int64_t x_stride, int64_t b, T * y, int64_t ld, int64_t i0,
                                    int64_t i1) {
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        int64_t j = 0;
        for (; j + 8 <= b; j += 8) {
            __m256 r[8];
            for (int k = 0; k < 8; ++k) {
                r[k] = _mm256_loadu_ps(reinterpret_cast<const float *>(x + (j + k) * x_stride) + i);
            }
            transpose8(r);
            for (int k = 0; k < 8; ++k) {
                store8(y + (i + k) * ld + j, r[k]);
            }
        }
        for (; j < b; ++j) {  // positions past the last whole tile
            const float * row = reinterpret_cast<const float *>(x + j * x_stride) + i;
            for (int k = 0; k < 8; ++k) {
                store1(y + (i + k) * ld + j, row[k]);
            }
        }
    }
    for (; i < i1; ++i) {
        for (int64_t j = 0; j < b; ++j) {
            store1(y + i * ld + j, reinterpret_cast<const float *>(x + j * x_stride)[i]);
        }
    }
}

// Thread ith of nth: a contiguous run of 8-row groups of the output (the last group may be shorter).
void transpose_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[0];
    const int64_t a = x->ne[0], b = x->ne[1], groups = (a + 7) / 8;
    const int64_t i0 = groups * ith / nth * 8, i1 = std::min(a, groups * (ith + 1) / nth * 8);
    const auto * xd = static_cast<const char *>(x->data);
    if (dst->type == GGML_TYPE_F16) {
        transpose_rows(xd, x->nb[1], b, static_cast<ggml_fp16_t *>(dst->data), b, i0, i1);
    } else {
        transpose_rows(xd, x->nb[1], b, static_cast<float *>(dst->data), b, i0, i1);
    }
}

}  // namespace

// F16C as well: the f16 stores use it (every AVX2 CPU so far has it; attention.cpp's cross op asks the same).
bool transpose_available() { return kernel_isa() >= isa::avx2 && __builtin_cpu_supports("f16c"); }

ggml_tensor * transpose(ggml_context * ctx, ggml_tensor * x, ggml_type type) {
    if (!transpose_available() || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || x->ne[2] != 1 ||
        x->ne[3] != 1 || (type != GGML_TYPE_F32 && type != GGML_TYPE_F16)) {
        throw std::invalid_argument("transpose: needs AVX2 and F16C, a 2-D f32 matrix with contiguous rows and an "
                                    "f32 or f16 result");
    }
    ggml_tensor * args[] = {x};
    return ggml_custom_4d(ctx, type, x->ne[1], x->ne[0], 1, 1, args, 1, transpose_op, GGML_N_TASKS_MAX, nullptr);
}

#else

bool transpose_available() { return false; }

ggml_tensor * transpose(ggml_context *, ggml_tensor *, ggml_type) {
    throw std::invalid_argument("transpose: x86-64 only");
}

#endif

}  // namespace aural
