"""The transcript library: every transcribed file and live session, kept and searchable (SQLite FTS5).

One database, `<user data>/history.sqlite3` (the same folder as the live journal: $AURAL_USER_DATA_DIR or
platformdirs' user data dir). A transcript is a row of `transcripts` (what, when, how long, which model and
language) and its segments (start, end, text); an FTS5 index over the segments' text answers searches with
the hit's time, so a hit opens its transcript there. Chinese and Japanese text has no spaces for FTS5's
word tokenizer to split on, so a query in those scripts is matched as a substring instead.

    history = History()
    entry_id = history.add("file", "interview.mp3", segments, source="/home/me/interview.mp3",
                           duration_s=812.0, model="whisper-tiny.en", language="en")
    for hit in history.search("canoe"):
        print(hit.entry.title, hit.start, hit.marked("<b>", "</b>"))
    history.rename(entry_id, "Interview with Ada")
    line = history.lines(entry_id)[3]
    history.edit(line.id, "Ada Lovelace said so.")   # history.revert(line.id) brings the words back
    history.delete(entry_id)   # the live journal file goes with a live session

Thread-safety: one History per thread (an sqlite3 connection is used by the thread that made it); several
connections, threads or processes may use the same file (SQLite's locking; WAL journal).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import AuralError
from .live.journal import audio_of, user_data_dir
from .text.chinese import UNSPACED_CHARS

__all__ = ["KINDS", "Entry", "History", "HistoryError", "Hit", "Line", "TimedWord", "history_path"]

KINDS = ("file", "live")
_MARK_OPEN, _MARK_CLOSE = "\x02", "\x03"  # around a hit's words in Hit.snippet (see Hit.marked)
_SNIPPET_TOKENS = 16  # words of context in a snippet (FTS5's snippet() allows 1 to 64)
_UNSPACED = re.compile(f"[{UNSPACED_CHARS}]")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS transcripts (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('file', 'live')),
    title TEXT NOT NULL,
    source TEXT NOT NULL,
    created REAL NOT NULL,
    duration_s REAL,
    model TEXT NOT NULL,
    language TEXT NOT NULL,
    journal TEXT
);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY,
    transcript INTEGER NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    text TEXT NOT NULL,  -- as shown, searched and exported: the user's edit where there is one
    original TEXT,  -- the transcribed text of an edited segment, NULL while unedited
    words TEXT,  -- JSON [[start, end, word], ...] of the transcribed text, NULL without word timestamps
    speaker TEXT  -- who speaks ("Speaker 1", or the name the user gave), NULL when not diarized
);
CREATE INDEX IF NOT EXISTS segments_of ON segments (transcript, start);
CREATE VIRTUAL TABLE IF NOT EXISTS segments_fts USING fts5 (
    text, content='segments', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS segments_ai AFTER INSERT ON segments BEGIN
    INSERT INTO segments_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS segments_ad AFTER DELETE ON segments BEGIN
    INSERT INTO segments_fts (segments_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS segments_au AFTER UPDATE OF text ON segments BEGIN
    INSERT INTO segments_fts (segments_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO segments_fts (rowid, text) VALUES (new.id, new.text);
END;
"""
# Version 2 added segments.speaker; a version 1 library gets the column on opening (_upgrade).
_VERSION = 2
_LINE_COLUMNS = 'start, "end", text, words, id, original, speaker'
_ENTRY_COLUMNS = "t.id, t.kind, t.title, t.source, t.created, t.duration_s, t.model, t.language, t.journal"


class HistoryError(AuralError):
    """The library cannot be read or written, or an entry does not exist."""


@dataclass(frozen=True)
class Entry:
    """One kept transcript.

    Attributes:
        id: its key in the library.
        kind: "file" or "live".
        title: what the list shows (a file's name, or "Live session" and its time, until renamed).
        source: the file's path, or the live session's input device.
        created: when it was transcribed (Unix seconds).
        duration_s: the audio's length, None when unknown.
        model, language: what transcribed it, in which language.
        journal: a live session's journal file, None for files.
    """

    id: int
    kind: str
    title: str
    source: str
    created: float
    duration_s: float | None
    model: str
    language: str
    journal: str | None

    @property
    def audio(self) -> Path | None:
        """The audio under the text, where it still exists: a file's source, a live session's recording."""
        path = Path(self.source) if self.kind == "file" else audio_of(Path(self.journal)) if self.journal else None
        return path if path is not None and path.is_file() else None


@dataclass(frozen=True)
class TimedWord:
    """A word of a line with its time in seconds (its text with Whisper's leading space)."""

    start: float
    end: float
    word: str


