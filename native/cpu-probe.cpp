#include "cpu-probe.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <stdexcept>

#include "backend.h"
#include "cpu.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "int8-matmul.h"

namespace aural {

namespace {

// [k x n] weights times [k x batch] activations: k = 256 is 8 quant blocks, n = 64 rows fills AMX's
// 32-row kernels twice and CPU_REPACK's 8-row interleave; batch 1 and 32 take the vector and tile paths.
constexpr int64_t k_in = 256, n_out = 64;
constexpr int batches[] = {1, 32};

struct ctx_deleter {
    void operator()(ggml_context * c) const { ggml_free(c); }
};
struct buffer_deleter {
    void operator()(ggml_backend_buffer_t b) const { ggml_backend_buffer_free(b); }
};
struct backend_deleter {
    void operator()(ggml_backend_t b) const { ggml_backend_free(b); }
};
using ctx_ptr = std::unique_ptr<ggml_context, ctx_deleter>;
using buffer_ptr = std::unique_ptr<ggml_backend_buffer, buffer_deleter>;

ctx_ptr new_ctx(int n_tensors) {
    ggml_init_params params = {/*.mem_size =*/ n_tensors * ggml_tensor_overhead() + ggml_graph_overhead(),
                               /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true};
    return ctx_ptr(ggml_init(params));
}

// The weights as stored (ggml's quantiser, as converted models are) and as the float64 reference sees them.
std::vector<uint8_t> stored_weights(ggml_type type, const std::vector<float> & w, std::vector<float> & seen) {
    std::vector<uint8_t> bytes(ggml_row_size(type, k_in) * n_out);
    if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(w.data(), reinterpret_cast<ggml_fp16_t *>(bytes.data()), k_in * n_out);
    } else {
        ggml_quantize_chunk(type, w.data(), bytes.data(), 0, n_out, k_in, nullptr);
    }
    seen.resize(w.size());
    ggml_get_type_traits(type)->to_float(bytes.data(), seen.data(), k_in * n_out);
    return bytes;
}

// The largest |y - y64| over its bound. Activations are rounded to the kernel's vec_dot type (f16, or q8
// blocks of 32 with one scale: a step of amax / 127), so each product term is off by at most
// |w_k| max|x| / 127 (plus f32 summation, far smaller): the bound sums that over k.
double worst_error(const std::vector<float> & w, const std::vector<float> & x, const std::vector<float> & y,
                   int batch) {
    double worst = 0.0;
    for (int m = 0; m < batch; ++m) {
        const float * xm = x.data() + m * k_in;
        double xmax = 0.0;
        for (int64_t k = 0; k < k_in; ++k) xmax = std::max(xmax, std::fabs(double(xm[k])));
        for (int64_t n = 0; n < n_out; ++n) {
            const float * wn = w.data() + n * k_in;
            double exact = 0.0, bound = 1e-6;
            for (int64_t k = 0; k < k_in; ++k) {
                exact += double(wn[k]) * xm[k];
                bound += std::fabs(double(wn[k])) * xmax / 127.0;
            }
            const double got = y[m * n_out + n];
            worst = std::max(worst, std::isfinite(got) ? std::fabs(got - exact) / bound : INFINITY);
        }
    }
    return worst;
}

probe_result run_case(ggml_backend_t backend, ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft,
                      ggml_type type, int batch, std::mt19937 & rng) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> w(k_in * n_out), x(k_in * batch), seen;
    for (float & v : w) v = uniform(rng);
    for (float & v : x) v = uniform(rng);
    const std::vector<uint8_t> bytes = stored_weights(type, w, seen);

    ctx_ptr wctx = new_ctx(1), xctx = new_ctx(3);
    ggml_tensor * wt = ggml_new_tensor_2d(wctx.get(), type, k_in, n_out);
    ggml_tensor * xt = ggml_new_tensor_2d(xctx.get(), GGML_TYPE_F32, k_in, batch);
    ggml_tensor * yt = ggml_mul_mat(xctx.get(), wt, xt);
    probe_result r{ggml_backend_buft_name(buft), ggml_type_name(type), batch};
    buffer_ptr wbuf(ggml_backend_alloc_ctx_tensors_from_buft(wctx.get(), buft));
    buffer_ptr xbuf(ggml_backend_alloc_ctx_tensors_from_buft(xctx.get(), ggml_backend_dev_buffer_type(dev)));
    if (!wbuf || !xbuf) {
        throw std::runtime_error(std::string("probe: cannot allocate in ") + ggml_backend_buft_name(buft));
    }
    ggml_backend_buffer_set_usage(wbuf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_set(wt, bytes.data(), 0, bytes.size());  // extra buffer types repack here
    ggml_backend_tensor_set(xt, x.data(), 0, x.size() * sizeof(float));
    ggml_cgraph * gf = ggml_new_graph(xctx.get());
    ggml_build_forward_expand(gf, yt);
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error(std::string("probe: the product failed in ") + ggml_backend_buft_name(buft));
    }
    std::vector<float> y(n_out * batch);
    ggml_backend_tensor_get(yt, y.data(), 0, y.size() * sizeof(float));
    r.error = worst_error(seen, x, y, batch);
    return r;
}

