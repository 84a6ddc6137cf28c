// Qwen3-ASR's audio tower on ggml's CPU backend: a log-mel spectrogram in, one vector per 8 mel frames (80 ms)
// out, in the text model's width, for the prompt's audio pads (ref: qwen-asr 0.0.6,
// core/transformers_backend/modeling_qwen3_asr.py, Qwen3ASRAudioEncoder.forward).
//
//   aural::qwen3_audio_encoder enc(*model);                     // its own CPU backend and compute buffer
//   std::vector<float> a = enc.encode(mel.data(), n_frames);     // mel [n_mels][n_frames] row-major
//   // a: [qwen3_audio_frames(model->hp, n_frames)][n_out] row-major (143 x 1024 for 11 s with 0.6B)
//
// The tower cuts the mel into chunks of 2 * n_window = 100 frames (the last one shorter, zero-padded to 100;
// torch's pad_sequence pads to the longest, so a clip under 100 frames stays one chunk of its own length);
// each chunk goes alone through three 3x3 stride-2 convs with GELU (128 bins -> 16, 100 frames -> 13) and
// conv_out, the sinusoidal positions restart at 0 in each, and a short last chunk keeps only its valid frames.
// The layers then attend within windows of n_window_infer / 100 = 8 chunks (104 vectors), never across.
// note: that is the flash_attention_2 path (cu_seqlens) and vLLM's; the official eager and sdpa paths attend
// over the whole clip, since Qwen3ASRAudioEncoder.forward never passes them the windows' mask. Both agree up
// to 104 vectors (8.3 s of audio). So each
// window depends on its own 800 mel frames alone: one graph takes up to windows_per_graph windows (their
// chunks are the convs' batch, the windows attention's, with a mask on a short last window's padding), and a
// longer clip runs graph after graph, which bounds the compute buffer whatever the clip's length.
//
// Cost (Qwen3-ASR-0.6B, 2 threads, AVX-512 Xeon): 1.95 s per 30 s of audio with f16 weights, 1.85 s with f32,
// 1.1 s of it in the conv stem (65 GMAC per 30 s). One window per graph (the default) ran as fast as 2 or 4
// there, with a 216 MiB compute buffer against 417 and 818 MiB; a GPU would want more per graph.
//
// Thread-safety: the model is read-only and may be shared; an encoder is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend.h"
#include "ggml-cpp.h"
#include "qwen3-model.h"

namespace aural {

// The vectors the tower gives for n_frames mel frames: 13 per full chunk, plus (n - 1) / 2 + 1 three times over
// the n frames of a short last chunk (ref: _get_feat_extract_output_lengths, which hard-codes 100 and 13, the
// values of n_window = 50, the only one the official code runs with). 143 for 1100 frames.
int64_t qwen3_audio_frames(const qwen3_hparams & hp, int64_t n_frames);

class qwen3_audio_encoder {
  public:
    // Starts the model's device (and the CPU) with the model's threads and reserves the compute buffers of a graph of
    // windows_per_graph windows, so that running out of memory shows here. Throws std::runtime_error when it
    // cannot, std::invalid_argument for windows_per_graph < 1.
    explicit qwen3_audio_encoder(const qwen3_model & m, int windows_per_graph = 1);

    // mel: [n_mels][n_frames] row-major, the processor's log-mel (Whisper's, 128 bins). Returns
    // [qwen3_audio_frames(hp, n_frames)][n_out] row-major. n_layers >= 0 stops after that many layers and
    // returns the hidden states [..][n_state] before ln_post instead (0: the stem), which the reference records
    // too. Throws std::invalid_argument when n_frames < 1 or n_layers > the model's.
    std::vector<float> encode(const float * mel, int64_t n_frames, int n_layers = -1);

    const int windows_per_graph;  // attention windows (800 mel frames, 8 s, each) per graph
    size_t compute_bytes = 0;     // the compute buffers, reserved for a graph of windows_per_graph windows
    backend_report report;        // where the reserved graph's nodes run (ops that fell back to the CPU)

  private:
    // Runs the chunks [chunk0, chunk0 + n_chunks) of the clip (whole windows, except at the clip's end) and
    // writes their vectors to out.
    void run(const float * mel, int64_t n_frames, int64_t chunk0, int64_t n_chunks, int n_layers, float * out);

    const qwen3_model & m_;
    std::unique_ptr<backend_set> backends_;  // the model's device, and the CPU for the ops it lacks
    ggml_backend_sched_ptr sched_;           // the compute buffers, reused across graphs and calls
    std::vector<float> pos_;    // [t][n_state]: the positional embedding of a chunk's t = 13 frames
};

}  // namespace aural
