// Aural's own CPU kernels one at a time, on numpy arrays, for tests that hold them to a float64 reference:
// each call builds a one-op ggml graph, runs it on the CPU backend at the configured CPU level (cpu.h)
// and returns its output. They raise ValueError where the level does not run the kernel.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "activation.h"
#include "attention.h"
#include "backend.h"
#include "bindings.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "int8-matmul.h"
#include "transpose.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using farray = py::array_t<float, py::array::c_style | py::array::forcecast>;

struct graph_run {
    std::vector<std::pair<ggml_tensor *, const void *>> inputs;
    ggml_tensor * output = nullptr;
};

// Builds the graph with `build` (which creates its input tensors and names their data), runs it on the CPU
// with the default thread count and copies the output into a float32 array of `shape`.
farray run_on_cpu(const std::function<graph_run(ggml_context *)> & build, std::vector<py::ssize_t> shape) {
    ensure_backends_loaded();
    ggml_init_params params = {/*.mem_size =*/ 16 * ggml_tensor_overhead() + ggml_graph_overhead(),
                               /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true};
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(params), ggml_free);
    graph_run run = build(ctx.get());
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, run.output);
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    std::unique_ptr<ggml_backend, decltype(&ggml_backend_free)> backend(ggml_backend_dev_init(dev, nullptr),
                                                                        ggml_backend_free);
    set_backend_threads(backend.get(), default_threads());
    std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)> buf(
        ggml_backend_alloc_ctx_tensors(ctx.get(), backend.get()), ggml_backend_buffer_free);
    for (const auto & [tensor, data] : run.inputs) {
        ggml_backend_tensor_set(tensor, data, 0, ggml_nbytes(tensor));
    }
    farray out(shape);
    {
        py::gil_scoped_release release;
        if (ggml_backend_graph_compute(backend.get(), gf) != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("kernel graph failed");
        }
        ggml_backend_tensor_get(run.output, out.mutable_data(), 0, ggml_nbytes(run.output));
    }
    return out;
}

farray gelu(const farray & x) {
    const int64_t n = x.size();
    return run_on_cpu([&](ggml_context * ctx) {
        ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
        return graph_run{{{t, x.data()}}, gelu_erf(ctx, t, /*simd=*/true)};
    }, {static_cast<py::ssize_t>(n)});
}

// q, v: (n, n_state); kt: (n_state, n). softmax(q_h k_h^T / sqrt(head_dim)) v_h per head h: (n, n_state).
farray attention(const farray & q, const farray & kt, const farray & v, int n_head) {
    if (q.ndim() != 2 || kt.ndim() != 2 || v.ndim() != 2) {
        throw std::invalid_argument("attention takes 2-D q (n, n_state), kt (n_state, n) and v (n, n_state)");
    }
    const int64_t n = q.shape(0), n_state = q.shape(1);
    return run_on_cpu([&](ggml_context * ctx) {
        ggml_tensor * tq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_state, n);
        ggml_tensor * tk = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kt.shape(1), kt.shape(0));
        ggml_tensor * tv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, v.shape(1), v.shape(0));
        return graph_run{{{tq, q.data()}, {tk, kt.data()}, {tv, v.data()}}, encoder_self_attention(ctx, tq, tk, tv, n_head)};
    }, {static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(n_state)});
}

