#include "model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "attention.h"
#include "backend.h"
#include "cpu.h"
#include "int8-matmul.h"
#include "ggml-alloc.h"
#include "gguf-file.h"
#include "log.h"
#include "transpose.h"

namespace aural {

namespace {

// Text from the file, fit for an error message: bytes outside printable ASCII become \xNN. pybind11
// decodes exception messages as UTF-8, so a damaged name would otherwise surface as UnicodeDecodeError
// instead of the RuntimeError naming the file (found by tests/test_fuzz.py).
std::string printable(const std::string & text) {
    std::string out;
    for (const unsigned char c : text) {
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char hex[5];
            std::snprintf(hex, sizeof(hex), "\\x%02x", c);
            out += hex;
        }
    }
    return out;
}

// The device's extra buffer types, best first (ggml-cpu: AMX, then CPU_REPACK), less those the CPU level
// leaves out (cpu.h: AMX unless its probe passed); none when the backend has no
// "ggml_backend_dev_get_extra_bufts" entry point. env: AURAL_NO_REPACK=1 ignores them (debugging).
std::vector<ggml_backend_buffer_type_t> extra_bufts(ggml_backend_dev_t dev) {
    std::vector<ggml_backend_buffer_type_t> out;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (!get || env_flag("AURAL_NO_REPACK")) {
        return out;
    }
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; ++b) {
        if (buft_allowed(ggml_backend_buft_name(*b))) out.push_back(*b);
    }
    return out;
}

}  // namespace

std::unique_ptr<model> model::load(const std::string & path, const std::string & device, int n_threads) {
    std::unique_ptr<model> m(new model());
    m->path = path;
    m->dev = select_device(device);
    if (is_software_device(m->dev)) {  // only when named: auto skips them
        AURAL_LOG_WARN("%s (%s) is a software %s device: it runs on the CPU, slower than the CPU backend",
                       ggml_backend_dev_name(m->dev), ggml_backend_dev_description(m->dev),
                       ggml_backend_reg_name(ggml_backend_dev_backend_reg(m->dev)));
    }
    m->n_threads = n_threads > 0 ? n_threads : default_threads();

    ggml_context * meta_ctx = nullptr;
    gguf_ptr meta = open_gguf(path, &meta_ctx);
    m->ctx_ = meta_ctx;
    m->read_hparams(meta.get());
    m->bind_tensors();
    // env: AURAL_NO_INT8=1 keeps the projections and the screen in ggml's types (debugging, A/B).
    m->int8 = m->on_cpu() && int8_matmul_available() && !env_flag("AURAL_NO_INT8") &&
              (m->tok_emb->type == GGML_TYPE_F16 || m->tok_emb->type == GGML_TYPE_F32);
    m->widen_encoder_projections();
    // env: AURAL_NO_SIMD_GELU=1 keeps ggml_gelu_erf on the CPU too (debugging, A/B).
    m->simd_gelu = m->on_cpu() && !env_flag("AURAL_NO_SIMD_GELU");
    // env: AURAL_NO_SIMD_ATTENTION=1 keeps ggml_flash_attn_ext in the encoder on the CPU too (debugging, A/B).
    m->simd_attention = m->on_cpu() && encoder_attention_available() && !env_flag("AURAL_NO_SIMD_ATTENTION");
    // env: AURAL_NO_SIMD_CROSS=1 keeps ggml's ops for the decoder's cross-attention (debugging, A/B).
    m->simd_cross = m->on_cpu() && cross_attention_available() && !env_flag("AURAL_NO_SIMD_CROSS");
    // env: AURAL_NO_SIMD_SELF=1 keeps ggml's flash attention for the decoder's self-attention (debugging, A/B).
    m->simd_self = m->on_cpu() && cross_attention_available() && !env_flag("AURAL_NO_SIMD_SELF");
    // env: AURAL_NO_SIMD_TRANSPOSE=1 keeps ggml's copies for the encoder's transposes (debugging, A/B).
    m->simd_transpose = m->on_cpu() && transpose_available() && !env_flag("AURAL_NO_SIMD_TRANSPOSE");
    // env: AURAL_NO_OUTPUT_ROWS=1 runs the decoder's last layer on every row of a step (debugging, A/B).
    m->last_layer_outputs_only = !env_flag("AURAL_NO_OUTPUT_ROWS");
    m->make_cpu_copies();
    m->allocate_weights();
    m->read_weights(meta.get());
    m->fill_screen();
    m->fill_group_biases();
    AURAL_LOG_INFO("%s: %u+%u layers, %.1f MiB of weights on %s", path.c_str(), m->hp.n_audio_layer,
                   m->hp.n_text_layer, m->weights_bytes / 1048576.0, ggml_backend_dev_name(m->dev));
    return m;
}

