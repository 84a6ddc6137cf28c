"""Speaker diarization of a whole recording: who spoke when, and which transcript segment is whose.

    diarizer = Diarizer.installed(n_threads=2)               # the models of `aural models pull speakers`
    turns = list(diarizer.diarize(audio, DiarizeOptions()))  # Turn(speaker=0, start=0.0, end=3.2), ...
    segments = assign_speakers(segments, turns)              # each segment's `speaker`: "Speaker 1", ...

The steps are those of pyannote's pipeline (Bredin 2023), with CAM++ (Wang et al. 2023, "CAM++: a fast and
efficient network for speaker verification using context-aware masking") as the embedding model:
1. segmentation-3.0 tells, in 10 s windows every `step_s`, when each of up to 3 local speakers talks;
2. each local speaker of each window gets one CAM++ embedding from the frames where it talks alone (or,
   when it never does for `min_embed_s`, from all its frames; shorter turns get none);
3. the embeddings are clustered (clustering.py): each cluster is a speaker of the recording;
4. every frame of the recording takes as many speakers as the windows covering it counted on average, the
   ones the windows' local speakers of those clusters voted for most; runs of frames become turns.
Only the whole recording can be clustered, so `diarize` yields its turns once it has seen all of it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aural.engine.speakers import segmentation as seg
from aural.engine.speakers.clustering import cluster
from aural.engine.speakers.fbank import FRAMES_PER_SECOND, SHIFT, log_mel

__all__ = ["DiarizeOptions", "Diarizer", "SpeakerAnalysis", "Turn", "assign_speakers", "speaker_label"]

# Same-speaker frames of one turn closer than this (seconds) are one turn: a breath is not a change of speaker.
_GAP_S = 0.25


@dataclass(frozen=True)
class Turn:
    """A stretch of one speaker's voice: `speaker` counts from 0 in order of first appearance; times in s."""

    speaker: int
    start: float
    end: float


@dataclass(frozen=True)
class DiarizeOptions:
    """How to diarize.

    Attributes:
        n_speakers: the number of speakers when known; None finds it with `threshold`.
        threshold: cosine similarity under which two groups of embeddings are different speakers.
        step_s: seconds between the starts of the 10 s segmentation windows.
        min_embed_s: a local speaker talking less than this in a window gets no embedding of its own.
    """

    n_speakers: int | None = None
    threshold: float = 0.45
    step_s: float = 2.5
    min_embed_s: float = 0.5


def speaker_label(speaker: int) -> str:
    return f"Speaker {speaker + 1}"


@dataclass(frozen=True)
class SpeakerAnalysis:
    """Local speakers of every window and their embeddings; `turns` clusters them (steps 3 and 4)."""

    chunks: seg.Chunks
    owners: list[tuple[int, int]]  # (window, local speaker) of each embedding
    embeddings: np.ndarray  # (len(owners), 192)
    n_samples: int

    def turns(self, *, n_speakers: int | None = None, threshold: float = DiarizeOptions.threshold) -> list[Turn]:
        if not self.owners:
            return []
        labels = cluster(self.embeddings, threshold=threshold, n_speakers=n_speakers)
        speaker_of = {owner: int(label) for owner, label in zip(self.owners, labels)}
        return list(_turns(_frame_speakers(self.chunks, speaker_of, self.n_samples)))


