"""The input devices the picker offers, kept current without ever making the GUI thread wait.

The sound server's sources and the applications playing sound are listed by three short `pactl` runs in
QProcesses (the server's defaults, its sources and its sink inputs, as JSON), so a slow or frozen server
costs the GUI nothing: a listing that takes longer than a few seconds is killed. `pactl subscribe` runs
as long as the app and reports every source that appears, changes or vanishes, every application stream
that starts or ends, and a change of the server's default; the list is then made again.
Where pactl is missing or no server answers, the PortAudio inputs (`Catalog.input_devices`) are offered
instead, and the subscription is tried again every few seconds, so that a server that starts later, or
comes back, is found.

Threads: everything here belongs to the GUI thread; QProcess reports through its signals there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from PySide6.QtCore import QObject, QProcess, QTimer, Signal, Slot

from aural.engine.errors import DeviceError
from aural.engine.live.capture import PACTL_LISTING, PACTL_TIMEOUT_S, InputDevice, parse_server_sources

__all__ = ["DeviceWatcher"]

logger = logging.getLogger(__name__)

_TIMEOUT_MS = round(PACTL_TIMEOUT_S * 1000)  # the engine's own pactl deadline: a frozen server past it
_SETTLE_MS = 100  # events come in bursts (a module load: new source, change, change): list once after them
_RETRY_MS = 5000  # after the subscription ended (no server): how soon to try again


class DeviceWatcher(QObject):
    """The sound server's sources, else the PortAudio inputs, listed again whenever they change.

    Attributes:
        devices: the latest list (`capture.InputDevice`s, microphones first); None until the first one.
        from_server: whether `devices` are the server's sources (False: the PortAudio fallback).
    """

    changed = Signal(list)  # InputDevices, whenever the list differs from the last one emitted
    failed = Signal(str)  # the PortAudio fallback cannot list either (no PortAudio library)

    def __init__(self, fallback: Callable[[], list[InputDevice]], pactl: str = "pactl",
                 parent: QObject | None = None):
        """`fallback` lists the PortAudio inputs; `pactl` is the program to ask, "" for the fallback only."""
        super().__init__(parent)
        self.devices: list[InputDevice] | None = None
        self.from_server = False
        self._fallback = fallback
        self._pactl = pactl
        self._shown: tuple | None = None  # (devices, error) last emitted
        # One process per query and one for the subscription, made once and started again: none is
        # deleted while Qt may still be delivering its signals.
        self._queries = {args: self._process(partial(self._query_ended, args)) for args in PACTL_LISTING}
        self._running = 0  # queries of the listing in flight
        self._again = False  # a refresh was asked for during a listing
        self._failure = ""  # why the listing in flight failed, if it did
        self._subscription = self._process(self._subscription_ended)
        self._subscription.readyReadStandardOutput.connect(self._on_events)
        self._stopped = False
        self._deadline = self._timer(_TIMEOUT_MS, self._time_out)
        self._settle = self._timer(_SETTLE_MS, self.refresh)
        self._retry = self._timer(_RETRY_MS, self._subscribe)

    def _process(self, ended: Callable[[bool], None]) -> QProcess:
        """A QProcess that calls `ended(True)` when it has run and ended, `ended(False)` when it could not start."""
        process = QProcess(self)
        process.finished.connect(lambda _code, _status: ended(True))
        # A program that cannot be started reports only this error: no `finished` follows.
        process.errorOccurred.connect(lambda error: error is QProcess.ProcessError.FailedToStart and ended(False))
        return process

    def _timer(self, ms: int, slot: Callable[[], None]) -> QTimer:
        timer = QTimer(self)
        timer.setSingleShot(True)
        timer.setInterval(ms)
        timer.timeout.connect(slot)
        return timer

    # -- the public side --

    def start(self) -> None:
        """Lists the devices and follows the server's changes from now on."""
        self._stopped = False
        if self._pactl:
            self._subscribe()
        else:
            self.refresh()

    @Slot()
    def refresh(self) -> None:
        """Lists the devices again; `changed` follows when the list is not the same."""
        if self._stopped:
            return
        if not self._pactl:
            self._show_fallback("")
            return
        if self._running:
            self._again = True
            return
        self._failure = ""
        self._running = len(self._queries)
        self._deadline.start()
        for args, process in self._queries.items():
            process.start(self._pactl, list(args))

    def stop(self) -> None:
        """Ends the subscription and any listing in flight (at shutdown); waits for their processes."""
        self._stopped = True
        for timer in (self._deadline, self._settle, self._retry):
            timer.stop()
        for process in (*self._queries.values(), self._subscription):
            if process.state() is not QProcess.ProcessState.NotRunning:
                process.kill()
                process.waitForFinished(1000)

    # -- listing --

    def _query_ended(self, args: tuple[str, ...], started: bool) -> None:
        process = self._queries[args]
        if not started:
            self._failure = f"{self._pactl} cannot be started: {process.errorString()}"
        elif not self._failure and (process.exitStatus() is not QProcess.ExitStatus.NormalExit
                                    or process.exitCode() != 0):
            reason = bytes(process.readAllStandardError()).decode(errors="replace").strip()
            self._failure = f"{self._pactl} failed: {reason or f'exit status {process.exitCode()}'}"
        self._running -= 1
        if self._running == 0:
            self._listed()

    def _time_out(self) -> None:
        self._failure = f"{self._pactl} gave no answer within {_TIMEOUT_MS / 1000:.0f} s"
        for process in self._queries.values():
            process.kill()  # its `finished` ends the listing

    def _listed(self) -> None:
        self._deadline.stop()
        if self._stopped:
            return
        info, sources, sink_inputs = (bytes(self._queries[args].readAllStandardOutput()).decode(errors="replace")
                                      for args in PACTL_LISTING)
        if self._failure:
            self._show_fallback(self._failure)
        else:
            try:
                self._show(parse_server_sources(sources, info, sink_inputs), from_server=True)
            except DeviceError as exc:
                self._show_fallback(str(exc))
        if self._again:
            self._again = False
            self._settle.start()  # soon, not from inside this process's own `finished`

    def _show_fallback(self, reason: str) -> None:
        if self.from_server or self.devices is None:  # once, not at every retry
            logger.info("offering PortAudio's inputs: %s", reason or "no sound server to ask")
        try:
            self._show(self._fallback(), from_server=False)
        except DeviceError as exc:
            self._show([], from_server=False, error=str(exc))

    def _show(self, devices: list[InputDevice], *, from_server: bool, error: str = "") -> None:
        self.from_server = from_server
        if self._shown == (devices, error):
            return
        self._shown = (devices, error)
        self.devices = devices
        self.changed.emit(devices)
        if error:
            self.failed.emit(error)

    # -- following the server --

    def _subscribe(self) -> None:
        if self._stopped:
            return
        if self._subscription.state() is QProcess.ProcessState.NotRunning:
            self._subscription.start(self._pactl, ["subscribe"])
        self.refresh()  # what is there now; the subscription reports what changes from here on

    def _on_events(self) -> None:
        # One line per event: "Event 'new' on source #3", "Event 'change' on server #4294967295"; an
        # application starting or ending a stream: "Event 'new' on sink-input #7".
        while self._subscription.canReadLine():
            line = bytes(self._subscription.readLine()).decode(errors="replace")
            app_stream = " on sink-input #" in line and "'change'" not in line
            if " on source #" in line or " on server" in line or app_stream:
                self._settle.start()

    def _subscription_ended(self, started: bool) -> None:
        if self._stopped:
            return
        self.refresh()  # the server is gone (or was never there): the fallback now
        if started:  # else there is no pactl, and nothing to try again
            self._retry.start()
