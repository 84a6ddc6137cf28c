"""Whisper's logit filters on synthetic logits, the prompt layout, and real decodes of the JFK window."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from whisper_normalizer.english import EnglishTextNormalizer

from aural import _native
from aural.engine.audio import load_audio
from aural.engine.models import store as models
from aural.engine.decoding import (
    DRAFT_TOKENS,
    DecodingOptions,
    build_logit_rules,
    compression_ratio,
    LOOP_SPAN,
    decode_window,
    is_looping,
    detect_language,
    initial_tokens,
)
from aural.engine.features import N_SAMPLES, log_mel_spectrogram
from aural.engine.text.tokenizer import WhisperTokenizer

from conftest import gamma_f32

N_VOCAB = 51864
JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."


@pytest.fixture(scope="module")
def tok(tiny_gguf):
    info = models.model_info(tiny_gguf)
    return WhisperTokenizer.from_gguf_json(info["tokenizer_json"], multilingual=False)


def flat() -> np.ndarray:
    return np.zeros(N_VOCAB, dtype=np.float32)


def allowed(logits: np.ndarray) -> np.ndarray:
    return np.isfinite(logits)


def rules(tok, *, blank=False, suppressed=(), cap=None, timestamps=True) -> _native.LogitRules:
    return _native.LogitRules(n_vocab=N_VOCAB, blank=[220, tok.eot] if blank else [], suppressed=list(suppressed),
                              timestamps=timestamps, eot=tok.eot, timestamp_begin=tok.timestamp_begin,
                              no_timestamps=tok.no_timestamps, max_initial_timestamp=-1 if cap is None else cap)


# -- SuppressBlank / SuppressTokens ----------------------------------------------------------------


def test_suppress_blank_only_at_the_first_sampled_position(tok):
    rule = rules(tok, blank=True, timestamps=False)
    first = rule.apply(flat(), [])
    assert not allowed(first)[[220, tok.eot]].any()
    assert allowed(first).sum() == N_VOCAB - 2
    later = rule.apply(flat(), [tok.timestamp_begin])
    assert allowed(later).all()


def test_suppress_tokens_every_step(tok):
    ids = tok.suppress_tokens("-1")
    rule = rules(tok, suppressed=ids, timestamps=False)
    for sampled in ([], [tok.timestamp_begin, 400]):
        logits = rule.apply(flat(), sampled)
        assert not allowed(logits)[list(ids)].any()
        assert allowed(logits).sum() == N_VOCAB - len(ids)


def test_rules_reject_ids_outside_the_vocabulary_and_rows_of_another_size(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        rules(tok, suppressed=[N_VOCAB])
    with pytest.raises(ValueError, match="n_vocab"):
        rules(tok).apply(np.zeros(N_VOCAB - 1, dtype=np.float32), [])
    with pytest.raises(ValueError, match="one list"):
        rules(tok).top_logprobs(np.zeros((2, N_VOCAB), dtype=np.float32), [[]], 1)


# -- ApplyTimestampRules ---------------------------------------------------------------------------


@pytest.fixture()
def ts(tok):
    return tok.timestamp_begin


def test_first_token_is_a_timestamp_within_the_initial_cap(tok, ts):
    ok = allowed(rules(tok, cap=50).apply(flat(), []))
    assert not ok[:ts].any()  # no text, no end of text
    assert ok[ts:ts + 51].all()  # <|0.00|> .. <|1.00|>
    assert not ok[ts + 51:].any()  # nothing later than max_initial_timestamp
    assert allowed(rules(tok).apply(flat(), []))[ts:].all()


def test_notimestamps_is_never_sampled(tok, ts):
    logits = flat()
    logits[tok.no_timestamps] = 100.0
    assert not allowed(rules(tok).apply(logits, [ts, 400]))[tok.no_timestamps]


def test_after_a_single_timestamp_text_is_suppressed(tok, ts):
    logits = flat()
    logits[400] = 50.0  # a very likely text token must still lose
    logits[tok.eot] = 20.0  # likelier than all timestamps together, so it survives the mass rule
    ok = allowed(rules(tok, cap=50).apply(logits, [ts, 400, 401, ts + 30]))
    assert not ok[:tok.eot].any()
    assert ok[tok.eot]  # the window may end after the closing timestamp
    assert ok[ts + 30]  # the pair may close on the same time
    assert not ok[ts:ts + 30].any()  # never earlier


def test_after_a_timestamp_pair_text_must_follow(tok, ts):
    ok = allowed(rules(tok, cap=50).apply(flat(), [ts, 400, ts + 30, ts + 30]))
    assert not ok[ts:].any()
    assert ok[400]


def test_timestamps_never_decrease_and_segments_have_length(tok, ts):
    logits = flat()
    logits[400] = 20.0  # likelier than all timestamps together, so text stays allowed
    ok = allowed(rules(tok, cap=50).apply(logits, [ts + 10, 400, 401]))
    assert not ok[ts:ts + 11].any()  # <= the last timestamp: a zero-length or backwards segment
    assert ok[ts + 11:].all()
    assert ok[400]


def test_timestamp_mass_beats_the_best_text_token(tok, ts):
    sampled = [ts, 400]
    logits = np.full(N_VOCAB, -10.0, dtype=np.float32)
    logits[500] = 2.0  # best single token is text ...
    logits[ts + 10:ts + 60] = 0.0  # ... but 50 timestamps at e^0 outweigh e^2 together
    filtered = rules(tok).apply(logits, sampled)
    assert not allowed(filtered)[:ts].any()
    assert allowed(filtered)[ts + 10]
    # With the text token clearly ahead, text stays allowed.
    logits = np.full(N_VOCAB, -10.0, dtype=np.float32)
    logits[500] = 6.0
    logits[ts + 10:ts + 60] = 0.0
    assert allowed(rules(tok).apply(logits, sampled))[500]


def reference_rules(tok, logits: np.ndarray, sampled: list[int], cap: int | None) -> tuple[np.ndarray, float]:
    """openai-whisper's ApplyTimestampRules after SuppressTokens(suppressed) in float64 NumPy (decoding.py,
    v20240930), and the margin of its last rule: log-sum-exp of the timestamps minus the best text logit."""
    x = logits.astype(np.float64)
    ts, eot = tok.timestamp_begin, tok.eot
    x[tok.no_timestamps] = -np.inf
    last_was_ts = len(sampled) >= 1 and sampled[-1] >= ts
    penultimate_was_ts = len(sampled) < 2 or sampled[-2] >= ts
    if last_was_ts:
        if penultimate_was_ts:
            x[ts:] = -np.inf
        else:
            x[:eot] = -np.inf
    stamps = [t for t in sampled if t >= ts]
    if stamps:
        x[ts:stamps[-1] if last_was_ts and not penultimate_was_ts else stamps[-1] + 1] = -np.inf
    if not sampled:
        x[:ts] = -np.inf
        if cap is not None:
            x[ts + cap + 1:] = -np.inf
    top = x[ts:].max()
    mass = top + np.log(np.sum(np.exp(x[ts:] - top))) if np.isfinite(top) else -np.inf
    margin = mass - x[:ts].max()
    if margin > 0:
        x[:ts] = -np.inf
    return x, margin


def test_native_rules_are_openai_whispers_on_random_steps(tok, ts):
    """Random rows after random histories (text and timestamps mixed, lone and paired timestamps, empty):
    the native rules forbid exactly what the float64 reference forbids and leave every other logit as it
    was. Steps whose last rule is decided by less than 1e-4 are skipped: the native log-sum-exp may be
    ~2.4e-6 off (native/logits.h), the reference's f64 sum ~1e-13."""
    rng = np.random.default_rng(5)
    suppressed = tok.suppress_tokens("-1")
    decided = {True: 0, False: 0}
    for case in range(300):
        cap = [None, 50][case % 2]
        rule = rules(tok, suppressed=suppressed, cap=cap)
        n = int(rng.integers(0, 8))
        stamp = rng.random(n) < 0.4
        sampled = [int(t) for t in np.where(stamp, rng.integers(ts, N_VOCAB, n), rng.integers(0, ts, n))]
        if case % 5 == 0 and n >= 2:
            sampled[-2:] = [ts + 40, ts + 40]  # a pair closed on the same time
        logits = rng.normal(0, 3, N_VOCAB).astype(np.float32)
        logits[ts:] += np.float32(rng.normal(2, 3))  # timestamps sometimes likelier together, sometimes not
        want = logits.copy()
        want[list(suppressed)] = -np.inf
        want, margin = reference_rules(tok, want, sampled, cap)
        if abs(margin) < 1e-4:
            continue
        decided[bool(margin > 0)] += 1
        got = rule.apply(logits, sampled)
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), (sampled, cap, margin)
        kept = np.isfinite(want)
        assert np.array_equal(got[kept], logits[kept])
    assert min(decided.values()) > 30  # both outcomes of the mass rule were exercised


