// Whisper hyper-parameters, read from the GGUF keys `whisper.*` written by aural.engine.models.convert.
#pragma once

#include <cstdint>

namespace aural {

struct hparams {
    uint32_t n_vocab = 0;        // 51864 (English-only) or 51865/51866 (multilingual)
    uint32_t n_audio_ctx = 0;    // encoder positions: 1500 for 30 s (two mel frames per position)
    uint32_t n_audio_state = 0;  // encoder width: 384 tiny, 512 base, ... 1280 large
    uint32_t n_audio_head = 0;
    uint32_t n_audio_layer = 0;
    uint32_t n_text_ctx = 0;     // decoder positions: 448
    uint32_t n_text_state = 0;
    uint32_t n_text_head = 0;
    uint32_t n_text_layer = 0;
    uint32_t n_mels = 0;         // 80, or 128 for large-v3 and turbo
    // Whisper's layer norms use PyTorch's default epsilon (ref: openai-whisper model.py LayerNorm).
    static constexpr float norm_eps = 1e-5f;
    // Mel frames per 30 s window: 2 * n_audio_ctx (conv2 has stride 2).
    uint32_t n_mel_frames() const { return 2 * n_audio_ctx; }
};

}  // namespace aural
