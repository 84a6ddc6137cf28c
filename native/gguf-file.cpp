#include "gguf-file.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
#include <sys/stat.h>

namespace aural {

namespace {

// A forward-only reader of a GGUF header that reports, instead of failing, when the file ends early.
class header_walk {
public:
    header_walk(FILE * file, uint64_t size) : file_(file), left_(size) {}

    template <typename T> bool read(T & value) {
        if (left_ < sizeof(T) || std::fread(&value, sizeof(T), 1, file_) != 1) return false;
        left_ -= sizeof(T);
        return true;
    }

    // Skips `n` items of `item_bytes` each; false when the file holds fewer.
    bool skip(uint64_t n, uint64_t item_bytes) {
        if (item_bytes != 0 && n > left_ / item_bytes) return false;
        left_ -= n * item_bytes;
        return std::fseek(file_, static_cast<long>(n * item_bytes), SEEK_CUR) == 0;
    }

    bool string(std::string * out = nullptr) {
        uint64_t n = 0;
        if (!read(n) || n > left_) return false;
        if (!out) return skip(n, 1);
        out->resize(n);
        left_ -= n;
        return n == 0 || std::fread(out->data(), 1, n, file_) == n;
    }

private:
    FILE * file_;
    uint64_t left_;  // bytes of the file after the position
};

// Bytes of one value of a GGUF scalar type (gguf.h's enum gguf_type); 0 for a string, -1 for none.
int gguf_scalar_bytes(uint32_t type) {
    switch (type) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
        case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
        case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
        case GGUF_TYPE_STRING: return 0;
        default: return -1;
    }
}

bool skip_values(header_walk & walk, uint32_t type, uint64_t n) {
    const int bytes = gguf_scalar_bytes(type);
    if (bytes != 0) return bytes > 0 && walk.skip(n, bytes);
    for (uint64_t i = 0; i < n; ++i) {  // ends at the file's end: each string takes 8 bytes or more
        if (!walk.string()) return false;
    }
    return true;
}

// Throws where the pinned ggml's gguf reader (ggml-python 0.0.45) would end the process instead of returning null:
// - a tensor with a dimension of 0 (a legal shape, and one damaged byte away: tests/test_fuzz.py found it). The
//   reader checks that the element count fits in int64 by dividing INT64_MAX by dimensions 1-3: an integer
//   division by zero, SIGFPE on x86-64. No model of Aural's has an empty tensor.
// - a "general.alignment" of another type than uint32, which it reads with gguf_get_val_u32, an assertion.
// Upstream fixed both (llama.cpp PR #25596, July 2026); drop this when the pin moves past it. Walks the header as
// gguf.cpp reads it (version 2 or 3): the key-value pairs, then each tensor's name, dimension count and dimensions.
// Anything else wrong ends the walk quietly: gguf's own reader then reports it. Reads `file` from its position.
void reject_what_gguf_cannot(FILE * file, const std::string & path, uint64_t size) {
    header_walk walk(file, size);
    uint32_t magic = 0, version = 0;
    int64_t n_tensors = 0, n_kv = 0;
    if (!walk.read(magic) || std::memcmp(&magic, GGUF_MAGIC, 4) != 0 || !walk.read(version) ||
        (version != 2 && version != 3) || !walk.read(n_tensors) || !walk.read(n_kv)) {
        return;
    }
    for (int64_t i = 0; i < n_kv; ++i) {
        std::string key;
        uint32_t type = 0, item_type = 0;
        uint64_t n = 1;
        if (!walk.string(&key) || !walk.read(type)) return;
        if (key == GGUF_KEY_GENERAL_ALIGNMENT && type != GGUF_TYPE_UINT32) {
            throw std::runtime_error(path + ": '" GGUF_KEY_GENERAL_ALIGNMENT "' is not a uint32 (a damaged file?)");
        }
        if (type == GGUF_TYPE_ARRAY && !(walk.read(item_type) && walk.read(n))) return;
        if (!skip_values(walk, type == GGUF_TYPE_ARRAY ? item_type : type, n)) return;
    }
    for (int64_t i = 0; i < n_tensors; ++i) {
        std::string name;
        uint32_t n_dims = 0, type = 0;
        uint64_t offset = 0;
        if (!walk.string(&name) || name.size() >= GGML_MAX_NAME || !walk.read(n_dims) || n_dims > GGML_MAX_DIMS) {
            return;
        }
        for (uint32_t j = 0; j < n_dims; ++j) {
            int64_t ne = 0;
            if (!walk.read(ne)) return;
            if (ne == 0) {
                throw std::runtime_error(path + ": tensor '" + name + "' has a dimension of 0 (a damaged file?)");
            }
        }
        if (!walk.read(type) || !walk.read(offset)) return;
    }
}

}  // namespace

gguf_ptr open_gguf(const std::string & path, ggml_context ** tensors) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw std::runtime_error(path + ": model file not found");
    }
    // One open for both readers: the walk, then gguf's from the start again.
    file_ptr file(std::fopen(path.c_str(), "rb"));
    if (file) reject_what_gguf_cannot(file.get(), path, static_cast<uint64_t>(st.st_size));
    gguf_init_params params = {/*.no_alloc =*/ true, /*.ctx =*/ tensors};
    gguf_ptr meta(file && std::fseek(file.get(), 0, SEEK_SET) == 0 ? gguf_init_from_file_ptr(file.get(), params)
                                                                    : nullptr);
    if (!meta) {
        throw std::runtime_error(path + ": not a readable GGUF file (corrupt or truncated header)");
    }
    return meta;
}

