"""Word-level timestamps: cross-attention of the alignment heads, aligned to time by dynamic time warping.

Whisper's timestamp tokens only bound segments. A few cross-attention heads of the decoder (the
model's "alignment heads", stored in the GGUF) attend to the audio frames a text token is spoken in,
so teacher-forcing the decoded text once more and reading those heads' weights gives, after
normalisation and a median filter, a text × time similarity matrix; the cheapest monotone path
through it (DTW) places each token, hence each word, in time. This follows openai-whisper timing.py
(find_alignment, add_word_timestamps) and faster-whisper's port of it. The native side only computes
the weights (`Context.align`, no flash attention for those heads); the rest is NumPy here.
"""

from __future__ import annotations

import logging
import string
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .text.tokenizer import WhisperTokenizer

__all__ = ["WordTiming", "dtw", "find_alignment", "median_filter", "merge_punctuations", "split_words", "token_positions"]

logger = logging.getLogger(__name__)

# Encoder positions per second: 1500 positions / 30 s (ref: openai-whisper audio.py TOKENS_PER_SECOND).
POSITIONS_PER_SECOND = 50
# Width of the median filter over time, in encoder positions (ref: openai-whisper timing.py medfilt_width).
MEDIAN_WIDTH = 7
# Languages written without spaces between words: words are split at character boundaries
# (ref: openai-whisper tokenizer.py split_to_word_tokens).
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass
class WordTiming:
    """One word in the window: its text, tokens, start/end seconds from the window's start and the
    mean probability of its tokens (mutable: the boundary heuristics adjust the times)."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a sliding window of `width` (odd) along the last axis, edges reflected (ref:
    openai-whisper timing.py median_filter, which pads with mode="reflect")."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x  # too short to filter (the reference gives up the same way)
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest monotone path from (0, 0) to (N-1, M-1) through `cost` [N, M].

    Steps are diagonal, down (next row) or right (next column); ties prefer right, then down, as the
    reference's comparisons do (ref: openai-whisper timing.py dtw_cpu). The accumulation runs over
    anti-diagonals, whose cells depend only on the two before, so each is one vectorised step.
    Returns the row and column index of every cell on the path.
    """
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        diag, up, left = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        step = np.where((diag < up) & (diag < left), 0, np.where((up < diag) & (up < left), 1, 2))
        acc[i, j] = cost[i - 1, j - 1] + np.choose(step, [diag, up, left])
        trace[i, j] = step
    trace[0, :] = 2
    trace[:, 0] = 1
    rows, cols = [], []
    i, j = n, m
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return np.array(rows[::-1]), np.array(cols[::-1])


def _split_on_unicode(tokenizer: WhisperTokenizer, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
    """Groups tokens into whole characters: a group closes once its bytes decode without a
    replacement character (a multi-byte character spans several byte-level tokens)."""
    words, groups, current = [], [], []
    for token in tokens:
        current.append(token)
        text = tokenizer.decode(current)  # specials decode to ""
        if "\ufffd" not in text:
            words.append(text)
            groups.append(current)
            current = []
    return words, groups


def split_words(tokenizer: WhisperTokenizer, tokens: Sequence[int], language: str | None) -> tuple[list[str], list[list[int]]]:
    """Words and their tokens. Spaced scripts: a word starts at a leading space, a punctuation mark or a
    special token; unspaced scripts: every character is a word."""
    words, groups = _split_on_unicode(tokenizer, tokens)
    if language in NO_SPACE_LANGUAGES:
        return words, groups
    out_words: list[str] = []
    out_groups: list[list[int]] = []
    for word, group in zip(words, groups):
        starts_new = (group[0] >= tokenizer.eot or word.startswith(" ") or word.strip() in string.punctuation
                      or not out_words)
        if starts_new:
            out_words.append(word)
            out_groups.append(list(group))
        else:
            out_words[-1] += word
            out_groups[-1].extend(group)
    return out_words, out_groups


def find_alignment(ctx, tokenizer: WhisperTokenizer, text_tokens: Sequence[int], n_frames: int,
                   heads: Sequence[tuple[int, int]]) -> list[WordTiming]:
    """Word timings of `text_tokens` in the window last encoded in `ctx` (n_frames mel frames of audio).

    The decoder is teacher-forced on <|startoftranscript|>… <|notimestamps|> text <|endoftext|>
    (ref: openai-whisper timing.py find_alignment). Replaces the context's self-attention cells.
    """
    if not text_tokens:
        return []
    matrix, logits = _attention(ctx, tokenizer, text_tokens, n_frames, heads)
    sot = tokenizer.sot_sequence
    # Probability of each text token given what precedes it (row i predicts token i + 1).
    rows = logits[len(sot):len(sot) + len(text_tokens), :tokenizer.eot].astype(np.float64)
    rows -= rows.max(axis=-1, keepdims=True)
    probs = np.exp(rows[np.arange(len(text_tokens)), list(text_tokens)]) / np.exp(rows).sum(axis=-1)
    text_index, time_index = dtw(-matrix)

    words, groups = split_words(tokenizer, [*text_tokens, tokenizer.eot], tokenizer.language)
    if len(groups) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(g) for g in groups[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_index), (1, 0), constant_values=1).astype(bool)
    jump_times = time_index[jumps] / POSITIONS_PER_SECOND
    starts, ends = jump_times[bounds[:-1]], jump_times[bounds[1:]]
    return [
        WordTiming(word, group, float(start), float(end), float(np.mean(probs[i:j])))
        for word, group, start, end, i, j in zip(words[:-1], groups[:-1], starts, ends, bounds[:-1], bounds[1:])
    ]


