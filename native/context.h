// One transcription session on a loaded model: backends, schedulers, the KV arena, graphs, timings.
//
//   aural::context ctx(*model, {/*kv_mode=*/kv_mode::device, /*graph_reuse=*/true, /*n_threads=*/0});
//   ctx.encode(mel.data());                                 // [n_mels, 3000] row-major, one 30 s window
//   ctx.decode(batch, logits.data());                       // logits [n_outputs, n_vocab]
//   ctx.reorder({0, 0, 1});                                 // beams: new sequences continue old ones
//   ctx.last_step.kv_io_bytes;                              // 0 in device mode
//
// Thread-safety: one context per thread; the model it uses may be shared by several contexts.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "ggml-backend.h"
#include "graph.h"
#include "kv-cache.h"
#include "model.h"

namespace aural {

enum class kv_mode {
    device,  // the KV history stays in the backend's memory; each step writes only its new rows
    host,    // baseline: history on the host, uploaded before and read back after every step
};

struct context_params {
    kv_mode mode = kv_mode::device;
    bool graph_reuse = true;  // env: AURAL_NO_GRAPH_REUSE=1 turns it off as well (debugging)
    int n_threads = 0;        // CPU threads; 0 = the model's default
    uint32_t n_seq = 1;       // sequences decoded side by side (beam size, best-of); at most 8
    uint32_t max_ubatch = 0;  // most tokens per decoder graph, longer batches go in pieces; 0 = the
                              // device's limit (decoder_ubatch_limit in backend.h)
    std::shared_ptr<kv_pool> pool;  // device mode: the self K/V in this pool's blocks (kv-pool.h); of the
                                    // context's model and device
    uint32_t max_audio_ctx = 0;     // the most encoder positions a window may have: the cross K/V and the
                                    // compute buffers are reserved for it; 0 = the model's (a 30 s window)
};

using clock_type = std::chrono::steady_clock;

// Milliseconds from `t0` to now: what the timings below are made of.
inline double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// Timings of one decoder step (milliseconds, bytes).
struct step_timings {
    double compute_ms = 0;    // graph compute, synchronised
    double kv_io_ms = 0;      // host<->device KV traffic (host mode only)
    size_t kv_io_bytes = 0;
    double logits_ms = 0;     // reading the logits back
    double build_ms = 0;      // building + allocating a graph (0 when reused)
    uint32_t n_tokens = 0;
    uint32_t n_graphs = 0;    // decoder graphs run: more than one when the batch exceeds ubatch()
    bool reused = false;      // every graph of the step was reused
};

struct encode_timings {
    double encoder_ms = 0;
    double kv_io_ms = 0;      // host mode: reading the cross K/V back to the host
    size_t kv_io_bytes = 0;
};

struct context_stats {
    uint64_t graph_builds = 0, graph_reuses = 0, decode_calls = 0, tokens_decoded = 0, encode_calls = 0;
    uint64_t encoder_builds = 0, reorders = 0, align_calls = 0;
    double encoder_ms_total = 0, compute_ms_total = 0, kv_io_ms_total = 0, logits_ms_total = 0;
    uint64_t kv_io_bytes_total = 0;
};



// Thrown by every compute of a context after `context::interrupt()`.
struct interrupted_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class context {
  public:
    context(const model & m, const context_params & params);
    ~context();
    context(const context &) = delete;
    context & operator=(const context &) = delete;

    // mel: [n_mels, n_frames] row-major floats, one window of log-mel features; n_frames is even and
    // at most 2 * n_audio_ctx (3000 = 30 s). Fewer frames encode a shorter audio context.
    void encode(const float * mel, uint32_t n_frames);
    // Appends batch.tokens at batch.pos of sequences batch.seq and writes logits
    // [outputs.size(), n_vocab] to `logits`.
    void decode(decode_batch & batch, float * logits);
    // Beam reorder: new sequence j continues old sequence parents[j]; sequences not named end.
    // Bookkeeping only: no K/V row moves.
    void reorder(const std::vector<int32_t> & parents);
    // Teacher-forces `tokens` (sequence 0, positions 0..) through the decoder on the window last
    // encoded and returns the cross-attention weights of `heads` [heads, n_tokens, n_cross] in `weights`
    // and the logits of every position [n_tokens, n_vocab] in `logits`. Replaces sequence 0's cells.
    void align(const int32_t * tokens, uint32_t n_tokens, const std::vector<align_head> & heads, float * weights,
               float * logits);
    void clear_kv();
    // Callable from any thread: the graph being computed stops before its next node (on backends with an
    // abort hook: the CPU; a GPU finishes the graph it runs), and this and every later encode, decode or
    // align throws interrupted_error. A cancelled transcription so waits for one node, not one window.
    void interrupt() { interrupted_.store(true); }
    bool interrupted() const { return interrupted_.load(); }

    const model & mdl;
    const context_params params;
    step_timings last_step;
    encode_timings last_encode;
    context_stats stats;
    backend_report encoder_report, decoder_report;
    const kv_cache & kv() const { return *kv_; }
    size_t compute_buffer_bytes() const;
    uint32_t ubatch() const { return ubatch_; }  // most tokens one decoder graph takes
    static constexpr uint32_t max_outputs = 8;  // logits rows per step (beams + the SOT row)
    static constexpr uint32_t max_seq = 8;      // sequences per context (beams or best-of samples)

  private:
    friend class stream_batch;  // decodes this context's steps in graphs shared with other contexts

    std::atomic<bool> interrupted_{false};  // polled by the backends between graph nodes
    std::unique_ptr<backend_set> backends_;
    ggml_backend_sched_t sched_enc_ = nullptr, sched_dec_ = nullptr;
    std::unique_ptr<kv_cache> kv_;
    std::unique_ptr<graph_result> enc_graph_, dec_graph_;
    bool reuse_enabled_ = true;
    uint32_t ubatch_ = 0;

    void use_encoder(uint32_t n_ctx);  // (re)builds the encoder graph for n_ctx positions
    void reserve_worst_case();
    void compute(ggml_backend_sched_t sched, ggml_cgraph * gf);
    void check_batch(const decode_batch & batch) const;
    uint32_t place(decode_batch & ub);
    void decode_ubatch(decode_batch & ub, float * logits);
    void align_ubatch(decode_batch & ub, const std::vector<align_head> & heads, float * weights, float * logits);
    void kv_upload(uint32_t n_rows, step_timings & t);
    void kv_download(const decode_batch & batch, step_timings & t);
};

// Cells of the KV arena of a session decoding n_seq sequences side by side: its worst case.
uint32_t arena_cells(const hparams & hp, uint32_t n_seq);

const char * kv_mode_name(kv_mode mode);
kv_mode parse_kv_mode(const std::string & name);  // throws std::invalid_argument naming the accepted values

}  // namespace aural
