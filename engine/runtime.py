"""A loaded Whisper model: the native weights, the tokenizer, the mel filterbank and the hparams; the
compute devices it can run on, and the fallback to the CPU when its device fails.

`WhisperModel` is shared by every transcription; each transcription gets its own native `Context`
(encoder output, KV arena, graphs) from `new_session`, or a `FallbackSession` that moves to the CPU when
the device fails under it. A model on a device other than the CPU runs in a process of its own
(`isolation`), so that a driver fault which ggml answers by ending the process ends only that one.

    model = load_model(path, device="Vulkan0")   # on the CPU, with model.fallback saying why, if it must
    session = FallbackSession(model, on_fallback=print, kv_mode="device")
    session.run(lambda: session.ctx.encode(mel))  # done again on the CPU if Vulkan0 is lost meanwhile
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import gguf
import numpy as np

from .errors import ModelError
from .features import mel_filters
from .isolation import RemoteModel
from .models.store import model_info
from .text.tokenizer import WhisperTokenizer

__all__ = ["CPU_DEVICE", "ComputeDevice", "DeviceFallback", "FallbackSession", "WhisperModel", "compute_devices",
           "isolates_devices", "load_any_model", "load_model", "resolve_device"]

logger = logging.getLogger(__name__)

# What the native module raises for files it cannot load (bad magic, shapes, types) or devices it
# cannot open; anything else is a bug and should keep its traceback.
_NATIVE_LOAD_ERRORS = (RuntimeError, ValueError)

CPU_DEVICE = "CPU"  # ggml's name for its CPU device: what every fallback lands on
# AURAL_NO_ISOLATION=1 loads every device's weights in process (debugging; the fake GPU of the tests).
NO_ISOLATION_ENV = "AURAL_NO_ISOLATION"

_T = TypeVar("_T")


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


def isolates_devices() -> bool:
    """Whether a model on a device other than the CPU runs in a device process: unless $AURAL_NO_ISOLATION."""
    return os.environ.get(NO_ISOLATION_ENV, "0") in ("", "0")


def _isolates_by_default(device: str) -> bool:
    return device != CPU_DEVICE and isolates_devices()


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
        fallback: why the CPU runs the model in place of the device asked for (`load_model`,
            `fall_back`); None while it runs where it was asked to.
        isolated: whether the weights live in a device process (`isolation.RemoteModel`). `isolate`
            chooses: None (the default) isolates every device but the CPU, whose faults the CPU probe
            has ruled out at load (`cpu`), unless $AURAL_NO_ISOLATION is set; True also isolates the CPU
            (tests play device faults there); False isolates none.
        batcher: when set (a `serve.batching.DecodeBatcher`), sessions opened in process from then on
            decode their steps together with the other sessions' (`batcher.wrap`); None: each on its own.
        kv_pool: when set (`use_kv_pool`), the native `KVPool` whose blocks hold the self-attention K/V of
            the device-mode sessions opened in process from then on; None: each session its own arena.
    """

    def __init__(self, path: str | Path, *, device: str = "auto", n_threads: int = 0, isolate: bool | None = None):
        start = time.perf_counter()
        self.path = Path(path)
        self.n_threads = n_threads
        info = model_info(self.path)
        self.name = str(info.get("name") or self.path.stem)
        self.multilingual = bool(info["multilingual"])
        self.tokenizer = WhisperTokenizer.from_gguf_json(info["tokenizer_json"], multilingual=self.multilingual)
        self.mel_filters = _stored_mel_filters(self.path, int(info["n_mels"]))
        self._model = self._load_weights(device, isolate)
        self.fallback: DeviceFallback | None = None
        self._moving = threading.Lock()  # sessions of several threads may lose the device at once
        self.batcher = None
        self.kv_pool = None
        self.hparams = dict(self._model.hparams)
        self.alignment_heads = _alignment_heads(info, self.hparams)
        self.load_s = time.perf_counter() - start
        logger.info("loaded %s on %s (%s) in %.2f s", self.name, self.device, self.backend, self.load_s)

    def _load_weights(self, device: str, isolate: bool | None):
        native = _native()
        try:
            if isolate or (isolate is None and _isolates_by_default(native.select_device(device))):
                return RemoteModel(str(self.path), device=device, n_threads=self.n_threads)
            return native.Model(str(self.path), device=device, n_threads=self.n_threads)
        except _NATIVE_LOAD_ERRORS as exc:
            raise ModelError(f"Cannot load model {self.path.name}: {exc}") from exc

    def fall_back(self, device: str, reason: str) -> DeviceFallback:
        """The CPU takes over from `device`, which failed under a session for `reason`: the weights are
        loaded again on the CPU, once however many sessions report it, and sessions opened from then on
        run there. Sessions still open on the device keep its weights alive until they end."""
        with self._moving:
            if self.device == device and (device != CPU_DEVICE or self.isolated):
                self._model = self._load_weights(CPU_DEVICE, isolate=False)
                if self.batcher is not None:  # the shared steps follow the weights
                    self.batcher = self.batcher.for_model(self)
                if self.kv_pool is not None:  # and so does the pool, on the weights' device
                    self.kv_pool = _native().KVPool(self._model, n_blocks=self.kv_pool.n_blocks)
                self.fallback = DeviceFallback(device, reason)
                logger.warning("%s", self.fallback.message)
        assert self.fallback is not None, f"{device} failed under a session, but the model never ran on it"
        return self.fallback

    @property
    def backend(self) -> str:
        return self._model.backend

    @property
    def isolated(self) -> bool:
        return isinstance(self._model, RemoteModel)

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

    def use_kv_pool(self, mib: float | None = None, *, sessions: int = 1, n_seq: int = MAX_SEQUENCES) -> None:
        """Sessions opened in process from then on keep their self-attention K/V in one pool of about `mib`
        MiB on the model's device, in blocks of `KVPool.block_cells` tokens taken as their text grows and
        given back when it ends (paged KV, native/kv-pool.h), instead of each reserving its worst case
        (448 cells, more with beams). A session that finds the pool full fails its step with
        ContextFullError. mib None: the blocks `sessions` sessions of `n_seq` sequences could hold at most
        (their own arenas' cells), so the pool is never full where their arenas would have had room; on the
        CPU only the blocks taken so far are resident. Not for models in a device process, whose sessions
        keep their own arenas."""
        if self.isolated:
            raise ValueError("a KV pool serves sessions in this process; this model runs in a device process")
        native = _native()
        block_bytes = 2 * self.hparams["n_text_layer"] * native.KVPool.block_cells * self.hparams["n_text_state"] * 2
        if mib is None:
            n_blocks = sessions * native.KVPool.session_blocks(self._model, n_seq)
            mib = n_blocks * block_bytes / 2**20
        else:
            n_blocks = int(mib * 2**20 // block_bytes)
        if n_blocks < 1:
            raise ValueError(f"a KV pool of {mib} MiB holds no block of {block_bytes / 2**20:.2f} MiB")
        try:
            self.kv_pool = native.KVPool(self._model, n_blocks=n_blocks)
        except _NATIVE_LOAD_ERRORS as exc:
            raise ModelError(f"Cannot reserve a KV pool of {mib} MiB on {self.device}: {exc}") from exc

    def new_session(self, *, kv_mode: str = "device", graph_reuse: bool = True, n_seq: int = 1,
                    max_audio_ctx: int = 0):
        """A fresh native `Context` on this model: one per concurrent transcription. `n_seq` is the
        most sequences decoded side by side (beam size or best-of, at most 8); `max_audio_ctx` the most
        encoder positions a window may have (0: the model's, a 30 s window), for which the session reserves
        its cross-attention K/V and compute buffers."""
        if kv_mode not in ("device", "host"):
            raise ValueError(f"kv_mode must be 'device' or 'host', not {kv_mode!r}")
        if not 1 <= n_seq <= MAX_SEQUENCES:
            raise ValueError(f"n_seq must be between 1 and {MAX_SEQUENCES}, not {n_seq}")
        params = dict(kv_mode=kv_mode, graph_reuse=graph_reuse, n_threads=self.n_threads, n_seq=n_seq,
                      max_audio_ctx=max_audio_ctx)
        try:
            if self.isolated:
                return self._model.new_context(**params)
            if self.kv_pool is not None and kv_mode == "device":
                params["kv_pool"] = self.kv_pool
            ctx = _native().Context(self._model, **params)
            return ctx if self.batcher is None else self.batcher.wrap(ctx)
        except _NATIVE_LOAD_ERRORS as exc:
            raise ModelError(f"Cannot create a session on {self.path.name}: {exc}") from exc

    def __repr__(self) -> str:
        return f"WhisperModel({self.name!r}, device={self.device!r}, backend={self.backend!r})"


# -- devices ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComputeDevice:
    """One ggml device the model can run on.

    Attributes:
        name: ggml's name, which `load_model` and `--backend` take ("CPU", "Vulkan0", "CUDA0").
        description: what it is (the CPU's or the GPU's model).
        backend: the ggml backend it belongs to ("CPU", "Vulkan", "CUDA").
        type: "cpu", "gpu", "igpu", "accel" or "other".
        software: a GPU API run on the CPU (Mesa's llvmpipe): slower than the CPU backend, so auto skips it.
        memory_free: bytes free now.
        memory_total: bytes in all.
    """

    name: str
    description: str
    backend: str
    type: str
    software: bool
    memory_free: int
    memory_total: int


def compute_devices() -> list[ComputeDevice]:
    """Every device of every ggml backend built in. The first call loads ggml's backends and picks the CPU
    variant (half a second, seconds on a first run that probes the CPU): call it off a GUI thread."""
    return [ComputeDevice(**d) for d in _native().devices()]


def resolve_device(want: str) -> str:
    """The device the backend policy picks for `want`: "auto", a device or a backend name. Raises
    ModelError naming the devices there are when none matches."""
    try:
        return _native().select_device(want)
    except ValueError as exc:
        raise ModelError(str(exc)) from exc


@dataclass(frozen=True)
class DeviceFallback:
    """A device that could not be used, and the CPU taking over (also a `streaming.Event`).

    Attributes:
        device: the device that failed ("Vulkan0").
        reason: the native layer's words for what failed.
    """

    device: str
    reason: str

    @property
    def message(self) -> str:
        """One line for the user."""
        return f"{self.device} could not be used ({self.reason}): running on the CPU"


def _reason(exc: Exception) -> str:
    """The native error under a ModelError: "Cannot load model x.gguf:" would only repeat the model's name."""
    return str(exc.__cause__ or exc)


def load_model(path: str | Path, *, device: str = "auto", n_threads: int = 0,
               isolate: bool | None = None) -> WhisperModel:
    """The model on `device` ("auto": the backend policy's pick), or on the CPU with `fallback` saying why
    when that device cannot be used: it is not there (a GPU named in the settings, since unplugged), its
    backend does not initialise, or the weights or a session's buffers do not fit in its memory. A model
    file the CPU cannot load either raises ModelError. `isolate` as for WhisperModel."""
    try:
        target = resolve_device(device)
    except ModelError as exc:
        return _on_cpu(path, n_threads, DeviceFallback(device, str(exc)))
    if target == CPU_DEVICE and not isolate:
        return WhisperModel(path, device=target, n_threads=n_threads, isolate=isolate)
    try:
        model = WhisperModel(path, device=target, n_threads=n_threads, isolate=isolate)
        # Opening a session initialises the device's backend and reserves its worst-case buffers: a device
        # that cannot run the model fails here, at load, rather than under the first transcription.
        model.new_session()
    except ModelError as exc:
        return _on_cpu(path, n_threads, DeviceFallback(target, _reason(exc)))
    return model


def load_any_model(path: str | Path, *, device: str = "auto", n_threads: int = 0, isolate: bool | None = None) -> Any:
    """The model a file holds, whatever its architecture: a `qwen3asr.Qwen3AsrModel` for a Qwen3-ASR GGUF,
    else load_model's WhisperModel; either on `device`, or on the CPU with `fallback` saying why. `isolate` as for
    WhisperModel."""
    from aural.engine.qwen3asr import Qwen3AsrModel, gguf_architecture

    if Path(path).suffix == ".gguf" and gguf_architecture(path) == "qwen3-asr":
        return Qwen3AsrModel(path, n_threads=n_threads, device=device, isolate=isolate)
    return load_model(path, device=device, n_threads=n_threads, isolate=isolate)


def _on_cpu(path: str | Path, n_threads: int, fallback: DeviceFallback) -> WhisperModel:
    model = WhisperModel(path, device=CPU_DEVICE, n_threads=n_threads, isolate=False)
    model.fallback = fallback
    logger.warning("%s", fallback.message)
    return model


class FallbackSession:
    """A native session (`ctx`) that moves to the CPU when its device fails, for work that can be redone.

    `run(work)` calls `work()`; when the device fails inside it (a RuntimeError from the native layer that
    is not an interrupt: a lost device, a graph it cannot compute, memory it cannot allocate), the model
    falls back to the CPU (`WhisperModel.fall_back`), a new session is opened there, `on_fallback` is
    told, `undo()` puts back what the failed attempt changed, and `work()` runs again. A session that
    cannot be opened on the device is opened on the CPU the same way. Work that fails on the CPU is not
    tried again: there is nothing left to fall back to.

    Failures that reach Python are caught (buffers that cannot be allocated, a graph compute that returns an
    error status, exceptions such as vulkan-hpp's), and so is the end of an isolated model's device process
    (`isolation.DeviceProcessLost`): a driver error that ggml answers by ending the process (CUDA_CHECK's
    GGML_ABORT, ggml-vulkan's VK_CHECK exit(1)) or a driver's segfault. In process, those would end the app.

    Attributes:
        ctx: the native Context (or `isolation.RemoteContext`) in use now.
        device: the device it runs on.
        isolated: whether ctx is in a device process, which can fall back to the CPU in process even when
            its device is the CPU.
    """

    def __init__(self, model: WhisperModel, on_fallback: Callable[[DeviceFallback], None], **session):
        self.model = model
        self._session = session  # new_session's arguments, for the session on the CPU
        self._on_fallback = on_fallback
        self.device = model.device
        self.isolated = model.isolated
        try:
            self.ctx = model.new_session(**session)
        except ModelError as exc:  # no room on the device for this session's KV arena and buffers
            if not self._can_fall_back():
                raise
            self._move_to_cpu(exc)

    def _can_fall_back(self) -> bool:
        return self.device != CPU_DEVICE or self.isolated

    def fit(self, n_frames: int) -> None:
        """Makes room for a window of `n_frames` mel frames: a session opened for a shorter recording (its
        `max_audio_ctx`, from the length the file's header gave) is replaced by one for whole windows.
        Call it before encoding a window: a new session holds no encoder output or text."""
        cap = self._session.get("max_audio_ctx", 0)
        if cap and n_frames // 2 > cap:
            logger.info("a window of %d mel frames is longer than the %d this session was opened for; "
                        "reopening it for whole windows", n_frames, 2 * cap)
            self._session["max_audio_ctx"] = 0
            self.ctx = self.model.new_session(**self._session)

    def run(self, work: Callable[[], _T], undo: Callable[[], None] | None = None) -> _T:
        try:
            return work()
        except RuntimeError as exc:
            if not self._can_fall_back() or self.ctx.interrupted:
                raise
            self._move_to_cpu(exc)
        if undo is not None:
            undo()
        return work()

    def _move_to_cpu(self, exc: Exception) -> None:
        fallback = self.model.fall_back(self.device, _reason(exc))
        self.ctx = self.model.new_session(**self._session)
        self.device = CPU_DEVICE
        self.isolated = False
        self._on_fallback(fallback)
