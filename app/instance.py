"""One Aural per user: a later launch hands its files to the running app and exits.

The running app listens on a local socket (QLocalServer) named after the user id, in $XDG_RUNTIME_DIR
(private to the user; tests point it at a folder of their own) or, where that is unset, the temporary
folder. A launch first connects to it: when an app answers, the launch sends its files (absolute paths:
the app has its own working folder) as one JSON line, waits for the app's "ok" and exits. When nothing
answers, the launch becomes the app: a socket file that a killed app left behind refuses connections
and is removed (QLocalServer.removeServer) before listening. A lock file held from the connect until
listening keeps two launches at the same moment from both becoming the app.

Usage, as `main.main` does it:

    instance = SingleInstance()          # once the QApplication exists
    if not instance.claim(paths):        # another app answered and took the paths
        return 0
    ...                                  # this process is the app: build the window
    instance.launched.connect(window.open_launch)

Threads: GUI thread only. `claim` blocks its caller for at most a few seconds (before the window
exists); from then on the server runs in the event loop, and `launched` is emitted on the GUI thread.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, QTimer, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

__all__ = ["NotAnswering", "SingleInstance", "server_path"]

logger = logging.getLogger(__name__)

_TIMEOUT_MS = 5000  # a running app answers within milliseconds; a hung one is given this long
_REPLY = b"ok\n"


class NotAnswering(RuntimeError):
    """An app is running, but it took the connection and sent no answer (it hangs)."""


def server_path() -> Path:
    """The socket of this user's running app: one per user id, in the user's runtime folder."""
    folder = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(folder) / f"aural-{os.getuid()}"


class SingleInstance(QObject):
    """This user's one running app: the server that later launches hand their files to.

    Attributes:
        path: the server's socket (`server_path()`).
        listening: whether this process serves later launches (after `claim` returned True).
    """

    launched = Signal(list)  # absolute paths (maybe none) from a later launch

    def __init__(self, path: Path | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.path = path or server_path()
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)  # the user's own launches only
        self._server.newConnection.connect(self._accept)
        self._clients: dict[QLocalSocket, bytearray] = {}  # connected launches and what each sent so far

    @property
    def listening(self) -> bool:
        return self._server.isListening()

    def claim(self, paths: Sequence[str]) -> bool:
        """Hands `paths` to the running app and returns False, or makes this process the app and returns
        True. Raises NotAnswering when an app took the connection but did not answer."""
        lock = QLockFile(f"{self.path}.lock")
        # Stale lock files (their process is gone) are taken over; an unlocked claim still works, racily.
        if not lock.tryLock(_TIMEOUT_MS):
            logger.warning("%s stayed locked; going on without it", lock.fileName())
        try:
            if self._hand_over(paths):
                return False
            listening = self._listen()
        finally:
            lock.unlock()
        if listening:  # said once the lock is free: a launch that reads this finds the app alone
            logger.info("serving later launches at %s", self.path)
        return True

    def _hand_over(self, paths: Sequence[str]) -> bool:
        """True when a running app took `paths`; False when none answers the connection."""
        if self.path.exists() and self.path.stat().st_uid != os.getuid():
            logger.warning("%s belongs to another user: not sending it anything", self.path)
            return False
        socket = QLocalSocket()
        socket.connectToServer(str(self.path))
        if not socket.waitForConnected(_TIMEOUT_MS):
            return False  # no socket file, or one that a killed app left (connection refused)
        socket.write(json.dumps({"files": list(paths)}).encode() + b"\n")
        answered = socket.waitForBytesWritten(_TIMEOUT_MS) and _read_reply(socket)
        socket.abort()
        if not answered:
            raise NotAnswering(f"Aural is already running but does not answer (at {self.path}); close it and "
                               "try again.")
        return True

    def _listen(self) -> bool:
        QLocalServer.removeServer(str(self.path))  # nothing answered there: a killed app's socket, if any
        if self._server.listen(str(self.path)):
            return True
        # The app still works, only not as the one instance.
        logger.warning("cannot serve later launches at %s: %s", self.path, self._server.errorString())
        return False

    # -- the server side --

    def _accept(self) -> None:
        while (socket := self._server.nextPendingConnection()) is not None:
            socket.setParent(None)  # owned here (by `_clients`), so it is freed when dropped from there
            self._clients[socket] = bytearray()
            socket.readyRead.connect(partial(self._read, socket))
            socket.disconnected.connect(partial(self._forget, socket))

    def _read(self, socket: QLocalSocket) -> None:
        received = self._clients.get(socket)
        if received is None:
            return
        received += bytes(socket.readAll())
        line, newline, _ = received.partition(b"\n")
        if not newline:
            return
        try:
            paths = json.loads(line)["files"]
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise ValueError(f"not a list of paths: {paths!r}")
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("a later launch sent something unreadable: %s", exc)
            socket.abort()
            return
        socket.write(_REPLY)
        socket.flush()
        socket.disconnectFromServer()
        logger.info("a later launch handed over %d file(s)", len(paths))
        self.launched.emit(paths)

    def _forget(self, socket: QLocalSocket) -> None:
        # Dropped on the next turn of the event loop: deleting a socket inside its own signal is unsafe.
        QTimer.singleShot(0, partial(self._clients.pop, socket, None))


def _read_reply(socket: QLocalSocket) -> bool:
    received = b""
    while not received.endswith(b"\n"):
        if not socket.waitForReadyRead(_TIMEOUT_MS):
            return False
        received += bytes(socket.readAll())
    return received == _REPLY
