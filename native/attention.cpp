#include "attention.h"

#include "cpu.h"

#include "vec-math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AURAL_X86_KERNELS 1
// GCC 12's avx512fintrin.h merges unmasked results into _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports at every inlined use (_mm512_cvtph_ps, _mm512_reduce_add_ps, _mm512_shuffle_f32x4): not a real read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define AURAL_INLINE inline __attribute__((always_inline))
// GCC notes that passing 256/512-bit vectors by value depends on the ISA. The helpers taking them are always
// inlined into one entry point per ISA, so no vector crosses a real call.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace aural {

#ifdef AURAL_X86_KERNELS

namespace {

// W floats in one register (16: AVX-512, 8: AVX2). The kernels below are written once on GCC/Clang vector
// types and inlined into one entry point per ISA (target attributes), which compiles them for that width.
// (A dependent vector_size on an alias template is dropped by GCC, hence one typedef per width.)
template <int W>
struct vec_of;
template <>
struct vec_of<16> {
    typedef float type __attribute__((vector_size(64)));
};
template <>
struct vec_of<8> {
    typedef float type __attribute__((vector_size(32)));
};
template <int W>
using vec = typename vec_of<W>::type;

template <int W>
AURAL_INLINE vec<W> load(const float * p) {
    vec<W> v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <int W>
AURAL_INLINE void store(float * p, const vec<W> & v) {
    std::memcpy(p, &v, sizeof v);
}

// One register tile: C[r][0, 2W) = sum_k A[r][k] B[k][0, 2W) for r < R (row strides lda, ldb, ldc floats).
// 2R accumulators stay in registers; each k costs two loads of B, R broadcasts of A and 2R FMAs.
template <int W, int R>
AURAL_INLINE void tile(const float * a, int64_t lda, const float * b, int64_t ldb, int64_t k_len, float * c,
                       int64_t ldc) {
    vec<W> acc[R][2] = {};
    for (int64_t k = 0; k < k_len; ++k) {
        const vec<W> b0 = load<W>(b + k * ldb), b1 = load<W>(b + k * ldb + W);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const float ar = a[r * lda + k];
            acc[r][0] += ar * b0;
            acc[r][1] += ar * b1;
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        store<W>(c + r * ldc, acc[r][0]);
        store<W>(c + r * ldc + W, acc[r][1]);
    }
}

// C[rows][0, 2W) as above, R rows at a time and the rest one by one.
template <int W, int R>
AURAL_INLINE void tile_rows(int64_t rows, const float * a, int64_t lda, const float * b, int64_t ldb, int64_t k_len,
                            float * c, int64_t ldc) {
    int64_t r = 0;
    for (; r + R <= rows; r += R) {
        tile<W, R>(a + r * lda, lda, b, ldb, k_len, c + r * ldc, ldc);
    }
    for (; r < rows; ++r) {
        tile<W, 1>(a + r * lda, lda, b, ldb, k_len, c + r * ldc, ldc);
    }
}

struct shapes {
    int64_t n_state, n, head_dim;
};

// Query rows per task: their scores, about 32 x n floats, stay in L2. A whole number of R-row tiles, as a
// row left over runs one-row tiles, whose two FMA chains wait on each other's latency: at R = 6 (AVX2) the
// 2 rows left of 32 took 15 % of base's encoder attention (perf, Zen 3). 30 also divides 1500.
template <int R>
constexpr int64_t block_rows = 32 / R * R;

// Scores s[r][j] = q_r . k_j for the block's rows (unscaled), row stride ld >= n rounded up to 2W. The last
// partial panel of positions is copied into a zero-padded panel so that every tile is whole.
template <int W, int R>
AURAL_INLINE void scores(const shapes & s, int64_t rows, const float * q, const float * kt, float * out, int64_t ld) {
    constexpr int64_t P = 2 * W;
    const int64_t full = s.n / P * P;
    for (int64_t c = 0; c < full; c += P) {
        tile_rows<W, R>(rows, q, s.n_state, kt + c, s.n, s.head_dim, out + c, ld);
    }
    if (full < s.n) {
        std::vector<float> panel(static_cast<size_t>(s.head_dim * P), 0.0f);
        for (int64_t d = 0; d < s.head_dim; ++d) {
            std::memcpy(panel.data() + d * P, kt + d * s.n + full, sizeof(float) * (s.n - full));
        }
        tile_rows<W, R>(rows, q, s.n_state, panel.data(), P, s.head_dim, out + full, ld);
    }
}

// Largest and sum of p[0, n): W lanes at a time, then the tail (a float reduction does not vectorise by
// itself: the compiler may not reorder the additions).
template <int W>
AURAL_INLINE float row_max(const float * p, int64_t n) {
    float mx = p[0];
    int64_t j = 0;
    if (n >= W) {
        vec<W> m = load<W>(p);
        for (j = W; j + W <= n; j += W) {
            const vec<W> x = load<W>(p + j);
            m = m > x ? m : x;
        }
        for (int l = 0; l < W; ++l) {
            mx = std::max(mx, m[l]);
        }
    }
    for (; j < n; ++j) {
        mx = std::max(mx, p[j]);
    }
    return mx;
}

template <int W>
AURAL_INLINE float row_sum(const float * p, int64_t n) {
    vec<W> acc = {};
    int64_t j = 0;
    for (; j + W <= n; j += W) {
        acc += load<W>(p + j);
    }
    float sum = 0.0f;
    for (int l = 0; l < W; ++l) {
        sum += acc[l];
    }
    for (; j < n; ++j) {
        sum += p[j];
    }
    return sum;
}

// In place: p[j] = e^(scale (s[j] - max s)) over j < n; returns the row's sum.
template <int W>
AURAL_INLINE float softmax_numerators(float * p, int64_t n, float scale) {
    const float mx = row_max<W>(p, n);
    for (int64_t j = 0; j < n; ++j) {
        p[j] = exp_neg(scale * (mx - p[j]));
    }
    return row_sum<W>(p, n);
}

// Thread ith of nth: tasks are (head, block of query rows), dealt round-robin.
template <int W, int R>
AURAL_INLINE void attend(ggml_tensor * dst, const ggml_tensor * q, const ggml_tensor * kt, const ggml_tensor * v,
                         int n_head, int ith, int nth) {
    const shapes s = {q->ne[0], q->ne[1], q->ne[0] / n_head};
    const int64_t ld = (s.n + 2 * W - 1) / (2 * W) * (2 * W);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    constexpr int64_t block = block_rows<R>;
    const int64_t n_blocks = (s.n + block - 1) / block;

    thread_local std::vector<float> buf;  // ggml's worker threads persist: allocated once per thread
    buf.resize(static_cast<size_t>(block * ld));
    float sums[block];
    // The head's V rows, copied contiguous ([n, head_dim]) when a task starts a new head. In v they are
    // head_dim floats n_state floats apart: at base's n_state of 512 that is 2 KiB, a power of two, so a head's
    // 1500 rows fall into an eighth of the cache sets and evict each other while the block's rows sum them.
    thread_local std::vector<float> v_head;
    v_head.resize(static_cast<size_t>(s.n * s.head_dim));
    int64_t v_head_of = -1;

    const auto * qd = static_cast<const float *>(q->data);
    const auto * ktd = static_cast<const float *>(kt->data);
    const auto * vd = static_cast<const float *>(v->data);
    auto * od = static_cast<float *>(dst->data);
    for (int64_t task = ith; task < n_head * n_blocks; task += nth) {
        const int64_t h = task / n_blocks, i0 = task % n_blocks * block;
        const int64_t rows = std::min(block, s.n - i0);
        const int64_t col = h * s.head_dim;  // the head's first column in q, v and out; its first row in kt
        scores<W, R>(s, rows, qd + i0 * s.n_state + col, ktd + col * s.n, buf.data(), ld);
        for (int64_t r = 0; r < rows; ++r) {
            sums[r] = softmax_numerators<W>(buf.data() + r * ld, s.n, scale);
        }
        if (h != v_head_of) {
            for (int64_t j = 0; j < s.n; ++j) {
                std::memcpy(v_head.data() + j * s.head_dim, vd + j * s.n_state + col, sizeof(float) * s.head_dim);
            }
            v_head_of = h;
        }
        float * out = od + i0 * s.n_state + col;
        for (int64_t c = 0; c < s.head_dim; c += 2 * W) {
            tile_rows<W, R>(rows, buf.data(), ld, v_head.data() + c, s.head_dim, s.n, out + c, s.n_state);
        }
        for (int64_t r = 0; r < rows; ++r) {
            const float inv = 1.0f / sums[r];
            for (int64_t c = 0; c < s.head_dim; ++c) {
                out[r * s.n_state + c] *= inv;
            }
        }
    }
}

// Register budgets: AVX-512 has 32 vector registers (8 rows: 16 accumulators), AVX2 16 (6 rows: 12).
__attribute__((target("avx512f,fma"))) void attend_avx512(ggml_tensor * dst, const ggml_tensor * q,
                                                          const ggml_tensor * kt, const ggml_tensor * v,
                                                          int n_head, int ith, int nth) {
    attend<16, 8>(dst, q, kt, v, n_head, ith, nth);
}

__attribute__((target("avx2,fma"))) void attend_avx2(ggml_tensor * dst, const ggml_tensor * q, const ggml_tensor * kt,
                                                     const ggml_tensor * v, int n_head, int ith, int nth) {
    attend<8, 6>(dst, q, kt, v, n_head, ith, nth);
}

void attention_op(ggml_tensor * dst, const ggml_tensor * q, const ggml_tensor * kt, const ggml_tensor * v, int ith,
                  int nth, void * userdata) {
    const int n_head = static_cast<int>(reinterpret_cast<intptr_t>(userdata));
    if (kernel_isa() >= isa::avx512) {
        attend_avx512(dst, q, kt, v, n_head, ith, nth);
    } else {
        attend_avx2(dst, q, kt, v, n_head, ith, nth);
    }
}

// ------------------------------------------------------------------------------------------------------------
// The decoder's cross-attention: a few query rows (one per beam, or a prompt) over the window's f16 cross K/V.
// ggml's three ops spend most of their time in 64-long f16 dot calls (one per position, row and head) and
// round q and the softmaxed weights to f16 on the way; here each K row is converted once per step and dotted
// with every query row in registers, and the weights stay f32.

// The ISA-specific pieces, as plain inline functions with their target: the kernel template calls them
// without a target of its own and is compiled into each entry point below, whose `flatten` inlines them there
// (an always_inline call across a target mismatch would not compile).
// [sum(a), sum(b), sum(c), sum(d)] of four 8-float vectors: two rounds of horizontal adds leave each 128-bit
// half holding the four half-sums, then the halves are added. Both ISAs' sum4 end here.
__attribute__((target("avx"))) inline __m128 sum4_of_8(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

struct f16_avx512 {
    static constexpr int W = 16, n_regs = 32;  // floats per vector, vector registers
    using V = __m512;
    __attribute__((target("avx512f"))) static inline V half(const ggml_fp16_t * p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
    }
    __attribute__((target("avx512f"))) static inline V load(const float * p) { return _mm512_loadu_ps(p); }
    __attribute__((target("avx512f"))) static inline V zero() { return _mm512_setzero_ps(); }
    __attribute__((target("avx512f"))) static inline float sum(V v) { return _mm512_reduce_add_ps(v); }
    __attribute__((target("avx512f"))) static inline V broadcast(float x) { return _mm512_set1_ps(x); }
    __attribute__((target("avx512f"))) static inline void store(float * p, V v) { _mm512_storeu_ps(p, v); }
    __attribute__((target("avx512f,f16c"))) static inline float scalar(ggml_fp16_t h) { return _cvtsh_ss(h); }
    // [sum(a), sum(b), sum(c), sum(d)]: each folded to 8 lanes, then sum4_of_8.
    __attribute__((target("avx512f"))) static inline __m256 fold(V x) {
        return _mm512_castps512_ps256(_mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2))));
    }
    __attribute__((target("avx512f"))) static inline __m128 sum4(V a, V b, V c, V d) {
        return sum4_of_8(fold(a), fold(b), fold(c), fold(d));
    }
};

