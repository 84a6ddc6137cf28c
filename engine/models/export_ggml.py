"""Export an Aural Whisper model to whisper.cpp's legacy `ggml-*.bin` format.

Used by the peer benchmarks (bench/) so whisper.cpp runs the very same weights as Aural and
faster-whisper, and as an end-to-end check of our converter: CTranslate2 -> Aural GGUF -> ggml .bin ->
whisper.cpp must still transcribe correctly.

The source is anything `models.resolve_model` accepts (a model name, a CTranslate2 directory, or an
Aural .gguf); the weights are read back from the GGUF, so the export goes through our converter.

File layout (whisper.cpp models/convert-pt-to-ggml.py writes it, src/whisper.cpp whisper_model_load
reads it), all little-endian:

    int32 magic 0x67676d6c ("ggml")
    int32 n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
          n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype
    int32 n_mel, n_fft; float32[n_mel * n_fft] mel filterbank
    int32 n_tokens; n_tokens x (int32 length, raw token bytes)   -- text tokens only, no specials
    tensors until end of file, each:
        int32 n_dims, int32 name length, int32 ggml type
        int32 ne[n_dims] (ggml order: fastest-varying dimension first)
        name bytes (no NUL), then the raw data

whisper.cpp looks tensors up by name and checks each one's ne and ggml type against what it expects:
1-D tensors, both positional embeddings and the conv biases (stored as ne [1, n_state]) are F32; the
conv kernels are F16 (F32 in an all-F32 model); every other 2-D weight, the token embedding included,
has the model's weight type. The special tokens (<|endoftext|> onward) are not stored: whisper.cpp
derives them from n_vocab.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import gguf
import numpy as np

from ..errors import AuralError, ModelError
from ..features import mel_filters
from .store import model_info, resolve_model

__all__ = [
    "GGML_MAGIC",
    "GgmlFile",
    "GgmlTensor",
    "export_ggml",
    "ggml_tensor_name",
    "main",
    "read_ggml",
]

logger = logging.getLogger(__name__)

GGML_MAGIC = 0x67676D6C  # "ggml" (ggml.h GGML_FILE_MAGIC)
# ggml.h: a quantised file's ftype carries GGML_QNT_VERSION * GGML_QNT_VERSION_FACTOR on top of the type.
_QNT_VERSION = 2
_QNT_VERSION_FACTOR = 1000
_N_FFT_BINS = 201  # 400-point STFT -> 201 bins (the filterbank's second dimension)

_T = gguf.GGMLQuantizationType
# Weight type -> (header ftype, ggml_ftype enum in ggml.h; ggml type of the 2-D weights).
_FTYPES = {
    "f32": (0, _T.F32),
    "f16": (1, _T.F16),
    "q4_0": (2, _T.Q4_0),
    "q8_0": (7, _T.Q8_0),
    "q5_0": (8, _T.Q5_0),
}
_FLOAT_TYPES = (_T.F32, _T.F16)
_NP_FLOAT = {_T.F32: np.float32, _T.F16: np.float16}

# Order of the hyper-parameters in the header (whisper_model_load reads them in this order).
_HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
            "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels")

# Aural GGUF name -> whisper.cpp name. Block-level parts first, then whole-model tensors.
_BLOCK_PARTS = {
    "attn_ln": "attn_ln", "attn.q": "attn.query", "attn.k": "attn.key", "attn.v": "attn.value",
    "attn.out": "attn.out", "cross_ln": "cross_attn_ln", "cross.q": "cross_attn.query",
    "cross.k": "cross_attn.key", "cross.v": "cross_attn.value", "cross.out": "cross_attn.out",
    "mlp_ln": "mlp_ln", "mlp.0": "mlp.0", "mlp.2": "mlp.2",
}
_GLOBAL = {
    "enc.conv1.weight": "encoder.conv1.weight", "enc.conv1.bias": "encoder.conv1.bias",
    "enc.conv2.weight": "encoder.conv2.weight", "enc.conv2.bias": "encoder.conv2.bias",
    "enc.pos": "encoder.positional_embedding", "enc.ln_post.weight": "encoder.ln_post.weight",
    "enc.ln_post.bias": "encoder.ln_post.bias", "dec.tok_emb": "decoder.token_embedding.weight",
    "dec.pos": "decoder.positional_embedding", "dec.ln.weight": "decoder.ln.weight",
    "dec.ln.bias": "decoder.ln.bias",
}
_BLOCK_RE = re.compile(r"(enc|dec)\.blk\.(\d+)\.(.+)\.(weight|bias)$")
_CONV_WEIGHTS = ("encoder.conv1.weight", "encoder.conv2.weight")
_CONV_BIASES = ("encoder.conv1.bias", "encoder.conv2.bias")
_POSITIONAL = ("encoder.positional_embedding", "decoder.positional_embedding")


def ggml_tensor_name(name: str) -> str:
    """whisper.cpp's name for an Aural GGUF tensor ("enc.blk.0.attn.q.weight" -> "encoder.blocks.0.attn.query.weight")."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLOCK_RE.match(name)
    if m is None or m.group(3) not in _BLOCK_PARTS:
        raise ModelError(f"tensor '{name}' has no whisper.cpp counterpart")
    stack = "encoder" if m.group(1) == "enc" else "decoder"
    return f"{stack}.blocks.{m.group(2)}.{_BLOCK_PARTS[m.group(3)]}.{m.group(4)}"


