// Reading Aural's GGUF files, shared by the loaders of the Whisper model (model.cpp) and of the CAM++
// speaker model (speaker-model.cpp): owning handles, and checked reads of metadata, since gguf's getters
// abort on a missing key or a type mismatch where a damaged file must raise an error naming the file.
//
//   ggml_context * tensors = nullptr;
//   gguf_ptr meta = open_gguf(path, &tensors);                 // throws std::runtime_error naming `path`
//   uint32_t n = gguf_u32(meta.get(), "whisper.n_mels", path, "Whisper");
//
// Thread-safety: free functions over the caller's handles.
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"

namespace aural {

struct gguf_deleter {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
using gguf_ptr = std::unique_ptr<gguf_context, gguf_deleter>;

struct file_closer {
    void operator()(FILE * f) const { std::fclose(f); }
};
using file_ptr = std::unique_ptr<FILE, file_closer>;

// The file's metadata, its tensors' descriptions (no data) in a new context at *tensors. Throws
// std::runtime_error naming `path`: "model file not found", not a readable GGUF, or damage that the pinned
// gguf reader would end the process on (a zero dimension, a wrong-typed alignment).
gguf_ptr open_gguf(const std::string & path, ggml_context ** tensors);

// A 32-bit integer key (u32, or i32 as written by some tools); `kind` names the model the file should hold.
uint32_t gguf_u32(gguf_context * meta, const std::string & key, const std::string & path, const char * kind);
std::vector<uint32_t> gguf_u32_array(gguf_context * meta, const std::string & key, const std::string & path,
                                     const char * kind);

// "[384, 1500]": a tensor's shape for error messages, ggml ne order.
std::string shape_str(const ggml_tensor * t);

// The tensor `name` of `tensors`, of shape `ne` (ggml order; trailing dimensions of 1 may be left out).
// Throws std::runtime_error naming `path` when it is missing or of another shape.
ggml_tensor * require_tensor(ggml_context * tensors, const std::string & name, std::initializer_list<int64_t> ne,
                             const std::string & path);

// Allocates every tensor of `tensors` in one buffer of `buft` and reads each one from the file (read_tensor_data).
// Returns the buffer, marked as weights; throws naming `path`.
ggml_backend_buffer_t read_weights(gguf_context * meta, ggml_context * tensors, ggml_backend_buffer_type_t buft,
                                   const std::string & path);

// Allocates each group of tensors (buffer type -> tensors) in one buffer of its type, marked as weights; the
// caller frees them. Throws naming `path` when one cannot be had.
std::vector<ggml_backend_buffer_t> allocate_weights(
    const std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> & groups, const std::string & path);

// Reads every tensor of the file into its allocated twin in `tensors`: straight into place in host memory (the
// CPU's), through a staging copy into a device's. Throws naming `path` when the file is cut short.
void read_tensor_data(gguf_context * meta, ggml_context * tensors, const std::string & path);

}  // namespace aural
