"""The Models dialog: one row per catalog model with its languages, size, what it holds on this computer and
how fast it would run here, and Download / Cancel / Delete with the download's progress.

A passive view: it shows what `set_rows`, `set_pulling` and `set_progress` give it and asks for work
through its signals; the main window connects those to `library.ModelLibrary`.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QDialogButtonBox, QHBoxLayout, QHeaderView,
                               QLabel, QProgressBar, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

__all__ = ["ModelsDialog", "progress_text", "size_text"]

_NAME, _LANGUAGES, _PARAMETERS, _SIZE, _STATE, _SPEED, _PROGRESS, _ACTIONS = range(8)
_HEADERS = ("Model", "Languages", "Parameters", "Download", "On this computer", "Speed here", "Progress", "")
# (type, what the picker says): the types `aural models pull --type` converts to, smallest loss first.
_WTYPES = (("f16", "f16 (as published)"), ("q8_0", "q8_0 (about half the memory)"),
           ("q5_0", "q5_0 (about a third)"), ("q4_0", "q4_0 (smallest, least accurate)"))
_STAGES = {"verify": "verifying the checksums…", "convert": "converting to GGUF…"}
_ERROR_MARK = "⚠"


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def progress_text(step, mib_per_s: float) -> str:
    """One line for a `store.PullProgress`: bytes and speed while downloading, else the stage."""
    if step.stage != "download":
        return f"{step.name}: {_STAGES.get(step.stage, step.stage)}"
    total = f" / {size_text(step.total_bytes)}" if step.total_bytes else ""
    return f"{step.name}: downloading {size_text(step.done_bytes)}{total} · {mib_per_s:.1f} MiB/s"


def _languages(entry) -> str:
    if entry is None or entry.languages is None:
        return "?"
    return "English only" if entry.languages == 1 else f"multilingual ({entry.languages})"


def _state(row, packaged: bool) -> str:
    """What `row` (a `store.CatalogModel`) holds in the cache; `packaged`: a model of that name came with Aural."""
    if row.cached:
        return f"installed ({', '.join(c.wtype for c in row.cached)}) · {size_text(row.disk_bytes)}"
    if row.downloaded:
        return f"downloaded, converts on first use · {size_text(row.disk_bytes)}"
    if row.partial_bytes:
        return f"not installed · {size_text(row.partial_bytes)} kept, Download resumes"
    return "included with Aural" if packaged else "not installed"


class ModelsDialog(QDialog):
    """Modeless: captions and files go on while a model downloads."""

    download_requested = Signal(str, str)  # name, weight type
    cancel_requested = Signal()
    delete_requested = Signal(str)  # name

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("modelsDialog")
        self.setWindowTitle("Models")
        self.resize(1240, 500)  # every built-in row and the whole progress text in view
        self._rows: list = []
        self._speeds: dict[str, tuple[str, str]] = {}
        self._packaged: set[str] = set()
        self._names: list[str] = []  # the rows the table's cell widgets were made for
        self._pulling = ""
        self.wtype_combo = QComboBox()
        for wtype, label in _WTYPES:
            self.wtype_combo.addItem(label, wtype)
        self.wtype_combo.setToolTip("The weight type a download is converted to; smaller types take less memory "
                                    "and disk, at some cost in accuracy")
        self.wtype_combo.currentIndexChanged.connect(lambda _index: self._fill())
        self.table = self._table()
        self.message = QLabel()
        self.message.setObjectName("modelsMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._layout()

    def _table(self) -> QTableWidget:
        table = QTableWidget(0, len(_HEADERS))
        table.setHorizontalHeaderLabels(_HEADERS)
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        header = table.horizontalHeader()
        for column in range(len(_HEADERS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(_PROGRESS, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(60)
        return table

    def _layout(self) -> None:
        top = QHBoxLayout()
        intro = QLabel("Whisper models from the catalog (whisper.cpp's files) and Qwen3-ASR (its Hugging Face "
                       "repository). A download can be cancelled and resumed; speeds are measured on this computer.")
        intro.setWordWrap(True)
        top.addWidget(intro, 1)
        top.addWidget(QLabel("Convert to"))
        top.addWidget(self.wtype_combo)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.message)
        layout.addWidget(buttons)

    @property
    def wtype(self) -> str:
        return self.wtype_combo.currentData()

    # -- what tests and the window read --

    def row_index(self, name: str) -> int:
        return next(i for i, row in enumerate(self._rows) if row.name == name)

    def cell_text(self, name: str, column: int) -> str:
        return self.table.item(self.row_index(name), column).text()

    def state_text(self, name: str) -> str:
        return self.cell_text(name, _STATE)

    def speed_text(self, name: str) -> str:
        return self.cell_text(name, _SPEED)

    def progress_bar(self, name: str) -> QProgressBar | None:
        """The bar of the row being pulled; None for the others."""
        return self.table.cellWidget(self.row_index(name), _PROGRESS)

    def button(self, name: str, text: str) -> QPushButton:
        """The row's button labelled `text` ("Download", "Resume", "Convert", "Installed", "Cancel" or "Delete")."""
        actions = self.table.cellWidget(self.row_index(name), _ACTIONS)
        return next(b for b in actions.findChildren(QPushButton) if b.text() == text)

    # -- slots --

    def set_rows(self, rows: list, speeds: dict, packaged: set[str]) -> None:
        """`store.CatalogModel`s, (text, tooltip) of each one's speed by name, and the names of the models
        that came with Aural (the picker offers them without a download)."""
        self._rows, self._speeds, self._packaged = rows, speeds, packaged
        self._fill()

    @Slot(str)
    def set_pulling(self, name: str) -> None:
        """`name` is being downloaded ("" once it has ended): its row offers Cancel, the others wait."""
        self._pulling = name
        self._fill(keep_bar=False)

    @Slot(object, float)
    def set_progress(self, step, mib_per_s: float) -> None:
        """A `store.PullProgress` of the model being pulled."""
        bar = self.progress_bar(step.name) if any(row.name == step.name for row in self._rows) else None
        if bar is None:
            return
        if step.stage == "download" and step.total_bytes:
            bar.setRange(0, 1000)  # per mille: a byte count of several GiB overflows the bar's int
            bar.setValue(round(1000 * step.done_bytes / step.total_bytes))
        else:
            bar.setRange(0, 0)  # busy: checksums and the conversion report no fraction
        bar.setFormat(progress_text(step, mib_per_s).removeprefix(f"{step.name}: "))
        if step.stage == "convert":  # store.pull's conversion runs to its end: no Cancel that would not act
            cancel = self.button(step.name, "Cancel")
            cancel.setEnabled(False)
            cancel.setToolTip("The download is complete; converting to GGUF cannot be interrupted")

    @Slot(str, bool)
    def show_message(self, text: str, error: bool = False) -> None:
        self.message.setText(f"{_ERROR_MARK} {text}" if error else text)

    # -- rows --

    def _fill(self, keep_bar: bool = True) -> None:
        """Shows every row's text and buttons. The cell widgets are made once per list of names and then
        updated in place, so a refresh during a download neither flickers nor resets its bar; the pulling
        row keeps its bar's progress if `keep_bar`."""
        names = [row.name for row in self._rows]
        if names != self._names:
            self._names = names
            self.table.setRowCount(len(names))
            for index, name in enumerate(names):
                self._make_cells(index, name)
            keep_bar = False
        for index, row in enumerate(self._rows):
            self._show_texts(index, row)
            self._show_actions(index, row)
            if row.name != self._pulling:
                self.table.removeCellWidget(index, _PROGRESS)  # only the row being pulled has a bar
            elif not (keep_bar and self.table.cellWidget(index, _PROGRESS)):
                self.table.setCellWidget(index, _PROGRESS, self._new_bar())

    def _make_cells(self, index: int, name: str) -> None:
        for column in range(_PROGRESS):
            self.table.setItem(index, column, QTableWidgetItem())
        cell = QWidget()
        layout = QHBoxLayout(cell)
        layout.setContentsMargins(4, 0, 4, 0)
        primary = QPushButton()
        primary.setObjectName("primary")
        primary.clicked.connect(lambda _checked=False: self._on_primary(name, primary.text()))
        delete = QPushButton("Delete")
        delete.setObjectName("delete")
        delete.setToolTip(f"Delete {name}'s files from this computer")
        delete.clicked.connect(lambda _checked=False: self.delete_requested.emit(name))
        layout.addWidget(primary)
        layout.addWidget(delete)
        self.table.setCellWidget(index, _ACTIONS, cell)

    def _show_texts(self, index: int, row) -> None:
        entry = row.entry
        speed, speed_tip = self._speeds.get(row.name, ("—", ""))
        cells = {
            _NAME: (row.name, f"Licence: {entry.license}" if entry and entry.license else ""),
            _LANGUAGES: (_languages(entry), ""),
            _PARAMETERS: (f"{entry.parameters / 1e6:.0f} M" if entry and entry.parameters else "?", ""),
            _SIZE: (size_text(entry.size) if entry and entry.size else "?", ""),
            _STATE: (_state(row, row.name in self._packaged), ""),
            _SPEED: (speed, speed_tip),
        }
        for column, (text, tooltip) in cells.items():
            item = self.table.item(index, column)
            item.setText(text)
            item.setToolTip(tooltip)

    def _show_actions(self, index: int, row) -> None:
        cell = self.table.cellWidget(index, _ACTIONS)
        primary, delete = cell.findChild(QPushButton, "primary"), cell.findChild(QPushButton, "delete")
        pulling = row.name == self._pulling
        label = "Cancel" if pulling else self._download_label(row)
        primary.setText(label)
        primary.setToolTip("Stop the download; Download resumes it later" if pulling
                           else f"Download {row.name} and convert it to {self.wtype}")
        primary.setEnabled(pulling or (not self._pulling and label != "Installed" and row.entry is not None))
        delete.setEnabled(row.disk_bytes > 0 and not pulling)

    @staticmethod
    def _new_bar() -> QProgressBar:
        bar = QProgressBar()
        bar.setMaximumHeight(18)
        bar.setTextVisible(True)
        bar.setRange(0, 0)  # busy until the pull's first step arrives
        bar.setFormat("starting…")
        return bar

    def _on_primary(self, name: str, label: str) -> None:
        if label == "Cancel":
            self.cancel_requested.emit()
        else:
            self.download_requested.emit(name, self.wtype)

    def _download_label(self, row) -> str:
        if any(c.wtype == self.wtype for c in row.cached):
            return "Installed"
        if row.downloaded:
            return "Convert"  # to another type, from the kept download: no network
        return "Resume" if row.partial_bytes else "Download"