struct f16_avx2 {
    static constexpr int W = 8, n_regs = 16;
    using V = __m256;
    __attribute__((target("avx2,fma,f16c"))) static inline V half(const ggml_fp16_t * p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    }
    __attribute__((target("avx2,fma,f16c"))) static inline V load(const float * p) { return _mm256_loadu_ps(p); }
    __attribute__((target("avx2,fma,f16c"))) static inline V zero() { return _mm256_setzero_ps(); }
    __attribute__((target("avx2,fma,f16c"))) static inline float sum(V v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    }
    __attribute__((target("avx2,fma,f16c"))) static inline V broadcast(float x) { return _mm256_set1_ps(x); }
    __attribute__((target("avx2,fma,f16c"))) static inline void store(float * p, V v) { _mm256_storeu_ps(p, v); }
    __attribute__((target("avx2,fma,f16c"))) static inline float scalar(ggml_fp16_t h) { return _cvtsh_ss(h); }
    __attribute__((target("avx2,fma,f16c"))) static inline __m128 sum4(V a, V b, V c, V d) { return sum4_of_8(a, b, c, d); }
};

constexpr int64_t cross_head_dim = 64;  // every Whisper size (n_state / n_head); checked when the op is made
constexpr int64_t cross_block_rows = 8;  // query rows per task: their weights, 8 x n_cross floats, stay in L2

