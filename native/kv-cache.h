// The KV arena of one decoding session: decoder self-attention K/V and the cross-attention K/V of the
// current 30 s window, resident in the device's memory.
//
//   kv_cache kv(dev, hp, /*n_ctx=*/512, /*n_seq=*/1, GGML_TYPE_F16); // allocated once, zero-cleared, size logged
//   ggml_tensor * k = kv.get_k(ctx, il);                  // view for a graph: [head_dim, n_ctx, n_head]
//   ggml_build_forward_expand(gf, kv.cpy_k(ctx, k_cur, idxs, il)); // new rows written in place
//   auto cells = kv.apply(update);                        // the one method that changes the bookkeeping
//
// Each step writes only its new rows (ggml_set_rows inside the graph); the history never leaves the
// device. Several sequences (beams, best-of samples) share the arena: a cell belongs to a set of
// sequences, so beams share their common prefix, and reordering beams only rewrites that membership;
// no K/V row moves (ref: llama.cpp llama_kv_cells, seq_id sets per cell). The attention mask lets each
// token see the cells of its own sequence. The `host_*` methods exist for the baseline `host` KV mode,
// which mirrors the old design.
// With a kv_pool (kv-pool.h), the self K/V rows live in the pool's blocks instead of the arena's own
// tensors: cells and their bookkeeping stay here, a block table maps each run of kv_pool::block_cells cells
// to a pool block, taken when a sequence first writes into it and given back when all its cells are free.
// The graph then reads the pool through a rows input (rows(), one i32 per cell) and the op or gather below.
// Thread-safety: owned by one context; not shared (a pool is, see kv-pool.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "hparams.h"
#include "kv-pool.h"

namespace aural {

// Bookkeeping of the self-attention cells, kept apart from the tensors.
struct kv_cells {
    std::vector<int32_t> pos;    // [n_ctx] decoder position held by each cell, -1 when free
    std::vector<uint32_t> seqs;  // [n_ctx] bit s set: the cell belongs to sequence s; 0 when free
    uint32_t cross = 0;          // cross-attention rows [0, cross) hold the current window's K/V

    bool visible(uint32_t cell, int32_t seq, int32_t at) const {  // may a token of `seq` at `at` see it?
        return (seqs[cell] >> seq & 1u) && pos[cell] <= at;
    }
    // The attention mask of n tokens (token i: sequence seq[i], position at[i]) over every cell, f16
    // [n][n_ctx] as flash attention takes it: 0 where the token sees the cell, -inf elsewhere.
    void mask(const int32_t * seq, const int32_t * at, int64_t n, ggml_fp16_t * out) const;
};

// One change to the bookkeeping; exactly one of the three parts is set.
struct kv_update {
    uint32_t n_cross = 0;            // a new window of n_cross encoder rows: every self cell is forgotten
    std::vector<int32_t> pos, seq;   // a decoder step: token i goes to position pos[i] of sequence seq[i];
                                     // each sequence forgets its cells at or after its first new position
    std::vector<int32_t> parents;    // a beam reorder: new sequence j continues old sequence parents[j]
};

// What an arena holds per layer: K/V rows of n_state values in n_head heads (a grouped-query model's K/V
// heads, fewer than its query heads), and n_cross rows of cross-attention K/V (0: none, a decoder-only model).
struct kv_dims {
    uint32_t n_layer = 0, n_head = 0, n_state = 0, n_cross = 0;
};

class kv_cache {
  public:
    // With `pool`, n_ctx must be a multiple of kv_pool::block_cells and the self K/V come from the pool.
    // n_cross: the most encoder positions a window may have (0: the model's n_audio_ctx, a 30 s window).
    kv_cache(ggml_backend_dev_t dev, const hparams & hp, uint32_t n_ctx, uint32_t n_seq, ggml_type type,
             std::shared_ptr<kv_pool> pool = nullptr, uint32_t n_cross = 0);
    kv_cache(ggml_backend_dev_t dev, const kv_dims & dims, uint32_t n_ctx, uint32_t n_seq, ggml_type type,
             std::shared_ptr<kv_pool> pool = nullptr);
    ~kv_cache();
    kv_cache(const kv_cache &) = delete;
    kv_cache & operator=(const kv_cache &) = delete;