@dataclass(frozen=True)
class Line:
    """A kept segment: seconds from the start of the audio, its text, its words where the transcription
    timed them, and as read back its id and, once edited, the transcribed text (the edit is `text`)."""

    start: float
    end: float
    text: str
    words: tuple[TimedWord, ...] = ()
    id: int = 0
    original: str | None = None
    speaker: str | None = None

    @property
    def timed_words(self) -> tuple[TimedWord, ...]:
        """The words whose times still describe `text`: none once the line is edited."""
        return self.words if self.original is None else ()


@dataclass(frozen=True)
class Hit:
    """A segment that matches a search: its transcript, its time, and its text with the matched words
    between \\x02 and \\x03 (see marked)."""

    entry: Entry
    start: float
    end: float
    snippet: str

    def marked(self, open_mark: str, close_mark: str) -> str:
        """The snippet with the matched words between the given marks (e.g. "<b>", "</b>" or "[", "]")."""
        return self.snippet.replace(_MARK_OPEN, open_mark).replace(_MARK_CLOSE, close_mark)


def _words_json(words) -> str | None:
    return json.dumps([[round(w.start, 3), round(w.end, 3), w.word] for w in words]) if words else None


def _line(start: float, end: float, text: str, words: str | None, line_id: int, original: str | None,
          speaker: str | None) -> Line:
    """A row of _LINE_COLUMNS as a Line."""
    return Line(start, end, text, tuple(TimedWord(*w) for w in json.loads(words)) if words else (), line_id,
                original, speaker)


def history_path() -> Path:
    return user_data_dir() / "history.sqlite3"


def _match_expression(query: str) -> str | None:
    """The user's words as an FTS5 query: every word must occur, the last may be a prefix (search as you
    type). Words are quoted, so FTS5's operators and punctuation in the query are plain text."""
    words = re.findall(r"\w+", query)
    if not words:
        return None
    quoted = [f'"{w}"' for w in words]
    quoted[-1] += "*"
    return " ".join(quoted)


