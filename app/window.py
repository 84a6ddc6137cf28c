"""The main window: it lays out the views, connects them to the services and keeps the settings.

It receives everything it uses (settings, services, catalog) from the composition root and calls the
engine only through those services.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from PySide6.QtCore import QSize, QStandardPaths, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QFileDialog, QHBoxLayout, QLabel, QMainWindow, QSplitter,
                               QTabWidget, QToolButton, QVBoxLayout, QWidget)

from aural.engine.history import History
from aural.engine.models.store import DEFAULT_MODEL
from aural.engine.text.tokenizer import LANGUAGES
from aural.engine.text.writers import merge_fragments

from .devices import DeviceWatcher
from .export import CaptionSegment, save_transcript
from .jobs import FileJob, JobStatus
from .library import ModelLibrary
from .services import Catalog, FileQueue, LiveSession, ModelService, stop_threads
from .settings import Key, Settings
from .widgets.about import AboutDialog
from .widgets.captions import CaptionsView
from .widgets.controls import ControlBar
from .widgets.file_queue import FileQueueView
from .widgets.file_result import EXPORT_FORMATS, FileResultView
from .widgets.history_view import HistoryView
from .widgets.metrics import MetricsPanel
from .widgets.models_dialog import ModelsDialog, progress_text, size_text
from .widgets.preferences import PreferencesDialog, diarize_files, speaker_count, transcribe_options
from .widgets.presentation import CaptionLook, CaptionWindow
from .widgets.restore_bar import RestoreBar
from .workers import ComputeDevicesWorker, DoctorWorker, SpeakerWorker, start_worker

__all__ = ["MainWindow"]

logger = logging.getLogger(__name__)

_FILTERS = {"txt": "Text (*.txt)", "srt": "SubRip subtitles (*.srt)", "vtt": "WebVTT subtitles (*.vtt)",
            "json": "JSON with segments and timings (*.json)"}
_ERROR_MARK = "⚠"
_OPEN_FILTER = ("Audio and video (*.wav *.flac *.mp3 *.ogg *.opus *.m4a *.aac *.wma *.mp4 *.mkv *.webm *.mov "
                "*.avi);;All files (*)")
_MODEL_FILTER = "Whisper or Qwen3-ASR models (*.gguf *.bin);;All files (*)"
_RECENT_LIMIT = 10
# Below this the control bar's pickers and the caption actions no longer fit side by side.
_MIN_SIZE = QSize(720, 440)


def _local_files(urls: list[QUrl]) -> list[str]:
    return [url.toLocalFile() for url in urls if url.isLocalFile() and url.toLocalFile()]


class MainWindow(QMainWindow):
    closing = Signal()  # the composition root stops the services on it

    def __init__(self, settings: Settings, models: ModelService, files: FileQueue, live: LiveSession,
                 catalog: Catalog, devices: DeviceWatcher, library: ModelLibrary, history: History):
        super().__init__()
        self.setWindowTitle("Aural")
        self.setAcceptDrops(True)
        self._settings = settings
        self.models = models
        self.files = files
        self.live = live
        self._catalog = catalog
        self.devices = devices
        self.library = library
        self.history = history
        self._models_dialog: ModelsDialog | None = None
        self._shown_job: FileJob | None = None
        self._offers: list = []  # journal.Session: unclosed sessions still to offer, oldest first
        self._started_at: float | None = None  # Start (or model ready, if Start waited), until the first partial
        self.last_error = ""
        self._build_menus()
        self._build_views()
        self._connect_services()
        self._restore(catalog)
        self._offer_restore()

    # -- construction --

    def _build_views(self) -> None:
        self.controls = ControlBar()
        self.captions = CaptionsView()
        self.metrics = MetricsPanel()
        self.queue = FileQueueView()
        self.result = FileResultView()
        self.caption_window = CaptionWindow(self)
        self._apply_caption_settings()
        self.restore_bar = RestoreBar()
        live = QSplitter(Qt.Orientation.Horizontal)
        live.addWidget(self._captions_pane())
        live.addWidget(self.metrics)
        live.setStretchFactor(0, 3)
        live.setStretchFactor(1, 2)
        files = QSplitter(Qt.Orientation.Vertical)
        files.addWidget(self.queue)
        files.addWidget(self.result)
        files.setStretchFactor(1, 3)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.metrics.setVisible(self._metrics_action.isChecked())
        self.live_pane = live
        self.live_tab = self.tabs.addTab(live, "Live captions")
        # Space toggles too, but only on the Live tab (the file list and the transcript table use Space
        # for their own items), and not where a widget that types or presses with it has the focus.
        QShortcut(QKeySequence(Qt.Key.Key_Space), self.live_pane, self.toggle_live,
                  context=Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.files_tab = self.tabs.addTab(files, "Files")
        self.history_view = HistoryView(self.history)
        self.history_tab = self.tabs.addTab(self.history_view, "History")
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.controls)
        layout.addWidget(self.tabs, 1)
        self.setCentralWidget(central)
        self.setMinimumSize(_MIN_SIZE.expandedTo(self.minimumSizeHint()))
        self.model_status = QLabel()
        self.model_status.setObjectName("modelStatus")
        self.statusBar().addPermanentWidget(self.model_status)
        self.live_language = QLabel("")
        self.live_language.setObjectName("liveLanguage")
        self.statusBar().addPermanentWidget(self.live_language)

    def _captions_pane(self) -> QWidget:
        """The captions with their actions underneath (the same actions as in the menus)."""
        save = QToolButton()
        save.setText("Save as…")
        save.setToolTip("Save the captions as TXT, SRT, VTT or JSON")
        save.setMenu(self._export_menu)
        save.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bar = QHBoxLayout()
        bar.setContentsMargins(8, 4, 8, 6)
        for action in (self._copy_action, self._clear_action):
            bar.addWidget(self._tool_button(action))
        bar.addWidget(save)
        bar.addStretch(1)
        bar.addWidget(self._tool_button(self._metrics_action))
        bar.addWidget(self._tool_button(self._present_action))
        pane = QWidget()
        layout = QVBoxLayout(pane)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.restore_bar)
        layout.addWidget(self.captions, 1)
        layout.addLayout(bar)
        return pane

    @staticmethod
    def _tool_button(action: QAction) -> QToolButton:
        button = QToolButton()
        button.setDefaultAction(action)
        return button

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self._action(file_menu, "&Open audio or video…", self.open_files, QKeySequence.StandardKey.Open)
        self._recent_menu = file_menu.addMenu("Open &recent")
        self._recent_menu.aboutToShow.connect(self._fill_recent_menu)
        file_menu.addSeparator()
        self._action(file_menu, "Open &model file…", self.open_model_file, "Ctrl+Shift+O")
        self._action(file_menu, "Open model &folder…", self.open_model_folder)
        self._action(file_menu, "Manage &models…", self.show_models)
        file_menu.addSeparator()
        self._export_menu = file_menu.addMenu("&Export captions as")
        for fmt in EXPORT_FORMATS:
            self._action(self._export_menu, fmt.upper(), lambda _=False, f=fmt: self._ask_export_captions(f))
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit = self.menuBar().addMenu("&Edit")
        self._copy_action = self._action(edit, "&Copy captions", self.copy_captions, "Ctrl+Shift+C")
        self._clear_action = self._action(edit, "C&lear captions", self.clear_captions, "Ctrl+L")
        self._undo_clear_action = self._action(edit, "&Undo clear", self.undo_clear, QKeySequence.StandardKey.Undo)
        self._undo_clear_action.setEnabled(False)
        edit.addSeparator()
        self._action(edit, "&Preferences…", self.show_preferences, QKeySequence.StandardKey.Preferences)
        live = self.menuBar().addMenu("&Live")
        self._action(live, "&Start / Stop", self.toggle_live, "Ctrl+R")
        view = self.menuBar().addMenu("&View")
        self._metrics_action = self._action(view, "&Metrics panel", self.show_metrics, "Ctrl+M")
        self._metrics_action.setCheckable(True)
        self._metrics_action.setChecked(self._settings.get(Key.METRICS_SHOWN))
        self._metrics_action.setToolTip("Show or hide the speed and decoder metrics (Ctrl+M)")
        self._present_action = self._action(view, "&Caption window", self.show_caption_window, "Ctrl+Shift+P")
        help_menu = self.menuBar().addMenu("&Help")
        self._action(help_menu, "&About Aural", self.show_about)

    def _action(self, menu, text: str, slot, shortcut=None) -> QAction:
        action = menu.addAction(text)
        action.triggered.connect(slot)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        return action

    def _connect_services(self) -> None:
        c = self.controls
        c.start_stop_requested.connect(self.toggle_live)
        c.device_changed.connect(lambda name: self._settings.set(Key.INPUT_DEVICE, name))
        c.refresh_devices_requested.connect(self.devices.refresh)
        self.devices.changed.connect(self._show_devices)
        self.devices.failed.connect(self.show_error)
        c.model_changed.connect(self._pick_model)
        c.manage_models_requested.connect(self.show_models)
        c.language_changed.connect(lambda code: self._settings.set(Key.LANGUAGE, code))
        self.metrics.kv_mode_changed.connect(lambda mode: self._settings.set(Key.KV_MODE, mode))
        self.models.loading.connect(lambda spec: self.model_status.setText(f"Loading {spec}…"))
        self.models.ready.connect(self._on_model_ready)
        self.models.failed.connect(self._on_model_failed)
        self.live.fallback.connect(self._on_device_fallback)
        self.files.fallback.connect(self._on_device_fallback)
        self.live.running_changed.connect(self._on_running_changed)
        self.live.partial.connect(self._on_partial)
        self.live.commit.connect(self._on_commit)
        self.live.metrics.connect(self.metrics.set_metrics)
        self.live.level.connect(c.level_meter.set_level)
        self.live.levels.connect(c.set_input_levels)
        self.live.failed.connect(self.show_error)
        self.files.added.connect(self.queue.add_job)
        self.files.changed.connect(self._on_job_changed)
        self.files.segment_added.connect(self._on_segment_added)
        self.queue.cancel_requested.connect(self.files.cancel)
        self.queue.job_selected.connect(lambda job_id: self.show_job(self.files.job(job_id)))
        self.result.export_requested.connect(self._ask_export_job)
        self.files.kept.connect(lambda _id: self.history_view.refresh())
        self.result.history_requested.connect(self.open_kept)
        self.files.not_kept.connect(self.show_error)
        self.files.not_diarized.connect(self.show_error)
        self.files.speakers_named.connect(self._on_speakers_named)
        self.history_view.export_requested.connect(self._ask_export_kept)
        self.history_view.failed.connect(self.show_error)
        self.history_view.speakers_requested.connect(self.identify_speakers)
        self.tabs.currentChanged.connect(self._on_tab_changed)
        self.restore_bar.restore_requested.connect(self.restore_session)
        self.restore_bar.discard_requested.connect(self.discard_session)
        lib = self.library
        lib.listed.connect(self._show_library)
        lib.pulling_changed.connect(self._on_pulling_changed)
        lib.progress.connect(self._on_pull_progress)
        lib.pulled.connect(self._on_pulled)
        lib.cancelled.connect(self._on_pull_cancelled)
        lib.failed.connect(self._on_library_failed)

    def _restore(self, catalog: Catalog) -> None:
        s = self._settings
        if not s.get(Key.GEOMETRY).isEmpty():
            self.restoreGeometry(s.get(Key.GEOMETRY))
        else:
            self.resize(1180, 740)
        self.controls.set_models(catalog.models(), s.get(Key.MODEL))
        self.controls.set_language(s.get(Key.LANGUAGE))
        self.metrics.set_kv_mode(s.get(Key.KV_MODE))
        self.controls.set_multilingual(False)  # until a model is loaded

    @Slot(list)
    @Slot(int)
    def open_kept(self, entry_id: int) -> None:
        """A kept transcript in the History tab (from the Files tab's Edit in History)."""
        self.tabs.setCurrentIndex(self.history_tab)
        self.history_view.open(entry_id)

    @Slot(int)
    def _on_tab_changed(self, index: int) -> None:
        # A live session enters the library when its journal closes: the list is read again on each visit.
        if index == self.history_tab:
            self.history_view.refresh()

    def _show_devices(self, devices: list) -> None:
        """A new device list: the input last picked stays picked while it is there (and is picked again when
        it comes back); else the default input."""
        self.controls.set_devices(devices, self._settings.get(Key.INPUT_DEVICE))

    # -- live captions --

    @Slot()
    def toggle_live(self) -> None:
        if self.live.running:
            self.live.stop()
            self.statusBar().showMessage("Stopping: committing the last words…")
            return
        self.tabs.setCurrentIndex(self.live_tab)
        self.metrics.reset()
        self._started_at = time.monotonic()
        self.live.start(self.controls.current_device(), self._language(), self._settings.get(Key.KV_MODE),
                        keep_audio=self._settings.get(Key.KEEP_LIVE_AUDIO))

    def _on_running_changed(self, running: bool) -> None:
        self.controls.set_running(running)
        if running:
            waiting = self.models.model is None
            self.statusBar().showMessage("Waiting for the model…" if waiting else "Listening…")
        else:
            self._started_at = None
            self._set_partial("")
            if not self._showing_error():
                self.statusBar().showMessage("Stopped.", 5000)

    def _on_partial(self, partial) -> None:
        if partial.text and self._started_at is not None:
            latency = time.monotonic() - self._started_at
            self._started_at = None
            logger.info("first partial %.2f s after Start", latency)
            self.statusBar().showMessage(f"Listening… first caption {latency:.2f} s after Start")
        self._set_partial(partial.text, partial.spaced)
        self._show_live_language(partial.language)

    def _on_commit(self, commit) -> None:
        self._append_caption(commit.text, commit.spaced)
        self._show_live_language(commit.language)

    # The captions show in two views, the pane and the caption window, which change together.

    def _set_partial(self, text: str, spaced: bool = True) -> None:
        for view in (self.captions, self.caption_window):
            view.set_partial(text, spaced)

    def _append_caption(self, text: str, spaced: bool = True) -> None:
        for view in (self.captions, self.caption_window):
            view.append_commit(text, spaced)

    def _clear_caption_views(self) -> None:
        for view in (self.captions, self.caption_window):
            view.clear_captions()

    def _show_live_language(self, code: str | None) -> None:
        """The language of what is being captioned: detected per utterance when the picker says
        "Detect automatically", else the one chosen."""
        self.live_language.setText(f"Language: {LANGUAGES.get(code, code).title()}" if code else "")

    @Slot()
    def copy_captions(self) -> None:
        QApplication.clipboard().setText(self.captions.committed_text())  # not the tail the next step may change
        self.statusBar().showMessage("Captions copied.", 3000)

    @Slot()
    def clear_captions(self) -> None:
        """Empties the caption views; Edit → Undo clear (Ctrl+Z) puts the text back."""
        if not self.live.transcript and not self.captions.committed_text():
            return
        self.live.clear_transcript()
        self._clear_caption_views()
        self._undo_clear_action.setEnabled(True)
        self.statusBar().showMessage("Captions cleared. Undo with Ctrl+Z.", 8000)

    @Slot()
    def undo_clear(self) -> None:
        if not self.live.can_undo_clear:
            return
        segments = self.live.undo_clear()
        self._clear_caption_views()
        for segment in segments:
            self._append_caption(segment.text, segment.spaced)
        self._undo_clear_action.setEnabled(False)
        self.statusBar().showMessage("Captions restored.", 5000)

    @Slot()
    def show_preferences(self) -> PreferencesDialog:
        """Opens the Preferences (modeless, so the captions go on); OK applies them: files added from then
        on are decoded with the new options, the caption window takes its look at once. The compute
        devices fill in when their worker has listed them."""
        dialog = PreferencesDialog(self._settings, self, models=self._combo_items(self.controls.model_combo),
                                   inputs=self._combo_items(self.controls.device_combo))
        dialog.accepted.connect(self._apply_preferences)
        worker = ComputeDevicesWorker()
        worker.listed.connect(dialog.set_compute_devices)
        worker.failed.connect(lambda message: self.show_error(f"Cannot list the compute devices: {message}"))
        start_worker(worker, self)
        dialog.open()
        return dialog

    @staticmethod
    def _combo_items(combo) -> list[tuple[str, str]]:
        """A picker's selectable (label, value) pairs."""
        items = combo.model()
        return [(combo.itemText(i), combo.itemData(i)) for i in range(combo.count())
                if combo.itemData(i) and items.item(i).isEnabled()]

    def _apply_preferences(self) -> None:
        s = self._settings
        self._apply_caption_settings()
        if not self.live.running:  # the pickers are locked while captioning; the next launch takes them
            self.controls.select_device(s.get(Key.INPUT_DEVICE))
            if s.get(Key.MODEL) != self.controls.model_combo.currentData():
                self.open_model(s.get(Key.MODEL))
            else:  # the same model on another compute device (the service loads nothing if that is unchanged)
                self._pick_model(s.get(Key.MODEL))

    def _apply_caption_settings(self) -> None:
        s = self._settings
        self.caption_window.set_look(CaptionLook(s.get(Key.CAPTION_FONT_FAMILY), s.get(Key.CAPTION_FONT_PX),
                                                 s.get(Key.CAPTION_ON_TOP), s.get(Key.CAPTION_TEXT_COLOR),
                                                 s.get(Key.CAPTION_BACKGROUND)))

    @Slot(bool)
    def show_metrics(self, shown: bool) -> None:
        """Shows or collapses the metrics panel; the captions take the whole pane when it is collapsed."""
        self._metrics_action.setChecked(shown)
        self.metrics.setVisible(shown)
        self._settings.set(Key.METRICS_SHOWN, shown)

    @Slot(int)
    def identify_speakers(self, entry_id: int) -> SpeakerWorker:
        """Diarizes a kept transcript on a worker; the History tab shows the speakers when it is done."""
        worker = SpeakerWorker(entry_id, speaker_count(self._settings))
        worker.named.connect(self._on_speakers_identified)
        worker.failed.connect(self.show_error)
        self.history_view.speakers_button.setEnabled(False)
        self.statusBar().showMessage("Identifying speakers…")
        start_worker(worker, self)
        return worker

    @Slot(int)
    def _on_speakers_identified(self, entry_id: int) -> None:
        self.statusBar().showMessage("Speakers identified.", 5000)
        if self.history_view.shown_id == entry_id:
            self.history_view.open(entry_id, self.history_view.player.position_s)

    @Slot()
    def show_about(self) -> AboutDialog:
        """Help → About; the system report fills in when its worker (about a second) is done."""
        dialog = AboutDialog(self._catalog.models(), self)
        worker = DoctorWorker()
        worker.reported.connect(dialog.set_report)
        worker.failed.connect(lambda message: dialog.set_report(f"The system report failed: {message}"))
        start_worker(worker, self)
        dialog.open()
        return dialog

    @Slot()
    def show_caption_window(self) -> None:
        self.caption_window.show()
        self.caption_window.raise_()

    # -- sessions a crash left unclosed --

    def _offer_restore(self) -> None:
        self._offers = self.live.unclosed_sessions()
        self._show_next_offer()

    def _show_next_offer(self) -> None:
        if not self._offers:
            self.restore_bar.clear_offer()
            return
        session = self._offers[0]
        self.restore_bar.show_offer(f"Restore the transcript of the session of {session.started_label}? "
                                    f"It did not end cleanly ({len(session.text.split())} words saved).")

    @Slot()
    def restore_session(self) -> None:
        """Puts the offered session's text into the captions, after any text already there."""
        if not self._offers:
            return
        try:
            segments = self.live.restore(self._offers[0])
        except OSError as exc:
            self.show_error(f"Cannot restore the session: {exc.strerror or exc}")
            return
        self._offers.pop(0)
        for segment in segments:
            self._append_caption(segment.text, segment.spaced)
        self.statusBar().showMessage(f"Restored {len(segments)} captions.", 5000)
        self._show_next_offer()

    @Slot()
    def discard_session(self) -> None:
        if not self._offers:
            return
        try:
            self.live.discard(self._offers[0])
        except OSError as exc:
            self.show_error(f"Cannot discard the session: {exc.strerror or exc}")
            return
        self._offers.pop(0)
        self._show_next_offer()

    def _language(self) -> str | None:
        """The picked language; None to detect it (the services ignore it for English-only models)."""
        return self._settings.get(Key.LANGUAGE) or None

    # -- model --

    def _pick_model(self, spec: str) -> None:
        self._settings.set(Key.MODEL, spec)
        self.models.load(spec, self._settings.get(Key.COMPUTE_DEVICE))

    @Slot()
    def open_model_file(self) -> None:
        """A .gguf (Whisper or Qwen3-ASR) or a whisper.cpp ggml .bin; converted (once, cached) and loaded for live
        and files."""
        path, _ = QFileDialog.getOpenFileName(self, "Open a model", "", _MODEL_FILTER)
        self.open_model(path)

    @Slot()
    def open_model_folder(self) -> None:
        """A CTranslate2 or Hugging Face Whisper model directory, or a Qwen3-ASR checkpoint's."""
        self.open_model(QFileDialog.getExistingDirectory(self, "Open a model folder"))

    def open_model(self, spec: str) -> None:
        """Loads `spec` (a known name or a path) and shows it in the picker at once."""
        if not spec:
            return
        self._pick_model(spec)
        self.controls.set_models(self._catalog.models(), spec)

    def _on_model_ready(self, model) -> None:
        if self._started_at is not None:  # a Start that waited for the model: time it from now
            self._started_at = time.monotonic()
        elif not self._showing_error():
            self.statusBar().showMessage(f"Ready: {model.name} loaded.", 5000)
        if model.fallback is not None:
            self.show_error(model.fallback.message)
        self._show_model_status(model)
        self.controls.set_multilingual(model.multilingual)
        # The first load converts the model: the picker says so until it is listed again.
        self.controls.set_models(self._catalog.models(), self._settings.get(Key.MODEL))
        if self._models_dialog is not None and self._models_dialog.isVisible():
            self.library.measure_speed()

    def _show_model_status(self, model) -> None:
        """Where the model really runs: the CPU, naming the device it replaces, after a fallback."""
        replaced = f" in place of {model.fallback.device}" if model.fallback is not None else ""
        self.model_status.setText(f"{model.name} · {model.backend}/{model.device}{replaced} · "
                                  f"loaded in {model.load_s:.1f} s")

    def _on_device_fallback(self, fallback) -> None:
        """A live run or a file went on on the CPU when the device failed under it; nothing done is lost."""
        self.show_error(fallback.message)
        self._show_model_status(self.models.model)

    def _on_model_failed(self, message: str) -> None:
        model = self.models.model
        self.model_status.setText("No model loaded" if model is None else f"{model.name} (still in use)")
        self.show_error(message)

    # -- the Models dialog --

    @Slot()
    def show_models(self) -> ModelsDialog:
        """Opens the Models dialog (modeless; one for the window's life, so a download's row stays in view),
        lists the models again and times the loaded model's encoder for the speed column."""
        if self._models_dialog is None:
            dialog = ModelsDialog(self)
            dialog.download_requested.connect(self.library.pull)
            dialog.cancel_requested.connect(self.library.cancel)
            dialog.delete_requested.connect(self.delete_model)
            self._models_dialog = dialog
            self._show_library()
            dialog.set_pulling(self.library.pulling)
        self.library.refresh()
        self.library.measure_speed()
        self._models_dialog.show()
        self._models_dialog.raise_()
        return self._models_dialog

    @Slot(str)
    def delete_model(self, name: str) -> None:
        """Deletes a pulled model. The one picked is replaced by the default model, unless live captions
        or a file are using it."""
        in_use = self._settings.get(Key.MODEL) == name
        if in_use and (self.live.running or self.files.busy):
            self._on_library_failed(f"{name} is in use: stop live captioning and the files, then delete it.")
            return
        freed = self.library.remove(name)
        if freed is None:
            return
        message = f"Deleted {name}: {size_text(freed)} freed."
        if in_use:  # a pulled tiny.en shadowed the packaged one: the same spec now loads other files
            self._settings.set(Key.MODEL, DEFAULT_MODEL)
            self.models.load(DEFAULT_MODEL, self._settings.get(Key.COMPUTE_DEVICE), reload=True)
            message += f" It was in use, so {DEFAULT_MODEL} is loaded in its place."
        self.controls.set_models(self._catalog.models(), self._settings.get(Key.MODEL))
        self._library_message(message)

    def _show_library(self) -> None:
        if self._models_dialog is not None:
            self._models_dialog.set_rows(self.library.rows, self.library.speed_texts(), self.library.packaged())

    def _on_pulling_changed(self, name: str) -> None:
        if self._models_dialog is not None:
            self._models_dialog.set_pulling(name)

    def _on_pull_progress(self, step, mib_per_s: float) -> None:
        """In the dialog's row, and in the status bar for when the dialog is closed."""
        if self._models_dialog is not None:
            self._models_dialog.set_progress(step, mib_per_s)
        self.statusBar().showMessage(progress_text(step, mib_per_s))

    def _on_pulled(self, name: str) -> None:
        self.controls.set_models(self._catalog.models(), self._settings.get(Key.MODEL))
        self._library_message(f"{name} is installed: pick it in the Model picker.")

    def _on_pull_cancelled(self, name: str, kept: int) -> None:
        self._library_message(f"The download of {name} was cancelled; {size_text(kept)} kept, Download resumes it.")

    def _on_library_failed(self, message: str) -> None:
        if self._models_dialog is not None:
            self._models_dialog.show_message(message, error=True)
        self.show_error(message)

    def _library_message(self, message: str) -> None:
        if self._models_dialog is not None:
            self._models_dialog.show_message(message)
        self.statusBar().showMessage(message, 8000)

    # -- files --

    @Slot()
    def open_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Transcribe files", self._export_dir(), _OPEN_FILTER)
        self.add_files(paths)

    @Slot(list)
    def open_launch(self, paths: list) -> None:
        """Another launch of Aural handed its files over (`instance.SingleInstance`): they are queued and
        this window comes to the front."""
        self.add_files(paths)
        self.bring_to_front()

    def bring_to_front(self) -> None:
        if self.isMinimized():
            self.showNormal()
        self.raise_()
        self.activateWindow()

    def add_files(self, paths: list[str]) -> None:
        if not paths:
            return
        jobs = self.files.add(paths, self._language(), self._settings.get(Key.KV_MODE),
                              transcribe_options(self._settings), diarize=diarize_files(self._settings),
                              n_speakers=speaker_count(self._settings))
        self._remember(paths)
        self.tabs.setCurrentIndex(self.files_tab)
        if self.models.model is None:
            self.statusBar().showMessage("Files wait for the model to load…")
        self.queue.setCurrentItem(self.queue.topLevelItem(self.queue.topLevelItemCount() - len(jobs)))

    def _remember(self, paths: list[str]) -> None:
        added = [str(Path(p).resolve()) for p in reversed(paths)]
        kept = [p for p in self._settings.get(Key.RECENT_FILES) if p not in added]
        self._settings.set(Key.RECENT_FILES, (added + kept)[:_RECENT_LIMIT])

    def _fill_recent_menu(self) -> None:
        """Built each time it opens: files deleted since are left out."""
        menu = self._recent_menu
        menu.clear()
        recent = [p for p in self._settings.get(Key.RECENT_FILES) if Path(p).is_file()]
        for path in recent:
            menu.addAction(Path(path).name, lambda p=path: self.add_files([p])).setToolTip(path)
        if not recent:
            menu.addAction("No recent files").setEnabled(False)
            return
        menu.addSeparator()
        menu.addAction("Clear the list", lambda: self._settings.set(Key.RECENT_FILES, []))

    def show_job(self, job: FileJob) -> None:
        self._shown_job = job
        self.result.show_job(job)

    def _on_job_changed(self, job: FileJob) -> None:
        self.queue.update_job(job)
        if job.status is JobStatus.DONE and job.timings is not None and self.models.loaded is not None:
            self.library.record_run(self.models.loaded[0], job.timings.rtf)  # the Models dialog's measured speed
        if job is self._shown_job:
            self.result.set_summary(job)
        if job.error:
            self.show_error(f"{job.path.name}: {job.error}")

    def _on_speakers_named(self, job: FileJob) -> None:
        if job is self._shown_job:
            self.result.show_job(job)

    def _on_segment_added(self, job: FileJob, segment) -> None:
        if job is self._shown_job:
            self.result.append_segment(segment)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if _local_files(event.mimeData().urls()):
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        if _local_files(event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = _local_files(event.mimeData().urls())
        if paths:
            event.acceptProposedAction()
            self.add_files(paths)

    # -- exports --

    def _export_dir(self) -> str:
        return self._settings.get(Key.EXPORT_DIR) or QStandardPaths.writableLocation(
            QStandardPaths.StandardLocation.DocumentsLocation)

    def _ask_path(self, fmt: str, stem: str) -> str:
        default = str(Path(self._export_dir()) / f"{stem}.{fmt}")
        path, _ = QFileDialog.getSaveFileName(self, f"Save as {fmt.upper()}", default, _FILTERS[fmt])
        return path

    def _ask_export_captions(self, fmt: str) -> None:
        path = self._ask_path(fmt, "captions")
        if path:
            self.export_captions(fmt, path)

    def _ask_export_job(self, fmt: str) -> None:
        job = self._shown_job
        path = self._ask_path(fmt, job.path.stem) if job is not None else ""
        if path:
            self.export_job(job, fmt, path)

    def _ask_export_kept(self, entry_id: int, fmt: str) -> None:
        path = self._ask_path(fmt, self.history.entry(entry_id).title)
        if path:
            self.export_kept(entry_id, fmt, path)

    def export_kept(self, entry_id: int, fmt: str, path: str | Path) -> Path | None:
        """A transcript of the History tab, as its lines were kept."""
        lines = self.history.lines(entry_id)
        return self._save(path, fmt, [CaptionSegment(k, ln.start, ln.end, ln.text, speaker=ln.speaker)
                                      for k, ln in enumerate(lines)])

    def export_captions(self, fmt: str, path: str | Path) -> Path | None:
        """Live commits are a few words each: they are merged into readable cues (whole sentences, two
        lines at most) before they are written."""
        return self._save(path, fmt, merge_fragments(self.live.transcript))

    def export_job(self, job: FileJob, fmt: str, path: str | Path) -> Path | None:
        return self._save(path, fmt, job.segments, job.info, job.timings)

    def _save(self, path: str | Path, fmt: str, segments, info=None, timings=None) -> Path | None:
        try:
            saved = save_transcript(path, fmt, segments, info, timings)
        except OSError as exc:
            self.show_error(f"Cannot save {path}: {exc.strerror or exc}")
            return None
        self._settings.set(Key.EXPORT_DIR, str(saved.parent))
        self.statusBar().showMessage(f"Saved {saved}", 5000)
        return saved

    # -- errors and closing --

    @Slot(str)
    def show_error(self, message: str) -> None:
        """Errors go to the status bar: nothing modal, so work in progress carries on."""
        self.last_error = message
        logger.warning("%s", message)
        self.statusBar().showMessage(f"{_ERROR_MARK} {message}")

    def _showing_error(self) -> bool:
        return self.statusBar().currentMessage().startswith(_ERROR_MARK)

    def closeEvent(self, event: QCloseEvent) -> None:
        self._settings.set(Key.GEOMETRY, self.saveGeometry())
        self._settings.sync()
        self.caption_window.close()
        stop_threads(self)  # a system report still being gathered for Help → About
        self.closing.emit()
        super().closeEvent(event)