// q: (n_q, n_state); k, v: (n_cross, n_state), rounded to f16 as the KV arena holds them (K per position,
// V transposed). softmax(q_h k_h^T / sqrt(64)) v_h per head h: (n_q, n_state).
farray cross_attention(const farray & q, const farray & k, const farray & v, int n_head) {
    if (q.ndim() != 2 || k.ndim() != 2 || v.ndim() != 2 || k.shape(1) != q.shape(1) || v.shape(0) != k.shape(0) ||
        v.shape(1) != q.shape(1) || n_head <= 0 || q.shape(1) % n_head != 0) {
        throw std::invalid_argument("cross_attention takes q (n_q, n_state), k and v (n_cross, n_state)");
    }
    const int64_t n_q = q.shape(0), n_state = q.shape(1), n_cross = k.shape(0), hd = n_state / n_head;
    std::vector<ggml_fp16_t> k16(n_cross * n_state), vt16(n_cross * n_state);
    ggml_fp32_to_fp16_row(k.data(), k16.data(), n_cross * n_state);
    for (int64_t j = 0; j < n_cross; ++j) {
        for (int64_t c = 0; c < n_state; ++c) {
            vt16[c * n_cross + j] = ggml_fp32_to_fp16(v.data()[j * n_state + c]);
        }
    }
    return run_on_cpu([&](ggml_context * ctx) {
        ggml_tensor * tq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_state, n_q);
        ggml_tensor * tk = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_state, n_cross);
        ggml_tensor * tv = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_cross, n_state);
        // The arena's views (kv-cache.cpp): K [hd, n_cross, n_head], V^T [n_cross, hd, n_head].
        ggml_tensor * kh = ggml_permute(ctx, ggml_view_3d(ctx, tk, hd, n_head, n_cross, hd * tk->nb[0], tk->nb[1], 0),
                                        0, 2, 1, 3);
        ggml_tensor * vh = ggml_view_3d(ctx, tv, n_cross, hd, n_head, tv->nb[1], hd * tv->nb[1], 0);
        return graph_run{{{tq, q.data()}, {tk, k16.data()}, {tv, vt16.data()}},
                         decoder_cross_attention(ctx, tq, kh, vh, n_head)};
    }, {static_cast<py::ssize_t>(n_q), static_cast<py::ssize_t>(n_state)});
}

// q: (n_q, n_state); k, v: (n_ctx, n_state), rounded to f16 as the KV arena holds them (one row per cell);
// visible: (n_q, n_ctx), which cells each query row sees (its mask row: 0 where true, -inf elsewhere).
// softmax(q_h k_h^T / sqrt(64)) v_h per head h over each row's visible cells: (n_q, n_state).
farray self_attention(const farray & q, const farray & k, const farray & v,
                      const py::array_t<bool, py::array::c_style | py::array::forcecast> & visible, int n_head) {
    if (q.ndim() != 2 || k.ndim() != 2 || v.ndim() != 2 || visible.ndim() != 2 || k.shape(1) != q.shape(1) ||
        v.shape(0) != k.shape(0) || v.shape(1) != q.shape(1) || visible.shape(0) != q.shape(0) ||
        visible.shape(1) != k.shape(0) || n_head <= 0 || q.shape(1) % n_head != 0) {
        throw std::invalid_argument("self_attention takes q (n_q, n_state), k and v (n_ctx, n_state) and "
                                    "visible (n_q, n_ctx)");
    }
    const int64_t n_q = q.shape(0), n_state = q.shape(1), n_ctx = k.shape(0), hd = n_state / n_head;
    std::vector<ggml_fp16_t> k16(n_ctx * n_state), v16(n_ctx * n_state), mask(n_q * n_ctx);
    ggml_fp32_to_fp16_row(k.data(), k16.data(), n_ctx * n_state);
    ggml_fp32_to_fp16_row(v.data(), v16.data(), n_ctx * n_state);
    for (int64_t i = 0; i < n_q * n_ctx; ++i) mask[i] = ggml_fp32_to_fp16(visible.data()[i] ? 0.0f : -INFINITY);
    return run_on_cpu([&](ggml_context * ctx) {
        ggml_tensor * tq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_state, n_q);
        ggml_tensor * tk = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_state, n_ctx);
        ggml_tensor * tv = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_state, n_ctx);
        ggml_tensor * tm = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_ctx, n_q);
        // The arena's views (kv-cache.cpp): K and V [hd, n_ctx, n_head].
        auto heads = [&](ggml_tensor * t) { return ggml_view_3d(ctx, t, hd, n_ctx, n_head, t->nb[1], hd * t->nb[0], 0); };
        return graph_run{{{tq, q.data()}, {tk, k16.data()}, {tv, v16.data()}, {tm, mask.data()}},
                         decoder_self_attention(ctx, tq, heads(tk), heads(tv), tm, n_head)};
    }, {static_cast<py::ssize_t>(n_q), static_cast<py::ssize_t>(n_state)});
}

