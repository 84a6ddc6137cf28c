"""Qwen3-ASR (issue #23): the checkpoint converter and the text decoder.

A checkpoint in the official layout is made here with numpy (random weights of a small configuration, bf16
like the official release, a byte-level tokenizer with the special tokens after it), converted, and read
back with gguf-py's reader: every hyper-parameter comes from the files, every tensor survives within its
storage type's rounding.

Where the reference venv exists (`make qwen-reference`, tools/qwen-reference: Qwen's own modelling code from
the qwen-asr package on CPU torch), a random-weight checkpoint made by that code converts tensor for tensor,
and Aural's text decoder (native/qwen3-*) is held to the official forward on the JFK prompt: its f32 logits
stray from a float64 run of the official code no more than a few times as far as the official code's own f32
run does, and the f16 KV arena's rounding moves them no more than that same amplification of f16's step
allows; greedy tokens and every step's logits follow the official generate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from aural import _native
from aural.engine.errors import ModelError
from aural.engine.models.importers import _byte_to_unicode, convert_model
from aural.engine.models.qwen3_asr import ARCH, plan, read_hparams, read_qwen3_asr
from qwen_reference import needs_reference

F32_STEP, F16_STEP = 2.0**-24, 2.0**-11  # unit roundoff
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
N_TEXT = 256 + 3  # the 256 bytes and three merges


def _config(n_vocab: int) -> dict:
    audio = {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128,
             "d_model": 64, "max_source_positions": 1500, "n_window": 50, "n_window_infer": 800, "output_dim": 96,
             "downsample_hidden_size": 32, "activation_function": "gelu", "scale_embedding": False}
    text = {"vocab_size": n_vocab, "hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False,
            "rope_scaling": {"mrope_section": [6, 5, 5], "interleaved": True, "rope_type": "default"}}
    return {"model_type": "qwen3_asr", "architectures": ["Qwen3ASRForConditionalGeneration"],
            "thinker_config": {"audio_config": audio, "text_config": text, "audio_token_id": N_TEXT + 5,
                               "audio_start_token_id": N_TEXT + 3, "user_token_id": 20}}


def _bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (round to nearest even), as torch stores them; safetensors' numpy API has no
    bf16, so the file is written as uint16 and its header's dtype patched."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def make_checkpoint(directory: Path, *, seed: int = 0, edit=None) -> dict[str, np.ndarray]:
    """A random checkpoint of _config in the official layout; returns the float32 values of its tensors
    (bf16-exact). `edit(config)` may change the config before the weights are made from it."""
    directory.mkdir(parents=True, exist_ok=True)
    n_vocab = N_TEXT + len(SPECIALS) + 2  # two unused ids at the end, as the real vocabulary has
    config = _config(n_vocab)
    if edit:
        edit(config)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [N_TEXT, N_TEXT + 2]}))
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {"feature_size": 128, "sampling_rate": 16000, "hop_length": 160, "n_fft": 400}))
    alphabet = _byte_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for i, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + i
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    added = {str(N_TEXT + i): {"content": s, "special": True} for i, s in enumerate(SPECIALS)}
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    rng = np.random.default_rng(seed)
    values, stored = {}, {}
    for name, (shape, _) in plan(read_hparams(directory)).items():
        bits = _bf16(rng.normal(0, 0.5, shape))
        values[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        stored[f"thinker.{name}"] = bits
    path = directory / "model.safetensors"
    save_file(stored, str(path))
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    for entry in header.values():
        if isinstance(entry, dict) and entry.get("dtype") == "U16":
            entry["dtype"] = "BF16"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data offsets are relative to the header's end: only its size changes
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size:])
    return values


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.fields[key]
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0] == gguf.GGUFValueType.STRING else value.tolist()[0]


def test_qwen3_asr_checkpoint_converts_with_every_value_from_its_files(tmp_path):
    values = make_checkpoint(tmp_path / "ckpt")
    out = convert_model(tmp_path / "ckpt", tmp_path / "q.gguf", wtype="f16")
    reader = gguf.GGUFReader(out)
    assert _field(reader, "general.architecture") == ARCH
    assert _field(reader, f"{ARCH}.audio.embedding_length") == 64
    assert _field(reader, f"{ARCH}.audio.n_window_infer") == 800
    assert _field(reader, f"{ARCH}.text.head_count_kv") == 2
    assert _field(reader, f"{ARCH}.text.rope_theta") == 1e6
    assert _field(reader, f"{ARCH}.token.audio") == N_TEXT + 5
    assert reader.fields[f"{ARCH}.token.eos"].contents() == [N_TEXT, N_TEXT + 2]
    assert reader.fields[f"{ARCH}.text.mrope_section"].contents() == [6, 5, 5]
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(values)  # tied: no lm_head
    assert "lm_head.weight" not in tensors
    for name, expected in values.items():
        t = tensors[name]
        got = np.asarray(t.data).astype(np.float32).reshape(expected.shape)
        if t.tensor_type == gguf.GGMLQuantizationType.F32:  # norms and biases: exact
            assert np.array_equal(got, expected), name
        else:  # f16: bf16's 8-bit mantissa fits f16's 11 bits, so only values under f16's normal range move
            assert np.allclose(got, expected, rtol=0, atol=2.0**-24), name
    assert tensors["audio_tower.conv2d1.weight"].tensor_type == gguf.GGMLQuantizationType.F16


def test_qwen3_asr_tokenizer_has_the_specials_at_their_ids(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    tokenizer = Tokenizer.from_str(read_qwen3_asr(tmp_path / "ckpt").tokenizer_json)
    for i, special in enumerate(SPECIALS):
        assert tokenizer.token_to_id(special) == N_TEXT + i
    ids = tokenizer.encode("<|im_start|>the hat").ids
    assert ids[0] == N_TEXT + 1 and 256 + 1 in ids  # "the" takes the merge "h e"
    assert tokenizer.decode(tokenizer.encode(" the héllo").ids) == " the héllo"


def test_qwen3_asr_q8_0_rounds_each_block_within_its_step(tmp_path):
    values = make_checkpoint(tmp_path / "ckpt", seed=1)
    reader = gguf.GGUFReader(convert_model(tmp_path / "ckpt", tmp_path / "q8.gguf", wtype="q8_0"))
    t = next(t for t in reader.tensors if t.name == "model.layers.0.mlp.gate_proj.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(values[t.name].shape)
    blocks = values[t.name].reshape(-1, 32)
    # q8_0 (ggml quantize_row_q8_0): step d = amax / 127 per 32 values, q = round(x / d), stored with d
    # rounded to f16 (relative error 2^-11): |x - q d16| <= d / 2 + 127 d 2^-11.
    step = np.abs(blocks).max(axis=1, keepdims=True) / 127
    err = np.abs(got.reshape(-1, 32) - blocks)
    assert np.all(err <= step / 2 + 127 * step * 2.0**-11 + 1e-7)
    assert err.max() > 0.4 * step.max()  # quantised: rounded to steps, not stored exactly


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["thinker_config"]["text_config"].pop("rope_theta"), "text_config.rope_theta"),
    (lambda c: c["thinker_config"]["audio_config"].update(activation_function="relu"), "activation_function"),
    (lambda c: c["thinker_config"].pop("audio_token_id"), "audio_token_id"),
    (lambda c: c["thinker_config"]["text_config"]["rope_scaling"].update(mrope_section=[8, 8, 8]), "mrope_section"),
])
def test_qwen3_asr_config_without_a_value_is_refused_by_name(tmp_path, edit, message):
    make_checkpoint(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    edit(config)
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=message):
        read_qwen3_asr(tmp_path / "ckpt")


def test_qwen3_asr_weights_of_another_shape_are_refused(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["thinker_config"]["text_config"]["intermediate_size"] = 192
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"gate_proj.weight' has shape \(160, 96\); the config implies \(192, 96\)"):
        read_qwen3_asr(tmp_path / "ckpt")


def test_aural_models_convert_takes_a_qwen3_asr_checkpoint(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out.gguf"
    proc = subprocess.run([sys.executable, "-m", "aural.engine.cli", "models", "convert", str(tmp_path / "ckpt"),
                           "--type", "q8_0", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert _field(gguf.GGUFReader(out), "general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q8_0)


def test_qwen3_asr_host_kv_mode_moves_the_history_and_changes_no_bit(tmp_path):
    """kv_mode='host' (the baseline that keeps the K/V history on the host) uploads the whole history before
    every call and reads the new rows back: the same logits bit for bit as the arena kept on the device, and
    the traffic of 2 (K, V) x layers x rows x 2 K/V heads x head_dim 32 x 2 bytes per row."""
    make_checkpoint(tmp_path / "ckpt")
    model = _native.Qwen3Model(str(convert_model(tmp_path / "ckpt", tmp_path / "q.gguf", wtype="f16")))
    audio_token = model.audio_token
    prompt = np.array([N_TEXT + 1, 5, 6, N_TEXT + 3, audio_token, audio_token, N_TEXT + 4, 7], dtype=np.int32)
    audio = np.random.default_rng(0).normal(0, 1, (2, model.n_state)).astype(np.float32)
    runs = {}
    for mode in ("device", "host"):
        ctx = _native.Qwen3Context(model, n_ctx=64, kv_mode=mode)
        logits = [ctx.decode(prompt, audio=audio)]
        traffic = []
        for _ in range(3):
            logits.append(ctx.decode(np.array([logits[-1].argmax()], dtype=np.int32)))
            traffic.append(ctx.last_timings["kv_io_bytes"])
        runs[mode] = (np.array(logits), traffic)
    assert np.array_equal(runs["device"][0], runs["host"][0])
    assert runs["device"][1] == [0, 0, 0]
    row = 2 * 2 * 2 * 32 * 2  # K and V, 2 layers, 2 heads of 32, f16
    assert runs["host"][1] == [row * (len(prompt) + i + 1) for i in range(3)]  # the history up, one row back


def test_qwen3_asr_a_pad_the_model_writes_is_embedded_as_the_token_it_is(tmp_path):
    """The official generate passes the audio features at the prefill alone (cache_position 0), so an audio pad
    the model writes after it is embedded as a token: a step on the pad with no audio gives the bits of a step
    whose one audio vector is the pad's own embedding row. With audio given, every pad must have a vector."""
    values = make_checkpoint(tmp_path / "ckpt")
    model = _native.Qwen3Model(str(convert_model(tmp_path / "ckpt", tmp_path / "q.gguf", wtype="f32")))
    pad = model.audio_token
    prompt = np.array([N_TEXT + 1, 5, pad, pad, N_TEXT + 4, 7], dtype=np.int32)
    audio = np.random.default_rng(2).normal(0, 1, (2, model.n_state)).astype(np.float32)
    own_row = values["model.embed_tokens.weight"][pad][None]
    steps = []
    for vector in (None, own_row):
        ctx = _native.Qwen3Context(model, n_ctx=16, kv_type="f32")
        ctx.decode(prompt, audio=audio)
        steps.append(ctx.decode(np.array([pad], dtype=np.int32), audio=vector))
    assert np.array_equal(steps[0], steps[1])
    with pytest.raises(ValueError, match="1 audio tokens for 2 audio embeddings"):
        ctx.decode(np.array([pad], dtype=np.int32), audio=audio)


