"""Playback of a transcript's audio (QtMultimedia): play/pause, a position slider, the time, and the speed.

    player = TranscriptPlayer()
    player.load(Path("talk.mp3"))        # None: nothing to play (a live session keeps no audio)
    player.position_changed.connect(lambda s: ...)   # seconds, several times a second while playing
    player.seek(12.5); player.toggle(); player.set_rate(1.5)

Keys, as media players have them, wherever the focus is inside `shortcut_parent`: K plays or pauses, J and L
go back and forward 5 s; the speed box takes 0.5x to 2x. QMediaPlayer decodes on its own threads, so the
GUI thread only receives positions.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QLoggingCategory, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QBrush, QColor, QKeySequence, QShortcut

# Loading QtMultimedia probes for PipeWire and warns on stderr where there is none (PulseAudio-only
# systems, a second launch handing its files over): noise for the user, not a fault.
QLoggingCategory.setFilterRules("qt.multimedia.symbolsresolver=false")
from PySide6.QtMultimedia import QAudioOutput, QMediaPlayer  # noqa: E402
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPushButton, QSlider, QTableWidget,  # noqa: E402
                               QWidget)

from .file_queue import format_duration  # noqa: E402

__all__ = ["HEARD", "RATES", "SKIP_S", "TranscriptPlayer", "mark_row", "row_at"]

RATES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
SKIP_S = 5.0  # J and L
HEARD = QColor(255, 196, 0, 70)  # the background of the line being played: a translucent amber on either theme


def row_at(table: QTableWidget, seconds: float, start_of) -> int:
    """The row being heard at `seconds`: the last one starting at or before it (between lines too); -1 before
    the first. `start_of(item)` reads a row's start (s) from its first cell."""
    row = -1
    for k in range(table.rowCount()):
        if start_of(table.item(k, 0)) > seconds:
            break
        row = k
    return row


def mark_row(table: QTableWidget, old: int, new: int) -> None:
    """Moves the heard line's background from row `old` to row `new` (-1: none)."""
    table.blockSignals(True)  # a colour is no edit
    for k, brush in ((old, QBrush()), (new, QBrush(HEARD))):
        for column in range(table.columnCount()) if k >= 0 else ():
            table.item(k, column).setBackground(brush)
    table.blockSignals(False)


class TranscriptPlayer(QWidget):
    position_changed = Signal(float)  # seconds
    failed = Signal(str)  # the file cannot be played: why

    def __init__(self, shortcut_parent: QWidget, parent: QWidget | None = None):
        super().__init__(parent)
        self.media = QMediaPlayer(self)
        self.audio = QAudioOutput(self)
        self.media.setAudioOutput(self.audio)
        self.play_button = QPushButton("Play")
        self.play_button.setToolTip("Play or pause (K); J and L go back and forward 5 s")
        self.play_button.clicked.connect(self.toggle)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.sliderMoved.connect(lambda ms: self.media.setPosition(ms))
        self.time = QLabel("—")
        self.rate = QComboBox()
        for rate in RATES:
            self.rate.addItem(f"{rate:g}×", rate)
        self.rate.setCurrentIndex(RATES.index(1.0))
        self.rate.setToolTip("Playback speed")
        self.rate.currentIndexChanged.connect(lambda _i: self.media.setPlaybackRate(self.rate.currentData()))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget, stretch in ((self.play_button, 0), (self.slider, 1), (self.time, 0), (self.rate, 0)):
            layout.addWidget(widget, stretch)
        context = Qt.ShortcutContext.WidgetWithChildrenShortcut
        QShortcut(QKeySequence(Qt.Key.Key_K), shortcut_parent, self.toggle, context=context)
        QShortcut(QKeySequence(Qt.Key.Key_J), shortcut_parent, lambda: self.skip(-SKIP_S), context=context)
        QShortcut(QKeySequence(Qt.Key.Key_L), shortcut_parent, lambda: self.skip(SKIP_S), context=context)
        self.media.positionChanged.connect(self._on_position)
        self.media.durationChanged.connect(lambda ms: self.slider.setRange(0, ms))
        self.media.playbackStateChanged.connect(self._on_state)
        self.media.errorOccurred.connect(lambda _error, message: self.failed.emit(f"Cannot play: {message}"))
        self.media.mediaStatusChanged.connect(self._on_status)
        self._pending_ms: int | None = None  # a seek asked for before the media had loaded
        self.load(None)

    def load(self, path: Path | None) -> None:
        """The audio to play (stopped at 0), or None: the controls are disabled."""
        self.media.stop()
        self._pending_ms = None
        self.media.setSource(QUrl.fromLocalFile(str(path)) if path is not None else QUrl())
        for widget in (self.play_button, self.slider, self.rate):
            widget.setEnabled(path is not None)
        self.time.setText("—" if path is None else format_duration(0))

    @property
    def playing(self) -> bool:
        return self.media.playbackState() == QMediaPlayer.PlaybackState.PlayingState

    @property
    def position_s(self) -> float:
        return self.media.position() / 1000

    @Slot()
    def toggle(self) -> None:
        if self.media.source().isEmpty():
            return
        if self.playing:
            self.media.pause()
        else:
            self.media.play()

    def seek(self, seconds: float) -> None:
        if self.media.source().isEmpty():
            return
        ms = max(0, round(seconds * 1000))
        if self.media.mediaStatus() == QMediaPlayer.MediaStatus.LoadingMedia:
            self._pending_ms = ms  # QMediaPlayer drops a position set while it loads
        else:
            self.media.setPosition(ms)

    def skip(self, seconds: float) -> None:
        self.seek(self.position_s + seconds)

    def set_rate(self, rate: float) -> None:
        self.rate.setCurrentIndex(RATES.index(rate))

    def stop(self) -> None:
        self.media.stop()

    @Slot(int)
    def _on_position(self, ms: int) -> None:
        if not self.slider.isSliderDown():
            self.slider.setValue(ms)
        self.time.setText(f"{format_duration(ms / 1000)} / {format_duration(self.media.duration() / 1000)}")
        self.position_changed.emit(ms / 1000)

    @Slot(QMediaPlayer.MediaStatus)
    def _on_status(self, status: QMediaPlayer.MediaStatus) -> None:
        if status == QMediaPlayer.MediaStatus.LoadedMedia and self._pending_ms is not None:
            self.media.setPosition(self._pending_ms)
            self._pending_ms = None

    @Slot(QMediaPlayer.PlaybackState)
    def _on_state(self, state: QMediaPlayer.PlaybackState) -> None:
        self.play_button.setText("Pause" if state == QMediaPlayer.PlaybackState.PlayingState else "Play")
