#include "gguf-file.h"

#include <stdexcept>

namespace aural {

gguf_ptr open_gguf(const std::string & path, ggml_context ** tensors) {
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

}  // namespace aural
