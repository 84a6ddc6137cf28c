"""The History tab: every kept transcript (engine.history), a search over all of them, and the chosen one's
lines. A search hit opens its transcript with the hit's line selected. A line's text is edited in place
(double-click or F2): the edit is kept in the library, searched and exported, and Revert line gives the
transcribed words back. A file's transcript plays its audio (player.TranscriptPlayer): the line being heard
is marked, and in it the word being heard where the transcription timed its words; a click on a line plays
from there."""

from __future__ import annotations

import html
import time

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QInputDialog, QLabel, QLineEdit,
                               QPushButton, QSplitter, QStyle, QStyledItemDelegate, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from aural.engine.history import Entry, Hit, History, HistoryError, Line, TimedWord
from aural.engine.speakers.weights import installed as speaker_models_installed
from aural.engine.text.writers import format_timestamp

from .file_result import EXPORT_FORMATS
from .file_queue import format_duration
from .player import TranscriptPlayer, mark_row, row_at

__all__ = ["HistoryView"]

_SEARCH_DELAY_MS = 200  # typing pauses this long before the search runs: one query per word, not per key
_LIST_HEADERS = ("When", "Length", "Transcript")
_HIT_HEADERS = ("Transcript", "At", "Match")
# Item data: the transcript's id, the line's start (s), the line's id, an edited line's transcribed words, the
# line's timed words.
_ID, _START, _LINE, _ORIGINAL, _WORDS = (Qt.ItemDataRole.UserRole + k for k in range(5))
_SPEAKER, _TEXT = 2, 3  # the lines' columns a user edits: who speaks (a diarized transcript), the text
_NAME = Qt.ItemDataRole.UserRole + 5  # a speaker cell's name as kept, before the user's edit


class _HeardWordDelegate(QStyledItemDelegate):
    """Paints the text of the line being heard with the word being heard in bold on amber (rich text, which a
    table item does not have); every other cell as usual."""

    def __init__(self, view: HistoryView):
        super().__init__(view)
        self._view = view

    def paint(self, painter, option, index) -> None:
        html_text = self._view.heard_html(index.row()) if index.column() == _TEXT else None
        if html_text is None:
            super().paint(painter, option, index)
            return
        self.initStyleOption(option, index)
        option.text = ""
        option.widget.style().drawControl(QStyle.ControlElement.CE_ItemViewItem, option, painter, option.widget)
        document = QTextDocument()
        document.setDefaultFont(option.font)
        document.setTextWidth(option.rect.width())
        document.setHtml(html_text)
        painter.save()
        painter.translate(option.rect.topLeft())
        document.drawContents(painter)
        painter.restore()


def _item(text: str, entry_id: int, start: float = 0.0) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setData(_ID, entry_id)
    item.setData(_START, start)
    return item


