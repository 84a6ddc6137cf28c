"""Whisper's byte-level BPE tokenizer with its special and timestamp tokens.

The text vocabulary and special tokens come from the HF ``tokenizer.json`` text stored in the model's
GGUF (``tokenizer.huggingface.json``). Special ids are found by looking up their strings, never by
hard-coded numbers, so English-only and multilingual vocabularies both work. Timestamp tokens are not
in that vocabulary: they start right after ``<|notimestamps|>`` (ref: openai-whisper tokenizer.py,
where the timestamps follow the last special token).
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterable, Sequence

from tokenizers import Tokenizer

__all__ = [
    "LANGUAGES",
    "TO_LANGUAGE_CODE",
    "TIME_PRECISION",
    "WhisperTokenizer",
    "normalize_language",
]


# Seconds per timestamp token: 30 s window / 1500 audio positions (ref: openai-whisper decoding.py,
# `precision = CHUNK_LENGTH / n_audio_ctx`).
TIME_PRECISION = 0.02

# Whisper's languages in token order: <|en|> is sot + 1, <|zh|> sot + 2, ... Order matters because the
# language tokens are laid out in exactly this sequence (ref: openai-whisper tokenizer.py LANGUAGES;
# "yue" is the 100th, present only in large-v3 vocabularies).
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
    "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak",
    "te": "telugu", "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian",
    "az": "azerbaijani", "sl": "slovenian", "kn": "kannada", "et": "estonian", "mk": "macedonian",
    "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian", "ne": "nepali",
    "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer",
    "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan",
    "ka": "georgian", "be": "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati",
    "am": "amharic", "yi": "yiddish", "lo": "lao", "uz": "uzbek", "fo": "faroese",
    "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt": "maltese",
    "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala",
    "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}

# Names and common aliases to codes (ref: openai-whisper tokenizer.py TO_LANGUAGE_CODE).
TO_LANGUAGE_CODE = {
    **{name: code for code, name in LANGUAGES.items()},
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht", "letzeburgesch": "lb",
    "pushto": "ps", "panjabi": "pa", "moldavian": "ro", "moldovan": "ro", "sinhalese": "si",
    "castilian": "es", "mandarin": "zh",
}

# Older vocabularies spell Hebrew "iw"; both resolve to the same token where it exists.
_CODE_ALIASES = {"iw": "he"}

# Symbols Whisper suppresses with suppress_tokens="-1": speaker tags, sound-effect brackets and music
# notes, keeping ordinary punctuation (ref: openai-whisper tokenizer.py non_speech_tokens).
_NON_SPEECH_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + (
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
)
# U+2640..U+267F symbols share their first UTF-8 bytes, so suppressing the first token of a multi-token
# encoding is safe (same reference).
_MISC_SYMBOLS = "♩♪♫♬♭♮♯"


def normalize_language(language: str | None) -> str | None:
    """A language code ("en") from a code or an English name ("English"); None stays None.

    Raises:
        ValueError: the language is not one of Whisper's.
    """
    if language is None:
        return None
    key = language.strip().lower()
    key = _CODE_ALIASES.get(key, key)
    if key in LANGUAGES:
        return key
    if key in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[key]
    raise ValueError(f"unsupported language: {language!r}")


class WhisperTokenizer:
    """Encodes and decodes Whisper text and knows the special-token layout of one vocabulary.

    Attributes:
        multilingual: whether the vocabulary has language and task tokens in its start sequence.
        language: the language code of the start sequence (None for English-only models).
        task: "transcribe" or "translate" (None for English-only models).
    """

    def __init__(self, hf: Tokenizer, *, multilingual: bool, language: str | None = None,
                 task: str | None = "transcribe"):
        if task not in (None, "transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {task!r}")
        self._hf = hf
        self.multilingual = multilingual
        # English-only models take no language or task tokens (ref: openai-whisper tokenizer.py
        # get_tokenizer: both forced to None when not multilingual).
        self.language = (normalize_language(language) or "en") if multilingual else None
        self.task = (task or "transcribe") if multilingual else None

    @classmethod
    def from_gguf_json(cls, json_text: str, *, multilingual: bool, language: str | None = None,
                       task: str | None = "transcribe") -> "WhisperTokenizer":
        """Builds the tokenizer from the ``tokenizer.huggingface.json`` text of a GGUF."""
        hf = Tokenizer.from_str(json_text)
        return cls(hf, multilingual=multilingual, language=language, task=task)

    def with_options(self, *, language: str | None = None, task: str | None = "transcribe") -> "WhisperTokenizer":
        """The same vocabulary with another language or task in its start sequence."""
        return WhisperTokenizer(self._hf, multilingual=self.multilingual, language=language, task=task)

    # -- text ---------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Text tokens only: the JSON's post-processor would add <|startoftranscript|> and friends."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of the text tokens; specials and timestamps (ids >= <|endoftext|>) are dropped."""
        eot = self.eot
        return self._hf.decode([int(t) for t in tokens if t < eot], skip_special_tokens=False)

    def decode_with_timestamps(self, tokens: Iterable[int]) -> str:
        """Text with timestamp tokens written in place as ``<|1.08|>``; other specials dropped."""
        parts: list[str] = []
        run: list[int] = []
        for token in tokens:
            if token >= self.timestamp_begin:
                parts.append(self.decode(run))
                run = []
                parts.append(f"<|{(token - self.timestamp_begin) * TIME_PRECISION:.2f}|>")
            else:
                run.append(token)
        parts.append(self.decode(run))
        return "".join(parts)

    # -- special tokens -----------------------------------------------------------------------------

    def _special(self, *names: str) -> int:
        for name in names:
            token = self._hf.token_to_id(name)
            if token is not None:
                return token
        raise KeyError(f"the vocabulary has none of {names}")

    @cached_property
    def eot(self) -> int:
        return self._special("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._special("<|startoftranscript|>")

    @cached_property
    def translate(self) -> int:
        return self._special("<|translate|>")

    @cached_property
    def transcribe(self) -> int:
        return self._special("<|transcribe|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._special("<|startoflm|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._special("<|startofprev|>")

    @cached_property
    def no_speech(self) -> int:
        # English-only HF vocabularies name the slot <|nocaptions|>; multilingual ones <|nospeech|>.
        return self._special("<|nospeech|>", "<|nocaptions|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._special("<|notimestamps|>")

    @cached_property
    def timestamp_begin(self) -> int:
        """Id of <|0.00|>: the first id after <|notimestamps|>."""
        return self.no_timestamps + 1

    # -- languages ----------------------------------------------------------------------------------

    @cached_property
    def language_codes_to_tokens(self) -> dict[str, int]:
        """Language code -> token id, for the languages this vocabulary has (99 or 100; none if .en)."""
        if not self.multilingual:
            return {}
        found = {code: self._hf.token_to_id(f"<|{code}|>") for code in LANGUAGES}
        if found.get("he") is None:
            found["he"] = self._hf.token_to_id("<|iw|>")
        return {code: token for code, token in found.items() if token is not None}

    @cached_property
    def language_tokens_to_codes(self) -> dict[int, str]:
        """Token id -> language code; the inverse of `language_codes_to_tokens`."""
        return {token: code for code, token in self.language_codes_to_tokens.items()}

    @property
    def language_token(self) -> int:
        """The token of `language`. Raises ValueError for English-only models."""
        if self.language is None:
            raise ValueError("an English-only vocabulary has no language tokens")
        try:
            return self.language_codes_to_tokens[self.language]
        except KeyError:
            raise ValueError(f"language {self.language!r} is not in this model's vocabulary") from None

    # -- sequences ----------------------------------------------------------------------------------

    @cached_property
    def sot_sequence(self) -> tuple[int, ...]:
        """[sot] for English-only models, [sot, language, task] for multilingual ones."""
        if not self.multilingual:
            return (self.sot,)
        task = self.transcribe if self.task == "transcribe" else self.translate
        return (self.sot, self.language_token, task)

    @cached_property
    def sot_sequence_including_notimestamps(self) -> tuple[int, ...]:
        return (*self.sot_sequence, self.no_timestamps)

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Tokens suppressed by suppress_tokens="-1" (ref: openai-whisper tokenizer.py).

        A symbol counts when it encodes to one token, with or without a leading space; the music notes
        count by their first token. Hyphens and apostrophes stay allowed inside words, so only their
        word-initial forms (" -", " '") are suppressed.
        """
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in _NON_SPEECH_SYMBOLS + list(_MISC_SYMBOLS):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in _MISC_SYMBOLS:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def suppress_tokens(self, spec: str | Sequence[int] | None) -> tuple[int, ...]:
        """Ids to mask at every step for a ``suppress_tokens`` option ("-1", "1,2", a list, or None).

        "-1" stands for `non_speech_tokens`. The start, task and previous-text tokens and the
        no-speech token are always added: they must never be sampled, and the no-speech probability
        is read separately (ref: openai-whisper decoding.py DecodingTask._get_suppress_tokens).
        """
        if isinstance(spec, str):
            ids = [int(t) for t in spec.split(",") if t.strip()]
        else:
            ids = [int(t) for t in (spec or ())]
        if -1 in ids:
            ids = [t for t in ids if t >= 0] + list(self.non_speech_tokens)
        ids += [self.transcribe, self.translate, self.sot, self.sot_prev, self.sot_lm, self.no_speech]
        return tuple(sorted(set(ids)))