struct cross_shapes {
    int64_t n_state, n_q, n_cross;
    size_t k_pos, k_head;  // bytes between K rows of successive positions, heads
    size_t v_dim, v_head;  // bytes between V^T rows of successive dimensions, heads
};

// w[r][j] = q_r . k_j / sqrt(head_dim) for the block's R rows. Keys go in groups of cross_key_group: each row
// keeps one sum per key of the group and reduces the group's sums together (O::sum4, three horizontal adds),
// where one key at a time spent a whole horizontal sum and a scalar store on each 64-long dot. With R > 1 the
// group's keys are widened to f32 once, into an L1 buffer the rows read; a single row (greedy) widens them in
// its registers. Every row adds the same products in the same order for any R, so a beam's scores do not
// depend on how many beams share the block. Keys past the last whole group go one at a time (O::sum).
// R is a compile-time count (cross_block_of), so the row loops unroll with every sum in a register: with the
// count known only at run time GCC 12 tested it again for each row of each key and of each V chunk.
constexpr int cross_key_group = 4;

template <class O, int R>
inline void cross_scores(const cross_shapes & s, const float * q, const char * k, float * w, int64_t ld) {
    constexpr int W = O::W, n_vec = cross_head_dim / W, G = cross_key_group;
    using V = typename O::V;
    const float scale = 1.0f / std::sqrt(static_cast<float>(cross_head_dim));
    auto key_row = [&](int64_t j) { return reinterpret_cast<const ggml_fp16_t *>(k + j * s.k_pos); };
    alignas(64) float widened[R > 1 ? G : 1][cross_head_dim];
    const int64_t grouped = s.n_cross / G * G;
    for (int64_t j = 0; j < grouped; j += G) {
        if constexpr (R > 1) {
            for (int g = 0; g < G; ++g) {
                for (int i = 0; i < n_vec; ++i) O::store(widened[g] + i * W, O::half(key_row(j + g) + i * W));
            }
        }
        for (int r = 0; r < R; ++r) {
            V acc[G];
            for (int g = 0; g < G; ++g) acc[g] = O::zero();
            for (int i = 0; i < n_vec; ++i) {
                const V qi = O::load(q + r * s.n_state + i * W);
                for (int g = 0; g < G; ++g) {
                    if constexpr (R > 1) {
                        acc[g] += qi * O::load(widened[g] + i * W);
                    } else {
                        acc[g] += qi * O::half(key_row(j + g) + i * W);
                    }
                }
            }
            _mm_storeu_ps(w + r * ld + j, _mm_mul_ps(O::sum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale)));
        }
    }
    for (int64_t j = grouped; j < s.n_cross; ++j) {
        V kv[n_vec];
        for (int i = 0; i < n_vec; ++i) kv[i] = O::half(key_row(j) + i * W);
        for (int r = 0; r < R; ++r) {
            V acc = O::zero();
            for (int i = 0; i < n_vec; ++i) acc += O::load(q + r * s.n_state + i * W) * kv[i];
            w[r * ld + j] = O::sum(acc) * scale;
        }
    }
}

