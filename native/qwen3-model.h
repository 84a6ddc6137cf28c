// Qwen3-ASR weights: one GGUF of architecture "qwen3-asr" written by aural.engine.models.qwen3_asr, whose
// tensors keep the names of Qwen's modelling code (qwen-asr's modeling_qwen3_asr.py) less "thinker.". Two
// parts: the audio tower (128-bin log-mel -> one embedding per 8 mel frames, in the text model's width) and
// the Qwen3 text decoder (RMSNorm, q/k-norm, RoPE, grouped-query attention, SwiGLU, tied output).
//
//   auto m = aural::qwen3_model::load("qwen3-asr.gguf", /*n_threads=*/0, /*device=*/"auto");
//   m->hp.text.n_layer;   // 28 for Qwen3-ASR-0.6B
//
// The weights live in a buffer of the chosen ggml device (select_device: "auto" takes a GPU where there is one,
// else the CPU); the audio tower (qwen3-audio.h) and the contexts (qwen3-context.h) compute there through a
// scheduler, which runs on the CPU the ops the device lacks and reports them. Thread-safety: read-only after
// load; any number of contexts may use it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"

namespace aural {

// Read from the GGUF keys `qwen3-asr.*`; comments give Qwen3-ASR-0.6B's values.
struct qwen3_hparams {
    struct {
        uint32_t n_mels = 0;         // 128
        uint32_t n_layer = 0;        // 18
        uint32_t n_head = 0;         // 14
        uint32_t n_ff = 0;           // 3584
        uint32_t n_state = 0;        // 896
        uint32_t n_max_pos = 0;      // 1500: rows of the sinusoidal position table
        uint32_t n_window = 0;       // the conv stem runs on chunks of 2 * n_window mel frames
        uint32_t n_window_infer = 0; // attention windows span n_window_infer mel frames' positions
        uint32_t n_out = 0;          // 1024: the text model's width
        uint32_t n_conv = 0;         // 480: channels of the 2-D conv stem
    } audio;
    struct {
        uint32_t n_vocab = 0;    // 151936
        uint32_t n_state = 0;    // 1024
        uint32_t n_ff = 0;       // 3072
        uint32_t n_layer = 0;    // 28
        uint32_t n_head = 0;     // 16
        uint32_t n_head_kv = 0;  // 8
        uint32_t head_dim = 0;   // 128
        float norm_eps = 0.0f;   // 1e-6
        float rope_theta = 0.0f; // 1e6
        bool tied = true;        // the output projection is model.embed_tokens
    } text;
    uint32_t audio_token = 0, audio_start_token = 0;
    std::vector<uint32_t> eos_tokens;
    // PyTorch's nn.LayerNorm default, which the audio tower's norms keep (modeling_qwen3_asr.py).
    static constexpr float audio_norm_eps = 1e-5f;
};

struct qwen3_linear {
    ggml_tensor * w = nullptr;  // [n_in, n_out]
    ggml_tensor * b = nullptr;  // [n_out] or null
};

struct qwen3_norm {
    ggml_tensor * w = nullptr;
    ggml_tensor * b = nullptr;  // LayerNorm only
};

struct qwen3_audio_layer {
    qwen3_norm attn_ln, ffn_ln;
    qwen3_linear q, k, v, o, fc1, fc2;
};

struct qwen3_text_layer {
    qwen3_norm attn_norm, ffn_norm, q_norm, k_norm;  // RMSNorm weights; q/k-norm over head_dim
    qwen3_linear q, k, v, o, gate, up, down;
};

class qwen3_model {
  public:
    // Throws std::runtime_error naming `path` for a missing or malformed file, another architecture, a
    // missing tensor or a wrong shape.
    static std::unique_ptr<qwen3_model> load(const std::string & path, int n_threads,
                                             const std::string & device = "cpu");
    ~qwen3_model();
    qwen3_model(const qwen3_model &) = delete;
    qwen3_model & operator=(const qwen3_model &) = delete;

    std::string path;
    qwen3_hparams hp;
    int n_threads = 0;
    size_t weights_bytes = 0;
    // Weights the device cannot hold (ggml_backend_dev_supports_op refuses them: llvmpipe's Vulkan took no
    // tensor over its storage-buffer limit, which Qwen3-ASR-0.6B's 151936-row embedding passes), kept in the
    // CPU's memory; the scheduler runs their products on the CPU.
    std::vector<std::string> host_weights;
    ggml_backend_dev_t dev = nullptr;  // where the weights are, and graphs run
    // CPU: RoPE by Aural's table op, one node a rotation (qwen3-graph.cpp); other devices, which cannot run a
    // CPU op, by ggml's products and sums on the same table. The same values: each product and difference is
    // rounded once in f32 either way. env: AURAL_NO_ROPE_OP=1 takes ggml's ops on the CPU too (tests, A/B).
    bool rope_op = false;

    // audio tower: conv stem [3, 3, c_in, n_conv] x3, conv_out [n_conv * f, n_state], layers, ln_post, proj1/2
    qwen3_linear conv[3];
    ggml_tensor * conv_out = nullptr;
    std::vector<qwen3_audio_layer> audio_layers;
    qwen3_norm ln_post;
    qwen3_linear proj1, proj2;

    // text decoder
    ggml_tensor * embed_tokens = nullptr;  // [n_state, n_vocab]
    std::vector<qwen3_text_layer> text_layers;
    qwen3_norm norm;
    ggml_tensor * lm_head = nullptr;  // embed_tokens when tied

  private:
    qwen3_model() = default;
    void read_hparams(gguf_context * meta);
    void bind_tensors();
    ggml_tensor * require(const std::string & name, std::initializer_list<int64_t> ne);
    void read_weights(gguf_context * meta);

    ggml_context * ctx_ = nullptr;  // tensor metadata
    std::vector<ggml_backend_buffer_t> buffers_;  // the weights: the device's, and the CPU's for what it refuses
};

}  // namespace aural
