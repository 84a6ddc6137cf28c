"""The live session journal: every committed caption is on disk before anyone sees it.

A session is one JSON Lines file in `<user data>/sessions/`: a header (model, start time, who wrote
it), one line per commit (text, start, end, wall time), and a closing line when the writer stops
cleanly. Each commit is flushed and `os.fsync`ed, so a crash, a SIGKILL or a power cut loses no
committed text; a session without its closing line did not end cleanly and can be restored.

While a writer has a session open it holds an advisory `flock` on the file, which the kernel drops
when the process dies however it dies: a locked session belongs to a running process (another window,
`aural live`) and is never offered for restoring.

<user data> is $AURAL_USER_DATA_DIR or platformdirs.user_data_dir("aural") (~/.local/share/aural
on Linux); platformdirs is already how the model cache finds its folder.

    journal = SessionJournal(model="whisper-tiny.en", source="aural live")
    journal.record(samples)                                   # the audio too, when the user keeps it
    journal.append("ask not what your country", 1.2, 2.9)   # on disk when this returns
    journal.close()                                           # a clean stop

A session's audio, when kept, is `<journal>.flac` beside it (16 kHz mono, 16-bit FLAC: about 60 MB an hour),
on the journal's timeline, so the History tab plays it under the text and can find its speakers. It is
written as it comes but not fsynced: the text is what a crash must never lose. Pruning leaves it alone
(the library may still show the session); deleting the session from the library deletes it.

    for session in unclosed_sessions():
        print(session.started, session.text)
        mark_session(session.path, "discarded")
    prune_sessions()                                          # ended over KEEP_DAYS ago: deleted
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import platformdirs
import soundfile as sf

__all__ = ["AUDIO_RATE", "KEEP_DAYS", "OUTCOMES", "JournalEntry", "Session", "SessionJournal", "audio_of", "mark_session", "prune_sessions", "read_session", "sessions_dir", "unclosed_sessions", "user_data_dir"]

logger = logging.getLogger(__name__)

_DATA_ENV = "AURAL_USER_DATA_DIR"  # not AURAL_DATA_DIR: the tests' speech clips already use that name
_VERSION = 1
# How a session ended: the writer stopped, or the user dealt with an unclosed one on the next launch.
OUTCOMES = ("stopped", "restored", "discarded")
# Ended sessions are kept this long (days) for anyone who wants to look back, then pruned at the next
# launch; the app's transcript panel is the place to keep text for good (export).
KEEP_DAYS = 30.0
_serial = itertools.count(1)  # file names stay unique within a process and a second
AUDIO_RATE = 16000  # Hz, what the live engine reads


def audio_of(journal: Path) -> Path:
    """Where a session's audio is kept, when it is."""
    return journal.with_suffix(".flac")


def user_data_dir() -> Path:
    """Aural's user data folder: $AURAL_USER_DATA_DIR, else platformdirs' (~/.local/share/aural)."""
    return Path(os.environ.get(_DATA_ENV) or platformdirs.user_data_dir("aural"))


def sessions_dir() -> Path:
    """Folder of session journals: the user data folder's sessions/."""
    return user_data_dir() / "sessions"


@dataclass(frozen=True)
class JournalEntry:
    """One committed caption.

    Attributes:
        text: the committed words.
        start: start in seconds on the writer's timeline (the input for `aural live`, the transcript for the app).
        end: end in seconds on the same timeline.
        wall: time.time() when it was journaled.
    """

    text: str
    start: float
    end: float
    wall: float


@dataclass(frozen=True)
class Session:
    """A journal as read back.

    Attributes:
        path: the file.
        model: the model named in the header.
        source: who wrote it ("app", "aural live").
        started: time.time() when the session began.
        entries: the commits, in order.
        outcome: one of OUTCOMES, or None when the session never closed.
    """

    path: Path
    model: str
    source: str
    started: float
    entries: tuple[JournalEntry, ...]
    outcome: str | None

    @property
    def text(self) -> str:
        return " ".join(e.text for e in self.entries)

    @property
    def started_label(self) -> str:
        """The local start time for people, e.g. "2026-11-30 01:20"."""
        return datetime.fromtimestamp(self.started).strftime("%Y-%m-%d %H:%M")


