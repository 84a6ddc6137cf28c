"""Transcript writers: timestamps, wrapping, and output that real SRT/VTT parsers accept."""

import io
import json
from dataclasses import dataclass, field

import pytest
import srt
import webvtt

from aural.engine.transcribe import Segment, Word
from aural.engine.text.writers import (
    DEFAULT_MAX_CUE_S,
    DEFAULT_MAX_LINE_LEN,
    WRITERS,
    format_timestamp,
    iter_cues,
    write_result,
)


@dataclass
class Seg:
    start: float
    end: float
    text: str
    tokens: list = field(default_factory=list)


JFK = [
    Seg(0.0, 7.6, " And so my fellow Americans, ask not what your country can do for you,", [50364, 400, 370]),
    Seg(7.6, 10.5, " ask what you can do for your country.", [1029, 437]),
]


def render(fmt, segments, info=None, timings=None, **options):
    out = io.StringIO()
    write_result(fmt, segments, info, timings, out, **options)
    return out.getvalue()


def parse_vtt(text):
    return webvtt.from_buffer(io.StringIO(text))


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "00:00:00.000"),
        (0.0004, "00:00:00.000"),
        (1.23, "00:00:01.230"),
        (1.2346, "00:00:01.235"),
        (59.999, "00:00:59.999"),
        (59.9996, "00:01:00.000"),
        (3599.9999, "01:00:00.000"),
        (3661.5, "01:01:01.500"),
        (36000 + 0.25, "10:00:00.250"),
        (-0.5, "00:00:00.000"),
    ],
)
def test_format_timestamp(seconds, expected):
    assert format_timestamp(seconds) == expected
    assert format_timestamp(seconds, ",") == expected.replace(".", ",")


def test_srt_parses_with_hours_and_stripped_text():
    text = render("srt", JFK, max_line_len=0, max_cue_s=0)  # 0: no wrapping, no duration limit
    assert text.startswith("1\n00:00:00,000 --> 00:00:07,600\nAnd so my fellow")
    subs = list(srt.parse(text))
    assert [s.index for s in subs] == [1, 2]
    assert subs[1].start.total_seconds() == pytest.approx(7.6)
    assert subs[1].end.total_seconds() == pytest.approx(10.5)
    assert subs[1].content == "ask what you can do for your country."


def test_vtt_parses_and_escapes_markup():
    segments = JFK + [Seg(3700.0, 3701.25, " a <b> & c --> d")]
    captions = parse_vtt(render("vtt", segments, max_line_len=0, max_cue_s=0))
    assert [c.text for c in captions][:2] == [s.text.strip() for s in JFK]
    assert captions[2].start == "01:01:40.000" and captions[2].end == "01:01:41.250"
    assert "&lt;b&gt; &amp; c --&gt; d" in captions[2].raw_text


@pytest.mark.parametrize("fmt", ["srt", "vtt", "txt", "tsv"])
def test_empty_segments_are_dropped(fmt):
    segments = [Seg(0, 1, "  "), Seg(1, 2, "hello"), Seg(2, 3, "")]
    text = render(fmt, segments)
    assert text.count("hello") == 1
    if fmt == "srt":
        assert len(list(srt.parse(text))) == 1
    if fmt == "vtt":
        assert len(parse_vtt(text)) == 1


def test_no_segments_gives_valid_empty_files():
    assert list(srt.parse(render("srt", []))) == []
    assert len(parse_vtt(render("vtt", []))) == 0
    assert json.loads(render("json", []))["segments"] == []


def test_wrap_at_word_boundaries_into_two_lines_and_split_cues():
    words = "the quick brown fox jumps over the lazy dog and keeps on running far away".split()
    segment = Seg(10.0, 20.0, " ".join(words))
    cues = list(iter_cues([segment], max_line_len=16))
    assert all(1 <= len(cue.lines) <= 2 for cue in cues)
    assert all(len(line) <= 16 for cue in cues for line in cue.lines)
    # Every word kept, in order, none broken.
    assert " ".join(" ".join(cue.lines) for cue in cues).split() == words
    assert len(cues) > 1
    # Cues tile the segment: contiguous, in order, from its start to its end.
    assert cues[0].start == 10.0 and cues[-1].end == pytest.approx(20.0)
    for before, after in zip(cues, cues[1:]):
        assert before.end == pytest.approx(after.start)
        assert before.start < before.end