// w: (rows, cols) packed as int8 (one scale per row); x: (m, cols). residual + (x w^T + bias): (m, rows), or
// with n_split > 1 the rows as n_split blocks, (n_split, m, rows / n_split). bias: (rows,); residual: (m, rows).
farray int8_product(const farray & w, const farray & x, const std::optional<farray> & bias,
                    const std::optional<farray> & residual, int64_t n_split) {
    if (w.ndim() != 2 || x.ndim() != 2 || w.shape(1) != x.shape(1) || n_split < 1 || w.shape(0) % n_split != 0 ||
        (bias && (bias->ndim() != 1 || bias->shape(0) != w.shape(0))) ||
        (residual && (residual->ndim() != 2 || residual->shape(0) != x.shape(0) || residual->shape(1) != w.shape(0)))) {
        throw std::invalid_argument("int8_matmul takes w (rows, cols), x (m, cols), bias (rows,), residual (m, rows) "
                                    "and n_split dividing rows");
    }
    const int64_t rows = w.shape(0), cols = w.shape(1), m = x.shape(0);
    const int64_t panels = (rows + int8_panel_rows - 1) / int8_panel_rows;
    std::vector<int8_t> packed(panels * int8_panel_bytes(cols));
    int8_pack(w.data(), rows, cols, packed.data());
    std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(rows)};
    if (n_split > 1) shape = {static_cast<py::ssize_t>(n_split), static_cast<py::ssize_t>(m),
                              static_cast<py::ssize_t>(rows / n_split)};
    return run_on_cpu([&](ggml_context * ctx) {
        ggml_tensor * tw = ggml_new_tensor_2d(ctx, GGML_TYPE_I8, int8_panel_bytes(cols), panels);
        ggml_tensor * tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, m);
        graph_run run{{{tw, packed.data()}, {tx, x.data()}}, nullptr};
        int8_epilogue e;
        e.n_split = n_split;
        if (bias) {
            e.bias = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, rows);
            run.inputs.push_back({e.bias, bias->data()});
        }
        if (residual) {
            e.residual = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, rows, m);
            run.inputs.push_back({e.residual, residual->data()});
        }
        run.output = int8_matmul(ctx, tw, rows, tx, e);
        return run;
    }, shape);
}

// x (b, row_len): its first `cols` values of each row (a view with x's row stride; -1: all), transposed to
// (cols, b), rounded to f16 with to_f16 (and widened back exactly for the float32 result).
farray transposed(const farray & x, int64_t cols, bool to_f16) {
    if (x.ndim() != 2 || cols < -1 || cols > x.shape(1)) {
        throw std::invalid_argument("transpose takes x (b, row_len) and cols <= row_len (-1: all)");
    }
    const int64_t b = x.shape(0), row_len = x.shape(1), a = cols < 0 ? row_len : cols;
    return run_on_cpu([&](ggml_context * ctx) {
        ggml_tensor * tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, row_len, b);
        ggml_tensor * y = transpose(ctx, ggml_view_2d(ctx, tx, a, b, tx->nb[1], 0),
                                    to_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32);
        return graph_run{{{tx, x.data()}}, to_f16 ? ggml_cast(ctx, y, GGML_TYPE_F32) : y};
    }, {static_cast<py::ssize_t>(a), static_cast<py::ssize_t>(b)});
}

}  // namespace

void register_kernels(py::module_ & m) {
    m.def("kernel_gelu", &gelu, py::arg("x"), "Aural's GELU (erf form) on a float32 array.");
    m.def("kernel_attention", &attention, py::arg("q"), py::arg("kt"), py::arg("v"), py::arg("n_head"),
          "Aural's encoder self-attention: q, v (n, n_state), kt (n_state, n) -> (n, n_state).");
    m.def("kernel_cross_attention", &cross_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("n_head"),
          "Aural's decoder cross-attention: q (n_q, n_state), k and v (n_cross, n_state) held as f16 -> "
          "(n_q, n_state).");
    m.def("kernel_self_attention", &self_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("visible"),
          py::arg("n_head"),
          "Aural's decoder self-attention: q (n_q, n_state), k and v (n_ctx, n_state) held as f16, visible "
          "(n_q, n_ctx) bool -> (n_q, n_state); a row that sees no cell gets zeros.");
    m.def("kernel_transpose", &transposed, py::arg("x"), py::arg("cols") = -1, py::arg("to_f16") = false,
          "Aural's transposed copy: x (b, row_len) -> its first cols columns (all: -1) as (cols, b), rounded to "
          "f16 with to_f16.");
    m.def("kernel_int8_matmul", &int8_product, py::arg("w"), py::arg("x"), py::arg("bias") = py::none(),
          py::arg("residual") = py::none(), py::arg("n_split") = 1,
          "Aural's int8 product: w (rows, cols) quantised per row, x (m, cols) per column -> residual + (x w^T + "
          "bias) (m, rows); with n_split > 1, (n_split, m, rows / n_split): the rows' blocks side by side.");
}

}  // namespace aural::bindings
