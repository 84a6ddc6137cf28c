#include "backend.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "cpu.h"
#include "ggml.h"
#include "log.h"

namespace aural {

namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

// ggml's log lines as one line: "a\nb" -> "a; b".
std::string one_line(std::string text) {
    for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at)) text.replace(at, 1, "; ");
    return text;
}

const char * type_name(enum ggml_backend_dev_type type) {
    switch (type) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default: return "other";
    }
}

// The first device of `type`; with `skip_software`, the first that is not a software GPU (each skipped one logged).
ggml_backend_dev_t first_of_type(enum ggml_backend_dev_type type, bool skip_software = false) {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) != type) {
            continue;
        }
        if (skip_software && is_software_device(dev)) {
            AURAL_LOG_INFO("auto: skipping %s (%s): a software %s device that runs on the CPU, slower than the "
                           "CPU backend; name it to use it anyway", ggml_backend_dev_name(dev),
                           ggml_backend_dev_description(dev), ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)));
            continue;
        }
        return dev;
    }
    return nullptr;
}

std::string available_names() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        names += (i ? ", " : "");
        names += ggml_backend_dev_name(ggml_backend_dev_get(i));
    }
    for (const backend_problem & p : backend_problems()) {
        names += p.loaded ? "; the " + p.name + " backend found no device" : "; " + p.name + " did not load";
        if (!p.detail.empty()) {
            names += " (" + p.detail + ")";
        }
        if (p.name == "Vulkan") {
            names += " (ggml lists a CPU-type one, such as Mesa's llvmpipe, only when GGML_VK_VISIBLE_DEVICES names it)";
        }
    }
    return names;
}

}  // namespace

void ensure_backends_loaded() {
    static std::once_flag once;
    std::call_once(once, [] {
        install_ggml_log_sink();
        load_dynamic_backends();  // GGML_BACKEND_DL builds (cpu.h); linked ones are already registered
    });
}

uint32_t decoder_ubatch_limit(ggml_backend_dev_t dev) {
    const std::string reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
    return reg == "Vulkan" ? 31 : UINT32_MAX;
}

bool is_software_device(ggml_backend_dev_t dev) {
    // note: ggml keeps Vulkan's VkPhysicalDeviceType to itself and Aural links no Vulkan, so the device
    // name is what tells: Mesa names lavapipe's device "llvmpipe (LLVM <version>, <bits> bits)", SwiftShader
    // "SwiftShader Device (<JIT>)".
    const std::string desc = ggml_backend_dev_description(dev);
    return ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU &&
           (desc.rfind("llvmpipe", 0) == 0 || desc.rfind("SwiftShader", 0) == 0);
}

std::vector<backend_problem> backend_problems() {
    ensure_backends_loaded();
    const std::vector<backend_load> loads = dynamic_backend_loads();
    std::vector<backend_problem> out;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        if (ggml_backend_reg_dev_count(reg) > 0) continue;
        const std::string name = ggml_backend_reg_name(reg);
        auto load = std::find_if(loads.begin(), loads.end(), [&](const backend_load & l) { return l.backend == name; });
        out.push_back({name, true, load == loads.end() ? "" : one_line(load->warnings)});
    }
    for (const backend_load & load : loads) {
        if (load.backend.empty()) out.push_back({load.file, false, one_line(load.warnings)});
    }
    return out;
}

device_info describe_device(ggml_backend_dev_t dev) {
    device_info info;
    info.name = ggml_backend_dev_name(dev);
    info.description = ggml_backend_dev_description(dev);
    info.backend = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
    info.type = type_name(ggml_backend_dev_type(dev));
    info.software = is_software_device(dev);
    ggml_backend_dev_memory(dev, &info.memory_free, &info.memory_total);
    return info;
}

std::vector<device_info> list_devices() {
    ensure_backends_loaded();
    std::vector<device_info> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        out.push_back(describe_device(ggml_backend_dev_get(i)));
    }
    return out;
}

