"""A finished transcription in the response formats of OpenAI's audio API.

`json` is `{"text": ...}`; `text`, `srt` and `vtt` are plain text (the subtitle formats through Aural's own
writers, so they split cues as the CLI's files do); `verbose_json` adds the task, language (by name, as
OpenAI writes it: "english"), duration, the segments with their decoder statistics and, when words were
asked for with `timestamp_granularities[]=word`, the words with their times.
(ref: OpenAI API reference, "Create transcription" and its "The transcription object (Verbose JSON)".)
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..metrics import Timings
from ..text.tokenizer import LANGUAGES
from ..text.writers import write_srt, write_vtt
from ..transcribe import Segment, TranscriptionInfo

__all__ = ["FORMATS", "GRANULARITIES", "Finished", "render"]

# diarized_json: OpenAI's speaker-labelled segments (its gpt-4o-transcribe-diarize format), from Aural's own
# diarization (engine/speakers) when the server has the speaker models.
FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
GRANULARITIES = ("segment", "word")
_MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "diarized_json": "application/json",
                "text": "text/plain",
                "srt": "application/x-subrip", "vtt": "text/vtt"}


@dataclass(frozen=True)
class Finished:
    """A transcription read to its end.

    Attributes:
        task: "transcribe" or "translate".
        info: what the engine knew before the first segment.
        segments: every segment, with words when they were asked for.
        timings: where the time went (audio_s, wall_s, rtf, ...).
    """

    task: str
    info: TranscriptionInfo
    segments: list[Segment]
    timings: Timings

    @property
    def text(self) -> str:
        # Whisper's segments carry their own leading space where the language puts one.
        return "".join(s.text for s in self.segments).strip()


def media_type(fmt: str) -> str:
    return _MEDIA_TYPES[fmt]


def render(fmt: str, done: Finished, granularities: Sequence[str] = ()) -> str | dict:
    """The response body: a dict for the JSON formats, text for the others."""
    if fmt == "json":
        return {"text": done.text}
    if fmt == "text":
        return done.text + "\n"
    if fmt in ("srt", "vtt"):
        out = io.StringIO()
        (write_srt if fmt == "srt" else write_vtt)(done.segments, out)
        return out.getvalue()
    if fmt == "diarized_json":
        return _diarized(done)
    return _verbose(done, granularities)


def speaker_letter(speaker: int) -> str:
    """OpenAI's speaker labels: A, B, ... Z, then AA, AB, ... (speaker counts from 0)."""
    return (speaker_letter(speaker // 26 - 1) if speaker >= 26 else "") + chr(ord("A") + speaker % 26)


def _diarized(done: Finished) -> dict:
    """Segments whose `speaker` the server filled with letters (serve/app.py), in OpenAI's shape."""
    return {
        "task": done.task,
        "duration": round(done.timings.audio_s, 3),
        "text": done.text,
        "segments": [{"type": "transcript.text.segment", "id": f"seg_{s.id}", "start": round(s.start, 3),
                      "end": round(s.end, 3), "text": s.text.strip(), "speaker": s.speaker or "A"}
                     for s in done.segments],
    }


def _verbose(done: Finished, granularities: Sequence[str]) -> dict:
    body = {
        "task": done.task,
        "language": LANGUAGES.get(done.info.language, done.info.language),
        "duration": round(done.timings.audio_s, 3),
        "text": done.text,
    }
    if "segment" in granularities or not granularities:
        body["segments"] = [_segment(s) for s in done.segments]
    if "word" in granularities:
        body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                         for s in done.segments for w in s.words or ()]
    return body


def _segment(s: Segment) -> dict:
    return {
        "id": s.id,
        # OpenAI's seek is the mel frame (10 ms) its window started at; Aural's segments keep their own
        # start instead, so this is the frame the segment starts at.
        "seek": round(s.start * 100),
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "text": s.text,
        "tokens": list(s.tokens),
        "temperature": s.temperature,
        "avg_logprob": _number(s.avg_logprob),
        "compression_ratio": _number(s.compression_ratio),
        "no_speech_prob": _number(s.no_speech_prob),
    }


def _number(value: float) -> float | None:
    """A value the model does not give (NaN: Qwen3-ASR has no no-speech probability) is null, as JSON has no NaN."""
    return value if math.isfinite(value) else None
