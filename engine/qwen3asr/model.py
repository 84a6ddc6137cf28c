"""A Qwen3-ASR GGUF loaded for transcription: the native weights, the tokenizer stored beside them, and the
transcription prompt the official processor builds (chat template of the release, then one audio pad per
audio-tower vector)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import gguf
import numpy as np
from tokenizers import Tokenizer

from aural.engine.errors import ModelError
from aural.engine.isolation import RemoteQwen3Model
from aural.engine.runtime import CPU_DEVICE, DeviceFallback, isolates_devices, resolve_device

__all__ = ["Qwen3AsrModel"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_TOKENIZER_KEY = "tokenizer.huggingface.json"


class Qwen3AsrModel:
    """Qwen3-ASR weights (aural._native.Qwen3Model) with their tokenizer, on a ggml device.

    Attributes:
        native: the _native.Qwen3Model, or an `isolation.RemoteQwen3Model` in a device process.
        tokenizer: the tokenizers.Tokenizer the converter stored (Qwen2's byte-level BPE and the added tokens).
        eos: the end-of-sequence ids (generation_config.json's eos_token_id).
        name: the file's stem, as sessions and logs name the model.
        multilingual: True (LANGUAGE_NAMES); what the app's language picker asks of any model.
        load_s: seconds spent loading (the tokenizer and the weights, on the CPU again after a fallback at load).
        fallback: why the CPU runs the model in place of the device asked for (a `runtime.DeviceFallback`),
            None while it runs where it was asked to.
        batcher: when set (a `serve.batching.DecodeBatcher`), contexts opened in process from then on decode
            their one-token steps together with the other contexts' (`batcher.wrap`); None: each on its own.

    `device` is what `runtime.resolve_device` takes ("cpu", "auto", "Vulkan0", "CUDA"). A device other than the
    CPU runs the weights in a device process (`isolation`), as Whisper's, so that a driver's fault ends that
    process and not this one; `isolate` as for `runtime.WhisperModel`. A device that is not there, or cannot
    load the weights or open a context, leaves the model on the CPU with `fallback` saying why; one that fails
    later does the same under `run`.
    """

    def __init__(self, path: str | Path, *, n_threads: int = 0, device: str = "cpu",
                 isolate: bool | None = None) -> None:
        start = time.perf_counter()
        self.path = Path(path)
        self.name = self.path.stem
        self.multilingual = True
        self.n_threads = n_threads
        try:
            field = gguf.GGUFReader(self.path).fields.get(_TOKENIZER_KEY)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{self.path} is not a readable GGUF file ({exc}).") from exc
        if field is None:
            raise ModelError(f"{self.path} has no tokenizer ({_TOKENIZER_KEY}).")
        self.tokenizer = Tokenizer.from_str(bytes(field.parts[field.data[0]]).decode("utf-8"))
        self.fallback: DeviceFallback | None = None
        self.batcher = None
        self._encoding = threading.Lock()  # the encoder's compute buffer serves one call at a time
        self._load_on(device, isolate)
        self.eos = frozenset(self.native.eos_tokens)
        self.load_s = time.perf_counter() - start

    def _load_on(self, device: str, isolate: bool | None) -> None:
        try:
            target = resolve_device(device)
        except ModelError as exc:
            return self._fall_back_to_cpu(device, str(exc))
        isolated = bool(isolate or (isolate is None and target != CPU_DEVICE and isolates_devices()))
        try:
            self._load(target, isolated=isolated)
            if target != CPU_DEVICE or isolated:
                self.new_context(n_ctx=8)  # initialises the device's backend: a device that cannot run fails here
        except ModelError as exc:
            if target == CPU_DEVICE and not isolated:
                raise
            self._fall_back_to_cpu(target, str(exc.__cause__ or exc))

    def _load(self, device: str, *, isolated: bool) -> None:
        from aural import _native

        try:
            if isolated:
                self.native = RemoteQwen3Model(str(self.path), device=device, n_threads=self.n_threads)
                self._encode = self.native.encode_audio
            else:
                self.native = _native.Qwen3Model(str(self.path), n_threads=self.n_threads, device=device)
                self._encode = _native.Qwen3AudioEncoder(self.native).encode
        except (RuntimeError, ValueError) as exc:
            raise ModelError(f"Cannot load model {self.path.name}: {exc}") from exc

    def _fall_back_to_cpu(self, device: str, reason: str) -> None:
        self._load(CPU_DEVICE, isolated=False)
        if self.batcher is not None:  # the shared steps follow the weights
            self.batcher = self.batcher.for_model(self)
        self.fallback = DeviceFallback(device, reason)
        logger.warning("%s", self.fallback.message)

    @property
    def device(self) -> str:
        return self.native.device

    @property
    def backend(self) -> str:
        return self.native.backend

    @property
    def isolated(self) -> bool:
        return isinstance(self.native, RemoteQwen3Model)

    def new_context(self, *, n_ctx: int, kv_mode: str = "device", kv_type: str = "f16"):
        """A decoding session (_native.Qwen3Context, or its proxy in the device process) of n_ctx tokens; with a
        batcher, wrapped so that its steps go through it."""
        from aural import _native

        try:
            if self.isolated:
                return self.native.new_context(n_ctx=n_ctx, kv_mode=kv_mode, kv_type=kv_type)
            ctx = _native.Qwen3Context(self.native, n_ctx=n_ctx, kv_mode=kv_mode, kv_type=kv_type)
        except RuntimeError as exc:
            raise ModelError(f"Cannot create a session on {self.path.name}: {exc}") from exc
        return ctx if self.batcher is None else self.batcher.wrap(ctx)

    def run(self, work: Callable[[], _T], on_fallback: Callable[[DeviceFallback], None] | None = None) -> _T:
        """work(), which opens its own contexts; when the device fails under it (a RuntimeError from the native
        layer, or the device process's end), the weights load on the CPU in this process, `on_fallback` is told,
        and work() runs again there. Work on the CPU in process is not tried again: nothing is left to take it."""
        if self.device == CPU_DEVICE and not self.isolated:
            return work()
        try:
            return work()
        except (RuntimeError, ModelError) as exc:
            self._fall_back_to_cpu(self.device, str(exc.__cause__ or exc))
        if on_fallback is not None:
            on_fallback(self.fallback)
        return work()

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
            return self._encode(np.ascontiguousarray(mel, dtype=np.float32))

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
