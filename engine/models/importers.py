"""Read Whisper models from whisper.cpp ggml .bin files and Hugging Face directories, and convert any
supported source (those two or a CTranslate2 directory) to Aural's GGUF through convert.write_gguf.

Each reader maps its tensor names onto the GGUF names of convert's tensor plan and hands over numpy
views (or LazyTensors for values that must be made: dequantised ggml blocks, bfloat16), so conversion
never holds more than one tensor in memory.

* whisper.cpp ggml .bin: the legacy layout written by whisper.cpp models/convert-pt-to-ggml.py and read by
  src/whisper.cpp whisper_model_load (documented in export_ggml.py, which writes it). F32 and F16 tensors
  are memory-mapped views. Quantised tensors (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are copied block for block
  when the requested --type is the same ggml type, and otherwise dequantised (gguf-py's reference
  dequantiser) and stored as that type. The file keeps only the text tokens, as raw bytes, so the BPE merge
  list is rebuilt from their order: in a byte-level BPE vocabulary a token's id is its merge rank (how
  tiktoken defines its .tiktoken files, which those ggml files copy), so each token is the merge of the
  two pieces that byte-pair merging with only lower-ranked tokens leaves. The special tokens follow from
  n_vocab (openai-whisper tokenizer.py: <|endoftext|>, <|startoftranscript|>, one token per language,
  then translate, transcribe, startoflm, startofprev, nospeech, notimestamps and 1501 timestamps).
* Hugging Face (transformers' WhisperForConditionalGeneration): config.json, model.safetensors or shards
  listed in model.safetensors.index.json, tokenizer.json (or vocab.json + merges.txt), and optionally
  generation_config.json for the alignment heads and suppressed tokens.

Why these dependencies: `safetensors` is the reference reader of the format and maps each file, handing
out one tensor at a time without torch; numpy has no bfloat16, so BF16 tensors are widened here from the
byte offsets in the file's JSON header. `tokenizers` builds the tokenizer JSON that tokenizer.py loads.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import re
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from aural.engine.models.convert import (
    LazyTensor,
    SourceArray,
    WhisperHParams,
    WhisperSource,
    _Cursor,
    check_wtype,
    ct2_source,
    read_ct2,
    write_gguf,
)
from aural.engine.errors import ModelError
from aural.engine.text.tokenizer import LANGUAGES

__all__ = [
    "FORMATS",
    "bpe_tokenizer_json",
    "convert_model",
    "files_sha256",
    "safetensors_lookup",
    "read_ggml_model",
    "read_hf",
    "read_source",
    "source_format",
    "source_sha256",
]

# Source format -> short prefix of its cache file name (store.py).
FORMATS = {"ctranslate2": "ct2", "huggingface": "hf", "whisper.cpp": "ggml"}

_GGML_MAGIC = 0x67676D6C  # "ggml" (ggml.h GGML_FILE_MAGIC); export_ggml.GGML_MAGIC, which imports models
_N_FFT_BINS = 201  # 400-point STFT -> 201 bins, the filterbank's second dimension
_MAX_DIMS = 4  # ggml tensors have at most GGML_MAX_DIMS = 4 dimensions
_MAX_NAME = 256  # whisper.cpp tensor names are < 64 bytes; anything this long is a corrupt header
_Q = gguf.GGMLQuantizationType
_GGML_TYPES = (_Q.F32, _Q.F16, _Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1, _Q.Q8_0)
_GGML_HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
                 "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels")

# Special tokens after the text tokens (openai-whisper tokenizer.py): <|endoftext|>, <|startoftranscript|>,
# the languages, 6 task/control tokens, then 1501 timestamps <|0.00|> .. <|30.00|> in 0.02 s steps.
_CONTROL = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
_N_TIMESTAMPS = 1501
_EOT = b"<|endoftext|>"
_N_SPECIALS_BESIDES_LANGUAGES = 2 + len(_CONTROL) + _N_TIMESTAMPS
_HASH_CHUNK = 1 << 20  # bytes read per step when hashing


# -- detection and conversion ----------------------------------------------------------------------


def source_format(path: str | Path) -> str:
    """"ctranslate2", "huggingface" or "whisper.cpp" for a model directory or file; ModelError otherwise."""
    path = Path(path)
    if path.is_dir():
        if (path / "model.bin").is_file():
            return "ctranslate2"
        if (path / "config.json").is_file() and _hf_index(path) is not None:
            return "huggingface"
        raise ModelError(
            f"{path} has no model.bin (CTranslate2) nor config.json with model.safetensors (Hugging Face), "
            "so it is not a Whisper model directory."
        )
    if not path.is_file():
        raise ModelError(f"Model file {path} does not exist.")
    try:
        with path.open("rb") as file:
            head = file.read(4)
    except OSError as exc:
        raise ModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if len(head) == 4 and struct.unpack("<I", head)[0] == _GGML_MAGIC:
        return "whisper.cpp"
    raise ModelError(f"{path} is not a whisper.cpp ggml model file (it does not start with the ggml magic).")


def read_source(path: str | Path) -> WhisperSource:
    """Read a CTranslate2 directory, a Hugging Face directory or a whisper.cpp ggml .bin."""
    kind = source_format(path)
    if kind == "ctranslate2":
        return ct2_source(read_ct2(path))
    return read_hf(path) if kind == "huggingface" else read_ggml_model(path)


def convert_model(src: str | Path, out_path: str | Path, *, wtype: str = "f16", name: str | None = None) -> Path:
    """Convert any supported source, a Qwen3-ASR checkpoint included, to one GGUF at out_path (written
    atomically); return the path."""
    from aural.engine.models.qwen3_asr import convert_qwen3_asr, is_qwen3_asr  # it reads safetensors with ours

    check_wtype(wtype)
    if is_qwen3_asr(src):
        return convert_qwen3_asr(src, out_path, wtype=wtype, name=name)
    return write_gguf(read_source(src), out_path, wtype=wtype, name=name)


def source_sha256(path: str | Path) -> str:
    """Hex sha256 of a source's weight files, read in order (model.bin, the .bin, or the safetensors shards)."""
    path = Path(path)
    kind = source_format(path)
    if kind == "ctranslate2":
        files = [path / "model.bin"]
    elif kind == "huggingface":
        files = sorted(set(_hf_index(path).values()))
    else:
        files = [path]
    return files_sha256(files)