def _expected_type(name: str, n_dims: int, wtype: str) -> gguf.GGMLQuantizationType:
    """The ggml type whisper_model_load creates for a tensor (it refuses any other)."""
    if name in _CONV_WEIGHTS:
        return _T.F32 if wtype == "f32" else _T.F16
    if n_dims == 1 or name in _CONV_BIASES or name in _POSITIONAL:
        return _T.F32
    return _FTYPES[wtype][1]


# -- byte-level BPE vocabulary ---------------------------------------------------------------------


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes
    (controls, space, 0x7f-0xa0, 0xad) take the code points from U+0100 upward, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in set(printable))
    for i, b in enumerate(shifted):
        table[chr(0x100 + i)] = b
    return table


def _text_tokens(tokenizer_json: str) -> list[bytes]:
    """The raw bytes of every text token (ids below <|endoftext|>), in id order."""
    try:
        spec = json.loads(tokenizer_json)
        vocab: dict[str, int] = spec["model"]["vocab"]
        specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"the model's tokenizer JSON is not a byte-level BPE tokenizer ({exc})") from exc
    eot = specials.get("<|endoftext|>", vocab.get("<|endoftext|>"))
    if eot is None:
        raise ModelError("the model's tokenizer has no <|endoftext|> token")
    decoder = _byte_decoder()
    tokens = [b""] * eot
    for text, idx in vocab.items():
        if idx < eot:
            try:
                tokens[idx] = bytes(decoder[c] for c in text)
            except KeyError:
                raise ModelError(f"token {idx} ({text!r}) is not in the byte-level alphabet") from None
    return tokens


# -- export ----------------------------------------------------------------------------------------


def _write_i32(out: BinaryIO, *values: int) -> None:
    out.write(struct.pack(f"<{len(values)}i", *values))


def _tensor_payload(t: gguf.ReaderTensor, target: gguf.GGMLQuantizationType, name: str) -> tuple[list[int], bytes]:
    """(ne, raw bytes) of a GGUF tensor stored as `target`, converting only between F16 and F32."""
    ne = [int(n) for n in t.shape]
    if name in _CONV_BIASES:
        ne = [1, *ne]  # whisper.cpp adds the conv bias as an [1, n_state] column
    source = _T(t.tensor_type)
    if source == target:
        return ne, np.ascontiguousarray(t.data).tobytes()
    if source in _FLOAT_TYPES and target in _FLOAT_TYPES:
        return ne, np.ascontiguousarray(t.data, dtype=_NP_FLOAT[target]).tobytes()
    raise ModelError(
        f"tensor {t.name} is {source.name} but whisper.cpp expects {target.name}; export from a "
        "model converted with the same --type"
    )