def test_rules_top_logprobs_is_apply_then_top_logprobs_and_keeps_its_input(tok, ts):
    rng = np.random.default_rng(9)
    rows = rng.normal(0, 3, (5, N_VOCAB)).astype(np.float32)
    before = rows.copy()
    histories = [[], [ts], [ts, 400], [ts, 400, ts + 20], [ts + 3, 400, ts + 20, ts + 20]]
    rule = build_logit_rules(tok, DecodingOptions(), N_VOCAB)
    ids, logprobs, norms = rule.top_logprobs(rows, histories, 6)
    assert np.array_equal(rows, before)
    for r, sampled in enumerate(histories):
        one = _native.top_logprobs(rule.apply(rows[r], sampled), 6)
        assert ids[r].tolist() == one[0].tolist()
        assert logprobs[r].tolist() == one[1].tolist() and norms[r] == one[2]


def test_rules_follow_the_options(tok):
    default = build_logit_rules(tok, DecodingOptions(), N_VOCAB)
    assert default.blank == [*tok.encode(" "), tok.eot] and default.timestamps
    assert default.suppressed == list(tok.suppress_tokens("-1"))
    assert default.max_initial_timestamp == 50  # 1.0 s at 0.02 s a step
    assert not build_logit_rules(tok, DecodingOptions(without_timestamps=True), N_VOCAB).timestamps
    bare = build_logit_rules(tok, DecodingOptions(suppress_blank=False, suppress_tokens=None), N_VOCAB)
    assert bare.blank == [] and bare.suppressed == []
    # First step with defaults: only <|0.00|>..<|1.00|> remain.
    first = default.apply(flat(), [])
    assert np.flatnonzero(allowed(first)).tolist() == list(range(tok.timestamp_begin, tok.timestamp_begin + 51))