def files_sha256(files: list[Path]) -> str:
    """Hex sha256 of the files' bytes read one after another; ModelError naming one that cannot be read."""
    digest = hashlib.sha256()
    for file in files:
        try:
            with file.open("rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            raise ModelError(f"Cannot read {file}: {exc.strerror or exc}.") from exc
    return digest.hexdigest()


# -- tokenizer -------------------------------------------------------------------------------------


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes (controls,
    space, 0x7f-0xa0, 0xad) take the code points from U+0100 upward, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    for i, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(0x100 + i)
    return table


def _merges_from_ranks(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """BPE merges in priority order, recovered from tokens listed by merge rank (see the module docstring)."""
    ranks = {token: rank for rank, token in enumerate(tokens)}
    merges = []
    for rank, token in enumerate(tokens):
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            found = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best, i = min(found)
            if best >= rank:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2 and ranks.get(parts[0], rank) < rank and ranks.get(parts[1], rank) < rank:
            merges.append((parts[0], parts[1]))
    return merges


def _special_tokens(n_text: int, n_vocab: int, path: Path) -> list[str]:
    """The special tokens that follow n_text text tokens in a vocabulary of n_vocab ids, timestamps excluded.

    tokenizer.py finds timestamps as the ids after <|notimestamps|>, so they are not added to the JSON.
    """
    n_languages = n_vocab - n_text - _N_SPECIALS_BESIDES_LANGUAGES
    if not 0 <= n_languages <= len(LANGUAGES):
        raise ModelError(
            f"{path}: {n_text} text tokens do not fit a Whisper vocabulary of {n_vocab} "
            f"(which leaves room for {n_languages} languages; Whisper has up to {len(LANGUAGES)})."
        )
    languages = [f"<|{code}|>" for code in list(LANGUAGES)[:n_languages]]
    return ["<|endoftext|>", "<|startoftranscript|>", *languages, *_CONTROL]


def bpe_tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]], n_vocab: int, path: Path) -> str:
    """HF tokenizers JSON of a byte-level BPE vocabulary (strings in GPT-2's alphabet) plus Whisper's specials.

    Specials already in vocab (HF's vocab.json holds <|endoftext|>) keep their ids; the rest follow in order.
    """
    n_text = vocab.get("<|endoftext|>", len(vocab))
    # Specials are numbered after the text tokens, so a gap or a duplicate would shift every one of them.
    if {v for k, v in vocab.items() if k != "<|endoftext|>"} != set(range(n_text)):
        raise ModelError(f"{path}: the text tokens are not numbered 0..{n_text - 1} without gaps or duplicates.")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = _special_tokens(n_text, n_vocab, path)
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokenizer.to_str()


