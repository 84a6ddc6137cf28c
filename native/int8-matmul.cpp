#include "int8-matmul.h"

#include "cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AURAL_VNNI_KERNELS 1
#define AURAL_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define AURAL_AVX2 __attribute__((target("avx2,fma")))
#define AURAL_AVX_VNNI __attribute__((target("avx2,fma,avxvnni")))
#define AURAL_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))
#endif

namespace aural {

void int8_pack(const float * rows, int64_t n_rows, int64_t n_cols, int8_t * out) {
    const int64_t n_panels = (n_rows + int8_panel_rows - 1) / int8_panel_rows;
    for (int64_t p = 0; p < n_panels; ++p) {
        int8_t * panel = out + p * int8_panel_bytes(n_cols);
        float scales[int8_panel_rows] = {};
        int32_t sums[int8_panel_rows] = {};
        for (int64_t r = 0; r < int8_panel_rows; ++r) {
            const int64_t row = p * int8_panel_rows + r;
            const float * src = rows + row * n_cols;
            float amax = 0.0f;
            for (int64_t k = 0; row < n_rows && k < n_cols; ++k) {
                amax = std::max(amax, std::fabs(src[k]));
            }
            scales[r] = amax / 127.0f;
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int64_t k = 0; k < n_cols; ++k) {
                const auto q = static_cast<int8_t>(row < n_rows ? std::nearbyint(src[k] * inv) : 0.0f);
                panel[(k / 4) * 4 * int8_panel_rows + r * 4 + k % 4] = q;
                sums[r] += q;
            }
        }
        std::memcpy(panel + n_cols * int8_panel_rows, scales, sizeof scales);
        std::memcpy(panel + n_cols * int8_panel_rows + sizeof scales, sums, sizeof sums);
    }
}

#ifdef AURAL_VNNI_KERNELS

namespace {

// Quantised activations: per column of x, n_cols bytes of u8 (q + 128, q = round(x / s) in [-127, 127])
// and then s (f32). VPDPBUSD multiplies unsigned by signed bytes, hence the offset, which the product
// takes back out as 128 x the weight row's sum.
int64_t xq_row_bytes(int64_t n_cols) { return n_cols + 4; }

AURAL_VNNI void quantize_column(const float * x, int64_t n_cols, uint8_t * out) {
    __m512 amax = _mm512_setzero_ps();
    for (int64_t k = 0; k < n_cols; k += 16) {
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
    }
    const float m = _mm512_reduce_max_ps(amax);
    const float s = m / 127.0f;
    const __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    const __m512i offset = _mm512_set1_epi32(128);
    for (int64_t k = 0; k < n_cols; k += 16) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));  // round to nearest
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + k), _mm512_cvtusepi32_epi8(_mm512_add_epi32(q, offset)));
    }
    std::memcpy(out + n_cols, &s, sizeof s);
}

enum class kernel { avx2, avx_vnni, avx512_vnni, amx };

kernel widest() {
    if (kernel_isa() >= isa::avx512_vnni) return kernel_amx() ? kernel::amx : kernel::avx512_vnni;
    return kernel_avx_vnni() ? kernel::avx_vnni : kernel::avx2;
}

