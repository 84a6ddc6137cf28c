// aural._native.Context: one decoding session (KV arena, graphs, timings) on a Model; StreamBatch: one
// decoder step of several sessions in one graph.
#include "context.h"
#include "stream-batch.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>

#include "bindings.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using float_array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using int_array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

std::unique_ptr<context> make_context(const model & m, const std::string & kv_mode, bool graph_reuse, int n_threads,
                                      uint32_t n_seq, uint32_t max_ubatch, std::shared_ptr<kv_pool> pool,
                                      uint32_t max_audio_ctx) {
    context_params p;
    p.pool = std::move(pool);
    p.max_audio_ctx = max_audio_ctx;
    p.mode = parse_kv_mode(kv_mode);
    p.graph_reuse = graph_reuse;
    p.n_threads = n_threads;
    p.n_seq = n_seq;
    p.max_ubatch = max_ubatch;
    py::gil_scoped_release release;
    return std::make_unique<context>(m, p);
}

void encode(context & self, const float_array & mel) {
    const hparams & hp = self.mdl.hp;
    if (mel.ndim() != 2 || mel.shape(0) != hp.n_mels) {
        throw std::invalid_argument("mel must be float32 of shape (" + std::to_string(hp.n_mels) + ", n_frames)");
    }
    const float * data = mel.data();
    const auto n_frames = static_cast<uint32_t>(mel.shape(1));
    py::gil_scoped_release release;
    self.encode(data, n_frames);
}

// Positions: each token continues its own sequence, so the k-th token of sequence s in this batch
// sits at n_past + k (one token per beam: every beam at n_past).
std::vector<int32_t> positions(const std::vector<int32_t> & seq, uint32_t n_past) {
    std::map<int32_t, int32_t> seen;
    std::vector<int32_t> pos;
    for (int32_t s : seq) pos.push_back(static_cast<int32_t>(n_past) + seen[s]++);
    return pos;
}

using opt_ids = std::optional<std::vector<int32_t>>;

// A step's batch from the Python arguments of `decode`; `tokens` must outlive it.
decode_batch make_batch(const int_array & tokens, uint32_t n_past, const opt_ids & outputs, const opt_ids & seq_ids) {
    if (tokens.ndim() != 1 || tokens.shape(0) == 0) {
        throw std::invalid_argument("tokens must be a non-empty 1-D int32 array");
    }
    decode_batch batch;
    batch.tokens = tokens.data();
    batch.n_tokens = static_cast<uint32_t>(tokens.shape(0));
    batch.seq = seq_ids.value_or(std::vector<int32_t>(batch.n_tokens, 0));
    if (batch.seq.size() != batch.n_tokens) {
        throw std::invalid_argument("seq_ids needs one sequence id per token");
    }
    batch.pos = positions(batch.seq, n_past);
    batch.outputs = outputs.value_or(std::vector<int32_t>{static_cast<int32_t>(batch.n_tokens) - 1});
    for (int32_t & o : batch.outputs) {
        o = o < 0 ? o + static_cast<int32_t>(batch.n_tokens) : o;  // Python-style negative indices
    }
    return batch;
}

py::array_t<float> logits_array(const decode_batch & batch, const model & m) {
    return py::array_t<float>({static_cast<py::ssize_t>(batch.outputs.size()), static_cast<py::ssize_t>(m.hp.n_vocab)});
}

py::array_t<float> decode(context & self, const int_array & tokens, uint32_t n_past, const opt_ids & outputs,
                          const opt_ids & seq_ids) {
    decode_batch batch = make_batch(tokens, n_past, outputs, seq_ids);
    py::array_t<float> logits = logits_array(batch, self.mdl);
    float * out = logits.mutable_data();
    {
        py::gil_scoped_release release;
        self.decode(batch, out);
    }
    return logits;
}

