"""The server's routes: OpenAI's audio API on Aural's engine, a WebSocket for live audio, health and metrics.

    app = create_app(ServeConfig(model="tiny.en", max_streams=2))
    uvicorn.run(app, host="127.0.0.1", port=8765)      # what `aural serve` does

Thread contract: routes run on the event loop and never call the engine there. Each transcription and
live stream runs on a thread of the server's own pool (one per stream slot), with its own native session
on the shared model; the loop only parses, queues, and sends what the threads produce. A client that goes
away stops its work within one decoder step (`cancel.StopEvent`), and frees its slot.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, File, Form, Request, UploadFile, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from .. import __version__
from ..audio import load_audio, probe
from ..cancel import StopEvent
from ..errors import AudioError, AuralError
from ..runtime import WhisperModel
from ..speakers import Diarizer, assign_speakers
from ..speakers.weights import installed as speaker_models_installed
from ..text.chinese import default_script, localize_transcription
from ..text.tokenizer import normalize_language
from ..transcribe import TranscribeOptions, transcribe
from . import live
from .batching import DecodeBatcher
from .registry import OPENAI_MODEL, Admission, Busy, ModelRegistry, UnknownModel
from .responses import FORMATS, GRANULARITIES, Finished, media_type, render, speaker_letter
from .telemetry import CONTENT_TYPE_LATEST, ServerMetrics

__all__ = ["ServeConfig", "create_app"]

logger = logging.getLogger(__name__)

_MIB = 1 << 20
# How often a running request checks that its client is still there, seconds.
_DISCONNECT_POLL_S = 0.5
# openai-whisper's temperature schedule steps by 0.2 (transcribe.py's --temperature_increment_on_fallback).
_TEMPERATURE_STEP = 0.2


@dataclass(frozen=True)
class ServeConfig:
    """What `aural serve` was started with.

    Attributes:
        model: the default model ("whisper-1" and requests without a model use it): a name or a path, as `-m`
            takes; None: the bundled tiny.en.
        device: the ggml device the models load on ("auto": the backend policy's pick).
        n_threads: CPU threads of each stream's session (0: the native default's threads shared among the
            `max_streams` streams, at least 1: on 2 cores two streams of one thread answered 1.45x the audio
            per second of one stream of two, bench/results/serve.md).
        api_key: when set, every /v1 request must carry `Authorization: Bearer <key>` (a WebSocket may
            instead pass `?api_key=<key>`, as browsers cannot set its headers).
        max_streams: transcriptions and live streams that run at once.
        max_queue: requests that may wait for a slot; more are refused with 429.
        max_upload_mib: largest request body, MiB (413 beyond it). 2 hours of 16 kHz 16-bit WAV is 220 MiB.
        max_audio_s: longest audio a request may hold, seconds (413 beyond it).
        beam_size: beam width of file transcriptions (as the CLI's --beam-size; 1: greedy).
        batch: decode the steps that concurrent streams take together in one graph (`batching`); None (the
            default) does so for Qwen3-ASR models and not for Whisper's. Whisper: on the 2-core Zen 4 it
            answered 0.9x the audio per second at 2 to 16 clients with a thread per stream, and the same with
            two (bench/results/serve-default.md, serve.md), since the shared products are a small part of a
            request there. Qwen3-ASR, whose 0.6B decoder is nearly all of a request's work: 0.9-1.1x at 1 to 3
            streams, 1.2-2.5x the tokens per second at 4 to 16 (bench/results/qwen3-batch-zen3.md). A GPU,
            where one graph per step is what costs, is where it is meant to pay most, but models in a device
            process (`isolation`, every GPU by default) decode each stream alone so far.
        kv_pool_mib: the streams' decoder self-attention K/V share one pool of this many MiB per model
            (`WhisperModel.use_kv_pool`): memory follows the text the streams hold instead of each stream's
            worst case; a stream that finds it full fails with 503. None (the default): the pool holds what the
            own arenas of `max_streams` + 1 sessions of 8 sequences would (a live stream may ask for 8 beams;
            +1: a stream that reopens its session for whole windows holds two for a moment), so it is never
            full where they would have had room, and on the CPU only the blocks taken are resident. 0: each
            stream its own arena.
    """

    model: str | None = None
    device: str = "auto"
    n_threads: int = 0
    api_key: str | None = None
    max_streams: int = 2
    max_queue: int = 16
    max_upload_mib: int = 1024
    max_audio_s: float = 4 * 3600.0
    beam_size: int = 5
    batch: bool | None = None
    kv_pool_mib: float | None = None


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


@dataclass
class _State:
    config: ServeConfig
    registry: ModelRegistry
    admission: Admission
    metrics: ServerMetrics
    executor: ThreadPoolExecutor
    started: float


def create_app(config: ServeConfig, *, load: Callable[[str | None], WhisperModel] | None = None) -> FastAPI:
    """The ASGI app. `load(spec)` loads a model (default: runtime.load_model on the config's device)."""
    registry = ModelRegistry(config.model, load or _loader(config))
    admission = Admission(config.max_streams, config.max_queue)
    state = _State(config, registry, admission, ServerMetrics(admission, registry),
                   ThreadPoolExecutor(max_workers=config.max_streams, thread_name_prefix="aural-serve"),
                   time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        state.executor.shutdown(wait=True, cancel_futures=True)

    app = FastAPI(title="Aural", version=__version__, lifespan=lifespan, max_body_size=config.max_upload_mib * _MIB)
    app.state.aural = state
    _add_error_handlers(app)
    _add_routes(app, state)
    return app


def _loader(config: ServeConfig) -> Callable[[str | None], WhisperModel]:
    def load(spec: str | None) -> WhisperModel:
        from ..models.store import resolve_model
        from ..runtime import load_any_model

        model = load_any_model(resolve_model(spec), device=config.device, n_threads=_threads(config))
        qwen3 = not isinstance(model, WhisperModel)
        if (config.batch or (config.batch is None and qwen3)) and not model.isolated:
            model.batcher = DecodeBatcher(model)
        # Qwen3-ASR's contexts keep their own arenas: the pool holds Whisper's K/V rows.
        if not qwen3 and config.kv_pool_mib != 0 and not model.isolated:
            model.use_kv_pool(config.kv_pool_mib, sessions=config.max_streams + 1)
        return model

    return load


def _threads(config: ServeConfig) -> int:
    if config.n_threads > 0:
        return config.n_threads
    from aural import _native

    return max(1, _native.default_threads() // config.max_streams)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = str(first.get("loc", ("", ""))[-1]) or None
        return ApiError(400, f"{param}: {first.get('msg', 'invalid request')}", param=param).response()

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail)).response()


def _authorize(state: _State) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        if state.config.api_key and not _key_matches(state.config.api_key, _bearer(request.headers)):
            raise ApiError(401, "Incorrect API key provided: send 'Authorization: Bearer <key>' with the key "
                                "`aural serve --api-key` was given.", code="invalid_api_key")
    return check


def _bearer(headers) -> str:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _key_matches(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def _add_routes(app: FastAPI, state: _State) -> None:
    authorized = [Depends(_authorize(state))]

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "version": __version__, "uptime_s": round(time.time() - state.started, 1),
                "models_loaded": state.registry.loaded_names(),
                "streams_active": state.admission.counts.active, "queue_length": state.admission.counts.waiting}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> dict:
        names = await run_in_threadpool(state.registry.names)
        return {"object": "list", "data": [_model_card(name, state) for name in [OPENAI_MODEL, *names]]}

    @app.get("/v1/models/{name}", dependencies=authorized)
    async def model(name: str) -> dict:
        try:
            await run_in_threadpool(state.registry.key, name)
        except UnknownModel as exc:
            raise ApiError(404, str(exc), param="model", code="model_not_found") from None
        return _model_card(name, state)

    @app.post("/v1/audio/transcriptions", dependencies=authorized)
    async def transcriptions(request: Request, form: Annotated[_Form, Depends()]) -> Response:
        return await _file_request(request, state, form, task="transcribe", route="transcriptions")

    @app.post("/v1/audio/translations", dependencies=authorized)
    async def translations(request: Request, form: Annotated[_TranslationForm, Depends()]) -> Response:
        return await _file_request(request, state, form, task="translate", route="translations")

    @app.websocket("/v1/audio/live")
    async def live_audio(websocket: WebSocket) -> None:
        given = websocket.query_params.get("api_key") or _bearer(websocket.headers)
        if state.config.api_key and not _key_matches(state.config.api_key, given):
            await live.refuse(websocket, "Incorrect API key provided: pass ?api_key=<key> or "
                                         "'Authorization: Bearer <key>'.")
            state.metrics.requests.labels("live", "401").inc()
            return
        await live.serve_stream(websocket, state.registry, state.admission, state.metrics, state.executor)


def _model_card(name: str, state: _State) -> dict:
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "aural"}


class _TranslationForm:
    """The fields of POST /v1/audio/translations (OpenAI's names)."""

    def __init__(self, file: Annotated[UploadFile, File()], model: Annotated[str, Form()] = OPENAI_MODEL,
                 prompt: Annotated[str | None, Form()] = None, response_format: Annotated[str, Form()] = "json",
                 temperature: Annotated[float, Form()] = 0.0):
        self.file, self.model, self.prompt = file, model, prompt
        self.response_format, self.temperature = response_format, temperature
        self.language: str | None = None
        self.granularities: list[str] = []


class _Form(_TranslationForm):
    """The fields of POST /v1/audio/transcriptions: a translation's, plus the language and the granularities."""

    def __init__(self, file: Annotated[UploadFile, File()], model: Annotated[str, Form()] = OPENAI_MODEL,
                 language: Annotated[str | None, Form()] = None, prompt: Annotated[str | None, Form()] = None,
                 response_format: Annotated[str, Form()] = "json", temperature: Annotated[float, Form()] = 0.0,
                 granularities: Annotated[list[str] | None, Form(alias="timestamp_granularities[]")] = None):
        super().__init__(file, model, prompt, response_format, temperature)
        self.language = language
        self.granularities = granularities or []


def _options(form: _TranslationForm, task: str, beam_size: int) -> TranscribeOptions:
    """The engine's options for a request; ApiError(400) names the field that is wrong."""
    if form.response_format not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}, not {form.response_format!r}",
                       param="response_format")
    unknown = [g for g in form.granularities if g not in GRANULARITIES]
    if unknown:
        raise ApiError(400, f"timestamp_granularities[] takes {' and '.join(GRANULARITIES)}, not {unknown[0]!r}",
                       param="timestamp_granularities[]")
    if form.granularities and form.response_format != "verbose_json":
        raise ApiError(400, "timestamp_granularities[] needs response_format verbose_json",
                       param="timestamp_granularities[]")
    if not 0.0 <= form.temperature <= 1.0:
        raise ApiError(400, f"temperature must be between 0 and 1, not {form.temperature}", param="temperature")
    try:
        language = normalize_language(form.language)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="language") from None
    return TranscribeOptions(language=language, task=task, temperatures=_temperatures(form.temperature),
                             initial_prompt=form.prompt or None, word_timestamps="word" in form.granularities,
                             beam_size=beam_size if beam_size > 1 else None)