def export_ggml(source: str | Path | None, out: str | Path, *, wtype: str = "f16") -> Path:
    """Write whisper.cpp's ggml .bin for `source` (model name, CTranslate2 directory or Aural GGUF).

    wtype: weight type of the 2-D matrices (f32, f16, q8_0, q5_0, q4_0). For a name or CTranslate2
    directory the GGUF of that type is converted (or reused from the cache); a .gguf is used as it is
    and must hold that type. The output is written atomically. Returns its path.
    """
    if wtype not in _FTYPES:
        raise ModelError(f"Unknown weight type '{wtype}'; accepted: {', '.join(_FTYPES)}.")
    gguf_path = resolve_model(source, wtype=wtype)
    info = model_info(gguf_path)
    reader = gguf.GGUFReader(gguf_path)
    by_name = {t.name: t for t in reader.tensors}
    n_mels = int(info["n_mels"])
    mel = by_name.pop("mel_filters", None)
    filters = (np.asarray(mel.data, dtype=np.float32) if mel is not None
               else mel_filters(n_mels).astype(np.float32)).reshape(n_mels, _N_FFT_BINS)
    tokens = _text_tokens(info["tokenizer_json"])
    header_ftype, _ = _FTYPES[wtype]
    if wtype not in ("f32", "f16"):
        header_ftype += _QNT_VERSION * _QNT_VERSION_FACTOR

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("wb") as f:
            _write_i32(f, GGML_MAGIC, *(int(info[k]) for k in _HPARAMS), header_ftype)
            _write_i32(f, *filters.shape)
            f.write(np.ascontiguousarray(filters, dtype="<f4").tobytes())
            _write_i32(f, len(tokens))
            for token in tokens:
                _write_i32(f, len(token))
                f.write(token)
            for t in by_name.values():
                name = ggml_tensor_name(t.name)
                target = _expected_type(name, len(t.shape), wtype)
                ne, payload = _tensor_payload(t, target, name)
                encoded = name.encode("utf-8")
                _write_i32(f, len(ne), len(encoded), int(target), *ne)
                f.write(encoded)
                f.write(payload)
        tmp.replace(out)
    except OSError as exc:
        raise ModelError(f"Cannot write {out}: {exc.strerror or exc}.") from exc
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("exported %s to %s (%s, %.1f MiB)", gguf_path.name, out, wtype, out.stat().st_size / 2**20)
    return out


# -- reading back ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GgmlTensor:
    """One tensor record of a ggml .bin.

    Attributes:
        name: whisper.cpp tensor name.
        ggml_type: ggml type id (0 F32, 1 F16, 2 Q4_0, 6 Q5_0, 8 Q8_0, ...).
        ne: dimensions, fastest-varying first (ggml order).
        offset: byte offset of the data in the file.
        n_bytes: size of the data.
    """

    name: str
    ggml_type: int
    ne: tuple[int, ...]
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class GgmlFile:
    """A parsed whisper.cpp ggml .bin (weights are located, not read).

    Attributes:
        hparams: n_vocab ... n_mels as in the header.
        ftype: header ftype without the quantisation version.
        qnt_version: the quantisation version carried in ftype (0 for F32/F16).
        mel_filters: (n_mel, n_fft) float32 filterbank.
        tokens: raw bytes of each stored token.
        tensors: the tensor records in file order.
    """

    hparams: dict[str, int]
    ftype: int
    qnt_version: int
    mel_filters: np.ndarray
    tokens: list[bytes]
    tensors: list[GgmlTensor]

    def tensor_data(self, path: str | Path, name: str) -> np.ndarray:
        """The values of an F32 or F16 tensor, in numpy (reversed ne) shape."""
        t = next((t for t in self.tensors if t.name == name), None)
        if t is None:
            raise KeyError(name)
        dtype = {0: "<f4", 1: "<f2"}.get(t.ggml_type)
        if dtype is None:
            raise ValueError(f"{name} is ggml type {t.ggml_type}, not F32 or F16")
        with open(path, "rb") as f:
            f.seek(t.offset)
            raw = f.read(t.n_bytes)
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(reversed(t.ne)))