// AVX2 without VNNI: the same quantised activations and the same integer sums, so the same output bits.
// VPMADDUBSW multiplies unsigned by signed bytes into saturating 16-bit pair sums; with u = q + 128 a pair
// could reach 2 x 255 x 127 and saturate. So this kernel's activations stay signed (offset 0) and it
// multiplies |w| (at most 127, formed once per weight load for all the tile's columns) by q with w's sign
// (VPSIGNB): a pair sum is at most 2 x 127 x 127 = 32 258 < 2^15, exact, then VPMADDWD adds pairs into
// int32. That gives sum q w directly, which is what VPDPBUSD's sum u w less the 128 x row-sum offset gives.
// Four instructions per 32 byte pairs against one per 64: a quarter of the VNNI kernel's work per instruction.
// offset: 128 for the VPDPBUSD kernels (u = q + 128), 0 for the AVX2 kernel (q as a signed byte).
AURAL_AVX2 void quantize_column_avx2(const float * x, int64_t n_cols, uint8_t * out, int32_t offset) {
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int64_t k = 0; k < n_cols; ++k) {
        amax = std::max(amax, std::fabs(x[k]));
    }
    const float s = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t k = 0; k < n_cols; ++k) {
        // nearbyint rounds half to even in the default mode, as _mm512_cvtps_epi32 does: the same bytes.
        out[k] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(x[k] * inv)) + offset);
    }
    std::memcpy(out + n_cols, &s, sizeof s);
}

void quantize_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[0];
    const int64_t n_cols = x->ne[0], m = x->ne[1];
    const kernel k = widest();
    for (int64_t c = ith; c < m; c += nth) {
        const float * column = static_cast<const float *>(x->data) + c * n_cols;
        auto * out = static_cast<uint8_t *>(dst->data) + c * dst->nb[1];
        if (k == kernel::avx512_vnni || k == kernel::amx) {
            quantize_column(column, n_cols, out);
        } else {
            quantize_column_avx2(column, n_cols, out, k == kernel::avx2 ? 0 : 128);
        }
    }
}

// Four activation bytes of one column (one group of the panel's four columns), for a broadcast.
inline int32_t four_bytes(const uint8_t * p) {
    int32_t four;
    std::memcpy(&four, p, sizeof four);
    return four;
}

// The AVX-512 panel: 16 rows in the lanes of one register per column.
// One VPDPBUSD as an asm: with the intrinsic, GCC 12 writes each sum to a new register and copies it back
// on every step (one move per product: 35 instructions per step of 8 columns, 23 with the asm), where "+v"
// keeps the sum in its register. The same holds for the ymm form in step_avx_vnni.
AURAL_VNNI inline void dpbusd(__m512i & acc, __m512i u, __m512i w) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(w));
}

// One column's int32 sums less the 128 x row sums, times the row scales and the column's activation scale
// (at xs): two f32 products, in this order in every kernel, so every kernel gives the same bits.
AURAL_VNNI inline void store_column(__m512i acc, __m512i offset, __m512 w_scale, const uint8_t * xs, float * out,
                                    __mmask16 rows) {
    float x_scale;
    std::memcpy(&x_scale, xs, sizeof x_scale);
    const __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, offset)),
                                   _mm512_mul_ps(w_scale, _mm512_set1_ps(x_scale)));
    _mm512_mask_storeu_ps(out, rows, y);
}

// out[c][rows] for the columns c of xq in I against one panel. The columns are a pack, not a loop: each sum
// then has a constant index and GCC 12 keeps it in one register, where with a loop over c it kept the
// 6-column AVX-VNNI tile's sums in memory (10 stores and 9 loads per step, seen in the disassembly).
template <size_t... I>
AURAL_VNNI inline __attribute__((always_inline)) void panel_tile(const int8_t * panel, int64_t n_cols,
                                                                 const uint8_t * xq, int64_t xq_stride, float * out,
                                                                 int64_t out_stride, __mmask16 rows,
                                                                 std::index_sequence<I...>) {
    __m512i acc[] = {(void(I), _mm512_setzero_si512())...};
    int64_t g = 0;
    do {  // n_cols is a positive multiple of 16
        const __m512i w = _mm512_loadu_si512(panel + g * 64);
        (dpbusd(acc[I], _mm512_set1_epi32(four_bytes(xq + I * xq_stride + g * 4)), w), ...);
    } while (++g < n_cols / 4);
    const int8_t * tail = panel + n_cols * int8_panel_rows;
    const __m512 w_scale = _mm512_loadu_ps(reinterpret_cast<const float *>(tail));
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(tail + 64), 7);  // 128 x row sums
    (store_column(acc[I], offset, w_scale, xq + I * xq_stride + n_cols, out + I * out_stride, rows), ...);
}

