#include "cpu.h"

#include <dlfcn.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "backend.h"
#include "ggml-backend.h"
#include "log.h"

namespace aural {

namespace fs = std::filesystem;

namespace {

std::mutex mutex;
cpu_config config;
bool loaded = false;
std::string in_use = "built-in";
std::string reason = "this ggml build links its CPU backend in (no variants to choose from)";
std::atomic<int> cap{-1};  // kernel_isa(), computed once the CPU backend is registered
std::atomic<bool> avx_vnni{false};  // kernel_avx_vnni(), set with cap
std::atomic<bool> amx_hw{false};     // the CPU, the variant and the OS run AMX-INT8 tiles, set with cap
std::atomic<bool> amx_allowed{false};  // "AURAL_AMX" is not among config.excluded_bufts
std::vector<backend_load> other_loads;  // load_other_backends(), once

// Where GGML_BACKEND_DL builds put their backends: the bin/ folder of the prefix ggml-python installed into
// (site-packages/bin, beside site-packages/lib and site-packages/ggml/lib, the two copies of libggml.so),
// beside libggml.so, or beside the executable (the bundle: packaging/aural.spec), as ggml itself looks.
std::vector<fs::path> backend_dirs() {
    std::vector<fs::path> dirs;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&ggml_backend_load), &info) != 0 && info.dli_fname) {
        const fs::path lib = fs::path(info.dli_fname).parent_path();
        dirs = {lib, lib.parent_path() / "bin", lib.parent_path().parent_path() / "bin"};
    }
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) dirs.push_back(exe.parent_path());
    return dirs;
}

// The shared objects named libggml-*.so in the backend folders (each file once, by name).
std::vector<fs::path> backend_files() {
    std::vector<fs::path> out;
    for (const fs::path & dir : backend_dirs()) {
        std::error_code ec;
        for (const auto & entry : fs::directory_iterator(dir, ec)) {
            const std::string file = entry.path().filename().string();
            const bool named = file.rfind("libggml-", 0) == 0 && entry.path().extension() == ".so";
            const bool seen = std::any_of(out.begin(), out.end(), [&](const fs::path & p) { return p.filename() == file; });
            if (named && !seen && file != "libggml-base.so") out.push_back(entry.path());
        }
    }
    return out;
}

// ggml_backend_score() of one variant's shared object; loading it runs none of its instructions.
int variant_score(const fs::path & path) {
    void * handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        AURAL_LOG_WARN("cannot load %s: %s", path.c_str(), dlerror());
        return 0;
    }
    using score_t = int (*)();
    auto score = reinterpret_cast<score_t>(dlsym(handle, "ggml_backend_score"));
    const int s = score ? score() : 0;
    dlclose(handle);
    return s;
}

std::string names(const std::vector<cpu_variant> & variants, bool runnable_only) {
    std::string out;
    for (const auto & v : variants) {
        if (!runnable_only || v.score > 0) out += (out.empty() ? "" : ", ") + v.name;
    }
    return out.empty() ? "none" : out;
}

struct kernel_caps {
    isa level = isa::baseline;
    bool avx_vnni = false;
    bool amx = false;
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// AMX-TILE and AMX-INT8 by CPUID (leaf 7: EDX bits 24 and 25), then the tile data state, which Linux grants
// per process on request (arch/x86/include/uapi/asm/prctl.h: ARCH_REQ_XCOMP_PERM; XTILEDATA is xfeature 18).
bool amx_granted() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
#if defined(__linux__)
    constexpr long req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return false;  // other systems grant the tile state their own way: not used there
#endif
}
#endif

kernel_caps compute_caps() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    if (!reg) return {};
    // The variant's compile-time features (ggml_cpu_has_*), and what this CPU and its OS run.
    const std::map<std::string, std::string> features = backend_features(reg);
    auto has = [&](const char * name) {
        auto it = features.find(name);
        return it != features.end() && it->second == "1";
    };
    const bool avx2 = has("AVX2") && has("FMA") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && has("AVX512") && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    const bool vnni = avx512 && has("AVX512_VNNI") && __builtin_cpu_supports("avx512vnni");
    return {vnni ? isa::avx512_vnni : avx512 ? isa::avx512 : avx2 ? isa::avx2 : isa::baseline,
            avx2 && has("AVX_VNNI") && __builtin_cpu_supports("avxvnni"), vnni && has("AMX_INT8") && amx_granted()};
#else
    return {};
#endif
}

// Every dynamic backend other than the CPU's (CUDA, Vulkan, BLAS ...): one libggml-<name>.so each. What ggml
// warns of meanwhile is kept for the report rather than printed: a CUDA build on a machine without a GPU or
// driver runs on the CPU, and says so where it is asked (aural doctor, a --backend that names the GPU).
void load_other_backends() {
    for (const fs::path & path : backend_files()) {
        const std::string file = path.filename().string();
        if (file.rfind("libggml-cpu", 0) == 0) continue;
        ggml_backend_reg_t reg = nullptr;
        const std::string warnings = capture_ggml_warnings([&] { reg = ggml_backend_load(path.c_str()); });
        other_loads.push_back({file, reg ? ggml_backend_reg_name(reg) : "", warnings});
        if (!reg || !warnings.empty()) {
            AURAL_LOG_INFO("backend %s: %s", file.c_str(), warnings.empty() ? "did not load" : warnings.c_str());
        }
    }
}