def _tensor_bytes(ggml_type: int, ne: tuple[int, ...]) -> int:
    qtype = _T(ggml_type)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    count = int(np.prod(ne))
    if count % block:
        raise ModelError(f"{count} values do not fill {qtype.name} blocks of {block}")
    return count // block * type_size


def _records(buf: bytes, pos: int) -> Iterator[tuple[GgmlTensor, int]]:
    while pos < len(buf):
        if pos + 12 > len(buf):
            raise ModelError(f"ggml file is truncated in a tensor header at byte {pos}")
        n_dims, name_len, ggml_type = struct.unpack_from("<3i", buf, pos)
        pos += 12
        if not 1 <= n_dims <= 4 or not 0 < name_len < 1024:
            raise ModelError(f"corrupt tensor header at byte {pos - 12} (n_dims {n_dims}, name length {name_len})")
        ne = struct.unpack_from(f"<{n_dims}i", buf, pos)
        pos += 4 * n_dims
        name = buf[pos:pos + name_len].decode("utf-8")
        pos += name_len
        n_bytes = _tensor_bytes(ggml_type, ne)
        if pos + n_bytes > len(buf):
            raise ModelError(f"ggml file is truncated inside tensor {name}")
        yield GgmlTensor(name, ggml_type, tuple(ne), pos, n_bytes), pos + n_bytes
        pos += n_bytes


def read_ggml(path: str | Path) -> GgmlFile:
    """Parse a whisper.cpp ggml .bin: header, filterbank, vocabulary and the tensor table."""
    buf = Path(path).read_bytes()
    if len(buf) < 4 * 12 or struct.unpack_from("<I", buf, 0)[0] != GGML_MAGIC:
        raise ModelError(f"{path} is not a ggml model file (bad magic)")
    values = struct.unpack_from("<11i", buf, 4)
    hparams = dict(zip(_HPARAMS, values[:10]))
    qnt_version, ftype = divmod(values[10], _QNT_VERSION_FACTOR)
    pos = 48
    n_mel, n_fft = struct.unpack_from("<2i", buf, pos)
    pos += 8
    filters = np.frombuffer(buf, dtype="<f4", count=n_mel * n_fft, offset=pos).reshape(n_mel, n_fft).copy()
    pos += 4 * n_mel * n_fft
    (n_tokens,) = struct.unpack_from("<i", buf, pos)
    pos += 4
    tokens = []
    for _ in range(n_tokens):
        (length,) = struct.unpack_from("<i", buf, pos)
        pos += 4
        tokens.append(bytes(buf[pos:pos + length]))
        pos += length
    tensors = [t for t, _ in _records(buf, pos)]
    return GgmlFile(hparams, ftype, qnt_version, filters, tokens, tensors)


# -- command line ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aural.engine.models.export_ggml",
        description="Export an Aural Whisper model to whisper.cpp's ggml .bin format.")
    parser.add_argument("source", nargs="?", default=None,
                        help="model name (tiny.en, base), CTranslate2 directory or Aural .gguf (default: tiny.en)")
    parser.add_argument("out", type=Path, help="output .bin path, e.g. ggml-tiny.en.bin")
    parser.add_argument("--type", dest="wtype", default="f16", choices=list(_FTYPES),
                        help="weight type of the 2-D matrices (default f16, as whisper.cpp's own models)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = export_ggml(args.source, args.out, wtype=args.wtype)
    except AuralError as exc:
        print(f"export_ggml: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
