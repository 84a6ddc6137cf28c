// Backends and devices: what ggml offers here, and the one policy that picks where the model runs.
//
//   auto devs = aural::list_devices();                  // every device of every registered backend
//   ggml_backend_dev_t dev = aural::select_device("auto"); // best GPU, else an iGPU/accelerator, else CPU
//   auto types = aural::supported_weight_types(dev);    // {"f32","f16","q8_0",...}
//
// Thread-safety: all functions are safe to call from any thread after ggml's registry is loaded.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ggml-backend.h"

namespace aural {

struct device_info {
    std::string name;         // ggml device name, e.g. "CPU", "CUDA0", "Vulkan0"
    std::string description;  // human-readable, e.g. the GPU model
    std::string backend;      // the backend registry that owns it, e.g. "CPU", "CUDA"
    std::string type;         // "cpu" | "gpu" | "igpu" | "accel"
    bool software = false;    // a GPU API implemented on the CPU (is_software_device); type still says "gpu"
    size_t memory_free = 0;   // bytes
    size_t memory_total = 0;  // bytes
};

// Loads dynamically built backends (GGML_BACKEND_DL builds) once; a no-op for linked-in backends.
void ensure_backends_loaded();

std::vector<device_info> list_devices();
device_info describe_device(ggml_backend_dev_t dev);

// Whether `dev` is a software implementation of a GPU API on the CPU: Mesa's lavapipe ("llvmpipe") or
// Google's SwiftShader. ggml types every Vulkan device as a GPU or iGPU (it hides CPU-type ones unless
// GGML_VK_VISIBLE_DEVICES names them), and such a device runs Whisper slower than ggml's CPU backend.
bool is_software_device(ggml_backend_dev_t dev);

// A backend this build has that offers no device: loaded but found none (CUDA without a GPU or driver, Vulkan
// without a GPU, where ggml hides llvmpipe), or a backend library that did not load (`name` is then its file,
// e.g. libggml-cuda.so, and `detail` the dynamic loader's error). `detail`: ggml's warnings meanwhile, or "".
struct backend_problem {
    std::string name;
    bool loaded = false;
    std::string detail;
};
std::vector<backend_problem> backend_problems();

// The backend policy, in one place, with each decision logged (ref: whisper.cpp whisper_backend_init):
// "auto" -> the first discrete GPU, then an integrated GPU, else the CPU; software GPUs are skipped (logged).
// Accelerators (BLAS, AMX) hold no weights: they join every scheduler beside the primary device (see
// accelerators()).
// Otherwise `want` names a device ("CUDA0") or a backend ("cuda", "vulkan", "cpu"), case-insensitive.
// Throws std::invalid_argument naming the available devices when `want` matches none.
ggml_backend_dev_t select_device(const std::string & want);

// The most tokens one decoder graph may take on `dev` (longer batches are decoded in pieces this long):
// unlimited (UINT32_MAX) except on Vulkan, where it is 31. ggml-vulkan's flash attention switches to a
// mask pre-pass (ggml_vk_flash_attn: use_mask_opt, taken when the mask has >= 32 rows and > 32768
// elements) after which the next single-token step crashed the process inside the driver's queue thread
// (Mesa 22.3 llvmpipe, ggml-python 0.0.45: a 32-token prompt, then one token, with 5 sequences).
uint32_t decoder_ubatch_limit(ggml_backend_dev_t dev);

// Devices of type ACCEL (e.g. ggml's BLAS backend): the scheduler offers them the ops they take.
std::vector<ggml_backend_dev_t> accelerators();

// Weight types whose matrix product the device runs natively (probed with ggml_backend_dev_supports_op).
std::vector<std::string> supported_weight_types(ggml_backend_dev_t dev);

// CPU features ggml was built for and detected (SSE3, AVX2, F16C, NEON ...), name -> value.
std::map<std::string, std::string> cpu_features();
// The same for one backend registry, without loading anything (cpu.cpp reads it while loading).
std::map<std::string, std::string> backend_features(ggml_backend_reg_t reg);

// Whether `dev` runs `w` x activations with `w` held in `buft`: a matmul on a copy of `w`'s type and
// shape, bound to a zero-size buffer of that type, asks the device (ref: llama.cpp weight_buft_supported).
bool buft_runs_matmul(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, const ggml_tensor * w);

// Threads a CPU backend uses when the caller passes 0: the physical-core estimate of ggml's own examples.
int default_threads();

// Whether the environment variable `name` is set to something other than "" or "0" (debugging switches).
bool env_flag(const char * name);

// Sets the thread count of a backend that has one (CPU, BLAS); other backends ignore it.
void set_backend_threads(ggml_backend_t backend, int n_threads);
// Backends that can stop a graph between nodes (ggml-cpu, Metal) poll `flag` before each node; a set flag
// makes ggml_backend_sched_graph_compute return GGML_STATUS_ABORTED. No-op on backends without the hook.
void set_backend_abort_flag(ggml_backend_t backend, const std::atomic<bool> * flag);

// The backends one session computes on: the model's device, accelerators (BLAS) and, unless the device is
// the CPU itself, the CPU for the ops the device lacks; each with the session's threads and abort flag (none:
// nothing interrupts their graphs).
// Owned by one session (a context, a stream_batch); not shared.
class backend_set {
  public:
    backend_set(ggml_backend_dev_t dev, int n_threads, const std::atomic<bool> * abort_flag);
    ~backend_set();
    backend_set(const backend_set &) = delete;
    backend_set & operator=(const backend_set &) = delete;

    // A scheduler over them in priority order: the device, then accelerators, the CPU last; ops a backend
    // lacks fall back to the next.
    ggml_backend_sched_t make_sched(size_t max_nodes) const;

    ggml_backend_t primary = nullptr;
    ggml_backend_t cpu = nullptr;  // CPU fallback when the primary is not the CPU
    std::vector<ggml_backend_t> accel;
};

// Where the nodes of a graph really run: fallbacks to the CPU are reported, never silent.
struct backend_report {
    std::string primary;
    std::map<std::string, int> nodes_per_backend;
    std::vector<std::string> fallback_ops;  // distinct ops that left the primary backend
    int n_splits = 0;
};

// A scheduler's size for graphs of at most `graph_nodes` nodes: its hash set holds their nodes and leafs (as
// many again: inputs, weights, views) and the copies it adds between backends.
inline size_t sched_size(size_t graph_nodes) { return 4 * graph_nodes; }

// Bytes of the compute buffers `sched` holds, over all its backends.
size_t sched_buffer_bytes(ggml_backend_sched_t sched);

// Where the scheduler placed each node of `gf` (allocated on `sched`, made by `b`): nodes per backend, and the
// ops that fell back from the primary device to the CPU.
backend_report placement(const backend_set & b, ggml_backend_sched_t sched, ggml_cgraph * gf);

}  // namespace aural