model::~model() {
    for (ggml_backend_buffer_t b : buffers_) {
        ggml_backend_buffer_free(b);
    }
    if (ctx_) {
        ggml_free(ctx_);
    }
    if (copies_ctx_) {
        ggml_free(copies_ctx_);
    }
}

void model::read_hparams(gguf_context * meta) {
    const int64_t arch_id = gguf_find_key(meta, "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(meta, arch_id) != GGUF_TYPE_STRING) {
        throw std::runtime_error(path + ": no general.architecture key (not a Whisper GGUF)");
    }
    const std::string arch = gguf_get_val_str(meta, arch_id);
    if (arch != "whisper") {
        throw std::runtime_error(path + ": architecture is '" + printable(arch) + "', expected 'whisper'");
    }
    hp.n_vocab = gguf_u32(meta, "whisper.vocab_size", path, "Whisper");
    hp.n_audio_ctx = gguf_u32(meta, "whisper.audio.context_length", path, "Whisper");
    hp.n_audio_state = gguf_u32(meta, "whisper.audio.embedding_length", path, "Whisper");
    hp.n_audio_head = gguf_u32(meta, "whisper.audio.head_count", path, "Whisper");
    hp.n_audio_layer = gguf_u32(meta, "whisper.audio.block_count", path, "Whisper");
    hp.n_text_ctx = gguf_u32(meta, "whisper.text.context_length", path, "Whisper");
    hp.n_text_state = gguf_u32(meta, "whisper.text.embedding_length", path, "Whisper");
    hp.n_text_head = gguf_u32(meta, "whisper.text.head_count", path, "Whisper");
    hp.n_text_layer = gguf_u32(meta, "whisper.text.block_count", path, "Whisper");
    hp.n_mels = gguf_u32(meta, "whisper.n_mels", path, "Whisper");
    if (hp.n_audio_head == 0 || hp.n_audio_state % hp.n_audio_head != 0 || hp.n_text_head == 0 ||
        hp.n_text_state % hp.n_text_head != 0 || hp.n_audio_layer == 0 || hp.n_text_layer == 0) {
        throw std::runtime_error(path + ": inconsistent hyper-parameters (heads do not divide the width)");
    }
}

ggml_tensor * model::require(const std::string & name, std::initializer_list<int64_t> ne) {
    return require_tensor(ctx_, name, ne, path);
}

void model::bind_tensors() {
    const int64_t na = hp.n_audio_state, nt = hp.n_text_state;
    conv1_w = require("enc.conv1.weight", {3, hp.n_mels, na});
    conv1_b = require("enc.conv1.bias", {na});
    conv2_w = require("enc.conv2.weight", {3, na, na});
    conv2_b = require("enc.conv2.bias", {na});
    enc_pos = require("enc.pos", {na, hp.n_audio_ctx});
    auto attn = [this](const std::string & p, int64_t n) {
        return attn_weights{require(p + ".q.weight", {n, n}), require(p + ".q.bias", {n}),
                            require(p + ".k.weight", {n, n}), require(p + ".v.weight", {n, n}),
                            require(p + ".v.bias", {n}), require(p + ".out.weight", {n, n}),
                            require(p + ".out.bias", {n})};
    };
    auto norm = [this](const std::string & p, int64_t n) {
        return norm_weights{require(p + ".weight", {n}), require(p + ".bias", {n})};
    };
    auto mlp = [this](const std::string & p, int64_t n) {
        return mlp_weights{require(p + ".0.weight", {n, 4 * n}), require(p + ".0.bias", {4 * n}),
                           require(p + ".2.weight", {4 * n, n}), require(p + ".2.bias", {n})};
    };
    for (uint32_t i = 0; i < hp.n_audio_layer; ++i) {
        const std::string p = "enc.blk." + std::to_string(i);
        enc.push_back({norm(p + ".attn_ln", na), attn(p + ".attn", na), norm(p + ".mlp_ln", na), mlp(p + ".mlp", na)});
    }
    enc_ln_post = norm("enc.ln_post", na);
    tok_emb = require("dec.tok_emb", {nt, hp.n_vocab});
    dec_pos = require("dec.pos", {nt, hp.n_text_ctx});
    for (uint32_t i = 0; i < hp.n_text_layer; ++i) {
        const std::string p = "dec.blk." + std::to_string(i);
        dec.push_back({norm(p + ".attn_ln", nt), attn(p + ".attn", nt), norm(p + ".cross_ln", nt),
                       attn(p + ".cross", nt), norm(p + ".mlp_ln", nt), mlp(p + ".mlp", nt)});
    }
    dec_ln = norm("dec.ln", nt);
}

