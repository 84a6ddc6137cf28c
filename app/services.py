"""The services the main window drives: the shared model, the file queue and the live session.

Each owns its workers and threads; the window only calls their methods and listens to their signals.
All of them live in the GUI thread and are built by the composition root (`aural.app.main`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from aural.engine.cancel import StopEvent
from aural.engine.errors import ModelError
from aural.engine.live.capture import (InputDevice, MicrophoneSource, list_input_devices, open_input,
                                      portaudio_input_devices)
from aural.engine.live.mix import MixSource, mix_parts
from aural.engine.live.journal import Session, SessionJournal, mark_session, prune_sessions, unclosed_sessions
from aural.engine.live.streaming import Commit, Metrics, StreamOptions
from aural.engine.metrics import Timings
from aural.engine.models.store import DEFAULT_MODEL, ModelEntry, catalog_models, list_models
from aural.engine.runtime import WhisperModel
from aural.engine.transcribe import Segment, TranscribeOptions, TranscriptionInfo

from .export import CaptionSegment
from .jobs import FileJob, JobStatus
from .workers import FileRequest, FileWorker, LiveWorker, ModelLoader, start_thread, start_worker, worker_threads

__all__ = ["Catalog", "FileQueue", "LiveSession", "ModelService", "open_microphone", "picker_models", "stop_threads"]

logger = logging.getLogger(__name__)


def picker_models() -> list[ModelEntry]:
    """The packaged models, then the catalog models pulled into the cache (the Models dialog). A pulled name
    takes the place of the packaged one it shares (tiny.en): `resolve_model` loads the pulled one. Reads the
    cache only."""
    entries = {e.name: e for e in list_models()}
    try:
        pulled = [r for r in catalog_models() if r.downloaded or r.cached]
    except ModelError as exc:  # a malformed AURAL_MODEL_MIRROR: the packaged models still work
        logger.warning("%s", exc)
        pulled = []
    for row in pulled:
        entries[row.name] = ModelEntry(row.name, "downloaded from the model catalog", (), True, row.cached,
                                       row.name == DEFAULT_MODEL)
    return list(entries.values())


@dataclass(frozen=True)
class Catalog:
    """What the pickers offer: engine look-ups, injected so that tests can replace them.

    Attributes:
        models: the models to offer.
        input_devices: the PortAudio inputs, offered where `pactl` finds no sound server.
        pactl: the program that lists and follows the sound server's sources (`devices.DeviceWatcher`);
            "" to offer `input_devices` only.
    """

    models: Callable[[], list[ModelEntry]] = picker_models
    input_devices: Callable[[], list[InputDevice]] = portaudio_input_devices
    pactl: str = "pactl"


def open_microphone(name: str) -> MicrophoneSource | MixSource:
    """The input called `name` (a sound server's source, a PortAudio device, or a `mix.mix_name` of several);
    the system default for "" or an input that is gone. Lists the inputs (runs pactl): call it off the GUI
    thread, as LiveWorker does."""
    devices = list_input_devices()
    known = {d.name for d in devices}
    parts = mix_parts(name)
    if parts is not None and all(part in known for part in parts):
        return MixSource([open_input(part, devices) for part in parts])
    return open_input(name if name in known else None, devices)


def _for_model(model: WhisperModel, language: str | None) -> str | None:
    """The language to ask `model` for: English-only models take none."""
    return language if model.multilingual else None


def stop_threads(owner: QObject) -> None:
    """Wait for every worker thread of `owner` to end; the workers' stop flags must already be set.

    All of them, not only the running worker's: a worker's `finished` reaches the GUI before its thread
    has ended, and a thread still running when the process exits aborts it ("QThread: Destroyed while
    thread is still running", seen in test_no_sound_server_in_a_real_process). quit() is called here
    too: at shutdown the GUI event loop has stopped, so the queued quit that a finishing worker sends
    would never arrive.
    """
    for thread in worker_threads(owner):
        thread.quit()
        thread.wait()


class ModelService(QObject):
    """Loads one model at a time off the GUI thread, on a compute device; files and live captioning share it."""

    loading = Signal(str)  # spec
    ready = Signal(object)  # WhisperModel (its `fallback` says whether the CPU took over from the device asked for)
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._model: WhisperModel | None = None
        self._loaded: tuple[str, str] | None = None  # the (spec, device) `_model` was loaded from
        self._loading: tuple[str, str] | None = None
        self._loader: ModelLoader | None = None
        self._pending: tuple[str, str, bool] | None = None  # (spec, device, reload) asked for during a load

    @property
    def model(self) -> WhisperModel | None:
        return self._model

    @property
    def loaded(self) -> tuple[str, str] | None:
        """The (spec, compute device asked for) of `model`."""
        return self._loaded

    def load(self, spec: str, device: str = "auto", *, reload: bool = False) -> None:
        """Load `spec` on the compute `device` unless it is loaded so already (or `reload`: its files
        changed, as when a pulled model that shadowed a packaged one is deleted); a request during a load
        waits for that load.

        The loaded model stays in use until the new one is ready, and if the new one fails to load.
        """
        if self._loader is not None:
            self._pending = (spec, device, reload)
            return
        if (spec, device) == self._loaded and not reload:
            return
        self._loading = (spec, device)
        self._loader = ModelLoader(spec, device)
        self._loader.loaded.connect(self._on_loaded)
        self._loader.failed.connect(self.failed)
        self._loader.finished.connect(self._on_finished)
        start_worker(self._loader, self)
        self.loading.emit(spec)

    @Slot(object)
    def _on_loaded(self, model: WhisperModel) -> None:
        self._model, self._loaded = model, self._loading
        self.ready.emit(model)

    @Slot()
    def _on_finished(self) -> None:
        self._loader = None
        pending, self._pending = self._pending, None
        if pending is not None:
            spec, device, reload = pending
            self.load(spec, device, reload=reload)

    def shutdown(self) -> None:
        """A load cannot be interrupted: wait for it."""
        self._pending = None
        stop_threads(self)


class FileQueue(QObject):
    """Transcribes queued files one after another with the shared model, on one worker thread that is
    started with the first file and ends at `shutdown`."""

    added = Signal(object)  # FileJob
    changed = Signal(object)  # FileJob: status or progress
    segment_added = Signal(object, object)  # FileJob, Segment
    fallback = Signal(object)  # runtime.DeviceFallback: the running file went on on the CPU
    kept = Signal(int)  # a finished file's transcript is in the library (engine.history) under this id
    not_kept = Signal(str)  # the library could not take it: why
    speakers_named = Signal(object)  # FileJob: its segments now name their speakers
    not_diarized = Signal(str)  # speakers could not be found: why (the transcript is kept without them)
    _submit = Signal(object)  # FileRequest, to the worker's thread

    def __init__(self, models: ModelService, parent: QObject | None = None):
        super().__init__(parent)
        self._models = models
        self._ids = itertools.count(1)
        self._jobs: dict[int, FileJob] = {}
        self._running: tuple[FileJob, threading.Event] | None = None  # the job and its stop flag
        self._worker: FileWorker | None = None
        self._thread: QThread | None = None
        models.ready.connect(self._next)

    @property
    def busy(self) -> bool:
        """Whether a file is being transcribed (or cancelled) now."""
        return self._running is not None

    def job(self, job_id: int) -> FileJob:
        return self._jobs[job_id]

    @property
    def jobs(self) -> list[FileJob]:
        """Every job added, in order."""
        return list(self._jobs.values())

    def add(self, paths: Iterable[str | Path], language: str | None, kv_mode: str,
            options: TranscribeOptions | None = None, *, diarize: bool = False,
            n_speakers: int | None = None) -> list[FileJob]:
        """Queues files; `options` (the Preferences) is how each is decoded, its language the picker's;
        `diarize`: name each segment's speaker once a file is transcribed, `n_speakers` of them if given."""
        jobs = [FileJob(next(self._ids), Path(p), language, kv_mode, options or TranscribeOptions(), diarize,
                        n_speakers) for p in paths]
        for job in jobs:
            self._jobs[job.id] = job
            self.added.emit(job)
        self._next()
        return jobs

    def cancel(self, job_id: int) -> None:
        job = self._jobs[job_id]
        if job.status is JobStatus.QUEUED:
            self._set_status(job, JobStatus.CANCELLED)
        elif job.status in (JobStatus.RUNNING, JobStatus.IDENTIFYING) and self._running is not None:
            self._running[1].set()
            self._set_status(job, JobStatus.CANCELLING)

    def shutdown(self) -> None:
        """Cancels the queue, lets the running file stop and ends the worker thread."""
        for job in self._jobs.values():
            if job.status is JobStatus.QUEUED:
                job.status = JobStatus.CANCELLED
        if self._running is not None:
            self._running[1].set()
        stop_threads(self)
        self._thread = None

    @Slot()
    def _next(self) -> None:
        model = self._models.model
        if self._running is not None or model is None:
            return
        job = next((j for j in self._jobs.values() if j.status is JobStatus.QUEUED), None)
        if job is None:
            return
        if self._thread is None:
            self._start_worker()
        stop = StopEvent()  # Cancel interrupts the encoder mid-window, not after it
        options = dataclasses.replace(job.options, language=_for_model(model, job.language))
        request = FileRequest(model, job.path, options, job.kv_mode, stop, job.diarize, job.n_speakers)
        job.started = time.monotonic()
        self._set_status(job, JobStatus.RUNNING)
        self._running = (job, stop)
        self._submit.emit(request)

    def _start_worker(self) -> None:
        worker = FileWorker()
        worker.opened.connect(self._on_opened)
        worker.progress.connect(self._on_progress)
        worker.segment.connect(self._on_segment)
        worker.done.connect(self._on_done)
        worker.cancelled.connect(self._on_cancelled)
        worker.failed.connect(self._on_failed)
        worker.fallback.connect(self.fallback)
        worker.kept.connect(self._on_kept)
        worker.not_kept.connect(self.not_kept)
        worker.diarizing.connect(self._on_diarizing)
        worker.speakers.connect(self._on_speakers)
        worker.not_diarized.connect(self.not_diarized)
        worker.finished.connect(self._on_finished)
        self._submit.connect(worker.transcribe)
        # The wrapper is kept here: were it collected while the thread runs, Python would delete the
        # worker from this thread under the worker thread's feet.
        self._worker = worker
        self._thread = start_thread(worker, self)

    @property
    def _current(self) -> FileJob:
        assert self._running is not None, "a worker signal arrived with no job running"
        return self._running[0]

    def _set_status(self, job: FileJob, status: JobStatus) -> None:
        job.status = status
        self.changed.emit(job)

    @Slot(object)
    def _on_opened(self, info: TranscriptionInfo) -> None:
        job = self._current
        job.info = info
        job.total_s = info.duration_s or 0.0
        self.changed.emit(job)

    @Slot(float, float)
    def _on_progress(self, done_s: float, total_s: float) -> None:
        job = self._current
        job.report_progress(done_s, total_s)
        self.changed.emit(job)

    @Slot(object)
    def _on_segment(self, segment: Segment) -> None:
        job = self._current
        job.segments.append(segment)
        self.segment_added.emit(job, segment)

    @Slot()
    def _on_diarizing(self) -> None:
        self._set_status(self._current, JobStatus.IDENTIFYING)

    @Slot(object)
    def _on_speakers(self, segments: list) -> None:
        job = self._current
        job.segments = segments
        self.speakers_named.emit(job)

    @Slot(int)
    def _on_kept(self, history_id: int) -> None:
        self._current.history_id = history_id
        self.kept.emit(history_id)

    @Slot(object)
    def _on_done(self, timings: Timings) -> None:
        job = self._current
        job.timings = timings
        self._set_status(job, JobStatus.DONE)

    @Slot()
    def _on_cancelled(self) -> None:
        self._set_status(self._current, JobStatus.CANCELLED)

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        job = self._current
        job.error = message
        self._set_status(job, JobStatus.FAILED)

    @Slot()
    def _on_finished(self) -> None:
        self._running = None
        self._next()


class LiveSession(QObject):
    """Live captioning from the input device with the shared model; one run at a time.

    Keeps every committed caption in `transcript`, across runs (later runs continue the timeline), until
    `clear_transcript`, which `undo_clear` takes back. The transcript is journaled as it grows
    (`engine.journal`): one session file from the first commit until a clean quit, so after a crash the
    next launch can restore it; Clear keeps the file, so a crash after a Clear loses nothing either.
    """

    running_changed = Signal(bool)
    partial = Signal(object)  # streaming.Partial
    commit = Signal(object)  # streaming.Commit
    metrics = Signal(object)  # streaming.Metrics
    level = Signal(float)  # input RMS, 0..1
    levels = Signal(list)  # a mix's inputs' RMS, 0..1 each
    failed = Signal(str)
    fallback = Signal(object)  # runtime.DeviceFallback: the run went on on the CPU, its captions kept

    def __init__(self, models: ModelService, open_source: Callable[[str], object],
                 parent: QObject | None = None):
        super().__init__(parent)
        self._models = models
        self._open_source = open_source
        self._running: LiveWorker | None = None
        self._pending: tuple[str, str | None, str, bool] | None = None
        self.transcript: list[CaptionSegment] = []
        self._cleared: list[CaptionSegment] = []  # what the last Clear removed, for undo_clear
        self._offset_s = 0.0  # transcript time of this run's input time 0
        self._run_audio_s = 0.0
        self._journal = SessionJournal(source="app")  # in engine.journal.sessions_dir()
        prune_sessions(self._journal.directory)  # sessions that ended over KEEP_DAYS ago (a few stat calls)
        models.ready.connect(self._start_pending)

    @property
    def running(self) -> bool:
        return self._running is not None or self._pending is not None

    def start(self, device: str, language: str | None, kv_mode: str, *, keep_audio: bool = False) -> None:
        """Start now, or as soon as the model being loaded is ready. `device` is an input's name;
        `keep_audio`: the session's audio goes beside its journal (engine.live.journal), for the History tab."""
        if self.running:
            return
        self._pending = (device, language, kv_mode, keep_audio)
        self.running_changed.emit(True)
        self._start_pending()

    def stop(self) -> None:
        """Ask the worker to stop; `running_changed(False)` follows once it has committed its tail."""
        if self._running is not None:
            self._running.stop()
        elif self._pending is not None:
            self._pending = None
            self.running_changed.emit(False)

    def clear_transcript(self) -> None:
        """Empties the transcript, keeping what it held for `undo_clear`. The journal stays open and the
        timeline goes on, so Undo puts every caption back at its time."""
        self._cleared, self.transcript = self.transcript, []

    @property
    def can_undo_clear(self) -> bool:
        return bool(self._cleared)

    def undo_clear(self) -> list[CaptionSegment]:
        """Puts the captions the last Clear removed back before those committed since; returns the
        whole transcript."""
        restored = self._cleared + self.transcript
        self._cleared = []
        self.transcript = [dataclasses.replace(s, id=i) for i, s in enumerate(restored)]
        return self.transcript

    def unclosed_sessions(self) -> list[Session]:
        """Journaled sessions that a crash (of this app or `aural live`) left unclosed, oldest first."""
        return unclosed_sessions(self._journal.directory)

    def restore(self, session: Session) -> list[CaptionSegment]:
        """Appends an unclosed session's text to the transcript and returns the new segments.

        The text is journaled in this app's session before the old file is closed as restored, so that
        a crash between the two offers it twice rather than never. Raises OSError when the disk fails.
        """
        base = self.transcript[-1].end if self.transcript else self._offset_s
        self._journal.extend([(e.text, base + e.start, base + e.end) for e in session.entries])
        mark_session(session.path, "restored")
        restored = [CaptionSegment(len(self.transcript) + i, base + e.start, base + e.end, e.text)
                    for i, e in enumerate(session.entries)]
        self.transcript += restored
        self._offset_s = max(self._offset_s, restored[-1].end)
        return restored

    def discard(self, session: Session) -> None:
        """Closes an unclosed session as discarded: it is not offered again. Raises OSError."""
        mark_session(session.path, "discarded")

    def shutdown(self) -> None:
        """Stops the run (its tail is committed and journaled), then closes the journal: a clean quit."""
        self._pending = None
        if self._running is not None:
            self._running.stop()
        stop_threads(self)
        self._journal.close()

    @Slot()
    def _start_pending(self) -> None:
        model = self._models.model
        if self._pending is None or self._running is not None or model is None:
            return
        device, language, kv_mode, keep_audio = self._pending
        self._pending = None
        self._run_audio_s = 0.0
        options = StreamOptions(language=_for_model(model, language))
        self._journal.model = model.name
        worker = LiveWorker(model, lambda: self._open_source(device), options, kv_mode, self._journal_commit,
                            self._record if keep_audio else None)
        # Partials, metrics and levels come many times a second: queued, so the engine never waits on the GUI.
        worker.partial.connect(self.partial, Qt.ConnectionType.QueuedConnection)
        worker.metrics.connect(self._on_metrics, Qt.ConnectionType.QueuedConnection)
        worker.level.connect(self.level, Qt.ConnectionType.QueuedConnection)
        worker.levels.connect(self.levels, Qt.ConnectionType.QueuedConnection)
        worker.commit.connect(self._on_commit)
        worker.failed.connect(self.failed)
        worker.fallback.connect(self.fallback)
        worker.finished.connect(self._on_finished)
        start_worker(worker, self)
        self._running = worker

    def _record(self, samples) -> None:
        """Runs on the worker's thread: the run's audio from its start on the transcript's timeline."""
        self._journal.record(samples, self._offset_s)

    def _journal_commit(self, commit: Commit) -> None:
        """Runs on the worker's thread: the commit is on disk before the GUI sees it, with the same
        transcript times as `_on_commit` gives it."""
        self._journal.append(commit.text, self._offset_s + commit.start, self._offset_s + commit.end)

    @Slot(object)
    def _on_commit(self, commit: Commit) -> None:
        self.transcript.append(CaptionSegment(len(self.transcript), self._offset_s + commit.start,
                                              self._offset_s + commit.end, commit.text, spaced=commit.spaced))
        self.commit.emit(commit)

    @Slot(object)
    def _on_metrics(self, metrics: Metrics) -> None:
        self._run_audio_s = metrics.audio_s
        self.metrics.emit(metrics)

    @Slot()
    def _on_finished(self) -> None:
        self._running = None
        self._offset_s += self._run_audio_s
        self.running_changed.emit(False)
