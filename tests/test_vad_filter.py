"""VAD pre-filter: speech regions from Silero's frame scores, the kept samples, times mapped back."""

from __future__ import annotations

import numpy as np
import pytest
from whisper_normalizer.english import EnglishTextNormalizer

from aural.engine.audio import load_audio
from aural.engine.transcribe import TranscribeOptions, transcribe
from aural.engine.vad.gate import FRAME_SAMPLES
from aural.engine.vad.regions import (
    SpeechMap,
    SpeechRegions,
    VadFilterOptions,
    has_speech,
    heard_enough,
    keep_regions,
    speech_regions,
)

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
RATE = 16000
normalize = EnglishTextNormalizer()


def regions_of(probs: list[float], **options) -> list[tuple[int, int]]:
    """Regions, in frames, of a probability per frame (padding given in frames too)."""
    pad_frames = options.pop("pad_frames", 0)
    options = {"min_silence_s": 3 * FRAME_SAMPLES / RATE, "speech_pad_s": pad_frames * FRAME_SAMPLES / RATE, **options}
    found = SpeechRegions(VadFilterOptions(**options))
    for p in probs:
        found.add(p)
    return [(s / FRAME_SAMPLES, e / FRAME_SAMPLES) for s, e in found.finish(len(probs) * FRAME_SAMPLES)]


def test_short_gaps_are_merged_and_long_ones_split():
    # speech 2-5, a 2-frame gap (shorter than 3: merged), speech 7-9, a 6-frame gap, speech 15-17.
    probs = [0, 0, .9, .9, .9, 0, 0, .9, .9, 0, 0, 0, 0, 0, 0, .9, .9, 0, 0, 0]
    assert regions_of(probs) == [(2, 9), (15, 20)]  # the last one is still open at the end: 20


def test_between_thresholds_neither_starts_nor_ends_speech():
    # 0.4 is below threshold 0.5 but above neg_threshold 0.35: it continues speech, never starts it.
    assert regions_of([.4, .4, .9, .4, .4, .4, .4, 0, 0, 0, 0]) == [(2, 7)]


def test_padding_and_shared_short_gaps():
    probs = [0] * 4 + [.9] * 2 + [0] * 6 + [.9] * 2 + [0] * 4 + [.9] + [0] * 10
    # Raw regions (4, 6), (12, 14), (18, 19) padded by 3 frames; the 4-frame gap 14-18, shorter than two
    # paddings, is shared instead, so the regions never overlap.
    assert regions_of(probs, pad_frames=3) == [(1, 9), (9, 16), (16, 22)]


def test_short_speech_is_dropped():
    probs = [.9] + [0] * 5 + [.9] * 4 + [0] * 5
    assert regions_of(probs, min_speech_s=2 * FRAME_SAMPLES / RATE) == [(6, 10)]


@pytest.mark.parametrize("min_speech_frames, pad_frames", [(0, 0), (2, 3)])
def test_the_speech_heard_so_far_never_exceeds_the_regions_found(min_speech_frames, pad_frames):
    """heard_floor, read after every frame of random scores (speech, silence and the band between the
    thresholds), never falls and never exceeds the padded regions' length that finish() returns."""
    rng = np.random.default_rng(min_speech_frames)
    options = VadFilterOptions(min_speech_s=min_speech_frames * FRAME_SAMPLES / RATE,
                               min_silence_s=3 * FRAME_SAMPLES / RATE, speech_pad_s=pad_frames * FRAME_SAMPLES / RATE)
    for _ in range(200):
        found = SpeechRegions(options)
        floors = []
        probs = rng.choice([0.0, 0.4, 0.9], size=int(rng.integers(1, 60)), p=[0.4, 0.2, 0.4])
        for p in probs:
            found.add(float(p))
            floors.append(found.heard_floor)
        total = sum(end - start for start, end in found.finish(len(probs) * FRAME_SAMPLES))
        assert floors == sorted(floors) and floors[-1] <= total


def test_invalid_options_name_the_accepted_values():
    with pytest.raises(ValueError, match="between 0 and 1"):
        VadFilterOptions(threshold=1.5)
    with pytest.raises(ValueError, match="speech_pad_s must be >= 0"):
        VadFilterOptions(speech_pad_s=-1)


