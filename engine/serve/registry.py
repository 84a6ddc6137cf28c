"""The models a server runs, and how many transcriptions may run on them at once.

A request names its model by a name `aural models list` shows (packaged and installed, or pulled), by the
name of the model the server was started with, or as "whisper-1": the OpenAI API's one model name, which
clients send by default, stands for the server's default model. A client never names a path: files on the
server's disk are not the client's to open. Each model is loaded on its first request and then shared by
every request (`WhisperModel` is read-only; each transcription opens its own session on it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..runtime import WhisperModel

__all__ = ["OPENAI_MODEL", "Admission", "Busy", "ModelRegistry", "UnknownModel"]

logger = logging.getLogger(__name__)

# The model name OpenAI's API documents for transcription; clients written for it send this.
OPENAI_MODEL = "whisper-1"


class UnknownModel(LookupError):
    """A model name the server does not have (HTTP 404)."""


class Busy(RuntimeError):
    """Every stream slot is taken and the queue is full (HTTP 429, or WebSocket close 1013)."""


def installed_model_names() -> list[str]:
    """Names a client may ask for: packaged models whose packages are installed, then pulled ones."""
    from ..models.store import catalog_models, list_models

    names = [entry.name for entry in list_models() if entry.installed]
    names += [row.name for row in catalog_models() if (row.downloaded or row.cached) and row.name not in names]
    return names


class ModelRegistry:
    """Loads each model once, on first use, and hands the same `WhisperModel` to every request.

    Attributes:
        default: the model "whisper-1" and an empty model field stand for: a name or a path, as `-m` takes.
    """

    def __init__(self, default: str | None, load: Callable[[str | None], WhisperModel],
                 names: Callable[[], list[str]] = installed_model_names):
        self.default = default
        self._load = load
        self._names = names
        self._models: dict[str | None, WhisperModel] = {}
        self._loading = threading.Lock()  # one load at a time: a conversion writes the cache

    @property
    def default_name(self) -> str:
        """What the default model is listed as: its registry name, or for a path the name it carries."""
        from ..models.store import DEFAULT_MODEL

        if self.default is None:
            return DEFAULT_MODEL
        loaded = self._models.get(None)
        return loaded.name if loaded is not None and self.default not in self._names() else self.default

    def names(self) -> list[str]:
        """Every model a request may name, the default first."""
        default = self.default_name
        return [default, *(name for name in self._names() if name != default)]

    def loaded(self) -> list[WhisperModel]:
        return list(self._models.values())

    def loaded_names(self) -> list[str]:
        return [self.default_name if key is None else key for key in self._models]

    def key(self, requested: str | None) -> str | None:
        """The registry key of a requested name: None for the default; UnknownModel if not served."""
        if requested in (None, "", OPENAI_MODEL, self.default, self.default_name):
            return None
        if requested not in self._names():
            raise UnknownModel(f"The model '{requested}' does not exist here; GET /v1/models lists the models "
                               f"this server has (or send '{OPENAI_MODEL}' for its default).")
        return requested

    def get(self, requested: str | None) -> WhisperModel:
        """The loaded model (loading it first; blocking: call it off the event loop)."""
        key = self.key(requested)
        with self._loading:
            model = self._models.get(key)
            if model is None:
                model = self._load(self.default if key is None else key)
                self._models[key] = model
                logger.info("serving %s (%s on %s)", model.name, model.backend, model.device)
            return model


@dataclass
class _Counts:
    active: int = 0
    waiting: int = 0


class Admission:
    """At most `max_streams` transcriptions and live streams run at once; up to `max_queue` more requests
    wait for a slot, and beyond that a request is refused at once (`Busy`) rather than left hanging.

    All methods run on the event loop's thread.
    """

    def __init__(self, max_streams: int, max_queue: int):
        if max_streams < 1 or max_queue < 0:
            raise ValueError(f"need max_streams >= 1 and max_queue >= 0, got {max_streams}, {max_queue}")
        self.max_streams = max_streams
        self.max_queue = max_queue
        self.counts = _Counts()
        self._free = asyncio.Condition()

    async def enter(self) -> None:
        """Takes a slot, waiting in the queue; raises Busy when the queue is full."""
        async with self._free:
            if self.counts.active < self.max_streams:
                self.counts.active += 1
                return
            if self.counts.waiting >= self.max_queue:
                raise Busy(f"the server is busy: {self.counts.active} streams are running and "
                           f"{self.counts.waiting} requests are waiting (--max-streams {self.max_streams})")
            self.counts.waiting += 1
            try:
                await self._free.wait_for(lambda: self.counts.active < self.max_streams)
            finally:
                self.counts.waiting -= 1
            self.counts.active += 1

    async def leave(self) -> None:
        async with self._free:
            self.counts.active -= 1
            self._free.notify()
