#include "qwen3-context.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"

namespace aural {

qwen3_context::qwen3_context(const qwen3_model & m, uint32_t n_ctx, ggml_type kv_type, kv_mode mode,
                             bool graph_reuse, uint32_t max_ubatch)
    : m_(m), mode_(mode), ubatch_(max_ubatch > 0 ? max_ubatch : decoder_ubatch_limit(m.dev)),
      reuse_enabled_(graph_reuse && !env_flag("AURAL_NO_GRAPH_REUSE")) {
    if (kv_type != GGML_TYPE_F16 && kv_type != GGML_TYPE_F32) {
        throw std::invalid_argument("the KV arena holds f16 or f32");
    }
    const auto & tx = m.hp.text;
    const kv_dims dims{tx.n_layer, tx.n_head_kv, tx.n_head_kv * tx.head_dim, 0};
    kv_ = std::make_unique<kv_cache>(m.dev, dims, n_ctx, 1, kv_type);
    if (mode_ == kv_mode::host) kv_->enable_host_mirror();
    backends_ = std::make_unique<backend_set>(m.dev, m.n_threads, nullptr);
    sched_ = backends_->make_sched(sched_size(qwen3_graph_size(m, 1)));
}

qwen3_context::~qwen3_context() {
    if (graph_.ctx) ggml_free(graph_.ctx);
    if (sched_) ggml_backend_sched_free(sched_);
}

void qwen3_context::rewind(uint32_t n_past) {
    if (n_past > n_past_) {
        throw std::invalid_argument("cannot rewind to " + std::to_string(n_past) + " tokens: the context holds " +
                                    std::to_string(n_past_));
    }
    // The cells at n_past and after stay in the arena until the next decode's kv_update, which forgets a
    // sequence's cells at or after its first new position before anything reads them (kv-cache.h).
    n_past_ = n_past;
}

void qwen3_context::clear() {
    kv_->clear();
    n_past_ = 0;
}

void qwen3_context::set_part_inputs(const qwen3_decoder_graph & g, size_t part, const int32_t * pos,
                                    const std::vector<int64_t> & cells) const {
    const int64_t n = static_cast<int64_t>(cells.size());
    ggml_backend_tensor_set(g.cells[part], cells.data(), 0, ggml_nbytes(g.cells[part]));
    const std::vector<int32_t> seq(static_cast<size_t>(n), 0);  // one sequence; causal by position
    std::vector<ggml_fp16_t> mask(ggml_nelements(g.mask[part]));
    kv_->cells().mask(seq.data(), pos, n, mask.data());
    ggml_backend_tensor_set(g.mask[part], mask.data(), 0, ggml_nbytes(g.mask[part]));
}

size_t qwen3_context::compute_bytes() const { return sched_buffer_bytes(sched_); }

void qwen3_context::decode(const int32_t * tokens, int64_t n, const float * audio, int64_t n_audio, float * logits,
                           bool all) {
    const auto & hp = m_.hp;
    if (n <= 0) {
        throw std::invalid_argument("decode needs at least one token");
    }
    std::vector<int64_t> audio_rows;
    for (int64_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= hp.text.n_vocab) {
            throw std::invalid_argument("token " + std::to_string(tokens[i]) + " is outside the vocabulary");
        }
        if (n_audio > 0 && static_cast<uint32_t>(tokens[i]) == hp.audio_token) audio_rows.push_back(i);
    }
    // Without audio, a token equal to the audio pad keeps its own embedding: the official generate passes the
    // audio features at the prefill alone (cache_position 0), so a pad the model writes is embedded as a token.
    if (n_audio > 0 && (static_cast<int64_t>(audio_rows.size()) != n_audio || !audio)) {
        throw std::invalid_argument(std::to_string(audio_rows.size()) + " audio tokens for " + std::to_string(n_audio) +
                                    " audio embeddings");
    }
    if (n_past_ + n > kv_->n_ctx()) {  // checked before any piece is appended: nothing is, then
        throw std::length_error("the context holds " + std::to_string(kv_->n_ctx()) + " tokens: " +
                                std::to_string(n_past_) + " + " + std::to_string(n) + " do not fit");
    }
    last_ = {};
    last_.reused = true;
    std::vector<float> scratch(all ? 0 : hp.text.n_vocab);  // the last token's logits of a piece before the last
    size_t audio_done = 0;
    for (int64_t start = 0; start < n; start += ubatch_) {
        const int64_t len = std::min<int64_t>(ubatch_, n - start);
        kv_update step;
        std::vector<int64_t> rows;  // this piece's audio rows, counted from its start
        for (int64_t i = start; i < start + len; ++i) {
            step.pos.push_back(static_cast<int32_t>(n_past_ + (i - start)));
            step.seq.push_back(0);
        }
        while (audio_done + rows.size() < audio_rows.size() && audio_rows[audio_done + rows.size()] < start + len) {
            rows.push_back(audio_rows[audio_done + rows.size()] - start);
        }
        float * out = all ? logits + start * hp.text.n_vocab : (start + len == n ? logits : scratch.data());
        try {
            const std::vector<int64_t> cells = kv_->apply(step);
            run(tokens + start, len, step.pos, cells, audio ? audio + audio_done * hp.text.n_state : nullptr,
                static_cast<int64_t>(rows.size()), rows, out, all);
        } catch (...) {
            clear();  // the arena holds this piece's cells but not their K/V: the session starts over
            throw;
        }
        audio_done += rows.size();
        n_past_ += static_cast<uint32_t>(len);
    }
}