std::vector<ggml_tensor *> model::matmul_weights() const {
    std::vector<ggml_tensor *> out;
    auto attn = [&out](const attn_weights & a) { out.insert(out.end(), {a.q_w, a.k_w, a.v_w, a.o_w}); };
    auto mlp = [&out](const mlp_weights & m) { out.insert(out.end(), {m.fc1_w, m.fc2_w}); };
    for (const encoder_layer & l : enc) {
        attn(l.attn);
        mlp(l.mlp);
    }
    for (const decoder_layer & l : dec) {
        attn(l.attn);
        attn(l.cross);
        mlp(l.mlp);
    }
    return out;
}

// The matrices that multiply the encoder's activations (1500 columns for a 30 s window): the layers'
// projections and the decoder's cross-attention K/V projections, which run once per window in the encoder
// graph.
std::vector<ggml_tensor *> model::encoder_projections() const {
    std::vector<ggml_tensor *> out;
    for (const encoder_layer & l : enc) {
        out.insert(out.end(), {l.attn.q_w, l.attn.k_w, l.attn.v_w, l.attn.o_w, l.mlp.fc1_w, l.mlp.fc2_w});
    }
    for (const decoder_layer & l : dec) {
        out.insert(out.end(), {l.cross.k_w, l.cross.v_w});
    }
    return out;
}

// The encoder multiplies its projections by 1500-column activations, where ggml-cpu's tinyBLAS runs f16
// weights by rounding each activation to f16 and widening each weight in the kernel, f32 weights directly:
// the tiny.en encoder takes 0.86x instead of 0.90x the time of the f16 K/V build per window (2 threads,
// bench/results/encoder-ab.md), and is more exact. The cost is twice their memory, so only while the f32
// copies stay within max_widened_bytes (tiny.en 31.5 MiB with the cross K/V; medium and large keep f16).
// The decoder's matrices stay as stored: one token per step is bound by memory traffic, which f16 halves.
// Cross-attention K/V projections run once per window in the encoder graph, so they count as encoder.
// env: AURAL_NO_WIDEN=1 keeps every matrix as stored.
void model::widen_encoder_projections() {
    constexpr size_t max_widened_bytes = 512u << 20;
    if (!on_cpu() || int8 || env_flag("AURAL_NO_WIDEN")) {
        return;
    }
    const std::vector<ggml_tensor *> candidates = encoder_projections();
    size_t bytes = 0;
    for (const ggml_tensor * t : candidates) {
        bytes += t->type == GGML_TYPE_F16 ? ggml_nelements(t) * sizeof(float) : 0;
    }
    if (bytes == 0 || bytes > max_widened_bytes) {
        return;
    }
    for (ggml_tensor * t : candidates) {
        if (t->type != GGML_TYPE_F16) {
            continue;
        }
        t->type = GGML_TYPE_F32;  // metadata only: no data is allocated yet
        t->nb[0] = sizeof(float);
        for (int i = 1; i < GGML_MAX_DIMS; ++i) {
            t->nb[i] = t->nb[i - 1] * t->ne[i - 1];
        }
        widened_.insert(t);
    }
    widened_bytes = bytes;
    AURAL_LOG_INFO("%zu encoder matrices widened from f16 to f32 for the CPU (%.1f MiB)", widened_.size(),
                   bytes / 1048576.0);
}

