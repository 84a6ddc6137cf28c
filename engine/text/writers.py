"""Transcript writers (txt, srt, vtt, tsv, json) shared by the CLI and the GUI.

Every writer streams: it consumes segments one at a time and writes each to the file handle at
once, so a long transcription never becomes one big string and a lazy `Transcription` can be written
while it is still decoding. A segment is any object with `start`, `end` (seconds), `text` and `tokens`;
`id`, a `words` list and a `speaker` name (diarization: "Speaker 1") are used when present.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, TextIO

__all__ = [
    "DEFAULT_MAX_CUE_S",
    "DEFAULT_MAX_LINE_LEN",
    "Cue",
    "WRITERS",
    "format_timestamp",
    "iter_cues",
    "merge_fragments",
    "write_json",
    "write_result",
    "write_srt",
    "write_tsv",
    "write_txt",
    "write_vtt",
]

logger = logging.getLogger(__name__)

# Subtitle style guides (Netflix Timed Text Style Guide, BBC Subtitle Guidelines) allow at most two
# lines on screen per cue.
MAX_LINES_PER_CUE = 2
# Subtitle defaults of the Netflix Timed Text Style Guide (English): at most 42 characters per line and
# 7 seconds per cue. A 0 or None option turns the limit off.
DEFAULT_MAX_LINE_LEN = 42
DEFAULT_MAX_CUE_S = 7.0
# The shortest a merged cue is shown, seconds: the Netflix guide's minimum event duration is 5/6 s
# (20 frames at 24 fps); a little more reads better, and a cue never runs into the next one.
MIN_CUE_S = 1.0
# Pauses longer than this (seconds) start a new cue: the speaker stopped.
MAX_CUE_GAP_S = 1.0
_SENTENCE_ENDS = (".", "?", "!", "。", "？", "！", "…")

# default=str: model paths and similar values arrive as Path objects.
_dumps = partial(json.dumps, ensure_ascii=False, default=str)


class Cue(NamedTuple):
    """One subtitle event: times in seconds, its (already wrapped) lines of text and who says them."""

    start: float
    end: float
    lines: tuple[str, ...]
    speaker: str | None = None


def format_timestamp(seconds: float, decimal_marker: str = ".") -> str:
    """`HH:MM:SS.mmm` (hours always present), rounded half-up to the millisecond, negatives clamped to 0."""
    total_ms = max(0, math.floor(seconds * 1000 + 0.5))
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, ms = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def _wrap(words: Sequence[str], width: int) -> list[list[str]]:
    """Greedy word-boundary wrap; a word longer than `width` gets a line of its own, never broken."""
    lines: list[list[str]] = []
    line: list[str] = []
    length = 0
    for word in words:
        if line and length + 1 + len(word) > width:
            lines.append(line)
            line, length = [], 0
        length += len(word) + (1 if line else 0)
        line.append(word)
    if line:
        lines.append(line)
    return lines


def _cue_pieces(words: list[str], max_line_len: int | None) -> list[list[str]]:
    """Split a segment's words into groups that each fit one cue of at most two wrapped lines."""
    if not max_line_len:
        return [words]
    lines = _wrap(words, max_line_len)
    return [
        [word for line in lines[i : i + MAX_LINES_PER_CUE] for word in line]
        for i in range(0, len(lines), MAX_LINES_PER_CUE)
    ]


def _spread(start: float, end: float, pieces: list[list[str]]) -> Iterator[tuple[float, float, list[str]]]:
    """Share [start, end] among the pieces in proportion to their length in characters."""
    sizes = [len(" ".join(piece)) for piece in pieces]
    total = sum(sizes)
    done = 0
    for piece, size in zip(pieces, sizes):
        piece_start = start + (end - start) * done / total
        done += size
        yield piece_start, start + (end - start) * done / total, piece


