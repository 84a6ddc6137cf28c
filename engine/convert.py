"""Convert a CTranslate2 Whisper model directory into the single GGUF file the native runtime loads.

Why these dependencies: CTranslate2's model.bin is a flat little-endian record list, so it is parsed with
`struct` and exposed as numpy views over an mmap (no ctranslate2 install, no copy of the weights); the
output is written with the `gguf` package because it is ggml's own reference writer, so the native
loader's gguf_init_from_file reads exactly what it writes. Quantised types go through ggml's quantiser
(`aural._native.quantize`) so the blocks are bit-for-bit what ggml's kernels expect.

The GGUF is written tensor by tensor: each tensor is converted from its mmap view, written, and dropped,
so peak memory is one tensor (dec.tok_emb, 51865 x n_state float32), not a second copy of the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import secrets
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from aural.engine.errors import AuralError, ModelError
from aural.engine.features import mel_filters

__all__ = [
    "FILE_TYPES",
    "HPARAM_KEYS",
    "WEIGHT_TYPES",
    "Ct2Model",
    "WhisperHParams",
    "convert_ct2",
    "file_sha256",
    "read_ct2",
    "whisper_hparams",
]

logger = logging.getLogger(__name__)

WEIGHT_TYPES = ("f32", "f16", "q8_0", "q5_0", "q4_0")

# general.file_type values: llama.cpp's LLAMA_FTYPE enum, which gguf-py mirrors as LlamaFileType.
FILE_TYPES = {
    "f32": int(gguf.LlamaFileType.ALL_F32),
    "f16": int(gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": int(gguf.LlamaFileType.MOSTLY_Q8_0),
    "q5_0": int(gguf.LlamaFileType.MOSTLY_Q5_0),
    "q4_0": int(gguf.LlamaFileType.MOSTLY_Q4_0),
}

# Storage type of the 2-D matrices (linear weights, dec.tok_emb) for each --type.
_MATRIX_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}
_QUANTISED = ("q8_0", "q5_0", "q4_0")

# WhisperHParams field -> GGUF key; convert writes these and models.model_info reads them back.
HPARAM_KEYS = {
    "n_vocab": "whisper.vocab_size",
    "n_audio_ctx": "whisper.audio.context_length",
    "n_audio_state": "whisper.audio.embedding_length",
    "n_audio_head": "whisper.audio.head_count",
    "n_audio_layer": "whisper.audio.block_count",
    "n_text_ctx": "whisper.text.context_length",
    "n_text_state": "whisper.text.embedding_length",
    "n_text_head": "whisper.text.head_count",
    "n_text_layer": "whisper.text.block_count",
    "n_mels": "whisper.n_mels",
}

# The model.bin layout this reader follows: CURRENT_BINARY_VERSION of CTranslate2's
# python/ctranslate2/specs/model_spec.py, the version the bundled tiny.en and base exports carry.
_CT2_BINARY_VERSION = 6
_CT2_SPEC = "WhisperSpec"
# Index = CTranslate2's DataType enum (include/ctranslate2/types.h): FLOAT32, INT8, INT16, INT32, FLOAT16;
# id 5 (BFLOAT16) has no numpy dtype, so it is refused like any unknown id.
_CT2_DTYPES = ("<f4", "<i1", "<i2", "<i4", "<f2")
# int8/int16 exports store weights with per-row scales that this converter does not undo.
_FLOAT_DTYPES = (np.dtype("<f4"), np.dtype("<f2"))

# Every released Whisper size has 64-wide attention heads (Radford et al. 2022, Table 1: tiny 384/6 ...
# large 1280/20).
_HEAD_DIM = 64
# English-only vocabularies have 51864 tokens, multilingual ones 51865 (51866 for large-v3).
_MULTILINGUAL_VOCAB = 51865
# Whisper's STFT: 400-sample window at 16 kHz -> 201 frequency bins (openai-whisper audio.py N_FFT).
_N_FFT = 400
# CTranslate2 fuses Whisper's bias-free k projection with an exact-zero bias (converters/utils.py
# fuse_linear); anything larger would be a real bias that dropping it would lose.
_ZERO_BIAS_TOL = 1e-6
# (n_audio_state, n_audio_layer) of the released sizes (Radford et al. 2022, Table 1), for general.name.
_SIZE_NAMES = {(384, 4): "tiny", (512, 6): "base", (768, 12): "small", (1024, 24): "medium", (1280, 32): "large"}
# ggml quantises in blocks of 32 values along a row (ggml-common.h QK8_0 = QK5_0 = QK4_0 = 32).
_QUANT_BLOCK = 32
_HASH_CHUNK = 1 << 20  # bytes read per step when hashing

# aural._native.quantize: (rows, cols) float32 C-contiguous, "q8_0" | "q5_0" | "q4_0" -> (rows, row_bytes) uint8.
_Quantize = Callable[[np.ndarray, str], np.ndarray]


@dataclass(frozen=True)
class Ct2Model:
    """A parsed CTranslate2 Whisper directory; the weights stay in the memory-mapped model.bin.

    Attributes:
        path: the model directory.
        revision: WhisperSpec revision recorded in model.bin.
        variables: variable name -> read-only numpy view into model.bin, in the file's dtype and shape.
        aliases: alias name -> the variable name it stands for (e.g. decoder/projection/weight).
        config: config.json (alignment_heads, lang_ids, suppress_ids, suppress_ids_begin).
        tokenizer_json: tokenizer.json text, embedded verbatim in the GGUF.
    """

    path: Path
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]
    config: dict[str, Any]
    tokenizer_json: str

    def variable(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Return the view of a variable (following aliases), checking its shape when one is given."""
        array = self.variables.get(self.aliases.get(name, name))
        if array is None:
            raise ModelError(f"{self.path / 'model.bin'} has no variable '{name}'; it is not a complete Whisper model.")
        if shape is not None and array.shape != shape:
            raise ModelError(f"{self.path / 'model.bin'} variable '{name}' has shape {array.shape}, expected {shape}.")
        return array