def test_qwen3_asr_steps_reuse_one_graph_with_the_bits_of_graphs_built_anew(tmp_path):
    """Every one-token step after the first runs the graph that step built (its shape is the same: attention
    spans the whole arena, masked); a batch of another length builds its own. Reused or built anew, the
    logits are the same bits, and the counters say which happened."""
    make_checkpoint(tmp_path / "ckpt")
    model = _native.Qwen3Model(str(convert_model(tmp_path / "ckpt", tmp_path / "q.gguf", wtype="f16")))
    audio_token = model.audio_token
    prompt = np.array([N_TEXT + 1, 5, audio_token, audio_token, N_TEXT + 4, 7], dtype=np.int32)
    audio = np.random.default_rng(1).normal(0, 1, (2, model.n_state)).astype(np.float32)
    runs = {}
    for reuse in (True, False):
        ctx = _native.Qwen3Context(model, n_ctx=64, graph_reuse=reuse)
        logits = [ctx.decode(prompt, audio=audio)]
        reused = []
        for batch in ([1], [1], [1], [2, 3], [1], [1]):  # steps, a two-token batch, steps again
            tokens = np.array([logits[-1].argmax(), *batch[1:]], dtype=np.int32)
            logits.append(ctx.decode(tokens))
            reused.append(ctx.last_timings["reused"])
        runs[reuse] = (np.array(logits), reused, ctx.stats)
    assert np.array_equal(runs[True][0], runs[False][0])
    assert runs[True][1] == [False, True, True, False, False, True]
    assert runs[True][2] == {"graph_builds": 4, "graph_reuses": 3}
    assert runs[False][1] == [False] * 6 and runs[False][2] == {"graph_builds": 7, "graph_reuses": 0}