def test_split_times_are_proportional_to_text_length():
    cues = list(iter_cues([Seg(0.0, 3.0, "aa bb cccccc dddddd")], max_line_len=6))
    assert [c.lines for c in cues] == [("aa bb", "cccccc"), ("dddddd",)]
    # 12 of the 18 characters ("aa bb cccccc") get 2/3 of the time.
    assert cues[0].end == pytest.approx(2.0)


def test_overlong_word_stays_whole():
    cues = list(iter_cues([Seg(0, 1, "a supercalifragilistic b")], max_line_len=5))
    assert [c.lines for c in cues] == [("a", "supercalifragilistic"), ("b",)]


def test_max_cue_duration():
    segment = Seg(0.0, 30.0, " ".join(f"w{i}" for i in range(40)))
    cues = list(iter_cues([segment], max_cue_s=7.0))
    assert len(cues) >= 5
    assert all(cue.end - cue.start <= 7.0 + 1e-9 for cue in cues)
    assert " ".join(" ".join(c.lines) for c in cues) == segment.text
    # A lone word longer than the limit is shown for the limit, not dropped.
    (held,) = iter_cues([Seg(5.0, 25.0, "♪")], max_cue_s=7.0)
    assert (held.start, held.end, held.lines) == (5.0, 12.0, ("♪",))


def test_srt_with_wrapping_parses():
    text = render("srt", JFK, max_line_len=20, max_cue_s=4.0)
    subs = list(srt.parse(text))
    assert [s.index for s in subs] == list(range(1, len(subs) + 1))
    assert all(len(s.content.split("\n")) <= 2 for s in subs)
    assert all(len(line) <= 20 for s in subs for line in s.content.split("\n"))
    assert " ".join(s.content.replace("\n", " ") for s in subs) == " ".join(s.text.strip() for s in JFK)


def _vtt_cues(text):
    return [(c.start_in_seconds, c.end_in_seconds, c.text.split("\n")) for c in parse_vtt(text)]


def _srt_cues(text):
    return [(s.start.total_seconds(), s.end.total_seconds(), s.content.split("\n")) for s in srt.parse(text)]


# A 23 s monologue segment of 64 words, the kind Whisper emits without pauses.
LONG = Seg(
    100.0, 123.0,
    " So the thing about the budget is that we have looked at every single line of it twice over the last"
    " three months, and what we found was that most of the money goes to maintenance of the old systems"
    " rather than to anything new that the people in this room actually asked us to build for them.",
)


@pytest.mark.parametrize("parse", [_srt_cues, _vtt_cues], ids=["srt", "vtt"])
def test_default_subtitles_follow_the_style_guides(parse):
    fmt = "srt" if parse is _srt_cues else "vtt"
    cues = parse(render(fmt, JFK + [LONG]))
    assert all(end - start <= DEFAULT_MAX_CUE_S + 1e-3 for start, end, _ in cues)
    assert all(1 <= len(lines) <= 2 for _, _, lines in cues)
    assert all(len(line) <= DEFAULT_MAX_LINE_LEN for _, _, lines in cues for line in lines)
    assert any(len(lines) == 2 for _, _, lines in cues)  # two-line cues do occur
    # Nothing lost or reordered; cues in time order without overlaps, within the segments.
    words = " ".join(" ".join(lines) for _, _, lines in cues).split()
    assert words == " ".join(s.text for s in JFK + [LONG]).split()
    for (_, end, _), (start, _, _) in zip(cues, cues[1:]):
        assert end <= start + 1e-3
    assert cues[0][0] == 0.0 and cues[-1][1] == pytest.approx(123.0)


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
@pytest.mark.parametrize(("max_line_len", "max_cue_s"), [(16, 3.0), (30, 5.0), (60, 2.0)])
def test_subtitle_limits_are_respected(fmt, max_line_len, max_cue_s):
    text = render(fmt, [LONG], max_line_len=max_line_len, max_cue_s=max_cue_s)
    cues = _srt_cues(text) if fmt == "srt" else _vtt_cues(text)
    assert all(end - start <= max_cue_s + 1e-3 for start, end, _ in cues)
    assert all(1 <= len(lines) <= 2 and all(len(line) <= max_line_len for line in lines) for _, _, lines in cues)
    assert " ".join(" ".join(lines) for _, _, lines in cues).split() == LONG.text.split()


