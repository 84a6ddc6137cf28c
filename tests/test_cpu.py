"""The CPU level (aural.engine.cpu, native/cpu.h): ggml's variants, the cap on Aural's own kernels, the
probe that vets extra buffer types in a child process, and each of Aural's kernels held to a float64
reference with bounds from its arithmetic (not to another kernel's output on one CPU)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_one_error_line, gamma_f32, run_cli

from aural.engine import cpu
from aural import _native  # noqa: I001

EPS32 = float(np.finfo(np.float32).eps)  # 2^-23: one f32 rounding is at most EPS32 / 2 relative


@pytest.fixture(scope="module")
def level():
    return cpu.configure()


def doctor(env=None, *args):
    proc = run_cli({**os.environ, **(env or {})}, "doctor", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def runnable():
    return [v["name"] for v in _native.cpu_variants() if v["score"] > 0]


def test_the_level_in_use_is_one_this_cpu_runs_and_caps_the_kernels(level):
    features = _native.cpu_features()
    assert level.variant in (level.runnable or ("built-in",))
    if level.runnable and not os.environ.get(cpu.VARIANT_ENV):
        assert level.variant == level.runnable[0]  # the best score wins when its probe passes
    expected = ("avx512_vnni" if features.get("AVX512_VNNI") == "1" else "avx512" if features.get("AVX512") == "1"
                else "avx2" if features.get("AVX2") == "1" and features.get("FMA") == "1" else "baseline")
    assert level.kernel_isa == expected
    with open("/proc/cpuinfo") as info:
        avx_vnni = features.get("AVX_VNNI") == "1" and "avx_vnni" in info.read().split()
    # AMX tiles where the variant has AMX-INT8 and the probe let Aural's tiles in
    amx = expected == "avx512_vnni" and features.get("AMX_INT8") == "1" and "AURAL_AMX" not in level.excluded
    assert level.int8_kernel == ("none" if expected == "baseline" else "amx" if amx else "avx512_vnni"
                                 if expected == "avx512_vnni" else "avx_vnni" if avx_vnni else "avx2")
    kernels = _native.cpu_kernels()
    assert kernels["int8_matmul"] == (expected != "baseline")  # AVX2 and up
    assert kernels["encoder_attention"] == (expected != "baseline")
    assert all(name in level.excluded or level.bufts.get(name) == "ok" for name in ("AMX", "AURAL_AMX"))


ZEN2 = {"vendor_id": "AuthenticAMD", "cpu family": "23", "model": "49", "model name": "AMD EPYC",
        "flags": "fpu sse2 avx f16c fma avx2 bmi2"}
SAPPHIRE_RAPIDS = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "143", "model name": "Intel Xeon",
                   "flags": "avx2 avx512f avx512_vnni avx_vnni amx_tile amx_int8"}


@pytest.mark.parametrize("info, expected", [
    (ZEN2, "AMD EPYC (Zen 2, family 23 model 49; AVX2, no AVX-512)"),
    (SAPPHIRE_RAPIDS, "Intel Xeon (Sapphire Rapids, family 6 model 143; AMX)"),
    ({**ZEN2, "model": "250"}, "AMD EPYC (family 23 model 250; AVX2, no AVX-512)"),
    ({"model name": "QEMU Virtual CPU", "flags": "sse2"}, "QEMU Virtual CPU (no AVX2)"),
])
def test_a_figures_cpu_names_the_core_and_the_widest_isa(monkeypatch, info, expected):
    # A KVM guest calls Zen 2, 3 and 4 alike "AMD EPYC": figures measured on them must say which.
    monkeypatch.setattr(cpu, "_cpuinfo", lambda: info)
    assert cpu.cpu_class() == expected


def test_a_named_variant_runs_ggml_and_aurals_kernels_at_that_level():
    if "haswell" not in runnable():
        pytest.skip("this CPU does not run ggml's haswell (AVX2) variant")
    report = doctor({cpu.VARIANT_ENV: ""}, "--cpu-variant", "haswell")
    assert report["cpu_level"]["variant"] == "haswell"
    assert report["cpu_level"]["reason"] == "AURAL_CPU_VARIANT=haswell"
    assert report["cpu_level"]["kernel_isa"] == "avx2"
    assert report["cpu_features"].get("AVX2") == "1" and "AVX512" not in report["cpu_features"]
    assert report["cpu_kernels"] == {"encoder_attention": True, "int8_matmul": True}


def test_unknown_and_unrunnable_variants_are_one_line_errors(jfk_wav):
    proc = run_cli(os.environ, "transcribe", jfk_wav, "--cpu-variant", "pentium4")
    assert_one_error_line(proc, "no CPU variant 'pentium4'; installed:")
    beyond = [v["name"] for v in _native.cpu_variants() if v["score"] == 0]
    if beyond:
        proc = run_cli({**os.environ, cpu.VARIANT_ENV: beyond[0]}, "doctor")
        assert_one_error_line(proc, f"CPU variant '{beyond[0]}' needs instructions this CPU lacks; it runs:")


def test_a_buffer_type_that_faults_is_left_out_and_cached(tmp_path):
    """AURAL_CPU_PROBE_FAULT makes the probe's child die of SIGILL where a buffer type's first product starts,
    as AMX tiles did on issue #16's VM: the verdict names the signal, the buffer type holds no weights, the
    other buffer types are still vetted, and the verdict is cached for this machine."""
    clean = doctor({"AURAL_CACHE_DIR": str(tmp_path)})["cpu_level"]["extra_buffers"]
    offered = sorted(clean)
    if not offered:
        pytest.skip("this CPU variant offers no extra buffer types")
    victim = offered[-1]
    report = doctor({"AURAL_CACHE_DIR": str(tmp_path / "fault"), "AURAL_CPU_PROBE_FAULT": victim})
    verdicts = report["cpu_level"]["extra_buffers"]
    assert verdicts[victim].startswith("SIGILL in its ") and victim in report["cpu_level"]["excluded"]
    assert all(verdicts[b] == clean[b] for b in offered if b != victim)
    cache = tmp_path / "fault" / "cpu-probe.json"
    stored = json.loads(cache.read_text())
    assert [v[victim] for v in stored.values()] == [verdicts[victim]]
    # Cached: without the fault the same machine keeps the stored verdict.
    assert doctor({"AURAL_CACHE_DIR": str(tmp_path / "fault")})["cpu_level"]["extra_buffers"] == verdicts


def test_aurals_amx_tiles_are_used_only_where_they_passed_their_probe(tmp_path):
    """Aural's int8 products go to AMX tiles only after the probe ran them right (AURAL_AMX): a fault there, or
    AURAL_NO_AMX=1, leaves them on AVX-512 VNNI with the same bits (test_int8_products_are_the_same_bits...)."""
    clean = doctor({"AURAL_CACHE_DIR": str(tmp_path)})["cpu_level"]
    if clean["extra_buffers"].get("AURAL_AMX") != "ok":
        pytest.skip("Aural's AMX tiles do not run here (no AMX-INT8, or they failed their probe)")
    assert clean["int8_kernel"] == "amx" and "AURAL_AMX" not in clean["excluded"]
    faulted = doctor({"AURAL_CACHE_DIR": str(tmp_path / "fault"), "AURAL_CPU_PROBE_FAULT": "AURAL_AMX"})["cpu_level"]
    assert faulted["extra_buffers"]["AURAL_AMX"] == "SIGILL in its i8 product"
    assert faulted["int8_kernel"] == "avx512_vnni" and "AURAL_AMX" in faulted["excluded"]
    off = doctor({"AURAL_CACHE_DIR": str(tmp_path), cpu.NO_AMX_ENV: "1"})["cpu_level"]
    assert off["int8_kernel"] == "avx512_vnni" and {"AMX", "AURAL_AMX"} <= set(off["excluded"])


def test_a_variant_whose_plain_products_fault_is_passed_over(tmp_path):
    names = runnable()
    if len(names) < 2:
        pytest.skip("needs two CPU variants this CPU runs")
    report = doctor({"AURAL_CACHE_DIR": str(tmp_path), "AURAL_CPU_PROBE_FAULT": f"{names[0]}/CPU",
                     cpu.VARIANT_ENV: ""})
    assert report["cpu_level"]["variant"] == names[1]
    assert f"passed over: {names[0]} (SIGILL in its f16 product)" in report["cpu_level"]["reason"]
    proc = run_cli({**os.environ, "AURAL_CACHE_DIR": str(tmp_path / "named"), "AURAL_CPU_PROBE_FAULT": f"{names[0]}/CPU",
                    cpu.VARIANT_ENV: names[0]}, "doctor")
    assert_one_error_line(proc, f"CPU variant '{names[0]}' fails its probe: SIGILL")


# ------------------------------------------------------------------------------- kernels against float64


def gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def test_gelu_is_within_its_approximation_and_rounding(level):
    """y = x/2 (1 + erf(x/sqrt 2)) with erfc from Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7)
    times exp_neg (relative <= 1e-7 with its roundings): the error is at most x/2 (1.5e-7 + 1e-7 erfc) plus
    a few f32 roundings of y."""
    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-14, 14, 28_001), rng.normal(0, 3, 20_000)]).astype(np.float32)
    y = _native.kernel_gelu(x).astype(np.float64)
    x64 = x.astype(np.float64)
    exact = gelu64(x64)
    erfc = np.vectorize(math.erfc)(np.abs(x64) / math.sqrt(2.0))
    bound = 0.5 * np.abs(x64) * (1.5e-7 + 1e-7 * erfc) + 4 * EPS32 * np.abs(exact) + 1e-30
    assert np.all(np.abs(y - exact) <= bound), float(np.max(np.abs(y - exact) / bound))


def attention64(q, kt, v, n_head):
    n, n_state = q.shape
    d = n_state // n_head
    out = np.empty((n, n_state))
    for h in range(n_head):
        cols = slice(h * d, (h + 1) * d)
        s = q[:, cols] @ kt[cols, :] / math.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, cols] = (p / p.sum(axis=1, keepdims=True)) @ v[:, cols]
    return out


def assert_attention_within_f32_rounding(got, q64, kt64, v64, n_head):
    """got against attention64 of the same inputs: a score carries gamma_d sum|q k| of summation error
    (gamma_n, conftest.gamma_f32), which moves an output by at most twice the largest score error times
    sum p |v|; the exponential (1e-7 relative) and the sum over n positions add (gamma_n + 1e-6) sum p |v|."""
    d, n = q64.shape[1] // n_head, kt64.shape[1]
    exact = attention64(q64, kt64, v64, n_head)
    for h in range(n_head):
        cols = slice(h * d, (h + 1) * d)
        s = q64[:, cols] @ kt64[cols, :] / math.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        score_err = gamma_f32(d) * (np.abs(q64[:, cols]) @ np.abs(kt64[cols, :])).max(axis=1) / math.sqrt(d)
        weight = p @ np.abs(v64[:, cols])  # sum_j p_j |v_j|, (n_q, d)
        bound = (2 * score_err[:, None] + gamma_f32(n) + 1e-6) * weight
        err = np.abs(got[:, cols] - exact[:, cols])
        assert np.all(err <= bound), float(np.max(err / bound))


@pytest.mark.parametrize("n", [1, 31, 601, 750])
def test_encoder_attention_is_within_f32_rounding(level, n):
    """softmax(q k^T / sqrt d) v per head in f32, within the bound of assert_attention_within_f32_rounding.
    n = 601 ends in a 1-row query block, 750 is not a multiple of the 32-position panels."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's attention needs AVX2 or AVX-512")
    rng = np.random.default_rng(n)
    n_state, n_head = 384, 6
    q, v = (rng.normal(0, 1, (n, n_state)).astype(np.float32) for _ in range(2))
    kt = rng.normal(0, 1, (n_state, n)).astype(np.float32)
    got = _native.kernel_attention(q, kt, v, n_head).astype(np.float64)
    assert_attention_within_f32_rounding(got, q.astype(np.float64), kt.astype(np.float64), v.astype(np.float64),
                                         n_head)


