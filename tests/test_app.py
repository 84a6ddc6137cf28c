"""The desktop app, offscreen, with real widgets and the real tiny.en model.

Drops are sent as QDragEnter/Move/Drop events (QTest has no drag and drop). Live captioning runs on
audio_harness's virtual microphone: a private PulseAudio daemon whose null sink's monitor is the default
input (docs: testing-gui-and-audio).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import srt
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QThread, QUrl
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel

from aural.app import jobs
from aural.app.jobs import FileJob, JobStatus
from aural.app.main import build_window
from aural.app.services import Catalog
from aural.app.settings import Key, Settings
from aural.app.widgets.captions import CaptionsView
from aural.app.widgets.metrics import MetricsPanel
from aural.app.widgets.presentation import CaptionWindow
from aural.engine.errors import DeviceError
from aural.engine.streaming import Metrics
from audio_harness import virtual_mic  # noqa: F401 - the session's virtual microphone fixture

JFK_TEXT = ("And so my fellow Americans, ask not what your country can do for you, "
            "ask what you can do for your country.")
MODEL_S = 120_000  # ms; the model loads in seconds, but CI machines are shared
FILE_S = 240_000  # ms for one file on a busy 2-core machine (the JFK clip alone can take 20 s there)


def normalized(text: str) -> str:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture
def settings():
    store = QSettings("AuralTests", f"test-{uuid.uuid4().hex}")
    yield Settings(store)
    store.clear()
    store.sync()


def _no_inputs():
    return []


@pytest.fixture
def make_window(qtbot, settings, tiny_gguf):
    """Builds the app's window through the composition root and waits for its model."""

    def make(open_source=None, catalog=Catalog(input_devices=_no_inputs)):
        kwargs = {} if open_source is None else {"open_source": open_source}
        window = build_window(settings, catalog=catalog, **kwargs)
        qtbot.addWidget(window)
        with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
            window.show()
        qtbot.waitExposed(window)
        return window

    return make


@pytest.fixture
def window(make_window):
    return make_window()


