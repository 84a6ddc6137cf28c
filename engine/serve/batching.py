"""Continuous batching across streams: the decoder steps that sessions on different threads take at about
the same time go to the device as one graph (`aural._native.StreamBatch` for Whisper, `Qwen3StreamBatch` for
Qwen3-ASR).

    model.batcher = DecodeBatcher(model)     # sessions opened from now on are batched
    ctx = model.new_session(n_seq=5)         # a BatchedContext: Context's API, decode goes through the batcher
    ctx = qwen3_model.new_context(n_ctx=n)   # the same for a Qwen3AsrModel's contexts

Every transcription and live stream keeps its own thread, decoding loop and native session (its KV arena and
window); only `decode` calls of a few tokens (a step: one token per beam) are gathered. A stream joins or
leaves between steps. The first thread to find a step ready runs everyone's pending steps in one call while
the others wait for their logits: a step waits for more company only while fewer streams are pending than
took part in the last two shared steps, and never longer than `wait_s` after it arrived or the last shared
step ended, whichever is later. (Counted from its arrival alone, the wait of a step that came during a long
shared step ran out before that step's streams were back, and the streams split into two halves that took
turns: 8 Qwen3 streams stepped in graphs of 4.) Whisper's logits are the same numbers a session's own call
gives (the layers' int8 and f32 products sum each column alone; tests/test_serve.py checks it); Qwen3-ASR's
differ by the summation order of its batched f32/f16/q8_0 products alone (tests/test_qwen3_stream_batch.py
bounds them).

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


@dataclass
class _Step:
    ctx: Any  # the native Context or Qwen3Context
    args: tuple  # its decode's arguments: (tokens, n_past, outputs, seq_ids) for Whisper, (tokens,) for Qwen3
    logits: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


class _Steps:
    """One model kind's shared native call (`batch_type` over the model's native weights) and its limits."""

    def __init__(self, batch_type, weights, n_threads: int):
        self.native = batch_type(weights, n_threads=n_threads)
        self.max_tokens = int(batch_type.max_tokens_per_context)
        self.max_streams = int(batch_type.max_contexts)


class _WhisperSteps(_Steps):
    """Whisper sessions' steps: `Context.decode(tokens, n_past, outputs=None, seq_ids=None)`, one token a beam."""

    # How long a pending step waits for the other streams' (seconds): about one greedy step of tiny.en on two
    # cores (1.2-1.5 ms), so a stream busy elsewhere (encoding, sampling) delays the others by at most that.
    wait_s = 0.0015

    def __init__(self, model):
        from aural import _native

        super().__init__(_native.StreamBatch, model._model, model.n_threads)

    def step_args(self, ctx, tokens: np.ndarray, args: tuple, kwargs: dict) -> tuple | None:
        """The step's arguments as the shared call takes them, or None where it runs in a graph of its own."""
        if tokens.size > self.max_tokens or ctx.kv_mode != "device":  # a prompt, or the host baseline
            return None
        return _whisper_args(tokens, *args, **kwargs)

    def decode(self, batch: list[_Step]) -> list[np.ndarray]:
        return self.native.decode(contexts=[s.ctx for s in batch], steps=[s.args for s in batch])


def _whisper_args(tokens, n_past: int, outputs=None, seq_ids=None) -> tuple:
    return (tokens, n_past, outputs, seq_ids)


class _Qwen3Steps(_Steps):
    """Qwen3-ASR sessions' steps: `Qwen3Context.decode(tokens)`, with no audio, the last token's logits."""

    # What 8 streams' greedy choices over 151 936 logits take one after another under the GIL (1-2 ms each,
    # argmax and the float64 log-probability), so that their next steps meet: at 6 ms, 8 streams stepped in
    # graphs of 4.3-5.3 on average, at 20 ms of 7.1 (the Zen 3, q8_0 0.6B shape). A third of the 60 ms step
    # of one stream alone; a stream that stays away (encoding its next chunk) drops out of the expected count
    # after two shared steps, so it costs the others two such waits.
    wait_s = 0.020

    def __init__(self, model):
        from aural import _native

        super().__init__(_native.Qwen3StreamBatch, model.native, model.n_threads)

    def step_args(self, ctx, tokens: np.ndarray, args: tuple, kwargs: dict) -> tuple | None:
        if args or kwargs.get("audio") is not None or kwargs.get("all_logits"):  # a prompt with its audio
            return None
        if tokens.size > self.max_tokens or ctx.kv_mode != "device":
            return None
        return (tokens,)

    def decode(self, batch: list[_Step]) -> list[np.ndarray]:
        return self.native.decode(contexts=[s.ctx for s in batch], tokens=[s.args[0] for s in batch])