# -- prompt layout ---------------------------------------------------------------------------------


def test_initial_tokens_layout(tok):
    assert initial_tokens(tok, DecodingOptions(), 448) == [tok.sot]
    assert initial_tokens(tok, DecodingOptions(without_timestamps=True), 448) == [tok.sot, tok.no_timestamps]
    prompt = list(range(1000, 1300))
    tokens = initial_tokens(tok, DecodingOptions(prompt=prompt), 448)
    assert tokens == [tok.sot_prev, *prompt[-223:], tok.sot]  # last n_text_ctx // 2 - 1 prompt tokens
    text = initial_tokens(tok, DecodingOptions(prompt="  Hello there. "), 448)
    assert text == [tok.sot_prev, *tok.encode(" Hello there."), tok.sot]


def test_compression_ratio():
    assert compression_ratio("a" * 400) > 10
    assert compression_ratio("And so my fellow Americans") < 2.4


# -- the decode loop, on a stand-in context --------------------------------------------------------


class FakeContext:
    """Stands in for `_native.Context`: every row favours one text token, so only limits stop."""

    def __init__(self, favourite: int, capacity: int = 448, cycle: int = 1):
        self.favourite = favourite
        self.cycle = cycle  # the favourite advances through `cycle` ids, one per call
        self.calls: list[tuple[list[int], int, list[int] | None]] = []
        self.stats = {"kv_capacity_tokens": capacity}
        self.last_timings = {"compute_ms": 1.0, "kv_io_ms": 0.0, "kv_io_bytes": 0, "logits_ms": 0.1,
                             "n_tokens": 1, "reused": True}

    def decode(self, tokens, n_past, outputs=None):
        self.calls.append((tokens.tolist(), n_past, outputs))
        logits = np.zeros((len(outputs) if outputs else 1, N_VOCAB), dtype=np.float32)
        logits[:, self.favourite + len(self.calls) % self.cycle] = 30.0
        return logits


