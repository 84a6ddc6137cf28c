"""A native model in a process of its own, so that a device fault ends that process and not the app.

    model = RemoteModel(path, device="Vulkan0", n_threads=2)   # starts the device process; the native
    ctx = model.new_context(kv_mode="device", n_seq=1)         # error if it cannot load the weights there
    ctx.encode(mel); logits = ctx.decode(tokens, 0)            # what aural._native.Context does
    # the process dies (a driver's abort, VK_CHECK's exit(1), a segfault): DeviceProcessLost, a RuntimeError

ggml answers some device errors by ending the process: CUDA_CHECK calls GGML_ABORT, ggml-vulkan's VK_CHECK
calls exit(1), and a driver may segfault (Mesa's llvmpipe has, README "Known defects"). In process, that
ends the app and takes uncommitted work with it. Here it ends the device process; the caller sees a
RuntimeError and `runtime.FallbackSession` redoes the work on the CPU in process, as it does for errors that
reach Python.

`RemoteModel` and `RemoteContext` have the attributes and methods of the native Model and Context that the
engine uses, with the same arguments; `RemoteQwen3Model` and `RemoteQwen3Context` those of Qwen3Model (with its
audio tower's `encode_audio`) and Qwen3Context. Thread contract: calls from any threads are serialised, one at a
time, as the native context's are by its callers; `interrupt()` may come from any thread while a call runs
(it travels on a socket of its own). A call waits on a socket, so the GIL is free meanwhile.
"""

from __future__ import annotations

import builtins
import collections
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .child import SHARED_BYTES, Shared

__all__ = ["DeviceProcessLost", "RemoteContext", "RemoteModel", "RemoteQwen3Context", "RemoteQwen3Model"]

logger = logging.getLogger(__name__)

_STDERR_KEPT = 20  # last lines of the child's stderr kept for the reason it died
_EXIT_WAIT_S = 5.0  # for the exit status of a child whose socket closed


class DeviceProcessLost(RuntimeError):
    """The device process ended under a call: a device or driver fault that ggml answered by exiting."""


def _child_command() -> list[str]:
    if getattr(sys, "frozen", False):  # the PyInstaller bundle: its executable takes the flag
        return [sys.executable, "--device-process"]
    return [sys.executable, "-m", "aural.engine.isolation.child"]


def _raise_remote(name: str, message: str):
    from aural import _native

    if name in ("Interrupted", "ContextFullError"):  # the native module's own: callers catch them by type
        raise getattr(_native, name)(message)
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        raise kind(message)
    raise RuntimeError(f"{name}: {message}")


