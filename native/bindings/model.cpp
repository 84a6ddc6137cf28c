// aural._native.Model: Whisper weights on one device.
#include "model.h"

#include <pybind11/stl.h>

#include "backend.h"
#include "bindings.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

py::dict hparams_dict(const hparams & hp) {
    py::dict d;
    d["n_vocab"] = hp.n_vocab;
    d["n_audio_ctx"] = hp.n_audio_ctx;
    d["n_audio_state"] = hp.n_audio_state;
    d["n_audio_head"] = hp.n_audio_head;
    d["n_audio_layer"] = hp.n_audio_layer;
    d["n_text_ctx"] = hp.n_text_ctx;
    d["n_text_state"] = hp.n_text_state;
    d["n_text_head"] = hp.n_text_head;
    d["n_text_layer"] = hp.n_text_layer;
    d["n_mels"] = hp.n_mels;
    return d;
}

}  // namespace

void register_model(py::module_ & m) {
    py::class_<model>(m, "Model", "Whisper weights loaded from a GGUF file onto one device (read-only, shareable).")
        .def(py::init([](const std::string & path, const std::string & device, int n_threads) {
                 py::gil_scoped_release release;
                 return model::load(path, device, n_threads);
             }),
             py::arg("path"), py::kw_only(), py::arg("device") = "auto", py::arg("n_threads") = 0,
             "Load `path`; `device` is 'auto' or a device/backend name; n_threads 0 = default.")
        .def_property_readonly("hparams", [](const model & self) { return hparams_dict(self.hp); })
        .def_property_readonly("device", [](const model & self) { return std::string(ggml_backend_dev_name(self.dev)); })
        .def_property_readonly("backend", [](const model & self) {
            return std::string(ggml_backend_reg_name(ggml_backend_dev_backend_reg(self.dev)));
        })
        .def_property_readonly("device_info", [](const model & self) {
            const device_info d = describe_device(self.dev);
            py::dict out;
            out["name"] = d.name;
            out["description"] = d.description;
            out["backend"] = d.backend;
            out["type"] = d.type;
            return out;
        })
        .def_property_readonly("n_threads", [](const model & self) { return self.n_threads; })
        .def_property_readonly("weights_bytes", [](const model & self) { return self.weights_bytes; })
        .def_property_readonly("weight_buffers", [](const model & self) { return self.weight_buffers; },
                               "[(buffer type name, bytes)]: where the weights live, e.g. CPU and CPU_REPACK.")
        .def_property_readonly("widened_bytes", [](const model & self) { return self.widened_bytes; },
                               "Bytes of f16 encoder matrices held as f32 for the CPU's matmul kernels (0: none).")
        .def_property_readonly("simd_gelu", [](const model & self) { return self.simd_gelu; },
                               "Whether GELU runs as Aural's vectorised CPU op instead of ggml's scalar erff.")
        .def_property_readonly("simd_attention", [](const model & self) { return self.simd_attention; },
                               "Whether the encoder's self-attention runs as Aural's CPU op instead of ggml's "
                               "flash attention (x86-64 with AVX2 or AVX-512).")
        .def_property_readonly("simd_cross", [](const model & self) { return self.simd_cross; },
                               "Whether the decoder's cross-attention runs as Aural's CPU op instead of ggml's "
                               "mul_mat, soft_max, mul_mat (x86-64 with AVX2 and F16C, or AVX-512).")
        .def_property_readonly("simd_self", [](const model & self) { return self.simd_self; },
                               "Whether the decoder's self-attention runs as Aural's CPU op instead of ggml's "
                               "flash attention (x86-64 with AVX2 and F16C, or AVX-512; f16 KV arena).")
        .def_property_readonly("simd_transpose", [](const model & self) { return self.simd_transpose; },
                               "Whether the encoder's transposed copies (K for the attention op, the stem, cross "
                               "V^T) run as Aural's CPU op instead of ggml's copies (x86-64 with AVX2 and F16C).")
        .def_property_readonly("int8", [](const model & self) { return self.int8; },
                               "Whether the layers' projections multiply as int8 with AVX2 or VNNI (and the "
                               "output screen is an int8 copy), as CTranslate2's int8 compute type.")
        .def_property_readonly("int8_bytes", [](const model & self) { return self.int8_bytes; },
                               "Bytes of the int8 copies of the layers' projections (0: none).")
        .def_property_readonly("screen_bytes", [](const model & self) { return self.screen_bytes; },
                               "Bytes of the int8 or q8_0 copy of the output projection that screens the vocabulary "
                               "before the best tokens are rescored (0: none; CPU with f16 weights only).")
        .def_property_readonly("path", [](const model & self) { return self.path; });
}

}  // namespace aural::bindings
