#include "qwen3-audio.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "activation.h"
#include "backend.h"
#include "log.h"

namespace aural {

namespace {

// Frames out of the stem's three convs (kernel 3, stride 2, padding 1) over n > 0 frames.
int64_t conv_frames(int64_t n) {
    for (int i = 0; i < 3; ++i) {
        n = (n - 1) / 2 + 1;
    }
    return n;
}

int64_t chunk_frames(const qwen3_hparams & hp) { return 2 * static_cast<int64_t>(hp.audio.n_window); }

// Chunks per attention window: window_aftercnn = 13 * (n_window_infer // (2 * n_window)) vectors.
int64_t window_chunks(const qwen3_hparams & hp) { return hp.audio.n_window_infer / chunk_frames(hp); }

// SinusoidsPositionEmbedding(n_max_pos, d)'s first n rows, [n][d]: sin(p * inv_i) for i < d / 2, then cos,
// inv_i = exp(-i * log(10000) / (d / 2 - 1)). Computed in double and rounded once; torch computes it in f32
// steps (inv_i, then p * inv_i), which put its values up to 7.2e-7 off these (d = 896, p <= 12).
std::vector<float> positions(int64_t n, int64_t d) {
    const int64_t half = d / 2;
    const double increment = std::log(10000.0) / static_cast<double>(half - 1);
    std::vector<float> pos(static_cast<size_t>(n * d));
    for (int64_t p = 0; p < n; ++p) {
        for (int64_t i = 0; i < half; ++i) {
            const double t = static_cast<double>(p) * std::exp(-increment * static_cast<double>(i));
            pos[p * d + i] = static_cast<float>(std::sin(t));
            pos[p * d + half + i] = static_cast<float>(std::cos(t));
        }
    }
    return pos;
}

// ---- graph --------------------------------------------------------------------------------------

struct tower_graph {
    ggml_cgraph * gf = nullptr;
    ggml_tensor * mel = nullptr;   // [l, n_mels, 1, n_chunks]: each chunk's l = 100 frames, zero-padded
    ggml_tensor * pos = nullptr;   // [n_state, t]: the positional embedding of a chunk's t = 13 vectors
    ggml_tensor * mask = nullptr;  // [n_w, n_w, 1, n_win] f16: 0, or -inf on the keys past the last valid
                                   // vector; null when every window is full
    ggml_tensor * out = nullptr;   // [n_out or n_state, n_w * n_win]: vectors past the valid ones are padding
};

// One of the stem's Conv2d(kernel 3, stride 2, padding 1), then GELU, on x [W, H, c_in, B] (time along ne0,
// mel bins along ne1, B chunks): torch's on (B, c_in, H, W). Returns [W', H', c_out, B] as a permuted view,
// which the next im2col reads as it is (it takes the channel and batch strides from the tensor).
// note: in f32 whatever the kernel's type (the converter stores it as f16): casting the kernel (4.1 M values
// for 0.6B) costs less than ggml_conv_2d's f16 columns, and loses nothing. 0.6B's stem took 1.15 s per 30 s
// so against 1.33 s in f16 (2 cores, AVX-512, 4 windows per graph).
ggml_tensor * conv_gelu(ggml_context * ctx, ggml_tensor * x, const qwen3_linear & conv) {
    ggml_tensor * kernel = conv.w->type == GGML_TYPE_F32 ? conv.w : ggml_cast(ctx, conv.w, GGML_TYPE_F32);
    ggml_tensor * cols = ggml_im2col(ctx, kernel, x, 2, 2, 1, 1, 1, 1, true, GGML_TYPE_F32);  // [9 c_in, W', H', B]
    const int64_t k = cols->ne[0], w = cols->ne[1], h = cols->ne[2], b = cols->ne[3], c_out = kernel->ne[3];
    // Operands in this order so the product comes out [W' H' B, c_out]: each channel's planes contiguous.
    ggml_tensor * y =
        ggml_mul_mat(ctx, ggml_reshape_2d(ctx, cols, k, w * h * b), ggml_reshape_2d(ctx, kernel, k, c_out));
    y = gelu_erf(ctx, ggml_add(ctx, y, ggml_reshape_2d(ctx, conv.b, 1, c_out)), /*simd=*/true);
    return ggml_permute(ctx, ggml_reshape_4d(ctx, y, w, h, b, c_out), 0, 1, 3, 2);
}

// The stem of every chunk of `mel`: [n_state, t * n_chunks], chunk after chunk (ref: Qwen3ASRAudioEncoder
// .forward up to `padded_embed + positional_embedding`).
ggml_tensor * stem_forward(ggml_context * ctx, const qwen3_model & m, ggml_tensor * mel, ggml_tensor * pos) {
    ggml_tensor * x = mel;
    for (const qwen3_linear & conv : m.conv) {
        x = conv_gelu(ctx, x, conv);
    }
    const int64_t t = x->ne[0], f = x->ne[1], c = x->ne[2], b = x->ne[3];  // [13, 16, n_conv, B]
    // torch's permute(0, 3, 1, 2).view(b, t, c * f): a frame's features channel by channel, bins within one.
    x = ggml_cont(ctx, ggml_permute(ctx, x, 2, 0, 1, 3));  // [f, c, t, B]
    x = ggml_mul_mat(ctx, m.conv_out, ggml_reshape_2d(ctx, x, f * c, t * b));
    x = ggml_add(ctx, ggml_reshape_3d(ctx, x, x->ne[0], t, b), pos);  // positions restart in every chunk
    return ggml_reshape_2d(ctx, x, x->ne[0], t * b);
}

ggml_tensor * linear(ggml_context * ctx, const qwen3_linear & l, ggml_tensor * x) {
    ggml_tensor * y = ggml_mul_mat(ctx, l.w, x);
    return l.b ? ggml_add(ctx, y, l.b) : y;
}

ggml_tensor * layer_norm(ggml_context * ctx, const qwen3_norm & n, ggml_tensor * x) {
    return ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, qwen3_hparams::audio_norm_eps), n.w), n.b);
}