// V^T rows (head dimensions) per pass over the weights w: as many as the registers hold beside R rows (R x D
// sums, D chunks of V and one of w). Each chunk of w then feeds D products where it fed one: at 8 rows w is
// 8 x n_cross floats (48 KB at 1500 positions), past L1, and was read 64 times a block. A single row (greedy)
// gets D independent sums where it had one chain of n_cross / W dependent adds.
template <class O, int R>
constexpr int cross_dims_per_pass() {
    for (int d : {4, 2}) {
        if (R * d + d + 1 <= O::n_regs) return d;
    }
    return 1;
}

// out_r[d] = sum_j w[r][j] v_j[d] / sums[r] over the head's 64 dimensions, each a long dot along V^T's row d.
// Rows of w are ld >= n_cross floats, zero past n_cross, so the last partial chunk of V^T can be read from a
// zero-padded copy. R as for cross_scores. Each sum adds the same products in the same order for any D.
template <class O, int R>
inline void cross_values(const cross_shapes & s, const float * w, int64_t ld, const float * sums, const char * vt,
                         float * out) {
    constexpr int W = O::W, D = cross_dims_per_pass<O, R>();
    static_assert(cross_head_dim % D == 0, "passes cover the head's dimensions");
    const int64_t full = s.n_cross / W * W;
    for (int64_t d0 = 0; d0 < cross_head_dim; d0 += D) {
        const ggml_fp16_t * vd[D];
        for (int e = 0; e < D; ++e) vd[e] = reinterpret_cast<const ggml_fp16_t *>(vt + (d0 + e) * s.v_dim);
        typename O::V acc[D][R];
        for (int e = 0; e < D; ++e) {
            for (int r = 0; r < R; ++r) acc[e][r] = O::zero();
        }
        auto chunk = [&](int64_t j, const typename O::V (&v)[D]) {
            for (int r = 0; r < R; ++r) {
                const typename O::V x = O::load(w + r * ld + j);
                for (int e = 0; e < D; ++e) acc[e][r] += x * v[e];
            }
        };
        for (int64_t j = 0; j < full; j += W) {
            typename O::V v[D];
            for (int e = 0; e < D; ++e) v[e] = O::half(vd[e] + j);
            chunk(j, v);
        }
        if (full < s.n_cross) {
            typename O::V v[D];
            for (int e = 0; e < D; ++e) {
                ggml_fp16_t tail[W] = {};
                std::memcpy(tail, vd[e] + full, sizeof(ggml_fp16_t) * (s.n_cross - full));
                v[e] = O::half(tail);
            }
            chunk(full, v);
        }
        for (int e = 0; e < D; ++e) {
            for (int r = 0; r < R; ++r) out[r * s.n_state + d0 + e] = O::sum(acc[e][r]) / sums[r];
        }
    }
}