class SessionJournal:
    """Writes one session. The file is created with the first entry, so a session in which nothing was
    committed leaves nothing behind; an entry after `close()` begins a new session in a new file.
    Thread-safe: a worker appends while the GUI thread may close it.

    Attributes:
        model: the model named in the header (may change until the first entry).
        source: who writes it ("app", "aural live").
        path: the current file, None before the first entry.
    """

    def __init__(self, *, model: str = "", source: str, directory: Path | None = None):
        self.model = model
        self.source = source
        self.directory = directory or sessions_dir()
        self.path: Path | None = None
        self._stem: Path | None = None  # the session's name, chosen by its first commit or audio
        self._file = None
        self._audio: sf.SoundFile | None = None
        self._lock = threading.Lock()

    def record(self, samples: np.ndarray, at_s: float = 0.0) -> None:
        """Keeps audio (float32, 16 kHz mono) right after the audio kept so far, and no earlier than `at_s`
        seconds into the journal's timeline: time not recorded before that (a pause between runs, restored
        text) is kept as silence. A run passes its start as `at_s` with every block."""
        with self._lock:
            if self._audio is None:
                self._audio = sf.SoundFile(audio_of(self._session_stem()), "w", AUDIO_RATE, 1, "PCM_16", format="FLAC")
            gap = int(round(at_s * AUDIO_RATE)) - self._audio.frames
            if gap > 0:
                self._audio.write(np.zeros(gap, np.float32))
            self._audio.write(np.clip(np.asarray(samples, np.float32).reshape(-1), -1.0, 1.0))

    def _session_stem(self) -> Path:
        if self._stem is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            stamp = datetime.fromtimestamp(time.time()).strftime("%Y%m%d-%H%M%S")
            self._stem = self.directory / f"session-{stamp}-{os.getpid()}-{next(_serial)}.jsonl"
        return self._stem

    def append(self, text: str, start: float, end: float) -> None:
        """Journals one commit; it is on disk (fsync) when this returns."""
        self.extend([(text, start, end)])

    def extend(self, commits: list[tuple[str, float, float]]) -> None:
        """Journals several commits with one fsync (restored text adopted by a new session)."""
        if not commits:
            return
        now = time.time()
        lines = [{"type": "commit", "text": text, "start": round(start, 3), "end": round(end, 3), "wall": now}
                 for text, start, end in commits]
        with self._lock:
            if self._file is None:
                self._open()
            self._write(lines)

    def close(self) -> None:
        """A clean stop: writes the closing line (when anything was journaled), releases the file and keeps
        the session in the transcript library beside the sessions folder (history.History). Safe to call
        twice."""
        with self._lock:
            audio, self._audio = self._audio, None
            if audio is not None:
                audio.close()
            stem, self._stem = self._stem, None
            if self._file is None:  # nothing committed: no session, and no audio kept for it
                if audio is not None:
                    audio_of(stem).unlink(missing_ok=True)
                return
            self._write([{"type": "end", "outcome": "stopped", "wall": time.time()}])
            self._file.close()  # drops the flock
            self._file = None
            path = self.path
        _keep_in_history(path)

    def _open(self) -> None:
        started = time.time()
        self.path = self._session_stem()
        self._file = open(self.path, "x", encoding="utf-8")
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        header = {"type": "header", "version": _VERSION, "model": self.model, "source": self.source,
                  "started": started}
        self._write([header])
        _fsync_dir(self.directory)  # the new name itself must survive a power cut
        logger.info("journaling the session to %s", self.path)

    def _write(self, lines: list[dict]) -> None:
        self._file.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        self._file.flush()
        os.fsync(self._file.fileno())


def _keep_in_history(path: Path) -> None:
    """The ended session into the library next to its folder (<user data>/history.sqlite3 by default). The
    journal stays the durable copy: a library that cannot be written costs a warning, not the session."""
    from ..history import History, HistoryError, Line  # the library imports this module

    session = read_session(path)
    if session is None or not session.entries:
        return
    lines = [Line(e.start, e.end, e.text) for e in session.entries]
    title = f"Live session {session.started_label}"
    try:
        with History(path.parent.parent / "history.sqlite3") as history:
            history.add("live", title, lines, source=session.source, model=session.model, language="",
                        duration_s=lines[-1].end, journal=str(path), created=session.started)
    except HistoryError as e:
        logger.warning("%s", e)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_session(path: Path) -> Session | None:
    """The session in `path`; None (logged) when it is not a journal. A torn last line, left by a crash
    in the middle of a write, is skipped: every line before it was fsynced whole."""
    header, entries, outcome = None, [], None
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
                kind = line["type"]
                if kind == "header":
                    header = line
                elif kind == "commit":
                    entries.append(JournalEntry(str(line["text"]), float(line["start"]), float(line["end"]),
                                                float(line["wall"])))
                elif kind == "end":
                    outcome = str(line["outcome"])
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("%s:%d: skipping an unreadable line (%s)", path, number, exc)
    if header is None:
        logger.warning("%s is not a session journal (no header)", path)
        return None
    return Session(path, str(header.get("model", "")), str(header.get("source", "")), float(header["started"]),
                   tuple(entries), outcome)


def unclosed_sessions(directory: Path | None = None) -> list[Session]:
    """Sessions that never closed and whose writer is gone, oldest first."""
    directory = directory or sessions_dir()
    found = []
    for path in sorted(directory.glob("session-*.jsonl")):
        try:
            if _in_use(path):
                continue
            session = read_session(path)
        except OSError as exc:
            logger.warning("cannot read %s: %s", path, exc)
            continue
        if session is not None and session.outcome is None and session.entries:
            found.append(session)
    return sorted(found, key=lambda s: s.started)


def prune_sessions(directory: Path | None = None, *, older_than_days: float = KEEP_DAYS) -> int:
    """Deletes sessions that ended (stopped, restored or discarded) over `older_than_days` ago, so the
    folder does not grow without end; unclosed and in-use sessions are kept whatever their age.
    Returns how many files were deleted."""
    directory = directory or sessions_dir()
    cutoff = time.time() - older_than_days * 86400.0
    deleted = 0
    for path in directory.glob("session-*.jsonl"):
        try:
            # A session's file is last written when it ends, so its mtime is when it ended.
            if path.stat().st_mtime >= cutoff or _in_use(path):
                continue
            session = read_session(path)
            if session is not None and session.outcome is not None:
                path.unlink()
                deleted += 1
        except OSError as exc:
            logger.warning("cannot prune %s: %s", path, exc)
    if deleted:
        logger.info("deleted %d session journals that ended over %g days ago", deleted, older_than_days)
    return deleted


def _in_use(path: Path) -> bool:
    """Whether a live writer holds the session's lock."""
    with open(path, encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def mark_session(path: Path, outcome: str) -> None:
    """Closes an unclosed session as "restored" or "discarded"; it is no longer offered."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    # After a torn last line the closing line must start a line of its own to be read back.
    torn = not path.read_bytes().endswith(b"\n")
    line = json.dumps({"type": "end", "outcome": outcome, "wall": time.time()}) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if torn else "") + line)
        f.flush()
        os.fsync(f.fileno())
