// aural._native: the Whisper engine on ggml. Native errors become Python exceptions (ValueError for
// bad arguments, RuntimeError for failures, ContextFullError when the decoder's context is full,
// Interrupted (a RuntimeError) after Context.interrupt()).
#include <stdexcept>

#include "bindings.h"
#include "context.h"
#include "ggml.h"
#include "log.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
    m.doc() = "Aural's native Whisper engine on ggml (device-resident KV cache).";
    static py::exception<std::length_error> context_full(m, "ContextFullError", PyExc_ValueError);
    static py::exception<aural::interrupted_error> interrupted(m, "Interrupted", PyExc_RuntimeError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const std::length_error & e) {
            py::set_error(context_full, e.what());
        } catch (const aural::interrupted_error & e) {
            py::set_error(interrupted, e.what());
        }
    });

    m.def("ggml_version", [] { return std::string(ggml_version()); }, "Version of the ggml library in use.");
    m.def("set_log_level", &aural::set_log_level, py::arg("level"),
          "Native log threshold, in Python logging levels (10 debug, 20 info, 30 warning, 40 error).");
    m.def("get_log_level", &aural::get_log_level, "Current native log threshold (Python logging level).");
    aural::bindings::register_backend(m);
    aural::bindings::register_kernels(m);
    aural::bindings::register_logits(m);
    aural::bindings::register_model(m);
    aural::bindings::register_context(m);
    aural::bindings::register_speaker(m);
    aural::bindings::register_qwen3(m);
}