def test_first_call_feeds_the_prompt_and_reads_two_rows(tok):
    ctx = FakeContext(favourite=400)
    options = DecodingOptions(prompt=[1000, 1001], sample_len=3)
    result = decode_window(ctx, tok, options, 448)
    assert ctx.calls[0] == ([tok.sot_prev, 1000, 1001, tok.sot], 0, [3])  # sot is also the last row
    assert [c[1] for c in ctx.calls[1:]] == [4, 5]  # then one token per call, at the next position
    assert result.tokens == [tok.timestamp_begin, 400, 400]  # a timestamp first, then the favourite
    assert ctx.calls[1][0] == [tok.timestamp_begin]
    without = FakeContext(favourite=400)
    decode_window(without, tok, DecodingOptions(without_timestamps=True, sample_len=1), 448)
    assert without.calls[0] == ([tok.sot, tok.no_timestamps], 0, [0, 1])  # sot row and last row


def test_decoding_stops_when_the_text_context_is_full(tok):
    ctx = FakeContext(favourite=400, capacity=50, cycle=60)  # never repeats: only the arena stops it
    result = decode_window(ctx, tok, DecodingOptions(), 448)
    assert max(n_past for _, n_past, _ in ctx.calls) == 49  # never past the arena
    assert len(result.tokens) == 50
    assert result.timer.n_calls == 50 and result.timer.reused_calls == 50


def test_a_decode_that_repeats_itself_is_cut(tok):
    ctx = FakeContext(favourite=400, cycle=3)  # 400 401 402 400 401 402 ...: a hallucination loop
    result = decode_window(ctx, tok, DecodingOptions(), 448)
    assert result.looped and is_looping(result.tokens)
    assert len(result.tokens) == 1 + LOOP_SPAN  # the first timestamp, then one span of the loop
    assert len(ctx.calls) < 448 // 4


class PositionContext(FakeContext):
    """A stand-in whose row after the token at position p favours 400 + 7 p % 101 whatever the tokens: greedy
    decoding writes 407, 414, ... (without timestamps), and a draft's rows are right only where it is."""

    def decode(self, tokens, n_past, outputs=None):
        self.calls.append((tokens.tolist(), n_past, outputs))
        self.last_timings = {**self.last_timings, "n_tokens": len(tokens)}
        rows = outputs if outputs else [len(tokens) - 1]
        logits = np.zeros((len(rows), N_VOCAB), dtype=np.float32)
        for i, k in enumerate(rows):
            logits[i, 400 + 7 * (n_past + k) % 101] = 30.0
        return logits