// Bidirectional self-attention within each window of x [n_state, n_w * n_win], the windows side by side:
// the cu_seqlens blocks of the reference, as a batch dimension rather than a block-diagonal mask over the
// whole clip (n_w^2 scores per window, not (n_w n_win)^2). The mask hides the last window's padding.
ggml_tensor * window_attention(ggml_context * ctx, const qwen3_audio_layer & l, ggml_tensor * x, int64_t n_head,
                               int64_t n_w, ggml_tensor * mask) {
    const int64_t d = x->ne[0], n = x->ne[1], hd = d / n_head;
    auto heads = [&](const qwen3_linear & proj) {  // [hd, n_w, n_head, n_win]
        return ggml_permute(ctx, ggml_reshape_4d(ctx, linear(ctx, proj, x), hd, n_head, n_w, n / n_w), 0, 2, 1, 3);
    };
    ggml_tensor * o = ggml_flash_attn_ext(ctx, heads(l.q), heads(l.k), heads(l.v), mask,
                                          1.0f / std::sqrt(static_cast<float>(hd)), 0.0f, 0.0f);
    return linear(ctx, l.o, ggml_reshape_2d(ctx, o, d, n));  // o: [hd, n_head, n_w, n_win]
}

// Qwen3ASRAudioEncoderLayer: pre-LayerNorm attention and MLP (exact GELU), each with its residual.
ggml_tensor * layer_forward(ggml_context * ctx, const qwen3_model & m, const qwen3_audio_layer & l, ggml_tensor * x,
                            int64_t n_w, ggml_tensor * mask) {
    x = ggml_add(ctx, x, window_attention(ctx, l, layer_norm(ctx, l.attn_ln, x), m.hp.audio.n_head, n_w, mask));
    ggml_tensor * h = gelu_erf(ctx, linear(ctx, l.fc1, layer_norm(ctx, l.ffn_ln, x)), /*simd=*/true);
    return ggml_add(ctx, x, linear(ctx, l.fc2, h));
}

// Nodes of one graph, whatever its length: ~40 per layer, the stem and head ~50.
size_t graph_size(const qwen3_model & m) { return 256 + 64 * m.audio_layers.size(); }

