// Registration functions of the `aural._native` module, one per wrapped class or group.
#pragma once

#include <pybind11/pybind11.h>

namespace aural::bindings {

void register_backend(pybind11::module_ & m);  // devices, backend policy, CPU features, quantisation
void register_kernels(pybind11::module_ & m);  // Aural's CPU kernels alone, for float64-reference tests
void register_logits(pybind11::module_ & m);  // top-k log-probabilities of decoder logits
void register_model(pybind11::module_ & m);
void register_context(pybind11::module_ & m);
void register_speaker(pybind11::module_ & m);  // CAM++ speaker embeddings
void register_qwen3(pybind11::module_ & m);    // Qwen3-ASR's text decoder and its KV arena

}  // namespace aural::bindings