void model::allocate_weights() {
    // Only the layers' projections may take an extra buffer type: a repacked layout serves ggml_mul_mat
    // alone, and tok_emb is also read by ggml_get_rows (graph.cpp), the conv kernels by im2col.
    const std::vector<ggml_tensor *> mm = matmul_weights();
    const std::set<const ggml_tensor *> projections(mm.begin(), mm.end());
    const std::vector<ggml_backend_buffer_type_t> extras = extra_bufts(dev);
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> groups;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx_); t; t = ggml_get_next_tensor(ctx_, t)) {
        if (int8_of(t)) {
            continue;  // read_weights fills its int8 copy; the graphs never read the matrix itself
        }
        // A tensor the device cannot hold (llvmpipe's Vulkan refused any past its storage-buffer limit) stays in
        // the CPU's memory, where the scheduler runs its products, instead of aborting the first graph.
        ggml_backend_buffer_type_t buft = ggml_backend_dev_supports_op(dev, t)
                                              ? ggml_backend_dev_buffer_type(dev)
                                              : ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
        for (ggml_backend_buffer_type_t e : extras) {
            if (projections.count(t) && buft_runs_matmul(dev, e, t)) {
                buft = e;
                break;
            }
        }
        groups[buft].push_back(t);
    }
    for (ggml_backend_buffer_t buf : aural::allocate_weights(groups, path)) {
        buffers_.push_back(buf);
        const size_t size = ggml_backend_buffer_get_size(buf);
        const char * name = ggml_backend_buft_name(ggml_backend_buffer_get_type(buf));
        weight_buffers.emplace_back(name, size);
        weights_bytes += size;
        AURAL_LOG_INFO("%zu weight tensors, %.1f MiB in %s", groups.at(ggml_backend_buffer_get_type(buf)).size(),
                       size / 1048576.0, name);
    }
}

void model::read_weights(gguf_context * meta) {
    // Each tensor is read once, straight from the file into its backend buffer: into the tensor's
    // memory when the buffer is host-visible, else through one bounded staging block.
    const size_t data_offset = gguf_get_data_offset(meta);
    file_ptr file(std::fopen(path.c_str(), "rb"));
    if (!file) {
        throw std::runtime_error(path + ": cannot open for reading");
    }
    std::fseek(file.get(), 0, SEEK_END);
    const size_t file_size = static_cast<size_t>(std::ftell(file.get()));
    for (int64_t i = 0; i < gguf_get_n_tensors(meta); ++i) {
        const size_t end = data_offset + gguf_get_tensor_offset(meta, i) + gguf_get_tensor_size(meta, i);
        if (end > file_size) {
            throw std::runtime_error(path + ": truncated (" + std::to_string(file_size) + " bytes, tensor '" +
                                     printable(gguf_get_tensor_name(meta, i)) + "' ends at " + std::to_string(end) +
                                     ")");
        }
    }
    const ggml_backend_buffer_type_t default_buft = ggml_backend_dev_buffer_type(dev);
    std::vector<uint8_t> staging;
    constexpr size_t staging_bytes = 16u << 20;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx_); t; t = ggml_get_next_tensor(ctx_, t)) {
        const int64_t id = gguf_find_tensor(meta, ggml_get_name(t));
        const size_t nbytes = ggml_nbytes(t);
        std::fseek(file.get(), static_cast<long>(data_offset + gguf_get_tensor_offset(meta, id)), SEEK_SET);
        if (ggml_tensor * copy = int8_of(t)) {  // f16/f32 in the file, only its int8 copy in memory
            staging.resize(nbytes);
            if (std::fread(staging.data(), 1, nbytes, file.get()) != nbytes) {
                throw std::runtime_error(path + ": read error in tensor '" + std::string(ggml_get_name(t)) + "'");
            }
            fill_copy(t, staging.data(), copy);
            continue;
        }
        if (widened_.count(t)) {  // f16 in the file; widened only on the CPU, whose buffers are host memory
            std::vector<ggml_fp16_t> half(static_cast<size_t>(ggml_nelements(t)));
            if (std::fread(half.data(), sizeof(ggml_fp16_t), half.size(), file.get()) != half.size()) {
                throw std::runtime_error(path + ": read error in tensor '" + std::string(ggml_get_name(t)) + "'");
            }
            ggml_fp16_to_fp32_row(half.data(), static_cast<float *>(t->data), ggml_nelements(t));
            continue;
        }
        if (ggml_backend_buffer_is_host(t->buffer)) {
            if (std::fread(t->data, 1, nbytes, file.get()) != nbytes) {
                throw std::runtime_error(path + ": read error in tensor '" + std::string(ggml_get_name(t)) + "'");
            }
            continue;
        }
        // note: a repacking buffer converts a whole tensor per set_tensor call (ggml-cpu repack.cpp
        // asserts offset 0 and the full size), so its tensors are staged whole.
        const size_t chunk = ggml_backend_buffer_get_type(t->buffer) == default_buft ? staging_bytes : nbytes;
        staging.resize(std::min(nbytes, chunk));
        for (size_t done = 0; done < nbytes;) {
            const size_t n = std::min(staging.size(), nbytes - done);
            if (std::fread(staging.data(), 1, n, file.get()) != n) {
                throw std::runtime_error(path + ": read error in tensor '" + std::string(ggml_get_name(t)) + "'");
            }
            ggml_backend_tensor_set(t, staging.data(), done, n);
            done += n;
        }
    }
}