// n_chunks chunks of l frames whose valid vectors number n_valid, as n_win windows of n_w vectors; n_layers < 0:
// the whole tower, else the hidden states after that many layers.
tower_graph build_graph(ggml_context * ctx, const qwen3_model & m, int64_t l, int64_t n_chunks, int64_t n_valid,
                        int64_t n_w, int n_layers) {
    const auto & au = m.hp.audio;
    const int64_t t = conv_frames(l), n_win = (n_valid + n_w - 1) / n_w, n = n_w * n_win;
    tower_graph g;
    g.mel = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, l, au.n_mels, 1, n_chunks);
    g.pos = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, au.n_state, t);
    ggml_set_input(g.mel);
    ggml_set_input(g.pos);
    const size_t n_run = n_layers < 0 ? m.audio_layers.size() : static_cast<size_t>(n_layers);
    if (n > n_valid && n_run > 0) {
        g.mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_w, n_w, 1, n_win);
        ggml_set_input(g.mask);
    }
    ggml_tensor * x = stem_forward(ctx, m, g.mel, g.pos);  // [n_state, t * n_chunks]
    // Vectors past n_valid (a short last chunk's tail) stay as padding: only keys are masked, and those
    // rows' outputs are dropped. The windows' span may be shorter than the chunks' (a view) or longer (zeros).
    x = x->ne[1] >= n ? ggml_view_2d(ctx, x, x->ne[0], n, x->nb[1], 0) : ggml_pad(ctx, x, 0, n - x->ne[1], 0, 0);
    for (size_t i = 0; i < n_run; ++i) {
        x = layer_forward(ctx, m, m.audio_layers[i], x, n_w, g.mask);
    }
    if (n_layers < 0) {
        x = gelu_erf(ctx, linear(ctx, m.proj1, layer_norm(ctx, m.ln_post, x)), /*simd=*/true);
        x = linear(ctx, m.proj2, x);
    }
    g.out = x;
    ggml_set_output(g.out);
    g.gf = ggml_new_graph_custom(ctx, graph_size(m), false);
    ggml_build_forward_expand(g.gf, g.out);
    return g;
}

ggml_context_ptr graph_context(const qwen3_model & m) {
    const size_t n_nodes = graph_size(m);
    const size_t mem_size = ggml_tensor_overhead() * n_nodes + ggml_graph_overhead_custom(n_nodes, false);
    ggml_init_params params = {/*.mem_size =*/mem_size, /*.mem_buffer =*/nullptr, /*.no_alloc =*/true};
    return ggml_context_ptr(ggml_init(params));
}

// The window length of a graph of n_valid vectors: the model's, or one window of them all when they are
// fewer (as in the reference, whose only window is then shorter).
int64_t window_length(const qwen3_hparams & hp, int64_t n_valid) {
    return std::min(conv_frames(chunk_frames(hp)) * window_chunks(hp), n_valid);
}

std::vector<ggml_fp16_t> window_mask(int64_t n_w, int64_t n_win, int64_t n_valid) {
    std::vector<ggml_fp16_t> mask(static_cast<size_t>(n_w * n_w * n_win));
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), hidden = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t w = 0; w < n_win; ++w) {
        for (int64_t q = 0; q < n_w; ++q) {
            for (int64_t k = 0; k < n_w; ++k) {
                mask[(w * n_w + q) * n_w + k] = w * n_w + k < n_valid ? zero : hidden;
            }
        }
    }
    return mask;
}

}  // namespace

int64_t qwen3_audio_frames(const qwen3_hparams & hp, int64_t n_frames) {
    const int64_t l = chunk_frames(hp), rest = n_frames % l;
    return n_frames / l * conv_frames(l) + (rest > 0 ? conv_frames(rest) : 0);
}

qwen3_audio_encoder::qwen3_audio_encoder(const qwen3_model & m, int n_windows) : windows_per_graph(n_windows), m_(m) {
    if (n_windows < 1) {
        throw std::invalid_argument("windows_per_graph must be at least 1, got " + std::to_string(n_windows));
    }
    const int64_t t = conv_frames(chunk_frames(m.hp));
    if (t > m.hp.audio.n_max_pos) {
        throw std::runtime_error(m.path + ": a chunk's " + std::to_string(t) + " frames exceed the " +
                                 std::to_string(m.hp.audio.n_max_pos) + " audio positions");
    }
    pos_ = positions(t, m.hp.audio.n_state);
    backends_ = std::make_unique<backend_set>(m.dev, m.n_threads, nullptr);
    sched_.reset(backends_->make_sched(sched_size(graph_size(m))));
    const int64_t n_chunks = windows_per_graph * window_chunks(m.hp), n_valid = n_chunks * t;
    ggml_context_ptr ctx = graph_context(m);
    const tower_graph g =
        build_graph(ctx.get(), m, chunk_frames(m.hp), n_chunks, n_valid, window_length(m.hp, n_valid), -1);
    if (!ggml_backend_sched_reserve(sched_.get(), g.gf)) {
        throw std::runtime_error("cannot allocate the audio tower's compute buffer (out of memory?)");
    }
    report = placement(*backends_, sched_.get(), g.gf);
    compute_bytes = sched_buffer_bytes(sched_.get());
    AURAL_LOG_INFO("%.1f MiB compute buffer for %d windows per graph on %s", compute_bytes / 1048576.0,
                   windows_per_graph, report.primary.c_str());
}

