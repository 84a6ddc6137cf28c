// One decoder step of several Qwen3-ASR sessions in one graph: continuous batching across streams, as
// stream-batch.h does for Whisper.
//
//   aural::qwen3_stream_batch batch(*model, /*n_threads=*/0);
//   batch.decode({&ctx_a, &ctx_b}, {{next_a}, {next_b}}, {logits_a, logits_b});  // one graph for both
//
// Each context keeps its own KV arena: the graph runs the layers' projections and the output head (the weights,
// nearly all of a step's memory traffic: 0.8 GB a step at the 0.6B shape in q8_0) once over every context's
// tokens, and each context's attention on its own arena (qwen3-graph.h, parts). Its tokens are appended, and
// its timings and counters kept, as if it had decoded alone; its logits are the same but for the summation
// order of the batched products. The graph is reused while the same contexts step with the same token counts.
// Thread-safety: one caller at a time; the contexts must not be used by their own threads meanwhile (their
// threads wait for this step's logits). Contexts must be of this batch's model, keep their KV on the device, and
// step at most `max_tokens_per_context` tokens.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend.h"
#include "qwen3-context.h"
#include "qwen3-graph.h"

namespace aural {

class qwen3_stream_batch {
  public:
    qwen3_stream_batch(const qwen3_model & m, int n_threads);
    ~qwen3_stream_batch();
    qwen3_stream_batch(const qwen3_stream_batch &) = delete;
    qwen3_stream_batch & operator=(const qwen3_stream_batch &) = delete;

    // tokens[i] appended to contexts[i] -> logits[i] [n_vocab] of its last token. Throws std::invalid_argument
    // naming the index of a step that is not allowed here (before any context changes). A graph that fails to
    // compute leaves every context cleared, as its own decode would, and throws std::runtime_error.
    void decode(const std::vector<qwen3_context *> & contexts, const std::vector<std::vector<int32_t>> & tokens,
                const std::vector<float *> & logits);

    static constexpr uint32_t max_tokens_per_context = 8;  // a step is one token; a few allow a forced word
    static constexpr uint32_t max_contexts = 16;

    const qwen3_model & mdl;
    uint64_t n_steps = 0, graph_builds = 0, graph_reuses = 0;
    double compute_ms_total = 0;

  private:
    std::atomic<bool> never_{false};  // a shared step is not interrupted
    std::unique_ptr<backend_set> backends_;
    ggml_backend_sched_t sched_ = nullptr;
    qwen3_decoder_graph graph_;  // the last graph built, allocated by sched_; its ctx is owned here
    std::vector<std::pair<uint64_t, int64_t>> shape_;  // (arena id, tokens) per part of graph_
    bool reuse_enabled_ = true;

    void check(const std::vector<qwen3_context *> & contexts, const std::vector<std::vector<int32_t>> & tokens) const;
    void prepare(const std::vector<qwen3_part> & parts, qwen3_timings & t);
};

}  // namespace aural