ggml_backend_dev_t select_device(const std::string & want) {
    ensure_backends_loaded();
    const std::string w = lower(want.empty() ? "auto" : want);
    if (w == "auto") {
        for (auto type : {GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU}) {
            if (ggml_backend_dev_t dev = first_of_type(type, /*skip_software=*/true)) {
                AURAL_LOG_INFO("auto: using %s device %s (%s)", type_name(type), ggml_backend_dev_name(dev),
                               ggml_backend_dev_description(dev));
                return dev;
            }
        }
        ggml_backend_dev_t cpu = first_of_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (!cpu) {
            throw std::runtime_error("no ggml device found, not even the CPU");
        }
        AURAL_LOG_INFO("auto: no GPU found, using the CPU");
        return cpu;
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const std::string reg = lower(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)));
        if (lower(ggml_backend_dev_name(dev)) == w || reg == w) {
            AURAL_LOG_INFO("requested '%s': using device %s (%s)", want.c_str(), ggml_backend_dev_name(dev),
                           ggml_backend_dev_description(dev));
            return dev;
        }
    }
    throw std::invalid_argument("no backend or device named '" + want + "'; available: " + available_names());
}

std::vector<ggml_backend_dev_t> accelerators() {
    ensure_backends_loaded();
    std::vector<ggml_backend_dev_t> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_ACCEL) {
            out.push_back(dev);
        }
    }
    return out;
}

std::vector<std::string> supported_weight_types(ggml_backend_dev_t dev) {
    // Probe a [256 x 32] weight times [256 x 8] activations, the shape class of Whisper's projections.
    static const std::pair<const char *, ggml_type> candidates[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"q8_0", GGML_TYPE_Q8_0},
        {"q5_0", GGML_TYPE_Q5_0}, {"q4_0", GGML_TYPE_Q4_0},
    };
    ggml_init_params params = {/*.mem_size =*/ 16 * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                               /*.no_alloc =*/ true};
    std::vector<std::string> out;
    for (const auto & [name, type] : candidates) {
        ggml_context * ctx = ggml_init(params);
        ggml_tensor * w = ggml_new_tensor_2d(ctx, type, 256, 32);
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 8);
        ggml_tensor * y = ggml_mul_mat(ctx, w, x);
        if (ggml_backend_dev_supports_op(dev, y)) {
            out.emplace_back(name);
        }
        ggml_free(ctx);
    }
    return out;
}

std::map<std::string, std::string> cpu_features() {
    ensure_backends_loaded();
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    return reg ? backend_features(reg) : std::map<std::string, std::string>{};
}

std::map<std::string, std::string> backend_features(ggml_backend_reg_t reg) {
    std::map<std::string, std::string> out;
    using get_features_t = ggml_backend_feature * (*)(ggml_backend_reg_t);
    auto get_features = reinterpret_cast<get_features_t>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
    for (ggml_backend_feature * f = get_features ? get_features(reg) : nullptr; f && f->name; ++f) {
        out[f->name] = f->value;
    }
    return out;
}

bool buft_runs_matmul(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, const ggml_tensor * w) {
    ggml_init_params params = {/*.mem_size =*/ 3 * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                               /*.no_alloc =*/ true};
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * probe = ggml_dup_tensor(ctx, w);
    ggml_tensor * y = ggml_mul_mat(ctx, probe, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 8));
    ggml_backend_buffer_t empty = ggml_backend_buft_alloc_buffer(buft, 0);
    probe->buffer = empty;
    const bool ok = ggml_backend_dev_supports_op(dev, y);
    ggml_backend_buffer_free(empty);
    ggml_free(ctx);
    return ok;
}

int default_threads() {
    // Whisper's matrix products saturate physical cores; SMT siblings add little (ref: whisper.cpp
    // cli default min(4, hardware_concurrency)). Use every logical core up to 8.
    const unsigned hc = std::thread::hardware_concurrency();
    return static_cast<int>(std::clamp(hc == 0 ? 4u : hc, 1u, 8u));
}

bool env_flag(const char * name) {
    const char * v = std::getenv(name);
    return v && *v && std::string(v) != "0";
}

