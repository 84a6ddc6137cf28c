// Graphs of Qwen3-ASR's text decoder (qwen3-model.h) over a KV arena (kv-cache.h): a batch of tokens at
// consecutive positions of one sequence, their K/V written into the arena in place, the logits of the last
// token or of all of them. The audio tower's graph is in qwen3-audio.h.
//
//   qwen3_decoder_graph g = build_qwen3_decoder(model, kv, /*n_tokens=*/n, /*n_audio=*/a, /*all_logits=*/false);
//   // allocate g.gf, set g.tokens, g.rope_cos/sin, g.cells, g.mask (and g.audio, g.embed_order), compute, read g.logits
//
// The reference is Qwen's modelling code (qwen-asr 0.0.6, modeling_qwen3_asr.py, Qwen3ASRThinkerTextModel):
// RMSNorm before attention and MLP, q- and k-norm over each head, RoPE on q and k (rotate_half: ggml's NEOX
// layout, by a table of angles; the three MRoPE position axes carry the same positions for audio and text,
// which is plain RoPE),
// grouped-query attention (K/V head j serves query heads j g .. j g + g - 1, g = n_head / n_head_kv, as
// repeat_kv and ggml's broadcast both do), SwiGLU, a final RMSNorm and the output projection.
// Thread-safety: free functions; the graph is the caller's.
#pragma once

#include <cstdint>

#include "ggml.h"
#include "kv-cache.h"
#include "qwen3-model.h"

namespace aural {

struct qwen3_decoder_graph {
    ggml_context * ctx = nullptr;  // the graph's tensor metadata; the caller frees it
    ggml_cgraph * gf = nullptr;
    ggml_tensor * tokens = nullptr;      // i32 [n_tokens]
    ggml_tensor * rope_cos = nullptr;    // f32 [head_dim / 2, n_tokens]: each token's RoPE angles' cosines
    ggml_tensor * rope_sin = nullptr;    // and sines (qwen3_rope_table)
    ggml_tensor * cells = nullptr;       // i64 [n_tokens]: arena rows of the new K/V (kv_cache::apply)
    ggml_tensor * mask = nullptr;        // f16 [n_ctx, n_tokens]: 0 where a token sees a cell, -inf elsewhere
    ggml_tensor * audio = nullptr;       // f32 [n_state, n_audio]: audio embeddings, or null
    ggml_tensor * embed_order = nullptr;  // i32 [n_tokens]: the row of [token embeddings, audio] each token takes
    ggml_tensor * logits = nullptr;      // f32 [n_vocab, 1 or n_tokens]
};

// The RoPE table of positions pos[0..n): cos and sin [n][head_dim / 2] of pos * theta^(-2i / head_dim), formed in
// double and rounded once to f32.
void qwen3_rope_table(const qwen3_model & m, const int32_t * pos, int64_t n, float * cos, float * sin);

// The most nodes a decoder graph of `m` has (a scheduler's size).
size_t qwen3_graph_size(const qwen3_model & m);

qwen3_decoder_graph build_qwen3_decoder(const qwen3_model & m, const kv_cache & kv, int64_t n_tokens, int64_t n_audio,
                                        bool all_logits);

}  // namespace aural
