#include "kv-cache.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "log.h"

namespace aural {

namespace {

std::atomic<uint64_t> next_id{1};

// A Whisper decoder's arena: its text layers, with room for a window of n_cross encoder positions.
kv_dims whisper_dims(const hparams & hp, uint32_t n_cross) {
    if (n_cross > hp.n_audio_ctx) {
        throw std::invalid_argument("a window has at most " + std::to_string(hp.n_audio_ctx) +
                                    " encoder positions, not " + std::to_string(n_cross));
    }
    return {hp.n_text_layer, hp.n_text_head, hp.n_text_state, n_cross > 0 ? n_cross : hp.n_audio_ctx};
}

}  // namespace

void kv_cells::mask(const int32_t * seq, const int32_t * at, int64_t n, ggml_fp16_t * out) const {
    const int64_t n_ctx = static_cast<int64_t>(pos.size());
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), neg_inf = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = 0; c < n_ctx; ++c) {
            out[i * n_ctx + c] = visible(static_cast<uint32_t>(c), seq[i], at[i]) ? zero : neg_inf;
        }
    }
}

kv_cache::kv_cache(ggml_backend_dev_t dev, const hparams & hp, uint32_t n_ctx, uint32_t n_seq, ggml_type type,
                   std::shared_ptr<kv_pool> pool, uint32_t n_cross)
    : kv_cache(dev, whisper_dims(hp, n_cross), n_ctx, n_seq, type, std::move(pool)) {}

kv_cache::kv_cache(ggml_backend_dev_t dev, const kv_dims & dims, uint32_t n_ctx, uint32_t n_seq, ggml_type type,
                   std::shared_ptr<kv_pool> pool)
    : id_(next_id++), n_ctx_(n_ctx), n_seq_(n_seq), n_state_(dims.n_state), n_head_(dims.n_head),
      n_audio_ctx_(dims.n_cross), pool_(std::move(pool)) {
    if (n_seq < 1 || n_seq > 32) {  // a cell's sequence set is a 32-bit mask
        throw std::invalid_argument("a KV arena holds 1 to 32 sequences, not " + std::to_string(n_seq));
    }
    if (pool_) {
        if (n_ctx % kv_pool::block_cells != 0 || pool_->k(0)->ne[0] != n_state_ || pool_->k(0)->type != type) {
            throw std::invalid_argument("a paged KV arena needs a pool of its model and type, and a multiple of " +
                                        std::to_string(kv_pool::block_cells) + " cells");
        }
        table_.assign(n_ctx / kv_pool::block_cells, -1);
    }
    const uint32_t n_layer = dims.n_layer;
    ggml_init_params params = {/*.mem_size =*/ 4 * n_layer * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                               /*.no_alloc =*/ true};
    ctx_ = ggml_init(params);
    for (uint32_t il = 0; il < n_layer; ++il) {
        if (!pool_) {
            k_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_ctx));
            v_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_ctx));
            ggml_format_name(k_.back(), "kv.k.%u", il);
            ggml_format_name(v_.back(), "kv.v.%u", il);
        }
        if (n_audio_ctx_ > 0) {
            ck_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_audio_ctx_));
            cv_.push_back(ggml_new_tensor_2d(ctx_, type, n_state_, n_audio_ctx_));
            ggml_format_name(ck_.back(), "kv.cross_k.%u", il);
            ggml_format_name(cv_.back(), "kv.cross_v.%u", il);
        }
    }
    row_bytes_ = ggml_row_size(type, n_state_);
    buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_dev_buffer_type(dev));
    if (!buffer_) {
        throw std::runtime_error("cannot allocate the KV arena on " + std::string(ggml_backend_dev_name(dev)));
    }
    clear();
    AURAL_LOG_INFO("KV arena on %s: self %.2f MiB%s (%u cells x %u layers, %u sequences), cross %.2f MiB",
                   ggml_backend_dev_name(dev), self_bytes() / 1048576.0, pool_ ? " held in the pool" : "", n_ctx,
                   n_layer, n_seq, cross_bytes() / 1048576.0);
}

kv_cache::~kv_cache() {
    for (int32_t b : table_) {
        if (b >= 0) pool_->release(b);
    }
    ggml_backend_buffer_free(buffer_);
    ggml_free(ctx_);
}

ggml_tensor * kv_cache::self_tensor(const std::vector<ggml_tensor *> & own, bool is_k, int il) const {
    return pool_ ? (is_k ? pool_->k(il) : pool_->v(il)) : own[il];
}

ggml_tensor * kv_cache::heads_view(ggml_context * ctx, ggml_tensor * t, int64_t n_rows) const {
    const int64_t hd = n_state_ / n_head_;
    const size_t es = ggml_element_size(t);
    // [n_state, rows] seen as [hd, n_head, rows], then heads moved outward: [hd, rows, n_head]
    ggml_tensor * v = ggml_view_3d(ctx, t, hd, n_head_, n_rows, hd * es, t->nb[1], 0);
    return ggml_permute(ctx, v, 0, 2, 1, 3);
}

