"""Chinese script of transcripts: Simplified ("hans") or Traditional ("hant") Han characters.

Whisper writes Chinese in whichever script its training data leaned to for that audio, and often mixes
both within one file, so the text is converted after decoding. Why OpenCC (the `opencc` package): it
converts phrase by phrase, not character by character, which is what gets one-to-many mappings right
(Simplified 发 is Traditional 發 in 出发 but 髮 in 头发), and its PyPI wheels carry the compiled library
and dictionaries, so nothing is compiled at install time.

The default script follows the user's locale, as the script subtags of BCP 47 (RFC 5646, "Hans",
"Hant") and the regions that write Traditional Chinese (Taiwan, Hong Kong, Macau) say; any other
locale gets Simplified, the script of most Mandarin speakers.

    >>> to_script("頭髮乾淨", "hans")
    '头发干净'
    >>> segments = localize_segments(transcription, transcription.info.language, default_script())
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import locale
import os
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["SCRIPTS", "UNSPACED_CHARS", "default_script", "localize_segments", "localize_transcription", "to_script"]

# Characters of scripts written without spaces between words, as a regex character class's inside: CJK
# ideographs (with extensions and compatibility forms), kana, and CJK and full-width punctuation (Unicode
# blocks 3000-30FF, 3400-4DBF, 4E00-9FFF, F900-FAFF, FF00-FFEF). Hangul is written with spaces and is not
# among them.
UNSPACED_CHARS = "\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"

# Script code -> OpenCC configuration that converts any Chinese text into that script (the ".json"
# spelling is accepted by every opencc release).
_CONFIGS = {"hans": "t2s.json", "hant": "s2t.json"}
SCRIPTS = tuple(_CONFIGS)

# Regions whose standard written Chinese is Traditional (ISO 3166-1 codes).
_TRADITIONAL_REGIONS = {"tw", "hk", "mo"}
# POSIX order of precedence for the messages locale (ref: POSIX.1-2017, 8.2 Internationalization Variables).
_LOCALE_ENV = ("LC_ALL", "LC_MESSAGES", "LANG")


def default_script(locale_name: str | None = None) -> str:
    """The script for a locale name ("zh_TW.UTF-8", "zh-Hant-HK", QLocale's "zh_TW"), or for the
    user's locale when None: "hant" for a Hant script or a TW/HK/MO region, else "hans"."""
    name = _user_locale() if locale_name is None else locale_name
    # Codeset (".UTF-8") and modifier ("@euro") say nothing about script; "-" and "_" both separate subtags.
    subtags = name.split(".")[0].split("@")[0].replace("-", "_").lower().split("_")
    if "hant" in subtags:
        return "hant"
    if "hans" in subtags:
        return "hans"
    return "hant" if subtags[0] == "zh" and _TRADITIONAL_REGIONS & set(subtags[1:]) else "hans"


def _user_locale() -> str:
    for variable in _LOCALE_ENV:
        if value := os.environ.get(variable):
            return value
    # No POSIX variables (Windows, a bare macOS app launch): ask the C library instead.
    return locale.getlocale()[0] or ""


@functools.cache
def _converter(script: str) -> Any:
    import opencc  # loads the OpenCC library and its dictionaries: only when Chinese is converted

    return opencc.OpenCC(_CONFIGS[script])


def _check(script: str) -> None:
    if script not in _CONFIGS:
        raise ValueError(f"unknown Chinese script {script!r}; accepted: {', '.join(SCRIPTS)}")


def to_script(text: str, script: str) -> str:
    """text with its Han characters in `script` ("hans" or "hant"); other characters are kept.

    Raises:
        ValueError: script is not one of SCRIPTS.
    """
    _check(script)
    return _converter(script).convert(text)


def localize_segments(segments: Iterable[Any], language: str | None, script: str) -> Iterator[Any]:
    """The segments (dataclasses with a `text` field) with their text in `script` when `language` is
    "zh"; any other language passes through unchanged. Lazy, like the transcription it wraps.

    Raises:
        ValueError: script is not one of SCRIPTS (at once, not on the first segment).
    """
    _check(script)
    if language != "zh":
        return iter(segments)
    return (_localize(segment, script) for segment in segments)


def localize_transcription(transcription: Any, script: str, *, translated: bool = False) -> Iterator[Any]:
    """localize_segments over a transcription (transcribe.Transcription) whose language is read as each segment
    comes: a Qwen3-ASR transcription names it only once its first chunk is decoded. A translation (English)
    passes through unchanged. Lazy, and like localize_segments raises ValueError for a bad script at once."""
    _check(script)
    return (_localize(segment, script) if not translated and transcription.info.language == "zh" else segment
            for segment in transcription)


def _localize(segment: Any, script: str) -> Any:
    words = getattr(segment, "words", None)
    if not words:
        return dataclasses.replace(segment, text=to_script(segment.text, script))
    # Words of Chinese are one or two characters, too short for OpenCC's phrases (头|发 would become
    # 頭|發, not 頭髮), so the words are converted together and cut back at their old lengths, which
    # OpenCC keeps (its tables map characters 1:1); should a phrase change a length, each word is
    # converted alone.
    originals = [w.word for w in words]
    joined = to_script("".join(originals), script)
    if len(joined) == sum(map(len, originals)):
        bounds = list(itertools.accumulate(map(len, originals), initial=0))
        texts = [joined[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    else:
        texts = [to_script(w, script) for w in originals]
    return dataclasses.replace(segment, text=to_script(segment.text, script),
                               words=[dataclasses.replace(w, word=t) for w, t in zip(words, texts)])
