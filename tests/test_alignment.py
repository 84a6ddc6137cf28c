"""Word timestamps (engine/alignment.py) and batched beam search / best-of (engine/decoding.py), on the real
tiny.en model and the JFK recording; DTW, the median filter and punctuation merging against plain
reference implementations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from whisper_normalizer.english import EnglishTextNormalizer

from aural.engine.alignment import WordTiming, dtw, find_alignment, median_filter, merge_punctuations, token_positions
from aural.engine.audio import load_audio
from aural.engine.decoding import DecodingOptions, decode_window
from aural.engine.features import HOP_LENGTH, N_FRAMES, N_SAMPLES, log_mel_spectrogram
from aural.engine.transcribe import SAMPLE_RATE, TranscribeOptions, transcribe

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
PREPENDED = "\"'“¿([{-"
APPENDED = "\"'.。,，!！?？:：”)]}、"


def normalized(text: str) -> str:
    return EnglishTextNormalizer()(text)


def encode(model, ctx, samples: np.ndarray) -> None:
    mel = log_mel_spectrogram(samples, model.n_mels, filters=model.mel_filters, padding=N_SAMPLES - samples.size)
    ctx.encode(np.ascontiguousarray(mel[:, :N_FRAMES]))


@pytest.fixture(scope="module")
def jfk_samples(jfk_wav) -> np.ndarray:
    return load_audio(jfk_wav)


# -- DTW against every monotone path -----------------------------------------------------------------


def all_paths(n: int, m: int):
    """Every path from (0, 0) to (n-1, m-1) made of diagonal, down and right steps."""
    def walk(i, j):
        if (i, j) == (n - 1, m - 1):
            yield [(i, j)]
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < n and j + dj < m:
                for rest in walk(i + di, j + dj):
                    yield [(i, j), *rest]
    return list(walk(0, 0))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_dtw_finds_the_cheapest_monotone_path(n, m, seed):
    # Random normal costs: no two paths tie, so the cheapest path is unique (see the tie test below).
    cost = np.random.default_rng(seed).standard_normal((n, m))
    rows, cols = dtw(cost)
    path = list(zip(rows.tolist(), cols.tolist()))
    candidates = {tuple(p): sum(cost[i, j] for i, j in p) for p in all_paths(*cost.shape)}
    assert tuple(path) in candidates  # a valid path: corner to corner, unit monotone steps
    assert candidates[tuple(path)] == pytest.approx(min(candidates.values()), abs=1e-9)


def test_dtw_breaks_ties_as_openai_whisper_does():
    # openai-whisper timing.py dtw_cpu takes the diagonal or the step down only when strictly cheaper
    # than both others, else the step right: with the diagonal and down tied below right, it goes right,
    # even though that path costs 4 where (0,0) (1,1) (2,1) would cost 3.
    rows, cols = dtw(np.ones((3, 2)))
    assert list(zip(rows.tolist(), cols.tolist())) == [(0, 0), (1, 0), (2, 0), (2, 1)]


def test_dtw_on_a_diagonal_valley():
    cost = np.ones((4, 6))
    for i, j in [(0, 0), (0, 1), (1, 2), (2, 3), (2, 4), (3, 5)]:
        cost[i, j] = 0.0
    rows, cols = dtw(cost)
    assert list(zip(rows.tolist(), cols.tolist())) == [(0, 0), (0, 1), (1, 2), (2, 3), (2, 4), (3, 5)]


# -- median filter -----------------------------------------------------------------------------------


def reference_median(x: np.ndarray, width: int) -> np.ndarray:
    """Position by position: the median of the `width` samples around it, mirrored at the edges
    without repeating the edge sample (numpy's and PyTorch's "reflect")."""
    n, pad = x.shape[-1], width // 2
    if n <= pad:
        return x

    def mirrored(k: int) -> int:
        return -k if k < 0 else 2 * (n - 1) - k if k >= n else k

    out = np.empty_like(x, dtype=np.float64)
    for t in range(n):
        index = [mirrored(k) for k in range(t - pad, t + pad + 1)]
        out[..., t] = np.median(x[..., index], axis=-1)
    return out


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 24)),
              elements=st.floats(-10, 10, allow_nan=False)),
       st.sampled_from([1, 3, 5, 7]))
def test_median_filter_matches_a_plain_reference(x, width):
    np.testing.assert_allclose(median_filter(x, width), reference_median(x, width))


def test_median_filter_removes_a_spike():
    x = np.zeros((1, 12))
    x[0, 5] = 9.0
    assert not median_filter(x, 7).any()


# -- punctuation -------------------------------------------------------------------------------------


def words(*spec: tuple[str, float, float]) -> list[WordTiming]:
    return [WordTiming(w, [100 + i], s, e, 0.5) for i, (w, s, e) in enumerate(spec)]


def kept(out: list[WordTiming]) -> list[tuple[str, list[int], float, float]]:
    return [(w.word, w.tokens, w.start, w.end) for w in out if w.word]


def test_closing_marks_join_the_word_before():
    given_words = words((" Hello", 0.0, 0.5), (",", 0.5, 0.6), (" world", 0.6, 1.0), (".", 1.0, 1.1))
    out = merge_punctuations(given_words, PREPENDED, APPENDED)
    assert kept(out) == [(" Hello,", [100, 101], 0.0, 0.5), (" world.", [102, 103], 0.6, 1.0)]
    assert [w.word for w in given_words] == [" Hello", ",", " world", "."]  # the input is left alone


def test_opening_marks_join_the_word_after():
    out = merge_punctuations(words((" (", 0.0, 0.1), ("yes", 0.1, 0.4), (")", 0.4, 0.5), (" no", 0.6, 0.9)),
                             PREPENDED, APPENDED)
    assert kept(out) == [(" (yes)", [100, 101, 102], 0.1, 0.4), (" no", [103], 0.6, 0.9)]


def test_marks_that_cannot_merge_stay():
    # An opening mark needs a leading space and a word after it; a closing mark stays apart from a
    # word that ends in a space.
    out = merge_punctuations(words((" Hi", 0.0, 0.3), ("-", 0.3, 0.4), (" so ", 0.4, 0.6), ("!", 0.6, 0.7),
                                   (' "', 0.7, 0.8)), PREPENDED, APPENDED)
    assert [w for w, *_ in kept(out)] == [" Hi", "-", " so ", "!", ' "']


# -- word timestamps on JFK --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jfk_words(whisper_model, jfk_wav):
    return list(transcribe(whisper_model, jfk_wav, TranscribeOptions(language="en", word_timestamps=True)))


def test_jfk_words_are_the_transcript(jfk_words):
    assert jfk_words and all(s.words for s in jfk_words)
    for s in jfk_words:
        assert "".join(w.word for w in s.words).replace(" ", "") == s.text.replace(" ", "")
    assert normalized(" ".join(w.word for s in jfk_words for w in s.words)) == normalized(JFK)
    assert all(0.0 <= w.probability <= 1.0 for s in jfk_words for w in s.words)


def test_jfk_word_times_are_monotone_and_inside_their_segment(jfk_words, jfk_samples):
    duration = jfk_samples.size / SAMPLE_RATE
    starts = [w.start for s in jfk_words for w in s.words]
    assert starts == sorted(starts)
    for s in jfk_words:
        for w in s.words:
            assert s.start <= w.start <= w.end <= s.end <= duration + 0.01  # times are rounded to 10 ms
    # The words cover the speech: the last word ends in the last second of the recording.
    assert jfk_words[-1].words[-1].end > duration - 1.0


def test_word_times_follow_the_audio(whisper_model, jfk_samples):
    """The same text aligned to the recording and to the recording 2 s later: every word but the
    first (DTW pins the first token to the first frame) moves by 2 s."""
    ctx = whisper_model.new_session()
    tok = whisper_model.tokenizer
    encode(whisper_model, ctx, jfk_samples)
    text = decode_window(ctx, tok, DecodingOptions(without_timestamps=True), whisper_model.n_text_ctx).tokens
    heads = whisper_model.alignment_heads
    original = find_alignment(ctx, tok, text, jfk_samples.size // HOP_LENGTH, heads)
    later = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), jfk_samples])
    encode(whisper_model, ctx, later)
    shifted = find_alignment(ctx, tok, text, later.size // HOP_LENGTH, heads)
    assert [w.word for w in shifted] == [w.word for w in original]
    moves = [b.start - a.start for a, b in zip(original[1:], shifted[1:])]
    assert np.median(moves) == pytest.approx(2.0, abs=0.1)


def test_token_positions_follow_the_audio(whisper_model, jfk_samples):
    """AlignAtt's signal: each token's most attended encoder position. Over JFK they move forward through
    the recording, and 2 s of silence in front moves them by 2 s (100 positions), within the median
    filter's width."""
    ctx = whisper_model.new_session()
    tok = whisper_model.tokenizer
    encode(whisper_model, ctx, jfk_samples)
    text = decode_window(ctx, tok, DecodingOptions(without_timestamps=True), whisper_model.n_text_ctx).tokens
    heads = whisper_model.alignment_heads
    n_pos = jfk_samples.size // HOP_LENGTH // 2
    original = token_positions(ctx, tok, text, jfk_samples.size // HOP_LENGTH, heads)
    assert original.shape == (len(text),) and np.all((0 <= original) & (original < n_pos))
    assert np.corrcoef(np.arange(len(text)), original)[0, 1] > 0.9, original
    later = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), jfk_samples])
    encode(whisper_model, ctx, later)
    shifted = token_positions(ctx, tok, text, later.size // HOP_LENGTH, heads)
    assert np.median(shifted - original) == pytest.approx(100, abs=7)


# -- beam search and best-of -------------------------------------------------------------------------


def beam_context(model, samples, kv_mode: str = "device"):
    ctx = model.new_session(kv_mode=kv_mode, n_seq=5)
    encode(model, ctx, samples)
    return ctx


def counters(ctx) -> dict[str, int]:
    return {k: ctx.stats[k] for k in ("decode_calls", "tokens_decoded", "graph_builds", "graph_reuses", "reorders")}


@pytest.fixture(scope="module")
def beam_ctx(whisper_model, jfk_samples):
    return beam_context(whisper_model, jfk_samples)


@pytest.fixture(scope="module")
def jfk_beams(whisper_model, beam_ctx):
    """JFK decoded with 5 beams, and what that did to the session's counters."""
    before = counters(beam_ctx)
    result = decode_window(beam_ctx, whisper_model.tokenizer, DecodingOptions(beam_size=5), whisper_model.n_text_ctx)
    return result, {k: v - before[k] for k, v in counters(beam_ctx).items()}


def test_beam_search_batches_the_beams_and_reuses_one_graph(jfk_beams):
    result, used = jfk_beams
    assert normalized(result.text) == normalized(JFK)
    steps = used["decode_calls"]
    assert steps > 10
    # The prompt is one call (<|startoftranscript|> alone for tiny.en); every later call feeds all 5 beams.
    assert used["tokens_decoded"] == 1 + 5 * (steps - 1)
    assert used["graph_reuses"] >= steps - 2 and used["graph_builds"] <= 2
    assert used["reorders"] >= 1
    assert -0.6 < result.avg_logprob < 0


def test_beams_decode_the_same_with_the_kv_on_the_host(whisper_model, jfk_samples, jfk_beams):
    host = decode_window(beam_context(whisper_model, jfk_samples, "host"), whisper_model.tokenizer,
                         DecodingOptions(beam_size=5), whisper_model.n_text_ctx)
    assert host.tokens == jfk_beams[0].tokens


class RecordingContext:
    """The real context, with every decoder call's tokens and sequence ids written down."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.calls: list[tuple[list[int], list[int] | None]] = []

    def decode(self, tokens, n_past, outputs=None, seq_ids=None):
        self.calls.append((tokens.tolist(), None if seq_ids is None else list(seq_ids)))
        return self._ctx.decode(tokens, n_past, outputs, seq_ids)

    def __getattr__(self, name):
        return getattr(self._ctx, name)


def test_best_of_returns_one_of_its_samples(whisper_model, beam_ctx):
    # The beams' session serves: 3 samples use sequences 0-2 of its 5, as a fallback after beam search would.
    tok = whisper_model.tokenizer
    ctx = RecordingContext(beam_ctx)
    result = decode_window(ctx, tok, DecodingOptions(temperature=0.5, best_of=3, seed=11), whisper_model.n_text_ctx)
    batched = ctx.calls[1:]
    assert batched and all(seq_ids == [0, 1, 2] for _, seq_ids in batched)  # one call feeds all three
    # Each sample is what its sequence was fed, up to its end of text (finished ones keep being fed it).
    samples = [list(itertools.takewhile(lambda t: t != tok.eot, lane)) for lane in zip(*(t for t, _ in batched))]
    assert result.tokens in samples
    assert result.temperature == 0.5 and result.avg_logprob < 0
