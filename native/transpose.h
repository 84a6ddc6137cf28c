// A matrix transposed into a new contiguous tensor, on the CPU, by 8 x 8 register tiles:
//
//   if (transpose_available()) y = transpose(ctx, x, GGML_TYPE_F32);  // x [a, b] f32 -> y [b, a]
//   vt = transpose(ctx, v, GGML_TYPE_F16);                            // and rounded to f16 on the way
//
// Why: ggml-cpu copies a transposed f32 view (ggml_cont(ggml_transpose(x))) one element at a time, each by a
// libc memcpy call of run-time length, and a transposed f32 -> f16 ggml_cpy element by element as well:
// together 4 % of base's encoder on a Zen 3 (perf, 2026-12-07: 7 transposes of 1500 x 512 floats and 6
// V^T copies into the KV arena per 30 s window). Values are copied (or rounded to f16 by F16C, as ggml's
// own conversion rounds them), so the result is the bits ggml's copy gives.
//
// x: f32, 2-D, rows contiguous (nb[0] = 4; rows may be a view's stride apart), any shape.
// Thread contract: a graph op; ggml's threads split the output's rows. CPU only (x86-64 with AVX2 and F16C).
#pragma once

#include "ggml.h"

namespace aural {

// Whether this CPU runs the op (AVX2 with F16C at the loaded CPU level).
bool transpose_available();

ggml_tensor * transpose(ggml_context * ctx, ggml_tensor * x, ggml_type type);

}  // namespace aural