@pytest.mark.parametrize("b, row_len, cols", [(1, 8, -1), (7, 12, -1), (1500, 384, -1), (1499, 1500, -1),
                                              (367, 1536, 512), (1500, 20, 13)])
def test_transposed_copies_are_the_values_and_their_f16_rounding(level, b, row_len, cols):
    """The encoder's transposed copies move values: f32 out is x^T exactly, f16 out is numpy's
    round-to-nearest-even of x^T, the rounding ggml's own copy gives. Shapes: single rows and positions, tiles
    left over on both sides (7, 12; 1499 positions, 1500 columns), a shortened window's odd 367 positions, a
    view of the first 512 of 1536 columns (a split projection's K), more columns than a tile by 5."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's transpose needs AVX2")
    rng = np.random.default_rng(b)
    x = rng.normal(0, 1, (b, row_len)).astype(np.float32)
    x.flat[:: 97] *= 7e4  # past f16's largest finite value (65504): inf, as ggml's conversion gives
    x.flat[1:: 89] *= 1e-6  # f16 subnormals
    expect = x[:, : row_len if cols < 0 else cols].T
    assert np.array_equal(_native.kernel_transpose(x, cols=cols), expect)
    with np.errstate(over="ignore"):
        assert np.array_equal(_native.kernel_transpose(x, cols=cols, to_f16=True),
                              expect.astype(np.float16).astype(np.float32))


def f16(x: np.ndarray) -> np.ndarray:
    """x as the KV arena holds it (f16), widened to float64 for a reference."""
    return x.astype(np.float16).astype(np.float64)


def decoder_attention_inputs(n_q: int, n: int, n_head: int):
    """Random q (n_q, n_state) and k, v (n, n_state), float32, for the decoder's attention ops (head_dim 64)."""
    rng = np.random.default_rng(n_q + n)
    n_state = n_head * 64
    q = rng.normal(0, 1, (n_q, n_state)).astype(np.float32)
    k, v = (rng.normal(0, 2, (n, n_state)).astype(np.float32) for _ in range(2))
    return rng, q, k, v