void qwen3_context::run(const int32_t * tokens, int64_t n, const std::vector<int32_t> & pos,
                        const std::vector<int64_t> & cells, const float * audio, int64_t n_audio,
                        const std::vector<int64_t> & audio_rows, float * logits, bool all) {
    auto t0 = clock_type::now();
    const qwen3_graph_shape shape{n, n_audio, all};
    if (can_reuse(shape)) {
        ++stats_.graph_reuses;
    } else {
        last_.reused = false;
        if (graph_.ctx) ggml_free(graph_.ctx);
        graph_ = {};
        ggml_backend_sched_reset(sched_);
        graph_ = build_qwen3_decoder(m_, {{kv_.get(), n}}, n_audio, all);
        if (!ggml_backend_sched_alloc_graph(sched_, graph_.gf)) {
            ggml_free(graph_.ctx);
            graph_ = {};
            throw std::runtime_error("cannot allocate the decoder's compute buffer (out of memory?)");
        }
        report_ = placement(*backends_, sched_, graph_.gf);
        shape_ = shape;
        ++stats_.graph_builds;
        last_.build_ms += ms_since(t0);
    }
    const qwen3_decoder_graph & g = graph_;
    ggml_backend_tensor_set(g.tokens, tokens, 0, ggml_nbytes(g.tokens));
    std::vector<float> cos(ggml_nelements(g.rope_cos)), sin(cos.size());
    qwen3_rope_table(m_, pos.data(), n, cos.data(), sin.data());
    ggml_backend_tensor_set(g.rope_cos, cos.data(), 0, ggml_nbytes(g.rope_cos));
    ggml_backend_tensor_set(g.rope_sin, sin.data(), 0, ggml_nbytes(g.rope_sin));
    set_part_inputs(g, 0, pos.data(), cells);
    if (n_audio > 0) {
        ggml_backend_tensor_set(g.audio, audio, 0, ggml_nbytes(g.audio));
        std::vector<int32_t> order(static_cast<size_t>(n));  // token i: its own row, or row n + k for audio row k
        for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
        for (size_t k = 0; k < audio_rows.size(); ++k) order[audio_rows[k]] = static_cast<int32_t>(n + k);
        ggml_backend_tensor_set(g.embed_order, order.data(), 0, ggml_nbytes(g.embed_order));
    }
    t0 = clock_type::now();
    if (mode_ == kv_mode::host) {
        last_.kv_io_bytes += kv_->host_upload_self(n_past_);  // the history; the graph writes the new rows
        last_.kv_io_ms += ms_since(t0);
    }
    t0 = clock_type::now();
    if (ggml_backend_sched_graph_compute(sched_, g.gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("the Qwen3 decoder's graph failed to compute");
    }
    last_.compute_ms += ms_since(t0);
    if (mode_ == kv_mode::host) {  // one sequence: its new cells are the rows after the history
        t0 = clock_type::now();
        last_.kv_io_bytes += kv_->host_download_self(static_cast<uint32_t>(cells.front()), static_cast<uint32_t>(n));
        last_.kv_io_ms += ms_since(t0);
    }
    ggml_backend_tensor_get(g.logits, logits, 0, ggml_nbytes(g.logits));
}

}  // namespace aural