// Aural's int8 product (int8-matmul.h) on AMX tiles, vetted apart from ggml's AMX buffer type as "AURAL_AMX":
// on Debian 12's GCC 12 ggml's kernels raise SIGILL on a machine where tiles work. Its _tile_loadconfig
// intrinsic names 8 of the configuration's 64 bytes as the instruction's operand, so the stores of the tile
// shapes are dropped as dead and TILELOADD finds tmm0 unconfigured (disassembly of ggml_backend_amx_mul_mat
// in libggml-cpu-sapphirerapids.so: one byte stored, then LDTILECFG; llama.cpp PR #26954).
// Rounding: weights to one step s_w = max|w_row| / 127 per row, activations to s_x = max|x_col| / 127 per
// column, so each product term is off by at most |x| s_w / 2 + |w| s_x / 2 + s_w s_x / 4; the bound sums that.
probe_result run_int8_case(ggml_backend_t backend, ggml_backend_dev_t dev, int batch, std::mt19937 & rng) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> w(k_in * n_out), x(k_in * batch);
    for (float & v : w) v = uniform(rng);
    for (float & v : x) v = uniform(rng);
    const int64_t n_panels = (n_out + int8_panel_rows - 1) / int8_panel_rows;
    std::vector<int8_t> packed(int8_panel_bytes(k_in) * n_panels);
    int8_pack(w.data(), n_out, k_in, packed.data());

    ctx_ptr ctx = new_ctx(4);
    ggml_tensor * wt = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_I8, int8_panel_bytes(k_in), n_panels);
    ggml_tensor * xt = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, k_in, batch);
    ggml_tensor * yt = int8_matmul(ctx.get(), wt, n_out, xt);
    buffer_ptr buf(ggml_backend_alloc_ctx_tensors_from_buft(ctx.get(), ggml_backend_dev_buffer_type(dev)));
    if (!buf) throw std::runtime_error("probe: cannot allocate the int8 product");
    ggml_backend_tensor_set(wt, packed.data(), 0, packed.size());
    ggml_backend_tensor_set(xt, x.data(), 0, x.size() * sizeof(float));
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, yt);
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("probe: the int8 product failed");
    }
    std::vector<float> y(n_out * batch);
    ggml_backend_tensor_get(yt, y.data(), 0, y.size() * sizeof(float));
    auto step = [](const float * v, int64_t n) {
        double m = 0.0;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(v[i])));
        return m / 127.0;
    };
    probe_result r{"AURAL_AMX", "i8", batch};
    for (int m = 0; m < batch; ++m) {
        const float * xm = x.data() + m * k_in;
        const double sx = step(xm, k_in);
        for (int64_t n = 0; n < n_out; ++n) {
            const float * wn = w.data() + n * k_in;
            const double sw = step(wn, k_in);
            double exact = 0.0, bound = 1e-6;
            for (int64_t k = 0; k < k_in; ++k) {
                exact += double(wn[k]) * xm[k];
                bound += std::fabs(double(xm[k])) * sw / 2 + std::fabs(double(wn[k])) * sx / 2 + sw * sx / 4;
            }
            const double got = y[m * n_out + n];
            r.error = std::max(r.error, std::isfinite(got) ? std::fabs(got - exact) / bound : INFINITY);
        }
    }
    return r;
}

}  // namespace

std::vector<probe_result> probe_cpu(const std::function<bool(const std::string &, const std::string &)> & on_start) {
    ensure_backends_loaded();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) {
        throw std::runtime_error("probe: no CPU device");
    }
    std::unique_ptr<ggml_backend, backend_deleter> backend(ggml_backend_dev_init(dev, nullptr));
    set_backend_threads(backend.get(), default_threads());
    std::vector<ggml_backend_buffer_type_t> bufts = {ggml_backend_dev_buffer_type(dev)};
    auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : nullptr; b && *b; ++b) {
        bufts.push_back(*b);
    }
    std::mt19937 rng(16);
    std::vector<probe_result> out;
    for (ggml_backend_buffer_type_t buft : bufts) {
        for (ggml_type type : {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0}) {
            ctx_ptr ctx = new_ctx(1);
            const bool taken = buft_runs_matmul(dev, buft, ggml_new_tensor_2d(ctx.get(), type, k_in, n_out));
            if (!taken || !on_start(ggml_backend_buft_name(buft), ggml_type_name(type))) continue;
            for (int batch : batches) {
                out.push_back(run_case(backend.get(), dev, buft, type, batch, rng));
            }
        }
    }
    // 32 columns: two blocks of 16 on two pairs of panels; 40: and 8 more through AVX-512 VNNI.
    if (kernel_amx() && on_start("AURAL_AMX", "i8")) {
        for (int batch : {32, 40}) {
            out.push_back(run_int8_case(backend.get(), dev, batch, rng));
        }
    }
    return out;
}

}  // namespace aural