@pytest.mark.parametrize("n_q, n_cross, n_head", [(1, 1500, 6), (5, 1500, 6), (9, 37, 8), (224, 1500, 20)])
def test_decoder_cross_attention_is_within_f32_rounding(level, n_q, n_cross, n_head):
    """The decoder's cross-attention over f16 K/V (as the KV arena holds them) in f32: each score is one
    64-long f32 dot of exact f16 keys, so the bound of the encoder's attention holds with K and V rounded to
    f16 first. 9 query rows end in a 1-row block, 37 positions in a partial chunk of V^T; 224 rows and 20
    heads are a prompt of large-v3's shape."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's cross-attention needs AVX2 or AVX-512")
    _, q, k, v = decoder_attention_inputs(n_q, n_cross, n_head)
    got = _native.kernel_cross_attention(q, k, v, n_head).astype(np.float64)
    assert_attention_within_f32_rounding(got, q.astype(np.float64), f16(k).T, f16(v), n_head)


def test_decoder_cross_attention_rows_are_the_same_bits_in_any_block(level):
    """Each query row's products and sums are the same, in the same order, whatever block of rows it is
    computed in: blocks of 1 to 8 rows run as separate compiled loops, which sum different numbers of head
    dimensions per pass (registers allowing). 13 rows are a block of 8 and one of 5."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's cross-attention needs AVX2 or AVX-512")
    _, q, k, v = decoder_attention_inputs(13, 1499, 6)
    together = _native.kernel_cross_attention(q, k, v, 6)
    alone = np.concatenate([_native.kernel_cross_attention(q[r:r + 1], k, v, 6) for r in range(len(q))])
    in_threes = np.concatenate([_native.kernel_cross_attention(q[r:r + 3], k, v, 6) for r in range(0, 13, 3)])
    assert np.array_equal(together, alone) and np.array_equal(together, in_threes)


