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
#include <memory>
#include <string>
#include <vector>

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

// The file's metadata, its tensors' descriptions (no data) in a new context at *tensors.
gguf_ptr open_gguf(const std::string & path, ggml_context ** tensors);

// A 32-bit integer key (u32, or i32 as written by some tools); `kind` names the model the file should hold.
uint32_t gguf_u32(gguf_context * meta, const std::string & key, const std::string & path, const char * kind);
std::vector<uint32_t> gguf_u32_array(gguf_context * meta, const std::string & key, const std::string & path,
                                     const char * kind);

// "[384, 1500]": a tensor's shape for error messages, ggml ne order.
std::string shape_str(const ggml_tensor * t);

}  // namespace aural
