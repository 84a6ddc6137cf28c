// Scalar math written so that the loops around it vectorise: no calls, no branches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace aural {

// e^-u for u >= 0. Cody-Waite range reduction: e^-u = 2^n e^r with n = round(-u / ln 2), |r| <= ln 2 / 2,
// e^r by its degree-7 Taylor polynomial (truncation error below 1e-8 there, under f32 rounding). u is
// clamped to 87 so that 2^n stays a normal float: a vector loop computes every lane, also those its caller
// then discards.
// Always inlined: each per-ISA kernel (activation.cpp, attention.cpp) vectorises it at its own width.
inline __attribute__((always_inline)) float exp_neg(float u) {
    const float a = -std::min(u, 87.0f);
    const float round_shift = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
    const float n = (a * 1.44269504f + round_shift) - round_shift;
    const float r = (a - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 as f32 hi + lo parts
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

}  // namespace aural
