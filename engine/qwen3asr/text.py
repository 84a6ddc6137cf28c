"""The model's output parsed as the official wrapper parses it (qwen-asr 0.0.6 inference/utils.py,
parse_asr_output and detect_and_fix_repetitions): "language English<asr_text>the words" -> ("English", "the
words"); "language None" is no speech; a run of one character, or of one pattern of up to 20 characters,
repeated more than 20 times is cut to one copy (a looping decode's tail)."""

from __future__ import annotations

__all__ = ["parse_output", "fix_repetitions"]

_TAG = "<asr_text>"
_LANGUAGE = "language "
_REPEATS = 20       # utils.py detect_and_fix_repetitions(threshold=20)
_PATTERN_CHARS = 20  # its fix_pattern_repeats(max_len=20)


def parse_output(raw: str, *, forced_language: str | None = None) -> tuple[str, str]:
    """(language, text) of a decoded output; with `forced_language` the output is the text alone."""
    s = (raw or "").strip()
    if not s:
        return "", ""
    s = fix_repetitions(s)
    if forced_language:
        return forced_language, s
    if _TAG not in s:
        return "", s.strip()
    meta, text = s.split(_TAG, 1)
    if "language none" in meta.lower():
        return "", text.strip()
    for line in meta.splitlines():  # the first line that names it
        line = line.strip()
        if line.lower().startswith(_LANGUAGE):
            return _language_name(line[len(_LANGUAGE):].strip()), text.strip()
    return "", text.strip()


def _language_name(name: str) -> str:
    """'english' -> 'English' (utils.py normalize_language_name: first letter upper, the rest lower)."""
    return name[:1].upper() + name[1:].lower() if name else ""


def fix_repetitions(text: str) -> str:
    return _fix_patterns(_fix_runs(text))


def _fix_runs(s: str) -> str:
    """A character repeated more than _REPEATS times in a row is kept once."""
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(s[i] if j - i > _REPEATS else s[i:j])
        i = j
    return "".join(out)


def _fix_patterns(s: str) -> str:
    """From the first place where a pattern of 1.._PATTERN_CHARS characters follows itself _REPEATS times, one
    copy of it is kept and every further copy dropped; the rest of the text is treated the same way."""
    n, i = len(s), 0
    while i <= n - 2 * _REPEATS:
        for k in range(1, _PATTERN_CHARS + 1):
            if i + k * _REPEATS > n:
                break
            pattern = s[i:i + k]
            if all(s[i + r * k:i + (r + 1) * k] == pattern for r in range(1, _REPEATS)):
                end = i + _REPEATS * k
                while end + k <= n and s[end:end + k] == pattern:
                    end += k
                return s[:i] + pattern + _fix_patterns(s[end:])
        i += 1
    return s
