"""Live captions with Qwen3-ASR (engine/qwen3asr/streaming.py, issue #23): the official streaming's chunks,
re-fed audio and forced text, with the work each chunk shares with the one before kept instead of redone.

The model is the small random-weight checkpoint of test_qwen3_asr.py in f32 (weights and KV arena): its text is
noise, but every step of the algorithm is observable in the events, and f32's rounding (about 1e-7 relative)
is far below the gaps between a random model's top logits, so kept and recomputed work give the same tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from aural.engine.audio import load_audio
from aural.engine.live.streaming import Commit, Metrics, Partial
from aural.engine.models.importers import convert_model
from aural.engine.qwen3asr.model import Qwen3AsrModel
from aural.engine.qwen3asr.streaming import Qwen3Stream, Qwen3StreamOptions
from test_qwen3_asr import make_checkpoint


@pytest.fixture(scope="module")
def qwen_f32(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen3-stream")
    make_checkpoint(directory / "ckpt")
    return convert_model(directory / "ckpt", directory / "q.gguf", wtype="f32")


def _stream(model, audio, **options) -> tuple[Qwen3Stream, list]:
    stream = Qwen3Stream(model, Qwen3StreamOptions(max_new_tokens=8, **options), kv_type="f32")
    events = []
    for start in range(0, len(audio), 5000):  # blocks of odd length, as a capture source delivers them
        events += stream.feed(audio[start:start + 5000])
    return stream, events + list(stream.finish())


def _events(model, audio, **options) -> list:
    return _stream(model, audio, **options)[1]


def _text(events) -> list:
    return [(type(e).__name__, e.text, e.audio_end_s if isinstance(e, Partial) else (e.start, e.end))
            for e in events if isinstance(e, (Partial, Commit))]


def test_kept_vectors_and_kv_give_the_tokens_of_the_official_refeed(qwen_f32, jfk_wav):
    """Reuse on (unchanged windows' vectors and the prompt head's K/V kept) and off (every chunk re-encodes and
    re-decodes its segment whole, as the official code does): the same partials and commits, chunk by chunk,
    across a segment cut; reuse decodes fewer tokens for them."""
    model = Qwen3AsrModel(qwen_f32)
    audio = np.concatenate([load_audio(jfk_wav)] * 2)  # 22 s: windows of 800 frames complete and stay
    keeper, kept = _stream(model, audio, max_segment_s=16.0)
    redoer, redone = _stream(model, audio, max_segment_s=16.0, reuse=False)
    assert _text(kept) == _text(redone)
    assert any(isinstance(e, Commit) for e in kept)
    calls = [sum(e.n_tokens for e in events if isinstance(e, Metrics)) for events in (kept, redone)]
    held = [max(e.kv_tokens for e in events if isinstance(e, Metrics)) for events in (kept, redone)]
    assert held[0] == held[1] and calls[0] == calls[1]  # the same prompts and text in as many decoder calls
    # ... for less work: the windows complete before a chunk (from 8 s on) and the prompt head before them are
    # not run again.
    assert keeper.frames_encoded < redoer.frames_encoded
    assert keeper.tokens_decoded < redoer.tokens_decoded


def test_commits_follow_each_other_and_never_change(qwen_f32, jfk_wav):
    """Forced text only grows: each commit adds text after the ones before, partials follow the last commit,
    and a stream longer than max_segment_s ends segments at a quiet point, the context staying bounded."""
    model = Qwen3AsrModel(qwen_f32)
    jfk = load_audio(jfk_wav)
    audio = np.concatenate([jfk, np.zeros(8000, dtype=np.float32), jfk, jfk])  # 33.5 s
    events = _events(model, audio, max_segment_s=8.0)
    commits = [e for e in events if isinstance(e, Commit)]
    assert len(commits) >= 4
    assert all(a.end <= b.start + 1e-9 or a.end <= b.end for a, b in zip(commits, commits[1:]))
    assert all(c.start <= c.end for c in commits)
    metrics = [e for e in events if isinstance(e, Metrics)]
    assert metrics[-1].audio_s == pytest.approx(len(audio) / 16000)
    # A segment holds at most 8 s and one chunk of audio: 10 s is 125 vectors, the prompt and the text besides.
    assert max(m.window_s for m in metrics) <= 10.0 + 1e-9
    assert max(m.kv_tokens for m in metrics) <= model.native.audio_vectors(1000) + 40 + 3 * 8 * 4
    assert metrics[-1].graph_reuses > 0


def test_options_are_checked():
    with pytest.raises(ValueError, match="chunk_s"):
        Qwen3StreamOptions(chunk_s=30.0, max_segment_s=24.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Qwen3StreamOptions(max_new_tokens=0)


def test_aural_live_captions_a_replay_with_a_qwen3_model(qwen_f32, jfk_wav):
    out = subprocess.run([sys.executable, "-m", "aural.engine.cli", "live", "-m", str(qwen_f32), "--replay",
                          str(jfk_wav), "--speed", "0", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    kinds = {e["type"] for e in events}
    assert {"partial", "metrics"} <= kinds, kinds
    assert events[-1]["type"] == "metrics" and events[-1]["audio_s"] == pytest.approx(11.0, abs=0.01)
    assert "live: 11.0 s audio" in out.stderr
