// aural._native.SpeakerModel: CAM++ speaker embeddings on ggml's CPU backend.
#include "speaker-model.h"

#include <pybind11/numpy.h>

#include <stdexcept>
#include <string>

#include "bindings.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using float_array = py::array_t<float, py::array::c_style | py::array::forcecast>;

py::array_t<float> embed(speaker_model & self, const float_array & features) {
    if (features.ndim() != 2 || features.shape(1) != self.hp.n_mels) {
        throw std::invalid_argument("features must be float32 of shape (n_frames, " + std::to_string(self.hp.n_mels) +
                                    ")");
    }
    py::array_t<float> out(static_cast<py::ssize_t>(self.hp.n_embed));
    const float * data = features.data();
    float * dest = out.mutable_data();
    const int64_t n_frames = features.shape(0);
    {
        py::gil_scoped_release release;
        self.embed(data, n_frames, dest);
    }
    return out;
}

}  // namespace

void register_speaker(py::module_ & m) {
    py::class_<speaker_model>(m, "SpeakerModel",
                              "CAM++ speaker-embedding weights from a GGUF file, on the CPU. embed() may be called "
                              "from any thread; calls on one model run one at a time.")
        .def(py::init([](const std::string & path, int n_threads) {
                 py::gil_scoped_release release;
                 return speaker_model::load(path, n_threads);
             }),
             py::arg("path"), py::kw_only(), py::arg("n_threads") = 0,
             "Load `path` (written by aural.engine.speakers.campplus.convert); n_threads 0 = default.")
        .def("embed", &embed, py::arg("features"),
             "The embedding (n_embed,) float32 of one utterance's mean-normalised log-mel fbank (n_frames, n_mels).")
        .def_property_readonly("n_mels", [](const speaker_model & self) { return self.hp.n_mels; })
        .def_property_readonly("n_embed", [](const speaker_model & self) { return self.hp.n_embed; })
        .def_property_readonly_static("min_frames", [](py::object) { return speaker_model::min_frames(); },
                                      "The fewest frames embed() takes.")
        .def_property_readonly("n_threads", [](const speaker_model & self) { return self.n_threads; })
        .def_property_readonly("weights_bytes", [](const speaker_model & self) { return self.weights_bytes; })
        .def_property_readonly("compute_bytes", [](const speaker_model & self) { return self.compute_bytes.load(); },
                               "Bytes of the compute buffer, grown to the longest utterance embedded so far.")
        .def_property_readonly("path", [](const speaker_model & self) { return self.path; });
}

}  // namespace aural::bindings