// Columns per tile: 8 accumulators, one weight load per 8 VPDPBUSD. 12 and 16 (of 32 registers) were no
// faster on a Sapphire Rapids-class Xeon (the kernel alone, 1500 columns, 2026-12-03).
constexpr int block_cols = 8;

template <int C = block_cols>
AURAL_VNNI void panel_cols(const int8_t * panel, int64_t n_cols, const uint8_t * xq, int64_t xq_stride, int64_t m,
                           float * out, int64_t out_stride, __mmask16 rows) {
    if constexpr (C > 0) {
        if (m >= C) {
            for (int64_t c = 0; c + C <= m; c += C) {
                panel_tile(panel, n_cols, xq + c * xq_stride, xq_stride, out + c * out_stride, out_stride, rows,
                           std::make_index_sequence<C>());
            }
            const int64_t done = m / C * C;
            m -= done;
            xq += done * xq_stride;
            out += done * out_stride;
        }
        panel_cols<C - 1>(panel, n_cols, xq, xq_stride, m, out, out_stride, rows);
    }
}

// AMX: TDPBUSD multiplies a tile of 16 rows x 64 u8 by one of 16 x 64 s8 into 16 x 16 int32 sums, 16 x 1024
// byte pairs per instruction where VPDPBUSD takes 64 (Intel SDM vol. 1, "Intel AMX"). The packed layout is already
// a B tile: 16 consecutive groups of a panel (64 bytes each: 16 rows x 4 columns) are the 16 rows of B for
// 64 values of the input dimension, and 16 columns of xq (stride xq->nb[1]) are the rows of A. C[c][r] is then
// column c's sum u w for panel row r, the VPDPBUSD kernel's integer, so the epilogue (store_column) gives the
// same bits. Tiles: sums 0-3 (2 column blocks x 2 panels), activations 4-5, weights 6-7, all 16 x 64 bytes.
struct alignas(64) tile_config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};

const tile_config & amx_config() {
    static const tile_config c = [] {
        tile_config t;
        for (int i = 0; i < 8; ++i) {
            t.bytes_per_row[i] = 64;
            t.rows[i] = 16;
        }
        return t;
    }();
    return c;
}

// LDTILECFG / STTILECFG with the whole 64-byte block as the operand (GCC 12's intrinsics name only its first
// 8 bytes, so the compiler may not see the rest read or written).
AURAL_AMX inline void load_tile_config(const tile_config & c) { asm volatile("ldtilecfg %0" ::"m"(c)); }
AURAL_AMX inline void store_tile_config(tile_config & c) { asm volatile("sttilecfg %0" : "=m"(c)); }

// One tile of sums (16 columns x 16 panel rows, at `sums`) through the AVX-512 kernel's epilogue.
AURAL_VNNI inline void store_sums(const int32_t * sums, const int8_t * tail, const uint8_t * xq, int64_t xq_stride,
                                  int64_t n_cols, float * out, int64_t out_stride, __mmask16 rows) {
    const __m512 w_scale = _mm512_loadu_ps(reinterpret_cast<const float *>(tail));
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(tail + 64), 7);  // 128 x row sums
    for (int c = 0; c < 16; ++c) {
        store_column(_mm512_loadu_si512(sums + c * 16), offset, w_scale, xq + c * xq_stride + n_cols,
                     out + c * out_stride, rows);
    }
}

