"""Preferences: the model, its compute device and the default input, the file decoding options the CLI
has, and the caption window's look; QSettings-backed.

    dialog = PreferencesDialog(settings, models=[(label, spec)], inputs=[(label, name)], parent=window)
    dialog.set_compute_devices(runtime.compute_devices())   # when a worker has listed them
    if dialog.exec():           # OK wrote every field to `settings`
        options = transcribe_options(settings)
"""

from __future__ import annotations

from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QCheckBox, QColorDialog, QComboBox, QDialog, QDialogButtonBox, QFontComboBox,
                               QFormLayout, QGroupBox, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from aural.engine.runtime import MAX_SEQUENCES, ComputeDevice
from aural.engine.speakers.weights import installed as speaker_models_installed
from aural.engine.transcribe import TranscribeOptions

from ..settings import Key, Settings

__all__ = ["AUTO_DEVICE_LABEL", "ColorButton", "PreferencesDialog", "device_label", "diarize_files",
           "speaker_count", "transcribe_options"]

AUTO_DEVICE_LABEL = "Automatic (best device)"


def transcribe_options(settings: Settings) -> TranscribeOptions:
    """The options files are transcribed with, from the Preferences (the language is the picker's)."""
    beam = settings.get(Key.BEAM_SIZE)
    return TranscribeOptions(
        beam_size=beam if beam > 1 else None,
        word_timestamps=settings.get(Key.WORD_TIMESTAMPS),
        vad_filter=settings.get(Key.VAD_FILTER),
        hotwords=settings.get(Key.HOTWORDS).strip() or None,
        initial_prompt=settings.get(Key.INITIAL_PROMPT).strip() or None,
        task="translate" if settings.get(Key.TRANSLATE) else "transcribe",
    )


def diarize_files(settings: Settings) -> bool:
    """Whether files are diarized: asked for in the Preferences, and the speaker models are installed."""
    return settings.get(Key.DIARIZE) and speaker_models_installed()


def speaker_count(settings: Settings) -> int | None:
    """How many speakers diarization looks for (Preferences), None: found from the voices."""
    return settings.get(Key.DIARIZE_SPEAKERS) or None


