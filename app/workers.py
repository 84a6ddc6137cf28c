"""Workers that run engine calls off the GUI thread.

One-shot workers (model loads, live runs) are QObjects moved to a QThread of their own (see
`start_worker`); the file queue's `FileWorker` lives on one thread for all its files (see `FileWorker`).
The engine's iterators are lazy, so a worker checks its stop flag (a `threading.Event`, set from the GUI
thread) between the items they yield; an item in progress (a 30 s window, a live step) is always
finished first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, QThread, Signal, Slot

from aural.engine.audio import load_audio
from aural.engine.errors import AuralError
from aural.engine.features import N_FRAMES, N_SAMPLES, window_mel
from aural.engine.history import History, HistoryError, Line, TimedWord
from aural.engine.live.capture import TappedSource
from aural.engine.live.mix import MixSource
from aural.engine.live.streaming import Commit, Error, Metrics, Partial, StreamOptions
from aural.engine.models.download import TransferRate
from aural.engine.models.store import PullProgress, catalog_models, pull, resolve_model
from aural.engine.qwen3asr import Qwen3AsrModel
from aural.engine.qwen3asr.streaming import any_live_events
from aural.engine.qwen3asr.transcribe import transcribe_file as transcribe_qwen3_file
from aural.engine.runtime import DeviceFallback, WhisperModel, compute_devices, load_any_model
from aural.engine.speakers import DiarizeOptions, Diarizer, assign_speakers
from aural.engine.text.chinese import default_script, localize_transcription
from aural.engine.transcribe import TranscribeOptions, TranscriptionInfo, transcribe

__all__ = ["CatalogLister", "ComputeDevicesWorker", "DoctorWorker", "EncoderProbe", "FileRequest", "FileWorker",
           "LiveWorker", "MeteredSource", "ModelLoader", "PullWorker", "SpeakerWorker", "start_thread", "start_worker",
           "worker_threads"]

logger = logging.getLogger(__name__)


def _describe(exc: Exception) -> str:
    """One line for the user: engine errors are written for users, anything else is a bug worth naming."""
    if isinstance(exc, AuralError):
        return str(exc)
    logger.exception("unexpected error in a worker")
    return f"unexpected {type(exc).__name__}: {exc}"


def start_worker(worker: QObject, parent: QObject) -> QThread:
    """Run `worker.run` in a new thread that quits when the worker finishes; both are then freed on the
    GUI thread (see `_Reaper`). `worker_threads(parent)` lists the thread until then."""
    thread = QThread()  # no parent: Python owns it, so dropping the reaper's reference frees it
    worker.moveToThread(thread)
    thread.started.connect(worker.run)
    worker.finished.connect(thread.quit)
    _Reaper.of(parent).watch(thread, worker)
    thread.start()
    return thread


def worker_threads(owner: QObject) -> list[QThread]:
    """Every thread of `owner` not yet freed: its child QThreads and its one-shot workers' threads."""
    reaper = owner.findChild(_Reaper)
    return owner.findChildren(QThread) + (reaper.threads() if reaper is not None else [])


class _Reaper(QObject):
    """Frees one-shot workers and their threads on the GUI thread, from Python, once a thread has ended.

    Not `deleteLater`: Qt would then destroy these Python-made objects from an event loop that does not
    hold the GIL. The destructor takes Qt's signal-slot lock and then waits for the GIL, while the GUI
    thread, holding the GIL, waits for that lock to connect a timer (QStatusBar.showMessage): the app froze
    in test_app. Starting workers in a tight loop also crashed PySide6 6.11 and 6.12 ("shared QObject was
    deleted directly", segfaults; tests/test_workers.py). Dropping the last Python references on the GUI
    thread, which holds the GIL, destroys them with nothing left running in their thread. The threads
    have no parent, so that dropping the reference frees them without a further call into Qt.
    """

    @staticmethod
    def of(owner: QObject) -> _Reaper:
        reaper = owner.findChild(_Reaper)
        return reaper if reaper is not None else _Reaper(owner)

    def __init__(self, owner: QObject):
        super().__init__(owner)
        self._running: dict[QThread, QObject] = {}  # thread -> its worker

    def threads(self) -> list[QThread]:
        return list(self._running)

    def watch(self, thread: QThread, worker: QObject) -> None:
        self._running[thread] = worker
        thread.finished.connect(self._reap)  # queued: `finished` is emitted by the ending thread

    @Slot()
    def _reap(self) -> None:
        for thread in [t for t in self._running if t.isFinished()]:
            thread.wait()  # `finished` comes just before the thread's last instructions
            del self._running[thread]  # the last references: both are freed at the end of this loop