def drop_files(window, paths) -> bool:
    """DragEnter, DragMove, Drop on the captions, as the platform sends them: to the top-level QWindow,
    which routes them to the widget under the cursor. True if the drop was accepted."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(window.captions.mapTo(window, window.captions.rect().center()))
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    target = window.windowHandle()
    enter = QDragEnterEvent(pos, *args)
    QApplication.sendEvent(target, enter)
    if not enter.isAccepted():
        return False
    QApplication.sendEvent(target, QDragMoveEvent(pos, *args))
    drop = QDropEvent(pos, *args)
    QApplication.sendEvent(target, drop)
    return drop.isAccepted()


def wait_status(qtbot, window, job, status: JobStatus, timeout=FILE_S):
    qtbot.waitUntil(lambda: job.status is status, timeout=timeout)
    assert window.queue.status_text(job.id).startswith(status.value)


def last_job(window):
    return window.files.jobs[-1]


def running_threads(*owners) -> list[QThread]:
    return [t for owner in owners for t in owner.findChildren(QThread) if t.isRunning()]


# -- files -------------------------------------------------------------------------------------------


def test_dropped_file_is_transcribed_shown_and_exported(window, settings, qtbot, jfk_wav, tmp_path, monkeypatch):
    assert drop_files(window, [jfk_wav])
    job = last_job(window)
    assert window.tabs.currentIndex() == window.files_tab
    assert window.captions.toPlainText() == ""  # queued, not pasted into the captions as a URL
    wait_status(qtbot, window, job, JobStatus.DONE)

    table = window.result.table
    shown = " ".join(table.item(row, 2).text() for row in range(table.rowCount()))
    assert normalized(shown) == normalized(JFK_TEXT)
    assert "RTF" in window.result.summary_text() and job.timings.rtf > 0
    assert float(window.queue.topLevelItem(0).text(4)) == pytest.approx(job.timings.rtf, abs=0.01)

    table.setCurrentCell(table.rowCount() - 1, 2)  # a click on the last segment shows its time
    assert window.result.selected_time_text().startswith(f"Segment {table.rowCount()}: 00:00:")

    out = tmp_path / "jfk.srt"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), "SubRip subtitles (*.srt)"))
    qtbot.mouseClick(window.result.export_button("srt"), Qt.MouseButton.LeftButton)
    subs = list(srt.parse(out.read_text(encoding="utf-8")))
    assert subs and all(s.start < s.end for s in subs)
    assert normalized(" ".join(s.content for s in subs)) == normalized(JFK_TEXT)
    assert settings.get(Key.EXPORT_DIR) == str(tmp_path)

    saved = window.export_job(job, "json", tmp_path / "jfk.json")
    assert '"segments"' in saved.read_text(encoding="utf-8")


def test_cancel_a_running_file(window, qtbot, data_dir):
    assert drop_files(window, [data_dir / "en_librivox_shakespeare_sonnet001.mp3"])
    job = last_job(window)
    qtbot.waitUntil(lambda: job.status is JobStatus.RUNNING, timeout=10_000)
    qtbot.mouseClick(window.queue.cancel_button(job.id), Qt.MouseButton.LeftButton)
    assert job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED)
    # The engine finishes the 30 s window it is decoding; then the worker stops.
    wait_status(qtbot, window, job, JobStatus.CANCELLED)
    assert not window.queue.cancel_button(job.id).isEnabled()
    qtbot.waitUntil(lambda: not running_threads(window.files), timeout=10_000)
    assert window.last_error == ""


def test_unreadable_files_show_an_error_and_the_window_stays_usable(window, qtbot, tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" + os.urandom(2000))
    assert drop_files(window, [broken, tmp_path / "missing.mp3"])  # two at once
    first, second = window.files.jobs
    wait_status(qtbot, window, first, JobStatus.FAILED, timeout=30_000)
    assert first.error and first.error in window.queue.status_text(first.id)
    wait_status(qtbot, window, second, JobStatus.FAILED, timeout=30_000)
    assert "missing.mp3" in window.statusBar().currentMessage() and "not found" in window.last_error
    assert window.isVisible() and window.controls.start_button.isEnabled()
    window.show_job(first)  # the failed file's view explains why
    assert first.error in window.result.summary_text()


def test_drop_of_non_files_is_refused(window):
    mime = QMimeData()
    mime.setText("just text")
    enter = QDragEnterEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, enter)
    assert not enter.isAccepted()


# -- live captioning ---------------------------------------------------------------------------------


@pytest.mark.audio
def test_live_captions_from_the_virtual_microphone(virtual_mic, make_window, qtbot, jfk_wav):
    window = make_window(catalog=Catalog())  # the real microphone path and device list
    assert window.controls.device_combo.isEnabled()
    levels = []
    window.live.level.connect(levels.append)
    with qtbot.waitSignal(window.live.running_changed, timeout=5000):
        qtbot.mouseClick(window.controls.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(levels), timeout=10_000)  # capturing: the clip will not be clipped
    player = virtual_mic.play(jfk_wav, wait=False)
    try:
        qtbot.waitUntil(lambda: "country" in normalized(window.captions.committed_text()), timeout=FILE_S)
    finally:
        player.wait(30)
    panel = window.metrics
    assert float(panel.value_text("rtf").split(" / ")[0]) > 0
    compute, kv_io = (float(v) for v in panel.value_text("split").removesuffix(" ms").split(" · "))
    assert compute > 0 and kv_io == 0  # KV on the device: no KV traffic per token
    assert panel.plotted_tokens() > 0
    assert panel.value_text("backend").startswith(f"{window.models.model.backend} / ")
    assert max(levels) > 0.01

    with qtbot.waitSignal(window.live.running_changed, timeout=FILE_S):
        qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert window.controls.start_button.text() == "Start"
    words = normalized(window.captions.committed_text()).split()
    reference = normalized(JFK_TEXT).split()
    assert sum(w in words for w in reference) >= 0.8 * len(reference)
    assert [s.text for s in window.live.transcript] and window.last_error == ""


def test_no_device_shows_an_error_and_the_window_stays_usable(make_window, qtbot):
    def no_microphone(_device):
        raise DeviceError("No microphone available: Error querying device -1")

    window = make_window(open_source=no_microphone)
    with qtbot.waitSignal(window.live.running_changed, timeout=5000,
                          check_params_cb=lambda running: not running):
        qtbot.keyClick(window, Qt.Key.Key_Space)  # the Start shortcut
    assert "No microphone available" in window.statusBar().currentMessage()
    assert window.controls.start_button.text() == "Start" and window.controls.start_button.isEnabled()
    window.captions.append_commit("still here")  # the views keep working
    assert window.captions.committed_text() == "still here"


def test_no_sound_server_in_a_real_process(tiny_gguf, tmp_path):
    """The real microphone path with no server at all: PortAudio lists no device and cannot open one."""
    script = textwrap.dedent("""
        from PySide6.QtCore import QSettings, QTimer
        from PySide6.QtWidgets import QApplication
        from aural.app.main import build_window
        from aural.app.settings import Settings
        app = QApplication([])
        store = QSettings("AuralTests", "no-server")
        window = build_window(Settings(store))
        window.show()
        def start():
            window.toggle_live()
            window.live.running_changed.connect(lambda running: running or app.quit())
        window.models.ready.connect(lambda _model: QTimer.singleShot(0, start))
        window.models.failed.connect(lambda message: app.exit(3))
        QTimer.singleShot(120_000, lambda: app.exit(4))
        code = app.exec()
        print("DEVICES:", window.controls.device_combo.currentText())
        print("ERROR:", window.last_error)
        print("USABLE:", window.controls.start_button.text(), window.controls.start_button.isEnabled())
        window.close()
        store.clear()
        raise SystemExit(code)
    """)
    env = dict(os.environ, PULSE_SERVER="unix:/nonexistent", QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "DEVICES: No input device found" in proc.stdout
    assert "ERROR: No microphone available" in proc.stdout
    assert "USABLE: Start True" in proc.stdout


def test_model_failure_shows_an_error_and_another_model_can_be_picked(settings, qtbot, tiny_gguf, tmp_path):
    settings.set(Key.MODEL, str(tmp_path / "missing.gguf"))
    window = build_window(settings, catalog=Catalog(input_devices=_no_inputs))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.models.failed, timeout=MODEL_S):
        window.show()
    assert "missing.gguf does not exist" in window.statusBar().currentMessage()
    assert window.model_status.text() == "No model loaded"

    combo = window.controls.model_combo
    combo.setCurrentIndex(combo.findData("tiny.en"))
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        combo.activated.emit(combo.currentIndex())
    assert window.model_status.text().startswith("whisper-tiny.en")
    assert settings.get(Key.MODEL) == "tiny.en"


def test_closing_during_work_stops_the_workers(make_window, qtbot, jfk_wav):
    from aural.engine.capture import ReplaySource

    window = make_window(open_source=lambda _device: ReplaySource(jfk_wav))
    window.toggle_live()
    window.add_files([str(jfk_wav)])
    qtbot.waitUntil(lambda: bool(running_threads(window.live) and running_threads(window.files)), timeout=10_000)
    window.close()  # returns once both workers have stopped
    assert not running_threads(window.live, window.files, window.models)


# -- views and settings ------------------------------------------------------------------------------


def test_captions_dim_the_tentative_tail_and_stop_following_when_scrolled_up(qtbot):
    view = CaptionsView()
    qtbot.addWidget(view)
    view.resize(300, 120)
    view.show()
    view.append_commit("And so my fellow Americans,")
    view.set_partial("ask not what")
    assert view.toPlainText() == "And so my fellow Americans, ask not what"
    cursor = view.textCursor()
    cursor.setPosition(3)
    committed_format = cursor.charFormat()
    cursor.setPosition(len(view.toPlainText()))
    assert cursor.charFormat().fontItalic() and not committed_format.fontItalic()
    assert cursor.charFormat().foreground().color() != committed_format.foreground().color()
    view.append_commit("ask not what your country can do for you,")
    assert view.committed_text().endswith("for you,") and view.partial_text() == ""

    for n in range(100):
        view.append_commit(f"line {n}")
    bar = view.verticalScrollBar()
    assert view.following and bar.value() == bar.maximum() > 0
    bar.setValue(0)  # the user scrolls up to read
    view.append_commit("more text")
    assert not view.following and bar.value() == 0
    bar.setValue(bar.maximum())
    view.append_commit("and more")
    assert view.following and bar.value() == bar.maximum()


def _metrics(**changes):
    base = Metrics(audio_s=4.0, window_s=4.0, n_steps=4, step_ms=420.0, rtf=0.31, rtf_mean=0.35, encoder_ms=210.0,
                   n_tokens=12, decode_ms_per_token=9.5, compute_ms_per_token=7.25, kv_io_ms_per_token=0.0,
                   kv_tokens=40, kv_mib=0.88, graph_builds=3, graph_reuses=41, first_partial_s=1.2,
                   commit_lag_s=0.8, dropped_blocks=0, backend="CUDA", device="CUDA0", kv_mode="device")
    return replace(base, **changes)


def test_metrics_panel_shows_each_number_and_warns_about_cpu_fallback(qtbot):
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_metrics(_metrics())
    assert panel.value_text("rtf") == "0.31 / 0.35"
    assert panel.value_text("split") == "7.25 · 0.00 ms"
    assert panel.value_text("kv") == "40 tokens · 0.88 MiB"
    assert panel.value_text("graphs") == "41 reused · 3 built"
    assert panel.value_text("latency") == "1.20 s · 0.80 s"
    assert panel.value_text("backend") == "CUDA / CUDA0 · KV on device"
    assert panel.fallback_text() == "" and panel.plotted_tokens() == 12
    panel.set_metrics(_metrics(fallback_ops=("ROPE", "CONV_1D"), n_tokens=400))
    assert "ROPE, CONV_1D" in panel.fallback_text()
    assert panel.plotted_tokens() == 300
    panel.reset()
    assert panel.value_text("rtf") == "—" and panel.fallback_text() == ""


def test_caption_window_shows_the_latest_text_large(qtbot):
    captions = CaptionWindow()
    qtbot.addWidget(captions)
    captions.resize(800, 300)
    captions.show()
    for n in range(30):
        captions.append_commit(f"sentence number {n} <b>")
    captions.set_partial("tentative")
    assert "sentence number 29 &lt;b&gt;" in captions.text() and "sentence number 0 " not in captions.text()
    assert "tentative" in captions.text()
    label = captions.findChild(QLabel, "captionText")
    small = label.font().pixelSize()
    captions.resize(800, 600)
    qtbot.waitUntil(lambda: label.font().pixelSize() > small)


def test_eta_counts_down_between_progress_reports(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(jobs, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    job = FileJob(1, Path("talk.wav"), None, "device", started=100.0)
    assert job.fraction is None and job.eta_s is None
    clock[0] = 110.0
    job.report_progress(30.0, 60.0)  # 10 s for the first 30 s of audio
    assert job.fraction == 0.5 and job.eta_s == pytest.approx(10.0)
    clock[0] = 114.0
    assert job.eta_s == pytest.approx(6.0)
    clock[0] = 130.0
    assert job.eta_s == 0.0


def test_settings_persist_between_windows(make_window, settings, qtbot):
    window = make_window()
    window.resize(790, 560)
    window.controls.set_kv_mode("host")
    window.controls.kv_combo.activated.emit(window.controls.kv_combo.currentIndex())
    window.close()
    assert settings.get(Key.KV_MODE) == "host"
    assert not settings.get(Key.GEOMETRY).isEmpty()

    again = make_window()
    assert again.controls.kv_combo.currentData() == "host"
    assert (again.width(), again.height()) == (790, 560)
