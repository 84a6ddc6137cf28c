#include "speaker-model.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "backend.h"
#include "gguf-file.h"
#include "log.h"

namespace aural {

namespace {

// ---- graph --------------------------------------------------------------------------------------

struct utterance_graph {
    ggml_cgraph * gf = nullptr;
    ggml_tensor * fbank = nullptr;  // [n_mels, n_frames]: the caller's row-major (n_frames, n_mels) array
    ggml_tensor * pool = nullptr;   // [T, n_seg + 1]: columns average each segment's frames, the last all T
    ggml_tensor * seg = nullptr;    // [T] i32: the segment of each frame
    ggml_tensor * out = nullptr;    // [n_embed, 1]
};

// A 2-D conv with "same" padding on x [n, F, c_in, 1] (time along ne0, the frequency bins along ne1):
// stride 1 along time, `stride` along frequency, as the head's Conv2d(stride=(stride, 1)) on torch's
// (B, C, F, T). Result [n, F / stride, c_out, 1] plus the folded BatchNorm.
// note: im2col then one product, not ggml_conv_2d_direct: the direct op tiles its im2col (a third of the
// compute buffer) but took 1.3x the time per embedding on two cores (276 against 212 ms at 1000 frames).
ggml_tensor * conv2d(ggml_context * ctx, ggml_tensor * x, const conv2d_weights & c, int stride) {
    const int pad = static_cast<int>(c.w->ne[0] / 2);
    // [k*k*c_in, n, F', 1]
    ggml_tensor * cols = ggml_im2col(ctx, c.w, x, 1, stride, pad, pad, 1, 1, true, GGML_TYPE_F32);
    const int64_t k = cols->ne[0], n = cols->ne[1], f = cols->ne[2], c_out = c.w->ne[3];
    // Operands in this order so the product comes out [n * F', c_out], already the layout of the next conv.
    ggml_tensor * y = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, cols, k, n * f), ggml_reshape_2d(ctx, c.w, k, c_out));
    return ggml_add(ctx, ggml_reshape_4d(ctx, y, n, f, c_out, 1), c.b);
}

ggml_tensor * res_block_forward(ggml_context * ctx, ggml_tensor * x, const res_block & r) {
    ggml_tensor * y = conv2d(ctx, ggml_relu(ctx, conv2d(ctx, x, r.conv1, r.stride)), r.conv2, 1);
    ggml_tensor * shortcut = r.shortcut.w ? conv2d(ctx, x, r.shortcut, r.stride) : x;
    return ggml_relu(ctx, ggml_add(ctx, y, shortcut));
}

// FCM: [n_mels, n] log-mel frames -> [n, head_channels * n_mels / 8], channel c * (n_mels / 8) + f as
// torch's reshape of (B, C, F, T) to (B, C * F, T).
ggml_tensor * head_forward(ggml_context * ctx, const speaker_model & m, ggml_tensor * fbank) {
    const int64_t n = fbank->ne[1];
    ggml_tensor * x = ggml_cont(ctx, ggml_transpose(ctx, fbank));  // [n, n_mels]: time along ne0
    x = ggml_relu(ctx, conv2d(ctx, ggml_reshape_4d(ctx, x, n, m.hp.n_mels, 1, 1), m.head_conv1, 1));
    for (const res_block & r : m.head_blocks) {
        x = res_block_forward(ctx, x, r);
    }
    x = ggml_relu(ctx, conv2d(ctx, x, m.head_conv2, 2));  // [n, n_mels / 8, head_channels, 1]
    return ggml_reshape_2d(ctx, x, n, x->ne[1] * x->ne[2]);
}

// Conv1d of x [n, c_in] (time along ne0) with w [k, c_in, c_out] by im2col: result [c_out, n'].
ggml_tensor * conv1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, int stride, int pad, int dilation) {
    ggml_tensor * cols = ggml_im2col(ctx, w, x, stride, 0, pad, 0, dilation, 0, false, GGML_TYPE_F32);  // [k*c_in, n]
    return ggml_mul_mat(ctx, ggml_reshape_2d(ctx, w, cols->ne[0], w->ne[2]), cols);
}

// relu(x * scale + shift) per channel of x [c, T]: a BatchNorm in eval mode, then its ReLU.
ggml_tensor * bn_relu(ggml_context * ctx, ggml_tensor * x, ggml_tensor * scale, ggml_tensor * shift) {
    return ggml_relu(ctx, ggml_add(ctx, ggml_mul(ctx, x, scale), shift));
}