// NC column blocks of 16 by NP panels (1 or 2 each). Tile numbers are literals: the intrinsics paste them
// into the instruction.
template <int NC, int NP>
AURAL_AMX void amx_tile(const int8_t * panel, int64_t panel_stride, int64_t n_cols, const uint8_t * xq,
                        int64_t xq_stride, float * out, int64_t out_stride, const __mmask16 * rows) {
    _tile_zero(0);
    if constexpr (NP > 1) _tile_zero(1);
    if constexpr (NC > 1) _tile_zero(2);
    if constexpr (NC > 1 && NP > 1) _tile_zero(3);
    const uint8_t * xq1 = xq + 16 * xq_stride;
    const int8_t * panel1 = panel + panel_stride;
    for (int64_t k = 0; k < n_cols; k += 64) {  // n_cols is a multiple of 64
        _tile_loadd(4, xq + k, xq_stride);
        _tile_loadd(6, panel + k * int8_panel_rows, 64);
        _tile_dpbusd(0, 4, 6);
        if constexpr (NP > 1) {
            _tile_loadd(7, panel1 + k * int8_panel_rows, 64);
            _tile_dpbusd(1, 4, 7);
        }
        if constexpr (NC > 1) {
            _tile_loadd(5, xq1 + k, xq_stride);
            _tile_dpbusd(2, 5, 6);
            if constexpr (NP > 1) _tile_dpbusd(3, 5, 7);
        }
    }
    alignas(64) int32_t sums[4][16 * 16];
    _tile_stored(0, sums[0], 64);
    if constexpr (NP > 1) _tile_stored(1, sums[1], 64);
    if constexpr (NC > 1) _tile_stored(2, sums[2], 64);
    if constexpr (NC > 1 && NP > 1) _tile_stored(3, sums[3], 64);
    const int8_t * tail = panel + n_cols * int8_panel_rows;
    for (int c = 0; c < NC; ++c) {
        for (int p = 0; p < NP; ++p) {
            store_sums(sums[c * 2 + p], tail + p * panel_stride, xq + c * 16 * xq_stride, xq_stride, n_cols,
                       out + c * 16 * out_stride + p * int8_panel_rows, out_stride, rows[p]);
        }
    }
}

// Panels [p0, p1) against every column: 32-column blocks outside, pairs of panels inside, so a block's
// activations (32 x n_cols bytes) stay in L1 while the thread's panels stream from L2; the other order read
// all of xq once per pair of panels, 2.3 MB at tiny.en's 1536-wide FFN input, past L2. Blocks of 16 come
// last, and the columns left of a multiple of 16 go through the AVX-512 kernel. The thread's tile
// configuration is saved and put back, since ggml's AMX kernels configure a thread's tiles once and rely on it
// after (ggml-cpu/amx/mmq.cpp).
AURAL_AMX void panels_amx(const int8_t * panels, int64_t stride, const uint8_t * xq, int64_t xq_stride, int64_t m,
                          int64_t n_cols, int64_t n_rows, int64_t p0, int64_t p1, float * out) {
    tile_config saved;
    store_tile_config(saved);
    load_tile_config(amx_config());
    const int64_t m16 = m / 16 * 16;
    auto live_rows = [&](int64_t p) {
        const int64_t live = std::min<int64_t>(int8_panel_rows, n_rows - p * int8_panel_rows);
        return static_cast<__mmask16>((1u << live) - 1);
    };
    for (int64_t c = 0; c < m16; c += 32) {
        const bool two = c + 32 <= m16;
        const uint8_t * x = xq + c * xq_stride;
        for (int64_t p = p0; p < p1; p += 2) {
            const __mmask16 rows[2] = {live_rows(p), p + 1 < p1 ? live_rows(p + 1) : __mmask16(0)};
            const int8_t * panel = panels + p * stride;
            float * o = out + c * n_rows + p * int8_panel_rows;
            if (p + 1 < p1) {
                two ? amx_tile<2, 2>(panel, stride, n_cols, x, xq_stride, o, n_rows, rows)
                    : amx_tile<1, 2>(panel, stride, n_cols, x, xq_stride, o, n_rows, rows);
            } else {
                two ? amx_tile<2, 1>(panel, stride, n_cols, x, xq_stride, o, n_rows, rows)
                    : amx_tile<1, 1>(panel, stride, n_cols, x, xq_stride, o, n_rows, rows);
            }
        }
    }
    for (int64_t p = p0; p < p1 && m16 < m; ++p) {
        panel_cols(panels + p * stride, n_cols, xq + m16 * xq_stride, xq_stride, m - m16,
                   out + m16 * n_rows + p * int8_panel_rows, n_rows, live_rows(p));
    }
    if (saved.palette != 0) {
        load_tile_config(saved);
    } else {
        _tile_release();
    }
}