def start_thread(worker: QObject, parent: QObject) -> QThread:
    """Moves a long-lived `worker` to a new running thread; its slots then run there when invoked
    through queued signals. The owner keeps `worker` and ends the thread with `services.stop_threads`."""
    thread = QThread(parent)
    worker.moveToThread(thread)
    thread.start()
    return thread


class _Reporter(QObject):
    """Runs engine work in its thread: any error becomes `failed`, and `finished` always follows."""

    failed = Signal(str)
    finished = Signal()

    def _guarded(self, work: Callable, *args) -> None:
        try:
            work(*args)
        except Exception as exc:  # noqa: BLE001 - reported to the user; the app keeps running
            self.failed.emit(_describe(exc))
        finally:
            self.finished.emit()


class _Worker(_Reporter):
    """A one-shot worker: `run` does `_work` once, until done or stopped."""

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()

    def stop(self) -> None:
        """Thread-safe: asks the work to end at its next check of the stop flag."""
        self._stop.set()

    @Slot()
    def run(self) -> None:
        self._guarded(self._work)

    def _work(self) -> None:
        raise NotImplementedError


# Sessions of one model that decode at once in the app: the live captions', the file queue's (one file at a
# time), and one a file reopens for whole windows while its first is still held (runtime.FallbackSession.fit).
APP_SESSIONS = 3


class ModelLoader(_Worker):
    """Resolves (converting on first use) and loads one model on a compute device: on the CPU, with the
    model's `fallback` saying why, when that device cannot be used. Whisper or Qwen3-ASR, as the file holds."""

    loaded = Signal(object)  # WhisperModel or qwen3asr.Qwen3AsrModel

    def __init__(self, spec: str, device: str = "auto"):
        super().__init__()
        self._spec = spec
        self._device = device

    def _work(self) -> None:
        model = load_any_model(resolve_model(self._spec), device=self._device)
        if isinstance(model, WhisperModel) and not model.isolated:
            # The sessions' self-attention K/V in one paged pool: on the CPU only the blocks their text takes
            # are resident, and the metrics panel shows the pool's use. Sized as the own arenas of the sessions
            # that can decode at once (APP_SESSIONS), so it is never full where they would have had room.
            model.use_kv_pool(sessions=APP_SESSIONS)
        self.loaded.emit(model)


class ComputeDevicesWorker(_Worker):
    """The ggml devices (the first listing loads ggml's backends: half a second, more on a first run)."""

    listed = Signal(list)  # runtime.ComputeDevice

    def _work(self) -> None:
        self.listed.emit(compute_devices())


class DoctorWorker(_Worker):
    """`aural doctor`'s text report (it loads the native engine and probes the audio input: up to ~1 s)."""

    reported = Signal(str)

    def _work(self) -> None:
        from aural.engine import doctor

        self.reported.emit(doctor.format_report(doctor.report()))


class CatalogLister(_Worker):
    """The catalog's models with what the cache holds. With AURAL_MODEL_MIRROR set the mirror's catalog.json is
    read too (the network: hence a thread); when it cannot be, the built-in entries come with the error."""

    listed = Signal(list)  # store.CatalogModel

    def _work(self) -> None:
        try:
            rows = catalog_models(remote=True)
        except AuralError:
            self.listed.emit(catalog_models())
            raise
        self.listed.emit(rows)


