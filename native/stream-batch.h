// One decoder step of several sessions in one graph: continuous batching across streams.
//
//   aural::stream_batch batch(*model, /*n_threads=*/0);
//   batch.decode({&ctx_a, &ctx_b}, {&step_a, &step_b}, {logits_a, logits_b});  // one graph for both
//
// Each context keeps its own KV arena and window: the graph runs the layers' matrix products (the weights,
// the bulk of a step's memory traffic) once over every context's tokens, and each context's self- and
// cross-attention on its own arena (graph.h, decoder parts). Its cells are placed and its timings and
// counters kept as if it had decoded alone, and its logits are the same numbers but for the summation
// order of the batched products. The graph is reused while the same contexts step with the same shapes.
// Thread-safety: one caller at a time; the contexts must not be used by their own threads meanwhile
// (their threads wait for this step's logits). Contexts must be of this batch's model, keep their KV on
// the device, and step at most `max_tokens_per_context` tokens.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "backend.h"
#include "context.h"
#include "graph.h"

namespace aural {

class stream_batch {
  public:
    stream_batch(const model & m, int n_threads);
    ~stream_batch();
    stream_batch(const stream_batch &) = delete;
    stream_batch & operator=(const stream_batch &) = delete;

    // steps[i] of contexts[i] (its tokens, positions, sequences, outputs) -> logits[i] [outputs, n_vocab].
    // Throws std::invalid_argument naming the index of a step that is not allowed here (before any context
    // changes), and interrupted_error when a context was interrupted.
    void decode(const std::vector<context *> & contexts, const std::vector<decode_batch *> & steps,
                const std::vector<float *> & logits);

    static constexpr uint32_t max_tokens_per_context = context::max_outputs;  // a step: one token per beam
    static constexpr uint32_t max_contexts = 16;

    const model & mdl;
    uint64_t n_steps = 0, graph_builds = 0, graph_reuses = 0;
    double compute_ms_total = 0;

  private:
    std::atomic<bool> never_{false};  // a shared step is not interrupted: each context's flag is checked first
    std::unique_ptr<backend_set> backends_;
    ggml_backend_sched_t sched_ = nullptr;
    std::unique_ptr<graph_result> graph_;
    bool reuse_enabled_ = true;

    void check(const std::vector<context *> & contexts, const std::vector<decode_batch *> & steps) const;
};

}  // namespace aural