// One head's block of R query rows: scores, their softmax weights (unnormalised, with their sums), values.
// buf holds R x ld floats.
template <class O, int R>
inline void cross_block(const cross_shapes & s, const float * q, const char * k, const char * vt, float * buf,
                        int64_t ld, float * out) {
    float sums[R];
    cross_scores<O, R>(s, q, k, buf, ld);
    for (int r = 0; r < R; ++r) {
        float * p = buf + r * ld;
        const float mx = row_max<O::W>(p, s.n_cross);
        for (int64_t j = 0; j < s.n_cross; ++j) p[j] = exp_neg(mx - p[j]);
        sums[r] = row_sum<O::W>(p, s.n_cross);
        std::fill(p + s.n_cross, p + ld, 0.0f);  // cross_values reads whole chunks
    }
    cross_values<O, R>(s, buf, ld, sums, vt, out);
}

// cross_block for a run-time count of 1..R rows (a prompt's last block may hold fewer than cross_block_rows).
template <class O, int R = static_cast<int>(cross_block_rows)>
inline void cross_block_of(int64_t rows, const cross_shapes & s, const float * q, const char * k, const char * vt,
                           float * buf, int64_t ld, float * out) {
    if constexpr (R > 1) {
        if (rows < R) return cross_block_of<O, R - 1>(rows, s, q, k, vt, buf, ld, out);
    }
    cross_block<O, R>(s, q, k, vt, buf, ld, out);
}

