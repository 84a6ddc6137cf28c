"""Write the single GGUF file the native runtime loads, from a Whisper model read by a per-format reader.

A reader turns its format into a `WhisperSource`: hyper-parameters, a lookup from GGUF tensor names to
source values, the tokenizer JSON and the decoding metadata. This module holds the CTranslate2 reader
(`read_ct2`, `ct2_source`) and the one writer (`write_gguf`); importers.py holds the whisper.cpp ggml and
Hugging Face readers, which reuse the same tensor plan and writer.

Why these dependencies: CTranslate2's model.bin is a flat little-endian record list, so it is parsed with
`struct` and exposed as numpy views over an mmap (no ctranslate2 install, no copy of the weights); the
output is written with the `gguf` package because it is ggml's own reference writer, so the native
loader's gguf_init_from_file reads exactly what it writes. Quantised types go through ggml's quantiser
(`aural._native.quantize`) so the blocks are bit-for-bit what ggml's kernels expect.

The GGUF is written tensor by tensor: each tensor is converted from its source view, written, and dropped,
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
from dataclasses import dataclass, field
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
    "LazyTensor",
    "WhisperHParams",
    "WhisperSource",
    "check_wtype",
    "convert_ct2",
    "ct2_source",
    "default_name",
    "file_sha256",
    "read_ct2",
    "whisper_hparams",
    "write_file",
    "write_gguf",
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
# large-v3 (and turbo, built on it) is the first release with 128 mel bands (openai-whisper model.py ModelDimensions).
_V3_N_MELS = 128
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


class LazyTensor:
    """Source values made only when the writer asks for them (dequantised, or widened from bfloat16), so
    peak memory stays one tensor. numpy reads it through __array__.

    Attributes:
        shape: numpy (PyTorch) shape of the values.
        dtype: numpy dtype of the values it makes (float16 or float32).
        raw: (ggml type, uint8 blocks) of an already-quantised source, copied as is when the output
            stores the tensor in that same type; None otherwise.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, load: Callable[[], np.ndarray],
                 raw: tuple[gguf.GGMLQuantizationType, np.ndarray] | None = None) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.raw = raw
        self._load = load

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self._load()
        return values if dtype is None else values.astype(dtype, copy=False)


# A source tensor: a numpy array (often a view into the source file) or a LazyTensor.
SourceArray = np.ndarray | LazyTensor


@dataclass(frozen=True)
class WhisperSource:
    """A Whisper model read from one of the supported formats, ready for write_gguf.

    Attributes:
        path: the file or directory read; errors name it.
        kind: "ctranslate2", "whisper.cpp" or "huggingface" (stored as whisper.source).
        hparams: the model's dimensions.
        lookup: GGUF tensor name -> (values in numpy shape, the source's own name for them); raises
            ModelError naming the file when the source lacks the tensor.
        tokenizer_json: HF tokenizers JSON of the vocabulary (tokenizer.py reads it).
        sha256: hex sha256 of the source weights (whisper.source_sha256).
        alignment_heads: [layer, head] pairs of the decoder's cross-attention used for word timing.
        suppress_ids: token ids to suppress (the source's suppress_tokens), or [].
        suppress_ids_begin: ids to suppress at the first step, or [].
        lang_ids: ids of the language tokens, or [].
        mel_filters: the (n_mels, 201) filterbank the source ships, or None for the standard Slaney one.
    """

    path: Path
    kind: str
    hparams: WhisperHParams
    lookup: Callable[[str], tuple[SourceArray, str]]
    tokenizer_json: str
    sha256: str
    alignment_heads: list[list[int]] = field(default_factory=list)
    suppress_ids: list[int] = field(default_factory=list)
    suppress_ids_begin: list[int] = field(default_factory=list)
    lang_ids: list[int] = field(default_factory=list)
    mel_filters: np.ndarray | None = None


@dataclass(frozen=True)
class _Tensor:
    """One GGUF tensor to write.

    Attributes:
        name: GGUF tensor name.
        data: source values in numpy (PyTorch) shape, which the writer reverses into ggml's ne order.
        kind: "conv" (stored F16 for every type, like whisper.cpp), "f32" (biases, norms, position tables,
            mel filters: always F32), or "matrix" (2-D weights that follow the requested type).
    """

    name: str
    data: SourceArray
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


# (GGUF name, numpy shape, kind) of every tensor the native loader binds (native/model.cpp bind_tensors).
_Spec = tuple[str, tuple[int, ...], str]


