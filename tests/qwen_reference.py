"""Qwen's own Qwen3-ASR code as a test oracle (tools/qwen-reference, its venv made by `make qwen-reference`):
random-weight checkpoints of the release's layout and the official outputs for them. Tests that need it are
marked `needs_reference` and skip where the venv could not be made (no CPU torch to install)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_PYTHON = ROOT / "build" / "qwen-reference" / "bin" / "python"
REFERENCE = ROOT / "tools" / "qwen-reference" / "reference.py"
needs_reference = pytest.mark.skipif(not REFERENCE_PYTHON.is_file(), reason="needs the reference venv: make qwen-reference")


def run_reference(*args: object) -> None:
    """reference.py's subcommand with `args`, under the reference venv."""
    subprocess.run([str(REFERENCE_PYTHON), str(REFERENCE), *map(str, args)], check=True, timeout=600,
                   capture_output=True)


def make_official(directory: Path, wav: Path) -> Path:
    """A tiny random-weight checkpoint made by the official code (seed 3), `wav`'s log-mel and transcription
    prompt, and the official outputs for them in float32 and float64 (f32.npz, f64.npz), in `directory`."""
    run_reference("make-checkpoint", directory / "ckpt", "--shape", "tiny", "--seed", "3")
    run_reference("mel", wav, "--out", directory / "mel.npy")
    run_reference("prompt", directory / "ckpt", "--mel", directory / "mel.npy", "--out", directory / "tokens.npy")
    for precision in ("f32", "f64"):
        run_reference("run", directory / "ckpt", "--mel", directory / "mel.npy", "--tokens", directory / "tokens.npy",
                      "--out", directory / f"{precision}.npz", "--precision", precision)
    return directory


def official_generate(ckpt: Path, wav: Path, directory: Path, *, seconds: float, new_tokens: int) -> tuple[Path, Path, list[int]]:
    """The first `seconds` of `wav` as a 16-bit WAV in `directory`, the official processor's prompt ids for it
    (a .npy) and the official generate's first `new_tokens` greedy tokens on the checkpoint at `ckpt`."""
    import numpy as np
    import soundfile

    from aural.engine.audio import load_audio

    clip = directory / "clip.wav"
    soundfile.write(clip, load_audio(wav)[:round(seconds * 16000)], 16000, subtype="PCM_16")
    run_reference("mel", clip, "--out", directory / "mel.npy")
    run_reference("prompt", ckpt, "--mel", directory / "mel.npy", "--out", directory / "ids.npy")
    run_reference("run", ckpt, "--mel", directory / "mel.npy", "--tokens", directory / "ids.npy",
                  "--out", directory / "ref.npz", "--new-tokens", str(new_tokens))
    return clip, directory / "ids.npy", np.load(directory / "ref.npz")["generated"].tolist()
