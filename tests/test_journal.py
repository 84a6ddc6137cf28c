"""The live session journal: what a crash leaves behind can be read back, nothing committed is lost.

Crashes are real: writers run in subprocesses that are SIGKILLed (the journal's library code and
`aural live`), and the files they leave are read back by this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aural.engine.live.journal import (SessionJournal, mark_session, prune_sessions, read_session, sessions_dir,
                                  unclosed_sessions)


def writer_script(directory: Path, n: int, then: str = "time.sleep(600)") -> str:
    """A process that journals `n` commits, says "journaled i" after each, then runs `then` (by default
    it waits to be killed)."""
    return textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from aural.engine.live.journal import SessionJournal
        journal = SessionJournal(model="whisper-tiny.en", source="test", directory=Path({str(directory)!r}))
        for i in range({n}):
            journal.append(f"words number {{i}}", i * 1.0, i + 0.5)
            print("journaled", i, flush=True)
        {then}
    """)


def test_a_sigkilled_writer_loses_no_commit(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", writer_script(tmp_path, 5)], stdout=subprocess.PIPE, text=True)
    try:
        acknowledged = [proc.stdout.readline() for _ in range(5)]
        assert acknowledged[-1] == "journaled 4\n"
        assert unclosed_sessions(tmp_path) == []  # the writer is alive: its session is not up for restoring
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    [session] = unclosed_sessions(tmp_path)
    assert [e.text for e in session.entries] == [f"words number {i}" for i in range(5)]
    assert [(e.start, e.end) for e in session.entries] == [(i * 1.0, i + 0.5) for i in range(5)]
    assert session.model == "whisper-tiny.en" and session.source == "test" and session.outcome is None
    assert session.text.startswith("words number 0 words number 1")


def test_a_clean_close_is_not_offered(tmp_path):
    journal = SessionJournal(model="m", source="test", directory=tmp_path)
    journal.append("hello there", 0.0, 1.0)
    assert unclosed_sessions(tmp_path) == []  # still open in this process: locked
    journal.close()
    journal.close()
    assert unclosed_sessions(tmp_path) == []
    assert read_session(journal.path).outcome == "stopped"


def test_an_entry_after_close_starts_a_new_session(tmp_path):
    journal = SessionJournal(source="test", directory=tmp_path)
    journal.append("first", 0.0, 1.0)
    first = journal.path
    journal.close()
    journal.append("second", 0.0, 1.0)
    assert journal.path != first
    assert [e.text for e in read_session(journal.path).entries] == ["second"]
    journal.close()


def test_a_session_without_commits_leaves_no_file(tmp_path):
    SessionJournal(source="test", directory=tmp_path / "sessions").close()
    assert not (tmp_path / "sessions").exists()


def test_restored_and_discarded_sessions_are_offered_no_more(tmp_path):
    for _ in range(2):  # two crashes: exits that skip every clean-up
        subprocess.run([sys.executable, "-c", writer_script(tmp_path, 1, then="os._exit(9)")], timeout=60)
    first, second = unclosed_sessions(tmp_path)
    mark_session(first.path, "restored")
    assert [s.path for s in unclosed_sessions(tmp_path)] == [second.path]
    mark_session(second.path, "discarded")
    assert unclosed_sessions(tmp_path) == []
    with pytest.raises(ValueError, match="restored, discarded"):
        mark_session(second.path, "lost")


def test_old_ended_sessions_are_pruned_and_unclosed_ones_kept(tmp_path):
    def session(text, close):
        journal = SessionJournal(source="test", directory=tmp_path)
        journal.append(text, 0.0, 1.0)
        if close:
            journal.close()
        return journal

    old_closed, recent_closed, open_now = session("old", True), session("recent", True), session("open", False)
    subprocess.run([sys.executable, "-c", writer_script(tmp_path, 1, then="os._exit(9)")], timeout=60)
    [crashed] = unclosed_sessions(tmp_path)
    long_ago = 40 * 86400
    for path in (old_closed.path, open_now.path, crashed.path):
        os.utime(path, (os.path.getmtime(path) - long_ago,) * 2)
    assert prune_sessions(tmp_path, older_than_days=30) == 1
    assert not old_closed.path.exists()
    assert recent_closed.path.exists() and open_now.path.exists()  # recent, and in use
    assert [s.path for s in unclosed_sessions(tmp_path)] == [crashed.path]  # still offered, however old
    open_now.close()


def test_a_torn_last_line_is_skipped_and_the_session_can_still_be_closed(tmp_path):
    header = {"type": "header", "version": 1, "model": "m", "source": "test", "started": 1.0e9}
    commit = {"type": "commit", "text": "kept", "start": 0.0, "end": 1.0, "wall": 1.0e9}
    path = tmp_path / "session-torn.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(commit) + '\n{"type": "commit", "text": "to')
    [session] = unclosed_sessions(tmp_path)
    assert [e.text for e in session.entries] == ["kept"]
    mark_session(path, "discarded")
    assert unclosed_sessions(tmp_path) == [] and read_session(path).outcome == "discarded"


def test_files_that_are_not_journals_are_ignored(tmp_path):
    (tmp_path / "session-garbage.jsonl").write_bytes(os.urandom(300))
    (tmp_path / "session-empty.jsonl").write_text("")
    assert unclosed_sessions(tmp_path) == []
    assert unclosed_sessions(tmp_path / "missing") == []


def test_the_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AURAL_USER_DATA_DIR", str(tmp_path))
    assert sessions_dir() == tmp_path / "sessions"


# -- aural live ------------------------------------------------------------------------------------


def live_command(*args) -> list[str]:
    return [sys.executable, "-m", "aural.engine.cli", "live", "--threads", "1", "--json", *map(str, args)]


def test_aural_live_journals_what_it_prints_and_closes_at_the_end(tmp_path, data_dir):
    env = {**os.environ, "AURAL_USER_DATA_DIR": str(tmp_path)}
    result = subprocess.run(live_command("--replay", data_dir / "en_libri_1089-134691-0001.flac", "--speed", "0"),
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    printed = [e for e in map(json.loads, result.stdout.splitlines()) if e["type"] == "commit"]
    [path] = (tmp_path / "sessions").glob("session-*.jsonl")
    session = read_session(path)
    assert printed and [(e.text, e.start, e.end) for e in session.entries] == [
        (c["text"], pytest.approx(c["start"], abs=1e-3), pytest.approx(c["end"], abs=1e-3)) for c in printed]
    assert session.source == "aural live" and session.outcome == "stopped"


def test_a_sigkilled_aural_live_leaves_its_commits_for_restoring(tmp_path, jfk_wav):
    env = {**os.environ, "AURAL_USER_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(live_command("--replay", jfk_wav), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    try:
        printed = []
        for line in proc.stdout:  # real time: kill right after the first commit is printed
            event = json.loads(line)
            if event["type"] == "commit":
                printed.append(event["text"])
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    [session] = unclosed_sessions(tmp_path / "sessions")
    assert printed and [e.text for e in session.entries][:len(printed)] == printed


def test_a_sessions_audio_is_kept_beside_it_on_its_timeline_and_only_with_text(tmp_path):
    import numpy as np
    import soundfile as sf

    from aural.engine.history import History
    from aural.engine.live.journal import AUDIO_RATE, audio_of

    journal = SessionJournal(source="app", directory=tmp_path / "sessions")
    tone = (0.1 * np.sin(np.arange(AUDIO_RATE) / 5)).astype(np.float32)
    journal.record(tone, at_s=0.0)
    journal.record(tone, at_s=2.5)  # a second run after a 1.5 s pause: the pause is silence
    journal.append("hello", 0.2, 0.8)
    journal.close()
    audio, rate = sf.read(audio_of(journal.path), dtype="float32")
    assert rate == AUDIO_RATE and len(audio) == int(3.5 * AUDIO_RATE)
    assert np.abs(audio[AUDIO_RATE:int(2.5 * AUDIO_RATE)]).max() == 0
    assert np.abs(audio[:AUDIO_RATE] - tone).max() <= 2.0 ** -15  # 16-bit FLAC: half a step of rounding

    [entry] = History(tmp_path / "history.sqlite3").entries()
    assert entry.audio == audio_of(journal.path)
    History(tmp_path / "history.sqlite3").delete(entry.id)
    assert not audio_of(journal.path).exists() and not journal.path.exists()

    silent = SessionJournal(source="app", directory=tmp_path / "sessions")
    silent.record(tone, at_s=0.0)  # audio, but nothing committed: no session is kept, and no audio
    silent.close()
    assert list((tmp_path / "sessions").glob("*.flac")) == []
