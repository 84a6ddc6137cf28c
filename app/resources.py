"""The icon and stylesheet in the repository's resources/ folder (absent from a wheel: the app then
uses Qt's defaults)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QIcon

__all__ = ["ICON_SIZES", "RESOURCES", "app_icon", "stylesheet"]

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256)


def app_icon() -> QIcon:
    icon = QIcon()
    for size in ICON_SIZES:
        png = RESOURCES / "icons" / f"aural-{size}.png"
        if png.is_file():
            icon.addFile(str(png))
    return icon


def stylesheet() -> str:
    qss = RESOURCES / "style.qss"
    return qss.read_text(encoding="utf-8") if qss.is_file() else ""