// StreamBatch.decode: one step of each context, in one graph. steps[i] = (tokens, n_past, outputs, seq_ids).
py::list decode_together(stream_batch & self, const std::vector<context *> & contexts,
                         const std::vector<std::tuple<int_array, uint32_t, opt_ids, opt_ids>> & steps) {
    std::vector<decode_batch> batches;
    std::vector<py::array_t<float>> out;
    for (const auto & [tokens, n_past, outputs, seq_ids] : steps) {
        batches.push_back(make_batch(tokens, n_past, outputs, seq_ids));
        out.push_back(logits_array(batches.back(), self.mdl));
    }
    std::vector<decode_batch *> ptrs;
    std::vector<float *> dest;
    for (size_t i = 0; i < batches.size(); ++i) {
        ptrs.push_back(&batches[i]);
        dest.push_back(out[i].mutable_data());
    }
    {
        py::gil_scoped_release release;
        self.decode(contexts, ptrs, dest);
    }
    py::list result;
    for (auto & a : out) result.append(a);
    return result;
}

void reorder(context & self, const std::vector<int32_t> & parents) {
    py::gil_scoped_release release;
    self.reorder(parents);
}

py::tuple align(context & self, const int_array & tokens, const std::vector<std::pair<int, int>> & heads) {
    if (tokens.ndim() != 1 || tokens.shape(0) == 0) {
        throw std::invalid_argument("tokens must be a non-empty 1-D int32 array");
    }
    std::vector<align_head> hs;
    for (const auto & [layer, head] : heads) hs.push_back({layer, head});
    const auto n = static_cast<py::ssize_t>(tokens.shape(0));
    const auto n_cross = static_cast<py::ssize_t>(self.kv().cross_rows());
    py::array_t<float> weights({static_cast<py::ssize_t>(hs.size()), n, n_cross});
    py::array_t<float> logits({n, static_cast<py::ssize_t>(self.mdl.hp.n_vocab)});
    const int32_t * data = tokens.data();
    float * w = weights.mutable_data();
    float * l = logits.mutable_data();
    {
        py::gil_scoped_release release;
        self.align(data, static_cast<uint32_t>(n), hs, w, l);
    }
    return py::make_tuple(weights, logits);
}

py::dict step_dict(const step_timings & t) {
    py::dict d;
    d["compute_ms"] = t.compute_ms;
    d["kv_io_ms"] = t.kv_io_ms;
    d["kv_io_bytes"] = t.kv_io_bytes;
    d["logits_ms"] = t.logits_ms;
    d["build_ms"] = t.build_ms;
    d["n_tokens"] = t.n_tokens;
    d["n_graphs"] = t.n_graphs;
    d["reused"] = t.reused;
    return d;
}

py::dict encode_dict(const encode_timings & t) {
    py::dict d;
    d["encoder_ms"] = t.encoder_ms;
    d["kv_io_ms"] = t.kv_io_ms;
    d["kv_io_bytes"] = t.kv_io_bytes;
    return d;
}

py::dict stats_dict(const context & self) {
    const context_stats & s = self.stats;
    py::dict d;
    d["graph_builds"] = s.graph_builds;
    d["graph_reuses"] = s.graph_reuses;
    d["decode_calls"] = s.decode_calls;
    d["tokens_decoded"] = s.tokens_decoded;
    d["encode_calls"] = s.encode_calls;
    d["encoder_builds"] = s.encoder_builds;
    d["reorders"] = s.reorders;
    d["align_calls"] = s.align_calls;
    d["n_seq"] = self.kv().n_seq();
    d["cross_rows"] = self.kv().cross_rows();
    d["cross_capacity"] = self.kv().cross_capacity();
    d["encoder_ms_total"] = s.encoder_ms_total;
    d["compute_ms_total"] = s.compute_ms_total;
    d["kv_io_ms_total"] = s.kv_io_ms_total;
    d["kv_io_bytes_total"] = s.kv_io_bytes_total;
    d["logits_ms_total"] = s.logits_ms_total;
    d["kv_capacity_tokens"] = self.mdl.hp.n_text_ctx;
    d["kv_cells"] = self.kv().n_ctx();
    d["kv_used_tokens"] = self.kv().used();
    d["kv_bytes"] = self.kv().self_bytes();
    d["kv_pool_blocks"] = self.kv().blocks_held();
    d["kv_paged"] = self.kv().paged();
    d["cross_kv_bytes"] = self.kv().cross_bytes();
    d["compute_buffer_bytes"] = self.compute_buffer_bytes();
    d["ubatch"] = self.ubatch();
    return d;
}

