// Whisper's activation, the exact (erf) GELU: 0.5 x (1 + erf(x / sqrt 2)) (ref: openai-whisper model.py,
// nn.GELU()), on any backend.
//
//   x = gelu_erf(ctx, x, model.simd_gelu);  // x: contiguous f32, any shape
//
// ggml-cpu's ggml_gelu_erf calls libm's erff once per element; in the tiny.en encoder (9.2 M activations per
// 30 s window) that is about a fifth of the window's time on 2 cores. On the CPU the same function is computed
// here as a custom op that the compiler vectorises (AVX-512 / AVX2 clones chosen at load). Other backends keep
// ggml_gelu_erf: a custom op runs only on the CPU, and the scheduler would copy the activations there and back.
#pragma once

#include "ggml.h"

namespace aural {

// simd: the vectorised CPU op (only for graphs that run on the CPU backend); otherwise ggml_gelu_erf.
ggml_tensor * gelu_erf(ggml_context * ctx, ggml_tensor * x, bool simd);

}  // namespace aural