def _norm(prefix: str, n: int) -> list[_Spec]:
    return [(f"{prefix}.weight", (n,), "f32"), (f"{prefix}.bias", (n,), "f32")]


def _linear(prefix: str, n_out: int, n_in: int, bias: bool = True) -> list[_Spec]:
    return [(f"{prefix}.weight", (n_out, n_in), "matrix")] + ([(f"{prefix}.bias", (n_out,), "f32")] if bias else [])


def _attention(prefix: str, n: int) -> list[_Spec]:
    # Whisper's key projection has no bias (openai-whisper model.py MultiHeadAttention: key bias=False).
    return (_linear(f"{prefix}.q", n, n) + _linear(f"{prefix}.k", n, n, bias=False)
            + _linear(f"{prefix}.v", n, n) + _linear(f"{prefix}.out", n, n))


def _mlp(prefix: str, n: int) -> list[_Spec]:
    # Whisper's MLP is n -> 4n -> n (openai-whisper model.py ResidualAttentionBlock, n_mlp = n_state * 4).
    return _norm(f"{prefix}_ln", n) + _linear(f"{prefix}.0", 4 * n, n) + _linear(f"{prefix}.2", n, 4 * n)


def _specs(hp: WhisperHParams) -> list[_Spec]:
    """Every GGUF tensor of a model with these dimensions, encoder first."""
    na, nt = hp.n_audio_state, hp.n_text_state
    out: list[_Spec] = [
        ("enc.conv1.weight", (na, hp.n_mels, 3), "conv"), ("enc.conv1.bias", (na,), "f32"),
        ("enc.conv2.weight", (na, na, 3), "conv"), ("enc.conv2.bias", (na,), "f32"),
        ("enc.pos", (hp.n_audio_ctx, na), "f32"),
    ]
    for i in range(hp.n_audio_layer):
        out += _norm(f"enc.blk.{i}.attn_ln", na) + _attention(f"enc.blk.{i}.attn", na) + _mlp(f"enc.blk.{i}.mlp", na)
    out += _norm("enc.ln_post", na)
    out += [("dec.tok_emb", (hp.n_vocab, nt), "matrix"), ("dec.pos", (hp.n_text_ctx, nt), "f32")]
    for i in range(hp.n_text_layer):
        p = f"dec.blk.{i}"
        out += _norm(f"{p}.attn_ln", nt) + _attention(f"{p}.attn", nt)
        out += _norm(f"{p}.cross_ln", nt) + _attention(f"{p}.cross", nt) + _mlp(f"{p}.mlp", nt)
    return out + _norm("dec.ln", nt)


def _plan(source: WhisperSource) -> list[_Tensor]:
    """Every output tensor with its source values; all shapes are checked here, before anything is written."""
    tensors = []
    for name, shape, kind in _specs(source.hparams):
        data, origin = source.lookup(name)
        if data.shape != shape:
            raise ModelError(f"{source.path}: '{origin}' has shape {data.shape}, expected {shape}.")
        if data.dtype not in _FLOAT_DTYPES:
            raise ModelError(
                f"{source.path} stores '{origin}' as {data.dtype.name}; "
                "only float16 and float32 weights can be converted."
            )
        tensors.append(_Tensor(name, data, kind))
    # (n_mels, 1 + n_fft // 2) = (n_mels, 201) Slaney filters, stored so the runtime computes the same features.
    filters = mel_filters(source.hparams.n_mels, n_fft=_N_FFT) if source.mel_filters is None else source.mel_filters
    return tensors + [_Tensor("mel_filters", np.ascontiguousarray(filters, dtype=np.float32), "f32")]