// How many installed variants this CPU runs.
size_t runnable() {
    const std::vector<cpu_variant> & v = cpu_variants();
    return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](const cpu_variant & c) { return c.score > 0; }));
}

}  // namespace

const char * isa_name(isa level) {
    switch (level) {
        case isa::avx2: return "avx2";
        case isa::avx512: return "avx512";
        case isa::avx512_vnni: return "avx512_vnni";
        default: return "baseline";
    }
}

const std::vector<cpu_variant> & cpu_variants() {
    // Scanned once: scoring dlopens every variant (14 files), and the files do not change under a process.
    static const std::vector<cpu_variant> variants = [] {
        std::vector<cpu_variant> out;
        const std::string prefix = "libggml-cpu-";
        for (const fs::path & path : backend_files()) {
            const std::string file = path.filename().string();
            if (file.rfind(prefix, 0) != 0) continue;
            const std::string name = file.substr(prefix.size(), file.size() - prefix.size() - 3);
            out.push_back({name, path.string(), variant_score(path)});
        }
        std::sort(out.begin(), out.end(), [](const cpu_variant & a, const cpu_variant & b) { return a.score > b.score; });
        return out;
    }();
    return variants;
}

const cpu_variant * cpu_variant_named(const std::string & want) {
    const std::vector<cpu_variant> & variants = cpu_variants();
    if (variants.empty()) {
        if (want.empty() || want == "built-in") return nullptr;
        throw std::invalid_argument("CPU variant '" + want + "' is not installed: this ggml build links one CPU "
                                    "backend in (rebuild with GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS)");
    }
    if (want.empty()) return &variants.front();  // best score first
    auto it = std::find_if(variants.begin(), variants.end(), [&](const cpu_variant & v) { return v.name == want; });
    if (it == variants.end()) {
        throw std::invalid_argument("no CPU variant '" + want + "'; installed: " + names(variants, false));
    }
    if (it->score == 0) {
        throw std::invalid_argument("CPU variant '" + want + "' needs instructions this CPU lacks; it runs: " +
                                    names(variants, true));
    }
    return &*it;
}

void configure_cpu(const cpu_config & c) {
    std::lock_guard<std::mutex> lock(mutex);
    // The variant cannot change once loaded; the buffer types are read at each model load.
    if (loaded && !c.variant.empty() && c.variant != in_use) {
        throw std::logic_error("the CPU variant is chosen before the first device use; '" + in_use +
                               "' is loaded already");
    }
    config = c;
    amx_allowed = std::find(c.excluded_bufts.begin(), c.excluded_bufts.end(), "AURAL_AMX") == c.excluded_bufts.end();
}

void load_dynamic_backends() {
    std::lock_guard<std::mutex> lock(mutex);
    if (loaded) return;
    load_other_backends();
    const char * env = std::getenv("AURAL_CPU_VARIANT");
    const std::string want = !config.variant.empty() ? config.variant : (env && *env ? env : "");
    if (const cpu_variant * chosen = cpu_variant_named(want)) {
        if (chosen->score == 0 || !ggml_backend_load(chosen->path.c_str())) {
            throw std::runtime_error("cannot load ggml's CPU backend " + chosen->path);
        }
        in_use = chosen->name;
        reason = !config.reason.empty()  ? config.reason
                 : !config.variant.empty() ? "chosen by the caller"
                 : !want.empty()           ? "AURAL_CPU_VARIANT=" + want
                                           : "the best of the " + std::to_string(runnable()) +
                                               " installed variants this CPU runs (ggml score " +
                                               std::to_string(chosen->score) + ")";
    }
    loaded = true;
    const kernel_caps caps = compute_caps();
    avx_vnni = caps.avx_vnni;
    amx_hw = caps.amx;
    cap = static_cast<int>(caps.level);
    AURAL_LOG_INFO("CPU variant %s (%s); Aural's kernels up to %s%s%s", in_use.c_str(), reason.c_str(),
                   isa_name(caps.level), caps.avx_vnni ? " and AVX-VNNI" : "", caps.amx ? " and AMX" : "");
}

std::vector<backend_load> dynamic_backend_loads() {
    std::lock_guard<std::mutex> lock(mutex);
    return other_loads;
}

std::string cpu_variant_in_use() {
    std::lock_guard<std::mutex> lock(mutex);
    return in_use;
}

std::string cpu_variant_reason() {
    std::lock_guard<std::mutex> lock(mutex);
    return reason;
}

bool buft_allowed(const std::string & name) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto & ex = config.excluded_bufts;
    return std::find(ex.begin(), ex.end(), name) == ex.end();
}

isa kernel_isa() {
    if (cap.load() < 0) {
        ensure_backends_loaded();
    }
    return static_cast<isa>(cap.load());
}

bool kernel_avx_vnni() {
    kernel_isa();  // loads the backends
    return avx_vnni.load();
}

bool kernel_amx() {
    kernel_isa();  // loads the backends
    return amx_hw.load() && amx_allowed.load();
}

}  // namespace aural
