"""Kaldi-style log-mel filter banks, the input of the CAM++ speaker model.

    feats = kaldi_fbank(audio)   # audio: float32 mono 16 kHz -> (n_frames, 80) float32, mean over time removed

CAM++ (3D-Speaker) was trained on Kaldi's `compute-fbank-feats` definition as torchaudio.compliance.kaldi.fbank
computes it with dither 0, followed by subtracting the utterance's mean: 25 ms frames every 10 ms (edges snipped),
each frame's DC offset removed, pre-emphasis 0.97 (the first sample is its own predecessor), Povey's window
(a Hann window raised to 0.85), a 512-point power spectrum, 80 triangular filters equally spaced on Kaldi's
mel scale (1127 ln(1 + f / 700)) from 20 Hz to Nyquist, and the log floored at float32's epsilon. Numpy does
it in a few vectorised steps; features for an hour of audio are 360 000 x 80 floats (115 MB), so callers
take them per turn, not per recording.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
FRAME = 400  # 25 ms
SHIFT = 160  # 10 ms: 100 frames a second
N_FFT = 512  # the frame padded to the next power of two
N_MELS = 80
LOW_HZ = 20.0
PREEMPHASIS = 0.97
_EPS = float(np.finfo(np.float32).eps)

__all__ = ["FRAMES_PER_SECOND", "kaldi_fbank", "log_mel", "n_frames"]

FRAMES_PER_SECOND = SAMPLE_RATE // SHIFT


def n_frames(n_samples: int) -> int:
    """Frames Kaldi takes from `n_samples` with snipped edges (0 when shorter than one frame)."""
    return 0 if n_samples < FRAME else 1 + (n_samples - FRAME) // SHIFT


def _mel(hz: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def _mel_banks() -> np.ndarray:
    """(N_FFT // 2 + 1, N_MELS) triangular weights; the Nyquist bin's row is zero, as in Kaldi."""
    mel_low, mel_high = _mel(LOW_HZ), _mel(SAMPLE_RATE / 2)
    delta = (mel_high - mel_low) / (N_MELS + 1)
    left = mel_low + delta * np.arange(N_MELS)
    center, right = left + delta, left + 2 * delta
    bins = _mel(np.arange(N_FFT // 2) * (SAMPLE_RATE / N_FFT))[:, None]
    up = (bins - left) / (center - left)
    down = (right - bins) / (right - center)
    weights = np.maximum(0.0, np.minimum(up, down))
    return np.vstack([weights, np.zeros((1, N_MELS))])


_BANKS = _mel_banks()
_WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / (FRAME - 1))) ** 0.85


def kaldi_fbank(audio: np.ndarray) -> np.ndarray:
    """(n_frames(len(audio)), 80) float32 log-mel energies of 16 kHz mono `audio`, minus their mean over time."""
    feats = log_mel(audio)
    return feats - feats.mean(axis=0, keepdims=True) if len(feats) else feats


def log_mel(audio: np.ndarray) -> np.ndarray:
    """(n_frames(len(audio)), 80) float32 log-mel energies, the mean not removed (a caller picking frames
    removes the mean of those it picks)."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    n = n_frames(x.size)
    if n == 0:
        return np.zeros((0, N_MELS), np.float32)
    frames = np.lib.stride_tricks.sliding_window_view(x, FRAME)[::SHIFT][:n]
    frames = frames - frames.mean(axis=1, keepdims=True)
    previous = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
    frames = (frames - PREEMPHASIS * previous) * _WINDOW
    power = np.abs(np.fft.rfft(frames, n=N_FFT, axis=1)) ** 2
    return np.log(np.maximum(power @ _BANKS, _EPS)).astype(np.float32)