# GGUF name -> CTranslate2 variable for the whole-model tensors (CTranslate2 converters/transformers.py
# WhisperLoader: layer norms are gamma/beta, positions are position_encodings/encodings).
_CT2_GLOBAL = {
    "enc.conv1.weight": "encoder/conv1/weight", "enc.conv1.bias": "encoder/conv1/bias",
    "enc.conv2.weight": "encoder/conv2/weight", "enc.conv2.bias": "encoder/conv2/bias",
    "enc.pos": "encoder/position_encodings/encodings",
    "enc.ln_post.weight": "encoder/layer_norm/gamma", "enc.ln_post.bias": "encoder/layer_norm/beta",
    "dec.tok_emb": "decoder/embeddings/weight", "dec.pos": "decoder/position_encodings/encodings",
    "dec.ln.weight": "decoder/layer_norm/gamma", "dec.ln.bias": "decoder/layer_norm/beta",
}
# Block part -> (CTranslate2 module under layer_N, index in the fused projection, parts fused). Self-attention
# fuses [q; k; v] in linear_0; cross-attention has q in linear_0 and fuses [k; v] in linear_1.
_CT2_BLOCK = {
    "attn_ln": ("self_attention/layer_norm", 0, 1), "attn.q": ("self_attention/linear_0", 0, 3),
    "attn.k": ("self_attention/linear_0", 1, 3), "attn.v": ("self_attention/linear_0", 2, 3),
    "attn.out": ("self_attention/linear_1", 0, 1), "cross_ln": ("attention/layer_norm", 0, 1),
    "cross.q": ("attention/linear_0", 0, 1), "cross.k": ("attention/linear_1", 0, 2),
    "cross.v": ("attention/linear_1", 1, 2), "cross.out": ("attention/linear_2", 0, 1),
    "mlp_ln": ("ffn/layer_norm", 0, 1), "mlp.0": ("ffn/linear_0", 0, 1), "mlp.2": ("ffn/linear_1", 0, 1),
}
_BLOCK_RE = re.compile(r"(enc|dec)\.blk\.(\d+)\.(.+)\.(weight|bias)$")


def _ct2_lookup(model: Ct2Model) -> Callable[[str], tuple[np.ndarray, str]]:
    def lookup(name: str) -> tuple[np.ndarray, str]:
        if name in _CT2_GLOBAL:
            return model.variable(_CT2_GLOBAL[name]), _CT2_GLOBAL[name]
        m = _BLOCK_RE.match(name)
        module, index, n_parts = _CT2_BLOCK[m.group(3)]
        stack = "encoder" if m.group(1) == "enc" else "decoder"
        kind = {"weight": "gamma", "bias": "beta"}[m.group(4)] if module.endswith("layer_norm") else m.group(4)
        variable = f"{stack}/layer_{m.group(2)}/{module}/{kind}"
        if n_parts == 1:
            return model.variable(variable), variable
        if m.group(3).endswith(".k"):
            _check_zero_key_bias(model, f"{stack}/layer_{m.group(2)}/{module}/bias", index, n_parts)
        return _fused_part(model, variable, index, n_parts), f"{variable}[part {index + 1} of {n_parts}]"

    return lookup


def _fused_part(model: Ct2Model, variable: str, index: int, n_parts: int) -> np.ndarray:
    """Rows index*n .. (index+1)*n of a projection fused from n_parts stacked along rows."""
    fused = model.variable(variable)
    if fused.shape[0] % n_parts:
        raise ModelError(
            f"{model.path / 'model.bin'} '{variable}' has {fused.shape[0]} rows, not {n_parts} equal parts."
        )
    rows = fused.shape[0] // n_parts
    return fused[index * rows : (index + 1) * rows]


def _check_zero_key_bias(model: Ct2Model, bias: str, index: int, n_parts: int) -> None:
    # Whisper's k projection has no bias; CTranslate2 pads the fused bias with zeros there (converters/utils.py
    # fuse_linear), which are checked and dropped so the GGUF matches the original model.
    k = _fused_part(model, bias, index, n_parts)
    if k.size and np.abs(k.astype(np.float32)).max() > _ZERO_BIAS_TOL:
        raise ModelError(f"{model.path / 'model.bin'} '{bias}' has a non-zero key bias; Whisper's keys have none.")


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


def _encode(data: SourceArray, qtype: gguf.GGMLQuantizationType, quantize: _Quantize | None) -> np.ndarray:
    raw = getattr(data, "raw", None)
    if raw is not None and raw[0] == qtype:
        return raw[1]  # already in the requested ggml type: copied, not dequantised and quantised again
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


def _int_list(config: dict[str, Any], key: str, path: Path) -> list[int]:
    values = config.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise ModelError(f"{path} '{key}' must be a list of integers.")
    return values


def _alignment_heads(source: WhisperSource) -> list[int]:
    """The [[layer, head], ...] pairs flattened to layer, head, layer, head, ..., checked against the decoder."""
    hp = source.hparams
    pairs = source.alignment_heads
    valid = isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) for v in p)
        and 0 <= p[0] < hp.n_text_layer and 0 <= p[1] < hp.n_text_head
        for p in pairs
    )
    if not valid:
        raise ModelError(
            f"{source.path} alignment_heads must be [layer, head] pairs inside the "
            f"{hp.n_text_layer}-layer, {hp.n_text_head}-head decoder."
        )
    return [v for pair in pairs for v in pair]


def _add_int32_array(writer: gguf.GGUFWriter, key: str, values: list[int]) -> None:
    # gguf-py cannot write an empty array, so an empty list is omitted; readers treat a missing key as [].
    if values:
        writer.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)


