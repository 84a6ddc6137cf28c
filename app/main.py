"""The composition root: builds the settings and the services and hands them to the main window.

`aural` with no arguments runs `main()`; `python -m aural.app` also takes demo options (see `--help`).
One app runs per user (`instance`): a later launch hands its files to it and exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QSettings, QSocketNotifier
from PySide6.QtWidgets import QApplication

from aural.engine.audio import SAMPLE_RATE
from aural.engine.history import History, HistoryError
from aural.engine.live.capture import InputDevice, ReplaySource

from .devices import DeviceWatcher
from .instance import NotAnswering, SingleInstance
from .library import ModelLibrary
from .services import Catalog, FileQueue, LiveSession, ModelService, open_microphone
from .settings import Key, Settings
from .theme import apply_theme
from .window import MainWindow

__all__ = ["build_window", "main"]

logger = logging.getLogger(__name__)


def build_window(settings: Settings, *, open_source: Callable[[str], object] = open_microphone,
                 catalog: Catalog | None = None) -> MainWindow:
    """The main window wired to fresh services; starts loading the settings' model and listing the input
    devices at once."""
    catalog = catalog or Catalog()
    models = ModelService()
    files = FileQueue(models)
    live = LiveSession(models, open_source)
    devices = DeviceWatcher(catalog.input_devices, catalog.pactl)
    library = ModelLibrary(models)
    history, history_problem = _open_history()
    window = MainWindow(settings, models, files, live, catalog, devices, library, history)
    if history_problem:
        window.show_error(history_problem)

    def shutdown() -> None:
        # Live first: it commits its tail while the file worker finishes its window.
        live.shutdown()
        files.shutdown()
        library.shutdown()  # a download stops after its current read, its partial kept for resuming
        models.shutdown()
        devices.stop()
        history.close()

    window.closing.connect(shutdown)
    models.load(settings.get(Key.MODEL), settings.get(Key.COMPUTE_DEVICE))
    devices.start()
    return window


def _open_history() -> tuple[History, str]:
    """The transcript library, or, when its file cannot be opened, one in memory for this run and why."""
    try:
        return History(), ""
    except HistoryError as e:
        return History(Path(":memory:")), f"{e}; transcripts are kept until Aural closes"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aural", description="Aural's desktop app.")
    parser.add_argument("files", nargs="*", help="audio or video files to transcribe")
    parser.add_argument("--replay", metavar="FILE",
                        help="caption FILE played at real-time pace instead of the microphone (demos, tests)")
    parser.add_argument("--start", action="store_true", help="start live captioning at once")
    parser.add_argument("--caption-window", action="store_true", help="open the caption window at once")
    parser.add_argument("--verbose", action="store_true", help="log timings and progress on stderr")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the desktop app; returns the exit code."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="aural: %(levelname)s: %(name)s: %(message)s")
    # "aural" as argv[0]: the X11 WM_CLASS and the like, whatever the launcher was called.
    app = QApplication.instance() or QApplication(["aural"])
    app.setApplicationName("Aural")
    app.setOrganizationName("Aural")
    app.setDesktopFileName("aural")
    files = [str(Path(f).absolute()) for f in args.files]  # the running app has its own working folder
    instance = SingleInstance()
    try:
        if not instance.claim(files):
            print(f"Aural is already running; {'the files were sent to it' if files else 'its window was raised'}.",
                  file=sys.stderr)
            return 0
    except NotAnswering as exc:
        print(f"aural: error: {exc}", file=sys.stderr)
        return 1
    apply_theme(app)
    window = build_window(Settings(QSettings()), **_replay(args.replay) if args.replay else {})
    instance.launched.connect(window.open_launch)
    _close_on_signals(window)
    window.show()
    window.add_files(files)
    if args.caption_window:
        window.show_caption_window()
    if args.start:
        window.toggle_live()
    return app.exec()


def _close_on_signals(window: MainWindow) -> None:
    """SIGTERM (a logout, `kill`) and SIGINT (Ctrl+C in a terminal) close the window as its close button
    does: the live tail is committed and the session journal closed, so the next launch has nothing to
    offer for restoring. Python runs signal handlers only between bytecodes and Qt's event loop runs
    none, so the signal's wake-up byte, written to a socket pair, is what wakes the loop."""
    wake, wakeup_fd = socket.socketpair()
    for end in (wake, wakeup_fd):
        end.setblocking(False)
    signal.set_wakeup_fd(wakeup_fd.fileno())
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: None)  # the work is done below, in the event loop
    notifier = QSocketNotifier(wake.fileno(), QSocketNotifier.Type.Read, window)

    def on_signal() -> None:
        wake.recv(64)
        logger.info("signal received: closing")
        window.close()

    notifier.activated.connect(on_signal)
    window.destroyed.connect(lambda: (wake.close(), wakeup_fd.close()))


def _replay(path: str) -> dict:
    """build_window arguments that make `path`, played at real-time pace, the only input device."""
    device = InputDevice(-1, f"Replay: {Path(path).name}", SAMPLE_RATE, True)
    return {"open_source": lambda _device: ReplaySource(path),
            "catalog": Catalog(input_devices=lambda: [device], pactl="")}