@dataclass(frozen=True)
class WhisperHParams:
    """Whisper hyper-parameters, read off the tensor shapes (names as in whisper.cpp and native/hparams.h).

    Attributes:
        n_vocab: token count (rows of the token embedding).
        n_audio_ctx: encoder positions (1500 for 30 s).
        n_audio_state: encoder width.
        n_audio_head: encoder attention heads.
        n_audio_layer: encoder blocks.
        n_text_ctx: decoder positions (448).
        n_text_state: decoder width.
        n_text_head: decoder attention heads.
        n_text_layer: decoder blocks.
        n_mels: mel bands of the input (80, or 128 for large-v3).
    """

    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int

    @property
    def multilingual(self) -> bool:
        """True for the multilingual vocabularies (English-only models have one token fewer)."""
        return self.n_vocab >= _MULTILINGUAL_VOCAB


@dataclass(frozen=True)
class _Tensor:
    """One GGUF tensor to write.

    Attributes:
        name: GGUF tensor name.
        data: source values, a view into model.bin (a row slice for fused projections); numpy (PyTorch)
            shape, which the writer reverses into ggml's ne order.
        kind: "conv" (stored F16 for every type, like whisper.cpp), "f32" (biases, norms, position tables,
            mel filters: always F32), or "matrix" (2-D weights that follow the requested type).
    """

    name: str
    data: np.ndarray
    kind: str


