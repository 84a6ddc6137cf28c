"""Convert a Qwen3-ASR checkpoint (the layout of Qwen/Qwen3-ASR-0.6B on Hugging Face) to Aural's GGUF.

The checkpoint: config.json (model_type "qwen3_asr"; thinker_config holding audio_config, text_config and
the audio token ids), model.safetensors (or shards with model.safetensors.index.json; bf16 in the official
release), generation_config.json, preprocessor_config.json (the Whisper-style 128-bin front end), and the
tokenizer's vocab.json, merges.txt and tokenizer_config.json (its added_tokens_decoder holds the specials).

Every hyper-parameter and special token id is read from those files; a missing or ill-typed one is an error
naming the file and key, never a default: the `qwen-asr` package's config classes default to other sizes
than the 0.6B checkpoint has (d_model 1280 and 32 encoder layers against 896 and 18).

Tensor names stay Qwen's own (modeling_qwen3_asr.py in the `qwen-asr` package) less the "thinker." prefix,
e.g. audio_tower.layers.0.self_attn.q_proj.weight, model.layers.0.mlp.gate_proj.weight: the longest is
under ggml's 64-character limit. The output projection is tied to model.embed_tokens when the config says
so (tie_word_embeddings), and a lm_head.weight the checkpoint may still carry is then not written.

    aural models convert ~/Downloads/Qwen3-ASR-0.6B --type q8_0
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from aural.engine.errors import ModelError
from aural.engine.models.convert import FILE_TYPES, SourceArray, _add_int32_array, _Tensor, check_wtype, write_file
from aural.engine.models.importers import _hf_index, _read_json, files_sha256, safetensors_lookup

__all__ = ["ARCH", "Qwen3AsrSource", "convert_qwen3_asr", "is_qwen3_asr", "plan", "read_hparams", "read_qwen3_asr",
           "write_qwen3_asr"]

logger = logging.getLogger(__name__)

ARCH = "qwen3-asr"
_MODEL_TYPE = "qwen3_asr"

# GGUF key -> (file, path of keys in it, type). Types: "int" (> 0), "float" (> 0), "bool", "str".
_AUDIO = "thinker_config.audio_config"
_TEXT = "thinker_config.text_config"
_HPARAMS = {
    "audio.n_mels": ("config.json", f"{_AUDIO}.num_mel_bins", "int"),
    "audio.block_count": ("config.json", f"{_AUDIO}.encoder_layers", "int"),
    "audio.head_count": ("config.json", f"{_AUDIO}.encoder_attention_heads", "int"),
    "audio.feed_forward_length": ("config.json", f"{_AUDIO}.encoder_ffn_dim", "int"),
    "audio.embedding_length": ("config.json", f"{_AUDIO}.d_model", "int"),
    "audio.max_positions": ("config.json", f"{_AUDIO}.max_source_positions", "int"),
    # The conv stem runs on chunks of 2 n_window mel frames; attention stays inside windows of
    # n_window_infer frames' worth of encoder positions (Qwen3ASRAudioEncoder.forward).
    "audio.n_window": ("config.json", f"{_AUDIO}.n_window", "int"),
    "audio.n_window_infer": ("config.json", f"{_AUDIO}.n_window_infer", "int"),
    "audio.output_length": ("config.json", f"{_AUDIO}.output_dim", "int"),
    "audio.conv_channels": ("config.json", f"{_AUDIO}.downsample_hidden_size", "int"),
    "audio.activation": ("config.json", f"{_AUDIO}.activation_function", "str"),
    "audio.scale_embedding": ("config.json", f"{_AUDIO}.scale_embedding", "bool"),
    "text.vocab_size": ("config.json", f"{_TEXT}.vocab_size", "int"),
    "text.embedding_length": ("config.json", f"{_TEXT}.hidden_size", "int"),
    "text.feed_forward_length": ("config.json", f"{_TEXT}.intermediate_size", "int"),
    "text.block_count": ("config.json", f"{_TEXT}.num_hidden_layers", "int"),
    "text.head_count": ("config.json", f"{_TEXT}.num_attention_heads", "int"),
    "text.head_count_kv": ("config.json", f"{_TEXT}.num_key_value_heads", "int"),
    "text.key_length": ("config.json", f"{_TEXT}.head_dim", "int"),
    "text.rms_norm_eps": ("config.json", f"{_TEXT}.rms_norm_eps", "float"),
    "text.rope_theta": ("config.json", f"{_TEXT}.rope_theta", "float"),
    "text.activation": ("config.json", f"{_TEXT}.hidden_act", "str"),
    "text.tie_word_embeddings": ("config.json", f"{_TEXT}.tie_word_embeddings", "bool"),
    "text.attention_bias": ("config.json", f"{_TEXT}.attention_bias", "bool"),
    "token.audio": ("config.json", "thinker_config.audio_token_id", "id"),
    "token.audio_start": ("config.json", "thinker_config.audio_start_token_id", "id"),
    "audio.sample_rate": ("preprocessor_config.json", "sampling_rate", "int"),
    "audio.hop_length": ("preprocessor_config.json", "hop_length", "int"),
    "audio.n_fft": ("preprocessor_config.json", "n_fft", "int"),
}
# What the engine implements of those: other values are refused by name rather than run wrongly.
_SUPPORTED = {"audio.activation": ("gelu",), "text.activation": ("silu",), "audio.scale_embedding": (False,)}
_CHECKS = {"str": str, "bool": bool, "float": (int, float), "int": int, "id": int}


@dataclass(frozen=True)
class Qwen3AsrSource:
    """A Qwen3-ASR checkpoint read for write_qwen3_asr.

    Attributes:
        path: the checkpoint directory; errors name it.
        hparams: GGUF key (without the "qwen3-asr." prefix) -> value, every one read from the checkpoint.
        mrope_section: the text model's rope_scaling.mrope_section: rotary pairs per position axis (time,
            height, width), interleaved as the reference code always does; audio and text give the three
            axes the same positions, where this is plain RoPE.
        eos_ids: generation_config.json's eos_token_id, as a list.
        tensors: GGUF tensor name -> (values in PyTorch shape, kind for convert's _storage_type).
        tokenizer_json: HF tokenizers JSON: the byte-level BPE with every added token at its id.
        sha256: hex sha256 of the weight files, in order.
    """

    path: Path
    hparams: dict[str, Any]
    mrope_section: list[int]
    eos_ids: list[int]
    tensors: dict[str, tuple[SourceArray, str]]
    tokenizer_json: str
    sha256: str


def is_qwen3_asr(path: str | Path) -> bool:
    """Whether `path` is a directory whose config.json describes a Qwen3-ASR model."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return _read_json(config).get("model_type") == _MODEL_TYPE
    except ModelError:
        return False


_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer_config.json")


def read_hparams(path: str | Path) -> dict[str, Any]:
    """The hyper-parameters of a checkpoint directory (GGUF keys without the "qwen3-asr." prefix), checked."""
    directory = Path(path)
    return _hparams(directory, {name: _read_json(directory / name) for name in _FILES})


def _hparams(directory: Path, files: dict[str, dict]) -> dict[str, Any]:
    if files["config.json"].get("model_type") != _MODEL_TYPE:
        raise ModelError(f"{directory / 'config.json'} does not describe a Qwen3-ASR model "
                         f"(model_type '{files['config.json'].get('model_type')}', not '{_MODEL_TYPE}').")
    hp = {key: _value(files, directory, file, keys, kind) for key, (file, keys, kind) in _HPARAMS.items()}
    for key, allowed in _SUPPORTED.items():
        if hp[key] not in allowed:
            file, keys, _ = _HPARAMS[key]
            raise ModelError(f"{directory / file} {keys} is {hp[key]!r}; Aural runs {' or '.join(map(repr, allowed))}.")
    if hp["audio.n_mels"] != files["preprocessor_config.json"].get("feature_size"):
        raise ModelError(f"{directory / 'preprocessor_config.json'} feature_size differs from the audio tower's "
                         f"num_mel_bins ({hp['audio.n_mels']}).")
    return hp


def read_qwen3_asr(path: str | Path) -> Qwen3AsrSource:
    """Read a Qwen3-ASR checkpoint directory; ModelError naming the file for anything missing or malformed."""
    directory = Path(path)
    files = {name: _read_json(directory / name) for name in _FILES}
    hp = _hparams(directory, files)
    rope = _value(files, directory, "config.json", f"{_TEXT}.rope_scaling", "dict")
    section = rope.get("mrope_section")
    if not isinstance(section, list) or not all(isinstance(v, int) and v > 0 for v in section) or \
            2 * sum(section) != hp["text.key_length"]:
        raise ModelError(f"{directory / 'config.json'} {_TEXT}.rope_scaling.mrope_section must be positive integers "
                         f"summing to head_dim / 2 ({hp['text.key_length'] // 2}).")
    index = _hf_index(directory)
    if index is None:
        raise ModelError(f"{directory} has no model.safetensors or model.safetensors.index.json.")
    return Qwen3AsrSource(
        path=directory, hparams=hp, mrope_section=section,
        eos_ids=_eos_ids(files["generation_config.json"], directory),
        tensors=_tensors(directory, index, hp), tokenizer_json=_tokenizer(directory, files["tokenizer_config.json"], hp),
        sha256=files_sha256(sorted(set(index.values()))))


def _value(files: dict[str, dict], directory: Path, file: str, keys: str, kind: str) -> Any:
    value: Any = files[file]
    for key in keys.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    ok = isinstance(value, dict) if kind == "dict" else isinstance(value, _CHECKS[kind])
    if kind in ("int", "float", "id") and ok:
        ok = not isinstance(value, bool) and (value >= 0 if kind == "id" else value > 0)
    if not ok:
        wanted = {"int": "a positive integer", "float": "a positive number", "bool": "true or false",
                  "str": "a string", "dict": "an object", "id": "a token id"}[kind]
        raise ModelError(f"{directory / file} needs {keys} ({wanted}).")
    return value


def _eos_ids(generation: dict[str, Any], directory: Path) -> list[int]:
    eos = generation.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else eos
    if not isinstance(eos, list) or not eos or not all(isinstance(v, int) and v >= 0 for v in eos):
        raise ModelError(f"{directory / 'generation_config.json'} needs eos_token_id (a token id or a list of them).")
    return eos


def plan(hp: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor a checkpoint of these hyper-parameters holds (less "thinker."): name -> (PyTorch shape,
    kind: "conv", "f32" or "matrix", convert's storage classes), from the hyper-parameters alone."""
    d, ffn, ch, n_out = (hp["audio.embedding_length"], hp["audio.feed_forward_length"], hp["audio.conv_channels"],
                         hp["audio.output_length"])
    freq = hp["audio.n_mels"]
    for _ in range(3):  # three 3x3 convolutions of stride 2 and padding 1 over the mel bins
        freq = (freq + 1) // 2
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for i, c_in in enumerate((1, ch, ch), start=1):
        tensors[f"audio_tower.conv2d{i}.weight"] = ((ch, c_in, 3, 3), "conv")
        tensors[f"audio_tower.conv2d{i}.bias"] = ((ch,), "f32")
    tensors["audio_tower.conv_out.weight"] = ((d, ch * freq), "matrix")

    def linear(name: str, n_o: int, n_i: int, bias: bool) -> None:
        tensors[f"{name}.weight"] = ((n_o, n_i), "matrix")
        if bias:
            tensors[f"{name}.bias"] = ((n_o,), "f32")

    def norm(name: str, n: int, bias: bool = True) -> None:
        tensors[f"{name}.weight"] = ((n,), "f32")
        if bias:
            tensors[f"{name}.bias"] = ((n,), "f32")

    for i in range(hp["audio.block_count"]):
        p = f"audio_tower.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(f"{p}.self_attn.{proj}", d, d, True)
        norm(f"{p}.self_attn_layer_norm", d)
        linear(f"{p}.fc1", ffn, d, True)
        linear(f"{p}.fc2", d, ffn, True)
        norm(f"{p}.final_layer_norm", d)
    norm("audio_tower.ln_post", d)
    linear("audio_tower.proj1", d, d, True)
    linear("audio_tower.proj2", n_out, d, True)

    h, inter, hd = hp["text.embedding_length"], hp["text.feed_forward_length"], hp["text.key_length"]
    n_q, n_kv, bias = hp["text.head_count"] * hd, hp["text.head_count_kv"] * hd, hp["text.attention_bias"]
    tensors["model.embed_tokens.weight"] = ((hp["text.vocab_size"], h), "matrix")
    for i in range(hp["text.block_count"]):
        p = f"model.layers.{i}"
        linear(f"{p}.self_attn.q_proj", n_q, h, bias)
        linear(f"{p}.self_attn.k_proj", n_kv, h, bias)
        linear(f"{p}.self_attn.v_proj", n_kv, h, bias)
        linear(f"{p}.self_attn.o_proj", h, n_q, bias)
        norm(f"{p}.self_attn.q_norm", hd, bias=False)
        norm(f"{p}.self_attn.k_norm", hd, bias=False)
        norm(f"{p}.input_layernorm", h, bias=False)
        norm(f"{p}.post_attention_layernorm", h, bias=False)
        linear(f"{p}.mlp.gate_proj", inter, h, False)
        linear(f"{p}.mlp.up_proj", inter, h, False)
        linear(f"{p}.mlp.down_proj", h, inter, False)
    norm("model.norm", h, bias=False)
    if not hp["text.tie_word_embeddings"]:
        tensors["lm_head.weight"] = ((hp["text.vocab_size"], h), "matrix")
    if n_out != h:
        raise ModelError(f"the audio tower's output_dim ({n_out}) is not the text model's hidden_size ({h}).")
    return tensors


def _tensors(directory: Path, index: dict[str, Path], hp: dict[str, Any]) -> dict[str, tuple[SourceArray, str]]:
    """The plan's tensors, read lazily from the safetensors files and checked for shape."""
    find = safetensors_lookup(directory, index, "thinker.", "a complete Qwen3-ASR checkpoint")
    out = {}
    for name, (shape, kind) in plan(hp).items():
        values, stored, file = find(name)
        if tuple(values.shape) != shape:
            raise ModelError(f"{file} '{stored}' has shape {tuple(values.shape)}; the config implies {shape}.")
        out[name] = (values, kind)
    return out


# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2.py PRETOKENIZE_REGEX): contractions, letter
# runs with one leading non-letter, single digits, punctuation runs, newlines, spaces.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _tokenizer(directory: Path, tokenizer_config: dict[str, Any], hp: dict[str, Any]) -> str:
    """HF tokenizers JSON as Qwen2TokenizerFast builds it from vocab.json and merges.txt (NFC, the Qwen2 split,
    byte-level BPE), with every token of tokenizer_config.json's added_tokens_decoder at its id."""
    vocab = _read_json(directory / "vocab.json")
    try:
        lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ModelError(f"Cannot read {directory / 'merges.txt'}: {exc.strerror or exc}.") from exc
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    if not all(len(m) == 2 for m in merges):
        raise ModelError(f"{directory / 'merges.txt'} has lines that are not two space-separated tokens.")
    added = tokenizer_config.get("added_tokens_decoder")
    if not isinstance(added, dict) or not added:
        raise ModelError(f"{directory / 'tokenizer_config.json'} has no added_tokens_decoder (the special tokens).")
    specials = sorted((int(i), t) for i, t in added.items())
    if specials[0][0] != len(vocab) or [i for i, _ in specials] != list(range(len(vocab), len(vocab) + len(specials))):
        raise ModelError(f"{directory / 'tokenizer_config.json'}: the added tokens must follow vocab.json's "
                         f"{len(vocab)} tokens without gaps.")
    if len(vocab) + len(specials) > hp["text.vocab_size"]:
        raise ModelError(f"{directory}: {len(vocab) + len(specials)} tokens do not fit the model's "
                         f"vocab_size {hp['text.vocab_size']}.")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([AddedToken(t["content"], special=bool(t.get("special")), normalized=False)
                          for _, t in specials])
    for i, t in specials:
        if tokenizer.token_to_id(t["content"]) != i:
            raise ModelError(f"{directory / 'tokenizer_config.json'}: '{t['content']}' did not get id {i}.")
    return tokenizer.to_str()


def write_qwen3_asr(source: Qwen3AsrSource, out_path: str | Path, *, wtype: str = "f16", name: str | None = None) -> Path:
    """Write `source` as one GGUF at out_path (atomically), matrices stored as wtype; return the path."""
    check_wtype(wtype)
    start = time.perf_counter()
    out = Path(out_path)
    write_file(out, ARCH, lambda w: _add_metadata(w, source, wtype, name or source.path.name),
               [_Tensor(n, data, kind) for n, (data, kind) in source.tensors.items()], wtype)
    logger.info("converted %s (Qwen3-ASR) to %s (%s, %.1f MiB) in %.2f s", source.path, out, wtype,
                out.stat().st_size / 2**20, time.perf_counter() - start)
    return out


def _add_metadata(writer: gguf.GGUFWriter, source: Qwen3AsrSource, wtype: str, name: str) -> None:
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[wtype])
    for key, value in source.hparams.items():
        full = f"{ARCH}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, str):
            writer.add_string(full, value)
        elif isinstance(value, float) or key in ("text.rms_norm_eps", "text.rope_theta"):
            writer.add_float32(full, float(value))
        else:
            writer.add_uint32(full, value)
    _add_int32_array(writer, f"{ARCH}.text.mrope_section", source.mrope_section)
    _add_int32_array(writer, f"{ARCH}.token.eos", source.eos_ids)
    writer.add_string(f"{ARCH}.source_sha256", source.sha256)
    writer.add_string("tokenizer.huggingface.json", source.tokenizer_json)


def convert_qwen3_asr(src: str | Path, out_path: str | Path, *, wtype: str = "f16", name: str | None = None) -> Path:
    """Convert a Qwen3-ASR checkpoint directory to one GGUF at out_path (written atomically); return the path."""
    check_wtype(wtype)
    return write_qwen3_asr(read_qwen3_asr(src), out_path, wtype=wtype, name=name)
