// The CPU level: which of ggml's CPU backend variants runs, which of its extra buffer types may hold
// weights, and the instruction set Aural's own CPU kernels (attention, GELU, int8 products) are capped to.
//
//   aural::configure_cpu({"haswell", {"AMX"}});   // before the first device use; throws once backends load
//   aural::ensure_backends_loaded();              // (backend.h) loads the chosen variant
//   if (aural::kernel_isa() >= aural::isa::avx512) { ... }
//
// A GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS build installs one libggml-cpu-<name>.so per x86-64 level
// (ggml/src/CMakeLists.txt: x64, sse42, ..., haswell, skylakex, icelake, zen4, sapphirerapids); each
// exports ggml_backend_score(), 0 where this CPU lacks the variant's instructions. A build with the CPU
// backend linked in has no variants: its one level is "built-in".
//
// Unconfigured, the variant is $AURAL_CPU_VARIANT or the best-scoring one, and AMX is left out (ggml's AMX
// buffer type and Aural's int8 tiles): tiles need OS and hypervisor support that CPUID does not prove, and
// ggml's AMX kernels as GCC 12 builds them raise SIGILL at their first TILELOADD (issue #16; cpu-probe.cpp
// says why). The Python side (aural.engine.cpu) probes both in a child process and configures the result.
//
// Thread-safety: configure_cpu() before any device use, from one thread; the readers are safe from any
// thread once the backends are loaded.
#pragma once

#include <string>
#include <vector>

namespace aural {

// Instruction sets Aural's own kernels are compiled for, in order: each implies those before it.
enum class isa : int { baseline = 0, avx2 = 1, avx512 = 2, avx512_vnni = 3 };
const char * isa_name(isa level);

struct cpu_variant {
    std::string name;  // ggml's tag, e.g. "haswell"
    std::string path;  // the shared object
    int score = 0;     // ggml_backend_score(): 0 when this CPU cannot run it
};

struct cpu_config {
    std::string variant;                     // "" = $AURAL_CPU_VARIANT, else the best score
    // Extra buffer types that must not hold weights, and "AURAL_AMX" where Aural's int8 products must not use
    // AMX tiles: both unvetted by default.
    std::vector<std::string> excluded_bufts = {"AMX", "AURAL_AMX"};
    std::string reason;                       // why, for `aural doctor` ("" = say how it was picked)
};

// The CPU variants this ggml build installed, best score first (empty for a build with the CPU linked in).
const std::vector<cpu_variant> & cpu_variants();

// The variant `want` names ("" = the best score), or null for a build with the CPU linked in. Throws
// std::invalid_argument when it is not installed or this CPU cannot run it.
const cpu_variant * cpu_variant_named(const std::string & want);

// Throws std::logic_error when the backends are already loaded with another variant.
void configure_cpu(const cpu_config & config);

// Loads every dynamic backend, of the CPU's variants the configured one; called by ensure_backends_loaded().
// Throws as cpu_variant_named() does.
void load_dynamic_backends();

// How one dynamic backend other than the CPU's loaded: its file, the registry it gave ("" when it did not
// load: a library it needs is missing) and ggml's warnings meanwhile (CUDA without a driver or GPU: "failed to
// initialize CUDA: ...").
struct backend_load {
    std::string file;
    std::string backend;
    std::string warnings;
};
std::vector<backend_load> dynamic_backend_loads();

// After loading: the variant in use ("built-in" without variants), and the reason it was chosen.
std::string cpu_variant_in_use();
std::string cpu_variant_reason();

// Whether an extra buffer type of ggml-cpu (by its name, "AMX", "CPU_REPACK") may hold weights.
bool buft_allowed(const std::string & name);

// The highest instruction set both this CPU and the loaded ggml variant have: Aural's kernels use
// nothing above it, so AURAL_CPU_VARIANT=haswell runs AVX2 code only, in ggml and in Aural alike.
isa kernel_isa();

// AVX-VNNI (VEX-encoded VPDPBUSD on 256-bit registers) where both this CPU and the loaded variant have it:
// ggml's alderlake variant (Alder Lake and later Intel client cores, Zen 5), not haswell, skylakex or icelake.
// It sits beside the isa line, not on it: Skylake-X has AVX-512 without it, Alder Lake has it without AVX-512.
bool kernel_avx_vnni();

// AMX tiles (TDPBUSD) for Aural's int8 products: where this CPU and the loaded variant have AMX-INT8, the OS
// granted the tile state (ARCH_REQ_XCOMP_PERM) and the configuration does not exclude "AURAL_AMX", which the
// CPU probe allows only after the tiles ran right in a child process (issue #16: a VM whose tiles raised
// SIGILL). On top of AVX-512 VNNI, which every AMX CPU has.
bool kernel_amx();

}  // namespace aural
