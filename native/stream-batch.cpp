#include "stream-batch.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace aural {

stream_batch::stream_batch(const model & m, int n_threads) : mdl(m) {
    reuse_enabled_ = !env_flag("AURAL_NO_GRAPH_REUSE");
    backends_ = std::make_unique<backend_set>(m.dev, n_threads > 0 ? n_threads : m.n_threads, &never_);
    sched_ = backends_->make_sched(max_graph_nodes);
}

stream_batch::~stream_batch() {
    graph_.reset();
    if (sched_) ggml_backend_sched_free(sched_);
}

void stream_batch::check(const std::vector<context *> & contexts, const std::vector<decode_batch *> & steps) const {
    if (contexts.empty() || contexts.size() != steps.size() || contexts.size() > max_contexts) {
        throw std::invalid_argument("a shared step takes 1 to " + std::to_string(max_contexts) +
                                    " contexts, one step each");
    }
    std::set<const context *> seen;
    for (size_t i = 0; i < contexts.size(); ++i) {
        const context & c = *contexts[i];
        const decode_batch & step = *steps[i];
        const std::string which = "step " + std::to_string(i) + ": ";
        if (&c.mdl != &mdl || c.params.mode != kv_mode::device || !seen.insert(&c).second) {
            throw std::invalid_argument(which + "its context is of another model, keeps its KV on the host, or "
                                                "appears twice");
        }
        if (step.n_tokens > max_tokens_per_context || step.outputs.empty() || step.outputs.size() > context::max_outputs) {
            throw std::invalid_argument(which + "a shared step has at most " + std::to_string(max_tokens_per_context) +
                                        " tokens and 1 to " + std::to_string(context::max_outputs) + " outputs");
        }
        try {
            c.check_batch(step);
        } catch (const std::exception & e) {
            throw std::invalid_argument(which + e.what());
        }
    }
}

void stream_batch::decode(const std::vector<context *> & contexts, const std::vector<decode_batch *> & steps,
                          const std::vector<float *> & logits) {
    check(contexts, steps);
    for (const context * c : contexts) {
        if (c->interrupted()) throw interrupted_error("interrupted");
    }
    // Every context places its tokens in its own arena, as it would for a step of its own.
    decode_batch all;
    std::vector<int32_t> tokens;
    decode_params p;
    for (size_t i = 0; i < contexts.size(); ++i) {
        decode_batch & step = *steps[i];
        contexts[i]->place(step);
        for (int32_t o : step.outputs) all.outputs.push_back(static_cast<int32_t>(tokens.size()) + o);
        tokens.insert(tokens.end(), step.tokens, step.tokens + step.n_tokens);
        all.pos.insert(all.pos.end(), step.pos.begin(), step.pos.end());
        all.seq.insert(all.seq.end(), step.seq.begin(), step.seq.end());
        all.parts.push_back(&step);
        const kv_cache & kv = contexts[i]->kv();
        p.parts.push_back({&kv, kv.id(), step.n_tokens, kv.cross_rows()});
    }
    all.tokens = tokens.data();
    all.n_tokens = static_cast<uint32_t>(tokens.size());
    p.n_tokens = all.n_tokens;
    p.n_outputs = static_cast<uint32_t>(all.outputs.size());

    step_timings t;
    t.reused = true;
    auto t0 = clock_type::now();
    if (reuse_enabled_ && graph_ && graph_->can_reuse(p)) {
        graph_reuses++;
    } else {
        t.reused = false;
        graph_.reset();
        ggml_backend_sched_reset(sched_);
        graph_ = build_decoder(mdl, p);
        if (!ggml_backend_sched_alloc_graph(sched_, graph_->gf)) {
            throw std::runtime_error("cannot allocate the shared decoder graph");
        }
        graph_builds++;
    }
    graph_->set_inputs(all);
    t.build_ms = ms_since(t0);
    t0 = clock_type::now();
    const ggml_status st = ggml_backend_sched_graph_compute(sched_, graph_->gf);
    if (st != GGML_STATUS_SUCCESS) {
        throw std::runtime_error(std::string("graph compute failed: ") + ggml_status_to_string(st));
    }
    t.compute_ms = ms_since(t0);
    t0 = clock_type::now();
    const size_t n_vocab = mdl.hp.n_vocab;
    std::vector<float> rows(all.outputs.size() * n_vocab);
    graph_->read_logits(rows.data());
    size_t row = 0;
    for (size_t i = 0; i < contexts.size(); ++i) {
        const size_t n = steps[i]->outputs.size();
        std::copy_n(rows.data() + row * n_vocab, n * n_vocab, logits[i]);
        row += n;
    }
    t.logits_ms = ms_since(t0);
    t.n_graphs = 1;
    // Each context waited for the whole step: its timings are the step's, its counters its own tokens.
    for (size_t i = 0; i < contexts.size(); ++i) {
        context & c = *contexts[i];
        c.last_step = t;
        c.last_step.n_tokens = steps[i]->n_tokens;
        c.stats.decode_calls++;
        c.stats.tokens_decoded += steps[i]->n_tokens;
        c.stats.compute_ms_total += t.compute_ms;
        c.stats.logits_ms_total += t.logits_ms;
        (t.reused ? c.stats.graph_reuses : c.stats.graph_builds)++;
    }
    n_steps++;
    compute_ms_total += t.compute_ms;
}

}  // namespace aural
