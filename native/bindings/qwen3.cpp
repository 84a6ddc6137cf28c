// aural._native.Qwen3Model, Qwen3AudioEncoder and Qwen3Context: Qwen3-ASR's weights, audio tower and text decoder
// with its KV arena, on ggml's CPU backend.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "qwen3-audio.h"
#include "qwen3-context.h"
#include "qwen3-model.h"
#include "qwen3-stream-batch.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using float_array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using int_array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// The encoder keeps its model alive: Python may drop the model first.
struct encoder_handle {
    std::shared_ptr<qwen3_model> model;
    std::unique_ptr<qwen3_audio_encoder> encoder;
};

py::array_t<float> encode(encoder_handle & self, const float_array & mel, std::optional<int> n_layers) {
    const auto & au = self.model->hp.audio;
    if (mel.ndim() != 2 || mel.shape(0) != au.n_mels) {
        throw std::invalid_argument("mel must be float32 of shape (n_mels, n_frames) with the model's " +
                                    std::to_string(au.n_mels) + " bins");
    }
    const float * data = mel.data();
    const int64_t n_frames = mel.shape(1);
    std::vector<float> out;
    {
        py::gil_scoped_release release;
        out = self.encoder->encode(data, n_frames, n_layers.value_or(-1));
    }
    const int64_t width = n_layers ? au.n_state : au.n_out;
    py::array_t<float> result({static_cast<py::ssize_t>(out.size() / width), static_cast<py::ssize_t>(width)});
    std::copy(out.begin(), out.end(), result.mutable_data());
    return result;
}

// The context keeps its model alive: Python may drop the model first.
struct context_handle {
    std::shared_ptr<qwen3_model> model;
    std::unique_ptr<qwen3_context> ctx;
};

py::array_t<float> decode(context_handle & self, const int_array & tokens, const std::optional<float_array> & audio,
                          bool all_logits) {
    const auto & hp = self.model->hp;
    if (tokens.ndim() != 1 || tokens.shape(0) == 0) {
        throw std::invalid_argument("tokens must be a non-empty 1-D array of ids");
    }
    if (audio && (audio->ndim() != 2 || audio->shape(1) != hp.text.n_state)) {
        throw std::invalid_argument("audio must be float32 of shape (n_audio, " + std::to_string(hp.text.n_state) + ")");
    }
    const int64_t n = tokens.shape(0), n_audio = audio ? audio->shape(0) : 0;
    py::array_t<float> out(all_logits ? std::vector<py::ssize_t>{n, hp.text.n_vocab}
                                      : std::vector<py::ssize_t>{hp.text.n_vocab});
    const int32_t * ids = tokens.data();
    const float * a = audio ? audio->data() : nullptr;
    float * dest = out.mutable_data();
    {
        py::gil_scoped_release release;
        self.ctx->decode(ids, n, a, n_audio, dest, all_logits);
    }
    return out;
}

// The batch keeps its model alive: Python may drop the model first.
struct batch_handle {
    std::shared_ptr<qwen3_model> model;
    std::unique_ptr<qwen3_stream_batch> batch;
};

py::list decode_together(batch_handle & self, const std::vector<context_handle *> & contexts,
                         const std::vector<int_array> & tokens) {
    std::vector<qwen3_context *> ctxs;
    for (context_handle * c : contexts) ctxs.push_back(c->ctx.get());
    std::vector<std::vector<int32_t>> steps;
    for (const int_array & t : tokens) {
        if (t.ndim() != 1) throw std::invalid_argument("each step's tokens must be a 1-D array of ids");
        steps.emplace_back(t.data(), t.data() + t.shape(0));
    }
    std::vector<py::array_t<float>> out;
    std::vector<float *> dest;
    for (size_t i = 0; i < steps.size(); ++i) {
        out.emplace_back(std::vector<py::ssize_t>{self.model->hp.text.n_vocab});
        dest.push_back(out.back().mutable_data());
    }
    {
        py::gil_scoped_release release;
        self.batch->decode(ctxs, steps, dest);
    }
    py::list result;
    for (auto & a : out) result.append(a);
    return result;
}

}  // namespace

