"""One file's result: its timestamped segments, the selected segment's time, its RTF and exports; once it is
done, its audio plays under the text (the line being heard marked, a click on a line plays from there)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from aural.engine.text.writers import format_timestamp

from ..jobs import FileJob, JobStatus
from .file_queue import format_duration
from .player import TranscriptPlayer, mark_row, row_at

__all__ = ["EXPORT_FORMATS", "FileResultView"]

EXPORT_FORMATS = ("txt", "srt", "vtt", "json")
_START, _END, _SPEAKER, _TEXT = range(4)


class FileResultView(QWidget):
    export_requested = Signal(str)  # format
    history_requested = Signal(int)  # the shown file's id in the library: open it there (playback, edits)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("fileResult")
        self._summary = QLabel("Select a file in the list to see its transcript.")
        self._summary.setObjectName("resultSummary")
        self._summary.setWordWrap(True)
        self._selected = QLabel("")
        self._selected.setObjectName("segmentTime")
        self._table = QTableWidget(0, 4)
        self._table.setHorizontalHeaderLabels(("Start", "End", "Speaker", "Text"))
        self._table.setColumnHidden(_SPEAKER, True)  # shown once a transcript names its speakers
        self._table.verticalHeader().setVisible(False)
        self._table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self._table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self._table.setWordWrap(True)
        self._table.setAlternatingRowColors(True)
        header = self._table.horizontalHeader()
        header.setSectionResizeMode(_START, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(_END, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(_SPEAKER, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(_TEXT, QHeaderView.ResizeMode.Stretch)
        self._table.currentCellChanged.connect(self._show_time)
        self._table.itemClicked.connect(lambda item: self.player.seek(item.data(Qt.ItemDataRole.UserRole)[0]))
        self.player = TranscriptPlayer(self)
        self.player.position_changed.connect(self._mark_heard)
        self._audio: object = None  # the file loaded in the player
        self._heard = -1  # the row marked as being played
        self._exports = {fmt: QPushButton(fmt.upper()) for fmt in EXPORT_FORMATS}
        self.history_button = QPushButton("Edit in History…")
        self.history_button.setToolTip("Open this transcript in the History tab: edit lines, rename speakers")
        self.history_button.clicked.connect(lambda: self.history_requested.emit(self._history_id))
        self._history_id: int | None = None
        self.history_button.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self._selected, 1)
        buttons.addWidget(self.history_button)
        buttons.addWidget(QLabel("Export:"))
        for fmt, button in self._exports.items():
            button.setToolTip(f"Save this transcript as {fmt.upper()}")
            button.clicked.connect(lambda _=False, f=fmt: self.export_requested.emit(f))
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._summary)
        layout.addWidget(self._table, 1)
        layout.addWidget(self.player)
        layout.addLayout(buttons)
        self._set_exportable(False)

    @property
    def table(self) -> QTableWidget:
        return self._table

    def summary_text(self) -> str:
        return self._summary.text()

    def selected_time_text(self) -> str:
        return self._selected.text()

    def export_button(self, fmt: str) -> QPushButton:
        return self._exports[fmt]

    @Slot(object)
    def show_job(self, job: FileJob) -> None:
        """Replace the view with `job`'s segments and summary."""
        self._table.setRowCount(0)
        self._heard = -1
        self._selected.clear()
        self._table.setColumnHidden(_SPEAKER, not any(getattr(s, "speaker", None) for s in job.segments))
        for segment in job.segments:
            self.append_segment(segment)
        self.set_summary(job)

    @Slot(object)
    def append_segment(self, segment) -> None:
        row = self._table.rowCount()
        self._table.insertRow(row)
        for column, text in ((_START, format_timestamp(segment.start)), (_END, format_timestamp(segment.end)),
                             (_SPEAKER, getattr(segment, "speaker", None) or ""), (_TEXT, segment.text.strip())):
            item = QTableWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, (segment.start, segment.end))
            self._table.setItem(row, column, item)
        self._table.resizeRowToContents(row)

    @Slot(object)
    def set_summary(self, job: FileJob) -> None:
        parts = [f"<b>{html.escape(job.path.name)}</b>", job.status.value]
        if job.info is not None:
            parts.append(f"{format_duration(job.info.duration_s)} · language {job.info.language}")
        if job.timings is not None:
            t = job.timings
            parts.append(f"RTF {t.rtf:.2f} ({t.wall_s:.1f} s) · {t.backend}/{t.device}, KV on {t.kv_mode}")
        if job.status is JobStatus.FAILED:
            parts.append(f'<span style="color:#e5484d">{html.escape(job.error)}</span>')
        self._summary.setText(" · ".join(parts))
        self._set_exportable(bool(job.segments))
        self._history_id = job.history_id
        self.history_button.setEnabled(job.history_id is not None)
        audio = job.path if job.status is JobStatus.DONE and job.path.is_file() else None
        if audio != self._audio:
            self._audio = audio
            self.player.load(audio)

    def heard_line(self) -> int:
        """The row marked as being played, -1 when none."""
        return self._heard

    @Slot(float)
    def _mark_heard(self, seconds: float) -> None:
        row = row_at(self._table, seconds, lambda item: item.data(Qt.ItemDataRole.UserRole)[0])
        if row != self._heard:
            mark_row(self._table, self._heard, row)
            self._heard = row

    def _set_exportable(self, enabled: bool) -> None:
        for button in self._exports.values():
            button.setEnabled(enabled)

    def _show_time(self, row: int, _column: int, _previous_row: int, _previous_column: int) -> None:
        item = self._table.item(row, _START) if row >= 0 else None
        if item is None:
            self._selected.clear()
            return
        start, end = item.data(Qt.ItemDataRole.UserRole)
        self._selected.setText(f"Segment {row + 1}: {format_timestamp(start)} → {format_timestamp(end)} "
                               f"({end - start:.1f} s)")
