"""Cancelling engine work that is inside a native call.

A plain `threading.Event` is checked between decoder steps, so a cancelled file still waits for the
window being encoded (0.3-1 s on two idle cores, many seconds on a loaded machine). A `StopEvent` is a
drop-in `threading.Event` that also interrupts the native context it guards: ggml's CPU backend
stops the graph before its next node (`Context.interrupt`), and the context raises
`aural._native.Interrupted` (a RuntimeError; `Context.interrupted` tells it from other failures).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["StopEvent", "interrupt_on_stop"]


class StopEvent(threading.Event):
    """A `threading.Event` whose `set()` also runs the hooks registered with `on_set`."""

    def __init__(self) -> None:
        super().__init__()
        # Re-entrant: `set()` may run in a signal handler on a thread that is registering a hook.
        self._lock = threading.RLock()
        self._hooks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        with self._lock:
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    @contextmanager
    def on_set(self, hook: Callable[[], None]) -> Iterator[None]:
        """Runs `hook` when the event is set while the block runs (at once if it is set already)."""
        with self._lock:
            self._hooks.append(hook)
        try:
            if self.is_set():
                hook()
            yield
        finally:
            with self._lock:
                self._hooks.remove(hook)


@contextmanager
def interrupt_on_stop(stop: threading.Event | None, ctx) -> Iterator[None]:
    """While the block runs, setting `stop` interrupts the native context `ctx` (a `StopEvent` only;
    other events are just polled by the caller)."""
    if isinstance(stop, StopEvent):
        with stop.on_set(ctx.interrupt):
            yield
    else:
        yield
