"""The caption (presentation) window: the latest captions in large text on a dark background."""

from __future__ import annotations

import html
from dataclasses import dataclass

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QColor, QResizeEvent
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

__all__ = ["CaptionLook", "CaptionWindow"]

# Characters of committed text kept on screen: about three lines at the default size; older text
# scrolls off the top, as on broadcast captions.
_TAIL_CHARS = 180
# Font height as a share of the window height, so resizing the window scales the captions.
_FONT_SHARE = 0.11
_MIN_FONT_PX = 18
# The tentative tail's colour: this share of the way from the background to the text colour.
_TAIL_SHARE = 0.6


@dataclass(frozen=True)
class CaptionLook:
    """How the caption window looks (Preferences → Caption window).

    Attributes:
        font_family: a font family name; "" for the application's font.
        font_px: a fixed font size in pixels; 0: a share of the window's height.
        on_top: the window stays above the others (captions over a video call or a slide show).
        text_color, background: `#rrggbb`.
    """

    font_family: str = ""
    font_px: int = 0
    on_top: bool = False
    text_color: str = "#ffffff"
    background: str = "#07090c"

    @property
    def tail_color(self) -> str:
        """The tentative tail's colour, between the background and the text colour."""
        return _mix(QColor(self.background), QColor(self.text_color), _TAIL_SHARE)


def _tail(text: str, limit: int) -> str:
    """The end of text, at most `limit` characters, cut at a word boundary."""
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return cut.partition(" ")[2] or cut


class CaptionWindow(QWidget):
    """A separate, resizable top-level window for an audience or a second screen."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setObjectName("captionWindow")
        self.setWindowTitle("Aural captions")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.resize(960, 300)
        self._committed = ""
        self._partial = ""
        self._partial_spaced = True
        self._look = CaptionLook()
        self._label = QLabel(self)
        self._label.setObjectName("captionText")
        self._label.setWordWrap(True)
        self._label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom)
        self._label.setTextFormat(Qt.TextFormat.RichText)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.addWidget(self._label)

    def text(self) -> str:
        return self._label.text()

    def append_commit(self, text: str, spaced: bool = True) -> None:
        """`spaced`: a space separates it from the text before (not between Chinese characters)."""
        separator = " " if spaced and self._committed else ""
        self._committed = _tail(f"{self._committed}{separator}{text.strip()}".strip(), _TAIL_CHARS)
        self._partial = ""
        self._partial_spaced = True
        self._render()

    def set_partial(self, text: str, spaced: bool = True) -> None:
        self._partial = text.strip()
        self._partial_spaced = spaced
        self._render()

    @Slot()
    def clear_captions(self) -> None:
        self._committed = self._partial = ""
        self._render()

    def set_look(self, look: CaptionLook) -> None:
        self._look = look
        self._fit_font(self.height())
        self.setStyleSheet(f"#captionWindow {{ background: {look.background}; }} "
                           f"#captionText {{ color: {look.text_color}; }}")
        self._render()
        shown = self.isVisible()
        self.setWindowFlag(Qt.WindowType.WindowStaysOnTopHint, look.on_top)
        if shown:
            self.show()  # changing a window flag hides the window

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._fit_font(event.size().height())
        super().resizeEvent(event)

    def _fit_font(self, height: int) -> None:
        font = self._label.font()
        if self._look.font_family:
            font.setFamily(self._look.font_family)
        font.setPixelSize(self._look.font_px or max(_MIN_FONT_PX, int(height * _FONT_SHARE)))
        self._label.setFont(font)

    def _render(self) -> None:
        separator = " " if self._partial_spaced and self._committed else ""
        partial = (f'{separator}<span style="color:{self._look.tail_color}">{html.escape(self._partial)}</span>'
                   if self._partial else "")
        self._label.setText(f"{html.escape(self._committed)}{partial}")


def _mix(a: QColor, b: QColor, share: float) -> str:
    """The colour `share` of the way from `a` to `b`, as `#rrggbb`."""
    mixed = [round(x + (y - x) * share) for x, y in zip(a.getRgb()[:3], b.getRgb()[:3])]
    return QColor(*mixed).name()
