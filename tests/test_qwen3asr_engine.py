"""Qwen3-ASR's Python side (engine/qwen3asr, issue #23): the output parser, the chunking of long audio and the
transcription prompt, each held to what the official wrapper (qwen-asr 0.0.6) does; the prompt against the
official processor's ids where the reference venv exists."""

from __future__ import annotations

import numpy as np
import pytest

from aural.engine.models.importers import convert_model
from aural.engine.qwen3asr import parse_output, split_chunks
from aural.engine.qwen3asr.model import Qwen3AsrModel
from aural.engine.qwen3asr.text import fix_repetitions
from qwen_reference import needs_reference, official_generate, run_reference


@pytest.mark.parametrize("raw, forced, expected", [
    ("language English<asr_text>And so my fellow Americans.", None, ("English", "And so my fellow Americans.")),
    ("language CHINESE\n<asr_text> 你好 ", None, ("Chinese", "你好")),
    ("note\nlanguage german\n<asr_text>Guten Tag", None, ("German", "Guten Tag")),  # the first line naming it
    ("language None<asr_text>", None, ("", "")),  # no speech
    ("plain words", None, ("", "plain words")),  # no tag: all text
    ("language English<asr_text>x", "French", ("French", "language English<asr_text>x")),  # forced: all text
    ("   ", None, ("", "")),
])
def test_qwen3_output_parses_as_the_official_wrapper_does(raw, forced, expected):
    assert parse_output(raw, forced_language=forced) == expected


def test_qwen3_repetition_fix_keeps_one_copy_of_a_runaway_loop():
    assert fix_repetitions("a" * 21 + "b") == "ab"  # more than 20 in a row: one
    assert fix_repetitions("a" * 20 + "b") == "a" * 20 + "b"  # 20: kept
    assert fix_repetitions("hi " + "la " * 25 + "end") == "hi la end"  # a 3-character pattern 25 times
    assert fix_repetitions("ok " * 19) == "ok " * 19


def test_qwen3_chunks_cut_long_audio_at_its_quietest_point_and_join_back_exactly():
    rng = np.random.default_rng(0)
    sr, n = 16000, 16000 * 25
    samples = rng.normal(0, 0.3, n).astype(np.float32)
    samples[int(9.2 * sr):int(9.5 * sr)] *= 0.001  # a pause 0.8 s before the 10 s mark
    chunks = split_chunks(samples, max_chunk_s=10.0)
    assert np.array_equal(np.concatenate([c for c, _ in chunks]), samples)
    assert [round(off, 3) for _, off in chunks][0] == 0.0
    first = len(chunks[0][0]) / sr
    assert 9.2 <= first <= 9.5  # within the pause, not at 10 s
    assert chunks[1][1] == pytest.approx(first)
    short = split_chunks(np.ones(1000, dtype=np.float32))
    assert len(short) == 1 and len(short[0][0]) == 8000  # padded to 0.5 s
    assert split_chunks(samples)[0][0] is not samples and len(split_chunks(samples)) == 1


@needs_reference
@pytest.mark.parametrize("language", [None, "English"])
def test_qwen3_prompt_is_the_official_processors(qwen_official, tmp_path, language):
    """The ids of the transcription prompt for JFK's 143 audio vectors, as the official processor renders the
    release's chat template and tokenizes it (tools/qwen-reference `prompt`)."""
    args = ["--language", language] if language else []
    run_reference("prompt", qwen_official / "ckpt", "--mel", qwen_official / "mel.npy", "--out", tmp_path / "ids.npy",
                  *args)
    expected = np.load(tmp_path / "ids.npy").tolist()
    model = Qwen3AsrModel(convert_model(qwen_official / "ckpt", tmp_path / "q.gguf", wtype="f16"))
    assert model.prompt(143, language=language) == expected


@needs_reference
def test_qwen3_transcription_follows_the_official_code_end_to_end(qwen_official, jfk_wav, tmp_path):
    """5 s of JFK (65 audio vectors: one attention window, where the official transformers code, which attends
    over the whole clip, and the windowed tower agree) through Aural's whole path: numpy log-mel, the native
    audio tower, the prompt, the decoder's greedy steps. The tokens are the official generate's, and `aural
    transcribe` writes their text. f32 weights and arena: the rounding left cannot flip a greedy choice."""
    import json
    import subprocess
    import sys

    from aural.engine.audio import load_audio
    from aural.engine.qwen3asr import transcribe_qwen3

    ckpt = qwen_official / "ckpt"
    clip, ids, expected = official_generate(ckpt, jfk_wav, tmp_path, seconds=5, new_tokens=12)
    gguf_path = convert_model(ckpt, tmp_path / "q.gguf", wtype="f32")
    model = Qwen3AsrModel(gguf_path)
    (chunk,) = transcribe_qwen3(model, load_audio(clip), max_new_tokens=12, kv_type="f32")
    assert list(chunk.tokens) == expected
    assert chunk.prompt_tokens == len(np.load(ids))
    assert (chunk.start, chunk.end) == (0.0, 5.0)

    out = subprocess.run([sys.executable, "-m", "aural.engine.cli", "transcribe", str(clip), "-m", str(gguf_path),
                          "-f", "json", "--quiet"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    segments = json.loads(out.stdout)["segments"]
    assert len(segments) == 1 and segments[0]["start"] == 0.0
    # The CLI decodes up to 512 tokens (no end-of-sequence from random weights) with the f16 arena: its text
    # starts with these 12 tokens'.
    assert segments[0]["text"].strip().startswith(chunk.text)
