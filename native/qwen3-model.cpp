#include "qwen3-model.h"

#include <map>
#include <stdexcept>
#include <string>

#include "backend.h"
#include "gguf-file.h"
#include "log.h"

namespace aural {

namespace {

constexpr const char * arch = "qwen3-asr";
constexpr const char * kind = "Qwen3-ASR";

std::string key(const char * name) { return std::string(arch) + "." + name; }

int64_t find_key(gguf_context * meta, const std::string & k, gguf_type type, const std::string & path) {
    const int64_t id = gguf_find_key(meta, k.c_str());
    if (id < 0 || gguf_get_kv_type(meta, id) != type) {
        throw std::runtime_error(path + ": not a Qwen3-ASR model file (key '" + k + "' missing or of another type)");
    }
    return id;
}

}  // namespace

std::unique_ptr<qwen3_model> qwen3_model::load(const std::string & path, int n_threads, const std::string & device) {
    std::unique_ptr<qwen3_model> m(new qwen3_model());
    m->path = path;
    m->n_threads = n_threads > 0 ? n_threads : default_threads();
    m->dev = select_device(device);
    m->rope_op = ggml_backend_dev_type(m->dev) == GGML_BACKEND_DEVICE_TYPE_CPU && !env_flag("AURAL_NO_ROPE_OP");
    ggml_context * meta_ctx = nullptr;
    gguf_ptr meta = open_gguf(path, &meta_ctx);
    m->ctx_ = meta_ctx;
    m->read_hparams(meta.get());
    m->bind_tensors();
    m->read_weights(meta.get());
    AURAL_LOG_INFO("%s: Qwen3-ASR, %u audio + %u text layers, %.1f MiB of weights on %s", path.c_str(),
                   m->hp.audio.n_layer, m->hp.text.n_layer, m->weights_bytes / 1048576.0,
                   ggml_backend_dev_name(m->dev));
    return m;
}

qwen3_model::~qwen3_model() {
    for (ggml_backend_buffer_t buf : buffers_) ggml_backend_buffer_free(buf);
    if (ctx_) ggml_free(ctx_);
}

void qwen3_model::read_hparams(gguf_context * meta) {
    const int64_t a = find_key(meta, "general.architecture", GGUF_TYPE_STRING, path);
    if (std::string(gguf_get_val_str(meta, a)) != arch) {
        throw std::runtime_error(path + ": architecture '" + gguf_get_val_str(meta, a) + "', not " + arch);
    }
    auto u32 = [&](const char * name) { return gguf_u32(meta, key(name), path, kind); };
    auto f32 = [&](const char * name) { return gguf_get_val_f32(meta, find_key(meta, key(name), GGUF_TYPE_FLOAT32, path)); };
    auto flag = [&](const char * name) { return gguf_get_val_bool(meta, find_key(meta, key(name), GGUF_TYPE_BOOL, path)); };
    auto & au = hp.audio;
    au.n_mels = u32("audio.n_mels");
    au.n_layer = u32("audio.block_count");
    au.n_head = u32("audio.head_count");
    au.n_ff = u32("audio.feed_forward_length");
    au.n_state = u32("audio.embedding_length");
    au.n_max_pos = u32("audio.max_positions");
    au.n_window = u32("audio.n_window");
    au.n_window_infer = u32("audio.n_window_infer");
    au.n_out = u32("audio.output_length");
    au.n_conv = u32("audio.conv_channels");
    auto & tx = hp.text;
    tx.n_vocab = u32("text.vocab_size");
    tx.n_state = u32("text.embedding_length");
    tx.n_ff = u32("text.feed_forward_length");
    tx.n_layer = u32("text.block_count");
    tx.n_head = u32("text.head_count");
    tx.n_head_kv = u32("text.head_count_kv");
    tx.head_dim = u32("text.key_length");
    tx.norm_eps = f32("text.rms_norm_eps");
    tx.rope_theta = f32("text.rope_theta");
    tx.tied = flag("text.tie_word_embeddings");
    hp.audio_token = u32("token.audio");
    hp.audio_start_token = u32("token.audio_start");
    hp.eos_tokens = gguf_u32_array(meta, key("token.eos"), path, kind);
    // The zero tests first: they are divisors below (a damaged file must raise, not SIGFPE), and an audio tower
    // with no window would loop forever.
    if (au.n_head == 0 || tx.n_head_kv == 0 || au.n_window == 0 || au.n_window_infer == 0 ||
        au.n_state % au.n_head != 0 || tx.n_head % tx.n_head_kv != 0 || au.n_out != tx.n_state ||
        au.n_window_infer % (2 * au.n_window) != 0 || tx.head_dim % 2 != 0) {
        throw std::runtime_error(path + ": inconsistent Qwen3-ASR hyper-parameters");
    }
}

ggml_tensor * qwen3_model::require(const std::string & name, std::initializer_list<int64_t> ne) {
    return require_tensor(ctx_, name, ne, path);
}

void qwen3_model::bind_tensors() {
    const auto & au = hp.audio;
    const int64_t c = au.n_conv, d = au.n_state, f = ((((au.n_mels + 1) / 2) + 1) / 2 + 1) / 2;
    for (int i = 0; i < 3; ++i) {
        const std::string p = "audio_tower.conv2d" + std::to_string(i + 1);
        conv[i] = {require(p + ".weight", {3, 3, i == 0 ? 1 : c, c}), require(p + ".bias", {c})};
    }
    conv_out = require("audio_tower.conv_out.weight", {c * f, d});
    auto linear = [&](const std::string & p, int64_t n_in, int64_t n_out, bool bias) {
        return qwen3_linear{require(p + ".weight", {n_in, n_out}), bias ? require(p + ".bias", {n_out}) : nullptr};
    };
    auto layer_norm = [&](const std::string & p, int64_t n) {
        return qwen3_norm{require(p + ".weight", {n}), require(p + ".bias", {n})};
    };
    for (uint32_t i = 0; i < au.n_layer; ++i) {
        const std::string p = "audio_tower.layers." + std::to_string(i);
        qwen3_audio_layer l;
        l.attn_ln = layer_norm(p + ".self_attn_layer_norm", d);
        l.q = linear(p + ".self_attn.q_proj", d, d, true);
        l.k = linear(p + ".self_attn.k_proj", d, d, true);
        l.v = linear(p + ".self_attn.v_proj", d, d, true);
        l.o = linear(p + ".self_attn.out_proj", d, d, true);
        l.ffn_ln = layer_norm(p + ".final_layer_norm", d);
        l.fc1 = linear(p + ".fc1", d, au.n_ff, true);
        l.fc2 = linear(p + ".fc2", au.n_ff, d, true);
        audio_layers.push_back(l);
    }
    ln_post = layer_norm("audio_tower.ln_post", d);
    proj1 = linear("audio_tower.proj1", d, d, true);
    proj2 = linear("audio_tower.proj2", d, au.n_out, true);

    const auto & tx = hp.text;
    const int64_t h = tx.n_state, hd = tx.head_dim, nq = tx.n_head * hd, nkv = tx.n_head_kv * hd;
    embed_tokens = require("model.embed_tokens.weight", {h, tx.n_vocab});
    auto rms = [&](const std::string & p, int64_t n) { return qwen3_norm{require(p + ".weight", {n}), nullptr}; };
    for (uint32_t i = 0; i < tx.n_layer; ++i) {
        const std::string p = "model.layers." + std::to_string(i);
        qwen3_text_layer l;
        l.attn_norm = rms(p + ".input_layernorm", h);
        const bool bias = ggml_get_tensor(ctx_, (p + ".self_attn.q_proj.bias").c_str()) != nullptr;  // attention_bias
        l.q = linear(p + ".self_attn.q_proj", h, nq, bias);
        l.k = linear(p + ".self_attn.k_proj", h, nkv, bias);
        l.v = linear(p + ".self_attn.v_proj", h, nkv, bias);
        l.o = linear(p + ".self_attn.o_proj", nq, h, bias);
        l.q_norm = rms(p + ".self_attn.q_norm", hd);
        l.k_norm = rms(p + ".self_attn.k_norm", hd);
        l.ffn_norm = rms(p + ".post_attention_layernorm", h);
        l.gate = linear(p + ".mlp.gate_proj", h, tx.n_ff, false);
        l.up = linear(p + ".mlp.up_proj", h, tx.n_ff, false);
        l.down = linear(p + ".mlp.down_proj", tx.n_ff, h, false);
        text_layers.push_back(l);
    }
    norm = rms("model.norm", h);
    lm_head = tx.tied ? embed_tokens : require("lm_head.weight", {h, tx.n_vocab});
}

void qwen3_model::read_weights(gguf_context * meta) {
    ggml_backend_buffer_type_t on_device = ggml_backend_dev_buffer_type(dev);
    ggml_backend_buffer_type_t on_cpu = ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> groups;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx_); t; t = ggml_get_next_tensor(ctx_, t)) {
        const bool held = ggml_backend_dev_supports_op(dev, t);
        if (!held) host_weights.emplace_back(ggml_get_name(t));
        groups[held ? on_device : on_cpu].push_back(t);
    }
    if (!host_weights.empty()) {
        AURAL_LOG_WARN("%s cannot hold %zu weight tensors (%s, ...): they stay in the CPU's memory, and their products "
                       "run on the CPU", ggml_backend_dev_name(dev), host_weights.size(), host_weights[0].c_str());
    }
    buffers_ = allocate_weights(groups, path);
    for (ggml_backend_buffer_t buf : buffers_) weights_bytes += ggml_backend_buffer_get_size(buf);
    read_tensor_data(meta, ctx_, path);
}

}  // namespace aural
