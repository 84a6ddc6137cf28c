#include "kv-pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "log.h"

namespace aural {

kv_pool::kv_pool(ggml_backend_dev_t dev, const hparams & hp, uint32_t n_blocks, ggml_type type) : n_blocks_(n_blocks) {
    if (n_blocks == 0) {
        throw std::invalid_argument("a KV pool holds at least one block");
    }
    const uint32_t n_layer = hp.n_text_layer;
    const int64_t n_rows = static_cast<int64_t>(n_blocks) * block_cells;
    ggml_init_params params = {/*.mem_size =*/ 2 * n_layer * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                               /*.no_alloc =*/ true};
    ctx_ = ggml_init(params);
    for (uint32_t il = 0; il < n_layer; ++il) {
        k_.push_back(ggml_new_tensor_2d(ctx_, type, hp.n_text_state, n_rows));
        v_.push_back(ggml_new_tensor_2d(ctx_, type, hp.n_text_state, n_rows));
        ggml_format_name(k_.back(), "kv_pool.k.%u", il);
        ggml_format_name(v_.back(), "kv_pool.v.%u", il);
    }
    row_bytes_ = ggml_row_size(type, hp.n_text_state);
    buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_dev_buffer_type(dev));
    if (!buffer_) {
        ggml_free(ctx_);
        throw std::runtime_error("cannot allocate a KV pool of " + std::to_string(n_blocks) + " blocks on " +
                                 ggml_backend_dev_name(dev));
    }
    free_.resize(n_blocks);
    for (uint32_t b = 0; b < n_blocks; ++b) free_[b] = static_cast<int32_t>(n_blocks - 1 - b);
    AURAL_LOG_INFO("KV pool on %s: %u blocks of %u cells, %.2f MiB", ggml_backend_dev_name(dev), n_blocks, block_cells,
                   bytes() / 1048576.0);
}

kv_pool::~kv_pool() {
    ggml_backend_buffer_free(buffer_);
    ggml_free(ctx_);
}

int32_t kv_pool::acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
        throw std::length_error("KV pool full: all " + std::to_string(n_blocks_) + " blocks of " +
                                std::to_string(block_cells) + " cells are held");
    }
    const int32_t b = free_.back();
    free_.pop_back();
    peak_ = std::max(peak_, n_blocks_ - static_cast<uint32_t>(free_.size()));
    if (static_cast<uint32_t>(b) >= cleared_) clear_up_to(static_cast<uint32_t>(b) + 1);
    return b;
}

// A row a sequence has not written is never visible (masked), but must be a finite number: a device's
// attention may still multiply it by a zero weight. So each block is zeroed once, when it is first handed
// out, not the whole pool when it is made: blocks go lowest first, so the pages a CPU pool touches (its
// resident memory) follow the most blocks ever held, not the size reserved.
void kv_pool::clear_up_to(uint32_t end) {
    for (const std::vector<ggml_tensor *> * tensors : {&k_, &v_}) {
        for (ggml_tensor * t : *tensors) {
            ggml_backend_tensor_memset(t, 0, cleared_ * block_cells * t->nb[1], (end - cleared_) * block_cells * t->nb[1]);
        }
    }
    cleared_ = end;
}

void kv_pool::release(int32_t block) {
    std::lock_guard<std::mutex> lock(mu_);
    AURAL_ASSERT(block >= 0 && static_cast<uint32_t>(block) < n_blocks_ && free_.size() < n_blocks_);
    free_.push_back(block);
}

uint32_t kv_pool::used_blocks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return n_blocks_ - static_cast<uint32_t>(free_.size());
}

uint32_t kv_pool::peak_blocks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
}

size_t kv_pool::block_bytes() const { return 2 * k_.size() * block_cells * row_bytes_; }

}  // namespace aural