// The two 256-bit kernels share their tile, column blocking and epilogue; they differ only in how a
// column's four bytes per lane enter the int32 sums (`accumulate`, `finish`). The pieces that need an
// instruction set are inline functions with their target; the templates that call them have none and are
// compiled into each kernel's entry point, whose `flatten` inlines them there, as in attention.cpp.
struct ymm_common {
    AURAL_AVX2 static inline __m256i zero() { return _mm256_setzero_si256(); }
    AURAL_AVX2 static inline __m256i load(const int8_t * p) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    }
    // One column's int32 sums q w (rows 0-7 in lo, 8-15 in hi) times the panel's row scales (at `tail`) and
    // the column's activation scale (at xs): the same two f32 products as the AVX-512 kernel, so the same
    // bits. `live` rows of 16 are stored.
    AURAL_AVX2 static inline void store(__m256i lo, __m256i hi, const int8_t * tail, const uint8_t * xs, float * out,
                                        int live) {
        const auto * w_scale = reinterpret_cast<const float *>(tail);
        float x_scale;
        std::memcpy(&x_scale, xs, sizeof x_scale);
        const __m256 s = _mm256_set1_ps(x_scale);
        const __m256 y_lo = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(_mm256_loadu_ps(w_scale), s));
        const __m256 y_hi = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(_mm256_loadu_ps(w_scale + 8), s));
        if (live == int8_panel_rows) {  // every panel but a matrix's last: a memcpy of run-time length is a
            _mm256_storeu_ps(out, y_lo);  // libc call per column (2.5 % of base's encoder, perf, Zen 3)
            _mm256_storeu_ps(out + 8, y_hi);
            return;
        }
        alignas(32) float y[int8_panel_rows];
        _mm256_store_ps(y, y_lo);
        _mm256_store_ps(y + 8, y_hi);
        std::memcpy(out, y, live * sizeof(float));
    }
};

// AVX2 without VNNI: see quantize_column_avx2 for why q with w's sign times |w| gives sum q w exactly.
struct step_avx2 : ymm_common {
    static constexpr int block_cols = 3;  // 6 accumulators, 4 weight registers, ones and 4 temporaries of 16
    struct weights {
        __m256i lo, hi, abs_lo, abs_hi;  // rows 0-7 and 8-15 of one group of four columns, and their |w|
    };
    AURAL_AVX2 static inline weights load_weights(const int8_t * p) {
        const __m256i lo = load(p), hi = load(p + 32);
        return {lo, hi, _mm256_abs_epi8(lo), _mm256_abs_epi8(hi)};
    }
    AURAL_AVX2 static inline void accumulate(__m256i & lo, __m256i & hi, int32_t four, const weights & w) {
        const __m256i q = _mm256_set1_epi32(four), ones = _mm256_set1_epi16(1);
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs_lo, _mm256_sign_epi8(q, w.lo)), ones));
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs_hi, _mm256_sign_epi8(q, w.hi)), ones));
    }
    AURAL_AVX2 static inline void finish(__m256i &, __m256i &, const int8_t * /*tail*/) {}  // already sum q w
};