// Copies of weights that only the CPU's kernels read, laid out here before the weights are allocated:
//
// * int8 (int8 set): every layer's projections as int8-matmul.h panels, which read_weights fills from the
//   file instead of the matrices (those are not allocated), with the error of CTranslate2's
//   int8 compute type (one scale per weight row and per activation column). VPDPBUSD runs the encoder's
//   products ~2.5x faster than f32 (fc1 3.7 against 11.4 ms for 1536 x 384 x 1500 on 2 cores), and a
//   decoder step reads half the bytes of f16 (JFK greedy: 1.9 against 3.4 ms per step). AVX2 without VNNI
//   runs the same sums (same bits) at a quarter of the rate per instruction. Accuracy on the widened sets,
//   int8 against AURAL_NO_INT8=1, per level: bench/results/accuracy.md.
//
// * The output screen. Each decoder step ends with the tied output projection, the largest read of the
//   step: for tiny.en 51 864 x 384 f16 = 38 MiB of the ~62 MiB a one-token step reads
//   (bench/results/speed-ablation.md), and on the CPU a step is bound by that traffic. An int8 copy halves
//   it and takes 0.37 ms a step against q8_0's 1.0 ms (ggml's q8_0 copy, now only below AVX2). Scoring
//   every token with q8_0 cost words with beam 5 (dev 7.7 % against 6.3 %), so the copy only screens: the
//   decoder scores the whole vocabulary with it, then rescores the best candidates with tok_emb itself
//   (graph.cpp, output_logits). A GPU reads the f16 matrix at its own bandwidth, and the copy would take
//   device memory. fill_screen fills it from tok_emb once that is read.
// env: AURAL_NO_SCREEN=1 scores every token with tok_emb (debugging, A/B).
void model::make_cpu_copies() {
    const bool screen = on_cpu() && tok_emb->type == GGML_TYPE_F16 && !env_flag("AURAL_NO_SCREEN");
    std::vector<ggml_tensor *> packed;
    // env: AURAL_NO_INT8_DECODER=1 keeps the projections a decoder step multiplies in f16 (the encoder's and
    // the cross K/V projections stay int8): an A/B of where int8's rounding costs words.
    std::set<const ggml_tensor *> f16_kept;
    if (env_flag("AURAL_NO_INT8_DECODER")) {
        for (const decoder_layer & l : dec) {
            f16_kept.insert({l.attn.q_w, l.attn.k_w, l.attn.v_w, l.attn.o_w, l.cross.q_w, l.cross.o_w, l.mlp.fc1_w,
                             l.mlp.fc2_w});
        }
    }
    if (int8) {
        for (ggml_tensor * w : matmul_weights()) {
            if ((w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32) && w->ne[0] % 16 == 0 && !f16_kept.count(w)) {
                packed.push_back(w);
            }
        }
    }
    if (!screen && packed.empty()) {
        return;
    }
    // Each weight's copy or view, each group's matrix and bias, the screen.
    ggml_init_params params = {/*.mem_size =*/ ggml_tensor_overhead() * (3 * packed.size() + 1),
                               /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true};
    copies_ctx_ = ggml_init(params);
    auto int8_copy = [this](const ggml_tensor * w) {
        return ggml_new_tensor_2d(copies_ctx_, GGML_TYPE_I8, int8_panel_bytes(w->ne[0]),
                                  (w->ne[1] + int8_panel_rows - 1) / int8_panel_rows);
    };
    make_int8_groups(packed);
    for (ggml_tensor * w : packed) {
        if (!int8_copies_.count(w)) {
            int8_copies_[w] = int8_copy(w);
            ggml_format_name(int8_copies_[w], "%s.int8", ggml_get_name(w));
        }
    }
    if (screen) {
        out_screen = int8 ? int8_copy(tok_emb)
                          : ggml_new_tensor_2d(copies_ctx_, GGML_TYPE_Q8_0, tok_emb->ne[0], tok_emb->ne[1]);
        ggml_set_name(out_screen, "dec.out_screen");
    }
    ggml_backend_buffer_t buf =
        ggml_backend_alloc_ctx_tensors_from_buft(copies_ctx_, ggml_backend_dev_buffer_type(dev));
    if (!buf) {
        throw std::runtime_error(path + ": cannot allocate the CPU's int8 / q8_0 weight copies (out of memory?)");
    }
    buffers_.push_back(buf);
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (const auto & [w, copy] : int8_copies_) {
        int8_bytes += ggml_nbytes(copy);  // a group member's view: its part of the group's matrix
    }
    screen_bytes = out_screen ? ggml_nbytes(out_screen) : 0;
    AURAL_LOG_INFO("CPU weight copies: %zu int8 matrices (%.1f MiB), %s output screen (%.1f MiB)", int8_copies_.size(),
                   int8_bytes / 1048576.0, out_screen ? ggml_type_name(out_screen->type) : "no",
                   screen_bytes / 1048576.0);
}

