"""Live captions over a WebSocket: `/v1/audio/live`.

The client sends binary frames of 16 kHz mono 16-bit little-endian PCM, of any length, and a text frame
`{"type": "stop"}` (or simply closes) when its audio ends. The server answers with text frames of JSON: first
`{"type": "ready", "model": ..., "sample_rate": 16000}` once a stream slot is free and the model is loaded (a
stream waits in the server's queue like an upload; with the queue full it is refused, 1013), then the events
of `aural live --json` (`partial`, `commit`, `metrics`, `error`, `fallback`), and closes with 1000 after the
last `metrics` of a stopped stream. Options ride in the query string: `model`, `language`, and `aural live`'s
caption flags by the same names (`step`, `hold`, `policy`, `frames`, `commit_after`, `pause_step`).

A client that sends faster than real time is slowed by the socket (its frames wait until the engine has room),
never dropped. One that disconnects stops its stream within a step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from concurrent.futures import Executor

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ..audio import SAMPLE_RATE
from ..errors import AuralError
from ..live.capture import PushSource
from ..live.streaming import FLAG_FIELDS, Error, Metrics, StreamOptions, event_dict, flagged_options
from ..qwen3asr.streaming import any_live_events
from ..text.tokenizer import normalize_language
from .registry import Admission, Busy, ModelRegistry, UnknownModel
from .telemetry import ServerMetrics

__all__ = ["refuse", "serve_stream", "stream_options"]

logger = logging.getLogger(__name__)

# Audio the server holds for a stream before the client's frames wait, seconds.
_BUFFER_S = 30.0
# While the buffer is full, how often the reader looks for room, seconds.
_ROOM_POLL_S = 0.02
_END = object()  # the producer thread is done
# WebSocket close codes (RFC 6455 7.4.1; 1013 "try again later" from the IANA registry).
_NORMAL, _POLICY, _ERROR, _TRY_LATER = 1000, 1008, 1011, 1013
# Query strings to the StreamOptions field types (their annotations are strings: `from __future__ import
# annotations`).
_PARSERS = {"float": float, "int": int, "str": str, "bool": lambda v: v.lower() in ("1", "true", "yes")}
_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(StreamOptions)}


def stream_options(query) -> StreamOptions:
    """StreamOptions from the query string (`aural live`'s flags, FLAG_FIELDS); ValueError names what is wrong."""
    given = {}
    for flag, field in FLAG_FIELDS.items():
        if flag in query:
            try:
                given[flag] = _PARSERS[_FIELD_TYPES[field]](query[flag])
            except ValueError:
                raise ValueError(f"{flag}: not a number: {query[flag]!r}") from None
    return flagged_options(given, language=normalize_language(query.get("language")))


async def serve_stream(ws: WebSocket, registry: ModelRegistry, admission: Admission, metrics: ServerMetrics,
                       executor: Executor) -> None:
    """Runs one live stream from handshake to close (the socket's key has been checked)."""
    await ws.accept()
    status = "200"
    try:
        options = stream_options(ws.query_params)
        await run_in_threadpool(registry.key, ws.query_params.get("model"))
        await admission.enter()  # in the queue like an upload: the client sends once it reads "ready"
    except (ValueError, UnknownModel, Busy) as exc:
        status = {ValueError: "400", UnknownModel: "404", Busy: "429"}[type(exc)]
        await refuse(ws, str(exc), _TRY_LATER if isinstance(exc, Busy) else _POLICY)
        metrics.requests.labels("live", status).inc()
        return
    try:
        status = await _stream(ws, registry, options, metrics, executor)
    finally:
        await admission.leave()
        metrics.requests.labels("live", status).inc()


async def refuse(ws: WebSocket, message: str, code: int = _POLICY) -> None:
    """Says why in an error event, then closes with `code` (accepting the handshake first if need be)."""
    if ws.client_state == WebSocketState.CONNECTING:
        await ws.accept()
    await _send(ws, event_dict(Error(message)))
    await _close(ws, code)


async def _stream(ws: WebSocket, registry: ModelRegistry, options: StreamOptions, metrics: ServerMetrics,
                  executor: Executor) -> str:
    loop = asyncio.get_running_loop()
    try:
        model = await loop.run_in_executor(executor, registry.get, ws.query_params.get("model"))
    except AuralError as exc:
        await refuse(ws, str(exc), _ERROR)
        return "500"
    if not await _send(ws, {"type": "ready", "model": model.name, "sample_rate": SAMPLE_RATE}):
        return "499"  # the client left while it waited
    source, stop, events = PushSource(buffer_s=_BUFFER_S), threading.Event(), asyncio.Queue()

    def produce() -> None:
        from aural import _native

        try:
            for event in any_live_events(model, source, options, stop=stop):
                loop.call_soon_threadsafe(events.put_nowait, event)
        except _native.ContextFullError as exc:  # the streams' shared KV pool (--kv-pool-mb) has no free block
            full = Error(f"{exc}: the server is at its KV memory limit; retry later (aural serve --kv-pool-mb)")
            loop.call_soon_threadsafe(events.put_nowait, full)
        finally:
            loop.call_soon_threadsafe(events.put_nowait, _END)

    producer = loop.run_in_executor(executor, produce)
    reader = asyncio.create_task(_read_audio(ws, source, stop))
    key, counted_s = id(source), 0.0
    try:
        while (event := await events.get()) is not _END:
            if isinstance(event, Metrics):
                metrics.live_kv[key] = (event.kv_tokens, round(event.kv_held_mib * 2**20))
                metrics.audio_seconds.labels("live").inc(max(0.0, event.audio_s - counted_s))
                counted_s = max(counted_s, event.audio_s)
            if not await _send(ws, event_dict(event)):
                stop.set()
        await _close(ws, _NORMAL)
        return "499" if stop.is_set() else "200"  # stop is set only when the client went away
    finally:
        stop.set()
        source.end()
        reader.cancel()
        await producer
        metrics.live_kv.pop(key, None)


async def _read_audio(ws: WebSocket, source: PushSource, stop: threading.Event) -> None:
    """Moves the client's PCM into the source until it stops or goes away."""
    leftover = b""
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                stop.set()  # nobody is left to read the captions
                return
            if message.get("bytes") is not None:
                data = leftover + message["bytes"]
                whole = len(data) - len(data) % 2
                leftover = data[whole:]
                await _push(source, np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0)
            elif _is_stop(message.get("text")):
                return
    except WebSocketDisconnect:
        stop.set()
    finally:
        source.end()


def _is_stop(text: str | None) -> bool:
    try:
        return json.loads(text or "").get("type") == "stop"
    except (ValueError, AttributeError):
        return False


async def _push(source: PushSource, samples: np.ndarray) -> None:
    block = round(_BUFFER_S * SAMPLE_RATE) // 4
    for start in range(0, samples.size, block):
        while not source.push(samples[start:start + block]):
            await asyncio.sleep(_ROOM_POLL_S)


async def _send(ws: WebSocket, message: dict) -> bool:
    """False when the client has gone."""
    if ws.client_state != WebSocketState.CONNECTED:
        return False
    try:
        await ws.send_json(message)
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False
    return True


async def _close(ws: WebSocket, code: int) -> None:
    if ws.client_state == WebSocketState.CONNECTED:
        try:
            await ws.close(code=code)
        except (RuntimeError, OSError):
            pass
