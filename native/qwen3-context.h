// One Qwen3-ASR decoding session: the text decoder's KV arena in device memory (kv-cache.h; grouped-query,
// n_head_kv heads per layer, no cross-attention rows) and the compute that runs the decoder's graphs
// (qwen3-graph.h) on it. A prompt is decoded in one batch, each new token in one step; the K/V rows of every
// token are appended in place and never leave the arena.
//
//   aural::qwen3_context c(*model, /*n_ctx=*/1024);
//   c.decode(prompt.data(), n, audio.data(), n_audio, logits.data(), /*all=*/false);  // prefill
//   c.decode(&next, 1, nullptr, 0, logits.data(), false);                           // one step
//   c.last();  // that call's compute and KV I/O time
//
// Graph reuse: a graph's shape depends only on (n_tokens, n_audio, all) (qwen3_graph_shape), as attention spans
// the whole arena, masked; so every one-token step after the first runs the graph the first one built, with new
// inputs. One switch (graph_reuse, or AURAL_NO_GRAPH_REUSE=1) turns it off; stats() counts builds and reuses.
//
// kv_mode::host is the baseline of the design's measurements (context.h): the history lives on the host and
// every call uploads all of it and reads the new rows back, the traffic a decoder that rebuilds its KV prefix
// each token pays; Qwen3-ASR-0.6B's 28 layers of 8 K/V heads make it 112 KiB a token.
//
// The graphs run on the model's device through a scheduler (backend.h backend_set): ops the device lacks run on
// the CPU, and report() names them.
// A device-mode context's one-token steps may also run in a graph shared with other contexts
// (qwen3-stream-batch.h), which appends to its arena and counts its timings as this class's decode does.
// Thread-safety: one thread at a time; the model may be shared by contexts on other threads.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "context.h"
#include "ggml-backend.h"
#include "kv-cache.h"
#include "qwen3-graph.h"
#include "qwen3-model.h"

namespace aural {

// One decode call's cost.
struct qwen3_timings {
    double compute_ms = 0.0;  // the graph (prompt batch or step)
    double kv_io_ms = 0.0;    // host mode: uploading the history and reading the new rows back
    size_t kv_io_bytes = 0;
    double build_ms = 0.0;    // building and allocating the graph (0 when reused)
    bool reused = false;
};

struct qwen3_stats {
    uint64_t graph_builds = 0, graph_reuses = 0;
};

// What a decoder graph's topology depends on: equal shapes run the same graph.
struct qwen3_graph_shape {
    int64_t n_tokens = 0, n_audio = 0;
    bool all_logits = false;
    bool operator==(const qwen3_graph_shape & o) const {
        return n_tokens == o.n_tokens && n_audio == o.n_audio && all_logits == o.all_logits;
    }
};

class qwen3_context {
  public:
    // n_ctx: the most tokens (prompt, audio and text) the session holds; kv_type: f16 (the default, half the
    // bytes) or f32 (for comparisons with an f32 reference: no rounding of K and V).
    // max_ubatch: the most tokens per graph, a longer batch running in pieces (0: the device's limit).
    qwen3_context(const qwen3_model & m, uint32_t n_ctx, ggml_type kv_type = GGML_TYPE_F16,
                  kv_mode mode = kv_mode::device, bool graph_reuse = true, uint32_t max_ubatch = 0);
    ~qwen3_context();
    qwen3_context(const qwen3_context &) = delete;
    qwen3_context & operator=(const qwen3_context &) = delete;

    // Appends tokens[0..n) at positions n_past() ..; `audio` [n_audio][n_state] replaces the embeddings of the
    // tokens equal to the audio token, in order (their count must be n_audio; with no audio, such a token keeps
    // its own embedding, as a generated one does in the official code). Writes the logits of the last
    // token [n_vocab], or with `all` of every token [n][n_vocab]. Throws std::invalid_argument for bad input
    // and std::length_error when the arena would overflow (nothing is appended then). last() sums the pieces'
    // times when the batch ran in several graphs.
    void decode(const int32_t * tokens, int64_t n, const float * audio, int64_t n_audio, float * logits, bool all);
    uint32_t n_past() const { return n_past_; }
    // Forget the tokens at positions n_past and after (a prompt whose head is unchanged keeps that head's K/V:
    // streaming re-feeds its audio so); the next decode appends at n_past. Throws when n_past > n_past().
    void rewind(uint32_t n_past);
    void clear();  // forget every token
    const kv_cache & kv() const { return *kv_; }
    size_t compute_bytes() const;
    const backend_report & report() const { return report_; }  // where the last graph built runs
    const qwen3_timings & last() const { return last_; }
    const qwen3_stats & stats() const { return stats_; }
    kv_mode mode() const { return mode_; }

  private:
    friend class qwen3_stream_batch;  // decodes this context's steps in graphs shared with other contexts

    bool can_reuse(const qwen3_graph_shape & shape) const { return reuse_enabled_ && graph_.gf && shape == shape_; }
    void run(const int32_t * tokens, int64_t n, const std::vector<int32_t> & pos, const std::vector<int64_t> & cells,
             const float * audio, int64_t n_audio, const std::vector<int64_t> & audio_rows, float * logits, bool all);
    // This context's cells and mask in part `part` of graph g: its tokens at positions pos, placed at `cells`.
    void set_part_inputs(const qwen3_decoder_graph & g, size_t part, const int32_t * pos,
                         const std::vector<int64_t> & cells) const;

    const qwen3_model & m_;
    std::unique_ptr<kv_cache> kv_;
    std::unique_ptr<backend_set> backends_;
    ggml_backend_sched_t sched_ = nullptr;
    uint32_t n_past_ = 0;
    kv_mode mode_ = kv_mode::device;
    // Most tokens per graph (backend.h decoder_ubatch_limit: 31 on Vulkan, whose flash attention's mask pass
    // crashed llvmpipe, as it did Whisper's decoder); a longer batch runs as pieces in order.
    uint32_t ubatch_ = 0;
    bool reuse_enabled_ = true;
    qwen3_decoder_graph graph_;  // the last graph built, allocated by sched_; its ctx is owned here
    qwen3_graph_shape shape_;
    qwen3_timings last_;
    qwen3_stats stats_;
    backend_report report_;
};

}  // namespace aural
