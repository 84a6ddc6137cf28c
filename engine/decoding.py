"""Decoding one 30 s window: Whisper's prompt layout, logit filters, greedy or sampled tokens.

The window must already be encoded (`Context.encode`). The decoder state lives in the native KV
arena: the first call feeds the whole initial sequence at n_past=0, then one token per call. The
logit filters and the top-k log-softmax of each step's rows run natively (`aural._native.LogitRules`),
following openai-whisper decoding.py (DecodingTask, GreedyDecoder, SuppressBlank, SuppressTokens,
ApplyTimestampRules) rule for rule.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .metrics import TokenTimer
from .text.tokenizer import TIME_PRECISION, WhisperTokenizer

if TYPE_CHECKING:
    from aural._native import LogitRules

__all__ = [
    "DecodingOptions",
    "DecodingResult",
    "build_logit_rules",
    "compression_ratio",
    "decode_window",
    "detect_language",
    "initial_tokens",
    "is_looping",
    "repeated_segments",
    "REPEATED_SEGMENTS",
    "too_repetitive",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodingOptions:
    """How to decode one window.

    Attributes:
        temperature: 0 for greedy (argmax); above 0, sample from softmax(logits / temperature).
        sample_len: most tokens to sample; None means n_text_ctx // 2 (ref: openai-whisper
            decoding.py DecodingTask.sample_len).
        language: language code for multilingual models (None keeps the tokenizer's).
        task: "transcribe" or "translate" (multilingual models only).
        prompt: previous text (str) or tokens, fed after <|startofprev|> to condition the window.
        prefix: text or tokens forced at the start of this window's output.
        suppress_blank: forbid a blank (space or end of text) as the first sampled token.
        suppress_tokens: ids to forbid at every step, comma-separated or a list; "-1" means the
            non-speech symbols; None or "" disables the filter.
        without_timestamps: add <|notimestamps|> and sample text only.
        max_initial_timestamp: the first timestamp may not be later than this (seconds); None or
            0 lifts the cap.
        seed: seed of the NumPy generator used when temperature > 0 (None: fresh entropy).
        beam_size: at temperature 0, keep this many hypotheses (beam search); None or 1: greedy.
        patience: beam search stops after beam_size * patience finished hypotheses (ref: "Beam
            Decoding with Controlled Patience", Kasai et al. 2022; openai-whisper's default 1.0).
        length_penalty: None ranks finished hypotheses by sum_logprob / length; a value alpha
            uses the Google NMT penalty ((5 + length) / 6) ** alpha (ref: openai-whisper MaximumLikelihoodRanker).
        best_of: above temperature 0, sample this many independent sequences and keep the best.
        draft: tokens greedy decoding at temperature 0 expects to sample (a live stream's last hypothesis of
            the same window): while the sampled tokens follow it, each decoder call also feeds up to
            DRAFT_TOKENS of its next tokens and so checks them in one call. The result is the one without it
            (up to rounding, see _Draft); only the number of decoder calls changes.
    """

    temperature: float = 0.0
    sample_len: int | None = None
    language: str | None = None
    task: str = "transcribe"
    prompt: str | Sequence[int] | None = None
    prefix: str | Sequence[int] | None = None
    suppress_blank: bool = True
    suppress_tokens: str | Sequence[int] | None = "-1"
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    seed: int | None = None
    beam_size: int | None = None
    patience: float | None = None
    length_penalty: float | None = None
    best_of: int | None = None
    draft: Sequence[int] | None = None


@dataclass(frozen=True)
class DecodingResult:
    """What one window decoded to.

    Attributes:
        tokens: sampled tokens, timestamps included, without the final <|endoftext|>.
        text: the decoded text of `tokens`, stripped.
        avg_logprob: sum_logprob / (len(tokens) + 1): the +1 counts the end-of-text token (ref:
            openai-whisper decoding.py DecodingTask.run).
        sum_logprob: summed log-probabilities of the sampled tokens under the filtered logits.
        no_speech_prob: probability of the no-speech token at the <|startoftranscript|> position.
        temperature: the temperature used.
        compression_ratio: zlib compression ratio of `text` (high means repetitive).
        language: the language code of the start sequence (None for English-only models).
        timer: per-token native and sampling timings of this decode.
        looped: decoding was cut because the output kept repeating itself (see `is_looping`).
    """

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    avg_logprob: float = float("nan")
    sum_logprob: float = 0.0
    no_speech_prob: float = float("nan")
    temperature: float = 0.0
    compression_ratio: float = float("nan")
    language: str | None = None
    timer: TokenTimer = field(default_factory=TokenTimer)
    looped: bool = False


def compression_ratio(text: str) -> float:
    """UTF-8 length over zlib-compressed length (ref: openai-whisper utils.py compression_ratio)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of a whole row (once per window: no-speech and language probabilities)."""
    x = logits.astype(np.float64)
    top = np.max(x)
    if not np.isfinite(top):
        return np.full(logits.shape, -np.inf)
    shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted)))


# -- logit filters ---------------------------------------------------------------------------------


def build_logit_rules(tokenizer: WhisperTokenizer, options: DecodingOptions, n_vocab: int) -> "LogitRules":
    """The logit filters of `options` for rows of n_vocab logits, applied natively in openai-whisper's
    order (native/logits.h):

    - suppress_blank: the first sampled token is neither a space nor end of text, so that a window never
      opens blank (ref: SuppressBlank).
    - suppress_tokens: those ids are never sampled (ref: SuppressTokens).
    - timestamps (unless without_timestamps): <|notimestamps|> is never sampled; timestamps come in pairs
      (after a lone one only a timestamp or end of text, after a pair only text), never decrease, and a
      segment after a pair is longer than zero; the first token is a timestamp no later than
      max_initial_timestamp; when the timestamps together are likelier than the best text token, a
      timestamp is sampled (ref: ApplyTimestampRules).
    """
    from aural._native import LogitRules

    index = -1
    if not options.without_timestamps and options.max_initial_timestamp:
        index = round(options.max_initial_timestamp / TIME_PRECISION)
    return LogitRules(
        n_vocab=n_vocab,
        blank=[*tokenizer.encode(" "), tokenizer.eot] if options.suppress_blank else [],
        suppressed=list(tokenizer.suppress_tokens(options.suppress_tokens)) if options.suppress_tokens else [],
        timestamps=not options.without_timestamps,
        eot=tokenizer.eot, timestamp_begin=tokenizer.timestamp_begin, no_timestamps=tokenizer.no_timestamps,
        max_initial_timestamp=index,
    )


# -- the prompt ------------------------------------------------------------------------------------


def _as_tokens(tokenizer: WhisperTokenizer, value: str | Sequence[int]) -> list[int]:
    # Text prompts get a leading space, as a continuation of running text would have.
    if isinstance(value, str):
        return tokenizer.encode(" " + value.strip())
    return [int(t) for t in value]


def initial_tokens(tokenizer: WhisperTokenizer, options: DecodingOptions, n_text_ctx: int) -> list[int]:
    """[<|startofprev|>, last n_text_ctx//2 - 1 prompt tokens] + start sequence (+ <|notimestamps|>)
    + prefix (ref: openai-whisper decoding.py DecodingTask._get_initial_tokens).

    The prefix keeps its last n_text_ctx//2 - 1 tokens so that half the context stays for sampling.
    """
    sot = tokenizer.sot_sequence_including_notimestamps if options.without_timestamps else tokenizer.sot_sequence
    tokens = list(sot)
    if options.prefix:
        tokens += _as_tokens(tokenizer, options.prefix)[-(n_text_ctx // 2 - 1):]
    if options.prompt:
        prompt = _as_tokens(tokenizer, options.prompt)[-(n_text_ctx // 2 - 1):]
        tokens = [tokenizer.sot_prev, *prompt, *tokens]
    return tokens


# -- sampling --------------------------------------------------------------------------------------


class _Sampler:
    """Greedy at temperature 0; otherwise a draw from softmax(logits / T) by the Gumbel-max trick,
    which equals a categorical draw and needs no normalisation."""

    def __init__(self, temperature: float, seed: int | None):
        self.temperature = temperature
        self.rng = np.random.default_rng(seed) if temperature > 0 else None

    def pick(self, logits: np.ndarray) -> int:
        if self.rng is None:
            return int(np.argmax(logits))
        noise = self.rng.gumbel(size=logits.shape[0])
        return int(np.argmax(logits.astype(np.float64) / self.temperature + noise))


def _top_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Native top-k log-softmax (native/logits.h) of (n_vocab,) or (n, n_vocab) filtered logits: ids,
    log-probabilities (f32 exponentials summed in f64 blocks, within ~2.4e-6 of the exact value) and the
    log normaliser. Imported here so that the pure-Python parts of the engine load without the build."""
    from aural._native import top_logprobs

    return top_logprobs(logits, k)


def _step(row: np.ndarray, sampled: list[int], rules: "LogitRules", sampler: _Sampler) -> tuple[int, float]:
    """Filters one step's logits, picks the token, returns it with its log-probability under the
    filtered, untempered logits (ref: openai-whisper decoding.py GreedyDecoder.update). At temperature 0
    the pick is the top-1 of the native pass (ties to the lower id, as np.argmax)."""
    if sampler.rng is None:
        ids, logprobs, _ = rules.top_logprobs(row[None, :], [sampled], 1)
        return int(ids[0, 0]), float(logprobs[0, 0])
    logits = rules.apply(row, sampled)
    token = sampler.pick(logits)
    _, _, log_norm = _top_logprobs(logits, 1)
    return token, float(logits[token]) - float(log_norm)


def _no_speech_prob(row: np.ndarray, tokenizer: WhisperTokenizer) -> float:
    return float(np.exp(_log_softmax(row)[tokenizer.no_speech]))


def _tokenizer_for(tokenizer: WhisperTokenizer, options: DecodingOptions) -> WhisperTokenizer:
    if not tokenizer.multilingual:
        return tokenizer
    language = options.language or tokenizer.language
    if (language, options.task) == (tokenizer.language, tokenizer.task):
        return tokenizer
    return tokenizer.with_options(language=language, task=options.task)


@dataclass
class _Prefill:
    """The window's initial sequence, decoded once: what every decoding strategy starts from."""

    tokenizer: WhisperTokenizer
    rules: "LogitRules"
    row: np.ndarray          # logits after the last initial token, (n_vocab,)
    no_speech_prob: float
    n_past: int              # positions decoded: the next token goes here
    capacity: int            # positions the decoder can hold
    sample_len: int
    timer: TokenTimer


def _prefill(ctx, tokenizer: WhisperTokenizer, options: DecodingOptions, n_text_ctx: int) -> _Prefill:
    """Feeds the whole initial sequence at n_past=0 and asks for logits at the
    <|startoftranscript|> position (no-speech probability) and at the last position."""
    tokenizer = _tokenizer_for(tokenizer, options)
    initial = initial_tokens(tokenizer, options, n_text_ctx)
    timer = TokenTimer()
    sot_index = initial.index(tokenizer.sot)
    rows = sorted({sot_index, len(initial) - 1})
    logits = ctx.decode(np.asarray(initial, dtype=np.int32), 0, rows)
    timer.add_call(ctx.last_timings, prefill=True)
    return _Prefill(
        tokenizer=tokenizer,
        rules=build_logit_rules(tokenizer, options, logits.shape[-1]),
        row=logits[-1],
        no_speech_prob=_no_speech_prob(logits[rows.index(sot_index)], tokenizer),
        n_past=len(initial),
        # Positions past n_text_ctx have no positional embedding; the arena may also be smaller.
        capacity=min(n_text_ctx, int(ctx.stats["kv_capacity_tokens"])),
        sample_len=options.sample_len or n_text_ctx // 2,
        timer=timer,
    )


# A decode stuck repeating a unit of at most this many tokens is cut once the repetition spans
# LOOP_SPAN tokens (and at least LOOP_MIN_REPEATS units): Whisper's "hallucination loops" would
# otherwise run to the end of the text context (ref: faster-whisper and whisper.cpp cut them only
# after the fact, by compression ratio / entropy; cutting early saves the wasted decode steps).
LOOP_MAX_UNIT = 16
LOOP_SPAN = 32
LOOP_MIN_REPEATS = 4


def is_looping(tokens: Sequence[int]) -> bool:
    """Whether `tokens` ends in the same unit of 1..LOOP_MAX_UNIT tokens repeated over LOOP_SPAN tokens."""
    for unit in range(1, LOOP_MAX_UNIT + 1):
        span = max(LOOP_SPAN, unit * LOOP_MIN_REPEATS)
        if len(tokens) < span:
            break
        tail = tokens[-span:]
        if all(tail[i] == tail[i - unit] for i in range(unit, span)):
            return True
    return False


# A decode in which one segment's text follows itself this many times in a row is a repetition loop that
# the compression ratio can miss: on issue #17's noisy 5 min series (tiny.en, greedy, Zen 4) a window wrote
# "It's a good thing to do with the earth." three times running, after twice "... the heart of the earth.",
# over speech that says none of it, at a compression ratio of 2.39 against the 2.4 threshold. Each
# repetition sits between its own timestamps, so is_looping never sees one unit repeat. Speech that says
# one whole sentence three times running is rare; where every temperature repeats it, the most probable
# attempt is kept (transcribe._Run.decode), most often the first, which the check's absence would keep.
REPEATED_SEGMENTS = 3


def repeated_segments(tokens: Sequence[int], timestamp_begin: int) -> int:
    """The longest run of consecutive segments (text tokens between timestamp tokens) that are the same."""
    longest = run = 0
    previous: tuple[int, ...] | None = None
    piece: list[int] = []
    for t in [*tokens, timestamp_begin]:  # a closing timestamp ends the last piece
        if t < timestamp_begin:
            piece.append(t)
            continue
        if piece:
            current = tuple(piece)
            run = run + 1 if current == previous else 1
            longest, previous, piece = max(longest, run), current, []
    return longest


def too_repetitive(result: DecodingResult, timestamp_begin: int, compression_ratio_threshold: float | None,
                   repeated_segments_threshold: int | None) -> bool:
    """Whether `result` is a repetition loop: its text compresses better than compression_ratio_threshold,
    or one segment follows itself repeated_segments_threshold times in a row (None turns a check off)."""
    if compression_ratio_threshold is not None and result.compression_ratio > compression_ratio_threshold:
        return True
    return (repeated_segments_threshold is not None
            and repeated_segments(result.tokens, timestamp_begin) >= repeated_segments_threshold)


def _result(pre: _Prefill, tokens: list[int], sum_logprob: float, options: DecodingOptions,
            looped: bool = False) -> DecodingResult:
    text = pre.tokenizer.decode(tokens).strip()
    return DecodingResult(
        tokens=tokens,
        text=text,
        avg_logprob=sum_logprob / (len(tokens) + 1),
        sum_logprob=sum_logprob,
        no_speech_prob=pre.no_speech_prob,
        temperature=options.temperature,
        compression_ratio=compression_ratio(text),
        language=pre.tokenizer.language,
        timer=pre.timer,
        looped=looped,
    )


def decode_window(ctx, tokenizer: WhisperTokenizer, options: DecodingOptions, n_text_ctx: int, *,
                  stop: threading.Event | None = None) -> DecodingResult:
    """Decodes the window last encoded in `ctx` (a `_native.Context`).

    Greedy or sampled one token per call; with `beam_size` > 1 at temperature 0, beam search; with
    `best_of` > 1 above temperature 0, that many samples side by side (both need a context made with
    n_seq >= that number). Decoding stops at end of text, after `sample_len` tokens, when the next
    token would not fit the text context (ref: openai-whisper decoding.py DecodingTask._main_loop),
    when the output loops (`is_looping`), or when `stop` is set (a cancel: the result is then
    incomplete).
    """
    pre = _prefill(ctx, tokenizer, options, n_text_ctx)
    if options.temperature == 0 and (options.beam_size or 1) > 1:
        return _decode_beams(ctx, pre, options, stop)
    if options.temperature > 0 and (options.best_of or 1) > 1:
        return _decode_best_of(ctx, pre, options, stop)
    return _decode_greedy(ctx, pre, options, stop)


# Draft tokens a greedy decoder call may feed after the token it samples from: one call returns at most 8
# logits rows (native/context.h, context::max_outputs), one after the sampled token and one after each draft
# token.
DRAFT_TOKENS = 7
# Sampled tokens that, found in a row in the draft, pick it up again after a token it did not foresee.
DRAFT_LOOKUP = 2


class _Draft:
    """The tokens greedy decoding expects (DecodingOptions.draft) and the rows the last decoder call
    computed ahead of the sampled tokens: ahead[i] is the decoder's output after the call's draft token i.
    Such a row is used only when that token is the one sampled next, after every earlier one was: then the
    call fed the same tokens at the same positions as calls of one token each would have, and ran the same
    operations row by row (integer products, per-row norms and attention): on the CPU the same bits
    (test_decoding.py; seen at the haswell and sse42 levels). A backend whose float products tile rows
    otherwise rounds within the bound that test checks, and may then flip a near tie, as another CPU level
    may. A row that does not follow the sampled tokens is dropped; the next call writes over the cells its
    token left (kv-cache.h: a sequence forgets its cells at and after its first new position)."""

    def __init__(self, tokens: Sequence[int] | None, timer: TokenTimer):
        self.tokens = [int(t) for t in tokens or []]
        self.timer = timer
        self.ahead: list[tuple[int, np.ndarray]] = []
        self.at = 0  # index in `tokens` of the last guess' first token: later guesses come from after it

    def next_tokens(self, sampled: list[int], room: int) -> list[int]:
        """At most `room` draft tokens to feed after `sampled`: those after it while the draft starts with
        it; else those after the next place, from the last guess on, where the draft has the last
        DRAFT_LOOKUP sampled tokens in a row. So after a token it did not foresee (a timestamp 0.2 s later,
        a word spelt otherwise) the draft is picked up where it goes on as sampled (as prompt lookup
        decoding looks up the last tokens in the prompt, Saxena 2023). Nothing where it has no such place."""
        n, tail = len(sampled), sampled[-DRAFT_LOOKUP:]
        if room <= 0 or not self.tokens:
            return []
        if self.tokens[:n] == sampled:
            start = n
        else:
            ends = (e for e in range(max(self.at, len(tail)), len(self.tokens))
                    if self.tokens[e - len(tail):e] == tail)
            start = next(ends, None)
            if start is None:
                return []
        self.at = start
        return self.tokens[start:start + min(room, DRAFT_TOKENS)]

    def hold(self, tokens: list[int], rows: np.ndarray) -> None:
        self.ahead = list(zip(tokens, rows))
        self.timer.draft_tokens += len(tokens)

    def row_after(self, token: int) -> np.ndarray | None:
        """The row computed ahead after `token`, if the last call fed it next; else None (and the rest go)."""
        if self.ahead and self.ahead[0][0] == token:
            self.timer.draft_accepted += 1
            return self.ahead.pop(0)[1]
        self.ahead = []
        return None


def _feed(ctx, pre: _Prefill, sampled: list[int], draft: _Draft, n_past: int) -> np.ndarray:
    """Feeds the last sampled token at n_past, and after it the draft's next tokens where the draft still
    holds; returns the row after the sampled token."""
    room = min(pre.capacity - n_past - 1, pre.sample_len - len(sampled) - 1)
    guess = draft.next_tokens(sampled, room)
    tokens = np.asarray([sampled[-1], *guess], dtype=np.int32)
    rows = ctx.decode(tokens, n_past, list(range(tokens.size)) if guess else None)
    pre.timer.add_call(ctx.last_timings)
    draft.hold(guess, rows[1:])
    return rows[0]


def _decode_greedy(ctx, pre: _Prefill, options: DecodingOptions, stop: threading.Event | None) -> DecodingResult:
    sampler = _Sampler(options.temperature, options.seed)
    draft = _Draft(options.draft if sampler.rng is None else None, pre.timer)
    row, n_past = pre.row, pre.n_past  # n_past: positions holding the initial and the sampled tokens fed
    sampled: list[int] = []
    sum_logprob = 0.0
    looped = False
    for step in range(pre.sample_len):
        if stop is not None and stop.is_set():
            break
        if step > 0:
            ahead = draft.row_after(sampled[-1])
            if ahead is None and n_past >= pre.capacity:
                logger.debug("text context full after %s tokens", n_past)
                break
            row = ahead if ahead is not None else _feed(ctx, pre, sampled, draft, n_past)
            n_past += 1
        start = time.perf_counter()
        token, logprob = _step(row, sampled, pre.rules, sampler)
        pre.timer.add_sampling(time.perf_counter() - start)
        sum_logprob += logprob
        if token == pre.tokenizer.eot:
            break
        sampled.append(token)
        if is_looping(sampled):
            logger.info("decode stopped: the last %s tokens repeat", LOOP_SPAN)
            looped = True
            break
    return _result(pre, sampled, sum_logprob, options, looped)


def _rank_score(sum_logprob: float, length: int, length_penalty: float | None) -> float:
    """Score of a finished sequence: sum_logprob / length, or the Google NMT length penalty
    ((5 + length) / 6) ** alpha (ref: openai-whisper decoding.py MaximumLikelihoodRanker)."""
    penalty = length if length_penalty is None else ((5 + length) / 6) ** length_penalty
    return sum_logprob / max(penalty, 1e-9)


def _decode_beams(ctx, pre: _Prefill, options: DecodingOptions, stop: threading.Event | None) -> DecodingResult:
    """Beam search with patience (ref: openai-whisper decoding.py BeamSearchDecoder).

    All beams advance together: one decoder call per step feeds one token per beam (sequence j of
    the KV arena), and the survivors' sequences are reordered in the arena, which moves no K/V.
    Every step keeps `beam_size` unfinished beams; a finished hypothesis (end of text) is set aside
    until beam_size * patience of them exist.
    """
    n_beams = int(options.beam_size)
    max_finished = round(n_beams * (options.patience or 1.0))
    if max_finished <= 0:
        raise ValueError("patience must be positive")
    eot = pre.tokenizer.eot
    ctx.reorder([0] * n_beams)  # every beam continues the shared initial sequence
    beams: list[list[int]] = [[]]  # the first step has one distinct beam (its logits row is shared)
    scores = [0.0]
    rows = pre.row[None, :]
    finished: dict[tuple[int, ...], float] = {}
    n_past = pre.n_past
    for _ in range(pre.sample_len):
        if stop is not None and stop.is_set():
            break
        start = time.perf_counter()
        candidates: dict[tuple[int, ...], tuple[float, int]] = {}
        # Each beam's k = beams + 1 best tokens after its filters: one native call for all rows.
        best_ids, best_logprobs, _ = pre.rules.top_logprobs(rows, beams, n_beams + 1)
        for j, prefix in enumerate(beams):
            for token, logprob in zip(best_ids[j].tolist(), best_logprobs[j].tolist()):
                seq = (*prefix, token)
                score = scores[j] + logprob
                if np.isfinite(score) and score > candidates.get(seq, (-np.inf, 0))[0]:
                    candidates[seq] = (score, j)
        kept: list[tuple[tuple[int, ...], float, int]] = []
        for seq, (score, parent) in sorted(candidates.items(), key=lambda kv: kv[1][0], reverse=True):
            if seq[-1] == eot:
                if len(finished) < max_finished:
                    finished[seq[:-1]] = score
            else:
                kept.append((seq, score, parent))
                if len(kept) == n_beams:
                    break
        pre.timer.add_sampling(time.perf_counter() - start)
        if len(finished) >= max_finished or not kept or n_past >= pre.capacity:
            break
        if kept and is_looping(kept[0][0]):
            logger.info("beam search stopped: the best beam repeats itself")
            break
        beams = [list(seq) for seq, _, _ in kept]
        scores = [score for _, score, _ in kept]
        ctx.reorder([parent for _, _, parent in kept])
        tokens = np.asarray([seq[-1] for seq in beams], dtype=np.int32)
        lanes = list(range(len(beams)))
        rows = ctx.decode(tokens, n_past, lanes, lanes)
        pre.timer.add_call(ctx.last_timings)
        n_past += 1
    # Too few finished: the live beams count as finished (ref: BeamSearchDecoder.finalize).
    for seq, score in sorted(zip(beams, scores), key=lambda b: b[1], reverse=True):
        if len(finished) >= n_beams:
            break
        finished.setdefault(tuple(seq), score)
    best = max(finished, key=lambda seq: _rank_score(finished[seq], len(seq), options.length_penalty))
    return _result(pre, list(best), finished[best], options, looped=is_looping(best))


def _decode_best_of(ctx, pre: _Prefill, options: DecodingOptions, stop: threading.Event | None) -> DecodingResult:
    """`best_of` independent samples at the options' temperature, decoded side by side (one decoder
    call per step for all of them), ranked like beam search's finished hypotheses (ref: openai-whisper
    decoding.py: GreedyDecoder over n_group = best_of, MaximumLikelihoodRanker)."""
    n = int(options.best_of)
    eot = pre.tokenizer.eot
    sampler = _Sampler(options.temperature, options.seed)
    ctx.reorder([0] * n)
    samples: list[list[int]] = [[] for _ in range(n)]
    sums = [0.0] * n
    done = [False] * n
    rows = [pre.row] * n
    n_past = pre.n_past
    for _ in range(pre.sample_len):
        if stop is not None and stop.is_set():
            break
        start = time.perf_counter()
        for j in range(n):
            if done[j]:
                continue
            token, logprob = _step(rows[j], samples[j], pre.rules, sampler)
            sums[j] += logprob
            if token == eot or is_looping(samples[j] + [token]):
                done[j] = True
            if token != eot:
                samples[j].append(token)
        pre.timer.add_sampling(time.perf_counter() - start)
        if all(done) or n_past >= pre.capacity:
            break
        # Finished samples keep feeding end of text so that every step has the same batch shape.
        tokens = np.asarray([eot if done[j] else samples[j][-1] for j in range(n)], dtype=np.int32)
        lanes = list(range(n))
        rows = list(ctx.decode(tokens, n_past, lanes, lanes))
        pre.timer.add_call(ctx.last_timings)
        n_past += 1
    best = max(range(n), key=lambda j: _rank_score(sums[j], len(samples[j]), options.length_penalty))
    return _result(pre, samples[best], sums[best], options, looped=is_looping(samples[best]))


def detect_language(ctx, tokenizer: WhisperTokenizer) -> tuple[str, dict[str, float]]:
    """Most probable language of the window last encoded in `ctx`, with every language's probability.

    One decoder step on <|startoftranscript|>, all but the language tokens masked (ref:
    openai-whisper decoding.py detect_language). Raises ValueError for English-only models.
    """
    codes = tokenizer.language_tokens_to_codes
    if not codes:
        raise ValueError("an English-only model cannot detect the language")
    row = ctx.decode(np.asarray([tokenizer.sot], dtype=np.int32), 0)[0]
    ids = np.fromiter(codes, dtype=np.int64)
    probs = np.exp(_log_softmax(row[ids]))
    by_code = {codes[int(t)]: float(p) for t, p in zip(ids, probs)}
    best = max(by_code, key=by_code.get)
    logger.info("detected language %s (p=%.2f)", best, by_code[best])
    return best, by_code
