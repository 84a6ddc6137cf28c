"""Who speaks when inside 10 s windows: pyannote's segmentation-3.0 model, run by onnxruntime.

    seg = Segmenter(path_to_onnx, n_threads=2)
    chunks = seg(audio, step_s=2.5)     # audio: float32 mono 16 kHz
    chunks.activity                     # (n_chunks, 589, 3) bool: local speaker k talks in frame i of chunk c
    chunks.start_s(c), FRAME_S          # chunk c starts there; frame i covers FRAME_S seconds from i * STEP_S

The model (PyanNet: SincNet, LSTMs; Bredin 2023, "pyannote.audio 2.1 speaker diarization pipeline: principle,
benchmark, and recipe") reads 10 s (160 000 samples) and outputs, for each of 589 frames, log-probabilities
of 7 "powerset" classes: nobody, speaker 1, 2, 3 alone, and the pairs {1,2}, {1,3}, {2,3} (Plaquet & Bredin
2023, "Powerset multi-class cross entropy loss for neural speaker diarization"). The most probable class of a
frame is its decision, so no threshold is tuned. Local speakers are numbered per window only: which window's
"speaker 2" is whom is the clustering's job (pipeline.py). The frames come from SincNet's convolutions and
poolings: frame i covers samples [270 i, 270 i + 721) of its window.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from aural.engine.errors import ModelError

SAMPLE_RATE = 16000
WINDOW = 10 * SAMPLE_RATE  # samples per model input
FRAMES = 589  # frames per window: (160 000 - 721) // 270 + 1
FRAME_STEP = 270  # samples between frame starts
FRAME_FIELD = 721  # samples a frame sees
STEP_S = FRAME_STEP / SAMPLE_RATE
FRAME_S = FRAME_FIELD / SAMPLE_RATE
N_LOCAL = 3  # speakers per window the model tells apart
BATCH = 16  # windows per onnxruntime call: 16 x 640 kB of input

# Powerset class -> local speakers active, in the model's class order.
_POWERSET = np.array(
    [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=bool
)

__all__ = ["FRAMES", "FRAME_S", "N_LOCAL", "STEP_S", "WINDOW", "Chunks", "Segmenter", "chunk_starts"]


@dataclass(frozen=True)
class Chunks:
    """Local speaker activity of overlapping windows.

    Attributes:
        starts: (n_chunks,) first sample of each window.
        activity: (n_chunks, FRAMES, N_LOCAL) bool; frames past the end of the audio are False.
    """

    starts: np.ndarray
    activity: np.ndarray

    def start_s(self, chunk: int) -> float:
        return float(self.starts[chunk]) / SAMPLE_RATE


def chunk_starts(n_samples: int, step: int) -> np.ndarray:
    """Window starts every `step` samples, the last one reaching the end (pyannote's sliding windows)."""
    last = max(0, n_samples - WINDOW)
    starts = np.arange(0, last + 1, step, dtype=np.int64)
    if starts[-1] != last:
        starts = np.append(starts, last)
    return starts


class Segmenter:
    """The segmentation model on onnxruntime's CPU provider."""

    def __init__(self, path: str | os.PathLike[str], *, n_threads: int = 0) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ModelError("speaker diarization needs onnxruntime: pip install 'aural[diarize]'") from exc
        options = ort.SessionOptions()
        options.intra_op_num_threads = n_threads if n_threads > 0 else min(4, os.cpu_count() or 1)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initialisers are not the user's business
        try:
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for unreadable models
            raise ModelError(f"cannot load the speaker segmentation model {path}: {exc}".splitlines()[0]) from exc

    def __call__(self, audio: np.ndarray, *, step_s: float = 2.5) -> Chunks:
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        starts = chunk_starts(audio.size, max(FRAME_STEP, round(step_s * SAMPLE_RATE)))
        activity = np.zeros((len(starts), FRAMES, N_LOCAL), dtype=bool)
        for first in range(0, len(starts), BATCH):
            batch = starts[first:first + BATCH]
            windows = np.zeros((len(batch), 1, WINDOW), np.float32)
            for j, start in enumerate(batch):
                piece = audio[start:start + WINDOW]
                windows[j, 0, :piece.size] = piece
            logp = self._session.run(None, {"input": windows})[0]  # (batch, FRAMES, 7)
            activity[first:first + len(batch)] = _POWERSET[logp.argmax(axis=-1)]
        # A short input is zero-padded to one window: its padding is silence, not a decision.
        valid = (audio.size - FRAME_FIELD) // FRAME_STEP + 1
        if len(starts) == 1 and valid < FRAMES:
            activity[0, max(0, valid):] = False
        return Chunks(starts=starts, activity=activity)