def _limit_duration(
    start: float, end: float, words: list[str], max_cue_s: float | None
) -> Iterator[tuple[float, float, list[str]]]:
    """Split a cue longer than `max_cue_s` into enough word groups; clamp what cannot be split further."""
    if not max_cue_s or end - start <= max_cue_s:
        yield start, end, words
        return
    count = min(len(words), math.ceil((end - start) / max_cue_s))
    parts = [words[len(words) * i // count : len(words) * (i + 1) // count] for i in range(count)]
    for part_start, part_end, part in _spread(start, end, parts):
        # A single long word (a held note, "♪") cannot be split: shorten its display time instead.
        yield part_start, min(part_end, part_start + max_cue_s), part


def iter_cues(
    segments: Iterable[Any], *, max_line_len: int | None = None, max_cue_s: float | None = None
) -> Iterator[Cue]:
    """Subtitle cues for the segments: text stripped, empty segments dropped, long ones split."""
    for segment in segments:
        words = str(segment.text).split()
        if not words:
            continue
        start = max(0.0, float(segment.start))
        end = max(start, float(segment.end))
        speaker = getattr(segment, "speaker", None)
        for piece_start, piece_end, piece in _spread(start, end, _cue_pieces(words, max_line_len)):
            for cue_start, cue_end, part in _limit_duration(piece_start, piece_end, piece, max_cue_s):
                lines = _wrap(part, max_line_len) if max_line_len else [part]
                yield Cue(cue_start, cue_end, tuple(" ".join(line) for line in lines), speaker)


def merge_fragments(segments: Iterable[Any], *, max_chars: int = MAX_LINES_PER_CUE * DEFAULT_MAX_LINE_LEN,
                    max_cue_s: float = DEFAULT_MAX_CUE_S, max_gap_s: float = MAX_CUE_GAP_S,
                    min_cue_s: float = MIN_CUE_S) -> list[Any]:
    """Joins consecutive short segments (live commits: a word or a few each) into readable cues.

    A cue ends at a sentence's end, before a pause over `max_gap_s`, or before it would pass `max_chars`
    (two subtitle lines) or `max_cue_s`; then each cue is shown at least `min_cue_s` where the next one
    leaves room. The text is unchanged: every word, in order. Segments are dataclasses; a `spaced` field
    of False (Chinese, Japanese) joins without a space. Returns new segments numbered from 0.
    """
    groups: list[list[Any]] = []
    for segment in segments:
        if not str(segment.text).strip():
            continue
        group = groups[-1] if groups else None
        if group is None or _starts_cue(group, segment, max_chars, max_cue_s, max_gap_s):
            groups.append([segment])
        else:
            group.append(segment)
    merged = [_joined(i, group) for i, group in enumerate(groups)]
    for i, cue in enumerate(merged):
        room = merged[i + 1].start if i + 1 < len(merged) else math.inf
        merged[i] = dataclasses.replace(cue, end=max(cue.end, min(cue.start + min_cue_s, room)))
    return merged


def _starts_cue(group: list[Any], segment: Any, max_chars: int, max_cue_s: float, max_gap_s: float) -> bool:
    last = group[-1]
    return (str(last.text).strip().endswith(_SENTENCE_ENDS) or segment.start - last.end > max_gap_s
            or getattr(segment, "speaker", None) != getattr(last, "speaker", None)
            or segment.end - group[0].start > max_cue_s
            or len(_joined(0, group + [segment]).text) > max_chars)


def _joined(index: int, group: list[Any]) -> Any:
    text = str(group[0].text).strip()
    for segment in group[1:]:
        text += (" " if getattr(segment, "spaced", True) else "") + str(segment.text).strip()
    return dataclasses.replace(group[0], id=index, end=group[-1].end, text=text, tokens=[])


def write_txt(segments: Iterable[Any], fh: TextIO) -> None:
    """One line of stripped text per non-empty segment, after "Speaker 1: " when the segment names its speaker."""
    for segment in segments:
        text = str(segment.text).strip()
        speaker = getattr(segment, "speaker", None)
        if text:
            fh.write(f"{speaker}: {text}\n" if speaker else f"{text}\n")


def write_srt(
    segments: Iterable[Any],
    fh: TextIO,
    *,
    max_line_len: int | None = DEFAULT_MAX_LINE_LEN,
    max_cue_s: float | None = DEFAULT_MAX_CUE_S,
) -> None:
    """SubRip: numbered cues, `HH:MM:SS,mmm` times; a cue's speaker as a `[Speaker 1] ` prefix (SubRip has no
    voice markup; brackets are the captioning convention for who speaks)."""
    count = 0
    for count, cue in enumerate(iter_cues(segments, max_line_len=max_line_len, max_cue_s=max_cue_s), start=1):
        text = ("" if cue.speaker is None else f"[{cue.speaker}] ") + "\n".join(cue.lines)
        fh.write(f"{count}\n{format_timestamp(cue.start, ',')} --> {format_timestamp(cue.end, ',')}\n{text}\n\n")
    logger.debug("wrote %d SRT cues", count)


def _vtt_escape(text: str) -> str:
    # WebVTT cue text is markup: '&' and '<' must be escaped, and '>' too so "-->" cannot appear
    # (W3C WebVTT, section 4.2.2 "Cue text").
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_vtt(
    segments: Iterable[Any],
    fh: TextIO,
    *,
    max_line_len: int | None = DEFAULT_MAX_LINE_LEN,
    max_cue_s: float | None = DEFAULT_MAX_CUE_S,
) -> None:
    """WebVTT: the `WEBVTT` header, then cues with `HH:MM:SS.mmm` times; a cue's speaker as a voice span
    (`<v Speaker 1>`, W3C WebVTT 4.2.2), which players show or style as the speaker's name."""
    fh.write("WEBVTT\n\n")
    count = 0
    for count, cue in enumerate(iter_cues(segments, max_line_len=max_line_len, max_cue_s=max_cue_s), start=1):
        voice = "" if cue.speaker is None else f"<v {_vtt_escape(cue.speaker)}>"
        text = voice + "\n".join(_vtt_escape(line) for line in cue.lines)
        fh.write(f"{format_timestamp(cue.start)} --> {format_timestamp(cue.end)}\n{text}\n\n")
    logger.debug("wrote %d VTT cues", count)


def write_tsv(segments: Iterable[Any], fh: TextIO) -> None:
    """`start<TAB>end<TAB>text` with integer milliseconds, the layout of openai-whisper's tsv output."""
    fh.write("start\tend\ttext\n")
    for segment in segments:
        text = " ".join(str(segment.text).split())  # tabs and newlines would break the columns
        if text:
            fh.write(f"{round(1000 * float(segment.start))}\t{round(1000 * float(segment.end))}\t{text}\n")


def _as_dict(obj: Any) -> dict[str, Any]:
    """A word entry as a plain dict, whether it is a mapping, a dataclass or a named tuple."""
    if isinstance(obj, Mapping):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return obj._asdict()


def _word_record(word: Any) -> dict[str, Any]:
    record = _as_dict(word)
    for key in ("start", "end"):  # millisecond resolution, as for segments
        if key in record:
            record[key] = round(float(record[key]), 3)
    return record


def _segment_record(index: int, segment: Any) -> dict[str, Any]:
    record = {
        "id": getattr(segment, "id", index),
        # Millisecond resolution is all the decoder has (timestamps step by 20 ms); rounding drops float noise.
        "start": round(float(segment.start), 3),
        "end": round(float(segment.end), 3),
        "text": str(segment.text).strip(),
        "tokens": [int(token) for token in segment.tokens],
    }
    speaker = getattr(segment, "speaker", None)
    if speaker is not None:
        record["speaker"] = speaker
    words = getattr(segment, "words", None)
    if words:
        record["words"] = [_word_record(word) for word in words]
    return record


def _timings_record(timings: Any) -> dict[str, Any]:
    if timings is None:
        return {}
    return dict(timings) if isinstance(timings, Mapping) else timings.to_dict()


def write_json(segments: Iterable[Any], fh: TextIO, *, info: Any = None, timings: Any = None) -> None:
    """One JSON object: `language`, `model`, `backend`, `device`, `duration`, `segments`, `timings`.

    `info` is a TranscriptionInfo (or None); `timings` a dict, an object with `to_dict()`, or None.
    """
    remaining = iter(segments)
    # Decode the first segment before writing the header: with language detection, `info.language` is
    # only known once the first window has been decoded.
    first = list(itertools.islice(remaining, 1))
    header = {
        "language": getattr(info, "language", None),
        "model": getattr(info, "model", None),
        "backend": getattr(info, "backend", None),
        "device": getattr(info, "device", None),
        "duration": getattr(info, "duration_s", None),
    }
    fh.write("{")
    for key, value in header.items():
        fh.write(f"{_dumps(key)}: {_dumps(value)}, ")
    fh.write('"segments": [')
    for index, segment in enumerate(itertools.chain(first, remaining)):
        fh.write(("\n  " if index == 0 else ",\n  ") + _dumps(_segment_record(index, segment)))
    # Timings are read last: the transcription fills them in while its segments are consumed.
    fh.write(f'\n], "timings": {_dumps(_timings_record(timings))}}}\n')


WRITERS = {"txt": write_txt, "srt": write_srt, "vtt": write_vtt, "tsv": write_tsv, "json": write_json}
_SUBTITLE_FORMATS = frozenset({"srt", "vtt"})


def write_result(
    fmt: str,
    segments: Iterable[Any],
    info: Any,
    timings: Any,
    fh: TextIO,
    *,
    max_line_len: int | None = DEFAULT_MAX_LINE_LEN,
    max_cue_s: float | None = DEFAULT_MAX_CUE_S,
) -> None:
    """Write `segments` in format `fmt`, giving each writer only the options it uses."""
    try:
        writer = WRITERS[fmt]
    except KeyError:
        raise ValueError(f"unknown output format {fmt!r} (expected one of {', '.join(WRITERS)})") from None
    if fmt == "json":
        writer(segments, fh, info=info, timings=timings)
    elif fmt in _SUBTITLE_FORMATS:
        writer(segments, fh, max_line_len=max_line_len, max_cue_s=max_cue_s)
    else:
        writer(segments, fh)