uint32_t gguf_u32(gguf_context * meta, const std::string & key, const std::string & path, const char * kind) {
    const int64_t id = gguf_find_key(meta, key.c_str());
    if (id < 0) {
        throw std::runtime_error(path + ": missing key '" + key + "' (not an Aural " + kind + " GGUF?)");
    }
    switch (gguf_get_kv_type(meta, id)) {
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(meta, id);
        case GGUF_TYPE_INT32: return static_cast<uint32_t>(gguf_get_val_i32(meta, id));
        default: throw std::runtime_error(path + ": key '" + key + "' has the wrong type");
    }
}

std::vector<uint32_t> gguf_u32_array(gguf_context * meta, const std::string & key, const std::string & path,
                                     const char * kind) {
    const int64_t id = gguf_find_key(meta, key.c_str());
    if (id < 0 || gguf_get_kv_type(meta, id) != GGUF_TYPE_ARRAY) {
        throw std::runtime_error(path + ": missing array '" + key + "' (not an Aural " + kind + " GGUF?)");
    }
    const gguf_type type = gguf_get_arr_type(meta, id);
    if (type != GGUF_TYPE_UINT32 && type != GGUF_TYPE_INT32) {
        throw std::runtime_error(path + ": array '" + key + "' is not of 32-bit integers");
    }
    const auto * data = static_cast<const uint32_t *>(gguf_get_arr_data(meta, id));  // same bits for int32 >= 0
    return std::vector<uint32_t>(data, data + gguf_get_arr_n(meta, id));
}

std::string shape_str(const ggml_tensor * t) {
    std::string s = "[";
    for (int i = 0; i < ggml_n_dims(t); ++i) {
        s += (i ? ", " : "") + std::to_string(t->ne[i]);
    }
    return s + "]";
}

ggml_tensor * require_tensor(ggml_context * tensors, const std::string & name, std::initializer_list<int64_t> ne,
                             const std::string & path) {
    ggml_tensor * t = ggml_get_tensor(tensors, name.c_str());
    if (!t) {
        throw std::runtime_error(path + ": missing tensor '" + name + "'");
    }
    int i = 0;
    bool ok = ggml_n_dims(t) <= static_cast<int>(ne.size());
    std::string expected;
    for (int64_t want : ne) {
        expected += (i ? ", " : "") + std::to_string(want);
        ok = ok && t->ne[i++] == want;
    }
    if (!ok) {
        throw std::runtime_error(path + ": tensor '" + name + "' has shape " + shape_str(t) + ", expected [" +
                                 expected + "]");
    }
    return t;
}

ggml_backend_buffer_t read_weights(gguf_context * meta, ggml_context * tensors, ggml_backend_buffer_type_t buft,
                                   const std::string & path) {
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(tensors, buft);
    if (!buf) {
        throw std::runtime_error(path + ": cannot allocate the weights (out of memory?)");
    }
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    try {
        read_tensor_data(meta, tensors, path);
    } catch (...) {
        ggml_backend_buffer_free(buf);
        throw;
    }
    return buf;
}

std::vector<ggml_backend_buffer_t> allocate_weights(
    const std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> & groups, const std::string & path) {
    std::vector<ggml_backend_buffer_t> buffers;
    try {
        for (const auto & [buft, group] : groups) {
            const size_t align = ggml_backend_buft_get_alignment(buft);
            size_t size = align;  // room to align the first tensor
            for (const ggml_tensor * t : group) {
                size += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
            }
            ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, size);
            if (!buf) {
                throw std::runtime_error(path + ": cannot allocate " + std::to_string(size >> 20) + " MiB of weights in " +
                                         ggml_backend_buft_name(buft) + " (out of memory?)");
            }
            buffers.push_back(buf);
            ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            ggml_tallocr talloc = ggml_tallocr_new(buf);
            for (ggml_tensor * t : group) {
                if (ggml_tallocr_alloc(&talloc, t) != GGML_STATUS_SUCCESS) {
                    throw std::runtime_error(path + ": cannot place '" + ggml_get_name(t) + "' in " +
                                             ggml_backend_buft_name(buft));
                }
            }
        }
    } catch (...) {
        for (ggml_backend_buffer_t buf : buffers) ggml_backend_buffer_free(buf);
        throw;
    }
    return buffers;
}

void read_tensor_data(gguf_context * meta, ggml_context * tensors, const std::string & path) {
    file_ptr file(std::fopen(path.c_str(), "rb"));
    if (!file) {
        throw std::runtime_error(path + ": cannot open for reading");
    }
    const size_t data_offset = gguf_get_data_offset(meta);
    std::vector<uint8_t> staging;  // a device's tensor: read here, then uploaded
    for (int64_t i = 0; i < gguf_get_n_tensors(meta); ++i) {
        ggml_tensor * t = ggml_get_tensor(tensors, gguf_get_tensor_name(meta, i));
        const size_t nbytes = ggml_nbytes(t);
        const bool host = ggml_backend_buffer_is_host(t->buffer);
        if (!host) staging.resize(nbytes);
        void * into = host ? t->data : staging.data();
        if (std::fseek(file.get(), static_cast<long>(data_offset + gguf_get_tensor_offset(meta, i)), SEEK_SET) != 0 ||
            std::fread(into, 1, nbytes, file.get()) != nbytes) {
            throw std::runtime_error(path + ": truncated (tensor '" + ggml_get_name(t) + "' is cut short)");
        }
        if (!host) ggml_backend_tensor_set(t, staging.data(), 0, nbytes);
    }
}

}  // namespace aural