class _Throttle:
    """Which pull steps to report: a new stage, the last byte, or 0.1 s since the last one reported (a
    download over loopback makes hundreds of 256 KiB steps a second); and the download's speed so far."""

    _EVERY_S = 0.1

    def __init__(self):
        self._stage = ""
        self._shown_at = 0.0
        self._rate = TransferRate()

    def mib_per_s(self, step: PullProgress, now: float) -> float:
        return self._rate.update(step.done_bytes, now) / 2**20 if step.stage == "download" else 0.0

    def due(self, step: PullProgress, now: float) -> bool:
        due = (step.stage != self._stage or step.done_bytes == step.total_bytes
               or now - self._shown_at >= self._EVERY_S)
        if due:
            self._stage, self._shown_at = step.stage, now
        return due


class PullWorker(_Worker):
    """Downloads a catalog model and converts it (`store.pull`); `stop` cancels after the current read and
    keeps the resumable partial. The conversion that follows a download cannot be interrupted."""

    progress = Signal(object, float)  # store.PullProgress, MiB/s of this run's download so far
    pulled = Signal(str)  # name
    cancelled = Signal(str, int)  # name, bytes kept in the partial

    def __init__(self, name: str, wtype: str):
        super().__init__()
        self.name = name
        self._wtype = wtype

    def _work(self) -> None:
        throttle = _Throttle()
        for step in pull(self.name, wtype=self._wtype, stop=self._stop):
            if step.stage == "done":
                self.pulled.emit(step.name)
            elif step.stage == "cancelled":
                self.cancelled.emit(step.name, step.done_bytes)
            else:
                now = time.monotonic()
                rate = throttle.mib_per_s(step, now)
                if throttle.due(step, now):
                    self.progress.emit(step, rate)


class EncoderProbe(_Worker):
    """Times one encoder pass over a full 30 s window on a session of its own on `model`, for the Models
    dialog's speed estimates. The window is silence: the encoder's work does not depend on what it hears."""

    measured = Signal(float)  # seconds for one 30 s window

    def __init__(self, model: WhisperModel):
        super().__init__()
        self._model = model

    def _work(self) -> None:
        ctx = self._model.new_session()
        mel = window_mel(np.zeros(N_SAMPLES, dtype=np.float32), self._model.mel_filters, N_FRAMES)
        ctx.encode(mel)  # the first pass also builds and allocates the graph: not what a window costs
        start = time.perf_counter()
        ctx.encode(mel)
        self.measured.emit(time.perf_counter() - start)


@dataclass(frozen=True)
class FileRequest:
    """One file for `FileWorker.transcribe`.

    Attributes:
        model: the loaded model.
        path: the file.
        options: how to transcribe it.
        kv_mode: "device" or "host".
        stop: set (from any thread) to cancel this file.
        diarize: name each segment's speaker once the file is transcribed.
        n_speakers: how many speak, None: found from the voices.
    """

    model: WhisperModel
    path: Path
    options: TranscribeOptions
    kv_mode: str
    stop: threading.Event
    diarize: bool = False
    n_speakers: int | None = None


