// Graphs of Qwen3-ASR's text decoder (qwen3-model.h) over KV arenas (kv-cache.h): for each part (one session's
// arena), a batch of tokens at consecutive positions of its one sequence, their K/V written into that arena in
// place; the logits of each part's last token, or of every token. Several parts are several sessions' steps in
// one graph (qwen3-stream-batch.h): the projections run once over all their tokens, each part's attention on its
// own arena. The audio tower's graph is in qwen3-audio.h.
//
//   qwen3_decoder_graph g = build_qwen3_decoder(model, {{&kv, /*n_tokens=*/n}}, /*n_audio=*/a, /*all_logits=*/false);
//   // allocate g.gf, set g.tokens, g.rope_cos/sin, each part's g.cells[i] and g.mask[i] (and g.audio,
//   // g.embed_order), compute, read g.logits
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
#include <vector>

#include "ggml.h"
#include "kv-cache.h"
#include "qwen3-model.h"

namespace aural {

// One session's tokens in a decoder graph: they follow the previous part's in the graph's token order.
struct qwen3_part {
    const kv_cache * kv = nullptr;
    int64_t n_tokens = 0;
};

struct qwen3_decoder_graph {
    ggml_context * ctx = nullptr;  // the graph's tensor metadata; the caller frees it
    ggml_cgraph * gf = nullptr;
    ggml_tensor * tokens = nullptr;      // i32 [n_tokens]: every part's, in order
    ggml_tensor * rope_cos = nullptr;    // f32 [head_dim / 2, n_tokens]: each token's RoPE angles' cosines
    ggml_tensor * rope_sin = nullptr;    // and sines (qwen3_rope_table)
    std::vector<ggml_tensor *> cells;    // per part: i64 [its n_tokens], arena rows of the new K/V (kv_cache::apply)
    std::vector<ggml_tensor *> mask;     // per part: f16 [its n_ctx, its n_tokens], 0 where a token sees a cell, -inf elsewhere
    ggml_tensor * audio = nullptr;       // f32 [n_state, n_audio]: audio embeddings, or null
    ggml_tensor * embed_order = nullptr;  // i32 [n_tokens]: the row of [token embeddings, audio] each token takes
    ggml_tensor * logits = nullptr;      // f32 [n_vocab, n_parts (each part's last token) or n_tokens]
};

// The RoPE table of positions pos[0..n): cos and sin [n][head_dim / 2] of pos * theta^(-2i / head_dim), formed in
// double and rounded once to f32.
void qwen3_rope_table(const qwen3_model & m, const int32_t * pos, int64_t n, float * cos, float * sin);

// The most nodes a decoder graph of `m` over n_parts parts has (a scheduler's size).
size_t qwen3_graph_size(const qwen3_model & m, size_t n_parts);

// n_audio > 0 (audio embeddings in place of the audio tokens) takes one part.
qwen3_decoder_graph build_qwen3_decoder(const qwen3_model & m, const std::vector<qwen3_part> & parts, int64_t n_audio,
                                        bool all_logits);

}  // namespace aural
