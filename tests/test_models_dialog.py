"""The Models dialog, offscreen, with real widgets: downloads from a real HTTP server on loopback
(tests/model_mirror.py) serving a whisper.cpp file exported from tiny.en, named `mirror-tiny.en` by the mirror's
catalog. A download installs the model and the picker offers it; a cancel keeps a resumable partial; Delete frees
the disk and forgets the model; a server that is down is one line in the dialog; closing mid-download stops."""

from __future__ import annotations

import shutil
import socket

import pytest
from model_mirror import catalog_entry, mirror, reset, use_mirror, write_catalog
from PySide6.QtCore import Qt

from aural.app.jobs import JobStatus
from aural.app.main import build_window
from aural.app.services import Catalog
from aural.app.settings import Key
from aural.app.speed import SpeedReference, Speeds
from aural.app.workers import worker_threads

NAME = "mirror-tiny.en"
MODEL_S = 120_000  # ms: loads and conversions on a busy 2-core machine
PULL_S = 180_000  # ms: a download of 74 MiB over loopback, its checksums and its conversion
FILE_S = 240_000  # ms for the JFK clip on a busy machine (as in test_app)
JFK_WORDS = "and so my fellow americans ask not what your country can do for you ask what you can do for your country"


@pytest.fixture(scope="module")
def served(tiny_ggml, tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    (root / tiny_ggml.name).hardlink_to(tiny_ggml)
    write_catalog(root, [catalog_entry(NAME, tiny_ggml, file=tiny_ggml.name)])
    with mirror(root) as (url, state):
        yield url, state


@pytest.fixture
def cache(tiny_gguf, tmp_path, monkeypatch):
    """An empty cache but for the packaged tiny.en, already converted (the window loads it at once)."""
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    for path in (tiny_gguf, tiny_gguf.with_name(tiny_gguf.name + ".sha256")):
        shutil.copy(path, models / path.name)
    monkeypatch.setenv("AURAL_USER_DATA_DIR", str(tmp_path / "user-data"))
    return models


@pytest.fixture
def site(served, cache, monkeypatch):
    url, state = served
    reset(state)
    use_mirror(monkeypatch, url, cache.parent)
    return state


def words(text: str) -> list[str]:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text).replace(".", " ").split()


def _no_inputs():
    return []


@pytest.fixture
def window(qtbot, settings, cache, jfk_wav):
    """The app's window, its live captions replaying JFK at real-time pace."""
    from aural.engine.live.capture import ReplaySource

    window = build_window(settings, open_source=lambda _device: ReplaySource(jfk_wav),
                          catalog=Catalog(input_devices=_no_inputs, pactl=""))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        window.show()
    qtbot.waitExposed(window)
    return window


def open_dialog(window, qtbot, name=NAME):
    """The Models dialog opened from the button beside the model picker, once it lists `name`."""
    qtbot.mouseClick(window.controls.manage_models_button, Qt.MouseButton.LeftButton)
    dialog = window._models_dialog
    qtbot.waitUntil(lambda: any(row.name == name for row in window.library.rows), timeout=30_000)
    return dialog


def click(qtbot, dialog, name, text):
    qtbot.mouseClick(dialog.button(name, text), Qt.MouseButton.LeftButton)


def enabled(dialog, name, text) -> bool:
    """Whether the row shows an enabled `text` button. False while it has none (its primary button still
    reads "Cancel" until the failed pull is reported back): waitUntil gives up on any exception but
    AssertionError, so a lookup that raises would end the wait at once."""
    try:
        return dialog.button(name, text).isEnabled()
    except StopIteration:
        return False


def picker_names(window) -> list[str]:
    combo = window.controls.model_combo
    return [combo.itemData(i) for i in range(combo.count())]


def files_under(path):
    return sorted(p.name for p in path.rglob("*") if p.is_file()) if path.exists() else []


def record_progress(window) -> list:
    steps = []
    window.library.progress.connect(lambda step, _rate: steps.append(step))
    return steps