def _attention(ctx, tokenizer: WhisperTokenizer, text_tokens: Sequence[int], n_frames: int,
               heads: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(text x time similarity [len(text_tokens) + 1, n_frames // 2], logits [T, n_vocab]) of the teacher-forced
    sequence: the alignment heads' weights over the audio's encoder positions, standardised and smoothed
    (ref: openai-whisper timing.py find_alignment). Rows: <|notimestamps|> (which predicts the first text
    token), then each text token."""
    sot = list(tokenizer.sot_sequence)
    tokens = np.asarray([*sot, tokenizer.no_timestamps, *text_tokens, tokenizer.eot], dtype=np.int32)
    weights, logits = ctx.align(tokens, [tuple(h) for h in heads])  # [H, T, n_cross], [T, n_vocab]
    # Keep the frames that hold audio and renormalise: the reference takes a softmax over exactly
    # those positions, and a softmax restricted and renormalised is the same thing.
    n_pos = max(1, min(n_frames // 2, weights.shape[-1]))
    w = weights[:, :, :n_pos].astype(np.float64)
    w /= np.maximum(w.sum(axis=-1, keepdims=True), 1e-12)
    # Standardise each head over the tokens, then smooth over time (ref: timing.py find_alignment).
    w = (w - w.mean(axis=-2, keepdims=True)) / np.maximum(w.std(axis=-2, keepdims=True), 1e-12)
    matrix = median_filter(w, MEDIAN_WIDTH).mean(axis=0)
    return matrix[len(sot):-1], logits  # rows of <|notimestamps|> … last text token: one per token + end


def token_positions(ctx, tokenizer: WhisperTokenizer, text_tokens: Sequence[int], n_frames: int,
                    heads: Sequence[tuple[int, int]]) -> np.ndarray:
    """The encoder position (20 ms each) each of `text_tokens` attends to most, in the window last encoded in
    `ctx` (n_frames mel frames of audio): the AlignAtt policy's signal (Wang et al. 2024, Simul-Whisper;
    SimulStreaming), read from the same alignment heads as the word timestamps. A token's row is the step that
    predicts it, as when it was decoded: the decoder looks where that token is spoken to write it."""
    if not text_tokens:
        return np.zeros(0, dtype=np.int64)
    matrix, _ = _attention(ctx, tokenizer, text_tokens, n_frames, heads)
    return np.argmax(matrix[:-1], axis=-1)


def merge_punctuations(words: list[WordTiming], prepended: str, appended: str) -> list[WordTiming]:
    """Opening marks (a spaced word made of `prepended` characters) join the next word, closing marks
    (`appended`) the previous one, so that no word is a lone mark; the absorbing word keeps its times
    (ref: openai-whisper timing.py merge_punctuations)."""
    out = [WordTiming(w.word, list(w.tokens), w.start, w.end, w.probability) for w in words]
    following = len(out) - 1
    for i in range(len(out) - 2, -1, -1):
        prev = out[i]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            out[following].word = prev.word + out[following].word
            out[following].tokens = prev.tokens + out[following].tokens
            prev.word, prev.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(out)):
        if not out[previous].word.endswith(" ") and out[j].word in appended:
            out[previous].word += out[j].word
            out[previous].tokens += out[j].tokens
            out[j].word, out[j].tokens = "", []
        else:
            previous = j
    return out


@dataclass
class SegmentWords:
    """A segment's time span and words (seconds from the start of the input), as aligned."""

    start: float
    end: float
    words: list[WordTiming]


# Sentence-final marks: an overlong word next to one is cut to max_duration (ref: openai-whisper
# timing.py add_word_timestamps, "truncate long words at sentence boundaries").
SENTENCE_END = ".。!！?？"
# Word durations are capped from the median, itself at most 0.7 s (ref: add_word_timestamps).
MAX_MEDIAN_S = 0.7


def _duration_limits(words: list[WordTiming]) -> tuple[float, float]:
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    median = min(MAX_MEDIAN_S, float(np.median(durations))) if durations.size else 0.0
    return median, 2 * median


def _cut_at_sentence_ends(words: list[WordTiming], max_duration: float) -> None:
    for prev, w in zip(words, words[1:]):
        if w.end - w.start > max_duration:
            if w.word in SENTENCE_END:
                w.end = w.start + max_duration
            elif prev.word in SENTENCE_END:
                w.start = w.end - max_duration


def _fit_segment(seg: SegmentWords, median: float, max_duration: float, last_speech_end: float) -> None:
    """openai-whisper's boundary heuristics: an overlong first word after a pause is shortened, and
    the segment's own timestamps win over a first/last word that overruns them by over 0.5 s."""
    words = seg.words
    first = words[0]
    long_start = first.end - first.start > max_duration or (
        len(words) > 1 and words[1].end - first.start > max_duration * 2)
    if first.end - last_speech_end > median * 4 and long_start:
        if len(words) > 1 and words[1].end - words[1].start > max_duration:
            boundary = max(words[1].end / 2, words[1].end - max_duration)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - max_duration)
    if seg.start < first.end and seg.start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median, seg.start))
    else:
        seg.start = first.start
    last = words[-1]
    if seg.end > last.start and seg.end + 0.5 < last.end:
        last.end = max(last.start + median, seg.end)
    else:
        seg.end = last.end