def _temperatures(first: float) -> tuple[float, ...]:
    """OpenAI's temperature 0 lets the decoder raise it until a window passes its checks; a higher one is
    where that schedule starts."""
    steps = round((1.0 - first) / _TEMPERATURE_STEP)
    return tuple(round(first + i * _TEMPERATURE_STEP, 2) for i in range(steps + 1)) or (first,)


async def _file_request(request: Request, state: _State, form: _TranslationForm, *, task: str, route: str) -> Response:
    started = time.perf_counter()
    status = "500"
    try:
        response = await _answer(request, state, form, task)
        status = str(response.status_code)
        return response
    except ApiError as exc:
        status = str(exc.status)
        raise
    finally:
        state.metrics.requests.labels(route, status).inc()
        state.metrics.latency.labels(route).observe(time.perf_counter() - started)


async def _answer(request: Request, state: _State, form: _TranslationForm, task: str) -> Response:
    options = _options(form, task, state.config.beam_size)
    try:
        await run_in_threadpool(state.registry.key, form.model)  # lists the installed models: disk reads
    except UnknownModel as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None
    if form.response_format == "diarized_json" and not await run_in_threadpool(speaker_models_installed):
        raise ApiError(400, "this server has no speaker models for diarized_json: run `aural models pull speakers` "
                            "where it runs", param="response_format")
    path = await run_in_threadpool(_save_upload, form.file)
    try:
        await run_in_threadpool(_check_audio, path, form.file.filename, state.config.max_audio_s)
        try:
            await state.admission.enter()
        except Busy as exc:
            raise ApiError(429, str(exc), code="rate_limit_exceeded") from None
        try:
            done = await _run_cancellable(request, state, form.model, path, options,
                                          diarize=form.response_format == "diarized_json")
        finally:
            await state.admission.leave()
    finally:
        os.unlink(path)
    if done is None:  # the client went away: nobody reads this
        return Response(status_code=499)
    route = "translations" if task == "translate" else "transcriptions"
    state.metrics.audio_seconds.labels(route).inc(done.timings.audio_s)
    state.metrics.processing_seconds.labels(route).inc(done.timings.wall_s)
    state.metrics.rtf.observe(done.timings.rtf)
    body = render(form.response_format, done, form.granularities)
    if isinstance(body, dict):
        return JSONResponse(body)
    return PlainTextResponse(body, media_type=media_type(form.response_format))