// Projections that take the same input, with their biases (null: none).
std::vector<std::pair<std::vector<ggml_tensor *>, std::vector<ggml_tensor *>>> model::projection_groups() const {
    std::vector<std::pair<std::vector<ggml_tensor *>, std::vector<ggml_tensor *>>> groups;
    for (const encoder_layer & l : enc) {
        groups.push_back({{l.attn.q_w, l.attn.k_w, l.attn.v_w}, {l.attn.q_b, nullptr, l.attn.v_b}});
    }
    std::vector<ggml_tensor *> cross_w, cross_b;
    for (const decoder_layer & l : dec) {
        groups.push_back({{l.attn.q_w, l.attn.k_w, l.attn.v_w}, {l.attn.q_b, nullptr, l.attn.v_b}});
        cross_w.insert(cross_w.end(), {l.cross.k_w, l.cross.v_w});
        cross_b.insert(cross_b.end(), {nullptr, l.cross.v_b});
    }
    groups.push_back({cross_w, cross_b});
    return groups;
}

// Groups of packed projections of one shape with whole panels: one I8 matrix each, the members' copies views
// of it (made before them in copies_ctx_, so that allocation places the matrix first).
void model::make_int8_groups(const std::vector<ggml_tensor *> & packed) {
    const std::set<const ggml_tensor *> is_packed(packed.begin(), packed.end());
    for (const auto & [ws, bs] : projection_groups()) {
        const bool fits = std::all_of(ws.begin(), ws.end(), [&](const ggml_tensor * w) {
            return is_packed.count(w) && w->ne[0] == ws[0]->ne[0] && w->ne[1] == ws[0]->ne[1] &&
                   w->ne[1] % int8_panel_rows == 0;
        });
        if (!fits || std::any_of(bs.begin(), bs.end(), [](const ggml_tensor * b) { return b && b->ne[1] != 1; })) {
            continue;
        }
        const int64_t rows = ws[0]->ne[1], panels = rows / int8_panel_rows, n = static_cast<int64_t>(ws.size());
        int8_group g{ggml_new_tensor_2d(copies_ctx_, GGML_TYPE_I8, int8_panel_bytes(ws[0]->ne[0]), n * panels),
                     ggml_new_tensor_1d(copies_ctx_, GGML_TYPE_F32, n * rows), n, rows, {bs.begin(), bs.end()}};
        ggml_format_name(g.w, "%s.group%d.int8", ggml_get_name(ws[0]), static_cast<int>(n));
        ggml_format_name(g.bias, "%s.group%d.bias", ggml_get_name(ws[0]), static_cast<int>(n));
        for (int64_t i = 0; i < n; ++i) {
            ggml_tensor * view = ggml_view_2d(copies_ctx_, g.w, g.w->ne[0], panels, g.w->nb[1], i * panels * g.w->nb[1]);
            ggml_format_name(view, "%s.int8", ggml_get_name(ws[i]));
            int8_copies_[ws[i]] = view;
        }
        int8_groups_[ws[0]] = std::move(g);
    }
}

