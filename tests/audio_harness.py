"""A virtual microphone for tests: a private PulseAudio daemon whose null sink's monitor is the default source.

Whatever `VirtualMic.play()` plays into the sink comes out of the default capture device, through the
real path an app uses (PortAudio -> ALSA `default` -> the pulse plugin -> the server); 16 kHz mono
16-bit WAVs come out bit-exact. Recipe and pitfalls: shared/docs/testing-gui-and-audio.md, section 4:
- an idle null sink renders in 2 s blocks, so a low-latency silence player keeps it ticking and the
  first audio is awaited once (~2 s after the daemon starts);
- PortAudio lists devices only when it initialises, so `rescan_portaudio()` re-initialises it after
  the daemon is up, and "no device" cases run in a subprocess.
Sources and sinks that come and go are modules loaded into the daemon (`pulse_modules`).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["VirtualMic", "default_input_mic", "private_mic", "pulse_modules", "rescan_portaudio", "virtual_mic"]

_TOOLS = ("pulseaudio", "pactl", "pacat", "paplay")

# The daemon's whole configuration: a private socket, one null sink, its monitor as default source.
_SCRIPT = (
    "load-module module-native-protocol-unix auth-anonymous=1 socket={socket}\n"
    "load-module module-null-sink sink_name=vsink rate={rate} channels=1 format=s16le"
    " sink_properties=device.description=AuralVirtualMic\n"
    "set-default-sink vsink\n"
    "set-default-source vsink.monitor\n"
)


# How long an earlier test's input stream may still take to close in the background (live/capture.py leaves a
# stream that does not close within 2 s to a daemon thread; on a loaded 2-core VM a live test's did).
_CLOSER_WAIT_S = 60.0


# Whether PortAudio has listed the devices with a sound server up, in this process (see rescan_portaudio).
_scanned_with_server = False


def rescan_portaudio() -> None:
    """Makes PortAudio list the devices of the server now in PULSE_SERVER (it lists them only at init).
    Pa_Terminate while a background closer aborts a stream deadlocked both (CI hung in this fixture), so
    the closers are waited for first. A closer that never ends (libpulse can deadlock in a stream whose
    daemon a test killed: CI lost 17 tests to one) leaves PortAudio as it is when it has already listed
    ALSA's pulse devices once: those connect to whatever server PULSE_SERVER names when a stream opens."""
    global _scanned_with_server
    import sounddevice as sd

    from aural.engine.live.capture import CLOSER_THREAD

    for closer in [t for t in threading.enumerate() if t.name == CLOSER_THREAD]:
        closer.join(_CLOSER_WAIT_S)
        if closer.is_alive():
            if _scanned_with_server:
                warnings.warn(f"an earlier test's input stream is still closing after {_CLOSER_WAIT_S:.0f} s: "
                              "PortAudio keeps its device list")
                return
            raise RuntimeError(f"an earlier test's input stream is still closing after {_CLOSER_WAIT_S:.0f} s: "
                               "PortAudio cannot be re-initialised")
    sd._terminate()
    sd._initialize()
    _scanned_with_server = True


