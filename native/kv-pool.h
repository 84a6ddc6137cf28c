// A pool of self-attention KV blocks on one device, shared by the sessions of one model (PagedAttention's
// idea: Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention").
//
//   auto pool = std::make_shared<aural::kv_pool>(dev, hp, /*n_blocks=*/256, GGML_TYPE_F16);  // reserved once
//   aural::kv_cache kv(dev, hp, n_ctx, n_seq, GGML_TYPE_F16, pool);  // its self K/V rows now come from the pool
//   int32_t b = pool->acquire();   // kv_cache does this when a sequence first writes into a block
//   pool->release(b);              // ... and this when every cell of the block is free again
//
// A session's arena keeps its cells and their bookkeeping as before; only where a cell's K/V row lives
// changes: cell c is row table[c / block_cells] * block_cells + c % block_cells of the pool's per-layer
// tensors. So memory follows the tokens the sessions hold, not n_sessions x their worst case, and the pool
// is reserved at its full size when it is made (no allocation while decoding); on the CPU only the blocks
// handed out so far are resident (each is zeroed when first taken). The cross-attention K/V
// stays in each session's arena: it is written once per window and read whole.
// Thread-safety: acquire, release and the counters may be called from any thread (one mutex). Graphs of
// different sessions write and read disjoint rows of the same tensors, which needs no lock.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "hparams.h"

namespace aural {

class kv_pool {
  public:
    // Cells per block: a greedy step writes one, a 224-token prompt seven blocks (ref: vLLM's default
    // block size is 16 tokens; 32 keeps the table of a 1536-cell beam arena at 48 entries).
    static constexpr uint32_t block_cells = 32;

    // Throws std::invalid_argument for n_blocks == 0 and std::runtime_error when the device cannot hold it.
    kv_pool(ggml_backend_dev_t dev, const hparams & hp, uint32_t n_blocks, ggml_type type);
    ~kv_pool();
    kv_pool(const kv_pool &) = delete;
    kv_pool & operator=(const kv_pool &) = delete;

    // A free block's index; std::length_error when every block is held.
    int32_t acquire();
    void release(int32_t block);

    // Per-layer tensors [n_state, n_blocks * block_cells], laid out as kv_cache's own self K/V.
    ggml_tensor * k(int il) const { return k_[il]; }
    ggml_tensor * v(int il) const { return v_[il]; }

    uint32_t n_blocks() const { return n_blocks_; }
    uint32_t used_blocks() const;
    uint32_t peak_blocks() const;  // the most blocks held at once since the pool was made
    size_t block_bytes() const;    // K and V of one block, all layers
    size_t bytes() const { return n_blocks_ * block_bytes(); }
    size_t row_bytes() const { return row_bytes_; }

  private:
    uint32_t n_blocks_ = 0;
    size_t row_bytes_ = 0;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t buffer_ = nullptr;
    std::vector<ggml_tensor *> k_, v_;
    mutable std::mutex mu_;
    std::vector<int32_t> free_;  // free block indices, the lowest last (handed out first)
    uint32_t peak_ = 0;
    uint32_t cleared_ = 0;  // blocks [0, cleared_) have been zeroed (clear_up_to)

    void clear_up_to(uint32_t end);  // zero blocks [cleared_, end); the caller holds mu_
};

}  // namespace aural