def _tokenizer_from_bytes(tokens: list[bytes], n_vocab: int, path: Path) -> str:
    # convert-pt-to-ggml.py stores the text tokens only; convert-h5-to-ggml.py stores HF's vocab.json, which
    # ends with <|endoftext|>. Both become the text tokens, and the specials are added after them.
    if _EOT in tokens:
        tokens = tokens[: tokens.index(_EOT)]
    to_unicode = _byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    vocab = {text(token): i for i, token in enumerate(tokens)}
    merges = [(text(a), text(b)) for a, b in _merges_from_ranks(tokens)]
    return bpe_tokenizer_json(vocab, merges, n_vocab, path)


# -- whisper.cpp ggml .bin -------------------------------------------------------------------------


def read_ggml_model(path: str | Path) -> WhisperSource:
    """Parse a whisper.cpp ggml .bin (memory-mapped) into a WhisperSource."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            if path.stat().st_size == 0:
                raise ModelError(f"{path} is empty.")
            buf = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)  # views keep it alive after close
    except OSError as exc:
        raise ModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    cursor = _Cursor(buf, path)
    if cursor.unpack("I") != _GGML_MAGIC:
        raise ModelError(f"{path} is not a whisper.cpp ggml model file (it does not start with the ggml magic).")
    hp = _ggml_hparams(cursor)
    filters = _ggml_filters(cursor, hp.n_mels)
    tokens = _ggml_tokens(cursor, hp.n_vocab)
    tensors = _ggml_tensors(cursor)
    from aural.engine.models.export_ggml import ggml_tensor_name  # imported here: export_ggml imports models

    def lookup(name: str) -> tuple[SourceArray, str]:
        ggml_name = ggml_tensor_name(name)
        if ggml_name not in tensors:
            raise ModelError(f"{path} has no tensor '{ggml_name}'; it is not a complete Whisper model.")
        values = tensors[ggml_name]
        if name in ("enc.conv1.bias", "enc.conv2.bias"):
            values = np.asarray(values).reshape(-1)  # whisper.cpp stores the conv biases as [n_state, 1]
        return values, ggml_name

    return WhisperSource(
        path=path, kind="whisper.cpp", hparams=hp, lookup=lookup,
        tokenizer_json=_tokenizer_from_bytes(tokens, hp.n_vocab, path),
        sha256=source_sha256(path), mel_filters=filters,
    )


def _ggml_hparams(cursor: _Cursor) -> WhisperHParams:
    values = [cursor.unpack("i") for _ in _GGML_HPARAMS]
    ftype = cursor.unpack("i")
    if min(values) <= 0 or ftype < 0:
        raise ModelError(f"{cursor.path} has a corrupt header: hyper-parameters {values}, ftype {ftype}.")
    return WhisperHParams(**dict(zip(_GGML_HPARAMS, values)))


def _ggml_filters(cursor: _Cursor, n_mels: int) -> np.ndarray:
    n_mel, n_fft = cursor.unpack("i"), cursor.unpack("i")
    if (n_mel, n_fft) != (n_mels, _N_FFT_BINS):
        raise ModelError(f"{cursor.path} has a {n_mel} x {n_fft} mel filterbank; expected {n_mels} x {_N_FFT_BINS}.")
    start = cursor.take(4 * n_mel * n_fft)
    return np.frombuffer(cursor.buf, dtype="<f4", count=n_mel * n_fft, offset=start).reshape(n_mel, n_fft)


def _ggml_tokens(cursor: _Cursor, n_vocab: int) -> list[bytes]:
    n_tokens = cursor.unpack("i")
    if not 0 < n_tokens < n_vocab:
        raise ModelError(f"{cursor.path} lists {n_tokens} tokens for a vocabulary of {n_vocab} (corrupt).")
    tokens = []
    for _ in range(n_tokens):
        length = cursor.unpack("i")
        if length < 0:
            raise ModelError(f"{cursor.path} has a token of length {length} (corrupt).")
        start = cursor.take(length)
        tokens.append(bytes(cursor.buf[start : start + length]))
    return tokens


def _ggml_tensors(cursor: _Cursor) -> dict[str, SourceArray]:
    """Tensor records until the end of the file: whisper.cpp name -> values in numpy (reversed ne) shape."""
    tensors = {}
    while cursor.pos < len(cursor.buf):
        n_dims, name_len, type_id = (cursor.unpack("i") for _ in range(3))
        if not 1 <= n_dims <= _MAX_DIMS or not 0 < name_len <= _MAX_NAME or type_id not in _GGML_TYPES:
            raise ModelError(
                f"{cursor.path} has a corrupt tensor header at byte {cursor.pos - 12} "
                f"(dimensions {n_dims}, name length {name_len}, ggml type {type_id})."
            )
        ne = [cursor.unpack("i") for _ in range(n_dims)]
        start = cursor.take(name_len)
        name = bytes(cursor.buf[start : start + name_len]).decode("utf-8", "replace")
        tensors[name] = _ggml_values(cursor, name, _Q(type_id), tuple(reversed(ne)))
    return tensors


def _ggml_values(cursor: _Cursor, name: str, qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> SourceArray:
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if min(shape) <= 0 or shape[-1] % block:
        raise ModelError(f"{cursor.path} tensor '{name}' has shape {shape}, which does not fill {qtype.name} blocks.")
    count = int(np.prod(shape, dtype=np.int64))
    start = cursor.take(count // block * type_size)
    if qtype in (_Q.F32, _Q.F16):
        dtype = "<f4" if qtype == _Q.F32 else "<f2"
        return np.frombuffer(cursor.buf, dtype=dtype, count=count, offset=start).reshape(shape)
    rows = np.frombuffer(cursor.buf, dtype=np.uint8, count=count // block * type_size, offset=start)
    rows = rows.reshape(*shape[:-1], shape[-1] // block * type_size)
    return LazyTensor(shape, np.float32, partial(dequantize, rows, qtype), raw=(qtype, rows))


# -- Hugging Face directory ------------------------------------------------------------------------

# GGUF name -> transformers' WhisperModel name for whole-model tensors (modeling_whisper.py).
_HF_GLOBAL = {
    "enc.conv1.weight": "encoder.conv1.weight", "enc.conv1.bias": "encoder.conv1.bias",
    "enc.conv2.weight": "encoder.conv2.weight", "enc.conv2.bias": "encoder.conv2.bias",
    "enc.pos": "encoder.embed_positions.weight",
    "enc.ln_post.weight": "encoder.layer_norm.weight", "enc.ln_post.bias": "encoder.layer_norm.bias",
    "dec.tok_emb": "decoder.embed_tokens.weight", "dec.pos": "decoder.embed_positions.weight",
    "dec.ln.weight": "decoder.layer_norm.weight", "dec.ln.bias": "decoder.layer_norm.bias",
}
# Block part -> the module of WhisperEncoderLayer / WhisperDecoderLayer.
_HF_BLOCK = {
    "attn_ln": "self_attn_layer_norm", "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj", "attn.out": "self_attn.out_proj", "cross_ln": "encoder_attn_layer_norm",
    "cross.q": "encoder_attn.q_proj", "cross.k": "encoder_attn.k_proj", "cross.v": "encoder_attn.v_proj",
    "cross.out": "encoder_attn.out_proj", "mlp_ln": "final_layer_norm", "mlp.0": "fc1", "mlp.2": "fc2",
}
_BLOCK_RE = re.compile(r"(enc|dec)\.blk\.(\d+)\.(.+)\.(weight|bias)$")
# WhisperHParams field -> transformers WhisperConfig key; one d_model serves encoder and decoder.
_HF_CONFIG = {
    "n_vocab": "vocab_size", "n_audio_ctx": "max_source_positions", "n_audio_state": "d_model",
    "n_audio_head": "encoder_attention_heads", "n_audio_layer": "encoder_layers",
    "n_text_ctx": "max_target_positions", "n_text_state": "d_model", "n_text_head": "decoder_attention_heads",
    "n_text_layer": "decoder_layers", "n_mels": "num_mel_bins",
}
_HF_FLOAT = {"F32": np.float32, "F16": np.float16}
_SAFETENSORS_HEADER = struct.Struct("<Q")  # the file starts with the JSON header's byte length


def _hf_tensor_name(name: str) -> str:
    """transformers' name for a GGUF tensor (enc.blk.0.attn.q.weight -> encoder.layers.0.self_attn.q_proj.weight)."""
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    m = _BLOCK_RE.match(name)
    stack = "encoder" if m.group(1) == "enc" else "decoder"
    return f"{stack}.layers.{m.group(2)}.{_HF_BLOCK[m.group(3)]}.{m.group(4)}"