def test_zero_turns_the_subtitle_limits_off():
    (cue,) = _srt_cues(render("srt", [LONG], max_line_len=0, max_cue_s=0))
    assert cue == (100.0, 123.0, [LONG.text.strip()])


def test_tsv_uses_integer_milliseconds():
    text = render("tsv", [Seg(0.0, 1.2345, " hello\tworld "), Seg(59.9996, 3661.5, "later")])
    assert text.splitlines() == ["start\tend\ttext", "0\t1234\thello world", "60000\t3661500\tlater"]


def test_txt_one_line_per_segment():
    assert render("txt", JFK) == "".join(f"{s.text.strip()}\n" for s in JFK)


@dataclass
class Info:
    path: str = "jfk.wav"
    language: str = "en"
    duration_s: float = 11.0
    model: str = "tiny.en"
    backend: str = "CPU"
    device: str = "CPU"
    kv_mode: str = "device"


class Timings:
    def __init__(self):
        self.filled = False

    def to_dict(self):
        return {"total_s": 1.5, "filled": self.filled}


def test_json_schema_and_late_timings():
    timings = Timings()

    def lazy_segments():
        yield from JFK
        timings.filled = True  # like a Transcription, timings are complete only after iteration

    doc = json.loads(render("json", lazy_segments(), Info(), timings))
    assert doc["language"] == "en" and doc["model"] == "tiny.en" and doc["backend"] == "CPU"
    assert doc["timings"] == {"total_s": 1.5, "filled": True}
    assert [set(s) for s in doc["segments"]] == [{"id", "start", "end", "text", "tokens"}] * 2
    first = doc["segments"][0]
    assert first == {"id": 0, "start": 0.0, "end": 7.6, "text": JFK[0].text.strip(), "tokens": [50364, 400, 370]}
    assert all(isinstance(s["start"], float) and isinstance(s["end"], float) for s in doc["segments"])


def test_json_keeps_segment_ids_and_words():
    @dataclass
    class Word:
        start: float
        end: float
        word: str

    @dataclass
    class WordSeg(Seg):
        id: int = 7
        words: list = field(default_factory=list)

    seg = WordSeg(0.0, 1.0, " hi", [1], words=[Word(0.0, 1.0, " hi")])
    doc = json.loads(render("json", [seg], timings={"x": 1}))
    assert doc["segments"][0]["id"] == 7
    assert doc["segments"][0]["words"] == [{"start": 0.0, "end": 1.0, "word": " hi"}]
    assert doc["timings"] == {"x": 1} and doc["language"] is None


def test_json_writes_the_words_of_word_timestamps():
    words = [Word(" Ask", 1.0, 1.24, 0.91), Word(" not.", 1.24, 1.6000000001, 0.5)]
    with_words = Segment(id=0, start=1.0, end=1.6, text=" Ask not.", tokens=[1, 2], avg_logprob=-0.2,
                         compression_ratio=1.0, no_speech_prob=0.01, temperature=0.0, words=words)
    without = Segment(id=1, start=2.0, end=3.0, text=" Yes.", tokens=[3], avg_logprob=-0.2,
                      compression_ratio=1.0, no_speech_prob=0.01, temperature=0.0)
    doc = json.loads(render("json", [with_words, without]))
    assert doc["segments"][0]["words"] == [
        {"word": " Ask", "start": 1.0, "end": 1.24, "probability": 0.91},
        {"word": " not.", "start": 1.24, "end": 1.6, "probability": 0.5},
    ]
    assert "words" not in doc["segments"][1]


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_writers_stream_segments_one_at_a_time(fmt):
    out = io.StringIO()
    seen = []

    def segments():
        yield JFK[0]
        seen.append(out.getvalue())  # what had reached the file when the second segment was asked for
        yield JFK[1]

    write_result(fmt, segments(), Info(), {}, out)
    assert "fellow" in seen[0] and "ask what" not in seen[0]
    assert "ask what" in out.getvalue()


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown output format"):
        render("docx", JFK)