def _steps_for(model) -> _WhisperSteps | _Qwen3Steps:
    from ..qwen3asr.model import Qwen3AsrModel

    return _Qwen3Steps(model) if isinstance(model, Qwen3AsrModel) else _WhisperSteps(model)


class DecodeBatcher:
    """Gathers concurrent decoder steps of one model's sessions into shared native steps.

    Attributes:
        wait_s: the longest a step waits for other streams' steps.
        steps: shared steps run; stream_steps: the sessions' steps they held (stream_steps / steps is the
            mean batch).
    """

    def __init__(self, model, *, wait_s: float | None = None):
        self._steps = _steps_for(model)
        self.max_streams = self._steps.max_streams
        self.wait_s = self._steps.wait_s if wait_s is None else wait_s
        self.steps = 0
        self.stream_steps = 0
        self._cond = threading.Condition()
        self._pending: list[_Step] = []
        self._running = False
        self._recent: tuple[set[int], set[int]] = (set(), set())  # the contexts of the last two shared steps
        self._last_end = 0.0  # time.monotonic() at the end of the last shared step

    def for_model(self, model) -> "DecodeBatcher":
        """A batcher like this one for `model`'s weights now (after they moved to the CPU)."""
        return DecodeBatcher(model, wait_s=self.wait_s)

    def wrap(self, ctx) -> "BatchedContext":
        return BatchedContext(ctx, self)

    def decode(self, ctx, tokens, *args, **kwargs) -> np.ndarray:
        """ctx.decode(tokens, *args, **kwargs), in a shared step where it is one."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        shared = self._steps.step_args(ctx, tokens, args, kwargs)
        if shared is None:
            return ctx.decode(tokens, *args, **kwargs)
        step = _Step(ctx, shared)
        arrived = time.monotonic()
        with self._cond:
            self._pending.append(step)
            self._cond.notify_all()
            while not step.done:
                # A step waits from its arrival or the end of the last shared step, whichever is later: one that
                # came during a shared step waits for the streams of that step to come back.
                deadline = max(arrived, self._last_end) + self.wait_s
                due = len(self._pending) >= self._expected() or time.monotonic() >= deadline
                if not self._running and self._pending and due:
                    self._run_pending()
                else:
                    self._cond.wait(max(0.0, deadline - time.monotonic()) or self.wait_s)
        if step.error is not None:
            raise step.error
        return step.logits

    def _expected(self) -> int:
        """How many streams' steps make a full shared step: those of the last two steps, at least one."""
        return max(1, min(self.max_streams, len(self._recent[0] | self._recent[1])))

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
            self._recent = (self._recent[1], {id(step.ctx) for step in batch})
            self._last_end = time.monotonic()
            self.steps += 1
            self.stream_steps += len(batch)
            for step in batch:
                step.done = True
            self._cond.notify_all()

    def _decode(self, batch: list[_Step]) -> None:
        try:
            results = self._steps.decode(batch)
        except (ValueError, RuntimeError) as exc:
            # A step the shared call refused (it checks every step before any session changes) or a session
            # that was interrupted: each step alone, so each session gets its own answer. A failure after the
            # sessions' cells were placed (a device lost mid-compute) is every step's.
            if not isinstance(exc, ValueError) and not any(getattr(s.ctx, "interrupted", False) for s in batch):
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
        try:
            step.logits = step.ctx.decode(*step.args)
        except BaseException as exc:  # noqa: BLE001 - handed to the step's own thread, which raises it
            step.error = exc


class BatchedContext:
    """A native Context or Qwen3Context whose `decode` goes through a `DecodeBatcher`; everything else is the
    context's."""

    def __init__(self, ctx, batcher: DecodeBatcher):
        self._ctx = ctx
        self._batcher = batcher

    def decode(self, tokens, *args, **kwargs) -> np.ndarray:
        return self._batcher.decode(self._ctx, tokens, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)
