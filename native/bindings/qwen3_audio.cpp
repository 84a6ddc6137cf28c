// aural._native.qwen3_audio_tower: Qwen3-ASR's audio tower (qwen3-audio.h) on a GGUF file, for tests against
// the official code and measurements; it loads the model on every call and keeps nothing.
#include "qwen3-audio.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using float_array = py::array_t<float, py::array::c_style | py::array::forcecast>;

py::array_t<float> audio_tower(const std::string & path, const float_array & mel, int n_threads,
                               std::optional<int> n_layers, int windows_per_graph) {
    if (mel.ndim() != 2) {
        throw std::invalid_argument("mel must be float32 of shape (n_mels, n_frames)");
    }
    const float * data = mel.data();
    const int64_t n_mels = mel.shape(0), n_frames = mel.shape(1);
    std::vector<float> out;
    int64_t width = 0;
    {
        py::gil_scoped_release release;
        const auto m = qwen3_model::load(path, n_threads);
        if (n_mels != m->hp.audio.n_mels) {
            throw std::invalid_argument("mel has " + std::to_string(n_mels) + " bins; " + path + " takes " +
                                        std::to_string(m->hp.audio.n_mels));
        }
        out = qwen3_audio_encoder(*m, windows_per_graph).encode(data, n_frames, n_layers.value_or(-1));
        width = n_layers ? m->hp.audio.n_state : m->hp.audio.n_out;
    }
    py::array_t<float> result({static_cast<py::ssize_t>(out.size() / width), static_cast<py::ssize_t>(width)});
    std::copy(out.begin(), out.end(), result.mutable_data());
    return result;
}

}  // namespace

void register_qwen3_audio(py::module_ & m) {
    m.def("qwen3_audio_tower", &audio_tower, py::arg("path"), py::arg("mel"), py::kw_only(), py::arg("n_threads") = 0,
          py::arg("n_layers") = py::none(), py::arg("windows_per_graph") = 1,
          "Qwen3-ASR's audio tower: the vectors (A, n_out) float32 of a log-mel (n_mels, n_frames), with the weights "
          "of the GGUF at `path` (loaded for this call; n_threads 0 = default). n_layers: stop after that many "
          "layers and return the hidden states (A, n_state) before ln_post instead (0: the stem). "
          "windows_per_graph: attention windows (8 s each) computed by one graph.");
}

}  // namespace aural::bindings