    // Views for graph builders. Self K/V and cross K are laid out for ggml_flash_attn_ext and ggml_mul_mat:
    // [head_dim, n_rows, n_head]. Cross V is stored transposed, packed for the window's n_rows
    // (n_rows x n_state elements, so the same bytes as row-major V), and viewed as [n_rows, head_dim,
    // n_head]: the weighted sum over audio positions is then one ggml_mul_mat per head.
    // Paged: get_k and get_v view the whole pool ([head_dim, n_pool_rows, n_head]), cell c at row rows()[c];
    // gather_k and gather_v copy the arena's n_ctx rows out of it in cell order (f16 [head_dim, n_ctx,
    // n_head], for graph paths that take contiguous K/V), `rows` being the graph's i32 [n_ctx] input.
    ggml_tensor * get_k(ggml_context * ctx, int il) const;
    ggml_tensor * get_v(ggml_context * ctx, int il) const;
    ggml_tensor * gather_k(ggml_context * ctx, int il, ggml_tensor * rows) const;
    ggml_tensor * gather_v(ggml_context * ctx, int il, ggml_tensor * rows) const;
    ggml_tensor * get_cross_k(ggml_context * ctx, int il, uint32_t n_rows) const;
    ggml_tensor * get_cross_v(ggml_context * ctx, int il, uint32_t n_rows) const;
    // Graph ops writing new rows: cur [n_state, n_tokens] f32 -> rows `idxs` (i64 [n_tokens], from apply()).
    ggml_tensor * cpy_k(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * idxs, int il) const;
    ggml_tensor * cpy_v(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * idxs, int il) const;
    // Graph ops writing a window's cross K/V: cur [n_state, n_rows] f32 -> rows [0, n_rows) (V transposed).
    // With `transposed`, cur is V^T already, [n_rows, n_state] contiguous (on the CPU: transpose.h), and is copied.
    ggml_tensor * cpy_cross_k(ggml_context * ctx, ggml_tensor * cur, int il) const;
    ggml_tensor * cpy_cross_v(ggml_context * ctx, ggml_tensor * cur, int il, bool transposed = false) const;
    // The arena's element type (the constructor's `type`).
    ggml_type type() const { return cv_.front()->type; }

    // The bookkeeping's only mutator (see kv_update). A decoder step returns the tensor row of each token:
    // its cell (free cells, lowest first), or where the pool holds that cell. Throws std::length_error
    // when the arena or the pool would overflow (the arena then is as before the call) and
    // std::invalid_argument when a sequence would skip positions.
    std::vector<int64_t> apply(const kv_update & u);
    void clear();  // zero the buffer and forget every cell

    bool paged() const { return pool_ != nullptr; }
    // Paged: the pool row of every cell [n_ctx] (0 for a cell of a block not held: masked, never read).
    void rows(int32_t * out) const;
    uint32_t blocks_held() const;  // paged: pool blocks this arena holds

    // Unique per arena for the life of the process: a graph built on an arena's tensors names it by this,
    // since a later arena may be allocated at a freed one's address.
    uint64_t id() const { return id_; }
    uint32_t n_ctx() const { return n_ctx_; }
    uint32_t n_seq() const { return n_seq_; }
    uint32_t used() const;        // cells holding K/V of some sequence
    uint32_t high_water() const;  // cells [0, high_water()) include every cell in use
    const kv_cells & cells() const { return cells_; }
    uint32_t cross_rows() const { return cells_.cross; }
    uint32_t cross_capacity() const { return n_audio_ctx_; }
    size_t self_bytes() const;   // self-attention K+V of all layers (paged: of the blocks held now)
    size_t cross_bytes() const;  // cross-attention K+V of all layers
    size_t row_bytes() const { return row_bytes_; }

    // Baseline `host` mode: a host mirror is the source of truth; these move it to and from the arena
    // and return the bytes moved. Not with a pool (std::invalid_argument).
    void enable_host_mirror();
    size_t host_upload_self(uint32_t n_rows);                 // rows [0, n_rows) of every layer
    size_t host_download_self(uint32_t row0, uint32_t n_rows);
    size_t host_upload_cross();    // the current window's rows [0, cross_rows())
    size_t host_download_cross();

  private:
    uint64_t id_ = 0;
    uint32_t n_ctx_ = 0, n_seq_ = 1;
    uint32_t n_state_ = 0, n_head_ = 0, n_audio_ctx_ = 0;
    size_t row_bytes_ = 0;
    kv_cells cells_;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t buffer_ = nullptr;
    std::vector<ggml_tensor *> k_, v_;    // per layer [n_state, n_ctx]
    std::vector<ggml_tensor *> ck_, cv_;  // per layer [n_state, n_audio_ctx]; cv_ holds V^T (see get_cross_v)
    std::vector<std::vector<uint8_t>> host_k_, host_v_, host_ck_, host_cv_;
    std::shared_ptr<kv_pool> pool_;
    std::vector<int32_t> table_;  // paged: [n_ctx / block_cells] pool block of each run of cells, -1 none

    ggml_tensor * heads_view(ggml_context * ctx, ggml_tensor * t, int64_t n_rows) const;
    std::vector<int64_t> append(const std::vector<int32_t> & pos, const std::vector<int32_t> & seq);
    void reorder(const std::vector<int32_t> & parents);
    void forget_self();
    ggml_tensor * self_tensor(const std::vector<ggml_tensor *> & own, bool is_k, int il) const;
    int64_t row_of(uint32_t cell) const;
    void take_blocks(const std::vector<int64_t> & cells);  // paged: blocks for these cells, all or none
    void give_back_free_blocks();                          // paged: blocks whose cells are all free
};

}  // namespace aural
