"""The transcript library (engine.history): kept transcripts, full-text search, rename and delete, live
sessions entering it when their journal closes, and `aural history`."""

from __future__ import annotations

import os
import sqlite3

import pytest
from conftest import assert_one_error_line, run_cli

from aural.engine.history import History, HistoryError, Line
from aural.engine.live.journal import SessionJournal

JFK = [Line(0.0, 2.9, " And so my fellow Americans,"), Line(3.3, 7.6, " ask not what your country can do for you,"),
       Line(8.1, 10.6, " ask what you can do for your country.")]
CANOE = [Line(0.0, 2.5, "The birch canoe slid on the smooth planks."), Line(2.5, 5.0, "Glue the sheet to the dark "
         "blue background."), Line(61.0, 64.0, "Façade of the café, naïve.")]


@pytest.fixture
def history(tmp_path):
    with History(tmp_path / "history.sqlite3") as h:
        yield h


def add(history, title, lines, kind="file", created=None, **fields):
    return history.add(kind, title, lines, source=fields.get("source", f"/audio/{title}"), model="whisper-tiny.en",
                       language=fields.get("language", "en"), duration_s=lines[-1].end, created=created)


def test_transcripts_are_kept_with_their_lines_newest_first(history):
    jfk = add(history, "jfk.wav", JFK, created=1000.0)
    canoe = add(history, "canoe.wav", CANOE, created=2000.0)
    assert [e.id for e in history.entries()] == [canoe, jfk]
    entry = history.entry(jfk)
    assert (entry.kind, entry.title, entry.source, entry.duration_s, entry.language) == \
        ("file", "jfk.wav", "/audio/jfk.wav", 10.6, "en")
    assert [line.text for line in history.lines(jfk)] == [line.text.strip() for line in JFK]
    assert history.lines(canoe)[-1].start == 61.0


def test_search_finds_every_word_the_last_as_a_prefix_and_marks_them(history):
    jfk = add(history, "jfk.wav", JFK)
    add(history, "canoe.wav", CANOE)
    hits = list(history.search("your countr"))
    assert {(h.entry.id, h.start) for h in hits} == {(jfk, 3.3), (jfk, 8.1)}
    assert all("[your]" in h.marked("[", "]") and "[country" in h.marked("[", "]") for h in hits)
    assert [h.start for h in history.search("CANOE smooth")] == [0.0]  # case does not matter
    assert [h.start for h in history.search("facade cafe")] == [61.0]  # nor do accents
    assert list(history.search("canoe country")) == []  # every word, in one segment


def test_search_takes_any_text_as_plain_words(history):
    add(history, "jfk.wav", JFK)
    for query in ('"', "AND OR NOT (", "ask*", "country:", "-", "", "   ", "NEAR(ask not)"):
        list(history.search(query))  # never an FTS5 syntax error
    assert len(list(history.search("ask*"))) == 2


def test_chinese_is_searched_as_written(history):
    zh = add(history, "会议.wav", [Line(0.0, 2.0, "今天我们讨论预算"), Line(2.0, 4.0, "明天再讨论人员")], language="zh")
    hits = list(history.search("讨论"))
    assert [(h.entry.id, h.start) for h in hits] == [(zh, 0.0), (zh, 2.0)]
    assert hits[0].marked("[", "]") == "今天我们[讨论]预算"
    assert list(history.search("预算%")) == []  # LIKE's wildcards are plain characters


def test_rename_and_delete(history, tmp_path):
    journal = tmp_path / "session.jsonl"
    journal.write_text("{}\n")
    jfk = add(history, "jfk.wav", JFK)
    live = history.add("live", "Live session", CANOE, source="app", model="m", language="", journal=str(journal))
    history.rename(jfk, "  Kennedy, inaugural  ")
    assert history.entry(jfk).title == "Kennedy, inaugural"
    with pytest.raises(HistoryError, match="needs a title"):
        history.rename(jfk, " ")
    history.delete(live)
    assert not journal.exists()
    assert [e.id for e in history.entries()] == [jfk]
    assert list(history.search("canoe")) == []  # its lines left the index too
    for call in (lambda: history.entry(live), lambda: history.lines(live), lambda: history.delete(live),
                 lambda: history.rename(live, "x")):
        with pytest.raises(HistoryError, match=f"no transcript {live}"):
            call()