class _Cursor:
    """Reads little-endian fields from model.bin, reporting a truncated file as ModelError."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 0

    def take(self, n_bytes: int) -> int:
        """Advance over n_bytes and return where they start."""
        start = self.pos
        if start + n_bytes > len(self.buf):
            raise ModelError(
                f"{self.path} is truncated: needs at least {start + n_bytes} bytes but has {len(self.buf)}."
            )
        self.pos += n_bytes
        return start

    def unpack(self, fmt: str) -> int:
        return struct.unpack_from("<" + fmt, self.buf, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        # uint16 byte length including the trailing NUL, then the UTF-8 bytes.
        length = self.unpack("H")
        start = self.take(length)
        return bytes(self.buf[start : start + length]).rstrip(b"\0").decode("utf-8", "replace")


def read_ct2(path: str | Path) -> Ct2Model:
    """Parse a CTranslate2 Whisper directory (model.bin, config.json, tokenizer.json) without copying weights."""
    directory = Path(path)
    if not directory.is_dir():
        raise ModelError(f"CTranslate2 model directory {directory} does not exist.")
    model_bin = directory / "model.bin"
    if not model_bin.is_file():
        raise ModelError(f"{directory} has no model.bin, so it is not a CTranslate2 model directory.")
    config = _read_config(directory / "config.json")
    tokenizer_json = _read_text(directory / "tokenizer.json")
    revision, variables, aliases = _read_model_bin(model_bin)
    return Ct2Model(directory, revision, variables, aliases, config, tokenizer_json)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelError(f"{path} is missing; a CTranslate2 Whisper directory needs it.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path} cannot be read: {exc}.") from exc


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON: {exc}.") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{path} must hold a JSON object.")
    return config


def _read_model_bin(path: Path) -> tuple[int, dict[str, np.ndarray], dict[str, str]]:
    with path.open("rb") as file:
        if path.stat().st_size == 0:
            raise ModelError(f"{path} is empty.")
        # The views below keep the mapping alive after the file is closed.
        buf = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buf, path)
    version = cursor.unpack("I")
    if version != _CT2_BINARY_VERSION:
        raise ModelError(f"{path} is CTranslate2 binary version {version}; only {_CT2_BINARY_VERSION} is supported.")
    spec = cursor.string()
    if spec != _CT2_SPEC:
        raise ModelError(f"{path} holds a CTranslate2 '{spec}' model, not a Whisper model ({_CT2_SPEC}).")
    revision = cursor.unpack("I")
    variables = dict(_read_variable(cursor) for _ in range(cursor.unpack("I")))
    aliases = {cursor.string(): cursor.string() for _ in range(cursor.unpack("I"))}
    if cursor.pos != len(buf):
        raise ModelError(f"{path} has {len(buf) - cursor.pos} unexpected bytes after its last record (corrupt).")
    return revision, variables, aliases


def _read_variable(cursor: _Cursor) -> tuple[str, np.ndarray]:
    name = cursor.string()
    shape = tuple(cursor.unpack("I") for _ in range(cursor.unpack("B")))
    type_id = cursor.unpack("B")
    if type_id >= len(_CT2_DTYPES):
        raise ModelError(f"{cursor.path} variable '{name}' has unsupported CTranslate2 dtype id {type_id}.")
    dtype = np.dtype(_CT2_DTYPES[type_id])
    n_bytes = cursor.unpack("I")
    count = int(np.prod(shape, dtype=np.int64))
    if n_bytes != count * dtype.itemsize:
        raise ModelError(f"{cursor.path} variable '{name}' has {n_bytes} bytes for {shape} {dtype.name} (corrupt).")
    offset = cursor.take(n_bytes)
    return name, np.frombuffer(cursor.buf, dtype=dtype, count=count, offset=offset).reshape(shape)


def whisper_hparams(model: Ct2Model) -> WhisperHParams:
    """Derive the hyper-parameters from tensor shapes, cross-checked against CTranslate2's stored head counts."""
    conv1 = model.variable("encoder/conv1/weight")  # (n_state, n_mels, 3)
    emb = model.variable("decoder/embeddings/weight")  # (n_vocab, n_state)
    if conv1.ndim != 3 or emb.ndim != 2:
        raise ModelError(f"{model.path / 'model.bin'} has conv1 {conv1.shape} and embeddings {emb.shape}: not Whisper.")
    n_audio_state, n_text_state = conv1.shape[0], emb.shape[1]
    return WhisperHParams(
        n_vocab=emb.shape[0],
        n_audio_ctx=model.variable("encoder/position_encodings/encodings").shape[0],
        n_audio_state=n_audio_state,
        n_audio_head=_heads(model, "encoder", n_audio_state),
        n_audio_layer=_count_layers(model, "encoder"),
        n_text_ctx=model.variable("decoder/position_encodings/encodings").shape[0],
        n_text_state=n_text_state,
        n_text_head=_heads(model, "decoder", n_text_state),
        n_text_layer=_count_layers(model, "decoder"),
        n_mels=conv1.shape[1],
    )