def window_words(ctx, tokenizer: WhisperTokenizer, segments: Sequence[tuple[float, float, Sequence[int]]], *,
                 time_offset: float, n_frames: int, heads: Sequence[tuple[int, int]], prepended: str,
                 appended: str, last_speech_end: float) -> tuple[list[SegmentWords], float]:
    """Words of one window's segments (start, end, tokens), aligned together in one decoder pass.

    Returns each segment's (possibly adjusted) span with its words in input time, and the end of the
    last speech for the next window (ref: openai-whisper timing.py add_word_timestamps).
    """
    per_segment = [[t for t in tokens if t < tokenizer.eot] for _, _, tokens in segments]
    text_tokens = [t for tokens in per_segment for t in tokens]
    alignment = find_alignment(ctx, tokenizer, text_tokens, n_frames, heads)
    median, max_duration = _duration_limits(alignment)
    if alignment:
        _cut_at_sentence_ends(alignment, max_duration)
    alignment = merge_punctuations(alignment, prepended, appended)

    out: list[SegmentWords] = []
    index = 0
    for (start, end, _), tokens in zip(segments, per_segment):
        seg = SegmentWords(start, end, [])
        taken = 0
        while index < len(alignment) and taken < len(tokens):
            w = alignment[index]
            if w.word:
                seg.words.append(WordTiming(w.word, w.tokens, round(time_offset + w.start, 2),
                                            round(time_offset + w.end, 2), w.probability))
            taken += len(w.tokens)
            index += 1
        if seg.words:
            _fit_segment(seg, median, max_duration, last_speech_end)
            last_speech_end = seg.end
        out.append(seg)
    return out, last_speech_end
