// CAM++ speaker embeddings (3D-Speaker's CAMPPlus): the weights of one GGUF written by
// aural.engine.speakers.campplus.convert, and the graph that turns one utterance's log-mel fbank into one
// embedding. Every BatchNorm is already folded by the converter: into the conv it follows, or into a
// per-channel scale and shift where it follows a concatenation; every weight is f32.
//
//   auto m = aural::speaker_model::load("campplus.gguf", /*n_threads=*/0);
//   std::vector<float> emb(m->hp.n_embed);
//   m->embed(fbank.data(), n_frames, emb.data());  // fbank [n_frames, n_mels] row-major, mean-normalised
//
// CPU only for now: the weights live in a buffer of ggml's CPU backend and graphs run there. The model
// is small (7 M parameters, 26 MiB) and 10 s of speech (1000 frames) takes ~0.2 s on two cores; a GPU path
// would need the scheduler of backend.h and a test of CPU against GPU. The compute buffer grows with the
// utterance, ~70 KB a frame (mostly the head's im2col: 40 bins x 288 values per frame), 67 MiB at 10 s.
// Thread-safety: the weights are read-only after load; embed() may be called from any thread, and calls
// on one model run one at a time (they share its compute buffer, guarded by a mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"

namespace aural {

// Read from the GGUF keys `campplus.*`. The values in comments are those of the released model
// (CAMPPlus(feat_dim=80, embedding_size=192), 3D-Speaker speakerlab/models/campplus/DTDNN.py).
struct speaker_hparams {
    uint32_t n_mels = 0;          // 80 fbank bins; the head halves them three times, to n_mels / 8
    uint32_t n_embed = 0;         // 192
    uint32_t head_channels = 0;   // 32: channels of the 2-D conv head (FCM)
    uint32_t n_channels = 0;      // 128: output of the TDNN layer, input of the first dense block
    uint32_t growth = 0;          // 32: channels each dense layer appends
    uint32_t bottleneck = 0;      // 128: width inside a dense layer
    uint32_t seg_len = 0;         // 100: frames per segment of the CAM layer's context (after the TDNN)
    std::vector<uint32_t> block_layers;     // {12, 24, 16}: dense layers per block
    std::vector<uint32_t> block_dilations;  // {1, 2, 2}: dilation of each block's kernel-3 convs
};

// Tensor shapes are ggml ne order. "T" is the frame count after the TDNN layer; activations are
// [channels, T] ("channel-major") except where a comment says [T, channels].
struct conv2d_weights {
    ggml_tensor * w = nullptr;  // [k, k, c_in, c_out]: k = 3, or 1 for a shortcut
    ggml_tensor * b = nullptr;  // [1, 1, c_out]: the BatchNorm that follows the conv
};

// BasicResBlock of the head: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
struct res_block {
    conv2d_weights conv1, conv2;
    conv2d_weights shortcut;  // w null: the identity
    int stride = 1;           // along frequency (conv1 and shortcut)
};

// One CAMDenseTDNNLayer; its output (growth channels) is appended to its input.
struct dense_layer {
    ggml_tensor * bn_scale = nullptr;  // [c_in]: nonlinear1's BatchNorm as x * scale + shift, then relu
    ggml_tensor * bn_shift = nullptr;  // [c_in]
    ggml_tensor * linear1_w = nullptr;  // [c_in, bottleneck]
    ggml_tensor * linear1_b = nullptr;  // [1, bottleneck]: nonlinear2's BatchNorm, on the [T, bottleneck] output
    ggml_tensor * local_w = nullptr;    // [3, bottleneck, growth]: linear_local, in im2col's kernel layout
    ggml_tensor * cam1_w = nullptr;     // [bottleneck, bottleneck / 2]
    ggml_tensor * cam1_b = nullptr;     // [bottleneck / 2]
    ggml_tensor * cam2_w = nullptr;     // [bottleneck / 2, growth]
    ggml_tensor * cam2_b = nullptr;     // [growth]
};

// TransitLayer: relu(x * scale + shift), then a 1x1 conv to half the channels.
struct transit_layer {
    ggml_tensor * bn_scale = nullptr;  // [c]
    ggml_tensor * bn_shift = nullptr;  // [c]
    ggml_tensor * w = nullptr;         // [c, c / 2]
    // [1, c / 2] on the last transit only: out_nonlinear's BatchNorm, which follows its conv (the last
    // transit's output is [T, c / 2], for the statistics pooling over T); null elsewhere.
    ggml_tensor * b = nullptr;
};

struct dense_block {
    std::vector<dense_layer> layers;
    transit_layer transit;
    int dilation = 1;
};

class speaker_model {
  public:
    // Throws std::runtime_error naming `path` for a missing, truncated or malformed file, a wrong
    // architecture, a missing tensor or a wrong shape.
    static std::unique_ptr<speaker_model> load(const std::string & path, int n_threads);
    ~speaker_model();
    speaker_model(const speaker_model &) = delete;
    speaker_model & operator=(const speaker_model &) = delete;

    // The embedding of one utterance: `fbank` [n_frames, n_mels] row-major (Kaldi log-mel, mean-normalised
    // over time), `out` [n_embed]. Throws std::invalid_argument when n_frames < min_frames().
    void embed(const float * fbank, int64_t n_frames, float * out);
    // The TDNN layer halves the frames and the standard deviation over them needs two: 3 frames (30 ms).
    static constexpr int64_t min_frames() { return 3; }

    std::string path;
    speaker_hparams hp;
    int n_threads = 0;
    size_t weights_bytes = 0;
    std::atomic<size_t> compute_bytes{0};  // the compute buffer, grown to the longest utterance so far

    conv2d_weights head_conv1;       // [3, 3, 1, head_channels]
    std::vector<res_block> head_blocks;  // layer1 (2 blocks) then layer2 (2 blocks)
    conv2d_weights head_conv2;       // [3, 3, head_channels, head_channels], stride 2 along frequency
    ggml_tensor * tdnn_w = nullptr;  // [5, head_channels * n_mels / 8, n_channels]: stride 2, padding 2
    ggml_tensor * tdnn_b = nullptr;  // [n_channels]
    std::vector<dense_block> blocks;
    ggml_tensor * dense_w = nullptr;  // [2 * c_out, n_embed]: mean and std of the last transit's c_out channels
    ggml_tensor * dense_b = nullptr;  // [n_embed]: the BatchNorm(affine=False) that ends the model

  private:
    speaker_model() = default;
    void read_hparams(gguf_context * meta);
    ggml_tensor * require(const std::string & name, std::initializer_list<int64_t> ne);
    void bind_tensors();
    void read_weights(gguf_context * meta);
    size_t graph_size() const;  // nodes of one utterance's graph, whatever its length

    ggml_context * ctx_ = nullptr;  // weight metadata
    ggml_backend_buffer_t weights_ = nullptr;
    ggml_backend_t backend_ = nullptr;  // ggml's CPU backend
    ggml_gallocr_t galloc_ = nullptr;   // compute buffer, reused across calls
    std::mutex mutex_;                  // one embed() at a time
};

}  // namespace aural