def _hf_index(directory: Path) -> dict[str, Path] | None:
    """Tensor name -> the safetensors file holding it, or None when the directory has no safetensors weights."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelError(f"{index} has no 'weight_map' object.")
        return {name: directory / file for name, file in weight_map.items()}
    if single.is_file():
        return {name: single for name in _safetensors_header(single)}
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path} is missing.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path} cannot be read as JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} must hold a JSON object.")
    return data


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: tensor name -> {dtype, shape, data_offsets}, plus __metadata__."""
    try:
        with path.open("rb") as f:
            raw = f.read(_SAFETENSORS_HEADER.size)
            (size,) = _SAFETENSORS_HEADER.unpack(raw) if len(raw) == _SAFETENSORS_HEADER.size else (-1,)
            header = json.loads(f.read(size)) if 0 < size <= path.stat().st_size else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path} is not a readable safetensors file ({exc}).") from exc
    if not isinstance(header, dict):
        raise ModelError(f"{path} is not a safetensors file (bad header).")
    header.pop("__metadata__", None)
    return header


def read_hf(path: str | Path) -> WhisperSource:
    """Read a Hugging Face Whisper directory (config.json, safetensors weights, tokenizer) into a WhisperSource."""
    directory = Path(path)
    config = _read_json(directory / "config.json")
    if config.get("model_type", "whisper") != "whisper":
        raise ModelError(f"{directory / 'config.json'} describes a '{config['model_type']}' model, not Whisper.")
    hp = _hf_hparams(config, directory / "config.json")
    index = _hf_index(directory)
    if index is None:
        raise ModelError(f"{directory} has no model.safetensors or model.safetensors.index.json.")
    generation_path = directory / "generation_config.json"
    generation = _read_json(generation_path) if generation_path.is_file() else {}
    lang_ids = generation.get("lang_to_id", {})
    return WhisperSource(
        path=directory, kind="huggingface", hparams=hp, lookup=_hf_lookup(directory, index),
        tokenizer_json=_hf_tokenizer(directory, hp.n_vocab),
        sha256=source_sha256(directory),
        alignment_heads=generation.get("alignment_heads", []),
        suppress_ids=_ints(generation, config, "suppress_tokens", directory),
        suppress_ids_begin=_ints(generation, config, "begin_suppress_tokens", directory),
        lang_ids=sorted(lang_ids.values()) if isinstance(lang_ids, dict) else [],
    )


