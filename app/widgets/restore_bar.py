"""A bar above the captions offering to restore the text of a session that did not end cleanly.

Not a dialog: the offer must not block a user who wants to start captioning at once.
"""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

__all__ = ["RestoreBar"]


class RestoreBar(QFrame):
    """Shows one offer at a time; hidden when there is none."""

    restore_requested = Signal()
    discard_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("restoreBar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._label = QLabel()
        self._label.setWordWrap(True)
        self.restore_button = QPushButton("Restore")
        self.restore_button.setToolTip("Put the saved text back into the captions")
        self.restore_button.clicked.connect(self.restore_requested)
        self.discard_button = QPushButton("Discard")
        self.discard_button.setToolTip("Do not offer this text again (the file stays in the sessions folder)")
        self.discard_button.clicked.connect(self.discard_requested)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addWidget(self._label, 1)
        layout.addWidget(self.restore_button)
        layout.addWidget(self.discard_button)
        self.hide()

    def message(self) -> str:
        """The offer shown ("" when none)."""
        return self._label.text()

    @Slot(str)
    def show_offer(self, message: str) -> None:
        self._label.setText(message)
        self.show()

    @Slot()
    def clear_offer(self) -> None:
        self._label.clear()
        self.hide()