@pytest.mark.parametrize("chunk", [1, 7, 100, 1000])
def test_keep_regions_across_chunk_boundaries(chunk):
    audio = np.arange(1000, dtype=np.float32)
    regions = [(0, 3), (95, 205), (500, 501), (990, 1000)]
    chunks = (audio[i:i + chunk] for i in range(0, audio.size, chunk))
    kept = np.concatenate(list(keep_regions(chunks, regions)))
    assert np.array_equal(kept, np.concatenate([audio[s:e] for s, e in regions]))


def test_keep_regions_reads_the_input_lazily():
    pulled = []

    def chunks():
        for i in range(1000):  # 1000 s
            pulled.append(i)
            yield np.full(RATE, i, dtype=np.float32)

    first = next(keep_regions(chunks(), [(5 * RATE, 6 * RATE), (900 * RATE, 901 * RATE)]))
    assert first[0] == 5 and len(pulled) == 6


def test_speech_map_moves_times_back_to_the_input():
    speech_map = SpeechMap([(RATE * 20, RATE * 25), (RATE * 45, RATE * 50)], total_samples=RATE * 60)
    assert speech_map.kept_samples == 10 * RATE
    assert speech_map.to_original(0.0) == 20.0
    assert speech_map.to_original(2.5) == 22.5
    assert speech_map.to_original(5.0) == 45.0  # a start at a boundary begins the next region
    assert speech_map.to_original(5.0, is_end=True) == 25.0  # an end there closes the region before
    assert speech_map.to_original(7.0, is_end=True) == 47.0
    assert SpeechMap([], total_samples=RATE).to_original(1.0) == 1.0
    # Through a given region: a word from 4.8 to 5.2 s whose middle lies in the first region.
    assert speech_map.region(5.0) == 1 and speech_map.region(4.99) == 0
    assert speech_map.to_original(5.2, region=0) == pytest.approx(25.2)


def test_words_keep_to_the_region_of_their_middle():
    from aural.engine.transcribe import Segment, Word, _to_original

    speech_map = SpeechMap([(RATE * 20, RATE * 25), (RATE * 45, RATE * 50)], total_samples=RATE * 60)
    words = [Word(" ask", 4.0, 4.5, 0.9), Word(" not", 4.6, 5.2, 0.9), Word(" what", 5.2, 5.6, 0.9)]
    segment = Segment(id=0, start=3.9, end=5.6, text=" ask not what", tokens=[], avg_logprob=0.0,
                      compression_ratio=1.0, no_speech_prob=0.0, temperature=0.0, words=words)
    mapped = _to_original(segment, speech_map)
    assert [(w.start, w.end) for w in mapped.words] == [
        (pytest.approx(24.0), pytest.approx(24.5)), (pytest.approx(24.6), pytest.approx(25.2)),
        (pytest.approx(45.2), pytest.approx(45.6))]
    assert (mapped.start, mapped.end) == (mapped.words[0].start, mapped.words[-1].end)


# -- on real speech ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def padded_jfk(jfk_wav):
    """JFK split at 5.5 s, after 20 s of digital silence and with 20 s of white noise (-40 dBFS) between."""
    jfk = load_audio(jfk_wav)
    noise = np.random.default_rng(0).normal(0, 0.01, 20 * RATE).astype(np.float32)
    cut = int(5.5 * RATE)
    return np.concatenate([np.zeros(20 * RATE, dtype=np.float32), jfk[:cut], noise, jfk[cut:]])


def test_speech_regions_of_padded_speech(padded_jfk):
    regions, total = speech_regions(iter([padded_jfk[:400_000], padded_jfk[400_000:]]))
    assert total == padded_jfk.size
    (first_start, first_end), (second_start, second_end) = regions
    # Each region holds its half of the speech (with up to 0.4 s of padding), and little else.
    assert 19.5 <= first_start / RATE <= 20.2 and 25.3 <= first_end / RATE <= 26.0
    assert 45.0 <= second_start / RATE <= 45.7 and second_end / RATE == pytest.approx(51.0, abs=0.05)