py::dict report_dict(const backend_report & r) {
    py::dict d;
    d["primary"] = r.primary;
    d["nodes_per_backend"] = r.nodes_per_backend;
    d["fallback_ops"] = r.fallback_ops;
    d["n_splits"] = r.n_splits;
    return d;
}

}  // namespace

std::shared_ptr<kv_pool> make_pool(const model & m, uint32_t n_blocks) {
    py::gil_scoped_release release;
    return std::make_shared<kv_pool>(m.dev, m.hp, n_blocks, GGML_TYPE_F16);
}

void register_context(py::module_ & m) {
    py::class_<kv_pool, std::shared_ptr<kv_pool>>(m, "KVPool",
        "Self-attention KV blocks on the model's device, shared by the Contexts given it (paged KV).")
        .def(py::init(&make_pool), py::arg("model"), py::kw_only(), py::arg("n_blocks"),
             "Reserves n_blocks blocks of block_cells cells (K and V of every decoder layer) at once.")
        .def_property_readonly_static("block_cells", [](py::object) { return kv_pool::block_cells; })
        .def_static("session_blocks", [](const model & mdl, uint32_t n_seq) {
                if (n_seq < 1 || n_seq > context::max_seq) {
                    throw std::invalid_argument("n_seq must be between 1 and " + std::to_string(context::max_seq));
                }
                return (arena_cells(mdl.hp, n_seq) + kv_pool::block_cells - 1) / kv_pool::block_cells;
            }, py::arg("model"), py::arg("n_seq"),
            "The most blocks a session of this model decoding n_seq sequences can hold: its own arena's cells.")
        .def_property_readonly("n_blocks", &kv_pool::n_blocks)
        .def_property_readonly("used_blocks", &kv_pool::used_blocks)
        .def_property_readonly("peak_blocks", &kv_pool::peak_blocks)
        .def_property_readonly("block_bytes", &kv_pool::block_bytes)
        .def_property_readonly("bytes", &kv_pool::bytes);
    py::class_<context>(m, "Context", "One transcription session: KV arena on the device, graphs, timings.")
        .def(py::init(&make_context), py::arg("model"), py::kw_only(), py::arg("kv_mode") = "device",
             py::arg("graph_reuse") = true, py::arg("n_threads") = 0, py::arg("n_seq") = 1,
             py::arg("max_ubatch") = 0, py::arg("kv_pool") = nullptr, py::arg("max_audio_ctx") = 0,
             py::keep_alive<1, 2>(),
             "kv_mode 'device' keeps the KV history on the device; 'host' is the round-trip baseline. n_seq "
             "sequences (beams, best-of samples, at most 8) can be decoded side by side. A batch longer than "
             "max_ubatch tokens (0: the device's limit, stats['ubatch']) is decoded in pieces. With kv_pool "
             "(device mode, a KVPool of this model) the self-attention K/V take the pool's blocks as the text "
             "grows and give them back as it ends; a full pool raises ContextFullError. max_audio_ctx (0: the "
             "model's, a 30 s window) bounds the encoder positions of a window, for which the cross K/V and "
             "compute buffers are reserved: a session for a short recording needs less memory.")
        .def("encode", &encode, py::arg("mel"),
             "Encode one window: mel float32 (n_mels, n_frames), n_frames even and <= 3000 (30 s); fewer "
             "frames encode a shorter audio context. Computes the cross K/V on the device.")
        .def("decode", &decode, py::arg("tokens"), py::arg("n_past"), py::arg("outputs") = py::none(),
             py::arg("seq_ids") = py::none(),
             "Append int32 `tokens` at position n_past of their sequences (seq_ids, default all 0; the k-th "
             "token of a sequence goes to n_past + k); returns float32 logits (len(outputs), n_vocab), by "
             "default for the last token only.")
        .def("reorder", &reorder, py::arg("parents"),
             "Beam reorder: new sequence j continues old sequence parents[j]; unnamed sequences end. "
             "Moves no K/V: cells are shared by the sequences that contain them.")
        .def("align", &align, py::arg("tokens"), py::arg("heads"),
             "Teacher-force int32 `tokens` (sequence 0 from position 0) on the window last encoded; returns "
             "(weights float32 (len(heads), n_tokens, n_cross): cross-attention of each (layer, head), "
             "logits float32 (n_tokens, n_vocab)).")
        .def("clear_kv", &context::clear_kv, "Zero the KV arena and forget every position.")
        .def("interrupt", &context::interrupt,
             "Thread-safe and immediate: the computation in progress stops before its next graph node (CPU), and "
             "this and every later encode/decode/align raises Interrupted.")
        .def_property_readonly("interrupted", &context::interrupted)
        .def_property_readonly("kv_mode", [](const context & self) { return std::string(kv_mode_name(self.params.mode)); })
        .def_property_readonly("graph_reuse", [](const context & self) { return self.params.graph_reuse; })
        .def_property_readonly("last_timings", [](const context & self) { return step_dict(self.last_step); })
        .def_property_readonly("last_encode", [](const context & self) { return encode_dict(self.last_encode); })
        .def_property_readonly("stats", &stats_dict)
        .def_property_readonly("backend_report", [](const context & self) {
            py::dict d;
            d["encoder"] = report_dict(self.encoder_report);
            d["decoder"] = report_dict(self.decoder_report);
            d["primary"] = self.encoder_report.primary;
            std::set<std::string> ops(self.encoder_report.fallback_ops.begin(), self.encoder_report.fallback_ops.end());
            ops.insert(self.decoder_report.fallback_ops.begin(), self.decoder_report.fallback_ops.end());
            d["fallback_ops"] = std::vector<std::string>(ops.begin(), ops.end());
            return d;
        });

    py::class_<stream_batch>(m, "StreamBatch",
                             "Decodes one step of several Contexts of a model in one graph: the layers' matrix "
                             "products run once over all their tokens, attention on each Context's own KV.")
        .def(py::init([](const model & mdl, int n_threads) {
                 py::gil_scoped_release release;
                 return std::make_unique<stream_batch>(mdl, n_threads);
             }),
             py::arg("model"), py::kw_only(), py::arg("n_threads") = 0, py::keep_alive<1, 2>())
        .def("decode", &decode_together, py::arg("contexts"), py::arg("steps"),
             "steps[i] = (tokens, n_past, outputs, seq_ids) of contexts[i], as Context.decode takes them (at most "
             "max_tokens_per_context tokens); returns each one's logits. Every Context's last_timings and stats "
             "are updated as if it had decoded alone (the step's time is each one's).")
        .def_readonly_static("max_tokens_per_context", &stream_batch::max_tokens_per_context)
        .def_readonly_static("max_contexts", &stream_batch::max_contexts)
        .def_property_readonly("stats", [](const stream_batch & self) {
            py::dict d;
            d["steps"] = self.n_steps;
            d["graph_builds"] = self.graph_builds;
            d["graph_reuses"] = self.graph_reuses;
            d["compute_ms_total"] = self.compute_ms_total;
            return d;
        });
}

}  // namespace aural::bindings