def _hf_hparams(config: dict[str, Any], path: Path) -> WhisperHParams:
    values = {name: config.get(key) for name, key in _HF_CONFIG.items()}
    bad = [_HF_CONFIG[name] for name, v in values.items() if not isinstance(v, int) or v <= 0]
    if bad:
        raise ModelError(f"{path} lacks positive integer values for {', '.join(sorted(set(bad)))}.")
    return WhisperHParams(**values)


def _ints(generation: dict[str, Any], config: dict[str, Any], key: str, directory: Path) -> list[int]:
    # transformers moved these from config.json to generation_config.json; older exports have them in the former.
    values = generation.get(key, config.get(key)) or []
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise ModelError(f"{directory}: '{key}' must be a list of integers.")
    return values


def _hf_lookup(directory: Path, index: dict[str, Path]) -> Callable[[str], tuple[SourceArray, str]]:
    # Both spellings occur: WhisperForConditionalGeneration prefixes "model.", a bare WhisperModel does not.
    find = safetensors_lookup(directory, index, "model.", "a complete Whisper model")

    def lookup(name: str) -> tuple[SourceArray, str]:
        values, stored, _ = find(_hf_tensor_name(name))
        return values, stored

    return lookup


def safetensors_lookup(directory: Path, index: dict[str, Path], prefix: str,
                       what: str) -> Callable[[str], tuple[LazyTensor, str, Path]]:
    """A lookup of tensors by their stored name less `prefix`: (lazy values, stored name, file). ModelError
    saying the directory is not `what` for a missing one."""
    names = {name.removeprefix(prefix): name for name in index}
    headers: dict[Path, dict[str, Any]] = {}

    def lookup(name: str) -> tuple[LazyTensor, str, Path]:
        stored = names.get(name)
        if stored is None:
            raise ModelError(f"{directory} has no tensor '{name}'; it is not {what}.")
        file = index[stored]
        if file not in headers:
            headers[file] = _safetensors_header(file)
        return _hf_values(file, headers[file], stored), stored, file

    return lookup