// The CAM layer's gate from h [T, bottleneck]: sigmoid(linear2(relu(linear1(context)))), where a frame's
// context is the mean over all frames plus the mean over its 100-frame segment (ref: 3D-Speaker CAMLayer,
// seg_pooling: avg_pool1d with ceil_mode, so the last segment averages only the frames it has). The gate
// is computed once per segment and each frame takes its segment's column: [growth, T].
ggml_tensor * cam_gate(ggml_context * ctx, const dense_layer & l, ggml_tensor * h, const utterance_graph & g) {
    const int64_t n_seg = g.pool->ne[1] - 1;
    ggml_tensor * means = ggml_mul_mat(ctx, h, g.pool);  // [bottleneck, n_seg + 1]
    ggml_tensor * seg_means = ggml_view_2d(ctx, means, means->ne[0], n_seg, means->nb[1], 0);
    ggml_tensor * all_mean = ggml_view_2d(ctx, means, means->ne[0], 1, means->nb[1], n_seg * means->nb[1]);
    ggml_tensor * context = ggml_add(ctx, seg_means, all_mean);
    ggml_tensor * y = ggml_relu(ctx, ggml_add(ctx, ggml_mul_mat(ctx, l.cam1_w, context), l.cam1_b));
    y = ggml_sigmoid(ctx, ggml_add(ctx, ggml_mul_mat(ctx, l.cam2_w, y), l.cam2_b));  // [growth, n_seg]
    return ggml_get_rows(ctx, y, g.seg);
}

// One CAMDenseTDNNLayer on x [c, T]: returns [c + growth, T], its output appended to its input.
ggml_tensor * dense_layer_forward(ggml_context * ctx, const dense_layer & l, int dilation, ggml_tensor * x,
                                  const utterance_graph & g) {
    ggml_tensor * u = bn_relu(ctx, x, l.bn_scale, l.bn_shift);
    // Operands swapped: h comes out [T, bottleneck], the layout im2col and the segment means take.
    ggml_tensor * h = ggml_relu(ctx, ggml_add(ctx, ggml_mul_mat(ctx, u, l.linear1_w), l.linear1_b));
    const int pad = static_cast<int>(l.local_w->ne[0] - 1) / 2 * dilation;
    ggml_tensor * local = conv1d(ctx, h, l.local_w, 1, pad, dilation);  // [growth, T]
    return ggml_concat(ctx, x, ggml_mul(ctx, local, cam_gate(ctx, l, h, g)), 0);
}

// Statistics pooling (mean and unbiased standard deviation over time) of z [T, c], then the dense layer:
// [n_embed, 1].
ggml_tensor * embedding_forward(ggml_context * ctx, const speaker_model & m, ggml_tensor * z) {
    const int64_t n = z->ne[0];
    ggml_tensor * mean = ggml_mean(ctx, z);  // [1, c]
    ggml_tensor * var = ggml_sum_rows(ctx, ggml_sqr(ctx, ggml_sub(ctx, z, mean)));
    ggml_tensor * sd = ggml_sqrt(ctx, ggml_scale(ctx, var, 1.0f / static_cast<float>(n - 1)));
    ggml_tensor * stats = ggml_concat(ctx, mean, sd, 1);  // [1, 2c]
    stats = ggml_reshape_2d(ctx, stats, stats->ne[1], 1);
    return ggml_add(ctx, ggml_mul_mat(ctx, m.dense_w, stats), m.dense_b);
}

utterance_graph build_graph(ggml_context * ctx, const speaker_model & m, int64_t n_frames, size_t n_nodes) {
    utterance_graph g;
    // The TDNN layer: kernel 5, stride 2, padding 2.
    const int64_t n = (n_frames - 1) / 2 + 1;
    const int64_t n_seg = (n + m.hp.seg_len - 1) / m.hp.seg_len;
    g.fbank = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, m.hp.n_mels, n_frames);
    g.pool = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n_seg + 1);
    g.seg = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    for (ggml_tensor * t : {g.fbank, g.pool, g.seg}) {
        ggml_set_input(t);
    }
    ggml_tensor * x = conv1d(ctx, head_forward(ctx, m, g.fbank), m.tdnn_w, 2, 2, 1);
    x = ggml_relu(ctx, ggml_add(ctx, x, m.tdnn_b));  // [n_channels, T]
    for (const dense_block & b : m.blocks) {
        for (const dense_layer & l : b.layers) {
            x = dense_layer_forward(ctx, l, b.dilation, x, g);
        }
        ggml_tensor * u = bn_relu(ctx, x, b.transit.bn_scale, b.transit.bn_shift);
        // The last transit (with a bias) comes out [T, c / 2] for the pooling over T, and ends in
        // out_nonlinear's ReLU; the others stay [c / 2, T] for the next block.
        x = b.transit.b ? ggml_relu(ctx, ggml_add(ctx, ggml_mul_mat(ctx, u, b.transit.w), b.transit.b))
                        : ggml_mul_mat(ctx, b.transit.w, u);
    }
    g.out = embedding_forward(ctx, m, x);
    ggml_set_output(g.out);
    g.gf = ggml_new_graph_custom(ctx, n_nodes, false);
    ggml_build_forward_expand(g.gf, g.out);
    return g;
}