// AVX-VNNI (VPDPBUSD on ymm registers): the AVX-512 kernel's arithmetic in two 8-row halves. The activations
// keep their +128 offset and the panel's 128 x row sums come back out, so the int32 sums are those of the
// AVX2 kernel: the same bits, in one instruction per 32 byte pairs where that kernel takes four.
struct step_avx_vnni : ymm_common {
    static constexpr int block_cols = 6;  // 12 accumulators, 2 weight halves and the broadcast of 16 registers
    struct weights {
        __m256i lo, hi;
    };
    AURAL_AVX2 static inline weights load_weights(const int8_t * p) { return {load(p), load(p + 32)}; }
    AURAL_AVX_VNNI static inline void accumulate(__m256i & lo, __m256i & hi, int32_t four, const weights & w) {
        const __m256i u = _mm256_set1_epi32(four);  // VEX VPDPBUSD as an asm: see dpbusd above
        asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(lo) : "x"(u), "x"(w.lo));
        asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(hi) : "x"(u), "x"(w.hi));
    }
    AURAL_AVX_VNNI static inline void finish(__m256i & lo, __m256i & hi, const int8_t * tail) {
        const auto * sums = reinterpret_cast<const __m256i *>(tail + 64);
        lo = _mm256_sub_epi32(lo, _mm256_slli_epi32(_mm256_loadu_si256(sums), 7));
        hi = _mm256_sub_epi32(hi, _mm256_slli_epi32(_mm256_loadu_si256(sums + 1), 7));
    }
};

// out[c][0, live) for the columns c of xq in I against one panel, each column in two registers (rows 0-7,
// 8-15). The columns are a pack, not a loop, for the reason given at the AVX-512 panel_tile.
template <class S, size_t... I>
inline void panel_tile_ymm(const int8_t * panel, int64_t n_cols, const uint8_t * xq, int64_t xq_stride, float * out,
                           int64_t out_stride, int live, std::index_sequence<I...>) {
    __m256i lo[] = {(void(I), S::zero())...}, hi[] = {(void(I), S::zero())...};
    int64_t g = 0;
    do {  // n_cols is a positive multiple of 16
        const typename S::weights w = S::load_weights(panel + g * 64);
        (S::accumulate(lo[I], hi[I], four_bytes(xq + I * xq_stride + g * 4), w), ...);
    } while (++g < n_cols / 4);
    const int8_t * tail = panel + n_cols * int8_panel_rows;
    (S::finish(lo[I], hi[I], tail), ...);
    (S::store(lo[I], hi[I], tail, xq + I * xq_stride + n_cols, out + I * out_stride, live), ...);
}

template <class S, int C = S::block_cols>
inline void panel_cols_ymm(const int8_t * panel, int64_t n_cols, const uint8_t * xq, int64_t xq_stride, int64_t m,
                           float * out, int64_t out_stride, int live) {
    if constexpr (C > 0) {
        const int64_t done = m / C * C;
        for (int64_t c = 0; c < done; c += C) {
            panel_tile_ymm<S>(panel, n_cols, xq + c * xq_stride, xq_stride, out + c * out_stride, out_stride, live,
                              std::make_index_sequence<C>());
        }
        panel_cols_ymm<S, C - 1>(panel, n_cols, xq + done * xq_stride, xq_stride, m - done, out + done * out_stride,
                                 out_stride, live);
    }
}

__attribute__((target("avx2,fma"), flatten)) void panel_cols_avx2(const int8_t * panel, int64_t n_cols,
                                                                   const uint8_t * xq, int64_t xq_stride, int64_t m,
                                                                   float * out, int64_t out_stride, int live) {
    panel_cols_ymm<step_avx2>(panel, n_cols, xq, xq_stride, m, out, out_stride, live);
}

__attribute__((target("avx2,fma,avxvnni"), flatten)) void panel_cols_avx_vnni(const int8_t * panel, int64_t n_cols,
                                                                               const uint8_t * xq, int64_t xq_stride,
                                                                               int64_t m, float * out,
                                                                               int64_t out_stride, int live) {
    panel_cols_ymm<step_avx_vnni>(panel, n_cols, xq, xq_stride, m, out, out_stride, live);
}

