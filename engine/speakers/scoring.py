"""Diarization error rate (DER): how much of the reference speech time is missed, falsely detected or given
to the wrong speaker, after mapping hypothesis speakers onto reference speakers to minimise the error.

    score = diarization_error(reference, hypothesis)   # lists of Turn-like (speaker, start, end)
    score.der, score.missed, score.false_alarm, score.confusion   # fractions of the reference speech

The definition is NIST's (RT-09 evaluation plan; pyannote.metrics' DiarizationErrorRate): on a 10 ms frame grid,
each frame scores max(n_ref, n_hyp) - n_correct, split into missed speech max(0, n_ref - n_hyp), false alarm
max(0, n_hyp - n_ref) and confusion min(n_ref, n_hyp) - n_correct, where n_correct counts the reference speakers
whose mapped hypothesis speaker is active too; overlapped speech counts once per speaker. The mapping is
one-to-one and the best of all (an exhaustive search: recordings here have at most 6 speakers on either side).
`collar_s` leaves that much time either side of each reference boundary unscored, as NIST's 0.25 s collar does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DiarizationScore", "diarization_error"]

FRAME_S = 0.01


@dataclass(frozen=True)
class DiarizationScore:
    der: float
    missed: float
    false_alarm: float
    confusion: float
    reference_s: float  # scored reference speech, speaker-seconds
    mapping: dict[Any, Any]  # hypothesis speaker -> reference speaker


def _grid(turns: Sequence[Any], n_frames: int) -> tuple[list[Any], np.ndarray]:
    speakers = sorted({t.speaker for t in turns}, key=str)
    grid = np.zeros((n_frames, len(speakers)), dtype=bool)
    for t in turns:
        grid[int(round(t.start / FRAME_S)):int(round(t.end / FRAME_S)), speakers.index(t.speaker)] = True
    return speakers, grid


def _scored_frames(reference: Sequence[Any], n_frames: int, collar_s: float) -> np.ndarray:
    keep = np.ones(n_frames, dtype=bool)
    collar = int(round(collar_s / FRAME_S))
    for t in reference if collar else ():
        for edge in (int(round(t.start / FRAME_S)), int(round(t.end / FRAME_S))):
            keep[max(0, edge - collar):edge + collar] = False
    return keep


def diarization_error(reference: Sequence[Any], hypothesis: Sequence[Any], *, collar_s: float = 0.0) -> DiarizationScore:
    end = max([t.end for t in reference] + [t.end for t in hypothesis] + [0.0])
    n_frames = int(round(end / FRAME_S)) + 1
    ref_names, ref = _grid(reference, n_frames)
    hyp_names, hyp = _grid(hypothesis, n_frames)
    keep = _scored_frames(reference, n_frames, collar_s)
    ref, hyp = ref[keep], hyp[keep]
    n_ref, n_hyp = ref.sum(axis=1), hyp.sum(axis=1)
    # together[i, j]: frames where reference speaker i and hypothesis speaker j both talk
    together = ref.T.astype(np.int64) @ hyp.astype(np.int64)
    best, best_map = -1, ()
    size = min(len(ref_names), len(hyp_names))
    for refs in itertools.permutations(range(len(ref_names)), size):
        for hyps in itertools.combinations(range(len(hyp_names)), size) if size else [()]:
            correct = sum(together[r, h] for r, h in zip(refs, hyps))
            if correct > best:
                best, best_map = correct, tuple(zip(hyps, refs))
    total = max(int(n_ref.sum()), 1)
    missed = int(np.maximum(0, n_ref - n_hyp).sum())
    false_alarm = int(np.maximum(0, n_hyp - n_ref).sum())
    confusion = int(np.minimum(n_ref, n_hyp).sum()) - max(best, 0)
    return DiarizationScore(
        der=(missed + false_alarm + confusion) / total, missed=missed / total, false_alarm=false_alarm / total,
        confusion=confusion / total, reference_s=float(n_ref.sum()) * FRAME_S,
        mapping={hyp_names[h]: ref_names[r] for h, r in best_map})