def _heads(model: Ct2Model, stack: str, n_state: int) -> int:
    n_head = n_state // _HEAD_DIM
    stored = model.variables.get(f"{stack}/num_heads")
    if n_state % _HEAD_DIM or (stored is not None and int(stored) != n_head):
        raise ModelError(
            f"{model.path / 'model.bin'} {stack} width {n_state} does not split into {_HEAD_DIM}-wide heads "
            f"(stored num_heads {None if stored is None else int(stored)})."
        )
    return n_head


def _count_layers(model: Ct2Model, stack: str) -> int:
    pattern = re.compile(rf"{stack}/layer_(\d+)/")
    found = {int(m.group(1)) for name in model.variables if (m := pattern.match(name))}
    if not found or found != set(range(len(found))):
        raise ModelError(f"{model.path / 'model.bin'} has {stack} layers {sorted(found)}; expected 0..N-1.")
    return len(found)


def _norm(model: Ct2Model, src: str, dst: str, n: int) -> list[_Tensor]:
    return [
        _Tensor(f"{dst}.weight", model.variable(f"{src}/gamma", (n,)), "f32"),
        _Tensor(f"{dst}.bias", model.variable(f"{src}/beta", (n,)), "f32"),
    ]


def _linear(model: Ct2Model, src: str, dst: str, n_out: int, n_in: int) -> list[_Tensor]:
    return [
        _Tensor(f"{dst}.weight", model.variable(f"{src}/weight", (n_out, n_in)), "matrix"),
        _Tensor(f"{dst}.bias", model.variable(f"{src}/bias", (n_out,)), "f32"),
    ]


def _split(model: Ct2Model, src: str, dst: str, parts: str, n: int) -> list[_Tensor]:
    """Split a fused projection ([q;k;v] or [k;v] stacked along rows) into one tensor per part.

    Whisper's k projection has no bias; CTranslate2 pads the fused bias with zeros there, which are
    checked and dropped so the GGUF matches the original model.
    """
    weight = model.variable(f"{src}/weight", (len(parts) * n, n))
    bias = model.variable(f"{src}/bias", (len(parts) * n,))
    out = []
    for i, part in enumerate(parts):
        rows = slice(i * n, (i + 1) * n)
        out.append(_Tensor(f"{dst}.{part}.weight", weight[rows], "matrix"))
        if part != "k":
            out.append(_Tensor(f"{dst}.{part}.bias", bias[rows], "f32"))
        elif np.abs(bias[rows].astype(np.float32)).max() > _ZERO_BIAS_TOL:
            raise ModelError(f"{model.path / 'model.bin'} '{src}' has a non-zero key bias; Whisper's keys have none.")
    return out


def _attention(model: Ct2Model, src: str, dst: str, n: int) -> list[_Tensor]:
    # Self-attention: linear_0 = fused q,k,v [3n, n]; linear_1 = output projection.
    return _split(model, f"{src}/linear_0", dst, "qkv", n) + _linear(model, f"{src}/linear_1", f"{dst}.out", n, n)


def _cross_attention(model: Ct2Model, src: str, dst: str, n: int) -> list[_Tensor]:
    # Cross-attention: linear_0 = q [n, n]; linear_1 = fused k,v [2n, n]; linear_2 = output projection.
    return (
        _linear(model, f"{src}/linear_0", f"{dst}.q", n, n)
        + _split(model, f"{src}/linear_1", dst, "kv", n)
        + _linear(model, f"{src}/linear_2", f"{dst}.out", n, n)
    )


def _mlp(model: Ct2Model, src: str, dst: str, n: int) -> list[_Tensor]:
    # Whisper's MLP is n -> 4n -> n (openai-whisper model.py ResidualAttentionBlock, n_mlp = n_state * 4).
    return (
        _norm(model, f"{src}/layer_norm", f"{dst}_ln", n)
        + _linear(model, f"{src}/linear_0", f"{dst}.0", 4 * n, n)
        + _linear(model, f"{src}/linear_1", f"{dst}.2", n, 4 * n)
    )