@pytest.mark.parametrize("n_q, n_ctx, n_head", [(1, 448, 6), (5, 2240, 6), (8, 37, 20)])
def test_decoder_self_attention_is_within_f32_rounding(level, n_q, n_ctx, n_head):
    """The decoder's self-attention over f16 K/V cells, each query row over the cells its mask row leaves
    visible: per row, the cross-attention's bound over just those cells, and zeros for a row that sees none.
    Visibility is random (a beam's cells are scattered through the arena), 448 cells are one greedy arena,
    2240 a beam-5 one, 20 heads large-v3's."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's self-attention needs AVX2 or AVX-512")
    rng, q, k, v = decoder_attention_inputs(n_q, n_ctx, n_head)
    visible = rng.random((n_q, n_ctx)) < 0.3
    if n_q > 1:
        visible[-1] = False
    got = _native.kernel_self_attention(q, k, v, visible, n_head).astype(np.float64)
    for r, cells in enumerate(visible):
        if not cells.any():
            assert np.all(got[r] == 0.0)
            continue
        assert_attention_within_f32_rounding(got[r:r + 1], q[r:r + 1].astype(np.float64), f16(k[cells]).T,
                                             f16(v[cells]), n_head)


@pytest.mark.parametrize("rows, cols, m", [(64, 384, 1), (1536, 384, 5), (384, 1536, 33)])
def test_int8_products_are_within_their_quantisation_steps(level, rows, cols, m):
    """Weights round to int8 with one step sw = amax/127 per row, activations with one step sx per column;
    the int32 sums are exact, so y - y64 = sum_k (w_k ex_k + x_k ew_k + ew_k ex_k) with |ew| <= sw/2 and
    |ex| <= sx/2, plus two f32 roundings of the scaled result."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's int8 products need AVX2")
    rng = np.random.default_rng(rows + m)
    w = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    x = rng.normal(0, 1, (m, cols)).astype(np.float32)
    x[:, 7] = 6.0  # one outlier per column, as activations have: it sets the column's step
    got = _native.kernel_int8_matmul(w, x).astype(np.float64)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    exact = x64 @ w64.T
    sw = np.abs(w64).max(axis=1) / 127  # (rows,)
    sx = np.abs(x64).max(axis=1) / 127  # (m,)
    bound = (np.abs(x64).sum(axis=1)[:, None] * sw[None, :] / 2 + sx[:, None] * np.abs(w64).sum(axis=1)[None, :] / 2
             + cols * sx[:, None] * sw[None, :] / 4) * (1 + 1e-6) + 2 * EPS32 * np.abs(exact)
    err = np.abs(got - exact)
    assert np.all(err <= bound), float(np.max(err / bound))
    assert np.abs(got - exact).max() > 0  # the products are quantised: equal only by accident