def test_a_draft_is_fed_ahead_while_the_sampled_tokens_follow_it(tok):
    options = DecodingOptions(without_timestamps=True, sample_len=20)
    plain = decode_window(PositionContext(400), tok, options, 448)
    assert plain.tokens[:3] == [407, 414, 421] and len(plain.tokens) == 20
    s = plain.tokens
    draft = list(s)
    draft[9] = 999  # one token it did not foresee
    ctx = PositionContext(400)
    result = decode_window(ctx, tok, DecodingOptions(without_timestamps=True, sample_len=20, draft=draft), 448)
    assert result.tokens == s and result.sum_logprob == plain.sum_logprob
    assert ctx.calls[1:] == [
        ([s[0], *draft[1:8]], 2, list(range(8))),  # after the prompt [sot, notimestamps]: the first token and 7
        ([s[8], *draft[9:16]], 10, list(range(8))),  # the ninth and 7, of which only the ninth's row is used
        ([s[9]], 11, None),  # over the cell of the draft's 10th: one token a call,
        ([s[10]], 12, None),
        ([s[11], *draft[12:19]], 13, list(range(8))),  # until the last two sampled are the draft's 11th and 12th
    ]
    assert (result.timer.draft_tokens, result.timer.draft_accepted) == (21, 14)
    assert result.timer.n_tokens == 2 + 8 + 8 + 1 + 1 + 8 and result.timer.n_calls == 6


def test_a_draft_stops_at_the_sample_length_and_the_arena(tok):
    truth = [400 + 7 * (k + 1) % 101 for k in range(40)]  # what greedy writes
    ctx = PositionContext(400, capacity=12)  # 2 prompt tokens and 10 more
    result = decode_window(ctx, tok, DecodingOptions(without_timestamps=True, draft=truth), 448)
    assert result.tokens == truth[:11] and max(n + len(t) for t, n, _ in ctx.calls) == 12
    ctx = PositionContext(400)
    result = decode_window(ctx, tok, DecodingOptions(without_timestamps=True, sample_len=4, draft=truth), 448)
    assert result.tokens == truth[:4] and ctx.calls[1][0] == truth[:3]  # the 4th is sampled, never fed
    assert DRAFT_TOKENS == 7


def test_sampling_takes_no_draft(tok):
    ctx = PositionContext(400)
    options = DecodingOptions(without_timestamps=True, sample_len=5, temperature=0.5, seed=1, draft=[407] * 5)
    result = decode_window(ctx, tok, options, 448)
    assert result.timer.draft_tokens == 0 and all(len(fed) == 1 for fed, _, _ in ctx.calls[1:])


@pytest.mark.parametrize(
    ("tokens", "looping"),
    [
        ([7] * 31, False),                        # shorter than the span
        ([7] * 32, True),                         # one token, over the span
        ([1, 2, 3] * 11, True),                   # a 3-token unit
        (list(range(16)) * 4, True),              # the longest unit, 4 times
        (list(range(17)) * 3, False),             # a unit longer than LOOP_MAX_UNIT
        ([5, 6] * 20 + [9], False),               # the loop was broken by the last token
        (list(range(40)), False),
    ],
)
def test_is_looping(tokens, looping):
    assert is_looping(tokens) is looping


