"""Whisper's log-mel spectrogram input, computed with numpy alone.

Why numpy: openai-whisper computes this with torch.stft and loads librosa-made filters from a .npz; both
are heavy dependencies for one STFT. numpy's pocketfft rfft over a strided frame view reproduces
torch.stft(center=True, pad_mode="reflect") exactly and runs a 30 s window in a few tens of ms, and the
Slaney filterbank is a few lines of arithmetic. Every constant below follows openai-whisper's
whisper/audio.py unless stated otherwise.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from threadpoolctl import ThreadpoolController

__all__ = [
    "N_FFT",
    "HOP_LENGTH",
    "CHUNK_LENGTH",
    "N_SAMPLES",
    "N_FRAMES",
    "AUDIO_CTX_MODES",
    "context_frames",
    "mel_filters",
    "log_mel_spectrogram",
    "pad_or_trim",
]

N_FFT = 400  # 25 ms window at 16 kHz
HOP_LENGTH = 160  # 10 ms hop: 100 frames per second
CHUNK_LENGTH = 30  # seconds of audio in one encoder window
SAMPLE_RATE = 16000
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a 30 s window
# "full": every window is padded to 30 s, as Whisper was trained; "auto": a window with less audio
# encodes a shorter context (see context_frames).
AUDIO_CTX_MODES = ("auto", "full")

# Slaney's auditory-toolbox mel scale (librosa's default, htk=False): linear at 200/3 Hz per mel below
# 1 kHz, logarithmic above, with 27 mels per factor 6.4 in frequency.
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_BREAK_HZ = 1000.0
_BREAK_MEL = _BREAK_HZ / _LINEAR_HZ_PER_MEL  # 15 mels
_LOG_STEP = np.log(6.4) / 27.0  # natural-log Hz ratio per mel above the break

# torch.hann_window(400) default is periodic: 0.5 - 0.5 cos(2 pi n / N), n = 0..N-1 (not N-1 in the divisor).
_HANN = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)

# Whisper's floor on mel power (1e-10 = -100 dB) and dynamic range kept below the loudest bin (8 decades).
_POWER_FLOOR = 1e-10
_DYNAMIC_RANGE = 8.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    log_part = _BREAK_MEL + np.log(np.maximum(hz, _BREAK_HZ) / _BREAK_HZ) / _LOG_STEP
    return np.where(hz >= _BREAK_HZ, log_part, hz / _LINEAR_HZ_PER_MEL)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    log_part = _BREAK_HZ * np.exp(_LOG_STEP * (np.maximum(mel, _BREAK_MEL) - _BREAK_MEL))
    return np.where(mel >= _BREAK_MEL, log_part, mel * _LINEAR_HZ_PER_MEL)


@lru_cache(maxsize=None)
def mel_filters(n_mels: int = 80, sr: int = 16000, n_fft: int = 400) -> np.ndarray:
    """Slaney mel filterbank, shape (n_mels, n_fft // 2 + 1) float32, read-only (it is cached).

    Same as librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels) with its defaults (fmin=0,
    fmax=sr/2, htk=False, norm="slaney"), the matrix openai-whisper ships in assets/mel_filters.npz
    (80 and 128 mels). Filter i is a triangle rising from edge i to edge i+1 and falling to edge i+2,
    the n_mels + 2 edges evenly spaced in mel; it is scaled by 2 / (edge[i+2] - edge[i]) Hz so every
    filter has the same area.
    """
    bin_hz = np.fft.rfftfreq(n_fft, d=1.0 / sr)  # (n_fft//2 + 1,) centre of each rfft bin
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(np.float64(sr / 2)), n_mels + 2))  # (n_mels + 2,)
    widths = np.diff(edges)
    rising = (bin_hz[np.newaxis, :] - edges[:-2, np.newaxis]) / widths[:-1, np.newaxis]
    falling = (edges[2:, np.newaxis] - bin_hz[np.newaxis, :]) / widths[1:, np.newaxis]
    weights = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))[:, np.newaxis]
    weights = weights.astype(np.float32)
    weights.setflags(write=False)
    return weights


@lru_cache(maxsize=1)
def _blas_threads() -> ThreadpoolController:
    """The BLAS libraries loaded in this process (numpy's), found once."""
    return ThreadpoolController()


def _power_spectrum(audio: np.ndarray) -> np.ndarray:
    """|STFT|^2 as torch.stft(center=True, reflect) gives it, minus the last frame: (n // HOP_LENGTH, 201)."""
    padded = np.pad(audio, N_FFT // 2, mode="reflect")
    # (1 + n // HOP_LENGTH, N_FFT) strided view, no copy; whisper drops the last frame (stft[..., :-1]).
    frames = sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:-1]
    spectrum = np.fft.rfft(frames * _HANN, axis=-1)
    return spectrum.real**2 + spectrum.imag**2


def log_mel_spectrogram(
    audio: np.ndarray,
    n_mels: int = 80,
    *,
    filters: np.ndarray | None = None,
    padding: int = 0,
) -> np.ndarray:
    """Whisper's normalised log-mel spectrogram of 16 kHz mono audio, shape (n_mels, n // HOP_LENGTH) float32.

    Args:
        audio: (n,) samples in [-1, 1].
        n_mels: 80, or 128 for large-v3; ignored when `filters` is given.
        filters: (n_mels, 201) filterbank to use instead of mel_filters(n_mels), e.g. one stored in a model.
        padding: Zero samples appended before the STFT (whisper pads N_SAMPLES so the last window is full).

    Returns:
        log10 of mel power floored at 1e-10, clamped to 8 below its maximum, then mapped by (x + 4) / 4.
    """
    weights = mel_filters(n_mels) if filters is None else filters
    samples = np.asarray(audio, dtype=np.float64)
    if padding > 0:
        samples = np.pad(samples, (0, padding))
    if samples.size // HOP_LENGTH == 0:
        return np.zeros((weights.shape[0], 0), dtype=np.float32)
    # (n_frames, 201) @ (201, n_mels): both operands contiguous for BLAS, about twice as fast as
    # weights @ power.T; transposed to (n_mels, n_frames) C order on the final cast. On one BLAS thread:
    # numpy's OpenBLAS would wake a thread per core for this ~1 ms product, and they then spin, waiting
    # for more work, beside the encoder's threads. On 2 cores the encode that follows took 291-310 ms
    # instead of 230-272 (tiny.en, 30 s window, 3 interleaved runs of 10).
    with _blas_threads().limit(limits=1, user_api="blas"):
        mel = _power_spectrum(samples) @ weights.T
    log_mel = np.log10(np.maximum(mel, _POWER_FLOOR))
    log_mel = np.maximum(log_mel, log_mel.max() - _DYNAMIC_RANGE)
    return ((log_mel.T + 4.0) / 4.0).astype(np.float32, order="C")


def window_mel(samples: np.ndarray, filters: np.ndarray, n_frames: int = N_FRAMES) -> np.ndarray:
    """(n_mels, n_frames) C-contiguous float32 log-mel of one window for the encoder, zero-padded as
    openai-whisper pads every window to 30 s: the frames equal the first n_frames of the 30 s version.

    openai-whisper computes the log-mel of the whole file once and clamps every frame to 8 below the
    file's maximum; here each window is clamped to its own maximum. For inputs up to 30 s the two are
    identical; for longer ones a quiet window gets a slightly different floor. That difference is
    what keeps memory bounded: nothing file-wide is ever held.
    """
    padding = max(0, n_frames * HOP_LENGTH - samples.size)
    mel = log_mel_spectrogram(samples, filters=filters, padding=padding)
    return np.ascontiguousarray(mel[:, :n_frames], dtype=np.float32)


def context_frames(n_samples: int, audio_ctx: str, *, pad_s: float, bucket_s: float, min_s: float = 0.0) -> int:
    """Mel frames to encode for `n_samples` of audio: N_FRAMES in "full" mode; in "auto" mode a shortened
    encoder context (ref: whisper.cpp `audio_ctx`): the audio plus `pad_s` of zeros, at least `min_s`, rounded
    up to whole buckets of `bucket_s` (an even number of frames, two per encoder position), at most N_FRAMES.
    The encoder's cost falls with its context (attention quadratically); buckets bound how often its graph is
    rebuilt."""
    if audio_ctx == "full":
        return N_FRAMES
    bucket = 2 * math.ceil(bucket_s * SAMPLE_RATE / HOP_LENGTH / 2)
    needed = max(min_s * SAMPLE_RATE, n_samples + pad_s * SAMPLE_RATE) / HOP_LENGTH
    return min(N_FRAMES, bucket * math.ceil(needed / bucket))


def pad_or_trim(array: np.ndarray, length: int = N_SAMPLES, axis: int = -1) -> np.ndarray:
    """Cuts or zero-pads `array` along `axis` to `length`: N_SAMPLES for audio, N_FRAMES for a mel."""
    size = array.shape[axis]
    if size > length:
        return np.take(array, np.arange(length), axis=axis)
    if size < length:
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, length - size)
        return np.pad(array, widths)
    return array