// The per-segment averaging matrix [T, n_seg + 1] (column-major as ggml holds it) and each frame's segment.
void fill_pooling(int64_t n, int64_t seg_len, std::vector<float> & pool, std::vector<int32_t> & seg) {
    const int64_t n_seg = (n + seg_len - 1) / seg_len;
    pool.assign(static_cast<size_t>(n * (n_seg + 1)), 0.0f);
    seg.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
        const int64_t s = t / seg_len, len = std::min(seg_len, n - s * seg_len);
        seg[t] = static_cast<int32_t>(s);
        pool[s * n + t] = 1.0f / static_cast<float>(len);
        pool[n_seg * n + t] = 1.0f / static_cast<float>(n);
    }
}

}  // namespace

std::unique_ptr<speaker_model> speaker_model::load(const std::string & path, int n_threads) {
    ensure_backends_loaded();
    std::unique_ptr<speaker_model> m(new speaker_model());
    m->path = path;
    m->n_threads = n_threads > 0 ? n_threads : default_threads();
    ggml_context * meta_ctx = nullptr;
    gguf_ptr meta = open_gguf(path, &meta_ctx);
    m->ctx_ = meta_ctx;
    m->read_hparams(meta.get());
    m->bind_tensors();
    m->read_weights(meta.get());
    m->backend_ = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!m->backend_) {
        throw std::runtime_error("cannot initialise ggml's CPU backend");
    }
    set_backend_threads(m->backend_, m->n_threads);
    m->galloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(m->backend_));
    AURAL_LOG_INFO("%s: CAM++ with %zu dense blocks, %.1f MiB of weights on the CPU", path.c_str(), m->blocks.size(),
                   m->weights_bytes / 1048576.0);
    return m;
}

speaker_model::~speaker_model() {
    if (galloc_) ggml_gallocr_free(galloc_);
    if (backend_) ggml_backend_free(backend_);
    if (weights_) ggml_backend_buffer_free(weights_);
    if (ctx_) ggml_free(ctx_);
}

void speaker_model::read_hparams(gguf_context * meta) {
    const int64_t arch_id = gguf_find_key(meta, "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(meta, arch_id) != GGUF_TYPE_STRING ||
        std::string(gguf_get_val_str(meta, arch_id)) != "campplus") {
        throw std::runtime_error(path + ": general.architecture is not 'campplus' (not a CAM++ GGUF)");
    }
    hp.n_mels = gguf_u32(meta, "campplus.feature_length", path, "CAM++");
    hp.n_embed = gguf_u32(meta, "campplus.embedding_length", path, "CAM++");
    hp.head_channels = gguf_u32(meta, "campplus.head_channels", path, "CAM++");
    hp.n_channels = gguf_u32(meta, "campplus.channels", path, "CAM++");
    hp.growth = gguf_u32(meta, "campplus.growth_rate", path, "CAM++");
    hp.bottleneck = gguf_u32(meta, "campplus.bottleneck", path, "CAM++");
    hp.seg_len = gguf_u32(meta, "campplus.segment_length", path, "CAM++");
    hp.block_layers = gguf_u32_array(meta, "campplus.block_layers", path, "CAM++");
    hp.block_dilations = gguf_u32_array(meta, "campplus.block_dilations", path, "CAM++");
    const bool positive = hp.n_embed > 0 && hp.head_channels > 0 && hp.n_channels > 0 && hp.growth > 0 &&
                          hp.bottleneck >= 2 && hp.seg_len > 0;
    const auto out_of_range = [](uint32_t v) { return v == 0 || v > 1024; };
    if (!positive || hp.n_mels == 0 || hp.n_mels % 8 != 0 || hp.block_layers.empty() ||
        hp.block_layers.size() != hp.block_dilations.size() ||
        std::any_of(hp.block_layers.begin(), hp.block_layers.end(), out_of_range) ||
        std::any_of(hp.block_dilations.begin(), hp.block_dilations.end(), out_of_range)) {
        throw std::runtime_error(path + ": inconsistent CAM++ hyper-parameters");
    }
}

ggml_tensor * speaker_model::require(const std::string & name, std::initializer_list<int64_t> ne) {
    ggml_tensor * t = require_tensor(ctx_, name, ne, path);
    if (t->type != GGML_TYPE_F32) {
        throw std::runtime_error(path + ": tensor '" + name + "' is " + ggml_type_name(t->type) + ", expected f32");
    }
    return t;
}

