"""Qwen3-ASR's audio tower (native/qwen3-audio.*) against Qwen's official PyTorch code (tools/qwen-reference) on a
random-weight tiny checkpoint: the release's head size 64, conv stem, 100-frame chunks and 104-vector windows,
with 2 layers of width 128.

The official eager code attends over the whole clip (its forward() never passes the windows' mask; only
flash_attention_2 and vLLM use the windows), so the reference runs with `--attention windows`: the official
_prepare_attention_mask given to each layer, the flash_attention_2 behaviour the tower is specified by.

Tolerances are derived from the arithmetic, not tuned. A float64 numpy mirror of the tower, written from
modeling_qwen3_asr.py, computes the function exactly (to ~1e-15) and, beside every activation, the scale of the
rounding error an implementation can give it, in Higham and Mary's probabilistic model ("A new approach to
probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019): each rounding is an independent
mean-zero error bounded by u times the value rounded. An output's first-order error is then a sum of independent
bounded terms, sum_k c_k delta_k, and Hoeffding's inequality bounds it by lambda sqrt(sum_k c_k^2 b_k^2) except
with probability 2 exp(-lambda^2 / 2): for lambda = 7, 5e-11 per element, ~5e-5 over the ~1e6 elements this
test checks. The mirror carries V = sum_k c_k^2 b_k^2 forward, op by op:

- a product of K terms, y = W x + b: V_y = W^2 V_x + K u^2 (|W| |x| + |b|)^2 (Higham-Mary's sqrt(K) u sum|terms|,
  any summation order) + u_act^2 W^2 x^2, where u_act = 2^-11 for f16 weights (ggml rounds the activations to
  f16 first; f16 x f16 products are exact in f32), 0 for f32 weights and for the convs (f32 in any case);
- GELU: GELU'(x)^2 V_x + (c |x| + u |y|)^2, c = 0.5 (1.5e-7 + 18 u) for Aural's (erfc by Abramowitz & Stegun
  7.1.26, within 1.5e-7, evaluated in f32);
- LayerNorm: sum_j J_ij^2 V_j with J = diag(g) / sigma (I - (1 + xhat xhat^T) / n), plus
  (u (8 |g xhat| + 2 |g mu| / sigma + |y| + |b|))^2 for ggml_norm's float steps;
- attention per window and head: scores s = q.k / 8 with (k^2 V_q + q^2 V_k) / 64 + 64 u^2 (|q| |k|)^2 / 64 +
  u^2 s^2; softmax P_ij^2 sum_l (delta_jl - P_il)^2 V_s_il + (u P (|s| + |s - max| + 8))^2; o = P v with
  V_P v^2 + P^2 V_v + 2n u^2 (P |v|)^2 (the accumulation, rescaled online) + n u^2 o^2 (the normaliser);
- an add: V_a + V_b + u^2 (a + b)^2.

Carrying only the diagonal (no covariances) is exact in expectation over the random weights, not for one draw;
lambda = 7 leaves room for that. The bound is computed for Aural with u = 2^-24 (f32 weights) or with u_act = 2^-11
added (f16 weights), and for the mirror and the float64 reference with u = 2^-53. The mirror runs twice: on the
official weights and sinusoidal table (checked against the official outputs) and on the GGUF's weights and Aural's
table (the function Aural computes); the difference of the two functions, computed exactly, is added to the
tolerance of Aural against the official outputs.

Measured: Aural's errors are ~1% of the tolerance with f32 weights (it is loosest in the K u sum|terms| of long
products) and ~25% with f16. Each of these bugs failed it by 3x to 1000x: a tanh GELU in the MLP (3e-4 in the
37-frame output, tolerance 7e-5), a 37-frame clip padded to 100 frames (0.08), the mask one key off (0.04),
attention over the whole clip (0.24).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest

from qwen_reference import needs_reference, run_reference

pytest.importorskip("aural._native", reason="native engine not built")

from aural import _native  # noqa: E402
from aural.engine.models.importers import convert_model  # noqa: E402

pytestmark = needs_reference

U32, U16, U64 = 2.0**-24, 2.0**-11, 2.0**-53
LAMBDA = 7.0
# Clip lengths (mel frames): one short chunk, not padded to 100 frames (5 vectors, one window), one window of
# 100-frame chunks only (104), JFK's 1100 (a short last chunk, windows [0, 104, 143]), and 3250 (4 full windows,
# then the short chunk alone, still padded to 100 frames: 423 vectors; 5 graphs, or 2 of 4 windows).
FRAMES = (37, 800, 1100, 3250)


@dataclass(frozen=True)
class Rounding:
    """What one implementation's arithmetic adds to each op (the module docstring's terms).

    Attributes:
        u: unit roundoff of its arithmetic.
        u_act: rounding of a weight product's activations: 2^-11 where ggml converts them to f16, else 0.
        gelu_x: its GELU's own error per unit of |x|, beyond u |y|.
    """

    u: float
    u_act: float = 0.0
    gelu_x: float = 0.0


F64 = Rounding(u=U64, gelu_x=U64)
AURAL_F32 = Rounding(u=U32, gelu_x=0.5 * (1.5e-7 + 18 * U32))
AURAL_F16 = Rounding(u=U32, u_act=U16, gelu_x=AURAL_F32.gelu_x)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def aural_positions(n: int, d: int) -> np.ndarray:
    """native/qwen3-audio.cpp's table: the exact sinusoids rounded once to f32."""
    inv = np.exp(-np.arange(d // 2) * math.log(10000) / (d // 2 - 1))
    t = np.arange(n)[:, None] * inv[None]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32).astype(np.float64)


def chunk_vectors(n: int) -> int:
    """Vectors out of a chunk of n > 0 frames: three convs of stride 2."""
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


class Mirror:
    """The tower in float64 numpy on `weights` and `positions`. Every activation is an (x, V) pair: V [R, *x.shape]
    its rounding error's scale squared under each of the R rounding models (the module docstring)."""

    def __init__(self, weights: dict[str, np.ndarray], positions: np.ndarray, models: tuple[Rounding, ...]):
        self.w, self.pos = weights, positions
        self.models = {f: np.array([getattr(m, f) for m in models]) for f in ("u", "u_act", "gelu_x")}
        self.n_layer = sum(1 for k in weights if k.endswith("fc1.weight"))
        self.n_head = weights["conv_out.weight"].shape[0] // 64  # head_dim 64, as the release's

    def model(self, field_name: str, ndim: int = 3) -> np.ndarray:
        """A Rounding field of every model, shaped [R, 1, ...] to broadcast over a V of ndim dimensions."""
        return self.models[field_name].reshape((-1,) + (1,) * (ndim - 1))

    def product(self, x, v, w, b, f32=False):
        """x w^T + b, x [n, K]; f32: in f32 whatever the weights' type."""
        u, u_act, k = self.model("u"), 0.0 if f32 else self.model("u_act"), w.shape[1]
        w2 = w * w
        var = v @ w2.T + k * u * u * (np.abs(x) @ np.abs(w).T + np.abs(b)) ** 2 + u_act * u_act * ((x * x) @ w2.T)
        return x @ w.T + b, var

    def linear(self, x, v, name, bias=True):
        w = self.w[f"{name}.weight"]
        return self.product(x, v, w, self.w[f"{name}.bias"] if bias else np.zeros(w.shape[0]))

    def conv(self, x, v, name):
        """Conv2d(kernel 3, stride 2, padding 1) on x [B, C, H, W] as im2col and a product of K = 9 C terms."""
        def cols(t):
            *lead, b, c, h, w = t.shape
            oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
            tp = np.pad(t, [(0, 0)] * (len(lead) + 2) + [(1, 1), (1, 1)])
            p = np.stack([tp[..., i:i + 2 * oh:2, j:j + 2 * ow:2] for i in range(3) for j in range(3)], axis=-1)
            n = len(lead)
            p = p.transpose(*range(n), n, n + 2, n + 3, n + 1, n + 4)
            return p.reshape(*lead, b * oh * ow, c * 9), (b, oh, ow)

        (xc, shape), (vc, _) = cols(x), cols(v)
        w = self.w[f"{name}.weight"]
        y, var = self.product(xc, vc, w.reshape(w.shape[0], -1), self.w[f"{name}.bias"], f32=True)
        back = lambda t: np.moveaxis(t.reshape(*t.shape[:-2], *shape, -1), -1, -3)  # noqa: E731
        return back(y), back(var)

    def gelu(self, x, v):
        cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
        y = x * cdf
        slope = cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        local = self.model("gelu_x", v.ndim) * np.abs(x) + self.model("u", v.ndim) * np.abs(y)
        return y, slope**2 * v + local**2

    def layer_norm(self, x, v, name, eps=1e-5):
        g, b, u = self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.model("u")
        n = x.shape[-1]
        mu = x.mean(-1, keepdims=True)
        sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        xh = (x - mu) / sigma
        y = xh * g + b
        s = lambda t: t.sum(-1, keepdims=True)  # noqa: E731
        # sum_j (delta_ij - a_ij)^2 V_j with a_ij = (1 + xh_i xh_j) / n
        cross = (s(v) + 2 * xh * s(xh * v) + xh * xh * s(xh * xh * v)) / n**2
        var = (g / sigma) ** 2 * (v * (1 - 2 * (1 + xh * xh) / n) + cross)
        local = u * (8 * np.abs(g * xh) + 2 * np.abs(g * mu) / sigma + np.abs(y) + np.abs(b))
        return y, var + local**2

    def add(self, a, va, b, vb):
        return a + b, va + vb + (self.model("u") * (a + b)) ** 2

    def stem(self, mel):
        """[A, d]: each 100-frame chunk's convs and conv_out, positions restarting per chunk, a short last chunk's
        padding dropped (ref: Qwen3ASRAudioEncoder.forward). pad_sequence pads the chunks to the longest: 100
        frames, or the whole clip when it is shorter."""
        n = mel.shape[1]
        x = np.zeros((-(-n // 100), 1, mel.shape[0], min(n, 100)))
        for c in range(len(x)):
            part = mel[:, c * 100:(c + 1) * 100]
            x[c, 0, :, :part.shape[1]] = part
        v = np.zeros((len(self.models["u"]), *x.shape))
        for i in (1, 2, 3):
            x, v = self.gelu(*self.conv(x, v, f"conv2d{i}"))
        b, c, f, t = x.shape
        flat = lambda a: np.moveaxis(a, -1, -3).reshape(*a.shape[:-4], b * t, c * f)  # noqa: E731 (permute + view)
        x, v = self.linear(flat(x), flat(v), "conv_out", bias=False)
        x, v = self.add(x, v, self.pos[np.tile(np.arange(t), b)], 0.0)
        valid = (b - 1) * t + (chunk_vectors(n % 100) if n % 100 else t)
        return x[:valid], v[:, :valid]

    def attention(self, x, v, name, windows):
        u = self.model("u")
        (q, vq), (k, vk), (val, vv) = (self.linear(x, v, f"{name}.{p}_proj") for p in "qkv")
        o, vo = np.zeros_like(q), np.zeros_like(vq)
        for a, z in zip(windows[:-1], windows[1:]):
            n = z - a
            for h in range(self.n_head):
                at = (slice(a, z), slice(64 * h, 64 * (h + 1)))
                vat = (slice(None), *at)
                qh, kh, vh = q[at], k[at], val[at]
                s = qh @ kh.T / 8
                vs = ((vq[vat] @ (kh * kh).T + (qh * qh) @ np.swapaxes(vk[vat], -1, -2)) / 64
                      + u * u * (np.abs(qh) @ np.abs(kh).T) ** 2 + (u * s) ** 2)
                m = s.max(-1, keepdims=True)
                p = np.exp(s - m)
                p /= p.sum(-1, keepdims=True)
                vp = (p * p * (vs * (1 - 2 * p) + (p * p * vs).sum(-1, keepdims=True))
                      + (u * p * (np.abs(s) + np.abs(s - m) + 8)) ** 2)
                o[at] = p @ vh
                vo[vat] = (vp @ (vh * vh) + (p * p) @ vv[vat] + 2 * n * u * u * (p @ np.abs(vh)) ** 2
                           + n * (u * o[at]) ** 2)
        return self.linear(o, vo, f"{name}.out_proj")

    def forward(self, mel):
        """The hidden states [stem, after layer 1, ...] and the output [A, n_out], as (x, V) pairs, and the
        windows' bounds."""
        x, v = self.stem(mel)
        windows = list(range(0, len(x), 104)) + [len(x)]
        states = [(x, v)]
        for i in range(self.n_layer):
            p = f"layers.{i}"
            h, vh = self.layer_norm(x, v, f"{p}.self_attn_layer_norm")
            x, v = self.add(x, v, *self.attention(h, vh, f"{p}.self_attn", windows))
            h, vh = self.layer_norm(x, v, f"{p}.final_layer_norm")
            h, vh = self.gelu(*self.linear(h, vh, f"{p}.fc1"))
            x, v = self.add(x, v, *self.linear(h, vh, f"{p}.fc2"))
            states.append((x, v))
        x, v = self.layer_norm(x, v, "ln_post")
        x, v = self.gelu(*self.linear(x, v, "proj1"))
        return states, self.linear(x, v, "proj2"), windows


def _gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """The audio tower's weights as Aural reads them (f16 conv kernels; f16 matrices in an f16 file)."""
    return {t.name.removeprefix("audio_tower."): np.asarray(t.data, dtype=np.float64)
            for t in gguf.GGUFReader(path).tensors if t.name.startswith("audio_tower.")}


@dataclass
class Case:
    """One clip: its mel, the official float64 outputs, and the mirror's (x, V) pairs on the official weights
    (`official`, models (F64,)) and on each GGUF's (`gguf[wtype]`, models (F64, AURAL_F32 or AURAL_F16))."""

    mel: np.ndarray
    ref: dict[str, np.ndarray]
    official: tuple
    gguf: dict[str, tuple]


@pytest.fixture(scope="module")
def tower(tmp_path_factory) -> tuple[dict[str, Path], list[Case]]:
    """A tiny checkpoint made by the official code (seed 5), random log-mels of FRAMES lengths, the official
    float64 tower on them (within windows), the checkpoint converted to f32 and f16 GGUFs, and the mirrors."""
    d = tmp_path_factory.mktemp("qwen3-audio")
    run_reference("make-checkpoint", d / "ckpt", "--shape", "tiny", "--seed", "5")
    rng = np.random.default_rng(23)
    mels = [rng.uniform(-1.0, 1.5, (128, n)).astype(np.float32) for n in FRAMES]  # Whisper's log-mel range
    for i, mel in enumerate(mels):
        np.save(d / f"mel{i}.npy", mel)
    run_reference("audio", d / "ckpt", "--mel", *(d / f"mel{i}.npy" for i in range(len(mels))), "--out",
                  d / "f64.npz", "--precision", "f64", "--attention", "windows", "--weights")
    ref = dict(np.load(d / "f64.npz"))
    paths = {wtype: Path(convert_model(d / "ckpt", d / f"{wtype}.gguf", wtype=wtype)) for wtype in ("f32", "f16")}
    official = {k.removeprefix("weight."): v.astype(np.float64) for k, v in ref.items() if k.startswith("weight.")}
    mirrors = {"official": Mirror(official, ref["positional_embedding"].astype(np.float64), (F64,))}
    d_model = official["conv_out.weight"].shape[0]
    for wtype, model in (("f32", AURAL_F32), ("f16", AURAL_F16)):
        mirrors[wtype] = Mirror(_gguf_weights(paths[wtype]), aural_positions(13, d_model), (F64, model))
    cases = []
    for i, mel in enumerate(mels):
        m = mel.astype(np.float64)
        cases.append(Case(mel, {k.rsplit(".", 1)[0]: v for k, v in ref.items() if k.endswith(f".{i}")},
                          mirrors["official"].forward(m), {w: mirrors[w].forward(m) for w in ("f32", "f16")}))
    return paths, cases


def _stages(result) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    states, out, _ = result
    return {"stem": states[0], **{f"layer {i}": s for i, s in enumerate(states[1:], 1)}, "out": out}


def _official(case: Case) -> dict[str, np.ndarray]:
    layers = case.ref["audio_layers"]
    return {"stem": case.ref["audio_stem"], **{f"layer {i}": layers[i - 1] for i in range(1, len(layers) + 1)},
            "out": case.ref["audio_out"]}


def _tol(v: np.ndarray) -> np.ndarray:
    """LAMBDA sqrt(V) of each model, summed: the tolerance on a difference of their results."""
    return LAMBDA * np.sqrt(v).sum(0)


def _check(got: np.ndarray, want: np.ndarray, tol: np.ndarray, what: str) -> float:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    ratio = np.abs(got - want) / tol
    worst = np.unravel_index(ratio.argmax(), ratio.shape)
    assert ratio.max() <= 1, (f"{what}: |error| {np.abs(got - want)[worst]:.3g} > tolerance {tol[worst]:.3g} at "
                              f"{worst}; max |error| {np.abs(got - want).max():.3g}")
    return float(ratio.max())


def _tower(path, mel, *, n_layers=None, windows_per_graph=1):
    """Aural's tower on `mel` with the GGUF at `path`, on 2 threads."""
    model = _native.Qwen3Model(str(path), n_threads=2)
    return _native.Qwen3AudioEncoder(model, windows_per_graph=windows_per_graph).encode(mel, n_layers=n_layers)


def test_qwen_audio_mirror_is_the_official_function(tower):
    """The float64 mirror against the official float64 outputs at every stage, within both's f64 rounding:
    the mirror computes the official function (its chunks, positions, windows, layers), so its bounds apply."""
    _, cases = tower
    for case in cases:
        n = case.mel.shape[1]
        assert case.official[2] == case.ref["audio_cu_seqlens"].tolist(), f"{n} frames: windows"
        for stage, want in _official(case).items():
            x, v = _stages(case.official)[stage]
            _check(x, want, 2 * _tol(v), f"{n} frames, {stage}, mirror vs official")


@pytest.mark.parametrize("wtype, windows", [("f32", 1), ("f16", 1), ("f32", 4)])
def test_qwen_audio_tower_matches_the_official_code(tower, wtype, windows):
    """Aural's stem and output on each clip against the mirror of the function it computes (its GGUF's weights and
    its sinusoidal table) within Aural's rounding plus the mirror's, and against the official outputs within that
    plus the exact difference between the two functions (the tables' last bits, ~5e-7; the weights are bf16
    values, which f16 holds exactly down to 2^-17). Four windows per graph: windows side by side in attention,
    the last one's padding masked (1100 frames: 104 + 39 vectors)."""
    paths, cases = tower
    for case in cases:
        n = case.mel.shape[1]
        mirror, official = _stages(case.gguf[wtype]), _stages(case.official)
        for stage, layers in (("stem", 0), ("out", None)):
            got = _tower(paths[wtype], case.mel, n_layers=layers, windows_per_graph=windows)
            (x, v), want = mirror[stage], _official(case)[stage]
            what = f"{n} frames, {wtype}, {windows} windows per graph, {stage}"
            _check(got, x, _tol(v), f"{what}, Aural vs mirror")
            tol = _tol(v) + _tol(official[stage][1]) + np.abs(x - official[stage][0])
            _check(got, want, tol, f"{what}, Aural vs official")


def test_qwen_audio_f16_weights_against_f32(tower):
    """The f16 file's output against the f32 file's: within both's rounding (f16 activations in every weight
    product: ~2^-11 relative each) plus the difference of their functions (f16 and f32 weights)."""
    paths, cases = tower
    for case in cases:
        (x16, v16), (x32, v32) = case.gguf["f16"][1], case.gguf["f32"][1]
        got = {w: _tower(paths[w], case.mel) for w in ("f16", "f32")}
        _check(got["f16"], got["f32"], _tol(v16) + _tol(v32) + np.abs(x16 - x32),
               f"{case.mel.shape[1]} frames, f16 vs f32 weights")


def test_qwen_audio_tower_rejects_bad_input(tower):
    paths, _ = tower
    with pytest.raises(ValueError, match="bins"):
        _tower(paths["f32"], np.zeros((80, 100), np.float32))
    with pytest.raises(ValueError, match="at least one"):
        _tower(paths["f32"], np.zeros((128, 0), np.float32))
    with pytest.raises(ValueError, match="layers"):
        _tower(paths["f32"], np.zeros((128, 10), np.float32), n_layers=3)
    with pytest.raises(ValueError, match="windows_per_graph"):
        _tower(paths["f32"], np.zeros((128, 10), np.float32), windows_per_graph=0)
    with pytest.raises(RuntimeError, match="not found"):
        _tower(str(paths["f32"]) + ".missing", np.zeros((128, 10), np.float32))