def test_download_installs_the_model_and_the_picker_loads_it_for_files(site, window, qtbot, jfk_wav):
    dialog = open_dialog(window, qtbot)
    assert dialog.state_text(NAME) == "not installed" and dialog.cell_text(NAME, 1) == "English only"
    assert NAME not in picker_names(window)
    qtbot.waitUntil(lambda: "(estimate)" in dialog.speed_text("large-v3"), timeout=MODEL_S)  # tiny.en's encoder, timed
    steps = record_progress(window)
    cancellable = []  # (stage, whether Cancel could be clicked), after the dialog has shown each step
    window.library.progress.connect(
        lambda step, _rate: cancellable.append((step.stage, dialog.button(NAME, "Cancel").isEnabled())))
    with qtbot.waitSignal(window.library.pulled, timeout=PULL_S):
        click(qtbot, dialog, NAME, "Download")
    stages = [s.stage for s in steps]
    assert stages[0] == "download" and stages[-2:] == ["verify", "convert"]
    assert cancellable[0] == ("download", True) and cancellable[-1] == ("convert", False)
    downloads = [s.done_bytes for s in steps if s.stage == "download"]
    assert downloads == sorted(downloads) and downloads[-1] == steps[0].total_bytes
    qtbot.waitUntil(lambda: dialog.state_text(NAME).startswith("installed (f16)"), timeout=30_000)
    assert dialog.button(NAME, "Installed").isEnabled() is False and f"{NAME} is installed" in dialog.message.text()

    combo = window.controls.model_combo
    assert NAME in picker_names(window)
    combo.setCurrentIndex(combo.findData(NAME))
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        combo.activated.emit(combo.currentIndex())
    assert window.model_status.text().startswith(f"whisper-{NAME}")
    window.add_files([str(jfk_wav)])
    job = window.files.jobs[-1]
    qtbot.waitUntil(lambda: job.status is JobStatus.DONE, timeout=FILE_S)
    assert words(" ".join(s.text for s in job.segments)) == JFK_WORDS.split()
    qtbot.waitUntil(lambda: "(measured)" in dialog.speed_text(NAME), timeout=5_000)


def test_cancel_keeps_a_resumable_partial_and_resume_finishes_it(site, window, qtbot, cache):
    site.slow = True
    dialog = open_dialog(window, qtbot)
    steps = record_progress(window)
    click(qtbot, dialog, NAME, "Download")
    qtbot.waitUntil(lambda: bool(steps) and steps[-1].done_bytes >= 2**20, timeout=30_000)
    assert "MiB/s" in dialog.progress_bar(NAME).format() and "downloading" in window.statusBar().currentMessage()
    with qtbot.waitSignal(window.library.cancelled, timeout=30_000) as cancelled:
        click(qtbot, dialog, NAME, "Cancel")
    kept = cancelled.args[1]
    qtbot.waitUntil(lambda: "kept, Download resumes" in dialog.state_text(NAME), timeout=10_000)
    assert dialog.state_text(NAME).startswith("not installed")
    assert files_under(cache / "pulled") == [f".ggml-{NAME}.bin.part"] and 2**20 <= kept < steps[0].total_bytes
    assert NAME not in picker_names(window)

    site.slow = False
    before = len(site.requests)
    with qtbot.waitSignal(window.library.pulled, timeout=PULL_S):
        click(qtbot, dialog, NAME, "Resume")
    # One download, resumed where the partial ends; the dialog may read the catalog again meanwhile (CI saw
    # /catalog.json land last), which is not a download.
    assert [r for r in site.requests[before:] if r[0] != "/catalog.json"] == [("/ggml-tiny.en.bin", f"bytes={kept}-")]
    assert files_under(cache / "pulled") == [f"ggml-{NAME}.bin", f"{NAME}-f16.gguf", f"{NAME}-f16.gguf.sha256"]