def test_qwen3_asr_rope_by_ggml_ops_gives_the_table_ops_bits(tmp_path, monkeypatch):
    """Devices rotate q and k with ggml's products and sums on the RoPE table, the CPU with Aural's op: each
    product and difference is rounded once in f32 either way, so the logits are the same bits."""
    make_checkpoint(tmp_path / "ckpt")
    path = str(convert_model(tmp_path / "ckpt", tmp_path / "q.gguf", wtype="f32"))
    audio_token = N_TEXT + 5
    prompt = np.array([N_TEXT + 1, 5, audio_token, audio_token, N_TEXT + 4, 7, 8, 9], dtype=np.int32)
    audio = np.random.default_rng(2).normal(0, 1, (2, 96)).astype(np.float32)
    runs = []
    for ggml_ops in (False, True):
        monkeypatch.setenv("AURAL_NO_ROPE_OP", "1" if ggml_ops else "0")
        ctx = _native.Qwen3Context(_native.Qwen3Model(path), n_ctx=64, kv_type="f32")
        logits = [ctx.decode(prompt, audio=audio, all_logits=True)[-1]]
        for _ in range(4):
            logits.append(ctx.decode(np.array([logits[-1].argmax()], dtype=np.int32)))
        runs.append(np.array(logits))
    assert np.array_equal(runs[0], runs[1])


