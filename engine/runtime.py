"""A loaded Whisper model: the native weights, the tokenizer, the mel filterbank and the hparams.

`WhisperModel` is shared by every transcription; each transcription gets its own native `Context`
(encoder output, KV arena, graphs) from `new_session`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import gguf
import numpy as np

from .errors import ModelError
from .features import mel_filters
from .models import model_info
from .tokenizer import WhisperTokenizer

__all__ = ["WhisperModel"]

logger = logging.getLogger(__name__)

# What the native module raises for files it cannot load (bad magic, shapes, types) or devices it
# cannot open; anything else is a bug and should keep its traceback.
_NATIVE_LOAD_ERRORS = (RuntimeError, ValueError)


def _native():
    # Imported on first load so that the pure-Python parts of the engine import without the build. The CPU
    # level is chosen (and its buffer types probed) before the first model touches a device.
    from aural import _native as native

    from . import cpu

    cpu.configure()
    return native


def _stored_mel_filters(path: Path, n_mels: int) -> np.ndarray:
    """The model's own (n_mels, 201) filterbank; the standard Slaney one if the file has none."""
    reader = gguf.GGUFReader(path)  # memory-mapped: only this tensor is read
    for tensor in reader.tensors:
        if tensor.name == "mel_filters":
            return np.array(tensor.data, dtype=np.float32).reshape(n_mels, -1)
    logger.debug("%s stores no mel_filters; using the standard filterbank", path.name)
    return mel_filters(n_mels)


# Sequences one native context decodes side by side (context.h max_seq): beams or best-of samples.
MAX_SEQUENCES = 8


def _alignment_heads(info: dict, hparams: dict) -> list[tuple[int, int]]:
    """The model's alignment heads; without any, every head of the decoder's second half (ref:
    openai-whisper model.py Whisper.__init__ default)."""
    heads = [(int(layer), int(head)) for layer, head in info.get("alignment_heads") or []]
    if heads:
        return heads
    n_layer, n_head = int(hparams["n_text_layer"]), int(hparams["n_text_head"])
    return [(layer, head) for layer in range(n_layer // 2, n_layer) for head in range(n_head)]


class WhisperModel:
    """One GGUF Whisper model, loaded on a device.

    Attributes:
        path: the GGUF file.
        name: the model's name from its metadata (e.g. "tiny.en"), else the file stem.
        hparams: dimensions as the native model reports them (n_vocab, n_text_ctx, n_mels, ...).
        multilingual: whether the vocabulary has language and task tokens.
        tokenizer: the tokenizer of the model's vocabulary (English, transcribe by default).
        mel_filters: (n_mels, 201) float32 filterbank stored with the model.
        n_threads: CPU threads given to the native model and its sessions (0: native default).
        load_s: seconds spent loading (metadata, tokenizer and weights).
    """

    def __init__(self, path: str | Path, *, device: str = "auto", n_threads: int = 0):
        start = time.perf_counter()
        self.path = Path(path)
        self.n_threads = n_threads
        info = model_info(self.path)
        self.name = str(info.get("name") or self.path.stem)
        self.multilingual = bool(info["multilingual"])
        self.tokenizer = WhisperTokenizer.from_gguf_json(info["tokenizer_json"], multilingual=self.multilingual)
        self.mel_filters = _stored_mel_filters(self.path, int(info["n_mels"]))
        try:
            self._model = _native().Model(str(self.path), device=device, n_threads=n_threads)
        except _NATIVE_LOAD_ERRORS as exc:
            raise ModelError(f"Cannot load model {self.path.name}: {exc}") from exc
        self.hparams = dict(self._model.hparams)
        self.alignment_heads = _alignment_heads(info, self.hparams)
        self.load_s = time.perf_counter() - start
        logger.info("loaded %s on %s (%s) in %.2f s", self.name, self.device, self.backend, self.load_s)

    @property
    def backend(self) -> str:
        return self._model.backend

    @property
    def device(self) -> str:
        return self._model.device

    @property
    def n_mels(self) -> int:
        return int(self.hparams["n_mels"])

    @property
    def n_text_ctx(self) -> int:
        return int(self.hparams["n_text_ctx"])

    @property
    def weights_bytes(self) -> int:
        return int(self._model.weights_bytes)

    def new_session(self, *, kv_mode: str = "device", graph_reuse: bool = True, n_seq: int = 1):
        """A fresh native `Context` on this model: one per concurrent transcription. `n_seq` is the
        most sequences decoded side by side (beam size or best-of, at most 8)."""
        if kv_mode not in ("device", "host"):
            raise ValueError(f"kv_mode must be 'device' or 'host', not {kv_mode!r}")
        if not 1 <= n_seq <= MAX_SEQUENCES:
            raise ValueError(f"n_seq must be between 1 and {MAX_SEQUENCES}, not {n_seq}")
        try:
            return _native().Context(self._model, kv_mode=kv_mode, graph_reuse=graph_reuse,
                                     n_threads=self.n_threads, n_seq=n_seq)
        except _NATIVE_LOAD_ERRORS as exc:
            raise ModelError(f"Cannot create a session on {self.path.name}: {exc}") from exc

    def __repr__(self) -> str:
        return f"WhisperModel({self.name!r}, device={self.device!r}, backend={self.backend!r})"
