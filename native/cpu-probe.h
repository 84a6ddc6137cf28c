// The CPU probe: each weight type's matrix product run once in the CPU buffer and in each of ggml-cpu's
// extra buffer types (AMX, CPU_REPACK), checked against a float64 product; where the CPU has AMX, Aural's
// int8 product on AMX tiles too, under the name "AURAL_AMX" (type "i8"). A buffer type whose kernels
// fault (SIGILL from AMX tiles a hypervisor does not enable) kills the process, so it is run in a child
// process (aural.engine.cpu.probe) that names each case before running it.
//
//   auto results = aural::probe_cpu([](const std::string & buft, const std::string & type) { return true; });
//
// Thread-safety: one call at a time; it loads the backends (cpu.h) if they are not loaded yet.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace aural {

struct probe_result {
    std::string buft;      // buffer type name, "CPU", "AMX", "CPU_REPACK"
    std::string type;      // weight type, "f16", "q8_0", "q5_0", "q4_0"
    int batch = 0;         // activation columns
    double error = 0.0;    // largest |y - y64| / bound over the outputs: <= 1 passes
};

// Every buffer type ggml-cpu offers, the excluded ones (cpu_config) too: this is how they are vetted.
// Only the weight types each buffer type takes are run; on_start(buft, type) is called before each and
// returns whether to run it.
std::vector<probe_result> probe_cpu(const std::function<bool(const std::string &, const std::string &)> & on_start);

}  // namespace aural
