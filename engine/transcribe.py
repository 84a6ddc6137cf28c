"""Long-form transcription: openai-whisper's sequential 30 s windows, yielded segment by segment.

The audio is pulled from `audio.stream_audio` into a rolling buffer that holds only the samples from
the current `seek` onward (at most one window ahead), and the log-mel of each window is computed when
that window is decoded, so memory stays flat however long the input is. Window placement, temperature
fallback, the no-speech skip, segment cutting and prompt conditioning follow openai-whisper
transcribe.py (`transcribe`) and faster-whisper transcribe.py (`generate_segments`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from . import audio
from .decoding import DecodingOptions, DecodingResult, decode_window, detect_language
from .errors import AudioError
from .features import HOP_LENGTH, N_FRAMES, N_SAMPLES, log_mel_spectrogram
from .metrics import Timings, TokenTimer
from .runtime import WhisperModel
from .tokenizer import TIME_PRECISION, WhisperTokenizer, normalize_language

__all__ = [
    "TranscribeOptions",
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
    """

    language: str | None = None
    task: str = "transcribe"
    temperatures: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
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

    def __post_init__(self):
        if not self.temperatures:
            raise ValueError("temperatures must hold at least one temperature")


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
    """

    path: str | None
    language: str
    duration_s: float | None
    model: str
    backend: str
    device: str
    kv_mode: str


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


def _open_source(source, raw_rate, raw_format) -> tuple[Iterator[np.ndarray], str | None, float | None]:
    """(chunk iterator, path or None, duration in seconds or None) of a path or a 16 kHz array."""
    if isinstance(source, np.ndarray):
        samples = np.asarray(source, dtype=np.float32)
        if samples.ndim != 1:
            raise AudioError(f"expected mono samples (1-D), got an array of shape {samples.shape}")
        return _array_chunks(samples), None, samples.size / SAMPLE_RATE
    path = str(Path(source))
    info = audio.probe(path, raw_rate=raw_rate, raw_format=raw_format)
    chunks = audio.stream_audio(path, raw_rate=raw_rate, raw_format=raw_format)
    return iter(chunks), path, info.duration_s


def _window_mel(samples: np.ndarray, model: WhisperModel) -> np.ndarray:
    """(n_mels, 3000) log-mel of one window, zero-padded to 30 s.

    openai-whisper computes the log-mel of the whole file once and clamps every frame to 8 below the
    file's maximum; here each window is clamped to its own maximum. For inputs up to 30 s the two are
    identical; for longer ones a quiet window gets a slightly different floor. That difference is
    what keeps memory bounded: nothing file-wide is ever held.
    """
    mel = log_mel_spectrogram(samples, model.n_mels, filters=model.mel_filters,
                              padding=N_SAMPLES - samples.size)
    return np.ascontiguousarray(mel[:, :N_FRAMES], dtype=np.float32)


# -- segments --------------------------------------------------------------------------------------


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
    """
    is_ts = [t >= timestamp_begin for t in tokens]
    single_timestamp_ending = len(tokens) >= 2 and is_ts[-1] and not is_ts[-2]
    consecutive = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    if not consecutive:
        stamps = [t for t in tokens if t >= timestamp_begin]
        duration = segment_duration
        if stamps and stamps[-1] != timestamp_begin:
            duration = (stamps[-1] - timestamp_begin) * TIME_PRECISION
        return [(time_offset, time_offset + duration, list(tokens))], segment_size

    slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
    segments = []
    last = 0
    for cut in slices:
        piece = list(tokens[last:cut])
        start = time_offset + (piece[0] - timestamp_begin) * TIME_PRECISION
        end = time_offset + (piece[-1] - timestamp_begin) * TIME_PRECISION
        segments.append((start, end, piece))
        last = cut
    if single_timestamp_ending:
        return segments, segment_size
    return segments, (tokens[last - 1] - timestamp_begin) * INPUT_STRIDE


# -- the run ---------------------------------------------------------------------------------------


def _needs_fallback(result: DecodingResult, options: TranscribeOptions) -> bool:
    """Too repetitive or too improbable, unless it looks like silence (ref: openai-whisper
    transcribe.py decode_with_fallback)."""
    failed = (options.compression_ratio_threshold is not None
              and result.compression_ratio > options.compression_ratio_threshold)
    low_logprob = options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold
    silence = (options.no_speech_threshold is not None
               and result.no_speech_prob > options.no_speech_threshold and low_logprob)
    return (failed or low_logprob) and not silence


def _is_silence(result: DecodingResult, options: TranscribeOptions) -> bool:
    """Skip the window: likely no speech, and the decode is not confident enough to overrule that."""
    if options.no_speech_threshold is None or result.no_speech_prob <= options.no_speech_threshold:
        return False
    return options.logprob_threshold is None or result.avg_logprob <= options.logprob_threshold