def int8_product64(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x w^T as the kernels define it, in numpy: each row of w and of x rounds to int8 with the step amax/127
    (f32 arithmetic, half to even), the int32 sums are exact, and each sum is scaled once in f32 by the
    product of its two steps."""
    def quantise(a):
        amax = np.abs(a).max(axis=1, keepdims=True)
        inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        return np.rint(a * inv).astype(np.int64), (amax / np.float32(127)).astype(np.float32)
    qw, sw = quantise(w)
    qx, sx = quantise(x)
    sums = (qx @ qw.T).astype(np.float32)  # exact in int64; one f32 rounding above 2^24, as VCVTDQ2PS makes
    return sums * (sw.T * sx)


@pytest.mark.parametrize("rows, cols, m", [(100, 384, 37), (1536, 1536, 9), (100, 448, 53), (100, 400, 53)])
def test_int8_products_are_their_exact_integer_sums_scaled_in_f32(level, rows, cols, m):
    """Bit for bit the arithmetic int8_product64 spells out, with whichever kernel this level runs: 100 rows
    end in a partial panel, 37 columns take every tile width, and a sum past 2^24 is rounded as VCVTDQ2PS does.
    With AMX: 53 columns are blocks of 32 and 16 and 5 left for AVX-512; 400 values per column (not a
    multiple of the tiles' 64) stay with AVX-512 throughout."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's int8 products need AVX2")
    rng = np.random.default_rng(rows + cols + m)
    w = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    x = rng.normal(0, 1, (m, cols)).astype(np.float32)
    w[0], x[0] = 0.2, 4.0  # all 127: one sum of cols x 127 x 127, past 2^24 at 1536 columns ...
    x[0, -1] = 1.0  # ... and odd (a last 32 x 127), so that its conversion to f32 rounds
    assert np.array_equal(_native.kernel_int8_matmul(w, x), int8_product64(w, x))


@pytest.mark.parametrize("m", [5, 53])
def test_int8_products_add_bias_and_residual_and_split_rows_as_separate_nodes_would(level, m):
    """The product's node adds a bias per row and then a residual (graph.cpp's linear: r + (w x + b)), each
    sum one f32 rounding of the f32 product, as ggml_add nodes after it gave: the same bits. Rows split in
    blocks (a layer's q, k and v packed one after another) give each block's own product and bias, whole
    panels at a time, with the AVX-512 kernel (5 columns) and AMX's tiles (53) alike."""
    if level.kernel_isa == "baseline":
        pytest.skip("Aural's int8 products need AVX2")
    rng = np.random.default_rng(m)
    w = rng.normal(0, 0.05, (3 * 64, 384)).astype(np.float32)
    x = rng.normal(0, 1, (m, 384)).astype(np.float32)
    bias = rng.normal(0, 1, 3 * 64).astype(np.float32)
    residual = rng.normal(0, 4, (m, 3 * 64)).astype(np.float32)
    plain = int8_product64(w, x)
    assert np.array_equal(_native.kernel_int8_matmul(w, x, bias=bias), plain + bias)
    assert np.array_equal(_native.kernel_int8_matmul(w, x, bias=bias, residual=residual), residual + (plain + bias))
    assert np.array_equal(_native.kernel_int8_matmul(w, x, residual=residual), residual + plain)
    split = _native.kernel_int8_matmul(w, x, bias=bias, n_split=3)
    assert split.shape == (3, m, 64)
    for i in range(3):
        rows = slice(64 * i, 64 * (i + 1))
        assert np.array_equal(split[i], int8_product64(w[rows], x) + bias[rows])
    with pytest.raises(ValueError):  # a block of 40 rows would split a panel of 16
        _native.kernel_int8_matmul(w[:120], x, n_split=3)


@pytest.mark.parametrize("variant, kernel, m", [("haswell", "avx2", 37), ("alderlake", "avx_vnni", 37),
                                               ("icelake", "avx512_vnni", 53)])
def test_int8_products_are_the_same_bits_with_each_kernel(level, tmp_path, variant, kernel, m):
    """The AVX2 kernel (VPSIGNB, VPMADDUBSW, VPMADDWD) forms the same int32 sums of the same int8 values as
    VPDPBUSD (AVX-VNNI on ymm, AVX-512 VNNI on zmm) and TDPBUSD (AMX tiles) less their unsigned offset, and all
    scale them alike: a child at `variant` and this level agree bit for bit, so choosing the level moves no
    int8 token."""
    if variant not in runnable() or level.int8_kernel in ("none", kernel):
        pytest.skip(f"needs a CPU that runs ggml's {variant} variant and another int8 kernel at its best level")
    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.05, (100, 384)).astype(np.float32)  # 100 rows: a partial last panel
    x = rng.normal(0, 1, (m, 384)).astype(np.float32)  # 37 columns: every tile width of the ymm kernels; 53:
    # AMX's blocks of 32 and 16 columns, and 5 for AVX-512
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "x.npy", x)
    child = ("import numpy as np, sys; from aural.engine import cpu; cpu.configure(); from aural import _native; "
             "d = sys.argv[1]; np.save(d + '/y.npy', _native.kernel_int8_matmul(np.load(d + '/w.npy'), "
             "np.load(d + '/x.npy'))); print(_native.cpu_level()['int8_kernel'])")
    proc = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, cpu.VARIANT_ENV: variant})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [kernel]
    assert np.array_equal(np.load(tmp_path / "y.npy"), _native.kernel_int8_matmul(w, x))