@needs_reference
def test_qwen3_asr_official_checkpoint_layout_converts(qwen_official, tmp_path):
    """A checkpoint of Qwen's own code (its config serialisers; every tensor of the model's state dict, the tied
    lm_head included) converts, and every tensor the engine reads is in the GGUF with its values."""
    ckpt = qwen_official / "ckpt"
    reader = gguf.GGUFReader(convert_model(ckpt, tmp_path / "official.gguf", wtype="f32"))
    source = read_qwen3_asr(ckpt)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(source.tensors)
    for name, (data, _) in source.tensors.items():
        got = np.asarray(tensors[name].data).reshape(data.shape)
        assert np.array_equal(got, np.asarray(data, dtype=np.float32)), name


@needs_reference
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_qwen3_asr_text_decoder_follows_the_official_code(qwen_official, tmp_path, kv_type):
    """The prompt (system turn, 143 audio vectors between <|audio_start|> and <|audio_end|>, assistant turn)
    decoded in one batch with the official audio tower's output in place of the pads, then 7 greedy steps,
    each appending one token's K/V to the arena.

    The bound: e_ref = max |official f32 - official f64| is how far f32 rounding (step 2^-24) alone moves this
    network's logits. Aural's f32 path sums in other orders, so it may stray a few times as far: 4 e_ref. The
    f16 arena rounds K and V with step 2^-11, 2^13 times f32's: the same network moves the logits by at most
    2^13 e_ref (an overestimate: only K and V take that rounding)."""
    ref32, ref64 = np.load(qwen_official / "f32.npz"), np.load(qwen_official / "f64.npz")
    e_ref = np.abs(ref32["logits"] - ref64["logits"]).max()
    assert 0 < e_ref < 1e-3 * np.abs(ref64["logits"]).max()
    bound = 4 * e_ref if kv_type == "f32" else e_ref * F16_STEP / F32_STEP
    model = _native.Qwen3Model(str(convert_model(qwen_official / "ckpt", tmp_path / "q.gguf", wtype="f32")))
    generated = follow_official_generate(_native.Qwen3Context(model, n_ctx=256, kv_type=kv_type), ref64, bound)
    if kv_type == "f32":
        assert generated == ref64["generated"].tolist()