def test_an_edit_is_searched_and_read_back_and_revert_brings_the_words_back(history):
    jfk = add(history, "jfk.wav", JFK)
    line = history.lines(jfk)[1]
    assert line.original is None
    history.edit(line.id, "  ask not what your nation can do for you,  ")
    edited = history.lines(jfk)[1]
    assert (edited.text, edited.original) == ("ask not what your nation can do for you,", line.text)
    assert [h.start for h in history.search("nation")] == [3.3]
    assert [h.start for h in history.search("country")] == [8.1]  # the edited line no longer says it
    history.edit(line.id, "ask not what your land can do for you,")  # a second edit keeps the first original
    assert history.lines(jfk)[1].original == line.text
    history.revert(line.id)
    assert history.lines(jfk)[1] == line
    assert sorted(h.start for h in history.search("country")) == [3.3, 8.1]
    assert list(history.search("nation")) == [] and list(history.search("land")) == []
    history.revert(line.id)  # an unedited line stays as it is
    assert history.lines(jfk)[1] == line
    with pytest.raises(HistoryError, match="no line 999"):
        history.edit(999, "x")


def test_speakers_are_kept_listed_and_renamed_in_one_transcript_only(history):
    said = [Line(0.0, 2.0, "Hello.", speaker="Speaker 1"), Line(2.0, 4.0, "Hi there.", speaker="Speaker 2"),
            Line(4.0, 6.0, "How are you?", speaker="Speaker 1")]
    first, other = add(history, "call.wav", said), add(history, "call2.wav", said)
    assert history.speakers(first) == ["Speaker 1", "Speaker 2"]
    history.rename_speaker(first, "Speaker 1", "Ada")
    assert [line.speaker for line in history.lines(first)] == ["Ada", "Speaker 2", "Ada"]
    assert history.speakers(other) == ["Speaker 1", "Speaker 2"]
    with pytest.raises(HistoryError, match="needs a name"):
        history.rename_speaker(first, "Ada", "  ")
    assert history.speakers(add(history, "jfk.wav", JFK)) == []


def test_a_library_of_the_first_version_gains_the_speaker_column(tmp_path):
    path = tmp_path / "history.sqlite3"
    with sqlite3.connect(path) as db:  # the version 1 tables, as a library made before diarization holds them
        db.executescript("""
            CREATE TABLE transcripts (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, title TEXT NOT NULL,
                source TEXT NOT NULL, created REAL NOT NULL, duration_s REAL, model TEXT NOT NULL,
                language TEXT NOT NULL, journal TEXT);
            CREATE TABLE segments (id INTEGER PRIMARY KEY, transcript INTEGER NOT NULL, start REAL NOT NULL,
                "end" REAL NOT NULL, text TEXT NOT NULL, original TEXT, words TEXT);
            INSERT INTO transcripts VALUES (1, 'file', 'old.wav', '/audio/old.wav', 1.0, 2.0, 'tiny.en', 'en', NULL);
            INSERT INTO segments VALUES (1, 1, 0.0, 2.0, 'Kept before.', NULL, NULL);
            PRAGMA user_version = 1;""")
    with History(path) as history:
        assert history.lines(1)[0].text == "Kept before." and history.lines(1)[0].speaker is None
        new = add(history, "new.wav", [Line(0.0, 1.0, "Now.", speaker="Speaker 1")])
        assert history.lines(new)[0].speaker == "Speaker 1"
    with History(path) as history:  # opened again: upgraded once
        assert history.speakers(new) == ["Speaker 1"]


def test_a_library_that_cannot_be_written_says_so_and_keeps_what_it_had(tmp_path):
    path = tmp_path / "history.sqlite3"
    with History(path, busy_timeout_s=0.1) as history:
        jfk = add(history, "jfk.wav", JFK)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another process in the middle of a write
        with pytest.raises(HistoryError, match="cannot write the transcript library .*locked"):
            add(history, "canoe.wav", CANOE)
        other.rollback()
        assert [e.id for e in history.entries()] == [jfk]
        add(history, "canoe.wav", CANOE)  # the failed write left nothing half done
        assert len(history.entries()) == 2
    damaged = tmp_path / "damaged.sqlite3"
    damaged.write_bytes(b"not a database" * 100)
    with pytest.raises(HistoryError, match="cannot open the transcript library"):
        History(damaged)