class ColorButton(QPushButton):
    """A button showing a colour; clicking it opens the colour picker."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._color = "#000000"
        self.clicked.connect(self._pick)

    def color(self) -> str:
        return self._color

    def set_color(self, color: str) -> None:
        self._color = QColor(color).name()
        self.setText(self._color)
        self.setStyleSheet(f"background: {self._color}; color: {_readable_on(self._color)};")

    def _pick(self) -> None:
        picked = QColorDialog.getColor(QColor(self._color), self, "Caption colour")
        if picked.isValid():
            self.set_color(picked.name())


def _readable_on(background: str) -> str:
    return "#000000" if QColor(background).lightnessF() > 0.5 else "#ffffff"


def device_label(device: ComputeDevice) -> str:
    """e.g. "Vulkan0 — llvmpipe (LLVM 15.0.6, 256 bits), 1.5 of 2.0 GiB free, software: slower than the CPU"."""
    free, total = device.memory_free / 2**30, device.memory_total / 2**30
    memory = f"{free:.1f} of {total:.1f} GiB free" if device.memory_free < device.memory_total else f"{total:.1f} GiB"
    software = ", software: slower than the CPU" if device.software else ""
    return f"{device.name} — {device.description}, {memory}{software}"


def _choice(entries: list[tuple[str, str]], tooltip: str) -> QComboBox:
    combo = QComboBox()
    combo.setToolTip(tooltip)
    for label, value in entries:
        combo.addItem(label, value)
    return combo


def _select(combo: QComboBox, value: str) -> None:
    index = combo.findData(value)
    if index < 0 and value:  # a model file or an input that is not listed now: keep it
        combo.addItem(value, value)
        index = combo.count() - 1
    combo.setCurrentIndex(max(0, index))


class PreferencesDialog(QDialog):
    """Edits the settings; OK stores them, Cancel leaves them as they were.

    `models` and `inputs` are (label, value) pairs, as the main window's pickers show them.
    """

    def __init__(self, settings: Settings, parent: QWidget | None = None, *,
                 models: list[tuple[str, str]] = (), inputs: list[tuple[str, str]] = ()):
        super().__init__(parent)
        self.setObjectName("preferences")
        self.setWindowTitle("Preferences")
        self._settings = settings
        self.model = _choice(list(models), "The model loaded at launch, for live captions and files")
        self.input = _choice([("System default input", "")] + list(inputs),
                             "The microphone or system audio that live captions listen to")
        # The devices fill in once a worker has listed them (set_compute_devices).
        self.compute_device = _choice([(AUTO_DEVICE_LABEL, "auto")],
                                      "Where the model runs; a device that fails hands over to the CPU")
        self.beam_size = QSpinBox(minimum=1, maximum=MAX_SEQUENCES)
        self.beam_size.setToolTip("Beams of beam search; 1 decodes greedily (faster, a little less accurate)")
        self.word_timestamps = QCheckBox("Word timestamps")
        self.vad_filter = QCheckBox("Skip non-speech (VAD pre-filter)")
        self.hotwords = QLineEdit(placeholderText="names or terms likely to be spoken")
        self.initial_prompt = QLineEdit(placeholderText="text that sets the style of the first window")
        self.translate = QCheckBox("Translate to English (multilingual models)")
        self.diarize = QCheckBox("Identify speakers (Speaker 1, 2, …)")
        self.diarize.setToolTip("After a file is transcribed, find who spoke when and name each line's speaker")
        self.speakers = QSpinBox(minimum=0, maximum=20, specialValueText="found from the voices")
        self.speakers.setToolTip("How many people speak, when you know it; also for History's Identify speakers")
        if not speaker_models_installed():
            self.diarize.setEnabled(False)
            self.diarize.setToolTip("Needs the speaker models: run `aural models pull speakers` (a 90 MB download)")
        self.font_family = QFontComboBox()
        self.font_family.setToolTip("The captions' typeface")
        self.font_px = QSpinBox(minimum=0, maximum=400, suffix=" px", specialValueText="follows the window")
        self.on_top = QCheckBox("Always on top")
        self.text_color = ColorButton()
        self.background = ColorButton()
        self.keep_live_audio = QCheckBox("Keep the audio of live sessions")
        self.keep_live_audio.setToolTip("Saved beside the session's text (about 60 MB an hour), so the History tab "
                                        "can play it and identify its speakers; deleting the session deletes it")
        general = QGroupBox("General")
        form = QFormLayout(general)
        form.addRow("Model", self.model)
        form.addRow("Compute device", self.compute_device)
        form.addRow("Default input", self.input)
        form.addRow("", self.keep_live_audio)
        decoding = QGroupBox("Transcribing files")
        form = QFormLayout(decoding)
        form.addRow("Beam size", self.beam_size)
        form.addRow("", self.word_timestamps)
        form.addRow("", self.vad_filter)
        form.addRow("Hot words", self.hotwords)
        form.addRow("Initial prompt", self.initial_prompt)
        form.addRow("", self.translate)
        form.addRow("", self.diarize)
        form.addRow("Speakers", self.speakers)
        captions = QGroupBox("Caption window")
        form = QFormLayout(captions)
        form.addRow("Font", self.font_family)
        form.addRow("Font size", self.font_px)
        form.addRow("Text colour", self.text_color)
        form.addRow("Background", self.background)
        form.addRow("", self.on_top)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(general)
        layout.addWidget(decoding)
        layout.addWidget(captions)
        layout.addWidget(buttons)
        self._load()

    def _fields(self):
        return ((Key.MODEL, lambda: self.model.currentData() or self._settings.get(Key.MODEL),
                 lambda spec: _select(self.model, spec)),
                (Key.COMPUTE_DEVICE, self.compute_device.currentData, lambda name: _select(self.compute_device, name)),
                (Key.INPUT_DEVICE, lambda: self.input.currentData() or "", lambda name: _select(self.input, name)),
                (Key.BEAM_SIZE, self.beam_size.value, self.beam_size.setValue),
                (Key.WORD_TIMESTAMPS, self.word_timestamps.isChecked, self.word_timestamps.setChecked),
                (Key.VAD_FILTER, self.vad_filter.isChecked, self.vad_filter.setChecked),
                (Key.HOTWORDS, self.hotwords.text, self.hotwords.setText),
                (Key.INITIAL_PROMPT, self.initial_prompt.text, self.initial_prompt.setText),
                (Key.TRANSLATE, self.translate.isChecked, self.translate.setChecked),
                (Key.DIARIZE, self.diarize.isChecked, self.diarize.setChecked),
                (Key.DIARIZE_SPEAKERS, self.speakers.value, self.speakers.setValue),
                (Key.KEEP_LIVE_AUDIO, self.keep_live_audio.isChecked, self.keep_live_audio.setChecked),
                (Key.CAPTION_FONT_FAMILY, lambda: self.font_family.currentFont().family(), self._set_family),
                (Key.CAPTION_FONT_PX, self.font_px.value, self.font_px.setValue),
                (Key.CAPTION_ON_TOP, self.on_top.isChecked, self.on_top.setChecked),
                (Key.CAPTION_TEXT_COLOR, self.text_color.color, self.text_color.set_color),
                (Key.CAPTION_BACKGROUND, self.background.color, self.background.set_color))

    def set_compute_devices(self, devices: list[ComputeDevice]) -> None:
        """Offers `devices` after "Automatic"; the device picked stays picked (kept by name if not listed)."""
        picked = self.compute_device.currentData()
        self.compute_device.clear()
        self.compute_device.addItem(AUTO_DEVICE_LABEL, "auto")
        for device in devices:
            self.compute_device.addItem(device_label(device), device.name)
        _select(self.compute_device, picked)

    def _set_family(self, family: str) -> None:
        """Shows `family`, or the application's font for "" (the caption window's default)."""
        font = self.font()
        if family:
            font.setFamily(family)
        self.font_family.setCurrentFont(font)

    def _load(self) -> None:
        for key, _read, write in self._fields():
            write(self._settings.get(key))

    def accept(self) -> None:
        for key, read, _write in self._fields():
            self._settings.set(key, read())
        self._settings.sync()
        super().accept()