// Thread ith of nth: tasks are (head, block of query rows), dealt round-robin.
template <class O>
inline void cross_attend(ggml_tensor * dst, const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * vt,
                         int n_head, int ith, int nth) {
    const cross_shapes s = {q->ne[0], q->ne[1], k->ne[1], k->nb[1], k->nb[2], vt->nb[1], vt->nb[2]};
    const int64_t n_blocks = (s.n_q + cross_block_rows - 1) / cross_block_rows;
    const int64_t ld = (s.n_cross + O::W - 1) / O::W * O::W;
    thread_local std::vector<float> buf;  // ggml's worker threads persist: allocated once per thread
    buf.resize(static_cast<size_t>(cross_block_rows * ld));
    const auto * qd = static_cast<const float *>(q->data);
    auto * od = static_cast<float *>(dst->data);
    for (int64_t task = ith; task < n_head * n_blocks; task += nth) {
        const int64_t h = task / n_blocks, i0 = task % n_blocks * cross_block_rows, col = h * cross_head_dim;
        cross_block_of<O>(std::min(cross_block_rows, s.n_q - i0), s, qd + i0 * s.n_state + col,
                          static_cast<const char *>(k->data) + h * s.k_head,
                          static_cast<const char *>(vt->data) + h * s.v_head, buf.data(), ld,
                          od + i0 * s.n_state + col);
    }
}

__attribute__((target("avx512f"), flatten)) void cross_attend_avx512(ggml_tensor * dst, const ggml_tensor * q,
                                                                      const ggml_tensor * k, const ggml_tensor * vt,
                                                                      int n_head, int ith, int nth) {
    cross_attend<f16_avx512>(dst, q, k, vt, n_head, ith, nth);
}

__attribute__((target("avx2,fma,f16c"), flatten)) void cross_attend_avx2(ggml_tensor * dst, const ggml_tensor * q,
                                                                          const ggml_tensor * k,
                                                                          const ggml_tensor * vt, int n_head,
                                                                          int ith, int nth) {
    cross_attend<f16_avx2>(dst, q, k, vt, n_head, ith, nth);
}

void cross_attention_op(ggml_tensor * dst, const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * vt,
                        int ith, int nth, void * userdata) {
    const int n_head = static_cast<int>(reinterpret_cast<intptr_t>(userdata));
    if (kernel_isa() >= isa::avx512) {
        cross_attend_avx512(dst, q, k, vt, n_head, ith, nth);
    } else {
        cross_attend_avx2(dst, q, k, vt, n_head, ith, nth);
    }
}

// ------------------------------------------------------------------------------------------------------------
// The decoder's self-attention: each query row (a beam's token, or a prompt's) over the KV arena's cells that
// its mask row leaves visible. ggml-cpu's flash attention handles one cell at a time (an f16 dot call, an
// online-softmax rescale, V accumulated in f16 and converted back per cell); here a row's visible cells are
// scored first, softmaxed in f32, then summed from V's 64-long f16 rows into registers.

template <class O>
AURAL_INLINE float dot64(const float * q, const ggml_fp16_t * k) {
    constexpr int W = O::W, n_vec = cross_head_dim / W;
    typename O::V acc[n_vec];
    for (int i = 0; i < n_vec; ++i) acc[i] = O::load(q + i * W) * O::half(k + i * W);
    for (int n = n_vec; n > 1; n /= 2) {  // independent products, summed as a tree
        for (int i = 0; i < n / 2; ++i) acc[i] += acc[i + n / 2];
    }
    return O::sum(acc[0]);
}

