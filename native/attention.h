// The encoder's self-attention and the decoder's cross-attention on the CPU, as Aural's own ops. The encoder's:
// softmax(q k^T / sqrt(head_dim)) v per head, with no mask (every audio position sees every other).
//
//   out = encoder_self_attention(ctx, q, kt, v, n_head);  // q, v: [n_state, n]; kt: [n, n_state]; out like q
//
// Why not ggml_flash_attn_ext: at 1500 positions ggml-cpu's flash attention reaches about half the speed of
// its own matrix products (41 ms per layer against ~22 ms for the same 3.5 GFLOP on 2 cores, tiny.en), and
// three ggml ops (mul_mat, soft_max, mul_mat) are slower still, since q k^T has an inner size of only 64 and
// the 1500 x 1500 x n_head scores go through memory. This op keeps a block of 32 query rows' scores
// (32 x n floats) in the core's cache and computes both products with register-tiled broadcast FMAs.
// K comes transposed (kt: row d holds dimension d of every position), which the projection gives for free:
// ggml_mul_mat(x, w_k) instead of ggml_mul_mat(w_k, x).
//
// CPU only (x86-64 with AVX-512 or AVX2); encoder_attention_available() says whether this CPU has it.
#pragma once

#include "ggml.h"

namespace aural {

// Whether this CPU runs the op (AVX-512F or AVX2 with FMA).
bool encoder_attention_available();

// q, kt, v: contiguous f32 as above, head_dim = n_state / n_head a multiple of 32. Result [n_state, n] f32,
// heads concatenated per position as in Whisper's MultiHeadAttention before its output projection.
ggml_tensor * encoder_self_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * kt, ggml_tensor * v,
                                     int n_head);

// The decoder's cross-attention on the CPU, softmax(q k^T / sqrt(64)) v per head, over the window's cross K/V
// as the KV arena holds them (f16 views: kv_cache::get_cross_k, get_cross_v):
//
//   out = decoder_cross_attention(ctx, q, k, vt, n_head);  // q [n_state, n_q] f32 -> out like q
//   // k [64, n_cross, n_head] f16, vt [n_cross, 64, n_head] f16 (V transposed), head_dim 64
//
// Why: ggml's mul_mat, soft_max, mul_mat take half of a beam-5 step over 1500 positions (tiny.en, Zen 4),
// most of it in one 64-long f16 dot call per position, query row and head; this op converts each K row once
// per step for every query row and keeps the softmaxed weights in f32. It returns no weights, so graphs that
// read the alignment heads keep ggml's ops in those layers. CPU only; cross_attention_available() says
// whether this CPU runs it (AVX-512F, or AVX2 with FMA and F16C).
bool cross_attention_available();
ggml_tensor * decoder_cross_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * vt,
                                      int n_head);

// The decoder's self-attention on the CPU over the KV arena (kv_cache::get_k, get_v), each query row seeing
// the cells its mask row leaves at 0 (the others are -inf); the same instruction sets as the cross op:
//
//   out = decoder_self_attention(ctx, q, k, v, mask, n_head);  // q [n_state, n_q] f32 -> out like q
//   // k, v [64, n_ctx, n_head] f16; mask [n_ctx, >= n_q] f16
//   out = decoder_self_attention(ctx, q, k, v, mask, n_head, rows);  // a paged arena (kv-pool.h):
//   // k, v [64, n_pool_rows, n_head] f16 over the pool; rows [n_ctx] i32, the row of each cell
//
// Why: ggml-cpu's flash attention costs ~100 ns per visible cell and head (an f16 dot call, an online-softmax
// rescale and V accumulated in f16, per cell): 0.8 ms of a 3.5 ms greedy step once a 224-token prompt is in
// the arena (tiny.en, Zen 2). Here a row's visible cells are scored, softmaxed in f32 and summed from V in
// registers. A row that sees no cell gets zeros.
ggml_tensor * decoder_self_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                     ggml_tensor * mask, int n_head, ggml_tensor * rows = nullptr);

}  // namespace aural
