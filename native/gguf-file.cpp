#include "gguf-file.h"

#include <stdexcept>
#include <string>
#include <vector>
#include <sys/stat.h>

namespace aural {

gguf_ptr open_gguf(const std::string & path, ggml_context ** tensors) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw std::runtime_error(path + ": model file not found");
    }
    gguf_init_params params = {/*.no_alloc =*/ true, /*.ctx =*/ tensors};
    gguf_ptr meta(gguf_init_from_file(path.c_str(), params));
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
