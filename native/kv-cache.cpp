#include "kv-cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "log.h"

namespace aural {

kv_cache::kv_cache(ggml_backend_dev_t dev, const hparams & hp, uint32_t n_ctx, ggml_type type)
    : n_ctx_(n_ctx), n_state_(hp.n_text_state), n_head_(hp.n_text_head), n_audio_ctx_(hp.n_audio_ctx) {
    const uint32_t n_layer = hp.n_text_layer;
    ggml_init_params params = {/*.mem_size =*/ 4 * n_layer * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                               /*.no_alloc =*/ true};
    ctx_ = ggml_init(params);
    for (uint32_t il = 0; il < n_layer; ++il) {
        k_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_ctx));
        v_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_ctx));
        ck_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_audio_ctx_));
        cv_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_audio_ctx_));
        ggml_format_name(k_.back(), "kv.k.%u", il);
        ggml_format_name(v_.back(), "kv.v.%u", il);
        ggml_format_name(ck_.back(), "kv.cross_k.%u", il);
        ggml_format_name(cv_.back(), "kv.cross_v.%u", il);
    }
    row_bytes_ = ggml_row_size(type, n_state_);
    buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_dev_buffer_type(dev));
    if (!buffer_) {
        throw std::runtime_error("cannot allocate the KV arena on " + std::string(ggml_backend_dev_name(dev)));
    }
    clear();
    AURAL_LOG_INFO("KV arena on %s: self %.2f MiB (%u cells x %u layers), cross %.2f MiB", ggml_backend_dev_name(dev),
                   self_bytes() / 1048576.0, n_ctx, n_layer, cross_bytes() / 1048576.0);
}

kv_cache::~kv_cache() {
    ggml_backend_buffer_free(buffer_);
    ggml_free(ctx_);
}

ggml_tensor * kv_cache::heads_view(ggml_context * ctx, ggml_tensor * t, int64_t n_rows) const {
    const int64_t hd = n_state_ / n_head_;
    const size_t es = ggml_element_size(t);
    // [n_state, rows] seen as [hd, n_head, rows], then heads moved outward: [hd, rows, n_head]
    ggml_tensor * v = ggml_view_3d(ctx, t, hd, n_head_, n_rows, hd * es, t->nb[1], 0);
    return ggml_permute(ctx, v, 0, 2, 1, 3);
}

ggml_tensor * kv_cache::get_k(ggml_context * ctx, int il) const { return heads_view(ctx, k_[il], n_ctx_); }
ggml_tensor * kv_cache::get_v(ggml_context * ctx, int il) const { return heads_view(ctx, v_[il], n_ctx_); }
ggml_tensor * kv_cache::get_cross_k(ggml_context * ctx, int il, uint32_t n_rows) const {
    return heads_view(ctx, ck_[il], n_rows);
}
ggml_tensor * kv_cache::get_cross_v(ggml_context * ctx, int il, uint32_t n_rows) const {
    return heads_view(ctx, cv_[il], n_rows);
}

ggml_tensor * kv_cache::cpy_k(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * idxs, int il) const {
    return ggml_set_rows(ctx, k_[il], cur, idxs);
}
ggml_tensor * kv_cache::cpy_v(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * idxs, int il) const {
    return ggml_set_rows(ctx, v_[il], cur, idxs);
}
ggml_tensor * kv_cache::cpy_cross_k(ggml_context * ctx, ggml_tensor * cur, int il) const {
    return ggml_cpy(ctx, cur, ggml_view_2d(ctx, ck_[il], n_state_, cur->ne[1], ck_[il]->nb[1], 0));
}
ggml_tensor * kv_cache::cpy_cross_v(ggml_context * ctx, ggml_tensor * cur, int il) const {
    return ggml_cpy(ctx, cur, ggml_view_2d(ctx, cv_[il], n_state_, cur->ne[1], cv_[il]->nb[1], 0));
}

