"""Live audio input: a microphone through PortAudio, or a file replayed at real-time pace.

The inputs offered are the sound server's sources, listed with `pactl` (pulseaudio-utils; PipeWire's
pulse server answers it too): Debian's PortAudio has no PulseAudio host API, so through ALSA's pulse
plugin it sees only "pulse" and "default". A chosen source is captured through that "pulse" device with
PULSE_SOURCE set while the stream opens: libpulse takes it as the default source of each connection,
and the plugin opens one per stream. Where pactl is missing or no server answers, the PortAudio
devices are listed instead.

Both sources share one path: blocks are pushed into a preallocated ring buffer (by PortAudio's callback
thread for the microphone, by a feeder thread for a replay) and the consumer drains it with `read()`.
The push only copies and counts drops, so a slow consumer never blocks the audio thread; it loses whole
blocks instead, which `dropped_blocks` reports. Resampling from a device's native rate happens in
`read()`, on the consumer's thread.

sounddevice is imported on first use: without libportaudio2 its import raises OSError, and without a
sound server PortAudio reports no device; both become a `DeviceError` with a clear message.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..audio import SAMPLE_RATE, Resampler16k, stream_audio
from ..errors import AudioError, DeviceError

__all__ = ["APP_PREFIX", "CLOSER_THREAD", "InputDevice", "PACTL_INFO", "PACTL_LISTING", "PACTL_SINK_INPUTS", "PACTL_SOURCES", "PACTL_TIMEOUT_S", "SERVER_SOURCE", "list_input_devices", "MicrophoneSource", "open_input",
           "PushSource", "ReplaySource", "TappedSource", "parse_server_sources", "portaudio_input_devices", "server_sources"]

logger = logging.getLogger(__name__)

# A device that delivered nothing for this long is treated as gone. Callbacks normally come every
# block (0.1 s); a sound server's idle null sink renders in 2 s blocks (docs/testing-gui-and-audio.md).
_STALL_S = 5.0
# Closing a stream waits for the sound server: one that froze never answers (PortAudio's close blocked
# for good in tests/test_capture.py with the PulseAudio daemon stopped). A healthy close takes a few ms.
_CLOSE_TIMEOUT_S = 2.0
OPENER_THREAD = "aural-open-input"  # the thread that opens a stream (_within)
CLOSER_THREAD = "aural-close-input"  # the name of a background closer (_close), which the tests wait for
# Opening and starting a stream waits for the sound server too. A healthy open takes tens of ms; ALSA's pulse
# plugin blocked for good in Pa_StartStream on a source that does not exist (about one open in ten, under
# tests/test_capture.py's mix test: CI of 790c2df hung there until its 90 min limit), and a frozen server
# never answers the connection at all.
_OPEN_TIMEOUT_S = 5.0
# pactl answers in milliseconds; one that takes longer talks to a frozen server.
PACTL_TIMEOUT_S = 3.0
# pactl's arguments for the server's defaults and for its sources, as JSON (pactl 16 and later).
PACTL_INFO = ("-f", "json", "info")
PACTL_SOURCES = ("-f", "json", "list", "sources")
PACTL_SINK_INPUTS = ("-f", "json", "list", "sink-inputs")  # the streams applications play
PACTL_LISTING = (PACTL_INFO, PACTL_SOURCES, PACTL_SINK_INPUTS)  # what the input list is made of (server_sources)
# An application's sound as one input name ("app:Firefox"): apps.AppSource.
APP_PREFIX = "app:"
# InputDevice.index of a sound server's source: not a PortAudio device of its own.
SERVER_SOURCE = -1
# The PortAudio (ALSA) device that is ALSA's pulse plugin: a server's sources are captured through it.
_PULSE_DEVICE = "pulse"
# The environment is the process's: one stream at a time opens with PULSE_SOURCE set.
_PULSE_SOURCE_LOCK = threading.Lock()


def _sounddevice():
    try:
        import sounddevice
    except OSError as exc:  # sounddevice raises OSError when the PortAudio library cannot be loaded
        raise DeviceError(f"Audio input unavailable: {exc} (install libportaudio2)") from exc
    return sounddevice


@dataclass(frozen=True)
class InputDevice:
    """A capture device: a sound server's source, or a PortAudio device where no server answers.

    Attributes:
        index: PortAudio device index (what `MicrophoneSource(device=...)` takes); SERVER_SOURCE for a
            sound server's source (`MicrophoneSource(server_source=name)`).
        name: the stable name to keep in settings: the source's ("alsa_input.usb-...", "vsink.monitor"),
            else the PortAudio device's.
        default_samplerate: the device's native rate in Hz (0 when the server gives none).
        is_default: whether it is the default input (the server's default source).
        description: the server's words for the source ("Built-in Audio Analog Stereo"); "" for a
            PortAudio device, whose name is all there is.
        is_monitor: a sink's monitor: what the computer plays (system audio), not a microphone.
        is_app: one application's sound alone (apps.AppSource; name "app:<application>").
    """

    index: int
    name: str
    default_samplerate: float
    is_default: bool
    description: str = ""
    is_monitor: bool = False
    is_app: bool = False

    @property
    def label(self) -> str:
        """What a picker shows: the description, else the name."""
        return self.description or self.name

    @property
    def is_microphone(self) -> bool:
        """Whether it is an input, not something the computer plays."""
        return not (self.is_monitor or self.is_app)

    @property
    def is_server_source(self) -> bool:
        """Whether it is a sound server's source (else a PortAudio device)."""
        return self.index == SERVER_SOURCE


def list_input_devices(pactl: str = "pactl") -> list[InputDevice]:
    """The sound server's sources (`server_sources`), else the PortAudio inputs (`portaudio_input_devices`)."""
    try:
        return server_sources(pactl)
    except DeviceError as exc:
        logger.info("listing PortAudio's inputs instead of the sound server's sources: %s", exc)
        return portaudio_input_devices()


def open_input(name: str | None, devices: list[InputDevice] | None = None) -> "MicrophoneSource":
    """A source for the input called `name`: a sound server's source ("alsa_input.usb-...", a monitor) or
    a PortAudio device's name or index; the system default for None or "". `devices` is the list to look
    the name up in (default: `list_input_devices()`, which runs pactl). A name found in neither is handed
    to PortAudio, which matches a part of a device's name or fails at start() with a DeviceError."""
    if not name:
        return MicrophoneSource()
    if name.startswith(APP_PREFIX):
        from .apps import AppSource

        return AppSource(name[len(APP_PREFIX):])
    device = next((d for d in (list_input_devices() if devices is None else devices) if d.name == name), None)
    if device is None:
        return MicrophoneSource(int(name) if name.isdigit() else name)
    if device.is_server_source:
        return MicrophoneSource(server_source=device.name)
    return MicrophoneSource(device=device.index)


def portaudio_input_devices() -> list[InputDevice]:
    """The devices with at least one input channel; empty when no sound server or card answers."""
    sd = _sounddevice()
    default = sd.default.device[0]
    return [
        InputDevice(int(d["index"]), str(d["name"]), float(d["default_samplerate"]), d["index"] == default)
        for d in sd.query_devices()
        if d["max_input_channels"] > 0
    ]


def server_sources(pactl: str = "pactl", timeout_s: float = PACTL_TIMEOUT_S) -> list[InputDevice]:
    """The PulseAudio (or PipeWire-pulse) server's sources, microphones first, then the applications
    playing sound (apps.AppSource); raises DeviceError when `pactl` is missing or fails, or no server
    answers within timeout_s."""
    info, sources, sink_inputs = (_run_pactl(pactl, args, timeout_s) for args in PACTL_LISTING)
    return parse_server_sources(sources, info, sink_inputs)


def _run_pactl(pactl: str, args: tuple[str, ...], timeout_s: float) -> str:
    try:
        done = subprocess.run([pactl, *args], capture_output=True, text=True, timeout=timeout_s)
    except OSError as exc:  # not installed
        raise DeviceError(f"{pactl} cannot be run: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise DeviceError(f"{pactl} gave no answer within {timeout_s:g} s") from exc
    if done.returncode != 0:
        raise DeviceError(f"{pactl} failed: {done.stderr.strip() or f'exit status {done.returncode}'}")
    return done.stdout


def parse_server_sources(sources_json: str, info_json: str, sink_inputs_json: str = "[]") -> list[InputDevice]:
    """InputDevices from the output of `pactl PACTL_SOURCES`, `pactl PACTL_INFO` and `pactl PACTL_SINK_INPUTS`:
    microphones, then monitors, then applications, each group in the server's order; raises DeviceError on
    output it cannot read."""
    from .apps import app_inputs

    try:
        default = json.loads(info_json).get("default_source_name")
        devices = [InputDevice(SERVER_SOURCE, s["name"], _spec_rate(s.get("sample_specification", "")),
                               s["name"] == default, s.get("description") or "", _is_monitor(s))
                   for s in json.loads(sources_json)]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DeviceError(f"unexpected output from pactl: {exc!r}") from exc
    return sorted(devices, key=lambda d: d.is_monitor) + app_inputs(sink_inputs_json)  # a stable sort


def _spec_rate(spec: str) -> float:
    """44100.0 from pactl's "s16le 2ch 44100Hz"; 0.0 when it names no rate."""
    match = re.search(r"(\d+)Hz", spec)
    return float(match.group(1)) if match else 0.0


def _is_monitor(source: dict) -> bool:
    # pactl names the monitored sink in "monitor_source" (empty for other sources); PipeWire marks the class.
    return bool(source.get("monitor_source")) or source.get("properties", {}).get("device.class") == "monitor"


class _Ring:
    """Single-producer, single-consumer float32 ring buffer.

    The producer only advances `written`, the consumer only advances `read`; both are Python ints
    whose updates are atomic under the GIL, so neither side takes a lock.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._data = np.zeros(capacity, dtype=np.float32)
        self.written = 0
        self.read = 0

    @property
    def available(self) -> int:
        return self.written - self.read

    def write(self, block: np.ndarray) -> bool:
        """Copies `block` in; False (nothing copied) when it does not fit."""
        n = block.shape[0]
        if n > self.capacity - self.available:
            return False
        start = self.written % self.capacity
        first = min(n, self.capacity - start)
        self._data[start:start + first] = block[:first]
        self._data[:n - first] = block[first:]
        self.written += n
        return True

    def drain(self) -> np.ndarray:
        """Everything written and not yet read, as a new array."""
        n = self.available
        start = self.read % self.capacity
        first = min(n, self.capacity - start)
        out = np.concatenate([self._data[start:start + first], self._data[:n - first]])
        self.read += n
        return out


class _RingSource:
    """The shared half of every source: the ring, `read()`, the drop counter and the error slot.

    Attributes:
        samplerate: rate of what `read()` returns (16000).
        dropped_blocks: blocks lost because the ring was full or the device overflowed.
        error: the `DeviceError`/`AudioError` that ended the source early, else None.
        samples_read: 16 kHz samples returned by `read()` since `start()`.
    """

    def __init__(self, *, block_s: float, buffer_s: float):
        if block_s <= 0 or buffer_s < block_s:
            raise ValueError(f"need 0 < block_s <= buffer_s, got block_s={block_s}, buffer_s={buffer_s}")
        self.samplerate = SAMPLE_RATE
        self.block_s = block_s
        self.buffer_s = buffer_s
        self.dropped_blocks = 0
        self.error: Exception | None = None
        self.samples_read = 0
        self._ring = _Ring(1)
        self._resampler: Resampler16k | None = None
        self._ready = threading.Event()  # set by every push and by the end of input
        self._input_ended = True

    # -- producer side (audio thread) --

    def _push(self, block: np.ndarray) -> None:
        if not self._ring.write(block):
            self.dropped_blocks += 1
        self._ready.set()

    def _end_input(self, error: Exception | None = None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self._input_ended = True
        self._ready.set()

    # -- consumer side --

    @property
    def finished(self) -> bool:
        """True once the input has ended (stop, end of file, error) and `read()` has returned it all."""
        return self._input_ended and self._ring.available == 0

    def start(self) -> None:
        """Starts (or restarts) capturing; raises DeviceError/AudioError when the input cannot open."""
        self.stop()
        self.error = None
        self.dropped_blocks = 0
        self.samples_read = 0
        self._ready.clear()
        self._input_ended = False
        try:
            self._open()
        except BaseException:
            self._input_ended = True
            raise

    def read(self, timeout_s: float = 0.1) -> np.ndarray | None:
        """The 16 kHz float32 samples captured since the last read; None when none came within timeout_s."""
        if self._ring.available == 0 and not self._input_ended:
            self._ready.wait(timeout_s)
        self._ready.clear()  # before draining, so that a push during the drain sets it again
        self._check_health()
        raw = self._ring.drain()
        self._after_drain()
        samples = raw if self._resampler is None else self._resampler.process(raw)
        if self._resampler is not None and self._input_ended and self._ring.available == 0:
            samples = np.concatenate([samples, self._resampler.flush()])
            self._resampler = None
        if samples.size == 0:
            return None
        self.samples_read += samples.size
        return samples

    def stop(self) -> None:
        """Stops capturing; what was captured can still be read. Safe to call twice."""
        self._close()
        self._end_input()

    # -- per source --

    def _open(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _check_health(self) -> None:
        """Called by `read()`: ends the input when the producer died silently."""

    def _after_drain(self) -> None:
        """Called by `read()` after each drain: room was made in the ring."""


class MicrophoneSource(_RingSource):
    """A PortAudio input device or a sound server's source, delivered as 16 kHz mono float32.

    Opened at `samplerate` (16 kHz) when the device accepts it, else at its native rate (44.1/48 kHz);
    any rate other than 16 kHz is resampled in `read()`. A device that vanishes (PortAudio error,
    stream stopped behind our back, or no audio for 5 s) ends the source with `error` set to a
    DeviceError; `start()` opens it again.

    Attributes:
        device: PortAudio index or name substring; None for the default input.
        server_source: a sound server's source name (`InputDevice.name`), captured through PortAudio's
            "pulse" device instead of `device`; None to capture from `device`.
        requested_rate: the capture rate tried first.
        capture_rate: the rate the device was opened at (0 before `start()`).
    """

    def __init__(self, device: int | str | None = None, *, server_source: str | None = None,
                 samplerate: int = SAMPLE_RATE, block_s: float = 0.1, buffer_s: float = 60.0):
        if device is not None and server_source is not None:
            raise ValueError(f"give a device or a server source, not both: {device!r}, {server_source!r}")
        super().__init__(block_s=block_s, buffer_s=buffer_s)
        self.device = device
        self.server_source = server_source
        self.requested_rate = samplerate
        self.capture_rate = 0
        self._stream = None
        self._stopping = False
        self._health = (0, 0.0)  # (ring.written, monotonic time) when audio last arrived

    def _open(self) -> None:
        sd = _sounddevice()
        try:
            with _default_source(self.server_source):
                device = self.device if self.server_source is None else _pulse_device(sd)
                self.capture_rate = _within(_OPEN_TIMEOUT_S, lambda: _capture_rate(sd, device, self.requested_rate))
                self._ring = _Ring(round(self.buffer_s * self.capture_rate))
                self._resampler = None if self.capture_rate == SAMPLE_RATE else Resampler16k(self.capture_rate)
                self._stopping = False
                self._stream = _within(_OPEN_TIMEOUT_S, lambda: _started(sd.InputStream(
                    device=device, samplerate=self.capture_rate, channels=1, dtype="float32",
                    blocksize=round(self.block_s * self.capture_rate), callback=self._callback,
                    finished_callback=self._ready.set,
                )), dispose=_abort_and_close)
        except (sd.PortAudioError, ValueError, TimeoutError) as exc:
            self._stream = None
            # PortAudio's own words ("Error querying device -1") go to the log, not to the user.
            logger.info("opening the input %r failed: %s", self.server_source or self.device, exc)
            if self.server_source is not None:
                raise DeviceError(f"Cannot capture from {self.server_source}: the source is gone, or the sound "
                                  "server (PulseAudio or PipeWire) is not running or not answering.") from exc
            raise DeviceError("No microphone available: no input device is connected, or the sound server "
                              "(PulseAudio or PipeWire) is not running or not answering.") from exc
        self._health = (0, time.monotonic())
        logger.info("capturing from %s at %d Hz", self.server_source or self._stream.device, self.capture_rate)

    def _callback(self, indata, frames, time_info, status) -> None:
        # PortAudio's thread: copy and count only (no allocation of buffers, no logging, no locks).
        if status.input_overflow:
            self.dropped_blocks += 1
        self._push(indata[:, 0])

    def _check_health(self) -> None:
        if self._stream is None or self._input_ended:
            return
        if not self._stream.active and not self._stopping:
            self._fail("the input device stopped (disconnected or PortAudio error)")
            return
        written, since = self._health
        now = time.monotonic()
        if self._ring.written != written:
            self._health = (self._ring.written, now)
        elif now - since > _STALL_S:
            self._fail(f"the input device delivered no audio for {_STALL_S:.0f} s")

    def _fail(self, reason: str) -> None:
        logger.warning("microphone lost: %s", reason)
        self._close()
        self._end_input(DeviceError(f"Microphone lost: {reason}"))

    def _close(self) -> None:
        """Closes the stream, waiting at most _CLOSE_TIMEOUT_S: a stream that a frozen server keeps from
        closing is left to a daemon thread, so that stopping (and so the app) never hangs on it."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        self._stopping = True
        closer = threading.Thread(target=_abort_and_close, args=(stream,), name=CLOSER_THREAD, daemon=True)
        closer.start()
        closer.join(_CLOSE_TIMEOUT_S)
        if closer.is_alive():
            logger.warning("the input device did not close within %.0f s; closing it in the background",
                           _CLOSE_TIMEOUT_S)
            # sounddevice's exit clean-up (Pa_Terminate) would wait for this stream forever, and the process
            # with it (seen after a PulseAudio daemon was killed: libpulse deadlocked); the OS frees it at exit.
            atexit.unregister(_sounddevice()._exit_handler)


def _within(timeout_s: float, work: Callable, dispose: Callable | None = None):
    """work() run on a daemon thread and waited for at most timeout_s; its exception is raised here.

    Past that, TimeoutError, and the thread is left to finish alone: what it returns then goes to
    dispose (a stream that started late is closed at once, so its callback, due a block (0.1 s) after
    the start, never runs)."""
    lock = threading.Lock()
    outcome: list = []  # [(result, exception)], set under the lock unless abandoned
    abandoned = False

    def run() -> None:
        result, error = None, None
        try:
            result = work()
        except BaseException as exc:  # raised by the waiting thread
            error = exc
        with lock:
            if not abandoned:
                outcome.append((result, error))
                return
        if dispose is not None and result is not None:
            dispose(result)

    worker = threading.Thread(target=run, name=OPENER_THREAD, daemon=True)
    worker.start()
    worker.join(timeout_s)
    with lock:
        if not outcome:
            abandoned = True
            # As for a close that never ends (_close): sounddevice's exit clean-up would wait for it.
            atexit.unregister(_sounddevice()._exit_handler)
            raise TimeoutError(f"the sound server did not answer within {timeout_s:g} s")
    result, error = outcome[0]
    if error is not None:
        raise error
    return result


def _started(stream):
    stream.start()
    return stream


def _abort_and_close(stream) -> None:
    try:
        stream.abort()  # abort, not stop: stop waits for buffers a dead server never completes
        stream.close()
    except Exception as exc:  # a vanished device may fail to close; it is gone either way
        logger.debug("closing the input stream failed: %s", exc)


@contextmanager
def _default_source(name: str | None) -> Iterator[None]:
    """PULSE_SOURCE=name for the server connections made inside (none for None); the caller's own value,
    if any, is put back after, so that other streams keep the server's default."""
    if name is None:
        yield
        return
    with _PULSE_SOURCE_LOCK:
        saved = os.environ.get("PULSE_SOURCE")
        os.environ["PULSE_SOURCE"] = name
        try:
            yield
        finally:
            if saved is None:
                del os.environ["PULSE_SOURCE"]
            else:
                os.environ["PULSE_SOURCE"] = saved


def _pulse_device(sd) -> int:
    """The index of PortAudio's "pulse" device; DeviceError when ALSA's pulse plugin is not there."""
    for d in sd.query_devices():
        if d["name"] == _PULSE_DEVICE and d["max_input_channels"] > 0:
            return int(d["index"])
    raise DeviceError("Cannot capture from the sound server's sources: PortAudio has no \"pulse\" device "
                      "(install libasound2-plugins, ALSA's pulse plugin).")


def _capture_rate(sd, device: int | str | None, rate: int) -> int:
    """`rate` when the device takes it, else its native rate (raises PortAudioError when there is none)."""
    try:
        sd.check_input_settings(device=device, samplerate=rate, channels=1, dtype="float32")
        return rate
    except (sd.PortAudioError, ValueError):
        info = sd.query_devices(device, kind="input")
        logger.info("%s does not take %d Hz; capturing at %d Hz", info["name"], rate, int(info["default_samplerate"]))
        return int(info["default_samplerate"])


class ReplaySource(_RingSource):
    """An audio file played into the same ring as a microphone, for tests, benchmarks and demos.

    Attributes:
        path: the file (anything `audio.stream_audio` reads).
        speed: 1.0 pushes each block when its last sample would have been spoken (real time), 2.0 twice
            as fast; 0 pushes the next block only once the consumer has read the previous one, so the
            consumer sees the file block by block, as fast as it reads, and nothing is ever dropped.
        clock_start: time.monotonic() at which the replay's sample 0 was "spoken" (for latency).
    """

    def __init__(self, path: str | os.PathLike, *, speed: float = 1.0, block_s: float = 0.1, buffer_s: float = 60.0):
        if speed < 0:
            raise ValueError(f"speed must be 0 (as fast as read) or positive, got {speed}")
        super().__init__(block_s=block_s, buffer_s=buffer_s)
        self.path = os.fspath(path)
        self.speed = speed
        self.clock_start = 0.0
        self._halt = threading.Event()
        self._drained = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> None:
        blocks = stream_audio(self.path, chunk_s=self.block_s)  # a missing or non-audio file fails here
        self._ring = _Ring(round(self.buffer_s * SAMPLE_RATE))
        self._halt.clear()
        self._drained.set()
        self.clock_start = time.monotonic()
        self._thread = threading.Thread(target=self._feed, args=(blocks,), name="aural-replay", daemon=True)
        self._thread.start()

    def _feed(self, blocks) -> None:
        pushed = 0
        try:
            for block in blocks:
                if not self._wait_turn(pushed + block.size):
                    return
                self._push(block)
                pushed += block.size
        except AudioError as exc:
            self._end_input(exc)
        finally:
            self._end_input()

    def _wait_turn(self, end_sample: int) -> bool:
        """Waits until the block ending at `end_sample` is due; False when the replay was stopped."""
        if self.speed > 0:
            due = self.clock_start + end_sample / SAMPLE_RATE / self.speed
            return not self._halt.wait(max(0.0, due - time.monotonic()))
        while not self._drained.wait(0.1):
            if self._halt.is_set():
                return False
        self._drained.clear()
        return not self._halt.is_set()

    def _after_drain(self) -> None:
        self._drained.set()

    def _close(self) -> None:
        self._halt.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()


class PushSource(_RingSource):
    """Audio a program hands over, e.g. a WebSocket client's PCM frames, delivered like a microphone's.

    `push` never drops: when the ring is full it refuses the block (False) and the caller waits for room,
    so a sender faster than the engine is slowed down rather than losing audio. `end()` ends the input
    once what was pushed has been read.
    """

    def __init__(self, *, buffer_s: float = 30.0):
        super().__init__(block_s=0.1, buffer_s=buffer_s)
        self._ring = _Ring(round(buffer_s * SAMPLE_RATE))
        self._ended = False

    def push(self, samples: np.ndarray) -> bool:
        """Copies 16 kHz mono float32 `samples` in; False (nothing copied) while there is no room."""
        if samples.size > self._ring.capacity:
            raise ValueError(f"a block of {samples.size} samples is larger than the buffer ({self._ring.capacity})")
        if not self._ring.write(samples):
            return False
        self._ready.set()
        return True

    def end(self) -> None:
        """No more audio will come."""
        self._ended = True
        self._end_input()

    def _open(self) -> None:
        if self._ended:  # ended before the consumer started
            self._end_input()

    def _close(self) -> None:
        pass


class TappedSource:
    """A capture source passed through unchanged, every block the engine reads from it handed to `tap` too,
    in order, on the reading thread (the audio callback only fills the ring, as ever): a session's recording
    (journal.SessionJournal.record), the app's level meters.

        source = TappedSource(open_input(None), lambda block: journal.record(block))
    """

    def __init__(self, source, tap: Callable[[np.ndarray], None]) -> None:
        self._source = source
        self._tap = tap

    def read(self, timeout_s: float = 0.1) -> np.ndarray | None:
        samples = self._source.read(timeout_s)
        if samples is not None and samples.size:
            self._tap(samples)
        return samples

    def __getattr__(self, name: str):
        return getattr(self._source, name)