ggml_tensor * kv_cache::get_k(ggml_context * ctx, int il) const {
    ggml_tensor * t = self_tensor(k_, true, il);
    return heads_view(ctx, t, t->ne[1]);
}
ggml_tensor * kv_cache::get_v(ggml_context * ctx, int il) const {
    ggml_tensor * t = self_tensor(v_, false, il);
    return heads_view(ctx, t, t->ne[1]);
}
ggml_tensor * kv_cache::gather_k(ggml_context * ctx, int il, ggml_tensor * rows) const {
    // get_rows gives f32 [n_state, n_ctx]; the attention paths that take it want the arena's f16
    ggml_tensor * t = self_tensor(k_, true, il);
    return heads_view(ctx, ggml_cast(ctx, ggml_get_rows(ctx, t, rows), t->type), n_ctx_);
}
ggml_tensor * kv_cache::gather_v(ggml_context * ctx, int il, ggml_tensor * rows) const {
    ggml_tensor * t = self_tensor(v_, false, il);
    return heads_view(ctx, ggml_cast(ctx, ggml_get_rows(ctx, t, rows), t->type), n_ctx_);
}
ggml_tensor * kv_cache::get_cross_k(ggml_context * ctx, int il, uint32_t n_rows) const {
    return heads_view(ctx, ck_[il], n_rows);
}
ggml_tensor * kv_cache::get_cross_v(ggml_context * ctx, int il, uint32_t n_rows) const {
    // The window's V^T is packed at the start of the tensor: [n_rows, n_state] seen as [n_rows, hd, n_head].
    const int64_t hd = n_state_ / n_head_;
    const size_t row = n_rows * ggml_element_size(cv_[il]);
    return ggml_view_3d(ctx, cv_[il], n_rows, hd, n_head_, row, hd * row, 0);
}

ggml_tensor * kv_cache::cpy_k(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * idxs, int il) const {
    return ggml_set_rows(ctx, self_tensor(k_, true, il), cur, idxs);
}
ggml_tensor * kv_cache::cpy_v(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * idxs, int il) const {
    return ggml_set_rows(ctx, self_tensor(v_, false, il), cur, idxs);
}
ggml_tensor * kv_cache::cpy_cross_k(ggml_context * ctx, ggml_tensor * cur, int il) const {
    return ggml_cpy(ctx, cur, ggml_view_2d(ctx, ck_[il], n_state_, cur->ne[1], ck_[il]->nb[1], 0));
}
ggml_tensor * kv_cache::cpy_cross_v(ggml_context * ctx, ggml_tensor * cur, int il, bool transposed) const {
    const int64_t n_rows = transposed ? cur->ne[0] : cur->ne[1];
    ggml_tensor * dst = ggml_view_2d(ctx, cv_[il], n_rows, n_state_, n_rows * ggml_element_size(cv_[il]), 0);
    return ggml_cpy(ctx, transposed ? cur : ggml_transpose(ctx, cur), dst);
}

std::vector<int64_t> kv_cache::apply(const kv_update & u) {
    if (u.n_cross > 0) {
        if (u.n_cross > n_audio_ctx_) {
            throw std::invalid_argument("a window has at most " + std::to_string(n_audio_ctx_) + " encoder positions");
        }
        forget_self();
        cells_.cross = u.n_cross;
        return {};
    }
    if (!u.parents.empty()) {
        reorder(u.parents);
        return {};
    }
    return append(u.pos, u.seq);
}

void kv_cache::forget_self() {
    cells_.pos.assign(n_ctx_, -1);
    cells_.seqs.assign(n_ctx_, 0);
    give_back_free_blocks();
}

int64_t kv_cache::row_of(uint32_t cell) const {
    if (!pool_) return cell;
    const int32_t b = table_[cell / kv_pool::block_cells];
    return b < 0 ? 0 : static_cast<int64_t>(b) * kv_pool::block_cells + cell % kv_pool::block_cells;
}

void kv_cache::rows(int32_t * out) const {
    for (uint32_t c = 0; c < n_ctx_; ++c) out[c] = static_cast<int32_t>(row_of(c));
}

uint32_t kv_cache::blocks_held() const {
    return static_cast<uint32_t>(std::count_if(table_.begin(), table_.end(), [](int32_t b) { return b >= 0; }));
}

void kv_cache::take_blocks(const std::vector<int64_t> & cells) {
    std::vector<size_t> taken;
    try {
        for (int64_t c : cells) {
            const size_t t = static_cast<size_t>(c) / kv_pool::block_cells;
            if (table_[t] < 0) {
                table_[t] = pool_->acquire();
                taken.push_back(t);
            }
        }
    } catch (...) {
        for (size_t t : taken) {
            pool_->release(table_[t]);
            table_[t] = -1;
        }
        throw;
    }
}