class VirtualMic:
    """One private PulseAudio daemon with a null sink at `rate` Hz, mono.

    Attributes:
        rate: the sink's sample rate.
        dir: the daemon's private HOME/runtime directory (holds the socket and the log).
        env: environment for pulse clients of this daemon (PULSE_SERVER set).
        server: the PULSE_SERVER value, "unix:<dir>/native".
    """

    def __init__(self, rate: int = 16000, directory: Path | None = None):
        self.rate = rate
        self.dir = directory
        self.env: dict[str, str] = {}
        self.server = ""
        self._daemon: subprocess.Popen | None = None
        self._feeder: subprocess.Popen | None = None
        self._own_dir = directory is None

    @staticmethod
    def missing_tools() -> list[str]:
        return [tool for tool in _TOOLS if shutil.which(tool) is None]

    def start(self, timeout_s: float = 15.0) -> "VirtualMic":
        """Starts the daemon and the silence feeder, and waits until the monitor delivers audio."""
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="aural-vmic-"))
        self.dir.chmod(0o700)
        socket = self.dir / "native"
        script = self.dir / "vmic.pa"
        script.write_text(_SCRIPT.format(socket=socket, rate=self.rate))
        self.server = f"unix:{socket}"
        self.env = dict(os.environ, HOME=str(self.dir), XDG_RUNTIME_DIR=str(self.dir),
                        XDG_CONFIG_HOME=str(self.dir / "config"), PULSE_SERVER=self.server)
        with open(self.dir / "pulseaudio.log", "w") as log:
            self._daemon = subprocess.Popen(
                ["pulseaudio", "--daemonize=no", "-n", "-F", str(script), "--exit-idle-time=-1",
                 "--use-pid-file=no", "--log-target=stderr", "--log-level=notice"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(socket, time.monotonic() + timeout_s)
        self._feeder = self.play_silence("vsink")
        self._wait_first_audio(timeout_s)
        return self

    def play_silence(self, sink: str) -> subprocess.Popen:
        """Digital silence into `sink` until the player is terminated: at 20 ms latency it keeps the sink
        rendering in small blocks instead of 2 s ones."""
        return subprocess.Popen(
            ["pacat", "--playback", f"--device={sink}", f"--rate={self.rate}", "--channels=1", "--format=s16le",
             "--raw", "--latency-msec=20", "/dev/zero"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pactl(self, *args: str) -> str:
        """pactl's output for `args`, asked of this daemon; RuntimeError when it fails."""
        done = subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"pactl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def _wait_ready(self, socket: Path, deadline: float) -> None:
        while not (socket.exists() and subprocess.run(["pactl", "info"], env=self.env,
                                                      capture_output=True).returncode == 0):
            if self._daemon.poll() is not None:
                raise RuntimeError(f"pulseaudio exited with {self._daemon.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"pulseaudio did not answer: {self.log_tail()}")
            time.sleep(0.02)

    def _wait_first_audio(self, timeout_s: float) -> None:
        """The null sink's first render tick comes ~2 s after the daemon starts: wait for it once."""
        recorder = subprocess.Popen(
            ["pacat", "--record", "--device=vsink.monitor", "--raw", f"--rate={self.rate}", "--channels=1",
             "--format=s16le", "--latency-msec=20"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            if not select.select([recorder.stdout], [], [], timeout_s)[0]:
                raise TimeoutError("the virtual microphone produced no audio")
            recorder.stdout.read1(self.rate // 50)
        finally:
            recorder.terminate()
            recorder.wait()

    def play(self, wav: Path, *, wait: bool = True, sink: str = "vsink") -> subprocess.Popen:
        """Plays a WAV into the sink, i.e. speaks it into the microphone (or into another sink's monitor)."""
        player = subprocess.Popen(["paplay", f"--device={sink}", str(wav)], env=self.env)
        if wait and player.wait(120) != 0:
            raise RuntimeError(f"paplay failed with {player.returncode}")
        return player

    def kill(self) -> None:
        """Kills the daemon abruptly, as when a USB microphone is pulled out."""
        for proc in (self._feeder, self._daemon):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    def freeze(self) -> None:
        """Stops the daemon (SIGSTOP) without killing it: a server that hangs; clients get no answer."""
        self._daemon.send_signal(signal.SIGSTOP)

    def restart(self) -> "VirtualMic":
        """A new daemon on the same socket, as when the sound server comes back (or the device is plugged
        back in): clients that kept PULSE_SERVER find it again. Works on a frozen daemon too."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """Stops the daemon and removes its directory (when the harness created it)."""
        for proc in (self._feeder, self._daemon):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self) -> str:
        log = self.dir / "pulseaudio.log" if self.dir else None
        return log.read_text()[-2000:] if log and log.exists() else ""


@contextlib.contextmanager
def default_input_mic() -> Iterator[VirtualMic]:
    """A running VirtualMic, made this process's default input (PULSE_SERVER, PortAudio rescanned) while the
    block runs; the tests' session and the benches that capture through a sound server use it."""
    mic = VirtualMic().start()
    saved = os.environ.get("PULSE_SERVER")
    os.environ["PULSE_SERVER"] = mic.server
    try:
        rescan_portaudio()
        yield mic
    finally:
        mic.stop()
        # Nothing captures any more, so PortAudio is not re-initialised.
        if saved is None:
            os.environ.pop("PULSE_SERVER", None)
        else:
            os.environ["PULSE_SERVER"] = saved


@pytest.fixture(scope="session")
def virtual_mic():
    """A running VirtualMic, made this process's default input (PULSE_SERVER) for the session."""
    missing = VirtualMic.missing_tools()
    if missing:
        pytest.skip(f"virtual microphone needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils)")
    with default_input_mic() as mic:
        yield mic


@pytest.fixture
def private_mic(virtual_mic):
    """`private_mic(rate=16000)` starts a VirtualMic that the test may kill and restart, and makes it this
    process's default input until the test ends; then the session's `virtual_mic` is the default again.
    Tests that kill a daemon use this one, so that the shared microphone stays up for the others."""
    mics: list[VirtualMic] = []

    # No PortAudio rescan: the session's rescan already lists ALSA's pulse devices, and each stream they
    # open connects to the server PULSE_SERVER names then. A rescan (Pa_Terminate) would also wait forever
    # for a stream that a killed daemon left stuck (live/capture.py gives up on closing such a stream).
    def start(rate: int = 16000) -> VirtualMic:
        mic = VirtualMic(rate).start()
        mics.append(mic)
        os.environ["PULSE_SERVER"] = mic.server
        return mic

    yield start
    for mic in mics:
        mic.stop()
    os.environ["PULSE_SERVER"] = virtual_mic.server


class _Modules:
    """Modules loaded into one daemon by a test: `load` returns the module's index, `unload` takes it."""

    def __init__(self, mic: VirtualMic):
        self.mic = mic
        self.loaded: list[int] = []

    def load(self, name: str, *args: str) -> int:
        index = int(self.mic.pactl("load-module", name, *args))
        self.loaded.append(index)
        return index

    def unload(self, index: int) -> None:
        self.mic.pactl("unload-module", str(index))
        self.loaded.remove(index)


@pytest.fixture
def pulse_modules(virtual_mic):
    """Loads modules (sources, sinks) into the session's daemon for one test; whatever the test leaves
    loaded is unloaded after it, so that other tests see the daemon as it was."""
    modules = _Modules(virtual_mic)
    yield modules
    for index in reversed(modules.loaded):
        virtual_mic.pactl("unload-module", str(index))