class HistoryView(QWidget):
    """Lists `history` (a History of the GUI thread: its queries take milliseconds) and shows a transcript.

    Signals: export_requested(entry id, format); failed(message) for a library that cannot be written; listed
    once the list has been filled again."""

    export_requested = Signal(int, str)
    speakers_requested = Signal(int)  # the shown transcript's id: find its speakers (a worker, off this thread)
    failed = Signal(str)
    listed = Signal()

    def __init__(self, history: History, parent: QWidget | None = None):
        super().__init__(parent)
        self.history = history
        self.shown_id: int | None = None
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search all transcripts")
        self.search.setClearButtonEnabled(True)
        self._timer = QTimer(self, singleShot=True, interval=_SEARCH_DELAY_MS)
        self._timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(self._timer.start)
        self.list = self._table(_LIST_HEADERS)
        self.list.itemSelectionChanged.connect(self._open_selected)
        self.title = QLabel("Transcripts of files and live sessions are kept here.")
        self.title.setObjectName("historyTitle")
        self.title.setWordWrap(True)
        self.lines = self._table(("Start", "End", "Speaker", "Text"))
        self.lines.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                   | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.lines.itemChanged.connect(self._on_line_edited)
        self.lines.itemSelectionChanged.connect(self._show_line_actions)
        self.lines.itemClicked.connect(self._play_from)
        self.player = TranscriptPlayer(self)
        self.player.position_changed.connect(self._mark_heard)
        self.player.failed.connect(self.failed)
        self._heard = -1  # the row marked as being played
        self._word = -1  # in it, the word being heard (an index of its timed words)
        self.lines.setItemDelegateForColumn(_TEXT, _HeardWordDelegate(self))
        self.revert_button = QPushButton("Revert line")
        self.revert_button.setToolTip("Give the selected line its transcribed words back")
        self.revert_button.clicked.connect(self.revert_selected)
        self.rename_button = QPushButton("Rename…")
        self.rename_button.clicked.connect(self._ask_rename)
        self.speakers_button = QPushButton("Identify speakers")
        self.speakers_button.clicked.connect(lambda: self.speakers_requested.emit(self.shown_id))
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Forget this transcript (a live session's journal file goes with it)")
        self.delete_button.clicked.connect(self.delete_shown)
        self.exports = {fmt: QPushButton(fmt.upper()) for fmt in EXPORT_FORMATS}
        for fmt, button in self.exports.items():
            button.clicked.connect(lambda _=False, f=fmt: self.export_requested.emit(self.shown_id, f))
        self.setLayout(self._layout())
        self._set_actions(False)
        self.refresh()

    @staticmethod
    def _table(headers: tuple[str, ...]) -> QTableWidget:
        table = QTableWidget(0, len(headers))
        table.setHorizontalHeaderLabels(headers)
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setWordWrap(True)
        header = table.horizontalHeader()
        for column in range(len(headers) - 1):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(len(headers) - 1, QHeaderView.ResizeMode.Stretch)
        return table

    def _layout(self) -> QVBoxLayout:
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.search)
        column.addWidget(self.list, 1)
        right = QWidget()
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        # Beside the title, whose text wraps: the button row below is as wide as the window may get narrow.
        heading = QHBoxLayout()
        heading.addWidget(self.title, 1)
        heading.addWidget(self.speakers_button, 0, Qt.AlignmentFlag.AlignTop)
        column.addLayout(heading)
        column.addWidget(self.lines, 1)
        column.addWidget(self.player)
        buttons = QHBoxLayout()
        buttons.addWidget(self.rename_button)
        buttons.addWidget(self.delete_button)
        buttons.addWidget(self.revert_button)
        buttons.addStretch(1)
        buttons.addWidget(QLabel("Export:"))
        for button in self.exports.values():
            buttons.addWidget(button)
        column.addLayout(buttons)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        split.setSizes([400, 600])  # the hits' snippets need room from the start
        layout = QVBoxLayout()
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        return layout

    @Slot()
    def refresh(self) -> None:
        """The list again: every transcript, or the hits of the search box's words."""
        self._timer.stop()
        query = self.search.text().strip()
        self.list.setRowCount(0)
        self.list.setHorizontalHeaderLabels(_HIT_HEADERS if query else _LIST_HEADERS)
        if query:
            for hit in self.history.search(query):
                self._add_hit(hit)
        else:
            for entry in self.history.entries():
                self._add_entry(entry)
        self._fit_rows()
        self.listed.emit()

    def _add_entry(self, entry: Entry) -> None:
        row = self.list.rowCount()
        self.list.insertRow(row)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created))
        for column, text in enumerate((when, format_duration(entry.duration_s), entry.title)):
            self.list.setItem(row, column, _item(text, entry.id))

    def _add_hit(self, hit: Hit) -> None:
        row = self.list.rowCount()
        self.list.insertRow(row)
        snippet = html.escape(hit.marked("\x02", "\x03")).replace("\x02", "<b>").replace("\x03", "</b>")
        for column, text in enumerate((hit.entry.title, format_duration(hit.start))):
            self.list.setItem(row, column, _item(text, hit.entry.id, hit.start))
        self.list.setItem(row, 2, _item("", hit.entry.id, hit.start))
        label = QLabel(snippet)  # rich text: the matched words in bold
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setWordWrap(True)
        self.list.setCellWidget(row, 2, label)

    def _fit_rows(self) -> None:
        """Row heights once the columns have their widths: a hit's snippet (a label, which the table does not
        measure) wraps whole."""
        self.list.resizeRowsToContents()
        for row in range(self.list.rowCount()):
            label = self.list.cellWidget(row, 2)
            if label is not None:
                height = label.heightForWidth(self.list.columnWidth(2)) + 4
                self.list.setRowHeight(row, max(self.list.rowHeight(row), height))

    def hit_text(self, row: int) -> str:
        """A search hit's snippet as shown (rich text), for tests and screenshots."""
        label = self.list.cellWidget(row, 2)
        return label.text() if label is not None else ""

    @Slot()
    def _open_selected(self) -> None:
        items = self.list.selectedItems()
        if items:
            self.open(items[0].data(_ID), items[0].data(_START))

    def open(self, entry_id: int, at_s: float = 0.0) -> None:
        """Shows a transcript with the line that holds `at_s` (seconds) selected and scrolled to."""
        entry = self.history.entry(entry_id)
        lines = self.history.lines(entry_id)
        self.shown_id = entry_id
        self._show_title(entry)
        self.lines.setRowCount(0)
        self._heard = self._word = -1
        self.lines.setColumnHidden(_SPEAKER, not any(line.speaker for line in lines))
        for line in lines:
            self._add_line(line)
        self._set_actions(True)
        self.player.load(entry.audio)
        self.player.seek(at_s)
        row = next((k for k, line in enumerate(lines) if line.start <= at_s < max(line.end, line.start + 1e-3)),
                   next((k for k, line in enumerate(lines) if line.start >= at_s), 0))
        if lines:
            self.lines.selectRow(row)
            self.lines.scrollToItem(self.lines.item(row, 0), QAbstractItemView.ScrollHint.PositionAtCenter)

    def _show_title(self, entry: Entry) -> None:
        self.title.setText(f"<b>{html.escape(entry.title)}</b> · {format_duration(entry.duration_s)} · "
                           f"{html.escape(entry.model)}{' · language ' + entry.language if entry.language else ''}")

    def _add_line(self, line: Line) -> None:
        row = self.lines.rowCount()
        self.lines.insertRow(row)
        self.lines.blockSignals(True)  # filling the table is no edit
        texts = (format_timestamp(line.start), format_timestamp(line.end), line.speaker or "", line.text)
        for column, text in enumerate(texts):
            item = _item(text, self.shown_id, line.start)
            item.setData(_LINE, line.id)
            item.setData(_WORDS, line.timed_words)
            if column not in (_SPEAKER, _TEXT) or (column == _SPEAKER and not line.speaker):
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
            self.lines.setItem(row, column, item)
        if line.speaker:
            speaker = self.lines.item(row, _SPEAKER)
            speaker.setData(_NAME, line.speaker)
            speaker.setToolTip("Double-click to rename this speaker in the whole transcript")
        self.lines.blockSignals(False)
        self._mark_edited(row, line.original)
        self.lines.resizeRowToContents(row)

    def _mark_edited(self, row: int, original: str | None) -> None:
        """An edited line in italics, its transcribed words in the tooltip."""
        item = self.lines.item(row, _TEXT)
        self.lines.blockSignals(True)
        font = item.font()
        font.setItalic(original is not None)
        item.setFont(font)
        item.setData(_ORIGINAL, original)
        item.setToolTip(f"Edited. Transcribed: {original}" if original is not None else "Double-click to edit")
        self.lines.blockSignals(False)

    @Slot(QTableWidgetItem)
    def _on_line_edited(self, item: QTableWidgetItem) -> None:
        if item.column() == _SPEAKER and self.shown_id is not None:
            self.rename_speaker(item.data(_NAME), item.text())
            return
        if item.column() != _TEXT or self.shown_id is None:
            return
        self._guarded(self.history.edit, item.data(_LINE), item.text())
        self._restyle(item.row())

    def _restyle(self, row: int) -> None:
        line = self.history.line(self.lines.item(row, _TEXT).data(_LINE))
        self.lines.blockSignals(True)
        self.lines.item(row, _TEXT).setText(line.text)
        self.lines.item(row, _TEXT).setData(_WORDS, line.timed_words)  # an edit's words have no times
        self.lines.blockSignals(False)
        self._mark_edited(row, line.original)
        self._show_line_actions()

    def rename_speaker(self, speaker: str, name: str) -> None:
        """Names `speaker` `name` on every line of the shown transcript (an empty name changes nothing)."""
        if name.strip():
            self._guarded(self.history.rename_speaker, self.shown_id, speaker, name)
        kept = {line.id: line.speaker for line in self.history.lines(self.shown_id)}
        self.lines.blockSignals(True)
        for row in range(self.lines.rowCount()):
            item = self.lines.item(row, _SPEAKER)
            if item.data(_NAME) is not None:
                item.setText(kept[item.data(_LINE)])
                item.setData(_NAME, kept[item.data(_LINE)])
        self.lines.blockSignals(False)

    def edit_line(self, row: int, text: str) -> None:
        """What a user's edit of line `row` does (tests and scripts)."""
        self.lines.item(row, _TEXT).setText(text)

    @Slot()
    def revert_selected(self) -> None:
        row = self.selected_line()
        if row >= 0:
            self._guarded(self.history.revert, self.lines.item(row, _TEXT).data(_LINE))
            self._restyle(row)

    @Slot()
    def _show_line_actions(self) -> None:
        row = self.selected_line()
        self.revert_button.setEnabled(row >= 0 and self.lines.item(row, _TEXT).data(_ORIGINAL) is not None)

    @Slot(QTableWidgetItem)
    def _play_from(self, item: QTableWidgetItem) -> None:
        self.player.seek(item.data(_START))

    @Slot(float)
    def _mark_heard(self, seconds: float) -> None:
        """Marks the line that holds `seconds` (the last one started before it, between lines), and its word."""
        row = row_at(self.lines, seconds, lambda item: item.data(_START))
        words = self._words(row)
        word = max((k for k, w in enumerate(words) if w.start <= seconds), default=-1)
        if (row, word) == (self._heard, self._word):
            return
        mark_row(self.lines, self._heard, row)
        if row != self._heard and row >= 0 and self.player.playing:
            self.lines.scrollToItem(self.lines.item(row, 0))
        self._heard, self._word = row, word
        self.lines.viewport().update()

    def _words(self, row: int) -> tuple[TimedWord, ...]:
        return self.lines.item(row, _TEXT).data(_WORDS) or () if row >= 0 else ()

    def heard_word(self) -> TimedWord | None:
        """The word marked as being heard, None when none is (no timed words, or between them)."""
        words = self._words(self._heard)
        return words[self._word] if 0 <= self._word < len(words) else None

    def heard_html(self, row: int) -> str | None:
        """The rich text of line `row` with the word being heard marked, None unless it is the heard line."""
        words = self._words(row)
        if row != self._heard or not 0 <= self._word < len(words):
            return None
        return "".join(f'<span style="background-color: rgba(255, 196, 0, 150); font-weight: bold">'
                       f"{html.escape(w.word)}</span>" if k == self._word else html.escape(w.word)
                       for k, w in enumerate(words)).strip()

    def heard_line(self) -> int:
        """The row marked as being played, -1 when none."""
        return self._heard

    def selected_line(self) -> int:
        rows = self.lines.selectionModel().selectedRows()
        return rows[0].row() if rows else -1

    def _set_actions(self, enabled: bool) -> None:
        for button in (self.rename_button, self.delete_button, *self.exports.values()):
            button.setEnabled(enabled)
        audio = enabled and self.shown_id is not None and self.history.entry(self.shown_id).audio is not None
        models = speaker_models_installed()
        self.speakers_button.setEnabled(audio and models)
        self.speakers_button.setToolTip(
            "Find who spoke when from the audio, and name each line's speaker" if models
            else "Needs the speaker models: run `aural models pull speakers` (a 90 MB download)")
        self._show_line_actions()

    def _ask_rename(self) -> None:
        if self.shown_id is None:
            return
        title, ok = QInputDialog.getText(self, "Rename transcript", "Title:",
                                         text=self.history.entry(self.shown_id).title)
        if ok:
            self.rename(self.shown_id, title)

    def rename(self, entry_id: int, title: str) -> None:
        self._guarded(self.history.rename, entry_id, title)
        self.refresh()
        if self.shown_id == entry_id:
            self._show_title(self.history.entry(entry_id))  # the lines and the playback stay as they are

    @Slot()
    def delete_shown(self) -> None:
        if self.shown_id is None:
            return
        self._guarded(self.history.delete, self.shown_id)
        self.shown_id = None
        self.lines.setRowCount(0)
        self.player.load(None)
        self.title.setText("Deleted.")
        self._set_actions(False)
        self.refresh()

    def _guarded(self, action, *args) -> None:
        try:
            action(*args)
        except HistoryError as e:
            self.failed.emit(str(e))
