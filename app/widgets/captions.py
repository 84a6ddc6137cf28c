"""The live captions: committed text in normal weight, the tentative tail dimmed, auto-scrolling."""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit

__all__ = ["EMPTY_HINT", "HINT_FLAGS", "CaptionsView"]

EMPTY_HINT = "Press Start (Ctrl+R) to caption the microphone, or drop audio files here."
# QTextEdit's own placeholder is drawn on one line and cut off in a narrow pane: this one wraps.
HINT_FLAGS = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap

# How close to the bottom (pixels) still counts as "following the captions".
_FOLLOW_SLACK_PX = 4


class CaptionsView(QTextEdit):
    """Read-only captions. Follows new text while the view is scrolled to the bottom; once the user
    scrolls up it stays where it is until they scroll back down."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("captions")
        self.setReadOnly(True)
        self.setAcceptDrops(False)  # files dropped here go to the window's queue, not into the text
        self._partial_at = 0  # document position where the tentative tail begins
        self._partial = ""
        self._partial_spaced = True
        self._committed = ""
        self._follow = True
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        self.verticalScrollBar().rangeChanged.connect(self._keep_following)

    @property
    def following(self) -> bool:
        return self._follow

    def committed_text(self) -> str:
        return self._committed

    def partial_text(self) -> str:
        return self._partial

    def append_commit(self, text: str, spaced: bool = True) -> None:
        """Appends committed text; `spaced`: a space separates it from the text before (not between
        Chinese or Japanese characters)."""
        text = text.strip()
        if text:
            self._committed += (" " if spaced and self._committed else "") + text
        self._partial = ""
        self._replace_tail(text, dimmed=False, spaced=spaced)
        self._partial_at = self.document().characterCount() - 1

    def set_partial(self, text: str, spaced: bool = True) -> None:
        self._partial = text.strip()
        self._replace_tail(self._partial, dimmed=True, spaced=spaced)

    @Slot()
    def clear_captions(self) -> None:
        self._committed = ""
        self._partial = ""
        self._partial_at = 0
        self.clear()
        self._follow = True

    def hint_rect(self):
        """Where the empty-state hint is drawn: the text area, inside the document's margin."""
        margin = round(self.document().documentMargin())
        return self.viewport().rect().adjusted(margin, margin, -margin, -margin)

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if self.document().isEmpty():
            painter = QPainter(self.viewport())
            painter.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(self.hint_rect(), HINT_FLAGS, EMPTY_HINT)

    def _replace_tail(self, text: str, *, dimmed: bool, spaced: bool) -> None:
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._partial_at)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        role = QPalette.ColorRole.PlaceholderText if dimmed else QPalette.ColorRole.Text
        fmt.setForeground(QColor(self.palette().color(role)))
        fmt.setFontItalic(dimmed)
        separator = " " if text and spaced and self._partial_at > 0 else ""
        cursor.insertText(separator + text, fmt)

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - _FOLLOW_SLACK_PX

    def _keep_following(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)