def _encoder(model: Ct2Model, hp: WhisperHParams) -> list[_Tensor]:
    n = hp.n_audio_state
    out = [
        _Tensor("enc.conv1.weight", model.variable("encoder/conv1/weight", (n, hp.n_mels, 3)), "conv"),
        _Tensor("enc.conv1.bias", model.variable("encoder/conv1/bias", (n,)), "f32"),
        _Tensor("enc.conv2.weight", model.variable("encoder/conv2/weight", (n, n, 3)), "conv"),
        _Tensor("enc.conv2.bias", model.variable("encoder/conv2/bias", (n,)), "f32"),
        _Tensor("enc.pos", model.variable("encoder/position_encodings/encodings", (hp.n_audio_ctx, n)), "f32"),
    ]
    for i in range(hp.n_audio_layer):
        src, dst = f"encoder/layer_{i}", f"enc.blk.{i}"
        out += _norm(model, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln", n)
        out += _attention(model, f"{src}/self_attention", f"{dst}.attn", n)
        out += _mlp(model, f"{src}/ffn", f"{dst}.mlp", n)
    return out + _norm(model, "encoder/layer_norm", "enc.ln_post", n)


def _decoder(model: Ct2Model, hp: WhisperHParams) -> list[_Tensor]:
    n = hp.n_text_state
    out = [
        _Tensor("dec.tok_emb", model.variable("decoder/embeddings/weight", (hp.n_vocab, n)), "matrix"),
        _Tensor("dec.pos", model.variable("decoder/position_encodings/encodings", (hp.n_text_ctx, n)), "f32"),
    ]
    for i in range(hp.n_text_layer):
        src, dst = f"decoder/layer_{i}", f"dec.blk.{i}"
        out += _norm(model, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln", n)
        out += _attention(model, f"{src}/self_attention", f"{dst}.attn", n)
        out += _norm(model, f"{src}/attention/layer_norm", f"{dst}.cross_ln", n)
        out += _cross_attention(model, f"{src}/attention", f"{dst}.cross", n)
        out += _mlp(model, f"{src}/ffn", f"{dst}.mlp", n)
    return out + _norm(model, "decoder/layer_norm", "dec.ln", n)


def _plan(model: Ct2Model, hp: WhisperHParams) -> list[_Tensor]:
    """Every output tensor with its source view; all shapes are checked here, before anything is written."""
    tensors = _encoder(model, hp) + _decoder(model, hp)
    for t in tensors:
        if t.data.dtype not in _FLOAT_DTYPES:
            raise ModelError(
                f"{model.path / 'model.bin'} stores {t.name} as {t.data.dtype.name}; "
                "only float16 and float32 exports can be converted."
            )
    # (n_mels, 1 + n_fft // 2) = (n_mels, 201) Slaney filters, stored so the runtime computes the same features.
    filters = np.ascontiguousarray(mel_filters(hp.n_mels, n_fft=_N_FFT), dtype=np.float32)
    return tensors + [_Tensor("mel_filters", filters, "f32")]


def _storage_type(t: _Tensor, wtype: str) -> gguf.GGMLQuantizationType:
    if t.kind == "conv":
        return gguf.GGMLQuantizationType.F16
    if t.kind == "f32":
        return gguf.GGMLQuantizationType.F32
    if wtype in _QUANTISED and t.data.shape[-1] % _QUANT_BLOCK:
        return gguf.GGMLQuantizationType.F16  # a row that does not fill whole blocks cannot be quantised
    return _MATRIX_TYPES[wtype]


def _layout(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, numpy dtype and byte count of the stored tensor (quantised tensors are uint8 rows of blocks)."""
    if qtype == gguf.GGMLQuantizationType.F32:
        dtype = np.dtype(np.float32)
    elif qtype == gguf.GGMLQuantizationType.F16:
        dtype = np.dtype(np.float16)
    else:
        byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
        return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape))
    return shape, dtype, int(np.prod(shape)) * dtype.itemsize


def _encode(data: np.ndarray, qtype: gguf.GGMLQuantizationType, quantize: _Quantize | None) -> np.ndarray:
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return np.ascontiguousarray(data, dtype=np.float16)  # no copy when the source is already float16
    return quantize(np.ascontiguousarray(data, dtype=np.float32), qtype.name.lower())


def _native_quantize() -> _Quantize:
    try:
        from aural import _native
    except ImportError as exc:
        raise AuralError(
            "Quantised types need ggml's quantiser in aural._native, which is not built; convert with f16 or f32."
        ) from exc
    return _native.quantize


def _int_list(model: Ct2Model, key: str) -> list[int]:
    values = model.config.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise ModelError(f"{model.path / 'config.json'} '{key}' must be a list of integers.")
    return values


def _alignment_heads(model: Ct2Model, hp: WhisperHParams) -> list[int]:
    """config.json's [[layer, head], ...] flattened to layer, head, layer, head, ..., checked against the decoder."""
    pairs = model.config.get("alignment_heads", [])
    valid = isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) for v in p)
        and 0 <= p[0] < hp.n_text_layer and 0 <= p[1] < hp.n_text_head
        for p in pairs
    )
    if not valid:
        raise ModelError(
            f"{model.path / 'config.json'} alignment_heads must be [layer, head] pairs inside the "
            f"{hp.n_text_layer}-layer, {hp.n_text_head}-head decoder."
        )
    return [v for pair in pairs for v in pair]


