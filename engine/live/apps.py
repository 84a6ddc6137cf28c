"""One application's sound, captured alone: a call or a video without the rest of what the computer plays.

    devices = app_inputs(pactl_json("-f", "json", "list", "sink-inputs"))  # InputDevice "app:Firefox", ...
    source = AppSource("Firefox")   # what open_input("app:Firefox") returns
    source.start()                  # Firefox's streams now play into a private sink, and on to the speakers
    samples = source.read()         # 16 kHz float32 of Firefox alone
    source.stop()                   # its streams are back where they were; the private sink is gone

PulseAudio (and PipeWire's pulse server) plays each application's stream as a "sink input". `start()` loads
a null sink of its own, moves the application's sink inputs to it and loops the null sink's monitor back to
the sink they played on, so the user still hears them; the monitor is then captured like any source
(capture.MicrophoneSource). Streams the application opens later are moved too, at the next health check.
`stop()` moves them back and unloads both modules. Modules left by a process that died (named after its
pid) are unloaded by the next start. All of it is pactl, as for the source list (capture.server_sources).

Threads: as for every source, start(), read() and stop() from one consumer thread.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field

from ..errors import DeviceError
from .capture import (APP_PREFIX, PACTL_SINK_INPUTS, PACTL_TIMEOUT_S, SERVER_SOURCE, InputDevice, MicrophoneSource,
                      _run_pactl, _spec_rate)

__all__ = ["AppSource", "app_inputs"]

logger = logging.getLogger(__name__)

_SINK_PREFIX = "aural_app_"  # then "<pid>_<n>": the null sinks this module loads
# How often a running capture looks for new streams of its application: a stream opened since (the next
# video, a call's ringtone) is moved within this many seconds.
_FOLLOW_S = 2.0
# The loopback's buffer: short enough that what the user hears stays in step with the picture, long enough
# not to underrun on a loaded machine (module-loopback's default is 200 ms).
_LOOPBACK_MS = 60


def app_inputs(sink_inputs_json: str) -> list[InputDevice]:
    """One InputDevice per application that plays a stream, from `pactl PACTL_SINK_INPUTS`, in the server's
    order; the streams of loopbacks (ours among them) are not applications. DeviceError on output it
    cannot read."""
    rates: dict[str, float] = {}  # application -> the rate of its first stream
    for stream in _sink_inputs(sink_inputs_json):
        if stream.application and not stream.loopback:
            rates.setdefault(stream.application, stream.rate)
    return [InputDevice(SERVER_SOURCE, APP_PREFIX + name, rate, False, name, is_app=True)
            for name, rate in rates.items()]


@dataclass(frozen=True)
class _SinkInput:
    index: int
    sink: int
    application: str
    loopback: bool
    rate: float  # Hz, 0 where pactl gives none


def _sink_inputs(sink_inputs_json: str) -> list[_SinkInput]:
    try:
        return [_SinkInput(int(s["index"]), int(s["sink"]), s.get("properties", {}).get("application.name", ""),
                           "loopback" in s.get("driver", ""), _spec_rate(s.get("sample_specification", "")))
                for s in json.loads(sink_inputs_json)]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DeviceError(f"unexpected output from pactl: {exc!r}") from exc


@dataclass
class _Route:
    """The modules loaded for one capture and where each moved stream came from."""

    null_sink: int  # module index
    loopback: int | None = None
    moved: dict[int, int] = field(default_factory=dict)  # sink input -> its sink before the move


class AppSource(MicrophoneSource):
    """The sound of the application called `application` (its application.name), as a live source.

    Attributes:
        application: the name as the sound server has it ("Firefox", "ZOOM VoiceEngine").
        sink: the private null sink's name while capturing; its monitor is what is recorded.
    """

    _numbers = itertools.count(1)  # of the null sinks made by this process: two captures never share a name

    def __init__(self, application: str, *, pactl: str = "pactl", **kwargs):
        self.application = application
        self.sink = f"{_SINK_PREFIX}{os.getpid()}_{next(AppSource._numbers)}"
        self._pactl = pactl
        self._route: _Route | None = None
        self._followed_at = 0.0
        super().__init__(server_source=f"{self.sink}.monitor", **kwargs)

    def _open(self) -> None:
        _unload_orphans(self._pactl)
        streams = self._streams()
        if not streams:
            raise DeviceError(f"{self.application} plays no sound now: start its audio, then captioning.")
        self._reroute(streams)
        try:
            super()._open()
        except BaseException:
            self._restore()
            raise
        self._followed_at = time.monotonic()

    def _close(self) -> None:
        super()._close()
        self._restore()

    def _check_health(self) -> None:
        super()._check_health()
        if self._route is not None and time.monotonic() - self._followed_at >= _FOLLOW_S:
            self._followed_at = time.monotonic()
            try:
                self._move([s for s in self._streams() if s.index not in self._route.moved])
            except DeviceError as exc:  # the server is gone: the capture's own health check ends the source
                logger.info("following %s's new streams failed: %s", self.application, exc)

    # -- routing --

    def _pactl_out(self, *args: str) -> str:
        return _run_pactl(self._pactl, args, PACTL_TIMEOUT_S)

    def _streams(self) -> list[_SinkInput]:
        return [s for s in _sink_inputs(self._pactl_out(*PACTL_SINK_INPUTS))
                if s.application == self.application and not s.loopback]

    def _reroute(self, streams: list[_SinkInput]) -> None:
        """Null sink, loopback to the first stream's sink, then the moves (self._route records each step as
        it is done); undone if any step fails."""
        description = re.sub(r"[^\w .-]", "", self.application)  # the module argument parser's quoting
        route = _Route(self._load("module-null-sink", f"sink_name={self.sink}",
                                  f"sink_properties='device.description=\"Aural capture of {description}\"'"))
        self._route = route
        try:
            route.loopback = self._load("module-loopback", f"source={self.sink}.monitor", f"sink={streams[0].sink}",
                                        f"latency_msec={_LOOPBACK_MS}", "source_dont_move=true", "sink_dont_move=true")
            self._move(streams)
        except DeviceError:
            self._restore()
            raise
        logger.info("capturing %s alone: %d stream(s) moved to %s", self.application, len(streams), self.sink)

    def _load(self, module: str, *args: str) -> int:
        """Loads a module; its index (DeviceError when pactl answers anything else)."""
        answer = self._pactl_out("load-module", module, *args)
        try:
            return int(answer)
        except ValueError:
            raise DeviceError(f"unexpected output from pactl load-module {module}: {answer.strip()!r}") from None

    def _move(self, streams: list[_SinkInput]) -> None:
        for stream in streams:
            self._pactl_out("move-sink-input", str(stream.index), self.sink)
            self._route.moved[stream.index] = stream.sink

    def _restore(self) -> None:
        """Moves the streams back and unloads the modules; a stream or sink that has gone meanwhile is
        skipped (unloading the null sink moves any stream still on it to the default sink)."""
        route, self._route = self._route, None
        if route is None:
            return
        for stream, sink in route.moved.items():
            _quietly(self._pactl, "move-sink-input", str(stream), str(sink))
        for module in (route.loopback, route.null_sink):
            if module is not None:
                _quietly(self._pactl, "unload-module", str(module))


def _quietly(pactl: str, *args: str) -> None:
    try:
        _run_pactl(pactl, args, PACTL_TIMEOUT_S)
    except DeviceError as exc:
        logger.info("pactl %s: %s", " ".join(args), exc)


def _unload_orphans(pactl: str) -> None:
    """Unloads the null sinks (and their loopbacks) that a process no longer running left behind."""
    # "index<TAB>name<TAB>argument" lines: pactl 16's JSON list of modules leaves out their indices.
    for line in _run_pactl(pactl, ("list", "short", "modules"), PACTL_TIMEOUT_S).splitlines():
        match = re.match(rf"(\d+)\t(\S+)\t.*\b(?:sink_name|source)={_SINK_PREFIX}(\d+)_\d+", line)
        if match and not _running(int(match.group(3))):
            logger.info("unloading %s, left by process %s", match.group(2), match.group(3))
            _quietly(pactl, "unload-module", match.group(1))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
