#include "context.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "backend.h"
#include "log.h"

namespace aural {

// The arena spans the decoder's 448 positions; each further sequence (beam) adds the 224 positions
// a window may sample (n_text_ctx / 2, ref: openai-whisper decoding.py sample_len) since beams share
// the prompt's cells. Padded to a multiple of 256 so GPU flash-attention kernels get whole 256-row KV
// tiles (ref: ggml-cuda fattn.cu FATTN_KQ_STRIDE).
uint32_t arena_cells(const hparams & hp, uint32_t n_seq) {
    return GGML_PAD(hp.n_text_ctx + (n_seq - 1) * (hp.n_text_ctx / 2), 256);
}

const char * kv_mode_name(kv_mode mode) { return mode == kv_mode::device ? "device" : "host"; }

kv_mode parse_kv_mode(const std::string & name) {
    if (name == "device") return kv_mode::device;
    if (name == "host") return kv_mode::host;
    throw std::invalid_argument("kv_mode must be 'device' or 'host', not '" + name + "'");
}

context::context(const model & m, const context_params & p) : mdl(m), params(p) {
    reuse_enabled_ = p.graph_reuse && !env_flag("AURAL_NO_GRAPH_REUSE");
    backends_ = std::make_unique<backend_set>(m.dev, p.n_threads > 0 ? p.n_threads : m.n_threads, &interrupted_);
    if (p.n_seq < 1 || p.n_seq > max_seq) {
        throw std::invalid_argument("n_seq must be between 1 and " + std::to_string(max_seq) + ", not " +
                                    std::to_string(p.n_seq));
    }
    ubatch_ = std::min(p.max_ubatch > 0 ? p.max_ubatch : decoder_ubatch_limit(m.dev), m.hp.n_text_ctx);
    kv_ = std::make_unique<kv_cache>(m.dev, m.hp, arena_cells(m.hp, p.n_seq), p.n_seq, GGML_TYPE_F16, p.pool,
                                     p.max_audio_ctx);
    if (p.mode == kv_mode::host) {
        kv_->enable_host_mirror();
    }
    sched_enc_ = backends_->make_sched(max_graph_nodes);
    sched_dec_ = backends_->make_sched(max_graph_nodes);
    reserve_worst_case();
}

context::~context() {
    dec_graph_.reset();
    enc_graph_.reset();
    if (sched_dec_) ggml_backend_sched_free(sched_dec_);
    if (sched_enc_) ggml_backend_sched_free(sched_enc_);
    kv_.reset();
}

void context::reserve_worst_case() {
    // Allocation failures belong at load time, with a message, not in the middle of a stream
    // (ref: whisper.cpp whisper_sched_graph_init, llama.cpp "reserve worst-case graphs").
    const uint32_t n_cross = kv_->cross_capacity();
    use_encoder(n_cross);
    std::vector<std::unique_ptr<graph_result>> worst;
    worst.push_back(build_decoder(mdl, *kv_, {ubatch_, std::min(ubatch_, max_outputs), n_cross}));
    if (ubatch_ < mdl.hp.n_text_ctx) {
        // Where batches go in pieces, an alignment piece (every row an output, every head's weights) is
        // bounded too, and reserved: on Vulkan (llvmpipe) a compute buffer that grew after load, for the
        // alignment of JFK's words, corrupted the heap (malloc abort).
        std::vector<align_head> heads;
        for (int l = 0; l < static_cast<int>(mdl.hp.n_text_layer); ++l) {
            for (int h = 0; h < static_cast<int>(mdl.hp.n_text_head); ++h) heads.push_back({l, h});
        }
        worst.push_back(build_decoder(mdl, *kv_, {ubatch_, ubatch_, n_cross}, heads));
    }
    for (const auto & g : worst) {
        if (!ggml_backend_sched_reserve(sched_dec_, g->gf)) {
            throw std::runtime_error("cannot reserve the decoder's compute buffer (out of device memory?)");
        }
    }
    AURAL_LOG_INFO("compute buffers reserved: %.2f MiB", compute_buffer_bytes() / 1048576.0);
    if (!encoder_report.fallback_ops.empty()) {
        AURAL_LOG_WARN("encoder: %zu op kinds fall back from %s to the CPU", encoder_report.fallback_ops.size(),
                       encoder_report.primary.c_str());
    }
}

size_t context::compute_buffer_bytes() const { return sched_buffer_bytes(sched_enc_) + sched_buffer_bytes(sched_dec_); }


void context::compute(ggml_backend_sched_t sched, ggml_cgraph * gf) {
    const ggml_status st = interrupted() ? GGML_STATUS_ABORTED : ggml_backend_sched_graph_compute(sched, gf);
    if (st == GGML_STATUS_ABORTED && interrupted()) {
        throw interrupted_error("interrupted");
    }
    if (st != GGML_STATUS_SUCCESS) {
        throw std::runtime_error(std::string("graph compute failed: ") + ggml_status_to_string(st));
    }
}

void context::use_encoder(uint32_t n_ctx) {
    if (enc_graph_ && enc_graph_->n_audio_ctx == n_ctx) {
        return;
    }
    enc_graph_.reset();
    ggml_backend_sched_reset(sched_enc_);
    enc_graph_ = build_encoder(mdl, *kv_, n_ctx);
    if (!ggml_backend_sched_alloc_graph(sched_enc_, enc_graph_->gf)) {
        throw std::runtime_error("cannot allocate the encoder's compute buffer (out of device memory?)");
    }
    encoder_report = placement(*backends_, sched_enc_, enc_graph_->gf);
    stats.encoder_builds++;
}

void context::encode(const float * mel, uint32_t n_frames) {
    if (n_frames < 2 || n_frames % 2 != 0 || n_frames > mdl.hp.n_mel_frames()) {
        throw std::invalid_argument("a window has an even number of mel frames between 2 and " +
                                    std::to_string(mdl.hp.n_mel_frames()) + ", not " + std::to_string(n_frames));
    }
    if (n_frames / 2 > kv_->cross_capacity()) {
        throw std::invalid_argument("this session encodes windows of at most " +
                                    std::to_string(2 * kv_->cross_capacity()) + " mel frames (max_audio_ctx), not " +
                                    std::to_string(n_frames));
    }
    const auto t0 = clock_type::now();
    use_encoder(n_frames / 2);  // the same graph every window while the length stays the same
    ggml_backend_tensor_set(enc_graph_->mel, mel, 0, ggml_nbytes(enc_graph_->mel));
    compute(sched_enc_, enc_graph_->gf);
    kv_update window;
    window.n_cross = n_frames / 2;
    kv_->apply(window);
    last_encode = encode_timings{};
    last_encode.encoder_ms = ms_since(t0);
    if (params.mode == kv_mode::host) {
        const auto t1 = clock_type::now();
        last_encode.kv_io_bytes = kv_->host_download_cross();
        last_encode.kv_io_ms = ms_since(t1);
    }
    stats.encode_calls++;
    stats.encoder_ms_total += last_encode.encoder_ms;
}

void context::check_batch(const decode_batch & batch) const {
    if (batch.n_tokens == 0 || batch.tokens == nullptr) {
        throw std::invalid_argument("decode needs at least one token");
    }
    if (batch.pos.size() != batch.n_tokens || batch.seq.size() != batch.n_tokens) {
        throw std::invalid_argument("decode needs a position and a sequence per token");
    }
    for (int32_t o : batch.outputs) {
        if (o < 0 || static_cast<uint32_t>(o) >= batch.n_tokens) {
            throw std::invalid_argument("output index " + std::to_string(o) + " is outside the batch");
        }
    }
    for (uint32_t i = 0; i < batch.n_tokens; ++i) {
        if (batch.tokens[i] < 0 || static_cast<uint32_t>(batch.tokens[i]) >= mdl.hp.n_vocab) {
            throw std::invalid_argument("token id " + std::to_string(batch.tokens[i]) + " is outside the vocabulary");
        }
        if (batch.pos[i] < 0 || static_cast<uint32_t>(batch.pos[i]) >= mdl.hp.n_text_ctx) {
            throw std::length_error("decoder context full: position " + std::to_string(batch.pos[i]) +
                                    " is beyond the model's " + std::to_string(mdl.hp.n_text_ctx));
        }
    }
    if (kv_->cross_rows() == 0) {
        throw std::logic_error("decode before encode: no window has been encoded in this context");
    }
}

void context::kv_upload(uint32_t n_rows, step_timings & t) {
    if (params.mode != kv_mode::host) return;
    const auto t0 = clock_type::now();
    t.kv_io_bytes += kv_->host_upload_self(n_rows) + kv_->host_upload_cross();
    t.kv_io_ms += ms_since(t0);
}

void context::kv_download(const decode_batch & batch, step_timings & t) {
    if (params.mode != kv_mode::host) return;
    const auto t0 = clock_type::now();
    const auto [lo, hi] = std::minmax_element(batch.cells.begin(), batch.cells.end());
    t.kv_io_bytes += kv_->host_download_self(static_cast<uint32_t>(*lo), static_cast<uint32_t>(*hi - *lo + 1));
    t.kv_io_ms += ms_since(t0);
}

namespace {

// Tokens [begin, end) of `b` as a batch of their own, with no outputs yet.
decode_batch slice(const decode_batch & b, uint32_t begin, uint32_t end) {
    decode_batch ub;
    ub.tokens = b.tokens + begin;
    ub.n_tokens = end - begin;
    ub.pos.assign(b.pos.begin() + begin, b.pos.begin() + end);
    ub.seq.assign(b.seq.begin() + begin, b.seq.begin() + end);
    return ub;
}

}  // namespace

void context::decode(decode_batch & batch, float * logits) {
    check_batch(batch);
    if (batch.outputs.empty() || batch.outputs.size() > max_outputs) {
        throw std::invalid_argument("decode returns between 1 and " + std::to_string(max_outputs) + " logits rows");
    }
    last_step = step_timings{};
    last_step.n_tokens = batch.n_tokens;
    last_step.reused = true;
    if (batch.n_tokens <= ubatch_) {
        decode_ubatch(batch, logits);
    } else {
        // Pieces in order: each appends its rows before the next attends to them, as one graph would.
        const size_t n_vocab = mdl.hp.n_vocab;
        std::vector<float> rows;
        for (uint32_t begin = 0; begin < batch.n_tokens; begin += ubatch_) {
            const uint32_t end = std::min(batch.n_tokens, begin + ubatch_);
            decode_batch ub = slice(batch, begin, end);
            std::vector<size_t> dest;  // where each of the piece's logits rows goes in `logits`
            for (size_t k = 0; k < batch.outputs.size(); ++k) {
                if (static_cast<uint32_t>(batch.outputs[k]) >= begin && static_cast<uint32_t>(batch.outputs[k]) < end) {
                    ub.outputs.push_back(batch.outputs[k] - static_cast<int32_t>(begin));
                    dest.push_back(k);
                }
            }
            if (ub.outputs.empty()) {  // a graph returns at least one row: the piece's last, unused
                ub.outputs.push_back(static_cast<int32_t>(ub.n_tokens - 1));
            }
            rows.resize(ub.outputs.size() * n_vocab);
            decode_ubatch(ub, rows.data());
            for (size_t j = 0; j < dest.size(); ++j) {
                std::copy_n(rows.data() + j * n_vocab, n_vocab, logits + dest[j] * n_vocab);
            }
        }
    }
    stats.decode_calls++;
    stats.tokens_decoded += batch.n_tokens;
    stats.compute_ms_total += last_step.compute_ms;
    stats.kv_io_ms_total += last_step.kv_io_ms;
    stats.kv_io_bytes_total += last_step.kv_io_bytes;
    stats.logits_ms_total += last_step.logits_ms;
}

// Gives the batch's tokens their arena cells (ub.cells, ub.kv for the mask); returns the cells in use before
// them, which host mode uploads.
uint32_t context::place(decode_batch & ub) {
    kv_update step;
    step.pos = ub.pos;
    step.seq = ub.seq;
    const uint32_t history = kv_->high_water();
    ub.cells = kv_->apply(step);
    ub.kv = &kv_->cells();
    return history;
}

// One decoder graph (at most ubatch_ tokens): appends the rows, writes the outputs' logits, adds its
// timings to last_step.
void context::decode_ubatch(decode_batch & ub, float * logits) {
    const uint32_t history = place(ub);
    step_timings & t = last_step;
    const decode_params p{ub.n_tokens, static_cast<uint32_t>(ub.outputs.size()), kv_->cross_rows()};
    auto t0 = clock_type::now();
    if (reuse_enabled_ && dec_graph_ && dec_graph_->can_reuse(p)) {
        stats.graph_reuses++;
    } else {
        t.reused = false;
        dec_graph_.reset();
        ggml_backend_sched_reset(sched_dec_);
        dec_graph_ = build_decoder(mdl, *kv_, p);
        if (!ggml_backend_sched_alloc_graph(sched_dec_, dec_graph_->gf)) {
            throw std::runtime_error("cannot allocate the decoder graph");
        }
        decoder_report = placement(*backends_, sched_dec_, dec_graph_->gf);
        stats.graph_builds++;
    }
    dec_graph_->set_inputs(ub);
    t.build_ms += ms_since(t0);

    kv_upload(history, t);
    t0 = clock_type::now();
    compute(sched_dec_, dec_graph_->gf);
    t.compute_ms += ms_since(t0);
    kv_download(ub, t);
    t0 = clock_type::now();
    dec_graph_->read_logits(logits);
    t.logits_ms += ms_since(t0);
    t.n_graphs++;
}

void context::reorder(const std::vector<int32_t> & parents) {
    kv_update u;
    u.parents = parents;
    if (parents.empty()) {
        throw std::invalid_argument("a reorder keeps at least one sequence");
    }
    kv_->apply(u);
    stats.reorders++;
}

void context::align(const int32_t * tokens, uint32_t n_tokens, const std::vector<align_head> & heads, float * weights,
                    float * logits) {
    decode_batch batch;
    batch.tokens = tokens;
    batch.n_tokens = n_tokens;
    for (uint32_t i = 0; i < n_tokens; ++i) {
        batch.pos.push_back(static_cast<int32_t>(i));
        batch.seq.push_back(0);
    }
    check_batch(batch);
    if (heads.empty()) {
        throw std::invalid_argument("align needs at least one alignment head");
    }
    for (const align_head & h : heads) {
        if (h.layer < 0 || h.layer >= static_cast<int>(mdl.hp.n_text_layer) || h.head < 0 ||
            h.head >= static_cast<int>(mdl.hp.n_text_head)) {
            throw std::invalid_argument("alignment head (" + std::to_string(h.layer) + ", " + std::to_string(h.head) +
                                        ") is outside the decoder's layers and heads");
        }
    }
    // weights is [heads][n_tokens][n_cross]: a piece's [heads][piece][n_cross] goes to its token rows.
    const size_t n_cross = kv_->cross_rows(), n_vocab = mdl.hp.n_vocab;
    std::vector<float> piece;
    for (uint32_t begin = 0; begin < n_tokens; begin += ubatch_) {
        const uint32_t end = std::min(n_tokens, begin + ubatch_), n = end - begin;
        decode_batch ub = slice(batch, begin, end);
        for (uint32_t i = 0; i < n; ++i) ub.outputs.push_back(static_cast<int32_t>(i));
        if (n == n_tokens) {
            align_ubatch(ub, heads, weights, logits);
            break;
        }
        piece.resize(heads.size() * n * n_cross);
        align_ubatch(ub, heads, piece.data(), logits + begin * n_vocab);
        for (size_t h = 0; h < heads.size(); ++h) {
            std::copy_n(piece.data() + h * n * n_cross, n * n_cross, weights + (h * n_tokens + begin) * n_cross);
        }
    }
    stats.align_calls++;
}

// One teacher-forced graph of at most ubatch_ tokens with every row an output.
void context::align_ubatch(decode_batch & ub, const std::vector<align_head> & heads, float * weights,
                           float * logits) {
    const uint32_t history = place(ub);
    // A one-off graph (its shape follows the text length); the decoder graph is rebuilt next step.
    dec_graph_.reset();
    ggml_backend_sched_reset(sched_dec_);
    const decode_params p{ub.n_tokens, ub.n_tokens, kv_->cross_rows()};
    auto g = build_decoder(mdl, *kv_, p, heads);
    if (!ggml_backend_sched_alloc_graph(sched_dec_, g->gf)) {
        throw std::runtime_error("cannot allocate the alignment graph");
    }
    g->set_inputs(ub);
    step_timings t;
    kv_upload(history, t);
    compute(sched_dec_, g->gf);
    kv_download(ub, t);
    // cross_qk is [n_cross, n_tokens, n_heads] in ggml order: row-major [n_heads][n_tokens][n_cross].
    ggml_backend_tensor_get(g->cross_qk, weights, 0, ggml_nbytes(g->cross_qk));
    g->read_logits(logits);
    ggml_backend_sched_reset(sched_dec_);
}

void context::clear_kv() { kv_->clear(); }

}  // namespace aural