void speaker_model::bind_tensors() {
    const int64_t hc = hp.head_channels, bn = hp.bottleneck, growth = hp.growth;
    auto conv = [&](const std::string & p, int64_t k, int64_t c_in) {
        return conv2d_weights{require(p + ".weight", {k, k, c_in, hc}), require(p + ".bias", {1, 1, hc})};
    };
    head_conv1 = conv("head.conv1", 3, 1);
    // FCM: two layers of two BasicResBlocks, the first of each with stride 2 and a 1x1 conv shortcut.
    for (int layer = 1; layer <= 2; ++layer) {
        for (int i = 0; i < 2; ++i) {
            const std::string p = "head.layer" + std::to_string(layer) + "." + std::to_string(i);
            res_block r{conv(p + ".conv1", 3, hc), conv(p + ".conv2", 3, hc), {}, i == 0 ? 2 : 1};
            if (i == 0) {
                r.shortcut = conv(p + ".shortcut", 1, hc);
            }
            head_blocks.push_back(r);
        }
    }
    head_conv2 = conv("head.conv2", 3, hc);
    tdnn_w = require("tdnn.weight", {5, hc * (hp.n_mels / 8), hp.n_channels});
    tdnn_b = require("tdnn.bias", {hp.n_channels});
    int64_t c = hp.n_channels;
    for (size_t b = 0; b < hp.block_layers.size(); ++b) {
        dense_block block;
        block.dilation = static_cast<int>(hp.block_dilations[b]);
        const std::string pb = "block" + std::to_string(b + 1);
        for (uint32_t i = 0; i < hp.block_layers[b]; ++i, c += growth) {
            const std::string p = pb + "." + std::to_string(i);
            block.layers.push_back({require(p + ".bn.scale", {c}), require(p + ".bn.shift", {c}),
                                    require(p + ".linear1.weight", {c, bn}), require(p + ".linear1.bias", {1, bn}),
                                    require(p + ".local.weight", {3, bn, growth}),
                                    require(p + ".cam1.weight", {bn, bn / 2}), require(p + ".cam1.bias", {bn / 2}),
                                    require(p + ".cam2.weight", {bn / 2, growth}),
                                    require(p + ".cam2.bias", {growth})});
        }
        const std::string pt = "transit" + std::to_string(b + 1);
        block.transit = {require(pt + ".bn.scale", {c}), require(pt + ".bn.shift", {c}),
                         require(pt + ".weight", {c, c / 2}), nullptr};
        c /= 2;
        if (b + 1 == hp.block_layers.size()) {
            block.transit.b = require(pt + ".bias", {1, c});
        }
        blocks.push_back(std::move(block));
    }
    dense_w = require("dense.weight", {2 * c, hp.n_embed});
    dense_b = require("dense.bias", {hp.n_embed});
}

void speaker_model::read_weights(gguf_context * meta) {
    weights_ = aural::read_weights(meta, ctx_, ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)),
                                      path);
    weights_bytes = ggml_backend_buffer_get_size(weights_);
}

size_t speaker_model::graph_size() const {
    // Each dense layer makes 22 tensors (ops and views); the head, TDNN, transits and pooling about 120.
    size_t n_layers = 0;
    for (const dense_block & b : blocks) n_layers += b.layers.size();
    return 256 + 32 * n_layers;
}

void speaker_model::embed(const float * fbank, int64_t n_frames, float * out) {
    if (n_frames < min_frames()) {
        throw std::invalid_argument("a speaker embedding needs at least " + std::to_string(min_frames()) +
                                    " frames, got " + std::to_string(n_frames));
    }
    const size_t n_nodes = graph_size();
    const size_t mem_size = ggml_tensor_overhead() * n_nodes + ggml_graph_overhead_custom(n_nodes, false);
    ggml_init_params params = {/*.mem_size =*/ mem_size, /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true};
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(params), ggml_free);
    const utterance_graph g = build_graph(ctx.get(), *this, n_frames, n_nodes);
    std::vector<float> pool;
    std::vector<int32_t> seg;
    fill_pooling(g.seg->ne[0], hp.seg_len, pool, seg);

    std::lock_guard<std::mutex> lock(mutex_);
    if (!ggml_gallocr_alloc_graph(galloc_, g.gf)) {
        throw std::runtime_error("cannot allocate the speaker model's compute buffer for " + std::to_string(n_frames) +
                                 " frames (out of memory?)");
    }
    compute_bytes = ggml_gallocr_get_buffer_size(galloc_, 0);
    ggml_backend_tensor_set(g.fbank, fbank, 0, ggml_nbytes(g.fbank));
    ggml_backend_tensor_set(g.pool, pool.data(), 0, ggml_nbytes(g.pool));
    ggml_backend_tensor_set(g.seg, seg.data(), 0, ggml_nbytes(g.seg));
    if (ggml_backend_graph_compute(backend_, g.gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("the speaker model's graph failed to compute");
    }
    ggml_backend_tensor_get(g.out, out, 0, ggml_nbytes(g.out));
}

}  // namespace aural
