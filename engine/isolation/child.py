"""The device process: one native model (Whisper's Model, or Qwen3-ASR's Qwen3Model with its audio tower) and its
contexts, served to the parent over two sockets; `KINDS` says what each architecture exposes.

    python -m aural.engine.isolation.child CALLS_FD CONTROL_FD ARRAYS_FD   # started by aural.engine.isolation

The first message names the kind, the weights, the device, the thread count and the log level; the answer is
the model's fields or the error loading it. Requests on CALLS_FD are then (frees, op, args) tuples answered in
order, one at a time: ("ok", value) or ("err", exception class name, message). A result array of up to
SHARED_BYTES (a decoder step's logits) is left in the shared memory ARRAYS_FD maps, and the value says only its
shape (`Shared`): through the socket, 5 beams' 1 MB of logits cost 1.02 ms per step over the in-process call,
through the shared memory 0.71 (tiny.en on the CPU, a 2-core Sapphire Rapids-class VM, 5 interleaved rounds
of 100 steps, 2026-12-03).

CONTROL_FD carries context ids to interrupt; a thread of its own serves it, since the calls socket is busy
while the call to interrupt runs (`Context.interrupt` is thread-safe). The process ends when the parent
closes CALLS_FD or dies; native log lines go to stderr, which the parent reads.
"""

from __future__ import annotations

import mmap
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

# 8 sequences' float32 logits for a vocabulary of up to 131 072 tokens (Whisper's is 51 865, Qwen3's 151 936
# for one sequence).
SHARED_BYTES = 4 << 20


@dataclass(frozen=True)
class Shared:
    """A result array left at the start of the shared memory: its shape and numpy dtype string."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Kind:
    """What the process serves for one model architecture.

    Attributes:
        fields: the model's read-only attributes, sent once at load.
        readable: context attributes the parent may read between calls.
        calls: context methods the parent may call, each with the attributes it changes, which travel back with
            its result, so that the decoder loop needs no second round trip for them.
        model_calls: model methods the parent may call (the Qwen3 audio tower's encode, which runs on the
            model's device with a compute buffer of its own).
    """

    fields: tuple[str, ...]
    readable: frozenset[str]
    calls: dict[str, tuple[str, ...]]
    model_calls: frozenset[str] = frozenset()


KINDS = {
    "whisper": Kind(
        fields=("hparams", "device", "backend", "device_info", "n_threads", "weights_bytes", "weight_buffers",
                "widened_bytes", "simd_gelu", "simd_attention", "simd_cross", "simd_self", "int8", "int8_bytes",
                "screen_bytes", "path"),
        readable=frozenset({"interrupted", "stats", "backend_report"}),
        calls={"encode": ("last_encode",), "decode": ("last_timings",), "align": ("last_timings",), "reorder": (),
               "clear_kv": ()}),
    "qwen3-asr": Kind(
        fields=("device", "backend", "host_weights", "n_vocab", "n_state", "audio_token", "audio_window_frames",
                "eos_tokens", "weights_bytes", "path"),
        readable=frozenset({"stats", "kv_bytes", "compute_bytes", "fallback_ops"}),
        calls={"decode": ("last_timings", "n_past"), "rewind": ("n_past",), "clear": ("n_past",)},
        model_calls=frozenset({"encode_audio", "audio_vectors"})),
}


class _Qwen3Weights:
    """Qwen3-ASR's weights with the audio tower that runs on them: the model calls of the qwen3-asr kind."""

    def __init__(self, native: Any, path: str, device: str, n_threads: int):
        self.native = native.Qwen3Model(path, device=device, n_threads=n_threads)
        self._encoder = native.Qwen3AudioEncoder(self.native)

    def __getattr__(self, name: str) -> Any:  # the model's fields and audio_vectors
        return getattr(self.native, name)

    def encode_audio(self, mel: np.ndarray) -> np.ndarray:
        return self._encoder.encode(mel)


def _load(native: Any, kind: str, path: str, device: str, n_threads: int) -> tuple[Any, Any]:
    """The weights of `kind` and the factory of their contexts."""
    if kind == "qwen3-asr":
        weights = _Qwen3Weights(native, path, device, n_threads)
        return weights, lambda **params: native.Qwen3Context(weights.native, **params)
    model = native.Model(path, device=device, n_threads=n_threads)
    return model, lambda **params: native.Context(model, **params)


class _Server:
    def __init__(self, kind: Kind, model: Any, new_context: Any, shared: mmap.mmap):
        self.kind = kind
        self.model = model
        self.new_context = new_context
        self.shared = shared
        self.contexts: dict[int, Any] = {}
        self.next_id = 0

    def handle(self, op: str, args: tuple) -> Any:
        if op == "new_context":
            ctx = self.new_context(**args[0])
            self.next_id += 1
            self.contexts[self.next_id] = ctx
            return self.next_id
        if op == "model":
            if args[0] not in self.kind.model_calls:
                raise AttributeError(args[0])
            return self._share(getattr(self.model, args[0])(*args[1]))
        ctx = self.contexts[args[0]]
        if op == "get":
            if args[1] not in self.kind.readable:
                raise AttributeError(args[1])
            return getattr(ctx, args[1])
        if op == "call":
            method, call_args, kwargs = args[1], args[2], args[3]
            if method not in self.kind.calls:
                raise AttributeError(method)
            value = getattr(ctx, method)(*call_args, **kwargs)
            return self._share(value), {name: getattr(ctx, name) for name in self.kind.calls[method]}
        raise ValueError(f"unknown request {op!r}")

    def _share(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray) or value.nbytes > SHARED_BYTES:
            return value
        np.frombuffer(self.shared, dtype=value.dtype, count=value.size).reshape(value.shape)[...] = value
        return Shared(value.shape, value.dtype.str)


def _serve_interrupts(control: Connection, server: _Server) -> None:
    while True:
        try:
            ctx_id = control.recv()
        except (EOFError, OSError):
            return
        ctx = server.contexts.get(ctx_id)
        if ctx is not None:
            ctx.interrupt()


def main(argv: list[str]) -> int:
    calls, control = Connection(int(argv[0])), Connection(int(argv[1]))
    shared = mmap.mmap(int(argv[2]), SHARED_BYTES)
    kind, path, device, n_threads, log_level = calls.recv()
    from aural import _native as native

    from .. import cpu

    native.set_log_level(log_level)
    try:
        cpu.configure()  # the parent's level: it passes AURAL_CPU_VARIANT
        model, new_context = _load(native, kind, path, device, n_threads)
    except Exception as exc:  # the native load error, or a CPU level this process cannot run: the parent's to say
        calls.send(("err", type(exc).__name__, str(exc)))
        return 0
    calls.send(("ok", {name: getattr(model, name) for name in KINDS[kind].fields}))
    server = _Server(KINDS[kind], model, new_context, shared)
    threading.Thread(target=_serve_interrupts, args=(control, server), daemon=True).start()
    while True:
        try:
            frees, op, args = calls.recv()
        except (EOFError, OSError):
            return 0
        for ctx_id in frees:
            server.contexts.pop(ctx_id, None)
        try:
            reply = ("ok", server.handle(op, args))
        except Exception as exc:  # every failure goes back to the caller, who raises it there
            reply = ("err", type(exc).__name__, str(exc))
        calls.send(reply)


if __name__ == "__main__":
    from aural.engine.isolation import child  # as the module, so that Shared pickles under its own name

    sys.exit(child.main(sys.argv[1:]))