void kv_cache::give_back_free_blocks() {
    for (size_t t = 0; t < table_.size(); ++t) {
        if (table_[t] < 0) continue;
        const auto first = cells_.seqs.begin() + t * kv_pool::block_cells;
        if (std::all_of(first, first + kv_pool::block_cells, [](uint32_t m) { return m == 0; })) {
            pool_->release(table_[t]);
            table_[t] = -1;
        }
    }
}

std::vector<int64_t> kv_cache::append(const std::vector<int32_t> & pos, const std::vector<int32_t> & seq) {
    AURAL_ASSERT(pos.size() == seq.size() && !pos.empty());
    // First new position of each sequence in this step: its cells from there on are a rewind.
    std::vector<int32_t> first(n_seq_, INT32_MAX);
    for (size_t i = 0; i < seq.size(); ++i) {
        if (seq[i] < 0 || static_cast<uint32_t>(seq[i]) >= n_seq_) {
            throw std::invalid_argument("sequence id " + std::to_string(seq[i]) + " is outside [0, " +
                                        std::to_string(n_seq_) + ")");
        }
        first[seq[i]] = std::min(first[seq[i]], pos[i]);
    }
    std::vector<int32_t> kept(n_seq_, 0);
    for (uint32_t c = 0; c < n_ctx_; ++c) {
        for (uint32_t s = 0; s < n_seq_; ++s) {
            if (!(cells_.seqs[c] >> s & 1u)) continue;
            if (cells_.pos[c] >= first[s]) {
                cells_.seqs[c] &= ~(1u << s);
            } else {
                kept[s]++;
            }
        }
        if (cells_.seqs[c] == 0) cells_.pos[c] = -1;
    }
    give_back_free_blocks();
    for (uint32_t s = 0; s < n_seq_; ++s) {
        if (first[s] != INT32_MAX && kept[s] != first[s]) {
            throw std::invalid_argument("n_past " + std::to_string(first[s]) + " is beyond the " +
                                        std::to_string(kept[s]) + " positions decoded so far");
        }
    }
    std::vector<int64_t> out;
    out.reserve(pos.size());
    for (uint32_t c = 0; c < n_ctx_ && out.size() < pos.size(); ++c) {
        if (cells_.seqs[c] == 0) out.push_back(c);
    }
    if (out.size() < pos.size()) {
        throw std::length_error("KV arena full: " + std::to_string(used()) + " + " + std::to_string(pos.size()) +
                                " tokens exceed its " + std::to_string(n_ctx_) + " cells");
    }
    if (pool_) take_blocks(out);
    for (size_t i = 0; i < pos.size(); ++i) {
        cells_.pos[out[i]] = pos[i];
        cells_.seqs[out[i]] = 1u << seq[i];
        out[i] = row_of(static_cast<uint32_t>(out[i]));
    }
    return out;
}

void kv_cache::reorder(const std::vector<int32_t> & parents) {
    if (parents.size() > n_seq_) {
        throw std::invalid_argument("a reorder names at most " + std::to_string(n_seq_) + " sequences");
    }
    for (int32_t p : parents) {
        if (p < 0 || static_cast<uint32_t>(p) >= n_seq_) {
            throw std::invalid_argument("parent sequence " + std::to_string(p) + " is outside [0, " +
                                        std::to_string(n_seq_) + ")");
        }
    }
    for (uint32_t c = 0; c < n_ctx_; ++c) {
        uint32_t next = 0;
        for (size_t j = 0; j < parents.size(); ++j) {
            next |= (cells_.seqs[c] >> parents[j] & 1u) << j;
        }
        cells_.seqs[c] = next;
        if (next == 0) cells_.pos[c] = -1;
    }
    give_back_free_blocks();
}

uint32_t kv_cache::used() const {
    return static_cast<uint32_t>(std::count_if(cells_.seqs.begin(), cells_.seqs.end(), [](uint32_t m) { return m != 0; }));
}

uint32_t kv_cache::high_water() const {
    for (uint32_t c = n_ctx_; c > 0; --c) {
        if (cells_.seqs[c - 1] != 0) return c;
    }
    return 0;
}

void kv_cache::clear() {
    ggml_backend_buffer_clear(buffer_, 0);
    forget_self();
    cells_.cross = 0;
    for (auto * mirror : {&host_k_, &host_v_, &host_ck_, &host_cv_}) {
        for (auto & layer : *mirror) {
            std::fill(layer.begin(), layer.end(), 0);
        }
    }
}

size_t kv_cache::self_bytes() const {
    if (pool_) return blocks_held() * pool_->block_bytes();
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
    if (pool_) {
        throw std::invalid_argument("the host KV mode keeps its own arena: it does not take a KV pool");
    }
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
