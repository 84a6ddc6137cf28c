"""The device process: one native Model and its Contexts, served to the parent over two sockets.

    python -m aural.engine.isolation.child CALLS_FD CONTROL_FD ARRAYS_FD   # started by aural.engine.isolation

Requests on CALLS_FD are (frees, op, args) tuples answered in order, one at a time: ("ok", value) or
("err", exception class name, message). A result array of up to SHARED_BYTES (a decoder step's logits) is
left in the shared memory ARRAYS_FD maps, and the value says only its shape (`Shared`): through the socket,
5 beams' 1 MB of logits cost 1.02 ms per step over the in-process call, through the shared memory 0.71
(tiny.en on the CPU, a 2-core Sapphire Rapids-class VM, 5 interleaved rounds of 100 steps, 2026-12-03).

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

# Context attributes the parent reads, and methods it calls; after each method the timings it changes travel
# back with its result, so the decoder loop needs no second round trip for them (and the parent keeps them).
_READABLE = {"interrupted", "stats", "backend_report"}
_CALLS = {"encode": "last_encode", "decode": "last_timings", "align": "last_timings", "reorder": None,
          "clear_kv": None}
# 8 sequences' float32 logits for a vocabulary of up to 131 072 tokens (Whisper's is 51 865).
SHARED_BYTES = 4 << 20


@dataclass(frozen=True)
class Shared:
    """A result array left at the start of the shared memory: its shape and numpy dtype string."""

    shape: tuple[int, ...]
    dtype: str


MODEL_FIELDS = ("hparams", "device", "backend", "device_info", "n_threads", "weights_bytes", "weight_buffers",
                "widened_bytes", "simd_gelu", "simd_attention", "simd_cross", "simd_self", "int8", "int8_bytes",
                "screen_bytes", "path")


class _Server:
    def __init__(self, native: Any, model: Any, shared: mmap.mmap):
        self.native = native
        self.model = model
        self.shared = shared
        self.contexts: dict[int, Any] = {}
        self.next_id = 0

    def handle(self, op: str, args: tuple) -> Any:
        if op == "new_context":
            ctx = self.native.Context(self.model, **args[0])
            self.next_id += 1
            self.contexts[self.next_id] = ctx
            return self.next_id
        ctx = self.contexts[args[0]]
        if op == "get":
            if args[1] not in _READABLE:
                raise AttributeError(args[1])
            return getattr(ctx, args[1])
        if op == "call":
            method, call_args, kwargs = args[1], args[2], args[3]
            if method not in _CALLS:
                raise AttributeError(method)
            value = getattr(ctx, method)(*call_args, **kwargs)
            timings = _CALLS[method]
            return self._share(value), (getattr(ctx, timings) if timings else None)
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
    path, device, n_threads, log_level = calls.recv()
    from aural import _native as native

    from .. import cpu

    native.set_log_level(log_level)
    try:
        cpu.configure()  # the parent's level: it passes AURAL_CPU_VARIANT
        model = native.Model(path, device=device, n_threads=n_threads)
    except Exception as exc:  # the native load error, or a CPU level this process cannot run: the parent's to say
        calls.send(("err", type(exc).__name__, str(exc)))
        return 0
    calls.send(("ok", {name: getattr(model, name) for name in MODEL_FIELDS}))
    server = _Server(native, model, shared)
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