class FileWorker(_Reporter):
    """Transcribes files one at a time on one long-lived thread, emitting each segment as it is decoded.

    One thread serves every file: a new thread per file gets its own malloc arena and OpenMP thread
    pool, and resident memory grew with each (measured: +86 MiB over the first 6 files of 1 s each, then
    a plateau); on one thread it stays flat. Every request ends with `finished`.
    """

    opened = Signal(object)  # TranscriptionInfo
    progress = Signal(float, float)  # done_s, total_s
    segment = Signal(object)  # Segment
    done = Signal(object)  # Timings
    cancelled = Signal()
    kept = Signal(int)  # history.History id of the finished transcript
    not_kept = Signal(str)  # why the library could not take it (the file's result stays as it is)
    fallback = Signal(object)  # runtime.DeviceFallback: the CPU took over the file from the model's device
    diarizing = Signal()  # transcribed; now finding who speaks
    speakers = Signal(object)  # the segments again, each naming its speaker
    not_diarized = Signal(str)  # why speakers could not be found (the transcript is kept without them)

    def __init__(self):
        super().__init__()
        self._diarizer = None  # loaded at the first file that asks, then kept: its models load in ~0.3 s

    @Slot(object)
    def transcribe(self, request: FileRequest) -> None:
        self._guarded(self._transcribe, request)

    def _transcribe(self, request: FileRequest) -> None:
        if request.stop.is_set():
            self.cancelled.emit()
            return
        # Diarization needs the whole recording: decoded once for both, as `aural transcribe --diarize` does.
        source = load_audio(request.path) if request.diarize else request.path
        # The engine checks the stop flag at every decoder step, and a StopEvent also interrupts the
        # native call in progress, so a cancel lands within one graph node.
        result = self._run(request, source)
        self.opened.emit(result.info)
        # Chinese in the user's script, as `aural transcribe` writes it (a translation is English).
        segments = []
        for segment in localize_transcription(result, default_script(),
                                              translated=request.options.task == "translate"):
            segments.append(segment)
            self.segment.emit(segment)
        if request.stop.is_set():
            self.cancelled.emit()
            return
        if request.diarize and isinstance(request.model, Qwen3AsrModel):
            self.not_diarized.emit(f"{request.path.name}: speakers not identified: Qwen3-ASR gives one segment per "
                                   "chunk of up to 20 minutes, too long to name a speaker for")
        elif request.diarize:
            segments = self._named(request, source, segments)
            if request.stop.is_set():
                self.cancelled.emit()
                return
        self._keep(request.path, result.info, segments)
        self.done.emit(result.timings)

    def _run(self, request: FileRequest, source):
        """The engine's `Transcription` of the file by the request's model: Whisper, or Qwen3-ASR with the
        options it takes (its language and hot words; it neither translates nor times words)."""
        options = request.options
        if not isinstance(request.model, Qwen3AsrModel):
            return transcribe(request.model, source, options, kv_mode=request.kv_mode, progress=self.progress.emit,
                              stop=request.stop, on_fallback=self.fallback.emit)
        if options.task == "translate":
            raise AuralError(f"{request.model.name} is a Qwen3-ASR model, which does not translate; choose a "
                             "Whisper model to translate.")
        return transcribe_qwen3_file(request.model, source, language=options.language, context=options.hotwords or "",
                                     kv_mode=request.kv_mode, path=str(request.path), progress=self.progress.emit,
                                     stop=request.stop, on_fallback=self.fallback.emit)

    def _named(self, request: FileRequest, audio, segments: list) -> list:
        """The segments with their speakers (`audio`: the file's 16 kHz samples); unchanged, and
        `not_diarized` says why, when that fails."""
        self.diarizing.emit()
        try:
            if self._diarizer is None:
                self._diarizer = Diarizer.installed()
            turns = list(self._diarizer.diarize(audio, DiarizeOptions(n_speakers=request.n_speakers), request.stop))
            if request.stop.is_set():
                return segments
        except (AuralError, RuntimeError, ValueError) as e:  # the native embedder's errors are Runtime/ValueError
            self.not_diarized.emit(f"{request.path.name}: speakers not identified: {e}")
            return segments
        named = list(assign_speakers(segments, turns))
        self.speakers.emit(named)
        return named

    def _keep(self, path: Path, info: TranscriptionInfo, segments: list) -> None:
        """The finished transcript into the library (History tab); one that cannot be written is reported
        and the transcript stays in the queue as it is."""
        try:
            with History() as history:
                entry_id = history.add("file", path.name, [_line(s) for s in segments],
                                       source=str(path), model=info.model, language=info.language,
                                       duration_s=info.duration_s)
        except HistoryError as e:
            self.not_kept.emit(str(e))
            return
        self.kept.emit(entry_id)


def _line(segment) -> Line:
    """A transcribed segment as the library keeps it, with its words' times when they were asked for."""
    words = tuple(TimedWord(w.start, w.end, w.word) for w in segment.words or ())
    return Line(segment.start, segment.end, segment.text, words, speaker=segment.speaker)