std::vector<float> qwen3_audio_encoder::encode(const float * mel, int64_t n_frames, int n_layers) {
    if (n_frames < 1) {
        throw std::invalid_argument("the audio tower needs at least one mel frame, got " + std::to_string(n_frames));
    }
    if (n_layers > static_cast<int>(m_.audio_layers.size())) {
        throw std::invalid_argument("the audio tower has " + std::to_string(m_.audio_layers.size()) + " layers, not " +
                                    std::to_string(n_layers));
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t l = chunk_frames(m_.hp), n_chunks = (n_frames + l - 1) / l;
    const int64_t per_graph = windows_per_graph * window_chunks(m_.hp);
    const int64_t width = n_layers < 0 ? m_.hp.audio.n_out : m_.hp.audio.n_state;
    std::vector<float> out(static_cast<size_t>(qwen3_audio_frames(m_.hp, n_frames) * width));
    for (int64_t c = 0; c < n_chunks; c += per_graph) {
        const int64_t done = qwen3_audio_frames(m_.hp, c * l);
        run(mel, n_frames, c, std::min(per_graph, n_chunks - c), n_layers, out.data() + done * width);
    }
    AURAL_LOG_DEBUG("%lld frames -> %zu vectors in %.1f ms", static_cast<long long>(n_frames), out.size() / width,
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    return out;
}

void qwen3_audio_encoder::run(const float * mel, int64_t n_frames, int64_t chunk0, int64_t n_chunks, int n_layers,
                              float * out) {
    // Chunks are zero-padded to the clip's longest (torch's pad_sequence): 100 frames, except in a clip shorter
    // than that, whose one chunk is convolved as it is (its last vectors differ, since each conv pads with zeros
    // where the padded chunk would have GELU(bias)).
    const int64_t l = std::min(chunk_frames(m_.hp), n_frames), n_mels = m_.hp.audio.n_mels;
    const int64_t first = chunk0 * l, n_in = std::min(n_chunks * l, n_frames - first);
    const int64_t n_valid = qwen3_audio_frames(m_.hp, n_in), n_w = window_length(m_.hp, n_valid);
    ggml_context_ptr ctx = graph_context(m_);
    const tower_graph g = build_graph(ctx.get(), m_, l, n_chunks, n_valid, n_w, n_layers);
    ggml_backend_sched_reset(sched_.get());
    if (!ggml_backend_sched_alloc_graph(sched_.get(), g.gf)) {
        throw std::runtime_error("cannot allocate the audio tower's compute buffer (out of memory?)");
    }
    // [n_chunks][n_mels][l] from the clip's [n_mels][n_frames], zeros past its end.
    std::vector<float> chunks(static_cast<size_t>(n_chunks * n_mels * l), 0.0f);
    for (int64_t c = 0; c < n_chunks; ++c) {
        const int64_t n = std::min(l, n_in - c * l);
        for (int64_t b = 0; b < n_mels; ++b) {
            std::copy_n(mel + b * n_frames + first + c * l, n, chunks.data() + (c * n_mels + b) * l);
        }
    }
    ggml_backend_tensor_set(g.mel, chunks.data(), 0, ggml_nbytes(g.mel));
    ggml_backend_tensor_set(g.pos, pos_.data(), 0, ggml_nbytes(g.pos));
    if (g.mask) {
        const std::vector<ggml_fp16_t> mask = window_mask(n_w, g.mask->ne[3], n_valid);
        ggml_backend_tensor_set(g.mask, mask.data(), 0, ggml_nbytes(g.mask));
    }
    if (ggml_backend_sched_graph_compute(sched_.get(), g.gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("the audio tower's graph failed to compute");
    }
    ggml_backend_tensor_get(g.out, out, 0, static_cast<size_t>(n_valid * g.out->ne[0]) * sizeof(float));
}

}  // namespace aural