def _hf_values(file: Path, header: dict[str, Any], name: str) -> LazyTensor:
    entry = header.get(name)
    if not isinstance(entry, dict):
        raise ModelError(f"{file} has no tensor '{name}' although model.safetensors.index.json lists it there.")
    dtype, shape = entry.get("dtype"), tuple(entry.get("shape", ()))
    if dtype == "BF16":
        return LazyTensor(shape, np.float32, partial(_bf16_values, file, header, name))
    if dtype not in _HF_FLOAT:
        raise ModelError(f"{file} stores '{name}' as {dtype}; only F32, F16 and BF16 weights can be converted.")
    return LazyTensor(shape, _HF_FLOAT[dtype], partial(_safetensors_tensor, file, name))


def _safetensors_tensor(file: Path, name: str) -> np.ndarray:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="np") as f:
            return f.get_tensor(name)
    except (OSError, SafetensorError) as exc:
        raise ModelError(f"{file} cannot be read ({exc}).") from exc


def _bf16_values(file: Path, header: dict[str, Any], name: str) -> np.ndarray:
    """A BF16 tensor widened to float32: bfloat16 is the top half of a float32's bits."""
    begin, end = header[name]["data_offsets"]
    shape = tuple(header[name]["shape"])
    with file.open("rb") as f:
        data_start = _SAFETENSORS_HEADER.size + _SAFETENSORS_HEADER.unpack(f.read(_SAFETENSORS_HEADER.size))[0]
    count = int(np.prod(shape, dtype=np.int64))
    if end - begin != 2 * count or data_start + end > file.stat().st_size:
        raise ModelError(f"{file} tensor '{name}' is truncated or its offsets are corrupt.")
    halves = np.fromfile(file, dtype="<u2", count=count, offset=data_start + begin)
    return (halves.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _hf_tokenizer(directory: Path, n_vocab: int) -> str:
    """tokenizer.json as it is, else one built from vocab.json and merges.txt (the slow tokenizer's files)."""
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        return tokenizer_json.read_text(encoding="utf-8")
    if not (directory / "vocab.json").is_file() or not (directory / "merges.txt").is_file():
        raise ModelError(f"{directory} has no tokenizer.json, nor vocab.json with merges.txt.")
    vocab = _read_json(directory / "vocab.json")
    lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
    # merges.txt starts with a "#version" comment line; each other line is "left right".
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    if not all(len(m) == 2 for m in merges):
        raise ModelError(f"{directory / 'merges.txt'} has lines that are not two space-separated tokens.")
    return bpe_tokenizer_json(vocab, merges, n_vocab, directory)
