"""Live captions from a growing audio window, confirmed by LocalAgreement-2 or by where the decoder attends.

Every `step_s` of new audio the window (from the last trim point to now) is encoded and decoded again,
prompted with the committed text that has scrolled out of it. Words on which the last two hypotheses
agree (after the words already committed) are committed: LocalAgreement-2, Macháček, Dabre and Bojar
2023, "Turning Whisper into Real-Time Transcription System" (ufal/whisper_streaming). Once the window
is longer than `trim_s` it is cut where everything before is committed: at the end of a closed Whisper
segment, or at a VAD pause the commits have passed (tiny models often put a whole window in one
segment). The whole tentative tail is committed on a pause of `min_silence_commit_s` and when the
stream ends. A Silero VAD gate keeps silence and noise away from the decoder.

One native `Context` serves the whole stream: its KV arena, cross K/V and decoder graphs are reused by
every step. With `audio_ctx="auto"` the encoder sees only the window plus a few seconds of zero
padding, rounded up to a bucket, instead of the 30 s Whisper was trained on (ref: whisper.cpp's `audio_ctx`):
the encoder is the dominant per-step cost and shrinks with the window (tiny.en, one CPU thread, idle
2-core VM: ~1.8 s for 3000 mel frames, ~0.5 s for 1000, ~0.1 s for 200; the encoder table of
bench/results/latency.md, taken under load, keeps those proportions). Too little padding after the
speech makes Whisper loop on short windows (see `audio_ctx_pad_s`); a hypothesis segment that starts
where the audio ends is dropped, and every word still needs two hypotheses to agree before it is
committed. The decode grows with the window's text.

`policy="alignatt"` commits from one hypothesis instead (AlignAtt: Papi et al. 2023; with Whisper,
Simul-Whisper, Wang et al. 2024, and SimulStreaming, Macháček and Polák 2025): the hypothesis' text is
teacher-forced once more through the alignment heads (alignment.token_positions), and its words up to the
first token whose most attended encoder position lies in the window's last `alignatt_frames` positions are
committed: the decoder wrote them from audio it has heard to the end. The rest stays tentative. It waits
for no second hypothesis, at the cost of one teacher-forced pass per step.

Word times are estimates: each Whisper segment's time span is spread over its words by character count.
Scripts written without spaces (Chinese, Japanese) are agreed on and committed character by character:
a word of space-separated text would be a whole sentence there, which two hypotheses rarely repeat
exactly, so nothing would commit until a pause.

With a multilingual model and no fixed language, each utterance (the speech after a window reset) gets
its own language: detected on every decode until the utterance holds `language_lock_s` of speech, then
kept until the next reset (ref: openai-whisper decoding.py detect_language, on the window's encoding).
Chinese is written in one script (`StreamOptions.zh_script`, the user's locale by default), as file
transcription writes it, so partials do not switch script from step to step.

A device that fails mid-stream (lost, out of memory) hands the stream to the CPU
(`runtime.FallbackSession`): the step in progress is decoded again there, nothing committed is lost,
and a `DeviceFallback` event says so before the step's Partial.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections import deque
from itertools import accumulate
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence, Union

import numpy as np

from ..alignment import token_positions
from ..decoding import (REPEATED_SEGMENTS, DecodingOptions, DecodingResult, decode_window, detect_language,
                        too_repetitive)
from ..errors import AuralError
from ..features import AUDIO_CTX_MODES, HOP_LENGTH, N_SAMPLES, context_frames, window_mel
from ..metrics import TokenTimer, peak_rss_mb
from ..runtime import MAX_SEQUENCES, DeviceFallback, FallbackSession, WhisperModel
from ..text.chinese import UNSPACED_CHARS, default_script, to_script
from ..text.tokenizer import TIME_PRECISION, WhisperTokenizer
from ..vad.gate import FRAME_SAMPLES, SpeechGate, VadOptions

__all__ = ["FLAG_FIELDS", "Partial", "Commit", "Metrics", "Error", "DeviceFallback", "Event", "StreamOptions",
           "event_dict", "flagged_options", "live_events", "source_events"]

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000
POLICIES = ("local-agreement", "alignatt")  # StreamOptions.policy
# Most tokens one step may sample: 10 per second of window plus 16. Fast English speech is about 4-5
# words/s, ~1.3 BPE tokens per word, plus a timestamp pair per segment; a repetition loop would
# otherwise run to openai-whisper's 224-token sample_len (~4 s of decoding on one CPU thread) before
# its compression ratio rejects it.
_TOKENS_PER_S = 10.0
_TOKENS_SLACK = 16
# Committed words no decode reads again are dropped once there are this many (see _forget_old_words): a few
# minutes of speech, so that the list's copy is rare.
_FORGET_AFTER = 512


# -- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partial:
    """The tentative text after the last commit; the next step may change it.

    Attributes:
        text: the unconfirmed words ("" when everything decoded is committed).
        audio_end_s: seconds of input consumed when this hypothesis was decoded.
        language: the language it was decoded in (detected or fixed; None for English-only models).
        spaced: whether a space separates it from the committed text before it.
    """

    text: str
    audio_end_s: float
    language: str | None = None
    spaced: bool = True


@dataclass(frozen=True)
class Commit:
    """Text that is final: later steps never change or repeat it.

    Attributes:
        text: the committed words with Whisper's punctuation, space-separated where the language
            separates words (no spaces between Chinese or Japanese characters).
        start: estimated start of the first word, seconds from the start of the input.
        end: estimated end of the last word.
        language: the language it was decoded in (None for English-only models).
        spaced: whether a space separates it from the text committed before it.
    """

    text: str
    start: float
    end: float
    language: str | None = None
    spaced: bool = True


@dataclass(frozen=True)
class Metrics:
    """Costs after one decode step (and a last one when the stream ends).

    Attributes:
        audio_s: seconds of input consumed.
        window_s: length of the window decoded.
        n_steps: decode steps so far.
        step_ms: wall time of this step (mel, encoder, decoder, agreement).
        rtf: processing time over audio advanced, across the last `StreamOptions.rtf_steps` steps.
        rtf_mean: the same over the whole stream so far.
        encoder_ms: native encoder time of this step.
        n_tokens: decoder calls of this step (one per token; the prompt batch counts once, and so does a call
            that also fed draft tokens: see draft_accepted).
        decode_ms_per_token: decoder wall per token the calls gave (n_tokens + draft_accepted): compute +
            KV/IO + logits read-back + sampling.
        compute_ms_per_token: native graph compute per token, as above.
        kv_io_ms_per_token: host<->device KV traffic per token (0 with the KV arena on the device).
        kv_tokens: KV arena cells in use after this step.
        kv_capacity_tokens: tokens one sequence can hold (the model's text context, 448 for Whisper).
        kv_mib: MiB of KV those cells occupy; with `kv_paged`, of the pool blocks the session holds.
        kv_capacity_mib: MiB of the session's whole arena, reserved at load; with `kv_paged`, of the pool
            the model's sessions share (`WhisperModel.use_kv_pool`).
        kv_paged: whether the session's self-attention K/V live in the shared pool's blocks.
        kv_pool_used_mib: with `kv_paged`, MiB of the pool's blocks all its sessions hold; 0 otherwise.
        graph_builds: decoder graphs built over the stream.
        graph_reuses: decoder graphs reused over the stream.
        first_partial_s: wall seconds from reading the first speech to the first non-empty Partial.
        commit_lag_s: how long the latest commit's first word waited: input consumed when it was committed
            minus that word's end, seconds of audio. It does not grow through silence, when nothing waits.
        dropped_blocks: audio blocks the source lost.
        dropped_by_input: of a mix, each input's share of dropped_blocks in the mix's order; () otherwise.
        rewrites: tentative words shown and then replaced or dropped so far, word by word in place (a word
            committed differently from how it was shown counts too); appended words are not rewrites.
        backend: the model's primary ggml backend.
        device: the device it runs on.
        kv_mode: "device" or "host".
        fallback_ops: ops the primary backend could not run (scheduled elsewhere).
        peak_rss_mb: peak resident memory of the process.
        draft_tokens: tokens of the previous hypothesis this step's calls fed ahead (DecodingOptions.draft).
        draft_accepted: those the step sampled: each saved a decoder call.
    """

    audio_s: float
    window_s: float
    n_steps: int
    step_ms: float
    rtf: float
    rtf_mean: float
    encoder_ms: float
    n_tokens: int
    decode_ms_per_token: float
    compute_ms_per_token: float
    kv_io_ms_per_token: float
    kv_tokens: int
    kv_capacity_tokens: int
    kv_mib: float
    kv_capacity_mib: float
    graph_builds: int
    graph_reuses: int
    first_partial_s: float | None
    commit_lag_s: float | None
    dropped_blocks: int
    rewrites: int
    backend: str
    device: str
    kv_mode: str
    fallback_ops: tuple[str, ...] = ()
    peak_rss_mb: float = 0.0
    dropped_by_input: tuple[int, ...] = ()
    kv_paged: bool = False
    kv_pool_used_mib: float = 0.0
    draft_tokens: int = 0
    draft_accepted: int = 0

    @property
    def tokens_given(self) -> int:
        """Tokens this step's decoder calls gave, which the per-token figures are per: one a call, and each
        draft token kept."""
        return self.n_tokens + self.draft_accepted

    @property
    def kv_held_mib(self) -> float:
        """MiB of KV memory the session keeps from others: its pool blocks, or its whole own arena."""
        return self.kv_mib if self.kv_paged else self.kv_capacity_mib


@dataclass(frozen=True)
class Error:
    """A problem that ended or interrupted the stream (e.g. the microphone vanished).

    Attributes:
        message: one line for the user.
    """

    message: str


Event = Union[Partial, Commit, Metrics, Error, DeviceFallback]

_EVENT_TYPES = {Partial: "partial", Commit: "commit", Metrics: "metrics", Error: "error", DeviceFallback: "fallback"}


def event_dict(event: Event) -> dict:
    """The event as a JSON-ready dict: {"type": "partial" | "commit" | "metrics" | "error" | "fallback",
    ...fields}."""
    return {"type": _EVENT_TYPES[type(event)], **asdict(event)}


# -- options ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOptions:
    """How the live stream decodes and commits.

    Attributes:
        step_s: new audio between two decodes (0.5-1.0 s: shorter gives earlier partials, costs an
            encoder run each).
        max_step_s: most new audio one step takes in when the engine falls behind real time.
        trim_s: once the window is longer than this, cut it where everything before is committed
            (ref: whisper_streaming's buffer_trimming_sec, 15 s).
        max_window_s: longest window; past it the completed segments are committed unconfirmed and
            cut, so the window stays well under Whisper's 30 s.
        stall_s: a hypothesis that writes no uncommitted word (or is rejected) stalls the window, which is
            then cut at once (see _Stream._trim), only where at least this much audio after the last
            committed word went unwritten. At 0.5 s steps a step often ends inside a word the decoder does
            not write yet: cut there, the next windows held 0.3-2 s of audio, and tiny.en looped on them
            ("Four of Clopes. Four of Clopes. ..."), its hypotheses were rejected, which stalled and cut the
            window again, and the words were lost. Streaming WER on the widened sets (Zen 3, 1 thread,
            stream-accuracy-stall-zen3.md): 0.5 s steps 12.90 % against 13.83 % (475 against 509 errors), 1 s
            steps 11.60 against 11.65 % (427 against 429). 0: every such hypothesis stalls the window.
        min_silence_commit_s: a pause of this long (VAD) commits the tentative tail. With `pause_step`,
            0.5 s makes the last words final 0.41 s after they are spoken (p50; p90 0.65 s) against 1.12 s
            (p90 2.18 s) for 2 s without it, on the 18 dev clips at real-time pace (bench/results/
            latency-fast-doubles.md, latency-default-doubles.md, Zen 4, 1 thread). Streaming WER on the
            widened sets (3681 words; stream-accuracy-doubles.md): 12.36 % against 12.47 %. Before
            `doubled_run_words` it was 14.07 % against 12.55 %: most of the difference was sentences
            written twice and committed at the short pause.
        pause_step: decode as soon as the speech gate closes after new speech, not only after `step_s`
            of new audio: the words before a pause show sooner and are final sooner.
        min_silence_reset_s: after a pause this long the window restarts at the silence (the text
            before it becomes the prompt).
        min_speech_s: speech (VAD) needed in the window before it is decoded at all.
        preroll_s: audio kept before the speech onset, so the first word is not clipped.
        prompt_chars: most characters of scrolled-out committed text fed as the prompt (ref:
            whisper_streaming OnlineASRProcessor.prompt, 200).
        prompt_timestamps: the prompt's sentences between timestamp tokens, as Whisper's prompts from its
            previous windows are (openai-whisper), instead of bare text (whisper_streaming's). Prompted with
            bare text, tiny.en writes no timestamp after the first cut, and once copied the prompt again at
            a window's end (the sonnet); with timestamps it closes its segments. It still lost words: streamed
            WER 12.33 against 11.93 % on the widened sets, 17.77 against 16.95 % under the seven noises
            (stream-accuracy-prompt-ts-zen3.md, stream-accuracy-noise-prompt-ts-zen3.md; Zen 3, 1 thread),
            so it is off.
        language: language code for multilingual models; None detects it for each utterance.
        language_lock_s: speech in an utterance after which its detected language is kept.
        zh_script: "hans" or "hant" for Chinese text (None: the user's locale, chinese.default_script).
        no_speech_threshold: a hypothesis with a higher no-speech probability and an average
            log-probability under `logprob_threshold` counts as silence (ref: openai-whisper).
        logprob_threshold: see `no_speech_threshold`.
        compression_ratio_threshold: a hypothesis compressing better than this is a repetition
            loop and is discarded (ref: openai-whisper, 2.4).
        repeated_segments_threshold: a hypothesis in which one segment follows itself this many
            times in a row is a repetition loop too (decoding.REPEATED_SEGMENTS); None: not checked.
        repeated_words_threshold: a hypothesis in which a run of two or more words follows itself this
            many times in a row is a loop too, inside one segment as well ("he could wait no longer. he
            could wait no longer. ..."; tiny.en wrote five of it into one segment at a pause commit and
            the speech after it was lost); None: not checked.
        doubled_run_words: where a run of at least this many words follows itself at once in a
            hypothesis, the second copy is dropped. Whisper says a sentence twice where it was said once
            ("The birch canoe. The birch canoe."), and a pause commit or two hypotheses that agree on it
            would commit both: all 7 hypotheses with such a double of 3+ words in the widened sets'
            streams with the former defaults, and the one committed, were of that kind. A speaker who
            does repeat three words at once ("let it be, let it be") loses one copy. Streaming WER on the
            widened sets, without and with it: 12.55 and 12.47 % (2 s pause commit), 14.07 and 12.36 %
            (0.5 s pause commit and pause step), 15.08 and 14.43 % (0.5 s step). A copy may differ from the
            first in one word's ending ("it feels like these days. it feel like these days."; _copies): the
            same 455 errors on those sets (stream-accuracy-near.md). None: kept.
        commit_margin_s: LocalAgreement commits only words that end at least this long before the newest
            audio (two hypotheses a step apart can agree on a guess at words the window's end cuts off); the
            pause commit still makes the whole tail final. 0.5 s: streaming WER on the widened sets 11.87 %
            against 12.36 % (437 against 455 errors; 0.3 s: 442), commit p50 1.33 s against 1.31 s, but the
            last words final 0.61 s after they are spoken (p50) against 0.40 s, over the 0.5 s target: 0 by
            default, a choice of accuracy over speed (stream-accuracy-margin*.md, latency-margin.md; Zen 4, 1
            thread). Sparing the pause step kept the speed and lost the gain (449 errors).
        agree_gap_s: LocalAgreement compares each hypothesis with the newest one decoded at least this much
            audio before it, not with the one before (0). With `step_s` 0.5 and a 1 s gap, partials come
            every 0.5 s while the two hypotheses that must agree are as far apart as with 1 s steps: two
            hypotheses 0.5 s apart see nearly the same audio, so they agree on more guesses (a 0.5 s step
            with the plain rule lost 2 points of streaming WER on the widened sets). Step 0.5 s, gap 1 s
            against the defaults (Sapphire Rapids-class Xeon, 1 thread; latency-gap.md, 18 dev clips at
            real-time pace; stream-accuracy-gap*.md, widened sets): partial p50 0.20 s (0.44), commit 1.21 s
            (1.29), last words final 0.61 s (0.41), 37.8 shown words changed a minute (18.1), stream WER
            12.44 % (12.12; a 1.5 s gap 12.31 %), twice the decodes. 0 (off) by default.
        beam_size: hypotheses each decode keeps (beam search over the session's sequences, as for files);
            1: greedy. 5 against 1, LocalAgreement (Sapphire Rapids-class Xeon, 1 thread): widened-set stream
            WER 11.98 against 12.12 %, commit p50 1.37 against 1.29 s, RTF 0.09 against 0.07
            (stream-accuracy-beam.md, latency-beam.md); offline beam 5 gains 2.5 points on those sets.
        policy: "local-agreement" (a word is committed once two hypotheses in a row agree on it) or
            "alignatt" (once the decoder wrote it attending to audio before the window's last
            `alignatt_frames` encoder positions).
        alignatt_frames: AlignAtt's threshold in encoder positions of 20 ms (SimulStreaming's and
            Simul-Whisper's frame_threshold; 25 = 0.5 s is their default).
        hold_steps: steps a shown tentative word is kept on screen when a new hypothesis changes it; it
            changes once that many hypotheses in a row disagree with it, so a word that flips back and
            forth stays put (0: every partial shows the latest hypothesis as it is).
        draft: a greedy decode of the window the last decode read (same start, language and prompt)
            feeds the last hypothesis' tokens ahead in batches and keeps those it samples (DecodingOptions.
            draft): the same hypothesis in fewer decoder calls. Off only to measure what it saves.
        rtf_steps: steps the running RTF averages over.
        vad: the speech gate's hysteresis.
        audio_ctx: "auto" encodes only the mel frames the window needs (its length plus
            `audio_ctx_pad_s`, rounded up to `audio_ctx_bucket_s`); "full" pads every window to 30 s.
        audio_ctx_pad_s: zero padding after the window's audio in "auto" mode, so the last word is
            followed by silence as in Whisper's training windows. Streamed at speed 0, the 12 English
            dev clips of at most 6 s gave 15.2% WER with 2 s (1-4 s windows fell into repetition
            loops: JFK, goforward) and 5.4% with both 3 and 4 s; 4 s keeps a margin.
        audio_ctx_bucket_s: "auto" context lengths are multiples of this, so the encoder graph,
            rebuilt whenever the length changes, is rebuilt at most once per bucket of window growth
            (a rebuild costs ~3 ms on tiny.en, against ~50 ms of encoder per second of context).
    """

    step_s: float = 1.0
    max_step_s: float = 5.0
    trim_s: float = 12.0
    max_window_s: float = 20.0
    stall_s: float = 1.0
    min_silence_commit_s: float = 0.5
    pause_step: bool = True
    min_silence_reset_s: float = 4.0
    min_speech_s: float = 0.25
    preroll_s: float = 0.3
    prompt_chars: int = 200
    prompt_timestamps: bool = False
    language: str | None = None
    language_lock_s: float = 3.0
    zh_script: str | None = None
    no_speech_threshold: float = 0.6
    logprob_threshold: float = -1.0
    compression_ratio_threshold: float = 2.4
    repeated_segments_threshold: int | None = REPEATED_SEGMENTS
    repeated_words_threshold: int | None = 3
    doubled_run_words: int | None = 3
    commit_margin_s: float = 0.0
    agree_gap_s: float = 0.0
    beam_size: int = 1
    policy: str = "local-agreement"
    alignatt_frames: int = 25
    hold_steps: int = 1
    draft: bool = True
    rtf_steps: int = 10
    vad: VadOptions = field(default_factory=VadOptions)
    audio_ctx: str = "auto"
    audio_ctx_pad_s: float = 4.0
    audio_ctx_bucket_s: float = 1.0

    def __post_init__(self) -> None:
        if self.audio_ctx not in AUDIO_CTX_MODES:
            raise ValueError(f"audio_ctx must be one of {', '.join(AUDIO_CTX_MODES)}, not {self.audio_ctx!r}")
        if self.audio_ctx_pad_s < 0 or not 0 < self.audio_ctx_bucket_s <= N_SAMPLES / SAMPLE_RATE:
            raise ValueError("need audio_ctx_pad_s >= 0 and 0 < audio_ctx_bucket_s <= 30 s, got "
                             f"{self.audio_ctx_pad_s}, {self.audio_ctx_bucket_s}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        if self.alignatt_frames < 0:
            raise ValueError(f"need alignatt_frames >= 0, got {self.alignatt_frames}")
        if self.hold_steps < 0:
            raise ValueError(f"need hold_steps >= 0, got {self.hold_steps}")
        if self.repeated_words_threshold is not None and self.repeated_words_threshold < 2:
            raise ValueError(f"need repeated_words_threshold >= 2 or None, got {self.repeated_words_threshold}")
        if self.stall_s < 0:
            raise ValueError(f"need stall_s >= 0, got {self.stall_s}")
        if self.commit_margin_s < 0:
            raise ValueError(f"need commit_margin_s >= 0, got {self.commit_margin_s}")
        if not 1 <= self.beam_size <= MAX_SEQUENCES:
            raise ValueError(f"need 1 <= beam_size <= {MAX_SEQUENCES}, got {self.beam_size}")
        if not 0 <= self.agree_gap_s <= self.trim_s:
            raise ValueError(f"need 0 <= agree_gap_s <= trim_s, got {self.agree_gap_s}")
        if self.doubled_run_words is not None and self.doubled_run_words < 1:
            raise ValueError(f"need doubled_run_words >= 1 or None, got {self.doubled_run_words}")
        if not 0 < self.min_silence_commit_s <= self.min_silence_reset_s:
            # The window restarts only with its words committed: the pause commit must come first.
            raise ValueError("need 0 < min_silence_commit_s <= min_silence_reset_s, got "
                             f"{self.min_silence_commit_s}, {self.min_silence_reset_s}")
        if not 0 < self.step_s <= self.max_step_s:
            raise ValueError(f"need 0 < step_s <= max_step_s, got {self.step_s}, {self.max_step_s}")
        if not self.trim_s <= self.max_window_s <= N_SAMPLES / SAMPLE_RATE - self.max_step_s:
            raise ValueError("need trim_s <= max_window_s <= 30 s - max_step_s, so that a window never "
                             f"outgrows the encoder; got {self.trim_s}, {self.max_window_s}, {self.max_step_s}")


# The caption flags of `aural live` (and the live WebSocket's query parameters of the same names), by the
# StreamOptions field each sets.
FLAG_FIELDS = {"step": "step_s", "hold": "hold_steps", "policy": "policy", "frames": "alignatt_frames",
               "commit_after": "min_silence_commit_s", "pause_step": "pause_step", "margin": "commit_margin_s",
               "agree_gap": "agree_gap_s", "beam": "beam_size"}


def flagged_options(flags: Mapping[str, Any], **fields: Any) -> StreamOptions:
    """StreamOptions of `fields` and the caption flags in `flags` (FLAG_FIELDS' names); a flag that is absent or
    None keeps StreamOptions' default. ValueError names what is out of range."""
    given = {field: flags[flag] for flag, field in FLAG_FIELDS.items() if flags.get(flag) is not None}
    return StreamOptions(**fields, **given)


# -- hypotheses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Word:
    """A word of a hypothesis, with its estimated span in seconds from the start of the input."""

    text: str
    start: float
    end: float
    spaced: bool = True  # a space separates it from the word before (False inside a run of CJK characters)

    @property
    def key(self) -> str:
        return _key(self.text)


# English number words as Whisper also writes them, in digits: "Ten of clubs" heard again as "10 of clubs" is the
# same words (over a telephone line, 0.5 s steps wrote the cards both ways, and those committed in words were
# taken for new words after a cut and committed again).
_NUMBER_WORDS = {word: str(k) for k, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}


def _key(text: str) -> str:
    # Agreement ignores case and punctuation: "Americans," then "Americans" is the same word.
    key = "".join(c for c in text.lower() if c.isalnum() or c == "'")
    return _NUMBER_WORDS.get(key, key)


@dataclass(frozen=True)
class _Hypothesis:
    """One decode of the window: its words, and where its closed segments end.

    Attributes:
        words: the words in order.
        cuts: (number of words before the cut, time of the cut in input seconds) at each closed segment.
    """

    words: list[_Word]
    cuts: list[tuple[int, float]]


# A unit: one character of an unspaced script (chinese.UNSPACED_CHARS), else a run of other non-space characters.
_UNIT = re.compile(f"[{UNSPACED_CHARS}]|[^\\s{UNSPACED_CHARS}]+")
_UNIT_CJK = re.compile(f"[{UNSPACED_CHARS}]")


def _unspaced(char: str) -> bool:
    return _UNIT_CJK.fullmatch(char) is not None


def _units(text: str) -> list[tuple[str, bool]]:
    """(unit, spaced) pairs of a segment's text: space-separated words, each character of an unspaced
    script its own unit (LocalAgreement then agrees on characters there). No space is kept between two
    such characters: Whisper puts one at some pauses ("广州市 佛地产"), which Chinese text does not have."""
    out: list[tuple[str, bool]] = []
    for piece in text.split():
        for k, unit in enumerate(_UNIT.findall(piece)):
            out.append((unit, k == 0 and not (out and _unspaced(out[-1][0][-1]) and _unspaced(unit[0]))))
    return out


def _repeated_run(keys: Sequence[str], times: int, shortest: int = 2) -> bool:
    """Whether some run of at least `shortest` units follows itself `times` times in a row in `keys`.

    For a run length n, keys[i:i + n] repeats `times` times exactly when keys[j] == keys[j + n] for the
    (times - 1) * n positions j from i on, so one pass per n counts such matches in a row."""
    for n in range(shortest, len(keys) // times + 1):
        in_a_row = 0
        for a, b in zip(keys, keys[n:]):
            in_a_row = in_a_row + 1 if a == b else 0
            if in_a_row >= (times - 1) * n:
                return True
    return False


def _near(a: str, b: str) -> bool:
    """Whether two different words are one word written twice with another ending ("feels" / "feel",
    "day" / "days"): one is the other plus at most two letters, and the shorter has three or more."""
    short, long = sorted((a, b), key=len)
    return len(short) >= 3 and len(long) - len(short) <= 2 and long.startswith(short)


def _copies(keys: Sequence[str], i: int, j: int, n: int) -> bool:
    """Whether keys[j:j + n] repeats keys[i:i + n]; in a run of three or more, one word may be written
    with another ending (_near). Words that differ otherwise make two runs that share a pattern, which
    speech has ("we shall fight on the beaches, we shall fight on the landing grounds"), not a copy."""
    if j + n > len(keys):
        return False
    odd = [(a, b) for a, b in zip(keys[i:i + n], keys[j:j + n]) if a != b]
    return not odd or (n >= 3 and len(odd) == 1 and _near(*odd[0]))


def _doubled_runs(keys: Sequence[str], shortest: int) -> list[range]:
    """Indices of the second copies to drop where a run of at least `shortest` units follows itself
    at once ("he could wait no longer. he could wait no longer.", also "it feels like these days. it
    feel like these days."; see _copies), scanning left to right, longest run first at each position; a
    run said three times loses both later copies."""
    drop: list[range] = []
    i = 0
    while i < len(keys):
        # Two copies that differ in one word at most agree on their first or their second word: a cheap
        # test that skips most (i, n) before _copies compares whole runs.
        n = next((n for n in range((len(keys) - i) // 2, shortest - 1, -1)
                  if (keys[i] == keys[i + n] or (n > 1 and keys[i + 1] == keys[i + n + 1]))
                  and _copies(keys, i, i + n, n)), 0)
        if not n:
            i += 1
            continue
        copies = 1
        while _copies(keys, i, i + (copies + 1) * n, n):
            copies += 1
        drop.append(range(i + n, i + (copies + 1) * n))
        i += (copies + 1) * n
    return drop


def _without_doubles(hyp: _Hypothesis, shortest: int) -> _Hypothesis:
    """The hypothesis with the second copy of each doubled run of words removed (see _doubled_runs).
    A segment end inside or at the end of a removed copy is dropped, since the audio before it may be
    what the copy stood in for; the others count the words that remain. Chinese and Japanese units are
    characters, about two to a word, so there a run needs twice as many."""
    if 2 * sum(w.spaced for w in hyp.words) < len(hyp.words):
        shortest *= 2
    drop = _doubled_runs([w.key for w in hyp.words], shortest)
    if not drop:
        return hyp
    gone = set().union(*drop)
    words = [w for k, w in enumerate(hyp.words) if k not in gone]
    cuts = [(n - sum(1 for k in gone if k < n), t) for n, t in hyp.cuts
            if not any(r.start < n <= r.stop for r in drop)]
    return _Hypothesis(words, cuts)


def _join(words: Sequence[_Word]) -> str:
    return "".join((" " if k and w.spaced else "") + w.text for k, w in enumerate(words))


# Whisper closes segments at sentence ends; the prompt's segments end there too.
_SENTENCE_END = re.compile("[.?!。？！]$")
_WINDOW_S = N_SAMPLES / SAMPLE_RATE


def _prompt_tokens(words: Sequence[_Word], tokenizer: WhisperTokenizer, timestamps: bool) -> list[int]:
    """Prompt tokens for committed `words`: their text, with `timestamps` laid out as Whisper's own prompts
    are, the previous windows' tokens as decoded (ref: openai-whisper transcribe.py, all_tokens): each
    sentence between two timestamp tokens, times from the words' estimates, counted from the first word
    and again from a later sentence where 30 s would be passed (a new window)."""
    if not words:
        return []
    if not timestamps:
        return tokenizer.encode(" " + _join(words).strip())
    sentences, begin = [], 0
    for k, word in enumerate(words):
        if _SENTENCE_END.search(word.text) or k == len(words) - 1:
            sentences.append(words[begin:k + 1])
            begin = k + 1
    def stamp(seconds: float) -> int:  # a timestamp token, within the window's 30 s
        return tokenizer.timestamp_begin + min(round(seconds / TIME_PRECISION), round(_WINDOW_S / TIME_PRECISION))

    tokens: list[int] = []
    base = words[0].start
    for sentence in sentences:
        if sentence[-1].end - base > _WINDOW_S:
            base = sentence[0].start
        start = sentence[0].start - base
        text = (" " if sentence[0].spaced else "") + _join(sentence)
        tokens += [stamp(start), *tokenizer.encode(text), stamp(max(start, sentence[-1].end - base))]
    return tokens


def _spread(units: list[tuple[str, bool]], start: float, end: float) -> list[_Word]:
    """Words of one segment with times interpolated by character count inside [start, end]."""
    lengths = [len(t) for t, _ in units]
    edges = np.concatenate([[0], np.cumsum(lengths)]) / max(1, sum(lengths))
    times = start + (end - start) * edges
    return [_Word(t, float(times[i]), float(times[i + 1]), spaced) for i, (t, spaced) in enumerate(units)]


def _parse(tokens: Sequence[int], tokenizer: WhisperTokenizer, offset_s: float, window_s: float,
           script: str | None = None) -> _Hypothesis:
    """Splits timestamped tokens into words; an unclosed last segment runs to the window's end.

    A segment that opens at the end of the audio or later is dropped with all that follows: there is
    nothing left to hear, so it can only be a repetition of earlier text, which a short encoder context
    invites (seen on 1-4 s windows with 1 s of padding: "And so my fellow Americans." again at 2.00 s).
    `script` converts Chinese text to that script ("hans", "hant") before it is cut into units.
    """

    def units(ids: list[int]) -> list[tuple[str, bool]]:
        text = tokenizer.decode(ids)
        return _units(to_script(text, script) if script else text)

    words: list[_Word] = []
    cuts: list[tuple[int, float]] = []
    start, text = 0.0, []
    for token in tokens:
        if token < tokenizer.timestamp_begin:
            text.append(token)
            continue
        # Whisper may stamp past the audio it was given (the window is padded to 30 s).
        stamp = min((token - tokenizer.timestamp_begin) * TIME_PRECISION, window_s)
        if text:
            words += _spread(units(text), offset_s + start, offset_s + stamp)
            cuts.append((len(words), offset_s + stamp))
            text = []
        elif stamp >= window_s - TIME_PRECISION:
            break
        start = stamp
    if text:
        words += _spread(units(text), offset_s + start, offset_s + window_s)
    return _Hypothesis(words, cuts)


def _prefix_distances(a: str, b: str) -> np.ndarray:
    """Levenshtein distance from `a` to every prefix b[:j], j = 0..len(b), one DP row per char of `a`.

    The insertion step row[j] = min(row[j - 1] + 1, x[j]) is a running minimum of x[j] - j, plus j.
    """
    idx = np.arange(len(b) + 1)
    codes = np.array([ord(c) for c in b], dtype=np.int64)
    row = idx.copy()
    for i, char in enumerate(a, 1):
        best = np.empty_like(row)
        best[0] = i
        best[1:] = np.minimum(row[:-1] + (codes != ord(char)), row[1:] + 1)
        row = np.minimum.accumulate(best - idx) + idx
    return row


# Most character edits, per committed character, between committed words and the closest prefix of a hypothesis
# taken to repeat them (_closest_prefix): the committed words left in a window just cut, the words heard before
# a pause.
_SKIP_MAX_EDITS = 0.5


def _closest_prefix(committed: Sequence[_Word], words: Sequence[_Word]) -> tuple[int, bool]:
    """(k, close): words[:k] is the prefix of `words` closest, in characters, to the `committed` words (ties go
    to the word count nearest theirs); close: it differs in at most _SKIP_MAX_EDITS of their characters."""
    keys = [w.key for w in words]
    text = "".join(w.key for w in committed)
    distances = _prefix_distances(text, "".join(keys))
    ends = [0, *accumulate(len(k) for k in keys)]
    best = min(range(len(ends)), key=lambda k: (distances[ends[k]], abs(k - len(committed))))
    return best, distances[ends[best]] <= _SKIP_MAX_EDITS * len(text)


def _skip_committed(committed: Sequence[_Word], words: Sequence[_Word], *, strict: bool = False) -> int:
    """How many leading words of a new hypothesis repeat the committed words still in the window.

    The new hypothesis starts at the same audio as those words, so it normally repeats them, but it
    may hear them differently ("stuff it" then "stuffed"). The split is the word boundary whose
    prefix is closest, in characters, to the committed text, so a changed word neither repeats nor
    swallows the next one.

    strict (the first hypothesis after a cut): a closest prefix that differs in most of their characters is not
    the committed words heard again; Whisper left them out (the 5 minute series over a telephone line went on
    from the sentence after them), and skipping it would drop as many new words ("it was the first great").
    Not later in a window: where its committed words hold a mistake no hypothesis repeats them closely, and
    taking each for new words committed them again and again (noisy 5 minute series: 112 -> 467 errors).
    """
    if not committed:
        return 0
    best, close = _closest_prefix(committed, words)
    return 0 if strict and not close else best


def _newer_tail(old: list[_Word], new: list[_Word]) -> list[_Word]:
    """The tentative words after a decode: the new hypothesis' own, unless it has none where the last one
    had some. Whisper can end a window's text early: base, given a committed Mandarin sentence and the one
    after it, wrote the first alone for steps on end, and dropping the second's tail then lost it for
    good (issue #24, the live run through the microphone on a loaded machine). Words it changes are
    still replaced."""
    return new or old


def _agreement(previous: Sequence[_Word], current: Sequence[_Word]) -> int:
    """Length of the longest common prefix of two tentative tails (LocalAgreement-2)."""
    n = 0
    for a, b in zip(previous, current):
        if a.key != b.key:
            break
        n += 1
    return n


class _Display:
    """The tentative words on screen, steadier than the hypotheses behind them, and how often they change.

    Each partial shows the latest hypothesis' uncommitted words, except that where it changes or drops
    words already shown, those stay for `hold_steps` more steps (new words after them still appear). Commits
    are never held: they come from the hypotheses, and a shown word committed differently is a rewrite.
    """

    def __init__(self, hold_steps: int):
        self.hold_steps = hold_steps
        self.shown: list[_Word] = []
        self.held = 0  # steps the shown words have outlived a disagreeing hypothesis
        self.rewrites = 0

    def update(self, committed: Sequence[_Word], tail: list[_Word]) -> list[_Word]:
        """The words to show after `committed` (committed since the last update) with `tail` tentative."""
        leaving = self.shown[:len(committed)]
        self.rewrites += sum(a.key != b.key for a, b in zip(leaving, committed))
        shown = self.shown[len(leaving):]
        # Word by word, as a viewer sees the line change: replaced words and dropped ones.
        changed = sum(a.key != b.key for a, b in zip(shown, tail)) + max(0, len(shown) - len(tail))
        if changed and self.held < self.hold_steps:
            self.held += 1
            self.shown = shown + tail[len(shown):]
            return self.shown
        self.rewrites += changed
        self.held = 0
        self.shown = list(tail)
        return self.shown


def _context_frames(n_samples: int, options: StreamOptions) -> int:
    """Mel frames to encode for a window of `n_samples`: all 3000 in "full" mode, else the window
    plus the padding, rounded up to the bucket."""
    return context_frames(n_samples, options.audio_ctx, pad_s=options.audio_ctx_pad_s,
                          bucket_s=options.audio_ctx_bucket_s)


# -- the stream ------------------------------------------------------------------------------------


class _Stream:
    """The window, the VAD gate, the committed words and the running costs of one live stream."""

    def __init__(self, model: WhisperModel, options: StreamOptions, kv_mode: str):
        self.model = model
        self.options = options
        self.kv_mode = kv_mode
        self.fallbacks: list[DeviceFallback] = []  # not yet reported
        self.session = FallbackSession(model, self.fallbacks.append, kv_mode=kv_mode, n_seq=options.beam_size)
        self.gate = SpeechGate(options.vad)
        self.audio = np.zeros(0, dtype=np.float32)  # the window
        self.window_start = 0  # input sample index of audio[0]
        self.total = 0  # input samples consumed
        self.decoded_upto = 0  # input sample index of the window's end at the last decode
        self.speech_samples = 0  # VAD speech in the window since it was last reset
        self.fresh_speech = False  # VAD speech fed since the last decode
        self.silence_from: int | None = 0  # input sample index where the gate last closed
        self.committed: list[_Word] = []
        self.in_window = 0  # the last `in_window` committed words lie inside the window
        self.cut_pending = False  # the window was cut and no hypothesis with words has been decoded from it since
        self.tail: list[_Word] = []  # the previous hypothesis' uncommitted words
        # With agree_gap_s: (input samples decoded, words) of the hypotheses since the window last changed,
        # newest last; the newest at least the gap older than a new one is what that one must agree with.
        self.earlier: deque[tuple[int, list[_Word]]] = deque()
        self.display = _Display(options.hold_steps)
        self.n_displayed = 0  # committed words the display has seen leave the tentative text
        # (input sample where a pause began, index in `committed` of the window's first word then,
        # the words heard before the pause)
        self.pauses: list[tuple[int, int, list[_Word]]] = []
        self.costs: deque[tuple[float, float]] = deque(maxlen=options.rtf_steps)  # (busy s, audio s)
        self.busy_s = 0.0
        self.reported_audio_s = 0.0
        self.n_steps = 0
        self.language = options.language  # of the current utterance; None until detected
        self.prompt_from = 0  # committed words before this index never prompt (another language's)
        self._committed_language = self.language  # the language of the last commit
        # A multilingual model with no fixed language detects it per utterance.
        self.detects_language = options.language is None and model.tokenizer.multilingual
        self.language_locked = not self.detects_language
        self.onset_read_at: float | None = None
        self.first_partial_s: float | None = None
        self.commit_lag_s: float | None = None  # of the latest commit (see Metrics)
        self.dropped_blocks = 0
        self.dropped_by_input: tuple[int, ...] = ()
        # ((window start, language, prompt), tokens) of the last decode: the next decode of the same window
        # with the same start sequence checks those tokens in batches (DecodingOptions.draft).
        self.last_decode: tuple[tuple, list[int]] | None = None

    @property
    def ctx(self):
        """The native session in use: the device's, or the CPU's after a fallback."""
        return self.session.ctx

    # -- input --

    def feed(self, samples: np.ndarray) -> None:
        """Appends new input to the window and runs it through the VAD gate."""
        self.audio = np.concatenate([self.audio, samples])
        self.total += samples.size
        for frame in self.gate.process(samples):
            if frame.speech:
                self.speech_samples += FRAME_SAMPLES
                self.fresh_speech = True
                self.silence_from = None
                if self.onset_read_at is None:
                    self.onset_read_at = time.monotonic()
            elif self.silence_from is None:
                self.silence_from = frame.start
        if self.speech_samples == 0:
            self._cut(max(self.window_start, self.total - round(self.options.preroll_s * SAMPLE_RATE)))

    def _active(self) -> bool:
        return self.speech_samples >= self.options.min_speech_s * SAMPLE_RATE

    def _silent_for(self, seconds: float) -> bool:
        return self.silence_from is not None and self.total - self.silence_from >= seconds * SAMPLE_RATE

    # -- steps --

    def poll(self) -> Iterator[Event]:
        """Whatever is due after new input: a pause commit, a window reset, a decode step, or nothing."""
        o = self.options
        if self._silent_for(o.min_silence_commit_s) and (self.tail or (self.fresh_speech and self._active())):
            yield from self.flush()
        elif self._silent_for(o.min_silence_reset_s) and self.speech_samples:
            self._reset_window()
        elif self._active() and self.fresh_speech and (self.total - self.decoded_upto >= o.step_s * SAMPLE_RATE
                                                       or (o.pause_step and self.silence_from is not None)):
            yield from self._step()

    def _step(self) -> Iterator[Event]:
        started = time.perf_counter()
        hyp, result = self._decode()
        done = _skip_committed(self._committed_in_window(), hyp.words, strict=self.cut_pending)
        self.cut_pending = self.cut_pending and not hyp.words
        tail = hyp.words[done:]
        if self.options.policy == "alignatt":
            agreed = max(0, min(len(tail), self._heard_words(result) - done))
        else:
            agreed = _agreement(self._reference(hyp.words), tail)
            if self.options.commit_margin_s > 0:
                horizon = (self.window_start + self.audio.size) / SAMPLE_RATE - self.options.commit_margin_s
                agreed = next((k for k in range(agreed) if tail[k].end > horizon), agreed)
        if agreed:
            yield self._commit(tail[:agreed])
        self.tail = _newer_tail(self.tail[agreed:], tail[agreed:])
        yield from self._trim(hyp, done + agreed, stalled=self._stalled(tail))
        yield from self._report(started, result)

    def _reference(self, words: list[_Word]) -> list[_Word]:
        """The uncommitted words LocalAgreement compares a new hypothesis (`words`, all of it) with: the
        previous hypothesis' (agree_gap_s 0), or those of the newest one decoded at least agree_gap_s of
        audio earlier, none while there is no such one. Pause-step decodes too: with the previous one there
        (0.5 s older at most) the last words were final 0.27 s after they were spoken instead of 0.61 s (p50,
        dev clips), but widened-set stream WER rose from 12.44 to 14.29 % (stream-accuracy-gap-pause.md)."""
        gap = round(self.options.agree_gap_s * SAMPLE_RATE)
        if not gap:
            return self.tail
        upto = self.decoded_upto - gap
        while len(self.earlier) > 1 and self.earlier[1][0] <= upto:
            self.earlier.popleft()  # an older one than needed: later hypotheses need none older either
        older = self.earlier[0][1] if self.earlier and self.earlier[0][0] <= upto else []
        self.earlier.append((self.decoded_upto, words))
        return older[_skip_committed(self._committed_in_window(), older):]

    def flush(self) -> Iterator[Event]:
        """Commits the whole tentative tail, decoding the newest speech first. The window (and so the
        acoustic context of the next words) is kept."""
        started = time.perf_counter()
        result = None
        if self.fresh_speech and self._active():
            hyp, result = self._decode()
            self.tail = _newer_tail(self.tail, hyp.words[_skip_committed(self._committed_in_window(), hyp.words):])
        if self.tail:
            yield self._commit(self.tail)
        self.tail = []
        self.earlier.clear()  # everything heard is committed: older hypotheses have nothing left to agree on
        if result is not None:
            yield from self._report(started, result)
        else:  # no partial follows: the display still sees the commit, for the rewrite count
            self._shown()

    def _shown(self) -> list[_Word]:
        """The tentative words to show now (see _Display)."""
        shown = self.display.update(self.committed[self.n_displayed:], self.tail)
        self.n_displayed = len(self.committed)
        return shown

    def _reset_window(self) -> None:
        """After a long silence with everything committed: keep only the pre-roll."""
        self.in_window = 0
        self.pauses = []
        if self.detects_language:
            self.language, self.language_locked = None, False  # the next utterance may be in another
        self.speech_samples = 0
        self.fresh_speech = False
        self._cut(max(self.window_start, self.total - round(self.options.preroll_s * SAMPLE_RATE)))

    def _committed_in_window(self) -> list[_Word]:
        return self.committed[len(self.committed) - self.in_window:]

    def _decode(self) -> tuple[_Hypothesis, DecodingResult]:
        # After a fallback the step is decoded again from the encoder on: the one thing a failed attempt
        # can have changed, the detected language, holds for the same audio.
        return self.session.run(self._decode_once)

    def _decode_once(self) -> tuple[_Hypothesis, DecodingResult]:
        frames = _context_frames(self.audio.size, self.options)
        self.ctx.encode(window_mel(self.audio, self.model.mel_filters, frames))
        o = self.options
        if not self.language_locked:
            self.language = detect_language(self.ctx, self.model.tokenizer)[0]
            self.language_locked = self.speech_samples >= o.language_lock_s * SAMPLE_RATE
            if self.committed and self.language != self._committed_language:
                # Text in another language as the prompt makes Whisper write in that language (base wrote
                # JFK in Chinese after a Chinese utterance): the new utterance starts without it.
                self.prompt_from = len(self.committed) - self.in_window
        options, start = self._decoding_options()
        result = decode_window(self.ctx, self.model.tokenizer, options, self.model.n_text_ctx)
        self.last_decode = (start, result.tokens)
        self.decoded_upto = self.total
        self.fresh_speech = False
        if self._rejected(result):
            return _Hypothesis([], []), result
        script = (o.zh_script or default_script()) if self.language == "zh" else None
        hyp = _parse(result.tokens, self.model.tokenizer, self.window_start / SAMPLE_RATE,
                     self.audio.size / SAMPLE_RATE, script)
        if o.doubled_run_words is not None:
            hyp = _without_doubles(hyp, o.doubled_run_words)
        if hyp.words and self.silence_from is not None and self.silence_from > self.window_start:
            self._mark_pause(hyp.words)
        return hyp, result

    def _decoding_options(self) -> tuple[DecodingOptions, tuple]:
        """This decode's options, with the last hypothesis as the draft where it starts as the last decode
        did; and that start (window start, language, prompt)."""
        o = self.options
        sample_len = _TOKENS_SLACK + math.ceil(_TOKENS_PER_S * self.audio.size / SAMPLE_RATE)
        prompt = self._prompt()
        start = (self.window_start, self.language, tuple(prompt))
        same_start = o.draft and self.last_decode is not None and self.last_decode[0] == start
        options = DecodingOptions(language=self.language, prompt=prompt or None, without_timestamps=False,
                                  sample_len=min(sample_len, self.model.n_text_ctx // 2),
                                  beam_size=o.beam_size if o.beam_size > 1 else None,
                                  draft=self.last_decode[1] if same_start else None)
        return options, start

    def _heard_words(self, result: DecodingResult) -> int:
        """How many of the hypothesis' words (committed ones in the window included) the decoder wrote from
        audio before the window's last `alignatt_frames` encoder positions (AlignAtt)."""
        tokenizer = self.model.tokenizer
        text = [t for t in result.tokens if t < tokenizer.eot]
        n_frames = self.audio.size // HOP_LENGTH
        positions = token_positions(self.ctx, tokenizer, text, n_frames, self.model.alignment_heads)
        late = np.flatnonzero(positions >= n_frames // 2 - self.options.alignatt_frames)
        if not late.size:
            return len(_units(tokenizer.decode(text)))
        k = int(late[0])
        heard = _units(tokenizer.decode(text[:k]))
        # A word the first late token continues (no leading space) is not whole yet.
        whole = tokenizer.decode([text[k]]).startswith(" ") or not heard
        return len(heard) if whole else len(heard) - 1

    def _rejected(self, result: DecodingResult) -> bool:
        """Silence by Whisper's own judgement, or a repetition loop (ref: openai-whisper transcribe.py)."""
        o = self.options
        silence = result.no_speech_prob > o.no_speech_threshold and result.avg_logprob < o.logprob_threshold
        loop = too_repetitive(result, self.model.tokenizer.timestamp_begin, o.compression_ratio_threshold,
                              o.repeated_segments_threshold)
        if not loop and o.repeated_words_threshold is not None:
            loop = _repeated_run([_key(unit) for unit, _ in _units(result.text)], o.repeated_words_threshold)
        if silence or loop:
            logger.debug("hypothesis rejected (no_speech %.2f, logprob %.2f, compression %.2f): %r",
                         result.no_speech_prob, result.avg_logprob, result.compression_ratio, result.text)
        return silence or loop

    def _prompt(self) -> list[int]:
        """The prompt's words as tokens (see StreamOptions.prompt_timestamps)."""
        words = self.committed[self._prompt_start():len(self.committed) - self.in_window]
        return _prompt_tokens(words, self.model.tokenizer, self.options.prompt_timestamps)

    def _prompt_start(self) -> int:
        """Index in `committed` of the prompt's first word: the prompt is the committed words that have left the
        window (from prompt_from on), the last of them whose text is within prompt_chars characters."""
        end = len(self.committed) - self.in_window
        first, chars = end, 0  # chars: of _join(self.committed[first:end])
        while first > self.prompt_from:
            space = int(first < end and self.committed[first].spaced)
            if chars + space + len(self.committed[first - 1].text) > self.options.prompt_chars:
                break
            first -= 1
            chars += space + len(self.committed[first].text)
        return first

    def _commit(self, words: list[_Word]) -> Commit:
        before = self.committed[-1].text if self.committed else ""
        # Estimates from different hypotheses may overlap; commits must not go back in time.
        start = max(words[0].start, self.committed[-1].end) if self.committed else words[0].start
        end = max(words[-1].end, start)
        self.committed += words[:-1] + [_Word(words[-1].text, words[-1].start, end, words[-1].spaced)]
        self.commit_lag_s = max(0.0, self.total / SAMPLE_RATE - words[0].end)
        self._committed_language = self.language
        self.in_window += len(words)
        # Between two commits as between two words: no space where both sides are Chinese or Japanese.
        spaced = words[0].spaced and not (before and _unspaced(before[-1]) and _unspaced(words[0].text[0]))
        self._forget_old_words()
        return Commit(_join(words), start, end, self.language, spaced)

    def _forget_old_words(self) -> None:
        """Drops the committed words nothing reads again, once there are _FORGET_AFTER of them: those before
        the window's, the prompt's (the last prompt_chars characters before the window), the display's and
        the pauses' markers, and the last one. The consumers have them all (Commit events); without this a
        stream's word list grew with it (~2 MiB an hour of speech, tracemalloc)."""
        window_base = len(self.committed) - self.in_window
        if window_base < _FORGET_AFTER:  # at most window_base words can go: no need to count them
            return
        keep = min(self._prompt_start(), self.n_displayed, len(self.committed) - 1,
                   *(base for _, base, _ in self.pauses))
        if keep < _FORGET_AFTER:
            return
        del self.committed[:keep]
        self.prompt_from = max(0, self.prompt_from - keep)
        self.n_displayed -= keep
        self.pauses = [(at, base - keep, heard) for at, base, heard in self.pauses]

    # -- the window --

    def _stalled(self, tail: list[_Word]) -> bool:
        """Whether a hypothesis whose uncommitted words are `tail` stalls the window (StreamOptions.stall_s): it
        wrote none, and at least stall_s of audio after the window's last committed word (all of it without
        one) went unwritten."""
        written = self.committed[-1].end if self.in_window else self.window_start / SAMPLE_RATE
        return not tail and self.total / SAMPLE_RATE - written >= self.options.stall_s

    def _trim(self, hyp: _Hypothesis, n_committed: int, *, stalled: bool = False) -> Iterator[Event]:
        """Once the window is longer than trim_s, or at once when the hypothesis is `stalled` (it wrote
        only committed words while fresh speech came in), cuts it at the latest point before which every
        word is committed: the end of a closed Whisper segment, or a VAD pause. Past max_window_s without
        one, commits up to the last closed segment (or everything) unconfirmed and cuts there.

        A stalled window is cut early because Whisper may keep ending its text with the committed words:
        base, given a committed Mandarin sentence and the next one 0.3 s after it, wrote the first alone
        for four steps and then lost the second (issue #24); decoded from the cut, the new speech is all
        the window holds."""
        window_s = self.audio.size / SAMPLE_RATE
        if window_s <= self.options.trim_s and not stalled:
            return
        cuts = [c for c in (self._segment_cut(hyp, n_committed), self._pause_cut()) if c is not None]
        if cuts:
            self._cut_window(*max(cuts, key=lambda cut: cut[1]))
            return
        if window_s <= self.options.max_window_s:
            return
        logger.warning("no committed segment or pause in %.1f s of audio; committing unconfirmed text", window_s)
        n_before, at_s = hyp.cuts[-1] if hyp.cuts else (len(hyp.words), self.total / SAMPLE_RATE)
        forced = hyp.words[n_committed:n_before]
        if forced:
            yield self._commit(forced)
        self.tail = hyp.words[n_before:]
        self._cut_window(self.in_window, round(at_s * SAMPLE_RATE))

    def _segment_cut(self, hyp: _Hypothesis, n_committed: int) -> tuple[int, int] | None:
        """(committed words before it, input sample) of the last closed segment whose words are all
        committed; hyp.words[:n_committed] are the window's committed words."""
        done = [cut for cut in hyp.cuts if cut[0] <= n_committed]
        if not done:
            return None
        n_before, at_s = done[-1]
        # The committed words the hypothesis wrote before the cut leave the window. Those it left out (a stalled
        # hypothesis ends before the last commits) stay: they were spoken after the cut, whose audio the window
        # keeps, and out of the prompt, which would otherwise hold them too (the sonnet: "but as the writer
        # should" committed twice). Their estimated times cannot tell: Whisper's segment ends move by tenths of
        # a second from one hypothesis to the next (the 5 minute series over a telephone line, 0.5 s steps:
        # "within thy", timed before a cut at 235.06 s, was written again after it; 108 -> 85 errors).
        finer = max(0, n_committed - self.in_window)  # the hypothesis wrote the committed words as more words
        return max(0, n_before - finer), round(at_s * SAMPLE_RATE)

    def _mark_pause(self, words: list[_Word]) -> None:
        """Remembers what was heard before the current pause: a hypothesis decoded while the gate is
        closed holds every word spoken before the pause, so once the commits run past those words
        the window may start at the pause (Whisper's segments alone are too rare to cut at)."""
        marker = (self.silence_from, len(self.committed) - self.in_window, words)
        if self.pauses and self.pauses[-1][0] == self.silence_from:
            self.pauses[-1] = marker  # a later hypothesis of the same pause has heard more
        else:
            self.pauses.append(marker)

    def _pause_cut(self) -> tuple[int, int] | None:
        """(committed words before it, input sample) of the latest pause the commits have passed: they hold what
        was heard before it and more. Commits that differ from what was heard in most of its characters are other
        words: a hypothesis decoded at the pause that left out committed words had not heard what came before."""
        window_base = len(self.committed) - self.in_window
        for at, base, heard in reversed(self.pauses):
            after = self.committed[base:]
            n_heard, close = _closest_prefix(heard, after)
            if close and n_heard < len(after) and base + n_heard >= window_base:
                return base + n_heard - window_base, at
        return None

    def _cut_window(self, n_leaving: int, start: int) -> None:
        """Starts the window at input sample `start`; its first `n_leaving` committed words leave it."""
        self.in_window = max(0, self.in_window - n_leaving)
        self._cut(min(self.total, max(self.window_start, start)))
        self.pauses = [p for p in self.pauses if p[0] > self.window_start]

    def _cut(self, start: int) -> None:
        self.audio = self.audio[start - self.window_start:].copy()
        self.window_start = start
        self.cut_pending = True  # the next hypothesis with words is the new window's first
        self.earlier.clear()  # hypotheses of the longer window: their words are not the new window's

    # -- costs --

    def _report(self, started: float, result: DecodingResult) -> Iterator[Event]:
        yield from self.fallbacks
        self.fallbacks.clear()
        busy = time.perf_counter() - started
        audio_s = self.total / SAMPLE_RATE
        shown = self._shown()
        text = _join(shown)
        if text and self.first_partial_s is None and self.onset_read_at is not None:
            self.first_partial_s = time.monotonic() - self.onset_read_at
        yield Partial(text, audio_s, self.language, not shown or shown[0].spaced)
        self.costs.append((busy, audio_s - self.reported_audio_s))
        self.reported_audio_s = audio_s
        self.busy_s += busy
        self.n_steps += 1
        yield self.metrics(busy, result.timer)

    def metrics(self, step_s: float = 0.0, timer: TokenTimer | None = None) -> Metrics:
        """The costs so far, with `timer` as this step's decoder calls."""
        stats, timer = self.ctx.stats, timer or TokenTimer()
        given = max(1, timer.n_calls + timer.draft_accepted)  # tokens the calls gave: one each, and the drafts kept
        kv_used = int(stats.get("kv_used_tokens", 0))
        arena_mib = stats.get("kv_bytes", 0) / 2**20
        kv_mib = kv_used * arena_mib / max(1, stats.get("kv_cells", 1))
        pool, pool_used_mib = self.model.kv_pool if stats.get("kv_paged") else None, 0.0
        if pool is not None:  # kv_bytes is the session's blocks; the arena's size is the pool's
            kv_mib, arena_mib, pool_used_mib = arena_mib, pool.bytes / 2**20, pool.used_blocks * pool.block_bytes / 2**20
        busy, audio = (sum(c[i] for c in self.costs) for i in (0, 1))
        audio_s = self.total / SAMPLE_RATE
        return Metrics(
            audio_s=audio_s, window_s=self.audio.size / SAMPLE_RATE, n_steps=self.n_steps,
            step_ms=step_s * 1000, rtf=busy / audio if audio else 0.0,
            rtf_mean=self.busy_s / audio_s if audio_s else 0.0,
            encoder_ms=float(self.ctx.last_encode.get("encoder_ms", 0.0)), n_tokens=timer.n_calls,
            decode_ms_per_token=(timer.compute_ms + timer.kv_io_ms + timer.logits_ms + timer.sampling_ms) / given,
            compute_ms_per_token=timer.compute_ms / given, kv_io_ms_per_token=timer.kv_io_ms / given,
            kv_tokens=kv_used, kv_capacity_tokens=int(stats.get("kv_capacity_tokens", 0)), kv_mib=kv_mib,
            kv_capacity_mib=arena_mib, graph_builds=int(stats.get("graph_builds", 0)),
            graph_reuses=int(stats.get("graph_reuses", 0)), first_partial_s=self.first_partial_s,
            commit_lag_s=self.commit_lag_s,
            dropped_blocks=self.dropped_blocks, rewrites=self.display.rewrites, backend=self.model.backend, device=self.model.device,
            kv_mode=self.kv_mode, fallback_ops=tuple(self.ctx.backend_report.get("fallback_ops", ())),
            peak_rss_mb=peak_rss_mb(), dropped_by_input=self.dropped_by_input, kv_paged=pool is not None,
            kv_pool_used_mib=pool_used_mib, draft_tokens=timer.draft_tokens, draft_accepted=timer.draft_accepted,
        )


# -- the generator ---------------------------------------------------------------------------------


def live_events(model: WhisperModel, source, options: StreamOptions | None = None, *, kv_mode: str = "device",
                stop: threading.Event | None = None) -> Iterator[Event]:
    """Captions of a live source (`capture.MicrophoneSource`, `capture.ReplaySource`), lazily.

    Starts the source on first iteration and stops it at the end. Runs until `stop` is set, the source
    ends, or the consumer closes the generator; then commits the tentative tail and yields a last
    Metrics. A source that cannot start, or fails midway, yields an Error instead of raising.
    """
    options = options or StreamOptions()
    stream = _Stream(model, options, kv_mode)
    heard = yield from source_events(source, stop or threading.Event(), lambda samples: _feed(stream, samples),
                                     after_read=lambda: _count_drops(stream, source))
    if heard:
        yield from stream.flush()
        yield stream.metrics()


def source_events(source, stop: threading.Event, feed: Callable[[np.ndarray], Iterator[Event]], *,
                  after_read: Callable[[], None] = lambda: None) -> Generator[Event, None, bool]:
    """Runs a capture source for a live stream: starts it, hands what it delivers to `feed` (whose events are
    yielded) until `stop` is set or the source ends, then what was captured before the stop; an Error for a
    source that fails. The source is stopped at the end, or when the consumer closes the generator. Returns
    False, after an Error, when the source could not start (nothing was heard), else True. `after_read` runs
    after each read (live_events counts the source's dropped blocks there)."""
    try:
        source.start()
    except AuralError as exc:
        yield Error(str(exc))
        return False
    try:
        while not stop.is_set():
            samples = source.read(0.1)
            after_read()
            if samples is not None:
                yield from feed(samples)
            elif source.finished:
                break
        source.stop()
        while (samples := source.read(0.0)) is not None:  # what was captured before the stop
            yield from feed(samples)
        after_read()
        if source.error is not None:
            yield Error(str(source.error))
    finally:
        source.stop()
    return True


def _count_drops(stream: _Stream, source) -> None:
    stream.dropped_blocks = source.dropped_blocks
    stream.dropped_by_input = tuple(getattr(source, "dropped_by_input", ()))


def _feed(stream: _Stream, samples: np.ndarray) -> Iterator[Event]:
    """Feeds a backlog in pieces of at most max_step_s, so a window never grows by more per step."""
    piece = round(stream.options.max_step_s * SAMPLE_RATE)
    for start in range(0, samples.size, piece):
        stream.feed(samples[start:start + piece])
        yield from stream.poll()