def test_a_closed_live_session_enters_the_library_beside_its_journal(tmp_path):
    journal = SessionJournal(model="whisper-tiny.en", source="aural live", directory=tmp_path / "sessions")
    journal.append("ask not what your country can do for you", 3.3, 7.6)
    journal.append("ask what you can do for your country", 8.1, 10.6)
    journal.close()
    SessionJournal(source="aural live", directory=tmp_path / "sessions").close()  # nothing said: nothing kept
    with History(tmp_path / "history.sqlite3") as history:
        [entry] = history.entries()
        assert (entry.kind, entry.model, entry.source, entry.journal) == \
            ("live", "whisper-tiny.en", "aural live", str(journal.path))
        assert entry.title.startswith("Live session 20") and entry.duration_s == 10.6
        assert sorted(h.start for h in history.search("country")) == [3.3, 8.1]


def test_a_live_session_is_journaled_even_when_the_library_is_damaged(tmp_path, caplog):
    (tmp_path / "history.sqlite3").write_bytes(b"not a database" * 100)
    journal = SessionJournal(source="app", directory=tmp_path / "sessions")
    journal.append("still on disk", 0.0, 1.0)
    journal.close()
    assert "still on disk" in journal.path.read_text()
    assert "cannot open the transcript library" in caplog.text


def test_the_cli_lists_searches_shows_renames_and_deletes(tmp_path):
    env = {**os.environ, "AURAL_USER_DATA_DIR": str(tmp_path)}
    with History(tmp_path / "history.sqlite3") as history:
        jfk = add(history, "jfk.wav", JFK)
        canoe = add(history, "canoe.wav", CANOE)
    listed = run_cli(env, "history", "list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [str(canoe), str(jfk)]
    found = run_cli(env, "history", "search", "your", "country")
    assert sorted(found.stdout.splitlines()) == [
        f"{jfk:>5}      0:03  jfk.wav: ask not what [your] [country] can do for you,",
        f"{jfk:>5}      0:08  jfk.wav: ask what you can do for [your] [country]."]
    shown = run_cli(env, "history", "show", str(canoe))
    assert shown.stdout.splitlines()[0] == "canoe.wav"
    assert shown.stdout.splitlines()[3] == "[1:01 - 1:04] Façade of the café, naïve."
    assert run_cli(env, "history", "rename", str(jfk), "Kennedy").returncode == 0
    assert run_cli(env, "history", "rm", str(canoe)).stdout == f"Deleted {canoe} (canoe.wav).\n"
    assert [line.split()[-1] for line in run_cli(env, "history", "list").stdout.splitlines()] == ["Kennedy"]
    assert_one_error_line(run_cli(env, "history", "show", str(canoe)), f"no transcript {canoe}")


def test_two_connections_share_the_file(tmp_path):
    path = tmp_path / "history.sqlite3"
    with History(path) as a, History(path) as b:
        jfk = add(a, "jfk.wav", JFK)
        assert [e.id for e in b.entries()] == [jfk]
        b.delete(jfk)
        assert a.entries() == []
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_aural_live_keep_audio_keeps_what_it_heard_beside_the_session(tmp_path, jfk_wav):
    import soundfile as sf

    env = {**os.environ, "AURAL_USER_DATA_DIR": str(tmp_path)}
    proc = run_cli(env, "live", "--replay", jfk_wav, "--speed", "0", "--keep-audio", "--json")
    assert proc.returncode == 0, proc.stderr
    [entry] = History(tmp_path / "history.sqlite3").entries()
    assert entry.kind == "live" and entry.audio is not None
    assert abs(sf.info(entry.audio).frames - sf.info(jfk_wav).frames) <= 1600  # what the engine read, whole
    assert "country" in " ".join(line.text for line in History(tmp_path / "history.sqlite3").lines(entry.id))