void kv_cache::apply(uint32_t n_past, uint32_t n_tokens, uint32_t n_cross) {
    if (n_cross > 0) {
        if (n_cross > n_audio_ctx_) {
            throw std::invalid_argument("a window has at most " + std::to_string(n_audio_ctx_) + " encoder positions");
        }
        cells_ = kv_cells{0, n_cross};
        return;
    }
    if (n_past > cells_.used) {
        throw std::invalid_argument("n_past " + std::to_string(n_past) + " is beyond the " +
                                    std::to_string(cells_.used) + " positions decoded so far");
    }
    if (static_cast<uint64_t>(n_past) + n_tokens > n_ctx_) {
        throw std::length_error("KV arena full: " + std::to_string(n_past) + " + " + std::to_string(n_tokens) +
                                " tokens exceed its " + std::to_string(n_ctx_) + " cells");
    }
    cells_.used = n_past + n_tokens;
}

void kv_cache::clear() {
    ggml_backend_buffer_clear(buffer_, 0);
    cells_ = kv_cells{};
    for (auto * mirror : {&host_k_, &host_v_, &host_ck_, &host_cv_}) {
        for (auto & layer : *mirror) {
            std::fill(layer.begin(), layer.end(), 0);
        }
    }
}

size_t kv_cache::self_bytes() const {
    size_t n = 0;
    for (size_t il = 0; il < k_.size(); ++il) {
        n += ggml_nbytes(k_[il]) + ggml_nbytes(v_[il]);
    }
    return n;
}

size_t kv_cache::cross_bytes() const {
    size_t n = 0;
    for (size_t il = 0; il < ck_.size(); ++il) {
        n += ggml_nbytes(ck_[il]) + ggml_nbytes(cv_[il]);
    }
    return n;
}

void kv_cache::enable_host_mirror() {
    auto make = [](const std::vector<ggml_tensor *> & ts, std::vector<std::vector<uint8_t>> & out) {
        out.clear();
        for (ggml_tensor * t : ts) {
            out.emplace_back(ggml_nbytes(t), 0);
        }
    };
    make(k_, host_k_);
    make(v_, host_v_);
    make(ck_, host_ck_);
    make(cv_, host_cv_);
}

size_t kv_cache::host_upload_self(uint32_t n_rows) {
    const size_t n = n_rows * row_bytes_;
    for (size_t il = 0; il < k_.size() && n > 0; ++il) {
        ggml_backend_tensor_set(k_[il], host_k_[il].data(), 0, n);
        ggml_backend_tensor_set(v_[il], host_v_[il].data(), 0, n);
    }
    return 2 * k_.size() * n;
}

size_t kv_cache::host_download_self(uint32_t row0, uint32_t n_rows) {
    const size_t off = row0 * row_bytes_, n = n_rows * row_bytes_;
    for (size_t il = 0; il < k_.size() && n > 0; ++il) {
        ggml_backend_tensor_get(k_[il], host_k_[il].data() + off, off, n);
        ggml_backend_tensor_get(v_[il], host_v_[il].data() + off, off, n);
    }
    return 2 * k_.size() * n;
}

size_t kv_cache::host_upload_cross() {
    const size_t n = cells_.cross * row_bytes_;
    for (size_t il = 0; il < ck_.size(); ++il) {
        ggml_backend_tensor_set(ck_[il], host_ck_[il].data(), 0, n);
        ggml_backend_tensor_set(cv_[il], host_cv_[il].data(), 0, n);
    }
    return 2 * ck_.size() * n;
}

size_t kv_cache::host_download_cross() {
    const size_t n = cells_.cross * row_bytes_;
    for (size_t il = 0; il < ck_.size(); ++il) {
        ggml_backend_tensor_get(ck_[il], host_ck_[il].data(), 0, n);
        ggml_backend_tensor_get(cv_[il], host_cv_[il].data(), 0, n);
    }
    return 2 * ck_.size() * n;
}

}  // namespace aural