class SpeakerWorker(_Worker):
    """Finds the speakers of a kept transcript from its audio (a file, a live session's recording) and names
    them on its lines in the library."""

    named = Signal(int)  # the transcript's id: its lines name their speakers now

    def __init__(self, entry_id: int, n_speakers: int | None = None):
        super().__init__()
        self._entry_id = entry_id
        self._options = DiarizeOptions(n_speakers=n_speakers)

    def _work(self) -> None:
        with History() as history:
            entry, lines = history.entry(self._entry_id), history.lines(self._entry_id)
        if entry.audio is None:
            raise AuralError(f"{entry.title}: its audio is gone, so its speakers cannot be found")
        turns = list(Diarizer.installed().diarize(load_audio(entry.audio), self._options, self._stop))
        if self._stop.is_set():
            return
        with History() as history:
            history.set_speakers(self._entry_id, {line.id: line.speaker for line in assign_speakers(lines, turns)})
        self.named.emit(self._entry_id)


class MeteredSource(TappedSource):
    """A capture source passed through unchanged, reporting the RMS of what each read returns, or for a
    mix (`mix.MixSource`) each input's RMS over it, so that each input has its own meter.

    The level is measured on the worker's side of the ring buffer, so it arrives when the engine reads:
    every 0.1 s while it keeps up, in one piece after a long decode step.
    """

    def __init__(self, source, on_level: Callable[[float], None], on_levels: Callable[[list], None]):
        super().__init__(source, self._meter)
        self._on_level = on_level
        self._on_levels = on_levels

    def _meter(self, samples: np.ndarray) -> None:
        if isinstance(self._source, MixSource):
            self._on_levels(list(self._source.levels))
        else:
            self._on_level(float(np.sqrt(np.mean(np.square(samples)))))


class LiveWorker(_Worker):
    """Live captioning from an audio source until stopped.

    Every commit goes to `journal` (on disk, fsynced) on this thread before it is emitted, so the GUI
    never shows text that a crash could lose, and never waits for the disk.
    """

    partial = Signal(object)  # streaming.Partial
    commit = Signal(object)  # streaming.Commit
    metrics = Signal(object)  # streaming.Metrics
    level = Signal(float)  # RMS of the latest audio, 0..1
    levels = Signal(list)  # of a mix: each input's RMS of the latest audio, 0..1, in the mix's order
    fallback = Signal(object)  # runtime.DeviceFallback: the CPU took over the stream from the model's device

    def __init__(self, model: WhisperModel, open_source: Callable[[], object], options: StreamOptions,
                 kv_mode: str, journal: Callable[[Commit], None], record: Callable[[np.ndarray], None] | None = None):
        """`record`: takes every block of audio the engine reads (on this thread), when the audio is kept."""
        super().__init__()
        self._model = model
        self._open_source = open_source
        self._options = options
        self._kv_mode = kv_mode
        self._journal = journal
        self._journal_failed = False
        self._record = record

    def _work(self) -> None:
        signals = {Partial: self.partial, Commit: self.commit, Metrics: self.metrics, DeviceFallback: self.fallback}
        # Metered next to the source itself: a mix's meters read its inputs (MeteredSource checks its type).
        source = MeteredSource(self._open_source(), self.level.emit, self.levels.emit)
        if self._record is not None:
            source = TappedSource(source, self._record_audio)
        for event in any_live_events(self._model, source, self._options, kv_mode=self._kv_mode, stop=self._stop):
            if isinstance(event, Error):
                self.failed.emit(event.message)
                continue
            if isinstance(event, Commit):
                self._write_journal(event)
            signals[type(event)].emit(event)

    def _record_audio(self, samples: np.ndarray) -> None:
        """Like the journal, a full disk stops the recording, not the captions (reported once)."""
        if self._record is None:
            return
        try:
            self._record(samples)
        except (OSError, RuntimeError) as exc:  # soundfile's LibsndfileError is a RuntimeError
            self._record = None
            self.failed.emit(f"The session's audio is not being kept: {exc}")

    def _write_journal(self, commit: Commit) -> None:
        """A full disk must not stop the captions: it is reported once per run, and captioning goes on."""
        try:
            self._journal(commit)
        except OSError as exc:
            if not self._journal_failed:
                self._journal_failed = True
                self.failed.emit(f"Captions are not being saved for recovery: {exc.strerror or exc}")
