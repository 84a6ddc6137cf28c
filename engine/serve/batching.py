"""Continuous batching across streams: the decoder steps that sessions on different threads take at about
the same time go to the device as one graph (`aural._native.StreamBatch`).

    model.batcher = DecodeBatcher(model)     # sessions opened from now on are batched
    ctx = model.new_session(n_seq=5)         # a BatchedContext: Context's API, decode goes through the batcher

Every transcription and live stream keeps its own thread, decoding loop and native session (its KV arena and
window); only `decode` calls of a few tokens (a step: one token per beam) are gathered. A stream joins or
leaves between steps. The first thread to find a step ready runs everyone's pending steps in one call while
the others wait for their logits: a step waits for more company only while fewer streams are pending than
took part in the last shared step, and never longer than `wait_s`. Logits are the same numbers a session's
own call gives (the layers' int8 and f32 products sum each column alone; tests/test_serve.py checks it).

Thread contract: any number of threads may call `decode` at once, each with its own context.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BatchedContext", "DecodeBatcher"]

logger = logging.getLogger(__name__)

# How long a pending step waits for the other streams' (seconds): about one greedy step of tiny.en on two
# cores (1.2-1.5 ms), so a stream busy elsewhere (encoding, sampling) delays the others by at most that.
DEFAULT_WAIT_S = 0.0015


@dataclass
class _Step:
    ctx: Any  # the native Context
    args: tuple  # (tokens, n_past, outputs, seq_ids), as StreamBatch.decode takes them
    logits: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


class DecodeBatcher:
    """Gathers concurrent decoder steps of one model's sessions into shared native steps.

    Attributes:
        wait_s: the longest a step waits for other streams' steps.
        steps: shared steps run; stream_steps: the sessions' steps they held (stream_steps / steps is the
            mean batch).
    """

    def __init__(self, model, *, wait_s: float = DEFAULT_WAIT_S):
        from aural import _native

        self.native = _native.StreamBatch(model._model, n_threads=model.n_threads)
        self.max_tokens = int(_native.StreamBatch.max_tokens_per_context)
        self.max_streams = int(_native.StreamBatch.max_contexts)
        self.wait_s = wait_s
        self.steps = 0
        self.stream_steps = 0
        self._cond = threading.Condition()
        self._pending: list[_Step] = []
        self._running = False
        self._last_size = 1  # streams in the last shared step

    def for_model(self, model) -> "DecodeBatcher":
        """A batcher like this one for `model`'s weights now (after they moved to the CPU)."""
        return DecodeBatcher(model, wait_s=self.wait_s)

    def wrap(self, ctx) -> "BatchedContext":
        return BatchedContext(ctx, self)

    def decode(self, ctx, tokens, n_past: int, outputs=None, seq_ids=None) -> np.ndarray:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if tokens.size > self.max_tokens or ctx.kv_mode != "device":  # a prompt: its own graph
            return ctx.decode(tokens, n_past, outputs=outputs, seq_ids=seq_ids)
        step = _Step(ctx, (tokens, n_past, outputs, seq_ids))
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            self._pending.append(step)
            self._cond.notify_all()
            while not step.done:
                due = len(self._pending) >= self._last_size or time.monotonic() >= deadline
                if not self._running and self._pending and due:
                    self._run_pending()
                else:
                    self._cond.wait(max(0.0, deadline - time.monotonic()) or self.wait_s)
        if step.error is not None:
            raise step.error
        return step.logits

    def _run_pending(self) -> None:
        """Runs the pending steps (up to the native limit) as one; called and returns with the lock held."""
        batch, self._pending = self._pending[:self.max_streams], self._pending[self.max_streams:]
        self._running = True
        self._cond.release()
        try:
            self._decode(batch)
        finally:
            self._cond.acquire()
            self._running = False
            self._last_size = len(batch)
            self.steps += 1
            self.stream_steps += len(batch)
            for step in batch:
                step.done = True
            self._cond.notify_all()

    def _decode(self, batch: list[_Step]) -> None:
        try:
            results = self.native.decode(contexts=[s.ctx for s in batch], steps=[s.args for s in batch])
        except (ValueError, RuntimeError) as exc:
            # A step the shared call refused (it checks every step before any session changes) or a session
            # that was interrupted: each step alone, so each session gets its own answer. A failure after the
            # sessions' cells were placed (a device lost mid-compute) is every step's.
            if not isinstance(exc, ValueError) and not any(s.ctx.interrupted for s in batch):
                for s in batch:
                    s.error = exc
                return
            for s in batch:
                self._alone(s)
            return
        for s, logits in zip(batch, results):
            s.logits = logits

    @staticmethod
    def _alone(step: _Step) -> None:
        tokens, n_past, outputs, seq_ids = step.args
        try:
            step.logits = step.ctx.decode(tokens, n_past, outputs=outputs, seq_ids=seq_ids)
        except BaseException as exc:  # noqa: BLE001 - handed to the step's own thread, which raises it
            step.error = exc


class BatchedContext:
    """A native Context whose `decode` goes through a `DecodeBatcher`; everything else is the Context's."""

    def __init__(self, ctx, batcher: DecodeBatcher):
        self._ctx = ctx
        self._batcher = batcher

    def decode(self, tokens, n_past: int, outputs=None, seq_ids=None) -> np.ndarray:
        return self._batcher.decode(self._ctx, tokens, n_past, outputs=outputs, seq_ids=seq_ids)

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)
