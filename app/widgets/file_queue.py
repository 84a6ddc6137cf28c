"""The file queue: one row per file with its status, progress, ETA, RTF and a cancel button."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QKeyEvent, QKeySequence, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import (QAbstractItemView, QHeaderView, QProgressBar, QPushButton, QTreeWidget,
                               QTreeWidgetItem, QWidget)

from ..jobs import FileJob, JobStatus

__all__ = ["EMPTY_HINT", "FileQueueView", "format_duration"]

_FILE, _STATUS, _PROGRESS, _ETA, _RTF, _CANCEL = range(6)
_HEADERS = ("File", "Status", "Progress", "ETA", "RTF", "")
EMPTY_HINT = "Drop audio or video files here, or use File → Open (Ctrl+O)."
# Drawn word-wrapped and centred in the empty list, so a narrow window still shows all of it.
HINT_FLAGS = Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap
_CANCEL_KEYS = (Qt.Key.Key_Delete, Qt.Key.Key_Backspace)


def format_duration(seconds: float | None) -> str:
    """`m:ss` (or `h:mm:ss`); an em dash when unknown."""
    if seconds is None:
        return "—"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class FileQueueView(QTreeWidget):
    """Rows keyed by job id; selecting a row asks for that file's result. Delete (or Backspace) cancels
    the selected file, as its Cancel button does, so the keyboard reaches every action."""

    cancel_requested = Signal(int)  # job id
    job_selected = Signal(int)  # job id

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("fileQueue")
        self.setHeaderLabels(_HEADERS)
        self.setRootIsDecorated(False)
        self.setUniformRowHeights(True)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setAcceptDrops(False)  # drops are the window's
        header = self.header()
        header.setSectionResizeMode(_FILE, QHeaderView.ResizeMode.Stretch)
        for column in (_STATUS, _PROGRESS, _ETA, _RTF, _CANCEL):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(False)
        self._rows: dict[int, QTreeWidgetItem] = {}
        self._jobs: dict[int, FileJob] = {}
        self._ticker = QTimer(self, interval=1000, timeout=self._tick)  # ETAs count down between reports
        self.currentItemChanged.connect(self._on_current_changed)

    def status_text(self, job_id: int) -> str:
        return self._rows[job_id].text(_STATUS)

    def status_tip(self, job_id: int) -> str:
        return self._rows[job_id].toolTip(_STATUS)

    def cancel_button(self, job_id: int) -> QPushButton:
        return self.itemWidget(self._rows[job_id], _CANCEL)

    @Slot(object)
    def add_job(self, job: FileJob) -> None:
        item = QTreeWidgetItem([job.path.name, "", "", "", "", ""])
        item.setToolTip(_FILE, str(job.path))
        item.setData(_FILE, Qt.ItemDataRole.UserRole, job.id)
        self.addTopLevelItem(item)
        self._rows[job.id] = item
        self._jobs[job.id] = job
        bar = QProgressBar()
        bar.setTextVisible(True)
        bar.setMaximumHeight(16)
        self.setItemWidget(item, _PROGRESS, bar)
        cancel = QPushButton("Cancel")
        cancel.setObjectName("cancelJob")
        cancel.setToolTip(f"Cancel this file ({QKeySequence(Qt.Key.Key_Delete).toString()} on the selected row)")
        cancel.clicked.connect(lambda: self.cancel_requested.emit(job.id))
        self.setItemWidget(item, _CANCEL, cancel)
        self.update_job(job)
        if self.currentItem() is None:
            self.setCurrentItem(item)

    @Slot(object)
    def update_job(self, job: FileJob) -> None:
        item = self._rows[job.id]
        # A failure's reason can be a paragraph: the column says "Failed" and keeps Progress, ETA, RTF
        # and Cancel in view; the reason is in the tooltip and the result pane.
        item.setText(_STATUS, job.status.value)
        failed = job.status is JobStatus.FAILED
        item.setToolTip(_STATUS, f"{job.status.value}: {job.error}" if failed else job.status.value)
        item.setText(_ETA, format_duration(job.eta_s) if job.status is JobStatus.RUNNING else "")
        item.setText(_RTF, f"{job.timings.rtf:.2f}" if job.timings is not None else "")
        self._show_progress(self.itemWidget(item, _PROGRESS), job)
        self.itemWidget(item, _CANCEL).setEnabled(
            job.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.IDENTIFYING))
        if job.status is JobStatus.RUNNING and not self._ticker.isActive():
            self._ticker.start()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        item = self.currentItem()
        if event.key() in _CANCEL_KEYS and item is not None:
            job_id = item.data(_FILE, Qt.ItemDataRole.UserRole)
            if self.cancel_button(job_id).isEnabled():
                self.cancel_requested.emit(job_id)
            event.accept()
            return
        super().keyPressEvent(event)

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if self.topLevelItemCount() == 0:
            painter = QPainter(self.viewport())
            painter.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(self.viewport().rect().adjusted(12, 12, -12, -12), HINT_FLAGS, EMPTY_HINT)

    def _tick(self) -> None:
        running = [job for job in self._jobs.values() if job.status is JobStatus.RUNNING]
        for job in running:
            self.update_job(job)
        if not running:
            self._ticker.stop()

    @staticmethod
    def _show_progress(bar: QProgressBar, job: FileJob) -> None:
        fraction = job.fraction
        if (job.status is JobStatus.RUNNING and fraction is None) or job.status is JobStatus.IDENTIFYING:
            bar.setRange(0, 0)  # busy: the first 30 s window is still being decoded, or the speakers found
            return
        bar.setRange(0, 1000)
        bar.setValue(1000 if job.status is JobStatus.DONE else round(1000 * (fraction or 0.0)))

    def _on_current_changed(self, current: QTreeWidgetItem | None, _previous) -> None:
        if current is not None:
            self.job_selected.emit(current.data(_FILE, Qt.ItemDataRole.UserRole))