class History:
    """The library in one SQLite file (see the module docstring)."""

    def __init__(self, path: Path | None = None, *, busy_timeout_s: float = 10.0):
        """`busy_timeout_s`: how long a write waits for another connection's write to end."""
        self.path = path or history_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)  # transactions: _write
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.executescript(_SCHEMA)
            self._upgrade()
        except (sqlite3.Error, OSError) as e:
            raise HistoryError(f"cannot open the transcript library {self.path}: {e}") from None

    def _upgrade(self) -> None:
        if self._db.execute("PRAGMA user_version").fetchone()[0] >= _VERSION:
            return
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(segments)")}
        if "speaker" not in columns:
            self._db.execute("ALTER TABLE segments ADD COLUMN speaker TEXT")
        self._db.execute(f"PRAGMA user_version = {_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def add(self, kind: str, title: str, lines: Iterable[Line], *, source: str, model: str, language: str,
            duration_s: float | None = None, journal: str | None = None, created: float | None = None) -> int:
        """Keeps a transcript (all its lines, in one transaction) and returns its id."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        with self._write():
            cur = self._db.execute(
                "INSERT INTO transcripts (kind, title, source, created, duration_s, model, language, journal)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (kind, title, source, time.time() if created is None else created, duration_s, model, language,
                 journal))
            entry_id = cur.lastrowid
            self._db.executemany(
                'INSERT INTO segments (transcript, start, "end", text, words, speaker) VALUES (?, ?, ?, ?, ?, ?)',
                ((entry_id, s.start, s.end, s.text.strip(), _words_json(s.words), s.speaker) for s in lines))
        return entry_id

    def entries(self) -> list[Entry]:
        """Every kept transcript, newest first."""
        rows = self._db.execute(f"SELECT {_ENTRY_COLUMNS} FROM transcripts t ORDER BY t.created DESC, t.id DESC")
        return [Entry(*row) for row in rows]

    def entry(self, entry_id: int) -> Entry:
        row = self._db.execute(f"SELECT {_ENTRY_COLUMNS} FROM transcripts t WHERE t.id = ?", (entry_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no transcript {entry_id} in the library")
        return Entry(*row)

    def lines(self, entry_id: int) -> list[Line]:
        """A transcript's lines in time order."""
        self.entry(entry_id)
        rows = self._db.execute(f"SELECT {_LINE_COLUMNS} FROM segments WHERE transcript = ? ORDER BY start, id",
                                (entry_id,))
        return [_line(*row) for row in rows]

    def line(self, line_id: int) -> Line:
        """One line as kept now (after an edit, say)."""
        row = self._db.execute(f"SELECT {_LINE_COLUMNS} FROM segments WHERE id = ?", (line_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no line {line_id} in the library")
        return _line(*row)

    def search(self, query: str, limit: int = 100) -> Iterator[Hit]:
        """Segments holding every word of `query` (the last as a prefix), best match first; in Chinese or
        Japanese, segments holding the query as written, newest transcript first."""
        if _UNSPACED.search(query):
            yield from self._substring_hits(query.strip(), limit)
            return
        expression = _match_expression(query)
        if expression is None:
            return
        rows = self._db.execute(
            f"SELECT {_ENTRY_COLUMNS}, s.start, s.\"end\","
            f" snippet(segments_fts, 0, '{_MARK_OPEN}', '{_MARK_CLOSE}', '…', {_SNIPPET_TOKENS})"
            " FROM segments_fts JOIN segments s ON s.id = segments_fts.rowid JOIN transcripts t ON t.id = s.transcript"
            " WHERE segments_fts MATCH ? ORDER BY bm25(segments_fts), t.created DESC, s.start LIMIT ?",
            (expression, limit))
        for row in rows:
            yield Hit(Entry(*row[:9]), row[9], row[10], row[11])

    def _substring_hits(self, needle: str, limit: int) -> Iterator[Hit]:
        escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._db.execute(
            f"SELECT {_ENTRY_COLUMNS}, s.start, s.\"end\", s.text"
            " FROM segments s JOIN transcripts t ON t.id = s.transcript"
            " WHERE s.text LIKE ? ESCAPE '\\' ORDER BY t.created DESC, s.start LIMIT ?", (f"%{escaped}%", limit))
        for row in rows:
            yield Hit(Entry(*row[:9]), row[9], row[10], row[11].replace(needle, _MARK_OPEN + needle + _MARK_CLOSE))

    def rename(self, entry_id: int, title: str) -> None:
        title = title.strip()
        if not title:
            raise HistoryError("a transcript needs a title")
        with self._write():
            if self._db.execute("UPDATE transcripts SET title = ? WHERE id = ?", (title, entry_id)).rowcount == 0:
                raise HistoryError(f"no transcript {entry_id} in the library")

    def rename_speaker(self, entry_id: int, speaker: str, name: str) -> None:
        """Gives every line of `speaker` in a transcript the name `name` ("Speaker 2" -> "Ada")."""
        name = name.strip()
        if not name:
            raise HistoryError("a speaker needs a name")
        with self._write():
            self.entry(entry_id)
            self._db.execute("UPDATE segments SET speaker = ? WHERE transcript = ? AND speaker = ?",
                             (name, entry_id, speaker))

    def set_speakers(self, entry_id: int, speakers: dict[int, str | None]) -> None:
        """Names each line's speaker, by line id (a diarization after the transcript was kept)."""
        with self._write():
            self.entry(entry_id)
            self._db.executemany("UPDATE segments SET speaker = ? WHERE id = ? AND transcript = ?",
                                 ((speaker, line_id, entry_id) for line_id, speaker in speakers.items()))

    def speakers(self, entry_id: int) -> list[str]:
        """The transcript's speakers in order of first appearance (none when it was not diarized)."""
        rows = self._db.execute("SELECT speaker FROM segments WHERE transcript = ? AND speaker IS NOT NULL"
                                " ORDER BY start, id", (entry_id,))
        return list(dict.fromkeys(row[0] for row in rows))

    def edit(self, line_id: int, text: str) -> None:
        """Replaces a line's text; the transcribed text is kept for `revert`. Search and exports use the
        edit."""
        text = text.strip()
        with self._write():
            if self._db.execute("UPDATE segments SET original = COALESCE(original, text), text = ? WHERE id = ?",
                                (text, line_id)).rowcount == 0:
                raise HistoryError(f"no line {line_id} in the library")

    def revert(self, line_id: int) -> None:
        """Gives an edited line its transcribed text back."""
        with self._write():
            self._db.execute("UPDATE segments SET text = original, original = NULL"
                             " WHERE id = ? AND original IS NOT NULL", (line_id,))

    def delete(self, entry_id: int) -> None:
        """Forgets a transcript, and deletes a live session's journal file with it."""
        entry = self.entry(entry_id)
        with self._write():
            self._db.execute("DELETE FROM transcripts WHERE id = ?", (entry_id,))
        if entry.journal:
            Path(entry.journal).unlink(missing_ok=True)
            audio_of(Path(entry.journal)).unlink(missing_ok=True)

    def _write(self):
        """A transaction: committed when the block ends, rolled back if it raises; SQLite errors (a full
        disk, a locked or damaged file) become one-line HistoryErrors."""
        return _Transaction(self._db, self.path)


class _Transaction:
    def __init__(self, db: sqlite3.Connection, path: Path):
        self._db, self._path = db, path

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")  # the write lock now: waits busy_timeout_s for another writer
        except sqlite3.Error as e:
            raise HistoryError(f"cannot write the transcript library {self._path}: {e}") from None

    def __exit__(self, exc_type, exc, _tb) -> bool:
        if exc_type is None:
            self._db.commit()
            return False
        self._db.rollback()
        if isinstance(exc, sqlite3.Error):
            raise HistoryError(f"cannot write the transcript library {self._path}: {exc}") from None
        return False
