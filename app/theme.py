"""The look: Fusion with a dark palette (captions read best light on dark), plus resources/style.qss."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from .resources import app_icon, stylesheet

__all__ = ["apply_theme"]

_ROLES = {
    QPalette.ColorRole.Window: "#1f2329",
    QPalette.ColorRole.WindowText: "#e6e9ef",
    QPalette.ColorRole.Base: "#16191e",
    QPalette.ColorRole.AlternateBase: "#1c2026",
    QPalette.ColorRole.Text: "#eef1f5",
    QPalette.ColorRole.PlaceholderText: "#7d8794",
    QPalette.ColorRole.Button: "#2a2f37",
    QPalette.ColorRole.ButtonText: "#e6e9ef",
    QPalette.ColorRole.Highlight: "#3b82f6",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#2a2f37",
    QPalette.ColorRole.ToolTipText: "#e6e9ef",
    QPalette.ColorRole.Link: "#60a5fa",
    QPalette.ColorRole.Mid: "#3a404a",
    QPalette.ColorRole.Dark: "#111317",
}
_DISABLED = {QPalette.ColorRole.Text: "#6b7280", QPalette.ColorRole.ButtonText: "#6b7280",
             QPalette.ColorRole.WindowText: "#6b7280"}


def apply_theme(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = QPalette()
    for role, color in _ROLES.items():
        palette.setColor(role, QColor(color))
    for role, color in _DISABLED.items():
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(color))
    app.setPalette(palette)
    app.setWindowIcon(app_icon())
    app.setStyleSheet(stylesheet())
