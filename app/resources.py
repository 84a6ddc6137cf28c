"""The icon and stylesheet of resources/: the `aural` package's resources/ folder once installed (the wheel
maps the repository's resources/ there, and the PyInstaller bundle keeps that layout), which from a checkout
is the repository's own resources/. Where it is missing the app uses Qt's defaults."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QIcon

__all__ = ["ICON_SIZES", "RESOURCES", "app_icon", "stylesheet"]

# <aural>/app/resources.py -> <aural>/resources; in a checkout app/resources.py -> <repo>/resources.
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
