// Devices, the backend policy, CPU features and ggml's quantiser.
#include "backend.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "attention.h"
#include "bindings.h"
#include "cpu-probe.h"
#include "cpu.h"
#include "int8-matmul.h"
#include "ggml.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

py::dict device_dict(const device_info & d) {
    py::dict out;
    out["name"] = d.name;
    out["description"] = d.description;
    out["backend"] = d.backend;
    out["type"] = d.type;
    out["software"] = d.software;
    out["memory_free"] = d.memory_free;
    out["memory_total"] = d.memory_total;
    return out;
}

ggml_type quant_type(const std::string & name) {
    if (name == "q8_0") return GGML_TYPE_Q8_0;
    if (name == "q5_0") return GGML_TYPE_Q5_0;
    if (name == "q4_0") return GGML_TYPE_Q4_0;
    throw std::invalid_argument("quantisation type must be one of q8_0, q5_0, q4_0, not '" + name + "'");
}

// ggml's own quantiser, so converted files match what the kernels expect bit for bit.
py::array_t<uint8_t> quantize(py::array_t<float, py::array::c_style | py::array::forcecast> data,
                              const std::string & type_name) {
    if (data.ndim() != 2) {
        throw std::invalid_argument("quantize takes a 2-D float32 array (rows, cols)");
    }
    const ggml_type type = quant_type(type_name);
    const int64_t rows = data.shape(0), cols = data.shape(1);
    if (cols % ggml_blck_size(type) != 0) {
        throw std::invalid_argument("row length " + std::to_string(cols) + " is not a multiple of the block size " +
                                    std::to_string(ggml_blck_size(type)));
    }
    const size_t row_bytes = ggml_row_size(type, cols);
    py::array_t<uint8_t> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(row_bytes)});
    const float * src = data.data();
    uint8_t * dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        ggml_quantize_chunk(type, src, dst, 0, rows, cols, nullptr);
    }
    return out;
}

}  // namespace

void register_backend(py::module_ & m) {
    m.def("devices", [] {
        py::list out;
        for (const auto & d : list_devices()) out.append(device_dict(d));
        return out;
    }, "Every device of every registered ggml backend: name, description, backend, type, memory.");
    m.def("backend_problems", [] {
        py::list out;
        for (const auto & p : backend_problems()) {
            py::dict d;
            d["name"] = p.name;
            d["loaded"] = p.loaded;
            d["detail"] = p.detail;
            out.append(d);
        }
        return out;
    }, "Backends of this build that offer no device: {name, loaded, detail}. loaded: the backend registered and "
       "found no device (CUDA without a GPU or driver; Vulkan without a GPU, where ggml hides llvmpipe); else "
       "name is a backend library that did not load. detail: ggml's warnings meanwhile (why), or ''.");
    m.def("select_device", [](const std::string & want) {
        return std::string(ggml_backend_dev_name(select_device(want)));
    }, py::arg("want") = "auto", "The device the backend policy picks for `want` (logged).");
    m.def("supported_weight_types", [](const std::string & device) {
        return supported_weight_types(select_device(device));
    }, py::arg("device"), "Weight types whose matrix product `device` runs natively.");
    m.def("cpu_features", &cpu_features, "CPU features of ggml's CPU backend, name -> value.");
    m.def("cpu_kernels", [] {
        return std::map<std::string, bool>{{"int8_matmul", int8_matmul_available()},
                                           {"encoder_attention", encoder_attention_available()}};
    }, "Which of Aural's own CPU kernels run at this CPU level (cpu_level()['kernel_isa']): int8 matrix "
       "products (AVX2, AVX-VNNI or AVX-512 VNNI) and the encoder's self-attention (AVX2 or AVX-512).");
    m.def("cpu_variants", [] {
        py::list out;
        for (const auto & v : cpu_variants()) {
            py::dict d;
            d["name"] = v.name;
            d["path"] = v.path;
            d["score"] = v.score;
            out.append(d);
        }
        return out;
    }, "ggml's installed CPU variants, best score first; score 0: this CPU cannot run it. Empty when the "
       "CPU backend is linked in.");
    m.def("check_cpu_variant", [](const std::string & name) { cpu_variant_named(name); }, py::arg("name"),
          "Raises ValueError when ggml's CPU variant `name` is not installed or this CPU cannot run it.");
    m.def("configure_cpu", [](const std::string & variant, const std::vector<std::string> & excluded_bufts,
                              const std::string & reason) { configure_cpu({variant, excluded_bufts, reason}); },
          py::arg("variant") = "", py::arg("excluded_bufts") = std::vector<std::string>{"AMX"},
          py::arg("reason") = "",
          "Choose the CPU level before the first device use: the variant ('' = $AURAL_CPU_VARIANT, else the "
          "best score), the extra buffer types that must not hold weights, and why (for aural doctor).");
    m.def("cpu_level", [] {
        const isa level = kernel_isa();  // loads the backends
        py::dict d;
        d["variant"] = cpu_variant_in_use();
        d["reason"] = cpu_variant_reason();
        d["kernel_isa"] = std::string(isa_name(level));
        d["int8_kernel"] = std::string(int8_kernel_name());
        return d;
    }, "The CPU variant in use, why it was chosen, the instruction set Aural's kernels are capped to, and the "
       "int8 product kernel it runs (avx512_vnni, avx_vnni, avx2 or none).");
    m.def("probe_cpu", [](const py::function & on_start) {
        py::list out;
        for (const auto & r : probe_cpu([&](const std::string & buft, const std::string & type) {
                 return on_start(buft, type).cast<bool>();
             })) {
            py::dict d;
            d["buft"] = r.buft;
            d["type"] = r.type;
            d["batch"] = r.batch;
            d["error"] = r.error;
            out.append(d);
        }
        return out;
    }, py::arg("on_start"),
       "Each weight type's product in the CPU buffer and every extra buffer type that takes it, against float64 "
       "(error <= 1 passes); on_start(buft, type) is called before each and returns whether to run it. May kill "
       "the process: run it in a child (aural.engine.cpu.probe).");
    m.def("default_threads", &default_threads, "CPU threads used when 0 is passed.");
    m.def("quantize", &quantize, py::arg("data"), py::arg("type"),
          "Quantise a (rows, cols) float32 array with ggml; returns (rows, row_bytes) uint8.");
}

}  // namespace aural::bindings