class _Run:
    """State of one transcription: the session, the rolling audio, the prompt and the timings."""

    def __init__(self, model: WhisperModel, options: TranscribeOptions, ctx, rolling: _RollingAudio,
                 timings: Timings, stop: threading.Event | None = None):
        self.model = model
        self.tokenizer: WhisperTokenizer = model.tokenizer
        self.options = options
        self.ctx = ctx
        self.rolling = rolling
        self.timings = timings
        self.tokens = TokenTimer()
        # Only the last n_text_ctx//2 - 1 tokens can ever be a prompt (ref: openai-whisper decoding.py
        # _get_initial_tokens), so that is all that is kept.
        self.prompt: deque[int] = deque(maxlen=model.n_text_ctx // 2 - 1)
        if options.initial_prompt:
            self.prompt.extend(model.tokenizer.encode(" " + options.initial_prompt.strip()))
        self.encoded_seek: int | None = None
        self.n_segments = 0
        self.stop = stop

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def resolve_language(self) -> str:
        """The language to decode: as given, "en" for English-only models, else detected on the first
        window. Sets the tokenizer's start sequence to match."""
        model, options = self.model, self.options
        if not model.multilingual:
            if options.language is not None and normalize_language(options.language) != "en":
                logger.warning("%s is English-only; ignoring language %r", model.name, options.language)
            return "en"
        language = normalize_language(options.language)
        if language is None:
            if self.encode(0) is None:
                raise AudioError("the input has no audio to detect its language from")
            language = detect_language(self.ctx, model.tokenizer)[0]
        self.tokenizer = model.tokenizer.with_options(language=language, task=options.task)
        return language

    def encode(self, seek: int) -> int | None:
        """Encodes the window at `seek` (mel frames); returns its frame count, None past the end."""
        samples = self.rolling.window(seek * HOP_LENGTH, N_SAMPLES)
        content_frames = self.rolling.total_samples // HOP_LENGTH if self.rolling.exhausted else None
        if content_frames is not None and seek >= content_frames:
            return None
        frames = N_FRAMES if content_frames is None else min(N_FRAMES, content_frames - seek)
        if self.encoded_seek != seek:
            self.ctx.encode(_window_mel(samples, self.model))
            self.timings.add_window(self.ctx.last_encode["encoder_ms"])
            self.encoded_seek = seek
        return frames

    def decode(self, seek: int) -> DecodingResult:
        """Decodes the encoded window, falling back to higher temperatures while it fails."""
        o = self.options
        for temperature in o.temperatures:
            decoding = DecodingOptions(
                temperature=temperature, language=self.tokenizer.language, task=o.task,
                prompt=list(self.prompt), suppress_blank=o.suppress_blank, suppress_tokens=o.suppress_tokens,
                without_timestamps=o.without_timestamps, max_initial_timestamp=o.max_initial_timestamp,
                # Distinct per window and reproducible across runs.
                seed=o.seed + seek,
            )
            result = decode_window(self.ctx, self.tokenizer, decoding, self.model.n_text_ctx, stop=self.stop)
            self.tokens.merge(result.timer)
            if not _needs_fallback(result, o):
                break
            logger.debug("window at %.2f s failed at T=%s (cr %.2f, logprob %.2f)", seek * HOP_LENGTH / SAMPLE_RATE,
                         temperature, result.compression_ratio, result.avg_logprob)
        return result

    def window(self, seek: int, segment_size: int) -> tuple[list[Segment], int]:
        """Decodes the window at `seek`; returns its segments and the next seek."""
        result = self.decode(seek)
        if _is_silence(result, self.options):
            logger.debug("window at frame %s skipped as silence (p=%.2f)", seek, result.no_speech_prob)
            return [], seek + segment_size
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE
        pieces, advance = split_segments(
            result.tokens, self.tokenizer.timestamp_begin, time_offset=time_offset,
            segment_size=segment_size, segment_duration=segment_size * HOP_LENGTH / SAMPLE_RATE)
        segments = [self._segment(start, end, tokens, result) for start, end, tokens in pieces]
        segments = [s for s in segments if s is not None]
        if (not self.options.condition_on_previous_text
                or result.temperature > self.options.prompt_reset_on_temperature):
            self.prompt.clear()
        return segments, seek + advance

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


def _segments(run: _Run, started: float, total_s: float | None,
              progress: Callable[[float, float], None] | None) -> Iterator[Segment]:
    seek = 0
    try:
        while not run.stopped() and (segment_size := run.encode(seek)) is not None:
            segments, seek = run.window(seek, segment_size)
            if run.stopped():  # the window was cut short: its text is incomplete, keep none of it
                break
            yield from segments
            if progress is not None:
                done_s = seek * HOP_LENGTH / SAMPLE_RATE
                total = total_s if total_s is not None else done_s
                progress(min(done_s, total), total)
    finally:
        audio_s = run.rolling.total_samples / SAMPLE_RATE
        run.timings.finish(audio_s=audio_s, wall_s=time.perf_counter() - started, tokens=run.tokens,
                           stats=run.ctx.stats)
        logger.info("transcribed %.1f s in %.1f s (RTF %.3f, %s windows)", audio_s, run.timings.wall_s,
                    run.timings.rtf, run.timings.n_windows)


def transcribe(model: WhisperModel, source: str | Path | np.ndarray, options: TranscribeOptions | None = None, *,
               kv_mode: str = "device", graph_reuse: bool = True, raw_rate: int | None = None,
               raw_format: str | None = None,
               progress: Callable[[float, float], None] | None = None,
               stop: threading.Event | None = None) -> Transcription:
    """Transcribes a file (any format `audio.stream_audio` reads) or a 16 kHz mono float32 array.

    Returns at once (after language detection, for multilingual models without a language) with a
    `Transcription` whose segments are decoded as they are iterated. `progress(done_s, total_s)` is
    called after each window. Setting `stop` ends the iteration within one decoder step (the
    window being decoded is dropped); segments already yielded stay valid.
    """
    options = options or TranscribeOptions()
    started = time.perf_counter()
    chunks, path, duration_s = _open_source(source, raw_rate, raw_format)
    ctx = model.new_session(kv_mode=kv_mode, graph_reuse=graph_reuse)
    timings = Timings(load_s=model.load_s, backend=model.backend, device=model.device, kv_mode=kv_mode)
    run = _Run(model, options, ctx, _RollingAudio(chunks), timings, stop)
    language = run.resolve_language()
    info = TranscriptionInfo(path=path, language=language, duration_s=duration_s, model=model.name,
                             backend=model.backend, device=model.device, kv_mode=kv_mode)
    return Transcription(info, _segments(run, started, duration_s, progress), timings)
