"""The model library behind the Models dialog: the catalog's models, one download at a time, deletion, and
how fast each model would run here. Every engine call that can wait (the network, a conversion, an encoder
pass) runs on a worker thread; this object lives in the GUI thread."""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal, Slot

from aural.engine.errors import AuralError
from aural.engine.models.catalog import load_catalog
from aural.engine.models.store import CatalogModel, list_models, remove_pulled

from .services import ModelService, stop_threads
from .speed import SpeedReference, Speeds
from .workers import CatalogLister, EncoderProbe, PullWorker, start_worker

__all__ = ["ModelLibrary"]

logger = logging.getLogger(__name__)


class ModelLibrary(QObject):
    """Lists, pulls and deletes catalog models (`store.catalog_models`, `pull`, `remove_pulled`)."""

    listed = Signal()  # `rows` and `speeds()` changed
    progress = Signal(object, float)  # store.PullProgress, MiB/s
    pulling_changed = Signal(str)  # the name being pulled; "" once it has ended
    pulled = Signal(str)  # name: installed
    cancelled = Signal(str, int)  # name, bytes kept for resuming
    removed = Signal(str, int)  # name, bytes freed
    failed = Signal(str)

    def __init__(self, models: ModelService, parent: QObject | None = None):
        super().__init__(parent)
        self._models = models
        self.rows: list[CatalogModel] = []
        self.speeds = Speeds()
        self._pull: PullWorker | None = None
        self._probing: tuple[str, str, int] | None = None  # (spec, device, parameters) being timed

    @property
    def pulling(self) -> str:
        """The model being downloaded or converted; "" when none."""
        return self._pull.name if self._pull is not None else ""

    def refresh(self) -> None:
        """Lists the models again (reading the mirror's catalog.json, if one is set, on a worker)."""
        lister = CatalogLister()
        lister.listed.connect(self._on_listed)
        lister.failed.connect(self.failed)
        start_worker(lister, self)

    def pull(self, name: str, wtype: str = "f16") -> None:
        """Downloads (or resumes) and converts `name`; one pull at a time."""
        if self._pull is not None:
            self.failed.emit(f"{self._pull.name} is downloading: wait for it or cancel it first.")
            return
        worker = PullWorker(name, wtype)
        worker.progress.connect(self.progress)
        worker.pulled.connect(self.pulled)
        worker.cancelled.connect(self.cancelled)
        worker.failed.connect(self.failed)
        worker.finished.connect(self._on_pull_finished)
        self._pull = worker
        start_worker(worker, self)
        self.pulling_changed.emit(name)

    def cancel(self) -> None:
        """Stops the download after its current read; the partial is kept, so Download resumes it."""
        if self._pull is not None:
            self._pull.stop()

    def remove(self, name: str) -> int | None:
        """Deletes `name`'s files; the bytes freed, or None (and `failed`) when it could not be.
        In the GUI thread: a few unlink calls, whatever the model's size."""
        if name == self.pulling:
            self.failed.emit(f"{name} is downloading: cancel it before deleting it.")
            return None
        try:
            freed = remove_pulled(name)
        except AuralError as exc:
            self.failed.emit(str(exc))
            return None
        self.removed.emit(name, freed)
        self.refresh()
        return freed

    @staticmethod
    def packaged() -> set[str]:
        """The names of the models that came with Aural, installed (pip packages or the bundle)."""
        return {entry.name for entry in list_models() if entry.installed}

    def speed_texts(self) -> dict[str, tuple[str, str]]:
        """(text, tooltip) of each row's speed on this machine."""
        return {r.name: self.speeds.text(r.name, r.entry.parameters if r.entry else None) for r in self.rows}

    def record_run(self, model: str, rtf: float) -> None:
        """A file that `model` (a spec) transcribed at `rtf`: its measured speed from now on."""
        self.speeds.record_run(model, rtf)
        self.listed.emit()

    def measure_speed(self) -> None:
        """Times the loaded model's encoder once per model and device, if the catalog knows its size."""
        model, loaded = self._models.model, self._models.loaded
        if model is None or loaded is None or self._probing is not None:
            return
        spec, _device = loaded
        ref = self.speeds.reference
        if ref is not None and (ref.model, ref.device) == (spec, model.device):
            return
        entry = load_catalog().get(spec)
        if entry is None or not entry.parameters:
            return
        probe = EncoderProbe(model)
        probe.measured.connect(self._on_measured)
        probe.failed.connect(self._on_probe_failed)
        probe.finished.connect(self._on_probe_finished)
        self._probing = (spec, model.device, entry.parameters)
        start_worker(probe, self)

    def shutdown(self) -> None:
        """Stops a download (its partial is kept); a conversion or an encoder pass under way is waited for."""
        self.cancel()
        stop_threads(self)

    @Slot(list)
    def _on_listed(self, rows: list) -> None:
        self.rows = rows
        self.listed.emit()

    @Slot(float)
    def _on_measured(self, seconds: float) -> None:
        self.speeds.reference = SpeedReference(*self._probing, seconds)
        self.listed.emit()

    @Slot(str)
    def _on_probe_failed(self, message: str) -> None:
        logger.warning("the speed probe failed: %s", message)  # the speed column stays "—"

    @Slot()
    def _on_probe_finished(self) -> None:
        self._probing = None

    @Slot()
    def _on_pull_finished(self) -> None:
        self._pull = None
        self.pulling_changed.emit("")
        self.refresh()