// Thread ith of nth: tasks are (query row, head), dealt round-robin. src: q [n_state, n_q] f32, k and v
// [64, n_rows, n_head] f16 views, mask [n_ctx, >= n_q] f16 (0 visible, -inf not), and for a paged arena
// rows [n_ctx] i32, the K/V row of each cell (else cell c is row c).
template <class O>
inline void self_attend(ggml_tensor * dst, int n_head, int ith, int nth) {
    constexpr int W = O::W, n_vec = cross_head_dim / W;
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * v = dst->src[2], * mask = dst->src[3];
    const int32_t * rows = dst->src[4] ? static_cast<const int32_t *>(dst->src[4]->data) : nullptr;
    const int64_t n_state = q->ne[0], n_q = q->ne[1], n_ctx = mask->ne[0];
    const float scale = 1.0f / std::sqrt(static_cast<float>(cross_head_dim));
    thread_local std::vector<float> w;  // ggml's worker threads persist: allocated once per thread
    thread_local std::vector<int64_t> cells;
    w.resize(static_cast<size_t>(n_ctx));
    cells.resize(static_cast<size_t>(n_ctx));
    for (int64_t task = ith; task < n_q * n_head; task += nth) {
        const int64_t r = task / n_head, h = task % n_head;
        const float * qr = static_cast<const float *>(q->data) + r * n_state + h * cross_head_dim;
        const auto * m = reinterpret_cast<const ggml_fp16_t *>(static_cast<const char *>(mask->data) + r * mask->nb[1]);
        const char * kh = static_cast<const char *>(k->data) + h * k->nb[2];
        const char * vh = static_cast<const char *>(v->data) + h * v->nb[2];
        int64_t n = 0;
        for (int64_t c = 0; c < n_ctx; ++c) {
            const float mc = O::scalar(m[c]);
            if (mc == -INFINITY) continue;
            const int64_t row = rows ? rows[c] : c;
            w[n] = dot64<O>(qr, reinterpret_cast<const ggml_fp16_t *>(kh + row * k->nb[1])) * scale + mc;
            cells[n++] = row;
        }
        typename O::V acc[n_vec];
        for (int i = 0; i < n_vec; ++i) acc[i] = O::zero();
        float * out = static_cast<float *>(dst->data) + r * n_state + h * cross_head_dim;
        if (n > 0) {
            const float mx = row_max<O::W>(w.data(), n);
            float sum = 0.0f;
            for (int64_t j = 0; j < n; ++j) sum += (w[j] = exp_neg(mx - w[j]));
            for (int64_t j = 0; j < n; ++j) {
                const auto * vj = reinterpret_cast<const ggml_fp16_t *>(vh + cells[j] * v->nb[1]);
                const typename O::V wj = O::broadcast(w[j] / sum);
                for (int i = 0; i < n_vec; ++i) acc[i] += wj * O::half(vj + i * W);
            }
        }
        for (int i = 0; i < n_vec; ++i) O::store(out + i * W, acc[i]);  // a row that sees no cell gets zeros
    }
}

__attribute__((target("avx512f,f16c"), flatten)) void self_attend_avx512(ggml_tensor * dst, int n_head, int ith,
                                                                         int nth) {
    self_attend<f16_avx512>(dst, n_head, ith, nth);
}

__attribute__((target("avx2,fma,f16c"), flatten)) void self_attend_avx2(ggml_tensor * dst, int n_head, int ith,
                                                                        int nth) {
    self_attend<f16_avx2>(dst, n_head, ith, nth);
}

void self_attention_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const int n_head = static_cast<int>(reinterpret_cast<intptr_t>(userdata));
    if (kernel_isa() >= isa::avx512) {
        self_attend_avx512(dst, n_head, ith, nth);
    } else {
        self_attend_avx2(dst, n_head, ith, nth);
    }
}

}  // namespace

bool encoder_attention_available() { return kernel_isa() >= isa::avx2; }

ggml_tensor * encoder_self_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * kt, ggml_tensor * v,
                                     int n_head) {
    const bool f32 = q->type == GGML_TYPE_F32 && kt->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32;
    const bool contiguous = ggml_is_contiguous(q) && ggml_is_contiguous(kt) && ggml_is_contiguous(v);
    const bool shaped = ggml_are_same_shape(q, v) && kt->ne[0] == q->ne[1] && kt->ne[1] == q->ne[0] &&
                        q->ne[0] % n_head == 0 && q->ne[0] / n_head % 32 == 0;
    if (!encoder_attention_available() || !f32 || !contiguous || !shaped) {
        throw std::invalid_argument("encoder_self_attention: needs AVX2 or AVX-512 and contiguous f32 q, kt, v "
                                    "shaped [n_state, n], [n, n_state], [n_state, n] with head_dim % 32 == 0");
    }
    return ggml_map_custom3(ctx, q, kt, v, attention_op, GGML_N_TASKS_MAX,
                            reinterpret_cast<void *>(static_cast<intptr_t>(n_head)));
}

