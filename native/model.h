// Whisper weights loaded from one GGUF file into backend buffers: immutable, shared by sessions. The
// layers' projection matrices go to the device's "extra" buffer type when it runs their matmul in its own
// layout (ggml-cpu's CPU_REPACK: q4_0/iq4_nl interleaved for AVX2/AVX512 GEMM kernels); everything else
// to the device's default buffer type. On the CPU, f16 matrices that multiply the encoder's 1500-column
// activations are widened to f32 at load (see model.cpp, widen_encoder_projections); on CPUs with
// AVX2 (VNNI or not) every layer's projections are copied as int8 instead (make_cpu_copies). An int8 or q8_0 copy
// of the output projection screens the vocabulary for the decoder.
//
//   auto model = aural::model::load("tiny.en-f16.gguf", "auto", /*n_threads=*/0);
//   model->hp.n_text_layer;   // 4 for tiny
//   model->dev;               // the ggml device that holds the weights
//
// Thread-safety: a loaded model is read-only; any number of contexts (one per thread) may use it.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "hparams.h"

namespace aural {

// Tensor shapes are ggml ne order ([ne0, ne1] = [in, out] for a linear weight).
struct attn_weights {
    ggml_tensor * q_w = nullptr;  // [n_state, n_state]
    ggml_tensor * q_b = nullptr;  // [n_state]
    ggml_tensor * k_w = nullptr;  // [n_state, n_state]; Whisper's key projection has no bias
    ggml_tensor * v_w = nullptr;  // [n_state, n_state]
    ggml_tensor * v_b = nullptr;  // [n_state]
    ggml_tensor * o_w = nullptr;  // [n_state, n_state]
    ggml_tensor * o_b = nullptr;  // [n_state]
};

struct norm_weights {
    ggml_tensor * w = nullptr;  // [n_state]
    ggml_tensor * b = nullptr;  // [n_state]
};

struct mlp_weights {
    ggml_tensor * fc1_w = nullptr;  // [n_state, 4*n_state]
    ggml_tensor * fc1_b = nullptr;  // [4*n_state]
    ggml_tensor * fc2_w = nullptr;  // [4*n_state, n_state]
    ggml_tensor * fc2_b = nullptr;  // [n_state]
};

struct encoder_layer {
    norm_weights attn_ln;
    attn_weights attn;
    norm_weights mlp_ln;
    mlp_weights mlp;
};

struct decoder_layer {
    norm_weights attn_ln;
    attn_weights attn;
    norm_weights cross_ln;
    attn_weights cross;
    norm_weights mlp_ln;
    mlp_weights mlp;
};

class model {
  public:
    // Throws std::runtime_error naming `path` for a missing, truncated or malformed file, a wrong
    // architecture, a missing tensor or a wrong shape; std::invalid_argument for an unknown device.
    static std::unique_ptr<model> load(const std::string & path, const std::string & device, int n_threads);
    // Whether the weights live on (and graphs run first on) ggml's CPU device: the CPU-only layouts and ops.
    bool on_cpu() const { return ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU; }
    ~model();
    model(const model &) = delete;
    model & operator=(const model &) = delete;

    std::string path;
    hparams hp;
    ggml_backend_dev_t dev = nullptr;  // where the weights live and graphs run first
    int n_threads = 0;                 // CPU threads for contexts that don't set their own
    size_t weights_bytes = 0;
    std::vector<std::pair<std::string, size_t>> weight_buffers;  // buffer type name -> bytes, e.g. {"CPU", ...}
    size_t widened_bytes = 0;  // f32 bytes of the f16 matrices widened for the CPU (0: none)
    bool simd_gelu = false;    // CPU: GELU by Aural's vectorised op, not ggml's scalar one (activation.h)
    bool simd_attention = false;  // CPU: encoder self-attention by Aural's op, not flash attention (attention.h)
    bool simd_cross = false;      // CPU: decoder cross-attention by Aural's op, not ggml's three (attention.h)
    bool simd_self = false;       // CPU: decoder self-attention by Aural's op, not flash attention (attention.h)
    bool simd_transpose = false;  // CPU: the encoder's transposed copies by Aural's op, not ggml's (transpose.h)
    bool last_layer_outputs_only = true;  // decoder: the last layer past its K/V on the output rows alone (graph.cpp)
    // CPU with AVX2, f16/f32 weights: the layers' projections multiply as int8 (int8-matmul.h).
    bool int8 = false;
    size_t int8_bytes = 0;  // bytes of those int8 copies
    // CPU, f16 tok_emb: an int8 (int8 set) or q8_0 copy of tok_emb that screens the vocabulary each decoder
    // step before the best candidates are scored with tok_emb itself (graph.cpp, output_logits). Null: none.
    ggml_tensor * out_screen = nullptr;
    size_t screen_bytes = 0;

