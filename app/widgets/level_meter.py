"""A horizontal input level meter in dBFS with a slowly falling peak marker."""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF, QSize, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QLinearGradient, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

__all__ = ["LevelMeter"]

FLOOR_DB = -60.0  # shown as an empty meter; quieter than any room
_PEAK_FALL_DB = 1.5  # per decay tick, so a peak stays readable for about a second
_DECAY_MS = 50


def to_db(rms: float) -> float:
    """dBFS of a linear RMS (full scale 1.0), clamped to the meter's floor."""
    return max(FLOOR_DB, 20.0 * math.log10(rms)) if rms > 0 else FLOOR_DB


class LevelMeter(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("levelMeter")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip("Input level (dBFS)")
        self._db = FLOOR_DB
        self._peak_db = FLOOR_DB
        self._decay = QTimer(self, interval=_DECAY_MS, timeout=self._fall)

    @property
    def level_db(self) -> float:
        return self._db

    def sizeHint(self) -> QSize:
        return QSize(120, 10)

    @Slot(float)
    def set_level(self, rms: float) -> None:
        """Linear RMS of the latest block, 0..1."""
        self._db = to_db(rms)
        self._peak_db = max(self._peak_db, self._db)
        if not self._decay.isActive():
            self._decay.start()
        self.update()

    @Slot()
    def reset(self) -> None:
        self._db = self._peak_db = FLOOR_DB
        self._decay.stop()
        self.update()

    def _fall(self) -> None:
        self._peak_db = max(self._db, self._peak_db - _PEAK_FALL_DB)
        if self._peak_db <= FLOOR_DB:
            self._decay.stop()
        self.update()

    def _x(self, db: float) -> float:
        return self.width() * (db - FLOOR_DB) / -FLOOR_DB

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(self.palette().color(self.backgroundRole()).darker(130))
        painter.drawRoundedRect(QRectF(self.rect()), 3, 3)
        gradient = QLinearGradient(0, 0, self.width(), 0)
        gradient.setColorAt(0.0, QColor("#2fbf71"))
        gradient.setColorAt(0.75, QColor("#e3c341"))  # -15 dBFS
        gradient.setColorAt(1.0, QColor("#e5484d"))
        painter.setBrush(gradient)
        painter.drawRoundedRect(QRectF(0, 0, self._x(self._db), self.height()), 3, 3)
        if self._peak_db > FLOOR_DB:
            painter.fillRect(QRectF(self._x(self._peak_db) - 1, 0, 2, self.height()), QColor("#f5f7fa"))
