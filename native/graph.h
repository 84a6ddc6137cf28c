// Graph builders for the Whisper encoder and decoder, and the rules for reusing a built graph.
//
//   decode_params p{/*n_tokens=*/1, /*n_outputs=*/1};
//   if (!reuse_enabled || !last || !last->can_reuse(p)) last = build_decoder(model, kv, p);  // else ++reuses
//   last->set_inputs(batch);   // tokens, positions, KV cells, mask: the only per-step data
//
// A graph is "single-use in terms of allocation, multi-use in terms of computation" (ggml): the
// decoder's shapes depend only on (n_tokens, n_outputs) because attention always spans the whole
// arena (masked), so every one-token step after the first reuses the same graph.
// Thread-safety: a graph belongs to one context.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ggml.h"
#include "kv-cache.h"
#include "model.h"

namespace aural {

// What one decoder step feeds: tokens of one or more sequences and which batch rows need logits.
struct decode_batch {
    const int32_t * tokens = nullptr;
    uint32_t n_tokens = 0;
    std::vector<int32_t> pos;      // [n_tokens] decoder position of each token
    std::vector<int32_t> seq;      // [n_tokens] sequence (beam) of each token
    std::vector<int32_t> outputs;  // batch indices whose logits are returned
    // Filled by the context before the graph's inputs are set:
    std::vector<int64_t> cells;        // [n_tokens] arena cell each token's K/V goes to
    const kv_cells * kv = nullptr;     // the arena's bookkeeping after this step, for the mask
    // A step of several contexts (stream_batch): each one's own batch, its tokens a run of this one's in
    // order; cells and kv are then theirs. Empty for one context's step.
    std::vector<const decode_batch *> parts;

    const decode_batch & part(size_t j) const { return parts.empty() ? *this : *parts[j]; }
};

// One context's share of a decoder graph: its arena, its tokens (a run of the batch) and its window's
// encoder positions (cross-attention length).
struct decode_part {
    const kv_cache * kv = nullptr;
    uint64_t kv_id = 0;  // kv->id(): a graph built on a freed arena must not match a new one at its address
    uint32_t n_tokens = 0;
    uint32_t n_cross = 0;
    bool operator==(const decode_part & o) const {
        return kv_id == o.kv_id && n_tokens == o.n_tokens && n_cross == o.n_cross;
    }
};

// Everything the decoder graph's topology depends on. Equal params => the same graph shape.
struct decode_params {
    uint32_t n_tokens = 0;
    uint32_t n_outputs = 0;
    uint32_t n_cross = 0;  // encoder positions of the current window (cross-attention length)
    std::vector<decode_part> parts;  // several contexts in one graph (stream_batch); empty: one context
    bool operator==(const decode_params & o) const {
        return n_tokens == o.n_tokens && n_outputs == o.n_outputs && n_cross == o.n_cross && parts == o.parts;
    }
};

// One input tensor of a graph: fills itself from a batch and says whether it fits new params.
class graph_input {
  public:
    virtual ~graph_input() = default;
    virtual void set_input(const decode_batch & batch) = 0;
    // Conservative by default: an input that cannot tell must force a rebuild.
    virtual bool can_reuse(const decode_params & p) const { return false; }
};

class graph_result {
  public:
    explicit graph_result(size_t max_nodes);
    ~graph_result();
    graph_result(const graph_result &) = delete;
    graph_result & operator=(const graph_result &) = delete;

    bool can_reuse(const decode_params & p) const;
    void set_inputs(const decode_batch & batch);
    // The computed logits [n_outputs][n_vocab] into `out`, the rescored ones written over the screen's.
    void read_logits(float * out) const;

    ggml_context * ctx = nullptr;   // tensor metadata only; data lives in the scheduler's buffers
    ggml_cgraph * gf = nullptr;
    decode_params params;
    std::vector<std::unique_ptr<graph_input>> inputs;
    ggml_tensor * mel = nullptr;     // encoder input [2 * n_audio_ctx, n_mels]
    uint32_t n_audio_ctx = 0;        // encoder positions this graph was built for
    ggml_tensor * logits = nullptr;  // decoder output [n_vocab, n_outputs]
    ggml_tensor * top = nullptr;     // screened decoders: [screen_top_k, n_outputs] i32 ids rescored exactly
    ggml_tensor * exact = nullptr;   // [screen_top_k, 1, n_outputs] their logits from tok_emb
    ggml_tensor * cross_qk = nullptr;  // aligner output [n_cross, n_tokens, n_heads]: cross-attention weights
};

// One cross-attention head whose weights follow the audio-text alignment (ref: openai-whisper
// model.py `alignment_heads`, timing.py find_alignment).
struct align_head {
    int layer = 0, head = 0;
};

// Graph capacity: a Whisper layer is ~60 nodes; large-v3 has 32+32 layers.
constexpr size_t max_graph_nodes = 8192;

// Encoder: mel [2*n_ctx, n_mels] -> conv stem -> transformer -> cross K/V rows [0, n_ctx) of `kv`.
// n_ctx < hp.n_audio_ctx encodes a shorter audio context (ref: whisper.cpp `audio_ctx`): the
// cost falls with it (attention quadratically), at some cost in accuracy the caller must weigh.
// Helpers for graphs over several contexts' tokens (a part each), shared with qwen3-graph.h.
// Columns [begin, begin + n) of x [n_state, n_tokens]: a contiguous view (x itself when that is all of it).
ggml_tensor * columns(ggml_context * ctx, ggml_tensor * x, int64_t begin, int64_t n);
// The parts' results [n_state, n_j] side by side in batch order.
ggml_tensor * join(ggml_context * ctx, const std::vector<ggml_tensor *> & outs);

std::unique_ptr<graph_result> build_encoder(const model & m, const kv_cache & kv, uint32_t n_ctx);
// Decoder: token batch -> logits of the requested outputs; writes the batch's K/V into `kv`.
// With `heads`, also outputs the softmaxed cross-attention weights of those heads (`cross_qk`),
// which the cross-attention materialises anyway (it runs as matrix products, not flash attention).
std::unique_ptr<graph_result> build_decoder(const model & m, const kv_cache & kv, const decode_params & p,
                                            const std::vector<align_head> & heads = {});
// The same for the steps of several contexts (p.parts, in batch order): the layers' matrix products run once
// over every part's tokens, each part's self- and cross-attention on its own arena and window.
std::unique_ptr<graph_result> build_decoder(const model & m, const decode_params & p);

}  // namespace aural