class Diarizer:
    """The segmentation and embedding models, loaded once; `diarize` may be called for many recordings."""

    def __init__(self, segmenter: Any, embedder: Any) -> None:
        self._segmenter = segmenter
        self._embedder = embedder

    @classmethod
    def installed(cls, *, n_threads: int = 0) -> Diarizer:
        """The models `aural models pull speakers` installed (ModelError naming that command when absent)."""
        from aural.engine.speakers.campplus import SpeakerEmbedder
        from aural.engine.speakers.weights import installed_paths

        paths = installed_paths()
        return cls(seg.Segmenter(paths.segmentation, n_threads=n_threads),
                   SpeakerEmbedder(paths.embedding, n_threads=n_threads))

    def diarize(self, audio: np.ndarray, options: DiarizeOptions = DiarizeOptions(),
                stop: threading.Event | None = None) -> Iterator[Turn]:
        """The turns of 16 kHz mono `audio`, in order of start time; none once `stop` is set (checked before
        each 10 s window's embeddings: a cancel lands within ~0.5 s)."""
        analysis = self.analyse(audio, options, stop)
        if stop is None or not stop.is_set():
            yield from analysis.turns(n_speakers=options.n_speakers, threshold=options.threshold)

    def analyse(self, audio: np.ndarray, options: DiarizeOptions = DiarizeOptions(),
                stop: threading.Event | None = None) -> SpeakerAnalysis:
        """Steps 1 and 2 (the costly ones): their result clusters again for another speaker count at no cost."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if audio.size < seg.FRAME_FIELD:
            return SpeakerAnalysis(seg.Chunks(np.zeros(0, np.int64), np.zeros((0, seg.FRAMES, seg.N_LOCAL), bool)),
                                   [], np.zeros((0, 0), np.float32), audio.size)
        chunks = self._segmenter(audio, step_s=options.step_s)
        owners, embeddings = self._embed(audio, chunks, options.min_embed_s, stop)
        stacked = np.stack(embeddings) if embeddings else np.zeros((0, 0), np.float32)
        return SpeakerAnalysis(chunks, owners, stacked, audio.size)

    def _embed(self, audio: np.ndarray, chunks: seg.Chunks, min_embed_s: float,
               stop: threading.Event | None) -> tuple[list, list]:
        owners: list[tuple[int, int]] = []
        embeddings: list[np.ndarray] = []
        min_frames = max(self._embedder.min_frames, round(min_embed_s * FRAMES_PER_SECOND))
        for c, start in enumerate(chunks.starts):
            if stop is not None and stop.is_set():
                break
            feats = log_mel(audio[start:start + seg.WINDOW])
            active = _fbank_activity(chunks.activity[c], len(feats))
            alone = active & (active.sum(axis=1, keepdims=True) == 1)
            for k in range(seg.N_LOCAL):
                frames = alone[:, k] if alone[:, k].sum() >= min_frames else active[:, k]
                if frames.sum() < min_frames:
                    continue
                picked = feats[frames]
                embeddings.append(self._embedder.embed(np.ascontiguousarray(picked - picked.mean(axis=0))))
                owners.append((c, k))
        return owners, embeddings


def _fbank_activity(activity: np.ndarray, n_fbank: int) -> np.ndarray:
    """(n_fbank, N_LOCAL): each 10 ms feature frame takes the segmentation frame nearest its centre."""
    centres = np.arange(n_fbank) * SHIFT + 200  # a 25 ms frame's centre, in samples
    nearest = np.clip(np.rint((centres - seg.FRAME_FIELD / 2) / seg.FRAME_STEP).astype(np.int64), 0, seg.FRAMES - 1)
    return activity[nearest]


def _frame_speakers(chunks: seg.Chunks, speaker_of: dict[tuple[int, int], int], n_samples: int) -> np.ndarray:
    """(n_frames, n_speakers) bool on the segmentation's frame grid over the whole recording."""
    n_frames = (n_samples - seg.FRAME_FIELD) // seg.FRAME_STEP + 1
    n_speakers = max(speaker_of.values(), default=-1) + 1
    votes = np.zeros((n_frames, n_speakers))
    count = np.zeros(n_frames)
    cover = np.zeros(n_frames)
    for c, start in enumerate(chunks.starts):
        first = int(round(start / seg.FRAME_STEP))
        frames = chunks.activity[c, :max(0, min(seg.FRAMES, n_frames - first))]
        span = slice(first, first + len(frames))
        cover[span] += 1
        count[span] += frames.sum(axis=1)
        for k in range(seg.N_LOCAL):
            if (c, k) in speaker_of:
                votes[span, speaker_of[(c, k)]] += frames[:, k]
    n_active = np.rint(count / np.maximum(cover, 1)).astype(np.int64)
    ranked = np.argsort(-votes, axis=1, kind="stable")
    active = np.zeros_like(votes, dtype=bool)
    for rank in range(min(seg.N_LOCAL, n_speakers)):
        rows = np.nonzero(n_active > rank)[0]
        chosen = ranked[rows, rank]
        keep = votes[rows, chosen] > 0
        active[rows[keep], chosen[keep]] = True
    return active


def _turns(active: np.ndarray) -> Iterator[Turn]:
    """Runs of active frames as turns, same-speaker runs closer than _GAP_S joined, renumbered by first start."""
    runs: list[tuple[float, float, int]] = []
    for speaker in range(active.shape[1]):
        edges = np.diff(np.concatenate([[0], active[:, speaker].astype(np.int8), [0]]))
        starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
        for first, last in zip(starts, ends):
            start = first * seg.STEP_S + (seg.FRAME_S - seg.STEP_S) / 2
            end = (last - 1) * seg.STEP_S + (seg.FRAME_S + seg.STEP_S) / 2
            if runs and runs[-1][2] == speaker and start - runs[-1][1] < _GAP_S:
                runs[-1] = (runs[-1][0], end, speaker)
            else:
                runs.append((start, end, speaker))
    runs.sort()
    order = {speaker: i for i, speaker in enumerate(dict.fromkeys(r[2] for r in runs))}
    for start, end, speaker in runs:
        yield Turn(speaker=order[speaker], start=round(start, 3), end=round(end, 3))


def _overlap(turn: Turn, start: float, end: float) -> float:
    return max(0.0, min(turn.end, end) - max(turn.start, start))


def _speaker_between(turns: Sequence[Turn], start: float, end: float) -> int | None:
    """The speaker talking most in [start, end]; for a point in time (or no overlap), the nearest turn's."""
    talk: dict[int, float] = {}
    for turn in turns:
        talk[turn.speaker] = talk.get(turn.speaker, 0.0) + _overlap(turn, start, end)
    if talk and max(talk.values()) > 0:
        return max(talk, key=talk.__getitem__)
    middle = (start + end) / 2
    nearest = min(turns, key=lambda t: min(abs(t.start - middle), abs(t.end - middle)), default=None)
    return None if nearest is None else nearest.speaker


def assign_speakers(segments: Iterable[Any], turns: Sequence[Turn],
                    label: Callable[[int], str] = speaker_label) -> Iterator[Any]:
    """Copies of the segments (dataclasses with a `speaker` field) naming the speaker who talks most in each
    (`label`: "Speaker 1" for speaker 0), one at a time as the segments arrive."""
    for segment in segments:
        speaker = _speaker_between(turns, float(segment.start), float(segment.end))
        yield dataclasses.replace(segment, speaker=None if speaker is None else label(speaker))