// Panels [p0, p1) of a matrix of n_rows rows (at `panels`, `stride` bytes apart) against every column of xq;
// out [n_rows, m].
void panel_range(const int8_t * panels, int64_t stride, const ggml_tensor * xq, int64_t m, int64_t n_rows,
                 int64_t p0, int64_t p1, float * out) {
    const int64_t n_cols = xq->ne[0] - 4;
    const auto * xq_data = static_cast<const uint8_t *>(xq->data);
    kernel k = widest();
    if (k == kernel::amx) {
        // Tiles take 64 input values and 16 columns per step: a matrix of another width, or fewer than 16
        // columns (a decoder step's tokens and beams, bound by reading the weights either way), stay with
        // AVX-512 VNNI.
        if (n_cols % 64 == 0 && m >= 16) {
            panels_amx(panels, stride, xq_data, xq->nb[1], m, n_cols, n_rows, p0, p1, out);
            return;
        }
        k = kernel::avx512_vnni;
    }
    for (int64_t p = p0; p < p1; ++p) {
        const int64_t live = std::min<int64_t>(int8_panel_rows, n_rows - p * int8_panel_rows);
        const int8_t * panel = panels + p * stride;
        float * o = out + p * int8_panel_rows;
        switch (k) {
            case kernel::amx:  // taken above
            case kernel::avx512_vnni:
                panel_cols(panel, n_cols, xq_data, xq->nb[1], m, o, n_rows, static_cast<__mmask16>((1u << live) - 1));
                break;
            case kernel::avx_vnni:
                panel_cols_avx_vnni(panel, n_cols, xq_data, xq->nb[1], m, o, n_rows, static_cast<int>(live));
                break;
            case kernel::avx2:
                panel_cols_avx2(panel, n_cols, xq_data, xq->nb[1], m, o, n_rows, static_cast<int>(live));
                break;
        }
    }
}

// Where the product's bias and residual are among dst's sources (-1: none).
struct epilogue_srcs {
    int bias, residual;
};
constexpr epilogue_srcs epilogues[4] = {{-1, -1}, {2, -1}, {-1, 2}, {2, 3}};

// Rows [r0, r1) of out [n_rows, m]: out = residual + (out + bias), each sum rounded to f32 as two ggml_add
// nodes after the product would round it (no multiply is left to fuse with), so the bits are theirs.
void add_epilogue(float * out, int64_t n_rows, int64_t m, int64_t r0, int64_t r1, const float * bias,
                  const float * residual) {
    for (int64_t c = 0; c < m; ++c) {
        float * o = out + c * n_rows;
        if (bias) {
            for (int64_t r = r0; r < r1; ++r) o[r] += bias[r];
        }
        if (residual) {
            const float * x = residual + c * n_rows;
            for (int64_t r = r0; r < r1; ++r) o[r] = x[r] + o[r];
        }
    }
}

// Thread ith of nth computes a contiguous range of panels (16 output rows each) for every column. dst is
// [split_rows, m, n_split]: the matrix's rows in n_split blocks, each block's output contiguous.
void matmul_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * xq = dst->src[1];
    const auto & e = *static_cast<const epilogue_srcs *>(userdata);
    const float * bias = e.bias < 0 ? nullptr : static_cast<const float *>(dst->src[e.bias]->data);
    const float * residual = e.residual < 0 ? nullptr : static_cast<const float *>(dst->src[e.residual]->data);
    const int64_t split_rows = dst->ne[0], m = dst->ne[1], n_split = dst->ne[2], n_panels = w->ne[1];
    const int64_t split_panels = n_panels / n_split;  // a split's rows are a multiple of 16 (int8_matmul)
    const int64_t p0 = n_panels * ith / nth, p1 = n_panels * (ith + 1) / nth;
    for (int64_t s = p0 / split_panels; p0 < p1 && s * split_panels < p1; ++s) {
        const int64_t q0 = std::max(p0, s * split_panels) - s * split_panels;
        const int64_t q1 = std::min(p1, (s + 1) * split_panels) - s * split_panels;
        float * out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + s * dst->nb[2]);
        panel_range(static_cast<const int8_t *>(w->data) + s * split_panels * w->nb[1], w->nb[1], xq, m, split_rows,
                    q0, q1, out);
        if (bias || residual) {
            add_epilogue(out, split_rows, m, q0 * int8_panel_rows, std::min(q1 * int8_panel_rows, split_rows),
                         bias ? bias + s * split_rows : nullptr, residual);
        }
    }
}

}  // namespace

