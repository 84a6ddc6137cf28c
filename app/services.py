"""The services the main window drives: the shared model, the file queue and the live session.

Each owns its workers and threads; the window only calls their methods and listens to their signals.
All of them live in the GUI thread and are built by the composition root (`aural.app.main`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import shiboken6
from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from aural.engine.capture import InputDevice, MicrophoneSource, list_input_devices
from aural.engine.metrics import Timings
from aural.engine.models import ModelEntry, list_models
from aural.engine.runtime import WhisperModel
from aural.engine.streaming import Commit, Metrics, StreamOptions
from aural.engine.transcribe import Segment, TranscribeOptions, TranscriptionInfo

from .export import CaptionSegment
from .jobs import FileJob, JobStatus
from .workers import FileWorker, LiveWorker, ModelLoader, start_worker

__all__ = ["Catalog", "FileQueue", "LiveSession", "ModelService", "open_microphone", "stop_thread"]


@dataclass(frozen=True)
class Catalog:
    """What the pickers offer: engine look-ups, injected so that tests can replace them."""

    models: Callable[[], list[ModelEntry]] = list_models
    input_devices: Callable[[], list[InputDevice]] = list_input_devices


def open_microphone(name: str) -> MicrophoneSource:
    """The input called `name`; the system default for "" or a device that is gone."""
    index = next((d.index for d in list_input_devices() if d.name == name), None) if name else None
    return MicrophoneSource(device=index)


def _for_model(model: WhisperModel, language: str | None) -> str | None:
    """The language to ask `model` for: English-only models take none."""
    return language if model.multilingual else None


def stop_thread(thread: QThread | None) -> None:
    """Wait for a worker's thread to end; its stop flag must already be set.

    quit() is called here too: at shutdown the GUI event loop has stopped, so the queued quit that a
    finishing worker sends would never arrive.
    """
    if thread is not None and shiboken6.isValid(thread):
        thread.quit()
        thread.wait()


class ModelService(QObject):
    """Loads one model at a time off the GUI thread; files and live captioning share it."""

    loading = Signal(str)  # spec
    ready = Signal(object)  # WhisperModel
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._model: WhisperModel | None = None
        self._model_spec: str | None = None  # what `_model` was loaded from
        self._loading_spec: str | None = None
        self._loader: ModelLoader | None = None
        self._thread: QThread | None = None
        self._pending: str | None = None

    @property
    def model(self) -> WhisperModel | None:
        return self._model

    def load(self, spec: str) -> None:
        """Load `spec` unless it is already loaded; a request during a load waits for that load.

        The loaded model stays in use until the new one is ready, and if the new one fails to load.
        """
        if self._loader is not None:
            self._pending = spec
            return
        if spec == self._model_spec:
            return
        self._loading_spec = spec
        self._loader = ModelLoader(spec)
        self._loader.loaded.connect(self._on_loaded)
        self._loader.failed.connect(self.failed)
        self._loader.finished.connect(self._on_finished)
        self._thread = start_worker(self._loader, self)
        self.loading.emit(spec)

    @Slot(object)
    def _on_loaded(self, model: WhisperModel) -> None:
        self._model, self._model_spec = model, self._loading_spec
        self.ready.emit(model)

    @Slot()
    def _on_finished(self) -> None:
        self._loader = self._thread = None
        pending, self._pending = self._pending, None
        if pending is not None:
            self.load(pending)

    def shutdown(self) -> None:
        """A load cannot be interrupted: wait for it."""
        self._pending = None
        stop_thread(self._thread)


class FileQueue(QObject):
    """Transcribes queued files one after another with the shared model."""

    added = Signal(object)  # FileJob
    changed = Signal(object)  # FileJob: status or progress
    segment_added = Signal(object, object)  # FileJob, Segment

    def __init__(self, models: ModelService, parent: QObject | None = None):
        super().__init__(parent)
        self._models = models
        self._ids = itertools.count(1)
        self._jobs: dict[int, FileJob] = {}
        self._running: tuple[FileJob, FileWorker, QThread] | None = None
        models.ready.connect(self._next)

    def job(self, job_id: int) -> FileJob:
        return self._jobs[job_id]

    @property
    def jobs(self) -> list[FileJob]:
        """Every job added, in order."""
        return list(self._jobs.values())

    def add(self, paths: Iterable[str | Path], language: str | None, kv_mode: str) -> list[FileJob]:
        jobs = [FileJob(next(self._ids), Path(p), language, kv_mode) for p in paths]
        for job in jobs:
            self._jobs[job.id] = job
            self.added.emit(job)
        self._next()
        return jobs

    def cancel(self, job_id: int) -> None:
        job = self._jobs[job_id]
        if job.status is JobStatus.QUEUED:
            self._set_status(job, JobStatus.CANCELLED)
        elif job.status is JobStatus.RUNNING and self._running is not None:
            self._running[1].stop()
            self._set_status(job, JobStatus.CANCELLING)

    def shutdown(self) -> None:
        for job in self._jobs.values():
            if job.status is JobStatus.QUEUED:
                job.status = JobStatus.CANCELLED
        if self._running is not None:
            _, worker, thread = self._running
            worker.stop()
            stop_thread(thread)

    @Slot()
    def _next(self) -> None:
        model = self._models.model
        if self._running is not None or model is None:
            return
        job = next((j for j in self._jobs.values() if j.status is JobStatus.QUEUED), None)
        if job is None:
            return
        options = TranscribeOptions(language=_for_model(model, job.language))
        worker = FileWorker(model, job.path, options, job.kv_mode)
        worker.opened.connect(self._on_opened)
        worker.progress.connect(self._on_progress)
        worker.segment.connect(self._on_segment)
        worker.done.connect(self._on_done)
        worker.cancelled.connect(self._on_cancelled)
        worker.failed.connect(self._on_failed)
        worker.finished.connect(self._on_finished)
        job.started = time.monotonic()
        self._set_status(job, JobStatus.RUNNING)
        self._running = (job, worker, start_worker(worker, self))

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
    `clear_transcript`.
    """

    running_changed = Signal(bool)
    partial = Signal(object)  # streaming.Partial
    commit = Signal(object)  # streaming.Commit
    metrics = Signal(object)  # streaming.Metrics
    level = Signal(float)  # input RMS, 0..1
    failed = Signal(str)

    def __init__(self, models: ModelService, open_source: Callable[[str], object],
                 parent: QObject | None = None):
        super().__init__(parent)
        self._models = models
        self._open_source = open_source
        self._running: tuple[LiveWorker, QThread] | None = None
        self._pending: tuple[str, str | None, str] | None = None
        self.transcript: list[CaptionSegment] = []
        self._offset_s = 0.0  # transcript time of this run's input time 0
        self._run_audio_s = 0.0
        models.ready.connect(self._start_pending)

    @property
    def running(self) -> bool:
        return self._running is not None or self._pending is not None

    def start(self, device: str, language: str | None, kv_mode: str) -> None:
        """Start now, or as soon as the model being loaded is ready. `device` is an input's name."""
        if self.running:
            return
        self._pending = (device, language, kv_mode)
        self.running_changed.emit(True)
        self._start_pending()

    def stop(self) -> None:
        """Ask the worker to stop; `running_changed(False)` follows once it has committed its tail."""
        if self._running is not None:
            self._running[0].stop()
        elif self._pending is not None:
            self._pending = None
            self.running_changed.emit(False)

    def clear_transcript(self) -> None:
        self.transcript.clear()
        self._offset_s = 0.0

    def shutdown(self) -> None:
        self._pending = None
        if self._running is not None:
            worker, thread = self._running
            worker.stop()
            stop_thread(thread)

    @Slot()
    def _start_pending(self) -> None:
        model = self._models.model
        if self._pending is None or self._running is not None or model is None:
            return
        device, language, kv_mode = self._pending
        self._pending = None
        self._run_audio_s = 0.0
        options = StreamOptions(language=_for_model(model, language))
        worker = LiveWorker(model, lambda: self._open_source(device), options, kv_mode)
        # Partials, metrics and levels come many times a second: queued, so the engine never waits on the GUI.
        worker.partial.connect(self.partial, Qt.ConnectionType.QueuedConnection)
        worker.metrics.connect(self._on_metrics, Qt.ConnectionType.QueuedConnection)
        worker.level.connect(self.level, Qt.ConnectionType.QueuedConnection)
        worker.commit.connect(self._on_commit)
        worker.failed.connect(self.failed)
        worker.finished.connect(self._on_finished)
        self._running = (worker, start_worker(worker, self))

    @Slot(object)
    def _on_commit(self, commit: Commit) -> None:
        self.transcript.append(CaptionSegment(len(self.transcript), self._offset_s + commit.start,
                                              self._offset_s + commit.end, commit.text))
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