def _save_upload(upload: UploadFile) -> str:
    """The upload copied to a file of its own: the decoder (PyAV) reads a path, and starlette's spooled
    upload has none while it is small enough to stay in memory."""
    suffix = os.path.splitext(upload.filename or "")[1][:16]
    fd, path = tempfile.mkstemp(prefix="aural-upload-", suffix=suffix)
    with os.fdopen(fd, "wb") as out:
        upload.file.seek(0)
        shutil.copyfileobj(upload.file, out, _MIB)
    return path


def _check_audio(path: str, filename: str | None, max_audio_s: float) -> None:
    """ApiError(400) for what is not audio, with the decoder's one-line reason; 413 for audio too long."""
    try:
        info = probe(path)
    except AudioError as exc:
        raise ApiError(400, str(exc).replace(path, filename or "the upload"), param="file") from None
    if info.duration_s is not None and info.duration_s > max_audio_s:
        raise ApiError(413, f"the audio is {info.duration_s:.0f} s long; this server takes at most "
                            f"{max_audio_s:.0f} s (aural serve --max-audio-s)", param="file")


async def _run_cancellable(request: Request, state: _State, model_name: str, path: str,
                           options: TranscribeOptions, *, diarize: bool = False) -> Finished | None:
    """Transcribes on the server's pool; None if the client disconnected (the work is stopped then)."""
    stop = StopEvent()
    job = asyncio.get_running_loop().run_in_executor(
        state.executor, _transcribe_file, state.registry, model_name, path, options, stop, diarize)
    while True:
        done, _ = await asyncio.wait({job}, timeout=_DISCONNECT_POLL_S)
        if done:
            break
        if await request.is_disconnected():
            stop.set()
            await asyncio.wait({job})
            return None
    try:
        return job.result()
    except AudioError as exc:
        raise ApiError(400, str(exc).replace(path, "the upload"), param="file") from None
    except AuralError as exc:  # the model did not load
        raise ApiError(500, str(exc), kind="server_error") from None