namespace {

// A backend's optional entry point `name` (ggml_backend_reg_get_proc_address), cast to F; null if it has none.
template <typename F> F backend_proc(ggml_backend_t backend, const char * name) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    return reg ? reinterpret_cast<F>(ggml_backend_reg_get_proc_address(reg, name)) : nullptr;
}

}  // namespace

void set_backend_threads(ggml_backend_t backend, int n_threads) {
    if (auto fn = backend_proc<ggml_backend_set_n_threads_t>(backend, "ggml_backend_set_n_threads")) {
        fn(backend, n_threads);
    }
}

void set_backend_abort_flag(ggml_backend_t backend, const std::atomic<bool> * flag) {
    if (auto fn = backend_proc<ggml_backend_set_abort_callback_t>(backend, "ggml_backend_set_abort_callback")) {
        fn(backend, [](void * data) { return static_cast<const std::atomic<bool> *>(data)->load(); },
           const_cast<std::atomic<bool> *>(flag));
    }
}

backend_set::backend_set(ggml_backend_dev_t dev, int n_threads, const std::atomic<bool> * abort_flag) {
    auto own = [&](ggml_backend_t b) {
        set_backend_threads(b, n_threads);
        if (abort_flag) set_backend_abort_flag(b, abort_flag);  // none: nothing interrupts this set's graphs
        return b;
    };
    primary = ggml_backend_dev_init(dev, nullptr);
    if (!primary) {
        throw std::runtime_error(std::string("cannot initialise backend ") + ggml_backend_dev_name(dev));
    }
    own(primary);
    if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
        cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
        if (!cpu) {
            ggml_backend_free(primary);
            throw std::runtime_error("cannot initialise the CPU backend");
        }
        own(cpu);
    }
    for (ggml_backend_dev_t a : accelerators()) {
        if (ggml_backend_t b = ggml_backend_dev_init(a, nullptr)) {
            accel.push_back(own(b));
            AURAL_LOG_INFO("accelerator %s joins the scheduler", ggml_backend_dev_name(a));
        }
    }
}

backend_set::~backend_set() {
    for (ggml_backend_t b : accel) ggml_backend_free(b);
    if (cpu) ggml_backend_free(cpu);
    if (primary) ggml_backend_free(primary);
}

ggml_backend_sched_t backend_set::make_sched(size_t max_nodes) const {
    // With no GPU the primary device is the CPU itself.
    std::vector<ggml_backend_t> order;
    if (cpu) {
        order.push_back(primary);
    }
    order.insert(order.end(), accel.begin(), accel.end());
    order.push_back(cpu ? cpu : primary);
    ggml_backend_sched_t s = ggml_backend_sched_new(order.data(), nullptr, static_cast<int>(order.size()), max_nodes,
                                                    /*parallel=*/false, /*op_offload=*/true);
    if (!s) {
        throw std::runtime_error("cannot create the ggml scheduler");
    }
    return s;
}

size_t sched_buffer_bytes(ggml_backend_sched_t sched) {
    size_t n = 0;
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        n += ggml_backend_sched_get_buffer_size(sched, ggml_backend_sched_get_backend(sched, i));
    }
    return n;
}

backend_report placement(const backend_set & b, ggml_backend_sched_t sched, ggml_cgraph * gf) {
    backend_report r;
    r.primary = ggml_backend_name(b.primary);
    r.n_splits = ggml_backend_sched_get_n_splits(sched);
    std::set<std::string> fallback;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        if (ggml_is_empty(node) || node->op == GGML_OP_NONE || node->op == GGML_OP_VIEW ||
            node->op == GGML_OP_RESHAPE || node->op == GGML_OP_PERMUTE || node->op == GGML_OP_TRANSPOSE) {
            continue;
        }
        ggml_backend_t node_backend = ggml_backend_sched_get_tensor_backend(sched, node);
        const std::string name = node_backend ? ggml_backend_name(node_backend) : "?";
        r.nodes_per_backend[name]++;
        if (node_backend && node_backend == b.cpu) {  // accelerators taking ops is the plan, the CPU a fallback
            fallback.insert(ggml_op_desc(node));
        }
    }
    r.fallback_ops.assign(fallback.begin(), fallback.end());
    return r;
}

}  // namespace aural