void register_qwen3(py::module_ & m) {
    py::class_<qwen3_model, std::shared_ptr<qwen3_model>>(
        m, "Qwen3Model", "Qwen3-ASR weights from a GGUF written by `aural models convert`, on a ggml device; read-only.")
        .def(py::init([](const std::string & path, int n_threads, const std::string & device) {
                 py::gil_scoped_release release;
                 return std::shared_ptr<qwen3_model>(qwen3_model::load(path, n_threads, device));
             }),
             py::arg("path"), py::kw_only(), py::arg("n_threads") = 0, py::arg("device") = "cpu",
             "Load `path` onto `device` ('cpu', 'auto': a GPU where there is one, or a device name such as "
             "'Vulkan0'); n_threads 0 = default.")
        .def_property_readonly("device", [](const qwen3_model & s) { return std::string(ggml_backend_dev_name(s.dev)); })
        .def_property_readonly("backend", [](const qwen3_model & s) {
            return std::string(ggml_backend_reg_name(ggml_backend_dev_backend_reg(s.dev)));
        })
        .def_property_readonly("host_weights", [](const qwen3_model & s) { return s.host_weights; },
                               "Weights the device cannot hold, kept in the CPU's memory (their products run there).")
        .def_property_readonly("n_vocab", [](const qwen3_model & s) { return s.hp.text.n_vocab; })
        .def_property_readonly("n_state", [](const qwen3_model & s) { return s.hp.text.n_state; })
        .def_property_readonly("audio_token", [](const qwen3_model & s) { return s.hp.audio_token; })
        .def_property_readonly("audio_window_frames", [](const qwen3_model & s) { return s.hp.audio.n_window_infer; },
                               "Mel frames of one attention window of the audio tower (800): its vectors depend on "
                               "those frames alone.")
        .def("audio_vectors", [](const qwen3_model & s, int64_t n_frames) { return qwen3_audio_frames(s.hp, n_frames); },
             py::arg("n_frames"), "The audio tower's vectors for n_frames mel frames (104 for one window).")
        .def_property_readonly("eos_tokens", [](const qwen3_model & s) { return s.hp.eos_tokens; })
        .def_property_readonly("weights_bytes", [](const qwen3_model & s) { return s.weights_bytes; })
        .def_property_readonly("path", [](const qwen3_model & s) { return s.path; });

    py::class_<encoder_handle>(m, "Qwen3AudioEncoder",
                               "Qwen3-ASR's audio tower on the model's device, with its own compute buffer; one thread at a "
                               "time.")
        .def(py::init([](std::shared_ptr<qwen3_model> model, int windows_per_graph) {
                 py::gil_scoped_release release;
                 auto encoder = std::make_unique<qwen3_audio_encoder>(*model, windows_per_graph);
                 return encoder_handle{std::move(model), std::move(encoder)};
             }),
             py::arg("model"), py::kw_only(), py::arg("windows_per_graph") = 1,
             "windows_per_graph: attention windows (8 s each) computed by one graph.")
        .def_property_readonly("fallback_ops", [](const encoder_handle & s) { return s.encoder->report.fallback_ops; },
                               "Ops of the tower's graph that the model's device lacks, run on the CPU.")
        .def("encode", &encode, py::arg("mel"), py::kw_only(), py::arg("n_layers") = py::none(),
             "The vectors (A, n_out) float32 of a 128-bin log-mel (n_mels, n_frames): one per 8 frames. n_layers: "
             "stop after that many layers and return the hidden states (A, n_state) before ln_post (0: the stem).");

    py::class_<context_handle>(m, "Qwen3Context",
                               "A Qwen3-ASR decoding session: the text decoder's KV arena (n_ctx tokens, f16) kept "
                               "in the backend's memory. One thread at a time.")
        .def(py::init([](std::shared_ptr<qwen3_model> model, uint32_t n_ctx, const std::string & kv_type,
                         const std::string & kv_mode, bool graph_reuse, uint32_t max_ubatch) {
                 if (kv_type != "f16" && kv_type != "f32") {
                     throw std::invalid_argument("kv_type is f16 or f32, not " + kv_type);
                 }
                 const auto mode = parse_kv_mode(kv_mode);
                 py::gil_scoped_release release;
                 auto ctx = std::make_unique<qwen3_context>(*model, n_ctx,
                                                            kv_type == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32, mode,
                                                            graph_reuse, max_ubatch);
                 return context_handle{std::move(model), std::move(ctx)};
             }),
             py::arg("model"), py::kw_only(), py::arg("n_ctx") = 1024, py::arg("kv_type") = "f16",
             py::arg("kv_mode") = "device", py::arg("graph_reuse") = true, py::arg("max_ubatch") = 0,
             "kv_mode 'host': the baseline that keeps the K/V history on the host and moves it every call. "
             "graph_reuse False (or AURAL_NO_GRAPH_REUSE=1): build every call's graph anew. max_ubatch: the most "
             "tokens per graph, a longer batch running in pieces (0: the device's limit, 31 on Vulkan).")
        .def("decode", &decode, py::arg("tokens"), py::kw_only(), py::arg("audio") = py::none(),
             py::arg("all_logits") = false,
             "Append `tokens` (int32) at the next positions; `audio` (n_audio, n_state) float32 replaces the audio "
             "tokens' embeddings in order. Returns the last token's logits (n_vocab,), or with all_logits every "
             "token's (n, n_vocab). ValueError for bad input; ContextFullError when n_ctx tokens would be exceeded "
             "(nothing is appended).")
        .def("clear", [](context_handle & s) { s.ctx->clear(); }, "Forget every token.")
        .def("rewind", [](context_handle & s, uint32_t n_past) { s.ctx->rewind(n_past); }, py::arg("n_past"),
             "Forget the tokens at positions n_past and after; the next decode appends there. ValueError when "
             "n_past exceeds the tokens held.")
        .def_property_readonly("n_past", [](const context_handle & s) { return s.ctx->n_past(); })
        .def_property_readonly("kv_bytes", [](const context_handle & s) { return s.ctx->kv().self_bytes(); })
        .def_property_readonly("compute_bytes", [](const context_handle & s) { return s.ctx->compute_bytes(); })
        .def_property_readonly("kv_mode", [](const context_handle & s) { return std::string(kv_mode_name(s.ctx->mode())); })
        .def_property_readonly(
            "last_timings",
            [](const context_handle & s) {
                const qwen3_timings & t = s.ctx->last();
                return py::dict(py::arg("compute_ms") = t.compute_ms, py::arg("kv_io_ms") = t.kv_io_ms,
                                py::arg("kv_io_bytes") = t.kv_io_bytes, py::arg("build_ms") = t.build_ms,
                                py::arg("reused") = t.reused);
            },
            "The last decode call's compute_ms, kv_io_ms and kv_io_bytes (host mode's traffic), and build_ms "
            "(building and allocating its graph; 0 with reused True).")
        .def_property_readonly("fallback_ops", [](const context_handle & s) { return s.ctx->report().fallback_ops; },
                               "Ops of the last decoder graph built that the model's device lacks, run on the CPU.")
        .def_property_readonly(
            "stats",
            [](const context_handle & s) {
                const qwen3_stats & st = s.ctx->stats();
                return py::dict(py::arg("graph_builds") = st.graph_builds, py::arg("graph_reuses") = st.graph_reuses);
            },
            "Graphs built and reused by this context's decode calls.");

    py::class_<batch_handle>(m, "Qwen3StreamBatch",
                             "Several Qwen3Contexts' decoder steps in one graph: the weights are read once for all of "
                             "them. One caller at a time.")
        .def(py::init([](std::shared_ptr<qwen3_model> model, int n_threads) {
                 py::gil_scoped_release release;
                 auto batch = std::make_unique<qwen3_stream_batch>(*model, n_threads);
                 return batch_handle{std::move(model), std::move(batch)};
             }),
             py::arg("model"), py::kw_only(), py::arg("n_threads") = 0, "n_threads 0: the model's.")
        .def("decode", &decode_together, py::arg("contexts"), py::arg("tokens"),
             "tokens[i] (int32, at most max_tokens_per_context) appended to contexts[i] as Qwen3Context.decode "
             "appends them; returns each one's last logits (n_vocab,). Every context's last_timings, stats and n_past "
             "are as if it had decoded alone (the step's time is each one's). ValueError, before any context "
             "changes, for a step not allowed here.")
        .def_readonly_static("max_tokens_per_context", &qwen3_stream_batch::max_tokens_per_context)
        .def_readonly_static("max_contexts", &qwen3_stream_batch::max_contexts)
        .def_property_readonly("stats", [](const batch_handle & self) {
            py::dict d;
            d["steps"] = self.batch->n_steps;
            d["graph_builds"] = self.batch->graph_builds;
            d["graph_reuses"] = self.batch->graph_reuses;
            d["compute_ms_total"] = self.batch->compute_ms_total;
            return d;
        });
}

}  // namespace aural::bindings
