"""Render aural.svg to icons/aural-<size>.png with Qt's SVG renderer: `python resources/render_icons.py`."""

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from aural.app.resources import ICON_SIZES

HERE = Path(__file__).resolve().parent


def main() -> None:
    app = QGuiApplication([])  # noqa: F841 - QPainter on images needs a Gui application
    renderer = QSvgRenderer(str(HERE / "aural.svg"))
    (HERE / "icons").mkdir(exist_ok=True)
    for size in ICON_SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        image.save(str(HERE / "icons" / f"aural-{size}.png"))


if __name__ == "__main__":
    main()