def _transcribe_file(registry: ModelRegistry, model_name: str, path: str, options: TranscribeOptions,
                     stop: StopEvent, diarize: bool = False) -> Finished:
    from aural import _native

    try:
        return _transcribe_and_label(registry, model_name, path, options, stop, diarize)
    except _native.ContextFullError as exc:  # the streams' shared KV pool (--kv-pool-mb) has no free block
        full = str(exc)
    # Raised outside the handler, the answer keeps no traceback: the session that found the pool full, and the
    # blocks it holds, go now rather than at the next garbage collection.
    raise ApiError(503, f"{full}: the server is at its KV memory limit; retry later (aural serve --kv-pool-mb)",
                   kind="server_error")


def _transcribe_and_label(registry: ModelRegistry, model_name: str, path: str, options: TranscribeOptions,
                          stop: StopEvent, diarize: bool) -> Finished:
    model = registry.get(model_name)
    if not isinstance(model, WhisperModel):
        return _qwen3_file(model, path, options, stop, diarize)
    if options.task == "translate" and not model.multilingual:
        raise ApiError(400, f"{model.name} is English-only and cannot translate; ask for a multilingual model.",
                       param="model")
    audio = load_audio(path) if diarize else None  # diarization needs the whole recording: decoded once for both
    result = transcribe(model, path if audio is None else audio, options, stop=stop)
    # A translation is English whatever was spoken: only transcripts can hold Chinese.
    segments = list(localize_transcription(result, default_script(), translated=options.task == "translate"))
    if audio is not None and not stop.is_set():
        turns = list(_diarizer().diarize(audio, stop=stop))
        segments = list(assign_speakers(segments, turns, label=speaker_letter))
    return Finished(options.task, result.info, segments, result.timings)


def _qwen3_file(model, path: str, options: TranscribeOptions, stop: StopEvent, diarize: bool) -> Finished:
    """A request to a Qwen3-ASR model (engine/qwen3asr): one segment per chunk of up to 20 minutes, the prompt as
    the words to bias towards; what it cannot do is a 400 naming the field."""
    from ..qwen3asr.transcribe import transcribe_file

    refused = [(param, what) for param, what, asked in (
        ("model", "translate", options.task == "translate"),
        ("timestamp_granularities[]", "time words", options.word_timestamps),
        ("response_format", "name speakers (diarized_json)", diarize)) if asked]
    if refused:
        param, what = refused[0]
        raise ApiError(400, f"{model.name} is a Qwen3-ASR model, which does not {what}; ask for a Whisper model.",
                       param=param)
    result = transcribe_file(model, path, language=options.language, context=options.initial_prompt or "",
                             stop=stop)
    segments = list(localize_transcription(result, default_script()))
    return Finished(options.task, result.info, segments, result.timings)


@functools.cache
def _diarizer() -> Diarizer:
    """One per server, loaded at the first diarized_json request: its models are read-only and its native
    embedder takes one utterance at a time (speaker-model.h)."""
    return Diarizer.installed()