def _add_metadata(writer: gguf.GGUFWriter, source: WhisperSource, wtype: str, name: str) -> None:
    hp = source.hparams
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[wtype])
    for key_field, key in HPARAM_KEYS.items():
        writer.add_uint32(key, getattr(hp, key_field))
    writer.add_bool("whisper.multilingual", hp.multilingual)
    _add_int32_array(writer, "whisper.alignment_heads", _alignment_heads(source))
    _add_int32_array(writer, "whisper.suppress_tokens", source.suppress_ids)
    _add_int32_array(writer, "whisper.suppress_tokens_begin", source.suppress_ids_begin)
    _add_int32_array(writer, "whisper.lang_ids", source.lang_ids)
    writer.add_string("whisper.source", source.kind)
    writer.add_string("whisper.source_sha256", source.sha256)
    writer.add_string("tokenizer.huggingface.json", source.tokenizer_json)


def default_name(hp: WhisperHParams) -> str:
    """general.name for a model of these dimensions: whisper-tiny.en, whisper-large-v3, whisper-large-v3-turbo."""
    size = _SIZE_NAMES.get((hp.n_audio_state, hp.n_audio_layer), f"{hp.n_audio_state}x{hp.n_audio_layer}")
    if hp.n_mels == _V3_N_MELS:
        size += "-v3"
    if hp.n_text_layer < hp.n_audio_layer:
        size += "-turbo"  # turbo keeps large-v3's encoder with a 4-layer decoder
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


def ct2_source(model: Ct2Model) -> WhisperSource:
    """The WhisperSource of a parsed CTranslate2 directory (metadata from its config.json)."""
    config_path = model.path / "config.json"
    return WhisperSource(
        path=model.path / "model.bin",
        kind="ctranslate2",
        hparams=whisper_hparams(model),
        lookup=_ct2_lookup(model),
        tokenizer_json=model.tokenizer_json,
        sha256=file_sha256(model.path / "model.bin"),
        alignment_heads=model.config.get("alignment_heads", []),
        suppress_ids=_int_list(model.config, "suppress_ids", config_path),
        suppress_ids_begin=_int_list(model.config, "suppress_ids_begin", config_path),
        lang_ids=_int_list(model.config, "lang_ids", config_path),
    )


def check_wtype(wtype: str) -> None:
    """Raise ModelError naming the accepted weight types unless wtype is one of them."""
    if wtype not in WEIGHT_TYPES:
        raise ModelError(f"Unknown weight type '{wtype}'; accepted: {', '.join(WEIGHT_TYPES)}.")


def write_file(out: Path, arch: str, add_metadata: Callable[[gguf.GGUFWriter], None], tensors: list[_Tensor],
               wtype: str) -> None:
    """One GGUF at `out` (written atomically): `add_metadata`'s keys, then the tensors one at a time, each
    converted from its source, stored as _storage_type gives for wtype, and dropped (peak memory: one tensor)."""
    quantize = _native_quantize() if wtype in _QUANTISED else None
    typed = [(t, _storage_type(t, wtype)) for t in tensors]
    with _atomic_output(out) as tmp:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            add_metadata(writer)
            for t, qtype in typed:
                shape, dtype, n_bytes = _layout(t.data.shape, qtype)
                writer.add_tensor_info(t.name, shape, dtype, n_bytes, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t, qtype in typed:
                writer.write_tensor_data(_encode(t.data, qtype, quantize))
        finally:
            writer.close()


def write_gguf(source: WhisperSource, out_path: str | Path, *, wtype: str = "f16", name: str | None = None) -> Path:
    """Write source as one GGUF at out_path (atomically), matrices stored as wtype; return the path."""
    check_wtype(wtype)
    start = time.perf_counter()
    out = Path(out_path)
    write_file(out, "whisper", lambda w: _add_metadata(w, source, wtype, name or default_name(source.hparams)),
               _plan(source), wtype)
    logger.info(
        "converted %s (%s) to %s (%s, %.1f MiB) in %.2f s",
        source.path, source.kind, out, wtype, out.stat().st_size / 2**20, time.perf_counter() - start,
    )
    return out


def convert_ct2(src_dir: str | Path, out_path: str | Path, *, wtype: str = "f16", name: str | None = None) -> Path:
    """Convert a CTranslate2 Whisper directory into one GGUF at out_path (written atomically); return the path."""
    check_wtype(wtype)
    return write_gguf(ct2_source(read_ct2(src_dir)), out_path, wtype=wtype, name=name)
