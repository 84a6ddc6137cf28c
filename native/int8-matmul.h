// Matrix products with int8 weights and int8 activations on CPUs with AVX2 (AVX-VNNI, AVX-512 VNNI or AMX
// where present), as CTranslate2's int8 compute type does: each weight row has one scale (absmax / 127), each
// activation column one scale, set when it is computed, and the products accumulate exactly in int32, so
// every CPU level that runs them gives the same bits.
//
//   int8_pack(values, n_rows, n_cols, packed);  // at load: f32 rows -> an I8 tensor's data (layout below)
//   y = int8_matmul(ctx, packed, n_rows, x);    // x [n_cols, m] f32 -> y [n_rows, m] f32
//   y = int8_matmul(ctx, packed, n_rows, x, {b, r});  // r + (w x + b) in the product's node
//   y = int8_matmul(ctx, qkv, 3 * n, x, {bias, nullptr, 3});  // [n, m, 3]: three projections of x at once
//
// Why: ggml-cpu's own int8 path (q8_0) reaches about half the speed of its f32 kernels here (one scale per
// 32 values, 256-bit dot products), so f32 was the fastest weight type on the CPU. VPDPBUSD multiplies 64
// byte pairs per instruction against 16 f32 FMAs: the encoder's projections run ~2x faster than f32. AVX2
// (VPSIGNB, VPMADDUBSW, VPMADDWD: 32 byte pairs in three) still halves the bytes a decoder step reads.
//
// Layout of a packed matrix (one I8 ggml tensor [panel_bytes(n_cols), n_panels]): panels of 16 rows; in a
// panel, for each group of 4 columns, 16 rows x 4 int8 (64 bytes: one VPDPBUSD operand); then the 16 rows'
// scales (f32) and column sums of the int8 values (i32, for the unsigned-activation offset). Rows past
// n_rows are zero.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace aural {

// Whether this CPU level runs the kernels: AVX2 (VPMADDUBSW), AVX-VNNI or AVX-512 VNNI (VPDPBUSD on 256 or 512
// bits), with the same results.
bool int8_matmul_available();

// The kernel this CPU level runs: "amx" (AVX-512 VNNI for products of fewer than 16 columns), "avx512_vnni",
// "avx_vnni", "avx2" or "none".
const char * int8_kernel_name();

constexpr int64_t int8_panel_rows = 16;

// Bytes of one packed panel of 16 rows of n_cols values (n_cols a multiple of 4).
inline int64_t int8_panel_bytes(int64_t n_cols) { return n_cols * int8_panel_rows + 2 * 4 * int8_panel_rows; }

// Packs f32 rows [n_rows][n_cols] into `out` (int8_panel_bytes(n_cols) * ceil(n_rows / 16) bytes).
void int8_pack(const float * rows, int64_t n_rows, int64_t n_cols, int8_t * out);

// What the product's node does besides w x, so that a layer's projections are one node each and
// projections of one input share one quantisation of it:
// * bias: f32 [n_rows], added to each column;
// * residual: f32 [n_rows, m], contiguous, added after the bias (y = residual + (w x + bias), rounded as two
//   ggml_add nodes would round it: the same bits);
// * n_split: the rows as n_split equal blocks of whole panels (several matrices packed one after another),
//   y [n_rows / n_split, m, n_split], so that each block's output is a contiguous [n_rows / n_split, m].
struct int8_epilogue {
    ggml_tensor * bias = nullptr;
    ggml_tensor * residual = nullptr;
    int64_t n_split = 1;
};

// y = w x: w a packed I8 tensor [int8_panel_bytes(n_cols), n_panels] of n_rows real rows, x [n_cols, m] f32.
// Two nodes: the activations are quantised per column first (u8 with an offset of 128, and a scale).
ggml_tensor * int8_matmul(ggml_context * ctx, ggml_tensor * w, int64_t n_rows, ggml_tensor * x,
                          const int8_epilogue & e = {});

}  // namespace aural
