"""A file's place in the queue and what has been transcribed from it (no Qt here: views and services share it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from aural.engine.metrics import Timings
from aural.engine.transcribe import Segment, TranscribeOptions, TranscriptionInfo

__all__ = ["FileJob", "JobStatus"]


class JobStatus(Enum):
    QUEUED = "Queued"
    RUNNING = "Transcribing"
    IDENTIFYING = "Identifying speakers"  # transcribed; diarizing (Preferences: Identify speakers)
    CANCELLING = "Cancelling…"
    DONE = "Done"
    CANCELLED = "Cancelled"
    FAILED = "Failed"


@dataclass(eq=False)
class FileJob:
    """One file of the queue and everything transcribed from it so far (kept whatever the outcome)."""

    id: int
    path: Path
    language: str | None  # None: detect (multilingual models)
    kv_mode: str
    options: TranscribeOptions = field(default_factory=TranscribeOptions)  # the Preferences when it was added
    diarize: bool = False  # name each segment's speaker once the file is transcribed (Preferences)
    n_speakers: int | None = None  # how many speak, when the Preferences say; None: found from the voices
    status: JobStatus = JobStatus.QUEUED
    info: TranscriptionInfo | None = None
    segments: list[Segment] = field(default_factory=list)
    timings: Timings | None = None
    error: str = ""
    done_s: float = 0.0
    total_s: float = 0.0
    history_id: int | None = None  # the finished transcript's id in the library (engine.history)
    started: float | None = None  # time.monotonic() when transcription began
    progressed: float | None = None  # time.monotonic() of the last progress report

    def report_progress(self, done_s: float, total_s: float) -> None:
        self.done_s, self.total_s = done_s, total_s
        self.progressed = time.monotonic()

    @property
    def fraction(self) -> float | None:
        """Share of the audio done; None before the first window has been decoded."""
        return self.done_s / self.total_s if self.total_s > 0 and self.done_s > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the speed so far, counting down between progress reports."""
        if self.started is None or self.progressed is None or not self.fraction:
            return None
        per_audio_s = (self.progressed - self.started) / self.done_s
        return max(0.0, per_audio_s * (self.total_s - self.done_s) - (time.monotonic() - self.progressed))
