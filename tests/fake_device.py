"""A GPU for the fallback tests on machines without one: "Vulkan0", whose weights and compute are the CPU's
own (the real tiny.en, the real results) and whose failures are the native layer's own exceptions, raised
on cue: a backend that cannot initialise, a session that does not fit, a device lost mid-stream.

    gpu = FakeGpu(lost_at=("encode", 2))  # lost while the second window is being encoded
    gpu.install(monkeypatch)         # aural.engine.runtime now lists it, loads onto it and runs on it

Only `runtime._native`, the engine's one way to the native module, is replaced: everything above it (the
fallback policy, transcription, streaming, the app's workers) runs as it does on a real device. Faults
could not be injected lower down: the native layer has no switch for them, and ggml's CPU backend, the
only one here, does not fail.
"""

from __future__ import annotations

from aural.engine import runtime

NAME, BACKEND = "Vulkan0", "Vulkan"
# What native/context.cpp raises (std::runtime_error, a RuntimeError in Python) for each failure.
INIT_FAILURE = f"cannot initialise backend {NAME}"
RESERVE_FAILURE = "cannot reserve the decoder's compute buffer (out of device memory?)"
COMPUTE_FAILURE = "graph compute failed: GGML status: error (operation failed)"
GIB = 2**30


class FakeGpu:
    """The device and its faults.

    Attributes:
        fails_to_initialise: every session on it fails to open, as a backend without a working driver does.
        max_sequences: sessions decoding more sequences side by side (beams) find no room for their buffers.
        lost_at: (method, n): the device is lost at the n-th call of the sessions' `method` ("encode",
            "decode", "align"; counted from 1 over every session on it), and from then on every call fails.
        calls: calls of each method so far.
        lost: whether it has been lost.
    """

    def __init__(self, *, fails_to_initialise: bool = False, max_sequences: int = 8,
                 lost_at: tuple[str, int] | None = None):
        self.fails_to_initialise = fails_to_initialise
        self.max_sequences = max_sequences
        self.lost_at = lost_at
        self.calls: dict[str, int] = {}
        self.lost = False

    def install(self, monkeypatch) -> None:
        native = _Native(runtime._native(), self)
        monkeypatch.setattr(runtime, "_native", lambda: native)
        # A device process would load the real native module, which has no Vulkan0: this GPU lives in process.
        monkeypatch.setenv(runtime.NO_ISOLATION_ENV, "1")

    def props(self) -> dict:
        """What `_native.devices()` says of it: a software Vulkan device, which auto passes over."""
        return {"name": NAME, "description": "llvmpipe (the CPU under a fake GPU)", "backend": BACKEND, "type": "gpu",
                "software": True, "memory_free": int(1.5 * GIB), "memory_total": 2 * GIB}

    def open(self, ctx, n_seq: int) -> _Context:
        if self.fails_to_initialise:
            raise RuntimeError(INIT_FAILURE)
        if n_seq > self.max_sequences:
            raise RuntimeError(RESERVE_FAILURE)
        return _Context(ctx, self)

    def call(self, method: str) -> None:
        """Counts a call of a session's `method`, which fails if the device is lost by now."""
        self.calls[method] = self.calls.get(method, 0) + 1
        self.lost = self.lost or self.lost_at == (method, self.calls[method])
        if self.lost:
            raise RuntimeError(COMPUTE_FAILURE)


def _names_it(want: str) -> bool:
    return want.lower() in (NAME.lower(), BACKEND.lower())


class _Native:
    """`aural._native` with the fake device among its devices."""

    def __init__(self, real, gpu: FakeGpu):
        self._real = real
        self._gpu = gpu

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def devices(self) -> list[dict]:
        return [*self._real.devices(), self._gpu.props()]

    def select_device(self, want: str = "auto") -> str:
        return NAME if _names_it(want) else self._real.select_device(want)

    def Model(self, path: str, *, device: str = "auto", n_threads: int = 0):  # noqa: N802 - the native class's name
        if _names_it(device):
            return _Model(self._real.Model(path, device="cpu", n_threads=n_threads))
        return self._real.Model(path, device=device, n_threads=n_threads)

    def Context(self, model, **session):  # noqa: N802 - the native class's name
        if isinstance(model, _Model):
            return self._gpu.open(self._real.Context(model.weights, **session), session.get("n_seq", 1))
        return self._real.Context(model, **session)


class _Model:
    """CPU weights that say they are on the fake device."""

    device, backend = NAME, BACKEND

    def __init__(self, weights):
        self.weights = weights

    def __getattr__(self, name: str):
        return getattr(self.weights, name)


class _Context:
    """A CPU session whose calls fail once the fake device is lost."""

    def __init__(self, ctx, gpu: FakeGpu):
        self._ctx = ctx
        self._gpu = gpu

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def encode(self, mel):
        self._gpu.call("encode")
        return self._ctx.encode(mel)

    def decode(self, *args, **kwargs):
        self._gpu.call("decode")
        return self._ctx.decode(*args, **kwargs)

    def align(self, *args, **kwargs):
        self._gpu.call("align")
        return self._ctx.align(*args, **kwargs)

    def reorder(self, *args, **kwargs):
        self._gpu.call("reorder")
        return self._ctx.reorder(*args, **kwargs)
