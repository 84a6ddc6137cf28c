"""A Qwen3-ASR GGUF loaded for transcription: the native weights, the tokenizer stored beside them, and the
transcription prompt the official processor builds (chat template of the release, then one audio pad per
audio-tower vector)."""

from __future__ import annotations

import threading
from pathlib import Path

import gguf
import numpy as np
from tokenizers import Tokenizer

from aural.engine.errors import ModelError

__all__ = ["Qwen3AsrModel"]

_TOKENIZER_KEY = "tokenizer.huggingface.json"


class Qwen3AsrModel:
    """Qwen3-ASR weights (aural._native.Qwen3Model) with their tokenizer.

    Attributes:
        native: the _native.Qwen3Model.
        tokenizer: the tokenizers.Tokenizer the converter stored (Qwen2's byte-level BPE and the added tokens).
        eos: the end-of-sequence ids (generation_config.json's eos_token_id).
        name: the file's stem, as sessions and logs name the model.

    `device` is a ggml device name ("cpu", "Vulkan0", "auto"). The app and the CLI keep Qwen3-ASR on the CPU:
    a GPU driver's fault would end this process, and Whisper's device process (engine/isolation), which
    contains that, does not run Qwen3-ASR yet. The device tier of the tests and the benchmarks name devices.
    """

    def __init__(self, path: str | Path, *, n_threads: int = 0, device: str = "cpu") -> None:
        from aural import _native

        self.path = Path(path)
        self.name = self.path.stem
        try:
            field = gguf.GGUFReader(self.path).fields.get(_TOKENIZER_KEY)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{self.path} is not a readable GGUF file ({exc}).") from exc
        if field is None:
            raise ModelError(f"{self.path} has no tokenizer ({_TOKENIZER_KEY}).")
        self.tokenizer = Tokenizer.from_str(bytes(field.parts[field.data[0]]).decode("utf-8"))
        try:
            self.native = _native.Qwen3Model(str(self.path), n_threads=n_threads, device=device)
        except RuntimeError as exc:
            raise ModelError(str(exc)) from exc
        self.eos = frozenset(self.native.eos_tokens)
        self._encoder = _native.Qwen3AudioEncoder(self.native)
        self._encoding = threading.Lock()  # the encoder's compute buffer serves one call at a time

    def prompt(self, n_audio: int, *, context: str = "", language: str | None = None) -> list[int]:
        """The ids of a transcription prompt for n_audio audio vectors: the system turn holding `context`
        (words to bias towards, or nothing), the user turn with the audio, and the assistant's turn; with
        `language`, "language X<asr_text>" after it, which makes the model write the text alone
        (Qwen3ASRModel._build_text_prompt)."""
        ids = self._ids(f"<|im_start|>system\n{context}<|im_end|>\n<|im_start|>user\n<|audio_start|>")
        ids += [self.native.audio_token] * n_audio
        ids += self._ids("<|audio_end|><|im_end|>\n<|im_start|>assistant\n")
        if language:
            ids += self._ids(f"language {language}<asr_text>")
        return ids

    def encode_audio(self, mel: np.ndarray) -> np.ndarray:
        """The audio tower's vectors (A, n_state) for a 128-bin log-mel (128, frames)."""
        with self._encoding:
            return self._encoder.encode(np.ascontiguousarray(mel, dtype=np.float32))

    def decode_text(self, ids: list[int]) -> str:
        """Text of generated ids, special tokens left out (batch_decode(skip_special_tokens=True))."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def gguf_architecture(path: str | Path) -> str:
    """general.architecture of a GGUF file ("whisper", "qwen3-asr", ...), "" when it has none."""
    try:
        field = gguf.GGUFReader(path).fields.get("general.architecture")
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path} is not a readable GGUF file ({exc}).") from exc
    return bytes(field.parts[field.data[0]]).decode("utf-8") if field else ""


# Qwen3-ASR's 30 languages (utils.py SUPPORTED_LANGUAGES) by the codes Aural's --language takes.
LANGUAGE_NAMES = {
    "zh": "Chinese", "en": "English", "yue": "Cantonese", "ar": "Arabic", "de": "German", "fr": "French",
    "es": "Spanish", "pt": "Portuguese", "id": "Indonesian", "it": "Italian", "ko": "Korean", "ru": "Russian",
    "th": "Thai", "vi": "Vietnamese", "ja": "Japanese", "tr": "Turkish", "hi": "Hindi", "ms": "Malay", "nl": "Dutch",
    "sv": "Swedish", "da": "Danish", "fi": "Finnish", "pl": "Polish", "cs": "Czech", "fil": "Filipino",
    "fa": "Persian", "el": "Greek", "ro": "Romanian", "hu": "Hungarian", "mk": "Macedonian",
}


def language_name(code_or_name: str) -> str:
    """The model's name for a language given as a code ("en") or a name ("english"); ModelError otherwise."""
    key = code_or_name.strip().lower()
    names = {name.lower(): name for name in LANGUAGE_NAMES.values()}
    if key in LANGUAGE_NAMES or key in names:
        return LANGUAGE_NAMES.get(key) or names[key]
    raise ModelError(f"Qwen3-ASR does not know the language '{code_or_name}'; it knows "
                     f"{', '.join(sorted(LANGUAGE_NAMES))}.")