// The encoder op's instruction sets, and F16C for the f16 K/V (every AVX2 CPU so far has it).
bool cross_attention_available() { return encoder_attention_available() && __builtin_cpu_supports("f16c"); }

ggml_tensor * decoder_cross_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * vt,
                                      int n_head) {
    const int64_t n_state = q->ne[0];
    const bool typed = q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F16 && vt->type == GGML_TYPE_F16;
    const bool shaped = n_state == n_head * cross_head_dim && k->ne[0] == cross_head_dim && k->ne[2] == n_head &&
                        vt->ne[0] == k->ne[1] && vt->ne[1] == cross_head_dim && vt->ne[2] == n_head &&
                        k->nb[0] == sizeof(ggml_fp16_t) && vt->nb[0] == sizeof(ggml_fp16_t);
    if (!cross_attention_available() || !typed || !shaped) {
        throw std::invalid_argument("decoder_cross_attention: needs AVX2 (F16C) or AVX-512, f32 q [n_state, n_q] "
                                    "and f16 k [64, n_cross, n_head], vt [n_cross, 64, n_head]");
    }
    return ggml_map_custom3(ctx, ggml_is_contiguous(q) ? q : ggml_cont(ctx, q), k, vt, cross_attention_op, GGML_N_TASKS_MAX,
                            reinterpret_cast<void *>(static_cast<intptr_t>(n_head)));
}

ggml_tensor * decoder_self_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                     ggml_tensor * mask, int n_head, ggml_tensor * rows) {
    const int64_t n_state = q->ne[0], n_q = q->ne[1];
    const bool typed = q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16 &&
                       mask->type == GGML_TYPE_F16;
    const bool shaped = n_state == n_head * cross_head_dim && ggml_are_same_shape(k, v) &&
                        k->ne[0] == cross_head_dim && k->ne[2] == n_head && k->nb[0] == sizeof(ggml_fp16_t) &&
                        v->nb[0] == sizeof(ggml_fp16_t) && mask->ne[1] >= n_q &&
                        (rows ? rows->type == GGML_TYPE_I32 && rows->ne[0] == mask->ne[0] : mask->ne[0] == k->ne[1]);
    if (!cross_attention_available() || !typed || !shaped) {
        throw std::invalid_argument("decoder_self_attention: needs AVX2 (F16C) or AVX-512, f32 q [n_state, n_q], "
                                    "f16 k and v [64, n_rows, n_head], an f16 mask [n_ctx, >= n_q] and, unless "
                                    "n_rows == n_ctx, i32 rows [n_ctx]");
    }
    ggml_tensor * args[] = {ggml_is_contiguous(q) ? q : ggml_cont(ctx, q), k, v, mask, rows};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, n_state, n_q, 1, 1, args, rows ? 5 : 4, self_attention_op,
                          GGML_N_TASKS_MAX, reinterpret_cast<void *>(static_cast<intptr_t>(n_head)));
}

#else  // not x86-64 with GCC or Clang: the graph keeps ggml_flash_attn_ext

bool encoder_attention_available() { return false; }

ggml_tensor * encoder_self_attention(ggml_context *, ggml_tensor *, ggml_tensor *, ggml_tensor *, int) {
    throw std::invalid_argument("encoder_self_attention: not built for this CPU");
}

bool cross_attention_available() { return false; }

ggml_tensor * decoder_cross_attention(ggml_context *, ggml_tensor *, ggml_tensor *, ggml_tensor *, int) {
    throw std::invalid_argument("decoder_cross_attention: not built for this CPU");
}

ggml_tensor * decoder_self_attention(ggml_context *, ggml_tensor *, ggml_tensor *, ggml_tensor *, ggml_tensor *, int,
                                     ggml_tensor *) {
    throw std::invalid_argument("decoder_self_attention: not built for this CPU");
}

#endif

}  // namespace aural