const model::int8_group * model::int8_group_of(const std::vector<ggml_tensor *> & ws) const {
    const auto it = ws.empty() ? int8_groups_.end() : int8_groups_.find(ws[0]);
    if (it == int8_groups_.end() || it->second.n_split != static_cast<int64_t>(ws.size())) {
        return nullptr;
    }
    for (size_t i = 0; i < ws.size(); ++i) {  // members follow each other in the matrix
        const ggml_tensor * copy = int8_of(ws[i]);
        if (!copy || copy->view_src != it->second.w ||
            copy->view_offs != i * static_cast<size_t>(it->second.rows_each / int8_panel_rows) * it->second.w->nb[1]) {
            return nullptr;
        }
    }
    return &it->second;
}

// Each group's bias from its members' biases (f32 or f16, read back from their buffer), zeros where a member has none.
void model::fill_group_biases() {
    for (auto & [first, g] : int8_groups_) {
        std::vector<float> bias(static_cast<size_t>(g.n_split * g.rows_each), 0.0f);
        for (size_t i = 0; i < g.biases.size(); ++i) {
            const ggml_tensor * b = g.biases[i];
            if (!b) continue;
            float * out = bias.data() + i * g.rows_each;
            if (b->type == GGML_TYPE_F32) {
                ggml_backend_tensor_get(b, out, 0, ggml_nbytes(b));
            } else if (b->type == GGML_TYPE_F16) {
                std::vector<ggml_fp16_t> h(static_cast<size_t>(g.rows_each));
                ggml_backend_tensor_get(b, h.data(), 0, ggml_nbytes(b));
                ggml_fp16_to_fp32_row(h.data(), out, g.rows_each);
            } else {
                throw std::runtime_error(path + ": " + ggml_get_name(b) + " is neither f32 nor f16");
            }
        }
        ggml_backend_tensor_set(g.bias, bias.data(), 0, ggml_nbytes(g.bias));
    }
}

void model::fill_screen() {
    if (out_screen) {
        fill_copy(tok_emb, tok_emb->data, out_screen);
    }
}

// Fills `copy` (int8 panels or q8_0 rows) from `data`, the f16/f32 values of matrix w, in blocks of rows
// through an f32 staging block (both quantisers take f32).
void model::fill_copy(const ggml_tensor * w, const void * data, ggml_tensor * copy) {
    const int64_t n_per_row = w->ne[0], n_rows = w->ne[1], block = 4096;  // a multiple of int8_panel_rows
    std::vector<float> rows(static_cast<size_t>(n_per_row * block));
    for (int64_t r0 = 0; r0 < n_rows; r0 += block) {
        const int64_t n = std::min(block, n_rows - r0);
        const char * src = static_cast<const char *>(data) + r0 * w->nb[1];
        if (w->type == GGML_TYPE_F16) {
            ggml_fp16_to_fp32_row(reinterpret_cast<const ggml_fp16_t *>(src), rows.data(), n * n_per_row);
        } else {
            std::memcpy(rows.data(), src, sizeof(float) * n * n_per_row);
        }
        if (copy->type == GGML_TYPE_I8) {
            int8_pack(rows.data(), n, n_per_row,
                      static_cast<int8_t *>(copy->data) + r0 / int8_panel_rows * copy->nb[1]);
        } else {
            ggml_quantize_chunk(copy->type, rows.data(), static_cast<char *>(copy->data) + r0 * copy->nb[1], 0, n,
                                n_per_row, nullptr);
        }
    }
}

}  // namespace aural