def test_top_logprobs_pick_the_best_and_are_within_their_roundings(level):
    """native/logits.cpp at this level against float64: the k best ids in order, ties to the lower id (as
    np.argmax), and log-probabilities off by at most the normaliser's relative error: each e^x has exp_neg's
    (1e-7 with its roundings), a block of 256 is summed in f32 (gamma_256) and the blocks in f64. Rows of
    mostly -inf (the timestamp rule's) and of all -inf (no token left) included."""
    rng = np.random.default_rng(11)
    rows = rng.normal(0, 4, (4, 51_864)).astype(np.float32)
    rows[1, :50_257] = -np.inf  # text suppressed: only timestamps left
    rows[2, 100:110] = rows[2].max() + 1  # ten-way tie at the top
    rows[3] = -np.inf
    ids, logprobs, norms = _native.top_logprobs(rows, 6)
    for r in range(3):
        x = rows[r].astype(np.float64)
        top = x.max()
        norm = top + np.log(np.sum(np.exp(x - top)))
        order = np.argsort(-rows[r], kind="stable")[:6]
        assert ids[r].tolist() == order.tolist()
        bound = 1e-7 + gamma_f32(256)
        assert np.all(np.abs(logprobs[r] - (x[order] - norm)) <= bound)
        assert abs(norms[r] - norm) <= bound
    assert ids[2].tolist() == list(range(100, 106))
    assert np.all(logprobs[3] == -np.inf) and norms[3] == -np.inf
    one = _native.top_logprobs(rows[0], 1)
    assert int(one[0][0]) == int(np.argmax(rows[0])) and one[1][0] == logprobs[0, 0]
    with pytest.raises(ValueError, match="k must be"):
        _native.top_logprobs(rows, 65)
