#include "qwen3-stream-batch.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace aural {

qwen3_stream_batch::qwen3_stream_batch(const qwen3_model & m, int n_threads) : mdl(m) {
    reuse_enabled_ = !env_flag("AURAL_NO_GRAPH_REUSE");
    backends_ = std::make_unique<backend_set>(m.dev, n_threads > 0 ? n_threads : m.n_threads, &never_);
    sched_ = backends_->make_sched(sched_size(qwen3_graph_size(m, max_contexts)));
}

qwen3_stream_batch::~qwen3_stream_batch() {
    if (graph_.ctx) ggml_free(graph_.ctx);
    if (sched_) ggml_backend_sched_free(sched_);
}

void qwen3_stream_batch::check(const std::vector<qwen3_context *> & contexts,
                               const std::vector<std::vector<int32_t>> & tokens) const {
    if (contexts.empty() || contexts.size() != tokens.size() || contexts.size() > max_contexts) {
        throw std::invalid_argument("a shared step takes 1 to " + std::to_string(max_contexts) +
                                    " contexts, one step each");
    }
    std::set<const qwen3_context *> seen;
    for (size_t i = 0; i < contexts.size(); ++i) {
        const qwen3_context & c = *contexts[i];
        const std::vector<int32_t> & step = tokens[i];
        const std::string which = "step " + std::to_string(i) + ": ";
        if (&c.m_ != &mdl || c.mode_ != kv_mode::device || !seen.insert(&c).second) {
            throw std::invalid_argument(which + "its context is of another model, keeps its KV on the host, or "
                                                "appears twice");
        }
        if (step.empty() || step.size() > max_tokens_per_context) {
            throw std::invalid_argument(which + "a shared step has 1 to " + std::to_string(max_tokens_per_context) +
                                        " tokens");
        }
        for (int32_t t : step) {
            if (t < 0 || static_cast<uint32_t>(t) >= mdl.hp.text.n_vocab) {
                throw std::invalid_argument(which + "token " + std::to_string(t) + " is outside the vocabulary");
            }
        }
        if (c.n_past_ + step.size() > c.kv_->n_ctx()) {
            throw std::invalid_argument(which + "the context holds " + std::to_string(c.kv_->n_ctx()) + " tokens");
        }
    }
}

// The graph for `parts`: the last one where it has the same arenas and token counts, else a new one.
void qwen3_stream_batch::prepare(const std::vector<qwen3_part> & parts, qwen3_timings & t) {
    std::vector<std::pair<uint64_t, int64_t>> shape;
    for (const qwen3_part & p : parts) shape.emplace_back(p.kv->id(), p.n_tokens);
    if (reuse_enabled_ && graph_.gf && shape == shape_) {
        ++graph_reuses;
        return;
    }
    const auto t0 = clock_type::now();
    t.reused = false;
    if (graph_.ctx) ggml_free(graph_.ctx);
    graph_ = {};
    shape_.clear();
    ggml_backend_sched_reset(sched_);
    graph_ = build_qwen3_decoder(mdl, parts, 0, false);
    if (!ggml_backend_sched_alloc_graph(sched_, graph_.gf)) {
        ggml_free(graph_.ctx);
        graph_ = {};
        throw std::runtime_error("cannot allocate the shared decoder graph (out of memory?)");
    }
    shape_ = std::move(shape);
    ++graph_builds;
    t.build_ms = ms_since(t0);
}

void qwen3_stream_batch::decode(const std::vector<qwen3_context *> & contexts,
                                const std::vector<std::vector<int32_t>> & tokens, const std::vector<float *> & logits) {
    check(contexts, tokens);
    // Every context places its tokens in its own arena, at its next positions, as its own decode would.
    std::vector<qwen3_part> parts;
    std::vector<std::vector<int32_t>> pos(contexts.size());
    std::vector<std::vector<int64_t>> cells(contexts.size());
    std::vector<int32_t> all_tokens, all_pos;
    qwen3_timings t;
    t.reused = true;
    try {
        for (size_t i = 0; i < contexts.size(); ++i) {
            qwen3_context & c = *contexts[i];
            kv_update step;
            for (size_t k = 0; k < tokens[i].size(); ++k) {
                pos[i].push_back(static_cast<int32_t>(c.n_past_ + k));
                step.seq.push_back(0);
            }
            step.pos = pos[i];
            cells[i] = c.kv_->apply(step);
            parts.push_back({c.kv_.get(), static_cast<int64_t>(tokens[i].size())});
            all_tokens.insert(all_tokens.end(), tokens[i].begin(), tokens[i].end());
            all_pos.insert(all_pos.end(), pos[i].begin(), pos[i].end());
        }
        prepare(parts, t);
        const qwen3_decoder_graph & g = graph_;
        ggml_backend_tensor_set(g.tokens, all_tokens.data(), 0, ggml_nbytes(g.tokens));
        std::vector<float> cos(ggml_nelements(g.rope_cos)), sin(cos.size());
        qwen3_rope_table(mdl, all_pos.data(), static_cast<int64_t>(all_pos.size()), cos.data(), sin.data());
        ggml_backend_tensor_set(g.rope_cos, cos.data(), 0, ggml_nbytes(g.rope_cos));
        ggml_backend_tensor_set(g.rope_sin, sin.data(), 0, ggml_nbytes(g.rope_sin));
        for (size_t i = 0; i < contexts.size(); ++i) contexts[i]->set_part_inputs(g, i, pos[i].data(), cells[i]);
        const auto t0 = clock_type::now();
        if (ggml_backend_sched_graph_compute(sched_, g.gf) != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("the shared Qwen3 decoder graph failed to compute");
        }
        t.compute_ms = ms_since(t0);
        const size_t n_vocab = mdl.hp.text.n_vocab;
        std::vector<float> rows(n_vocab * contexts.size());  // [n_parts][n_vocab]
        ggml_backend_tensor_get(g.logits, rows.data(), 0, ggml_nbytes(g.logits));
        for (size_t i = 0; i < contexts.size(); ++i) std::copy_n(rows.data() + i * n_vocab, n_vocab, logits[i]);
    } catch (...) {
        // The arenas may hold cells without their K/V: every context starts over, as its own decode does.
        for (qwen3_context * c : contexts) c->clear();
        throw;
    }
    // Each context waited for the whole step: its timings are the step's, its position its own tokens'.
    for (size_t i = 0; i < contexts.size(); ++i) {
        qwen3_context & c = *contexts[i];
        c.n_past_ += static_cast<uint32_t>(tokens[i].size());
        c.last_ = t;
        (t.reused ? c.stats_.graph_reuses : c.stats_.graph_builds)++;
    }
    ++n_steps;
    compute_ms_total += t.compute_ms;
}

}  // namespace aural