class _Process:
    """The child, its two sockets, the shared memory it leaves result arrays in and the reader of its
    stderr; `call` is one request and its answer."""

    def __init__(self, kind: str, path: str, device: str, n_threads: int):
        from aural import _native

        from .. import cpu

        calls, calls_child = socket.socketpair()
        control, control_child = socket.socketpair()
        arrays_fd = os.memfd_create("aural-device-arrays")  # results the child leaves there (child.Shared)
        os.ftruncate(arrays_fd, SHARED_BYTES)
        self._arrays = mmap.mmap(arrays_fd, SHARED_BYTES)
        fds = (calls_child.fileno(), control_child.fileno(), arrays_fd)
        # The child runs at the parent's CPU level, so its CPU kernels give the parent's bits.
        env = {**os.environ, cpu.VARIANT_ENV: cpu.configure().variant}
        try:
            # A session of its own: the terminal's Ctrl+C is the parent's to handle (by interrupting calls),
            # not a signal that would end the device process under the call and set off a fallback.
            self.proc = subprocess.Popen([*_child_command(), *map(str, fds)], pass_fds=fds, env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            calls.close()
            control.close()
            raise DeviceProcessLost(f"cannot start the device process: {exc}") from None
        finally:
            calls_child.close()
            control_child.close()
            os.close(arrays_fd)  # the mappings keep the memory
        self._calls = Connection(calls.detach())
        self._control = Connection(control.detach())
        self._lock = threading.Lock()  # one request at a time on the calls socket
        self._control_lock = threading.Lock()
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_KEPT)
        self._reader = threading.Thread(target=self._read_stderr, name="device-process-stderr", daemon=True)
        self._reader.start()
        self.lost: str | None = None  # why the process is gone, once it is
        self._frees: list[int] = []
        self._calls.send((kind, path, device, n_threads, _native.get_log_level()))
        try:
            self.first = self._answer()  # the model's fields, or the error loading it
        except BaseException:
            self.close()
            raise

    def _read_stderr(self) -> None:
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self._stderr.append(line)
            logger.debug("device process: %s", line)

    def _answer(self) -> Any:
        try:
            reply = self._calls.recv()
        except (EOFError, OSError):
            raise self._died()  # not `from`: runtime._reason reads __cause__, which would be the OSError
        if reply[0] == "err":
            _raise_remote(reply[1], reply[2])
        return reply[1]

    def _died(self) -> DeviceProcessLost:
        if self.lost is None:
            try:
                code = self.proc.wait(_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
            self._reader.join(1.0)
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            # GGML_ABORT and VK_CHECK print their reason last; a segfault prints nothing, so the line is
            # named for what it is, not as the cause.
            last = next((line for line in reversed(self._stderr) if line.strip()), "")
            self.lost = f"the device process ended ({how}" + (f"; its last log line: {last})" if last else ")")
            logger.info("%s", self.lost)  # the caller's fallback warns, once
        return DeviceProcessLost(self.lost)

    def call(self, op: str, *args: Any) -> Any:
        with self._lock:
            if self.lost is not None:
                raise DeviceProcessLost(self.lost)
            frees = []
            while self._frees:  # pop, not a swap: a finaliser on another thread may append meanwhile
                frees.append(self._frees.pop())
            try:
                self._calls.send((frees, op, args))
            except OSError:
                raise self._died()  # not `from`: runtime._reason reads __cause__, which would be the OSError
            answer = self._answer()
            # A result in the shared memory is copied out before the next call overwrites it.
            if op == "call" and isinstance(answer[0], Shared):
                answer = (self._copy_out(answer[0]), answer[1])
            elif op == "model" and isinstance(answer, Shared):
                answer = self._copy_out(answer)
            return answer

    def _copy_out(self, shared: Shared) -> np.ndarray:
        count = int(np.prod(shared.shape))
        return np.frombuffer(self._arrays, dtype=shared.dtype, count=count).reshape(shared.shape).copy()

    def interrupt(self, ctx_id: int) -> None:
        with self._control_lock:
            try:
                self._control.send(ctx_id)
            except OSError:  # gone already: the call it would stop has failed or will
                pass

    def free(self, ctx_id: int) -> None:
        self._frees.append(ctx_id)  # sent with the next request: a finaliser must not wait on the lock

    def close(self) -> None:
        self._calls.close()  # the child's recv sees EOF and returns
        self._control.close()
        try:
            self.proc.wait(_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def pid(self) -> int:
        return self.proc.pid


class RemoteModel:
    """The native Model's read-only fields, fetched once at load, and `new_context`."""

    _kind = "whisper"

    def __init__(self, path: str, *, device: str, n_threads: int = 0):
        self._process = _Process(self._kind, path, device, n_threads)
        self.__dict__.update(self._process.first)
        self._finalizer = weakref.finalize(self, self._process.close)

    @property
    def pid(self) -> int:
        """The device process's id (tests end it to play a driver fault)."""
        return self._process.pid

    @property
    def lost(self) -> str | None:
        """Why the device process is gone; None while it runs."""
        return self._process.lost

    def new_context(self, **params: Any) -> RemoteContext:
        return RemoteContext(self, self._process, self._process.call("new_context", params), params)

    def close(self) -> None:
        self._finalizer()


class RemoteContext:
    """A native Context in the device process: encode, decode, align, reorder, clear_kv and interrupt, and
    the attributes read after them (timings, stats, the backend report)."""

    def __init__(self, model: RemoteModel, process: _Process, ctx_id: int, params: dict):
        self._model = model  # keeps the process alive while the context is
        self._process = process
        self._id = ctx_id
        self.kv_mode = params.get("kv_mode", "device")
        self.graph_reuse = params.get("graph_reuse", True)
        self._interrupted = False
        self.last_timings: dict = {}
        self.last_encode: dict = {}
        self._last_read: dict[str, dict] = {}
        weakref.finalize(self, process.free, ctx_id)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._interrupted and method in ("encode", "decode", "align"):
            # The native flag is sticky; raising here also orders a call made after interrupt() behind it,
            # which the control socket's thread in the child might otherwise serve second.
            from aural import _native

            raise _native.Interrupted("interrupted")
        value, changed = self._process.call("call", self._id, method, args, kwargs)
        self.__dict__.update(changed)  # last_encode or last_timings (child.KINDS)
        return value

    def encode(self, mel) -> None:
        self._call("encode", mel)

    def decode(self, tokens, n_past: int, outputs=None, seq_ids=None):
        return self._call("decode", tokens, n_past, outputs=outputs, seq_ids=seq_ids)

    def align(self, tokens, heads):
        return self._call("align", tokens, heads)

    def reorder(self, parents) -> None:
        self._call("reorder", parents)

    def clear_kv(self) -> None:
        self._call("clear_kv")

    def interrupt(self) -> None:
        self._interrupted = True
        self._process.interrupt(self._id)

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    @property
    def stats(self) -> dict:
        return self._read("stats")

    @property
    def backend_report(self) -> dict:
        return self._read("backend_report")

    def _read(self, name: str) -> dict:
        # Read for the metrics panel between calls, outside the work that falls back when the process is
        # gone: once it is, the last values read stand until the next call fails and the work moves.
        try:
            self._last_read[name] = self._process.call("get", self._id, name)
        except DeviceProcessLost:
            if name not in self._last_read:
                raise
        return self._last_read[name]


class RemoteQwen3Model(RemoteModel):
    """A Qwen3-ASR model in a device process: the native Qwen3Model's fields, its audio tower (`encode_audio`)
    and `new_context`, which makes a Qwen3Context there."""

    _kind = "qwen3-asr"

    def audio_vectors(self, n_frames: int) -> int:
        return self._process.call("model", "audio_vectors", (n_frames,))

    def encode_audio(self, mel: np.ndarray) -> np.ndarray:
        """The tower's vectors (A, n_state) of a 128-bin log-mel (128, frames): Qwen3AudioEncoder.encode."""
        return self._process.call("model", "encode_audio", (mel,))

    def new_context(self, **params: Any) -> RemoteQwen3Context:
        return RemoteQwen3Context(self, self._process, self._process.call("new_context", params), params)


class RemoteQwen3Context:
    """A native Qwen3Context in the device process: decode, rewind and clear, n_past and the timings as they
    stand after the last call, and the attributes read between calls (stats, kv_bytes, ...)."""

    def __init__(self, model: RemoteQwen3Model, process: _Process, ctx_id: int, params: dict):
        self._model = model  # keeps the process alive while the context is
        self._process = process
        self._id = ctx_id
        self.kv_mode = params.get("kv_mode", "device")
        self.n_past = 0
        self.last_timings: dict = {}
        weakref.finalize(self, process.free, ctx_id)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        value, changed = self._process.call("call", self._id, method, args, kwargs)
        self.__dict__.update(changed)  # n_past, last_timings (child.KINDS)
        return value

    def decode(self, tokens, audio=None, all_logits: bool = False):
        return self._call("decode", tokens, audio=audio, all_logits=all_logits)

    def rewind(self, n_past: int) -> None:
        self._call("rewind", n_past)

    def clear(self) -> None:
        self._call("clear")

    @property
    def stats(self) -> dict:
        return self._process.call("get", self._id, "stats")

    @property
    def kv_bytes(self) -> int:
        return self._process.call("get", self._id, "kv_bytes")

    @property
    def compute_bytes(self) -> int:
        return self._process.call("get", self._id, "compute_bytes")

    @property
    def fallback_ops(self) -> list[str]:
        return self._process.call("get", self._id, "fallback_ops")