def test_another_type_converts_then_delete_frees_the_disk_and_the_default_takes_over(site, window, qtbot, cache,
                                                                                      settings):
    dialog = open_dialog(window, qtbot)
    with qtbot.waitSignal(window.library.pulled, timeout=PULL_S):
        click(qtbot, dialog, NAME, "Download")
    qtbot.waitUntil(lambda: dialog.state_text(NAME).startswith("installed (f16)"), timeout=30_000)
    dialog.wtype_combo.setCurrentIndex(dialog.wtype_combo.findData("q8_0"))
    with qtbot.waitSignal(window.library.pulled, timeout=PULL_S):
        click(qtbot, dialog, NAME, "Convert")  # from the kept download: no second GET
    qtbot.waitUntil(lambda: dialog.state_text(NAME).startswith("installed (f16, q8_0)"), timeout=30_000)
    assert [path for path, _ in site.requests].count("/ggml-tiny.en.bin") == 1
    window.open_model(NAME)
    qtbot.waitUntil(lambda: window.models.loaded == (NAME, "auto"), timeout=MODEL_S)
    qtbot.waitUntil(lambda: enabled(dialog, NAME, "Delete"), timeout=30_000)
    window.toggle_live()  # captions from the model: it cannot be deleted under them
    click(qtbot, dialog, NAME, "Delete")
    assert dialog.message.text() == f"⚠ {NAME} is in use: stop live captioning and the files, then delete it."
    assert f"{NAME}-q8_0.gguf" in files_under(cache / "pulled")
    with qtbot.waitSignal(window.live.running_changed, timeout=60_000):
        window.toggle_live()
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):
        click(qtbot, dialog, NAME, "Delete")
    assert files_under(cache / "pulled") == []
    assert NAME not in picker_names(window) and settings.get(Key.MODEL) == "tiny.en"
    assert window.controls.model_combo.currentData() == "tiny.en"
    assert window.model_status.text().startswith("whisper-tiny.en")
    message = dialog.message.text()
    assert message.startswith(f"Deleted {NAME}: ") and "MiB freed" in message and "tiny.en is loaded" in message
    qtbot.waitUntil(lambda: dialog.state_text(NAME) == "not installed", timeout=30_000)


def test_a_server_that_is_down_is_one_line_in_the_dialog_and_the_app_goes_on(cache, window, qtbot, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    use_mirror(monkeypatch, f"http://127.0.0.1:{port}", cache.parent)
    with qtbot.waitSignal(window.library.failed, timeout=30_000):  # the mirror's catalog cannot be read
        dialog = open_dialog(window, qtbot, name="tiny")
    with qtbot.waitSignal(window.library.failed, timeout=30_000) as failed:
        click(qtbot, dialog, "tiny", "Download")
    message = failed.args[0]
    assert f"Cannot reach 127.0.0.1:{port}" in message and "\n" not in message
    assert dialog.message.text() == f"⚠ {message}" and window.last_error == message
    qtbot.waitUntil(lambda: enabled(dialog, "tiny", "Download"), timeout=10_000)
    assert files_under(cache / "pulled") == [] and window.models.model is not None
    with qtbot.waitSignal(window.models.ready, timeout=MODEL_S):  # the app still loads models
        window.models.load("tiny.en", reload=True)


def test_closing_mid_download_stops_the_worker_and_keeps_the_partial(site, window, qtbot, cache):
    site.slow = True
    dialog = open_dialog(window, qtbot)
    steps = record_progress(window)
    click(qtbot, dialog, NAME, "Download")
    qtbot.waitUntil(lambda: bool(steps) and steps[-1].done_bytes >= 2**20, timeout=30_000)
    window.close()  # returns once the download has stopped
    assert not [t for t in worker_threads(window.library) if t.isRunning()]
    assert files_under(cache / "pulled") == [f".ggml-{NAME}.bin.part"]


def test_the_estimate_scales_the_timed_pass_by_parameters():
    speeds = Speeds()
    assert speeds.text("small", 244_000_000)[0] == "—"
    speeds.reference = SpeedReference("tiny.en", "CPU", 39_000_000, 0.5)  # 0.5 s per 30 s window
    assert speeds.text("tiny.en", 39_000_000)[0] == "≈ 60× faster than real time (estimate)"
    assert speeds.text("large", 39_000_000 * 120)[0] == "≈ 120 s per minute of audio (estimate)"
    speeds.record_run("tiny.en", 0.25)
    assert speeds.text("tiny.en", 39_000_000)[0] == "≈ 4× faster than real time (measured)"