bool int8_matmul_available() { return kernel_isa() >= isa::avx2; }

const char * int8_kernel_name() {
    if (!int8_matmul_available()) return "none";
    switch (widest()) {
        case kernel::amx: return "amx";
        case kernel::avx512_vnni: return "avx512_vnni";
        case kernel::avx_vnni: return "avx_vnni";
        default: return "avx2";
    }
}

ggml_tensor * int8_matmul(ggml_context * ctx, ggml_tensor * w, int64_t n_rows, ggml_tensor * x,
                          const int8_epilogue & e) {
    const int64_t n_cols = x->ne[0], m = x->ne[1];
    if (!int8_matmul_available() || w->type != GGML_TYPE_I8 || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
        n_cols <= 0 || n_cols % 16 != 0 || w->ne[0] != int8_panel_bytes(n_cols) ||
        w->ne[1] != (n_rows + int8_panel_rows - 1) / int8_panel_rows || ggml_nrows(x) != m) {
        throw std::invalid_argument("int8_matmul: needs AVX2, a packed I8 matrix and contiguous 2-D f32 "
                                    "activations with a multiple of 16 values per column");
    }
    const int64_t n_split = e.n_split;
    if (n_split < 1 || n_rows % n_split != 0 || (n_split > 1 && (n_rows / n_split) % int8_panel_rows != 0) ||
        (e.bias && (e.bias->type != GGML_TYPE_F32 || !ggml_is_contiguous(e.bias) || ggml_nelements(e.bias) != n_rows)) ||
        (e.residual && (n_split != 1 || e.residual->type != GGML_TYPE_F32 || !ggml_is_contiguous(e.residual) ||
                        e.residual->ne[0] != n_rows || ggml_nrows(e.residual) != m))) {
        throw std::invalid_argument("int8_matmul: splits of whole panels, an f32 bias of n_rows values and an "
                                    "f32 residual of the output's shape (unsplit), contiguous");
    }
    ggml_tensor * args[] = {x};
    ggml_tensor * xq = ggml_custom_4d(ctx, GGML_TYPE_I8, xq_row_bytes(n_cols), m, 1, 1, args, 1, quantize_op,
                                      GGML_N_TASKS_MAX, nullptr);
    ggml_tensor * margs[4] = {w, xq};
    int n_args = 2;
    if (e.bias) margs[n_args++] = e.bias;
    if (e.residual) margs[n_args++] = e.residual;
    const epilogue_srcs * kind = &epilogues[(e.bias ? 1 : 0) + (e.residual ? 2 : 0)];
    return ggml_custom_4d(ctx, GGML_TYPE_F32, n_rows / n_split, m, n_split, 1, margs, n_args, matmul_op,
                          GGML_N_TASKS_MAX, const_cast<epilogue_srcs *>(kind));
}

#else  // not x86-64 with GCC or Clang

bool int8_matmul_available() { return false; }

const char * int8_kernel_name() { return "none"; }

ggml_tensor * int8_matmul(ggml_context *, ggml_tensor *, int64_t, ggml_tensor *, const int8_epilogue &) {
    throw std::invalid_argument("int8_matmul: not built for this CPU");
}

#endif

}  // namespace aural