def _add_int32_array(writer: gguf.GGUFWriter, key: str, values: list[int]) -> None:
    # gguf-py cannot write an empty array, so an empty list is omitted; readers treat a missing key as [].
    if values:
        writer.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)


def _add_metadata(writer: gguf.GGUFWriter, model: Ct2Model, hp: WhisperHParams, wtype: str, name: str) -> None:
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[wtype])
    for field, key in HPARAM_KEYS.items():
        writer.add_uint32(key, getattr(hp, field))
    writer.add_bool("whisper.multilingual", hp.multilingual)
    _add_int32_array(writer, "whisper.alignment_heads", _alignment_heads(model, hp))
    _add_int32_array(writer, "whisper.suppress_tokens", _int_list(model, "suppress_ids"))
    _add_int32_array(writer, "whisper.suppress_tokens_begin", _int_list(model, "suppress_ids_begin"))
    _add_int32_array(writer, "whisper.lang_ids", _int_list(model, "lang_ids"))
    writer.add_string("whisper.source", "ctranslate2")
    writer.add_string("whisper.source_sha256", file_sha256(model.path / "model.bin"))
    writer.add_string("tokenizer.huggingface.json", model.tokenizer_json)


def _default_name(hp: WhisperHParams) -> str:
    size = _SIZE_NAMES.get((hp.n_audio_state, hp.n_audio_layer), f"{hp.n_audio_state}x{hp.n_audio_layer}")
    return f"whisper-{size}" + ("" if hp.multilingual else ".en")


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks so big models are never held in memory."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _atomic_output(out: Path) -> Iterator[Path]:
    """Yield a temp path next to `out`, renamed over it only if the block succeeds (readers never see half a file).

    The unique name lets two processes convert the same model at once; the last rename wins, and since
    conversion is deterministic both files are identical.
    """
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        tmp.replace(out)
    except OSError as exc:
        raise ModelError(f"Cannot write {out}: {exc.strerror or exc}.") from exc
    finally:
        tmp.unlink(missing_ok=True)


def convert_ct2(src_dir: str | Path, out_path: str | Path, *, wtype: str = "f16", name: str | None = None) -> Path:
    """Convert a CTranslate2 Whisper directory into one GGUF at out_path (written atomically); return the path."""
    if wtype not in WEIGHT_TYPES:
        raise ModelError(f"Unknown weight type '{wtype}'; accepted: {', '.join(WEIGHT_TYPES)}.")
    quantize = _native_quantize() if wtype in _QUANTISED else None
    start = time.perf_counter()
    model = read_ct2(src_dir)
    hp = whisper_hparams(model)
    tensors = [(t, _storage_type(t, wtype)) for t in _plan(model, hp)]
    out = Path(out_path)
    with _atomic_output(out) as tmp:
        writer = gguf.GGUFWriter(tmp, "whisper")
        try:
            _add_metadata(writer, model, hp, wtype, name or _default_name(hp))
            for t, qtype in tensors:
                shape, dtype, n_bytes = _layout(t.data.shape, qtype)
                writer.add_tensor_info(t.name, shape, dtype, n_bytes, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t, qtype in tensors:
                writer.write_tensor_data(_encode(t.data, qtype, quantize))
        finally:
            writer.close()
    logger.info(
        "converted %s to %s (%s, %.1f MiB) in %.2f s",
        model.path, out, wtype, out.stat().st_size / 2**20, time.perf_counter() - start,
    )
    return out