def test_detect_language_reads_only_language_tokens():
    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|zh|>", "<|de|>", "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    vocab = {"hello": 0, "[UNK]": 1, **{s: 2 + i for i, s in enumerate(specials)}}
    tok = WhisperTokenizer(Tokenizer(WordLevel(vocab, unk_token="[UNK]")), multilingual=True)
    ctx = FakeContext(favourite=0)  # a text token wins overall; it must not count
    ctx.decode = lambda tokens, n_past, outputs=None: np.array([[9.0, 0, 0, 0, 1.0, 3.0, 2.0] + [0] * 6])
    language, probs = detect_language(ctx, tok)
    assert language == "zh"
    assert set(probs) == {"en", "zh", "de"} and sum(probs.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        detect_language(ctx, WhisperTokenizer(tok._hf, multilingual=False))


# -- real decodes ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jfk_ctx(whisper_model, jfk_wav):
    samples = load_audio(jfk_wav)
    mel = log_mel_spectrogram(samples, whisper_model.n_mels, filters=whisper_model.mel_filters,
                              padding=N_SAMPLES - samples.size)
    ctx = whisper_model.new_session()
    ctx.encode(np.ascontiguousarray(mel))
    return ctx


def normalized(text: str) -> str:
    return EnglishTextNormalizer()(text)


def test_greedy_decode_of_the_jfk_window(whisper_model, jfk_ctx):
    tok = whisper_model.tokenizer
    result = decode_window(jfk_ctx, tok, DecodingOptions(), whisper_model.n_text_ctx)
    assert normalized(result.text) == normalized(JFK)
    assert result.tokens[0] == tok.timestamp_begin  # the first token is <|0.00|>
    assert result.tokens[-1] >= tok.timestamp_begin and tok.eot not in result.tokens
    stamps = [t for t in result.tokens if t >= tok.timestamp_begin]
    assert stamps == sorted(stamps) and stamps[-1] - tok.timestamp_begin <= 11.0 / 0.02
    assert result.no_speech_prob < 0.1
    assert -0.6 < result.avg_logprob < 0
    assert result.avg_logprob == pytest.approx(result.sum_logprob / (len(result.tokens) + 1))
    assert result.compression_ratio == pytest.approx(compression_ratio(result.text))
    assert result.temperature == 0.0 and result.language is None
    # One prompt batch, then one call per sampled token (the end of text is sampled, never fed).
    assert result.timer.n_calls == len(result.tokens) + 1
    assert result.timer.reused_calls > 0
    # Greedy is deterministic: the same window decodes to the same tokens.
    again = decode_window(jfk_ctx, tok, DecodingOptions(), whisper_model.n_text_ctx)
    assert again.tokens == result.tokens


def test_decode_without_timestamps(whisper_model, jfk_ctx):
    tok = whisper_model.tokenizer
    result = decode_window(jfk_ctx, tok, DecodingOptions(without_timestamps=True), whisper_model.n_text_ctx)
    assert all(t < tok.eot for t in result.tokens)
    assert normalized(result.text) == normalized(JFK)


def test_sample_len_caps_the_output(whisper_model, jfk_ctx):
    result = decode_window(jfk_ctx, whisper_model.tokenizer, DecodingOptions(sample_len=5), whisper_model.n_text_ctx)
    assert len(result.tokens) == 5
    assert result.avg_logprob == pytest.approx(result.sum_logprob / 6)


def test_sampling_is_seeded(whisper_model, jfk_ctx):
    tok = whisper_model.tokenizer
    options = DecodingOptions(temperature=1.0, seed=7)
    first = decode_window(jfk_ctx, tok, options, whisper_model.n_text_ctx)
    second = decode_window(jfk_ctx, tok, options, whisper_model.n_text_ctx)
    assert first.tokens == second.tokens and first.temperature == 1.0
    assert first.tokens[0] >= tok.timestamp_begin  # the timestamp rules hold when sampling too


# -- drafts on the real model ----------------------------------------------------------------------

# A batch of tokens runs the operations a one-token call runs, row by row: integer products (Aural's int8
# kernels: the same int32 sums in any order), per-row norms and attention. Where a backend's float products
# tile several rows differently, two orders of an n-term dot product differ by at most 2 gamma_n of the sum
# of the terms' magnitudes (conftest.gamma_f32), 1.8e-4 for tiny.en's widest (1536 terms), carried through
# 4 layers and their norms. TOLERANCE, relative to the largest logit, is 16 such bounds (observed on the
# CPU at the haswell and sse42 levels: 0, the same bits); a token fed at the wrong position or a stale K/V
# cell moves a row by a large part of its range.
TOLERANCE = 16 * 2 * gamma_f32(4 * 384)


def rows_one_by_one(ctx, initial: list[int], tokens: list[int]) -> np.ndarray:
    ctx.decode(np.asarray(initial, dtype=np.int32), 0)
    return np.stack([ctx.decode(np.asarray([t], dtype=np.int32), len(initial) + i)[0] for i, t in enumerate(tokens)])


def test_rows_of_a_batch_are_those_of_one_token_calls(whisper_model, jfk_ctx):
    tok = whisper_model.tokenizer
    result = decode_window(jfk_ctx, tok, DecodingOptions(), whisper_model.n_text_ctx)
    initial = initial_tokens(tok, DecodingOptions(), whisper_model.n_text_ctx)
    single = rows_one_by_one(jfk_ctx, initial, result.tokens)
    bound = TOLERANCE * np.abs(single).max()
    for n in range(2, DRAFT_TOKENS + 2):
        jfk_ctx.decode(np.asarray(initial, dtype=np.int32), 0)
        batched = np.concatenate([
            jfk_ctx.decode(np.asarray(result.tokens[k:k + n], dtype=np.int32), len(initial) + k,
                           list(range(len(result.tokens[k:k + n]))))
            for k in range(0, len(result.tokens), n)])
        assert np.abs(batched - single).max() <= bound, n
    shifted = jfk_ctx.decode(np.asarray(result.tokens[:4], dtype=np.int32), len(initial) + 1, list(range(4)))
    assert np.abs(shifted - single[:4]).max() > 10 * bound  # one position off is far outside it


def certain_prefix(ctx, tok, options: DecodingOptions, n_text_ctx: int, tokens: list[int], bound: float) -> int:
    """How many of greedy's `tokens` no rounding within `bound` could change: up to the first step whose
    best filtered logit leads the next by 2 bounds or less."""
    initial = initial_tokens(tok, options, n_text_ctx)
    rows = rows_one_by_one(ctx, initial, tokens[:-1])
    rule = build_logit_rules(tok, options, N_VOCAB)
    for i, row in enumerate(rows):
        top = np.sort(rule.apply(row, tokens[:i + 1]))[-2:]
        if top[1] - top[0] <= 2 * bound:
            return i + 1
    return len(tokens)


def test_a_draft_changes_the_calls_not_the_tokens(whisper_model, jfk_ctx, jfk_wav):
    tok, n_text_ctx = whisper_model.tokenizer, whisper_model.n_text_ctx
    plain = decode_window(jfk_ctx, tok, DecodingOptions(), n_text_ctx)
    # A live stream's draft: the hypothesis of the first 7 s of the clip, which ends sooner and otherwise.
    early = whisper_model.new_session()
    samples = load_audio(jfk_wav)[:7 * 16000]
    early.encode(np.ascontiguousarray(log_mel_spectrogram(samples, whisper_model.n_mels,
                                                          filters=whisper_model.mel_filters,
                                                          padding=N_SAMPLES - samples.size)))
    partial = decode_window(early, tok, DecodingOptions(), n_text_ctx).tokens
    assert partial != plain.tokens[:len(partial)] or len(partial) < len(plain.tokens)
    bound = TOLERANCE * 40.0  # tiny.en's logits stay under 40 on this window
    # 15: the 16th token is a choice between two timestamps 0.04 s apart whose logits are 0.2 apart.
    sure = certain_prefix(jfk_ctx, tok, DecodingOptions(), n_text_ctx, plain.tokens, bound)
    assert sure >= 10
    for draft in (plain.tokens, partial, list(reversed(plain.tokens))):
        result = decode_window(jfk_ctx, tok, DecodingOptions(draft=draft), n_text_ctx)
        assert result.tokens[:sure] == plain.tokens[:sure]
        if result.tokens == plain.tokens:
            assert result.sum_logprob == pytest.approx(plain.sum_logprob, abs=len(plain.tokens) * bound)
        calls = result.timer.n_calls
        assert calls == plain.timer.n_calls - result.timer.draft_accepted
    own = decode_window(jfk_ctx, tok, DecodingOptions(draft=plain.tokens), n_text_ctx)
    assert own.timer.n_calls <= 2 + len(plain.tokens) // (DRAFT_TOKENS + 1)  # the prompt, then 8 tokens a call
