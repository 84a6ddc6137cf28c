"""Saving transcripts with the engine's writers (the same TXT/SRT/VTT/JSON files as the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from aural.engine.text.writers import write_result

__all__ = ["CaptionSegment", "save_transcript"]


@dataclass(frozen=True)
class CaptionSegment:
    """A committed live caption in the shape the writers take (live captions have no token ids).

    `spaced`: a space separates it from the caption before (not between Chinese or Japanese characters).
    """

    id: int
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    spaced: bool = True
    speaker: str | None = None  # who says it, in a diarized transcript


def save_transcript(path: str | Path, fmt: str, segments: Iterable[Any], info: Any = None,
                    timings: Any = None) -> Path:
    """Write the segments to `path` in `fmt`; the file is replaced only once it is complete."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.part")
    try:
        with partial.open("w", encoding="utf-8", newline="\n") as fh:
            write_result(fmt, segments, info, timings, fh)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path