    ggml_tensor * conv1_w = nullptr;  // [3, n_mels, n_audio_state] f16
    ggml_tensor * conv1_b = nullptr;  // [n_audio_state]
    ggml_tensor * conv2_w = nullptr;  // [3, n_audio_state, n_audio_state] f16
    ggml_tensor * conv2_b = nullptr;  // [n_audio_state]
    ggml_tensor * enc_pos = nullptr;  // [n_audio_state, n_audio_ctx]
    std::vector<encoder_layer> enc;
    norm_weights enc_ln_post;

    // The int8 copy of a matrix (an I8 tensor of int8-matmul.h's panels), or null where it has none.
    ggml_tensor * int8_of(const ggml_tensor * w) const {
        const auto it = int8_copies_.find(w);
        return it == int8_copies_.end() ? nullptr : it->second;
    }

    // Projections of one input (a layer's self-attention q, k and v; the decoder layers' cross K and V of the
    // encoder's output) packed one after another as one int8 matrix, each one's int8 copy a view of it, with
    // their biases side by side (zeros where one has none): int8_matmul's n_split multiplies the input,
    // quantised once, by all of them in one node.
    struct int8_group {
        ggml_tensor * w = nullptr;     // I8 panels of n_split matrices of rows_each rows each
        ggml_tensor * bias = nullptr;  // f32 [n_split * rows_each]
        int64_t n_split = 0, rows_each = 0;
        std::vector<const ggml_tensor *> biases;  // each member's own bias (null: none), which fill `bias`
    };
    // The group whose members are exactly `ws`, in that order, or null.
    const int8_group * int8_group_of(const std::vector<ggml_tensor *> & ws) const;

    ggml_tensor * tok_emb = nullptr;  // [n_text_state, n_vocab]; also the output projection (tied)
    ggml_tensor * dec_pos = nullptr;  // [n_text_state, n_text_ctx]
    std::vector<decoder_layer> dec;
    norm_weights dec_ln;

  private:
    model() = default;
    void read_hparams(gguf_context * meta);
    void bind_tensors();
    ggml_tensor * require(const std::string & name, std::initializer_list<int64_t> ne);
    std::vector<ggml_tensor *> matmul_weights() const;
    std::vector<std::pair<std::vector<ggml_tensor *>, std::vector<ggml_tensor *>>> projection_groups() const;
    void make_int8_groups(const std::vector<ggml_tensor *> & packed);
    std::vector<ggml_tensor *> encoder_projections() const;
    void widen_encoder_projections();
    void allocate_weights();
    void read_weights(gguf_context * meta);
    void make_cpu_copies();
    void fill_screen();
    void fill_group_biases();
    void fill_copy(const ggml_tensor * w, const void * data, ggml_tensor * copy);

    ggml_context * ctx_ = nullptr;                 // tensor metadata (no data)
    ggml_context * copies_ctx_ = nullptr;          // metadata of out_screen and the int8 copies (made here)
    std::map<const ggml_tensor *, ggml_tensor *> int8_copies_;  // weight -> its int8 copy
    std::map<const ggml_tensor *, int8_group> int8_groups_;      // first member -> its group
    std::vector<ggml_backend_buffer_t> buffers_;  // one per buffer type that holds weights
    std::set<const ggml_tensor *> widened_;        // f16 in the file, f32 in memory
};

}  // namespace aural