def follow_official_generate(ctx, ref64, bound: float) -> list[int]:
    """The official run's prompt decoded in one batch on `ctx` (every token's logits within `bound` of the
    float64 run's), then its greedy steps one token at a time (each step's logits too); returns the tokens."""
    tokens = ref64["tokens"].astype(np.int32)
    logits = ctx.decode(tokens, audio=ref64["audio_out"].astype(np.float32), all_logits=True)
    assert np.abs(logits - ref64["logits"]).max() <= bound
    generated, steps = [], [logits[-1]]
    for _ in range(len(ref64["generated"]) - 1):
        generated.append(int(steps[-1].argmax()))
        steps.append(ctx.decode(np.array(generated[-1:], dtype=np.int32)))
    generated.append(int(steps[-1].argmax()))
    assert ctx.n_past == len(tokens) + len(generated) - 1
    assert np.abs(np.array(steps) - ref64["generated_logits"]).max() <= bound
    return generated


@needs_reference
def test_qwen3_asr_prompt_in_pieces_follows_the_official_code(qwen_official, tmp_path):
    """The JFK prompt in graphs of at most 7 tokens (as Vulkan runs it in 31s), its audio vectors falling into
    several pieces: the f32 run's bound and tokens, as in one graph."""
    ref32, ref64 = np.load(qwen_official / "f32.npz"), np.load(qwen_official / "f64.npz")
    e_ref = np.abs(ref32["logits"] - ref64["logits"]).max()
    model = _native.Qwen3Model(str(convert_model(qwen_official / "ckpt", tmp_path / "q.gguf", wtype="f32")))
    ctx = _native.Qwen3Context(model, n_ctx=256, kv_type="f32", max_ubatch=7)
    assert follow_official_generate(ctx, ref64, 4 * e_ref) == ref64["generated"].tolist()


@needs_reference
def test_qwen3_asr_context_refuses_what_does_not_fit(qwen_official, tmp_path):
    model = _native.Qwen3Model(str(convert_model(qwen_official / "ckpt", tmp_path / "q.gguf", wtype="f16")))
    ctx = _native.Qwen3Context(model, n_ctx=64)
    tokens = np.load(qwen_official / "tokens.npy").astype(np.int32)
    with pytest.raises(_native.ContextFullError):
        ctx.decode(np.full(65, 198, dtype=np.int32))  # 65 newlines in 64 cells
    assert ctx.n_past == 0
    n_pads = int(np.sum(tokens[:20] == model.audio_token))
    with pytest.raises(ValueError, match=f"{n_pads} audio tokens for {n_pads - 1} audio embeddings"):  # one short
        ctx.decode(tokens[:20], audio=np.zeros((n_pads - 1, model.n_state), dtype=np.float32))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ctx.decode(np.array([model.n_vocab], dtype=np.int32))
    ctx.decode(tokens[:8])
    assert ctx.n_past == 8