def test_has_speech_agrees_with_the_regions_and_stops_at_the_first(padded_jfk):
    """has_speech decides as speech_regions does (JFK, its leading silence, the noise between its halves;
    0.4 s of speech in silence with a minimum region of 0.2 s, kept, and of 0.4 s, dropped), and stops
    reading once speech is certain."""
    silence, noise = padded_jfk[: 20 * RATE], padded_jfk[int(25.5 * RATE) + 8000 : int(45.5 * RATE) - 8000]
    word = np.concatenate([silence[:RATE], padded_jfk[20 * RATE + 8000 : 20 * RATE + 14400], silence[:RATE]])
    kept, dropped = (VadFilterOptions(min_speech_s=s, min_silence_s=0.1) for s in (0.2, 0.4))
    cases = [(padded_jfk, None, True), (silence, None, False), (noise, None, False), (word, kept, True),
             (word, dropped, False)]
    for audio, options, speech in cases:
        assert has_speech([audio], options) == bool(speech_regions([audio], options)[0]) == speech

    def chunks():
        yield padded_jfk[: 22 * RATE]  # the silence, then 2 s of speech
        raise AssertionError("read past the first speech")

    assert has_speech(chunks())


def test_heard_enough_agrees_with_the_regions_and_stops_once_settled(padded_jfk):
    """heard_enough answers as the regions' total length does, on either side of it, and reads no further
    than the speech that settles it."""
    regions, _ = speech_regions([padded_jfk])
    heard = sum(end - start for start, end in regions) / RATE  # JFK's 11 s of speech, padded
    for need in (0.5, heard - 0.1, heard, heard + 0.1, 60.0):
        assert heard_enough([padded_jfk], lambda s, need=need: s >= need) == (heard >= need)

    def chunks():
        yield padded_jfk[: 25 * RATE]  # the silence, then 5 s of speech
        raise AssertionError("read past the speech that settles it")

    assert heard_enough(chunks(), lambda s: s >= 3.0)


def test_vad_filter_transcribes_only_speech_on_the_input_timeline(whisper_model, padded_jfk):
    plain = transcribe(whisper_model, padded_jfk)
    list(plain)
    result = transcribe(whisper_model, padded_jfk, TranscribeOptions(vad_filter=True, word_timestamps=True))
    segments = list(result)
    assert normalize("".join(s.text for s in segments)) == normalize(JFK)
    # Times are the input's: nothing starts in the leading silence, nothing ends past the input, and no
    # word lies in (or stretches over) the noise between the two halves.
    assert 19.5 <= segments[0].start and segments[-1].end <= 51.0 + 1e-6
    assert all(s.start < s.end for s in segments)
    words = [w for s in segments for w in s.words]
    assert all(19.5 <= w.start <= w.end <= 26.5 or 45.0 <= w.start <= w.end <= 51.0 for w in words), words
    assert [w.start for w in words] == sorted(w.start for w in words)
    # Less audio went through the model: one window instead of two.
    assert result.info.duration_after_vad_s < 13.0 and result.info.duration_s == pytest.approx(51.0)
    assert result.timings.n_windows == 1 < plain.timings.n_windows
    assert result.timings.audio_s == pytest.approx(51.0)


def test_stop_ends_the_scan(padded_jfk):
    import threading

    stop = threading.Event()

    def chunks():
        yield padded_jfk[:RATE]
        stop.set()  # as a cancel from another thread would, while the first chunk is scanned
        yield padded_jfk[RATE:]

    assert speech_regions(chunks(), stop=stop) == ([], RATE)


def test_vad_filter_on_a_file_with_no_speech(whisper_model, tmp_path):
    import soundfile

    path = tmp_path / "hum.wav"
    t = np.arange(10 * RATE) / RATE
    soundfile.write(path, 0.2 * np.sin(2 * np.pi * 50 * t), RATE, subtype="PCM_16")  # 50 Hz mains hum
    result = transcribe(whisper_model, path, TranscribeOptions(vad_filter=True))
    assert list(result) == [] and result.info.duration_after_vad_s == 0.0
    assert result.timings.n_windows == 0
