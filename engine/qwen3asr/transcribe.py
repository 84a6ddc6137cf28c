"""File transcription with Qwen3-ASR as the official wrapper does it (qwen-asr 0.0.6,
Qwen3ASRModel.transcribe): the audio in chunks of up to 20 minutes cut at a quiet point, each chunk's 128-bin
log-mel through the audio tower, its vectors in one prompt, greedy decoding until an end-of-sequence token or
512 new tokens, and the output parsed into language and text.

    for chunk in transcribe_qwen3(model, samples, language="English"):
        print(f"[{chunk.start:.1f}-{chunk.end:.1f}] {chunk.text}")

    result = transcribe_file(model, samples)   # the same as Whisper's `transcribe` gives it: one Segment a chunk
    for segment in result: ...                 # then result.info names the language the model heard
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from aural.engine.audio import load_audio
from aural.engine.decoding import compression_ratio
from aural.engine.features import log_mel_spectrogram
from aural.engine.metrics import Timings
from aural.engine.qwen3asr.model import LANGUAGE_NAMES, Qwen3AsrModel
from aural.engine.qwen3asr.text import parse_output
from aural.engine.runtime import DeviceFallback
from aural.engine.transcribe import Segment, Transcription, TranscriptionInfo

__all__ = ["MAX_CHUNK_S", "MAX_NEW_TOKENS", "Qwen3Chunk", "split_chunks", "transcribe_file", "transcribe_qwen3"]

SAMPLE_RATE = 16000
MAX_CHUNK_S = 1200.0  # utils.py MAX_ASR_INPUT_SECONDS: the most audio the wrapper hands the model at once
MIN_CHUNK_S = 0.5     # MIN_ASR_INPUT_SECONDS: a shorter chunk is padded with silence to this length
SEARCH_S = 5.0        # split_audio_into_chunks: a cut is sought within 5 s of the chunk's end ...
QUIET_WINDOW_S = 0.1  # ... as the quietest 100 ms there (sum of |x|), at its quietest sample
MAX_NEW_TOKENS = 512  # Qwen3ASRModel's default max_new_tokens


@dataclass(frozen=True)
class Qwen3Chunk:
    """One chunk's transcript.

    Attributes:
        start, end: the chunk's place in the input, in seconds.
        language: the language the model named (or the one forced), "" for none or no speech.
        text: the transcript.
        tokens: the generated ids, end-of-sequence left out.
        prompt_tokens: the prompt's length (audio vectors included).
        encode_ms: the audio tower's time; prefill_ms: the prompt batch's; step_ms: mean time per new token.
        avg_logprob: the mean log-probability of the greedy choices, the end-of-sequence one included (openai-whisper
            decoding.py's sum_logprobs / (tokens + 1)); NaN when nothing was chosen.
    """

    start: float
    end: float
    language: str
    text: str
    tokens: tuple[int, ...]
    prompt_tokens: int
    encode_ms: float
    prefill_ms: float
    step_ms: float
    avg_logprob: float = float("nan")


def quietest_point(samples: np.ndarray, left: int, right: int, *, default: int) -> int:
    """The quietest sample of the quietest QUIET_WINDOW_S (sum of |x|) in samples[left:right]; `default` when the
    stretch is no longer than that window (split_audio_into_chunks' cut)."""
    window = max(4, int(QUIET_WINDOW_S * SAMPLE_RATE))
    if right - left <= window:
        return default
    loudness = np.abs(samples[left:right])
    sums = np.convolve(loudness, np.ones(window, dtype=np.float32), mode="valid")
    quietest = int(np.argmin(sums))
    return left + quietest + int(np.argmin(loudness[quietest:quietest + window]))


def split_chunks(samples: np.ndarray, max_chunk_s: float = MAX_CHUNK_S) -> list[tuple[np.ndarray, float]]:
    """(chunk, offset in s) pieces of at most about max_chunk_s, cut at a quiet point, that join back into
    `samples` exactly; a piece shorter than MIN_CHUNK_S is padded with zeros (utils.split_audio_into_chunks)."""
    samples = np.asarray(samples, dtype=np.float32)
    total, max_len = len(samples), int(max_chunk_s * SAMPLE_RATE)
    expand = int(SEARCH_S * SAMPLE_RATE)
    pieces, start = [], 0
    while total - start > max_len:
        cut = start + max_len
        left, right = max(start, cut - expand), min(total, cut + expand)
        boundary = quietest_point(samples, left, right, default=cut)
        boundary = min(max(boundary, start + 1), total)
        pieces.append((start, boundary))
        start = boundary
    pieces.append((start, total))
    min_len = int(MIN_CHUNK_S * SAMPLE_RATE)
    out = []
    for begin, end in pieces:
        piece = samples[begin:end]
        if len(piece) < min_len:
            piece = np.pad(piece, (0, min_len - len(piece)))
        out.append((piece, begin / SAMPLE_RATE))
    return out


def transcribe_qwen3(model: Qwen3AsrModel, samples: np.ndarray, *, language: str | None = None, context: str = "",
                     max_new_tokens: int = MAX_NEW_TOKENS, max_chunk_s: float = MAX_CHUNK_S,
                     kv_mode: str = "device", kv_type: str = "f16",
                     on_fallback: Callable[[DeviceFallback], None] | None = None,
                     stop: threading.Event | None = None) -> Iterator[Qwen3Chunk]:
    """Chunks of 16 kHz mono `samples` transcribed in order (a lazy iterator). language: a name the model
    knows ("English", "Chinese", ...) to force, or None to let it say; context: words to bias towards;
    kv_mode "host": the baseline that moves the K/V history every token; kv_type "f32": an arena without
    f16's rounding (comparisons with an f32 reference). A device that fails under a chunk hands it to the CPU
    (`Qwen3AsrModel.run`), which transcribes it again from its start; `on_fallback` is told. Setting `stop`
    ends the iteration at the next decoder step (the chunk under way is not yielded)."""
    stop = stop or threading.Event()
    for piece, offset in split_chunks(samples, max_chunk_s):
        chunk = model.run(partial(_transcribe_chunk, model, piece, offset, language=language, context=context,
                                  max_new_tokens=max_new_tokens, kv_mode=kv_mode, kv_type=kv_type, stop=stop),
                          on_fallback)
        if stop.is_set():
            return
        yield chunk


def transcribe_file(model: Qwen3AsrModel, source: str | Path | np.ndarray, *, language: str | None = None,
                    context: str = "", kv_mode: str = "device", path: str | None = None,
                    progress: Callable[[float, float], None] | None = None, stop: threading.Event | None = None,
                    on_fallback: Callable[[DeviceFallback], None] | None = None) -> Transcription:
    """A file (any format `audio.load_audio` reads; `path` names it then) or 16 kHz mono samples as Whisper's
    `transcribe.transcribe` gives them, so the CLI, the app and the server take either model alike: a
    `Transcription` whose Segments (one per chunk with text, no word timing: the official wrapper times words
    with a separate forced aligner) are decoded as it is iterated. language: a code ("en")
    or a name the model knows, None to let it say; its `info.language` is then the code of the language the
    model named, once a chunk has been read. `progress(done_s, total_s)` follows each chunk; `stop` as for
    transcribe_qwen3."""
    from aural.engine.qwen3asr.model import language_name

    forced = language_name(language) if language else None
    if not isinstance(source, np.ndarray):
        path, source = str(source), load_audio(source)
    samples = source
    audio_s = len(samples) / SAMPLE_RATE
    info = TranscriptionInfo(path=path, language=_code(forced) if forced else "", duration_s=audio_s,
                             model=model.name, backend=model.backend, device=model.device, kv_mode=kv_mode)
    timings = Timings(load_s=model.load_s, audio_s=audio_s, backend=model.backend, device=model.device,
                      kv_mode=kv_mode)

    def segments() -> Iterator[Segment]:  # runs once iterated, when `result` below exists
        yield from _file_segments(result, model, samples, forced, context, kv_mode, progress, stop, on_fallback)

    result = Transcription(info, segments(), timings)
    return result


def _file_segments(result: Transcription, model: Qwen3AsrModel, samples: np.ndarray, forced: str | None,
                   context: str, kv_mode: str, progress, stop, on_fallback) -> Iterator[Segment]:
    start, timings, chunks = time.perf_counter(), result.timings, []
    for chunk in transcribe_qwen3(model, samples, language=forced, context=context, kv_mode=kv_mode,
                                  on_fallback=on_fallback, stop=stop):
        chunks.append(chunk)
        if chunk.language and not result.info.language:
            result.info = dataclasses.replace(result.info, language=_code(chunk.language))
        _add(timings, chunks, time.perf_counter() - start, model)
        if progress is not None:
            progress(min(chunk.end, timings.audio_s), timings.audio_s)
        if chunk.text:
            yield Segment(id=len([c for c in chunks if c.text]) - 1, start=chunk.start,
                          end=min(chunk.end, timings.audio_s), text=" " + chunk.text, tokens=list(chunk.tokens),
                          avg_logprob=chunk.avg_logprob, compression_ratio=compression_ratio(chunk.text),
                          no_speech_prob=float("nan"), temperature=0.0)  # no no-speech token in Qwen3-ASR


def _add(timings: Timings, chunks: list[Qwen3Chunk], wall_s: float, model: Qwen3AsrModel) -> None:
    """The run's timings after its latest chunk: per window (chunk) and per new token."""
    n_tokens = sum(len(c.tokens) for c in chunks)
    timings.wall_s, timings.rtf = wall_s, wall_s / max(timings.audio_s, 1e-9)
    timings.n_windows, timings.n_tokens = len(chunks), n_tokens
    timings.encoder_ms_list = [c.encode_ms for c in chunks]
    timings.encoder_ms = sum(timings.encoder_ms_list) / len(chunks)
    timings.compute_ms = timings.step_compute_ms = sum(c.step_ms * len(c.tokens) for c in chunks) / max(1, n_tokens)
    timings.backend, timings.device = model.backend, model.device  # a fallback moves them to the CPU


def _code(name: str) -> str:
    """The code of a language the model names ("English" -> "en"); the name itself for one it has no code of."""
    return next((code for code, known in LANGUAGE_NAMES.items() if known == name), name)


def _transcribe_chunk(model: Qwen3AsrModel, piece: np.ndarray, offset: float, *, language: str | None, context: str,
                      max_new_tokens: int, kv_mode: str, kv_type: str, stop: threading.Event) -> Qwen3Chunk:
    t0 = time.perf_counter()
    audio = model.encode_audio(log_mel_spectrogram(piece, 128))
    encode_ms = (time.perf_counter() - t0) * 1e3
    prompt = model.prompt(len(audio), context=context, language=language)
    ctx = model.new_context(n_ctx=len(prompt) + max_new_tokens, kv_mode=kv_mode, kv_type=kv_type)
    logits = ctx.decode(np.asarray(prompt, dtype=np.int32), audio=audio)
    prefill_ms = ctx.last_timings["compute_ms"] + ctx.last_timings["kv_io_ms"]
    tokens, step_ms, logprobs = [], 0.0, []
    while not stop.is_set():
        token = int(np.argmax(logits))
        logprobs.append(_greedy_logprob(logits))
        if token in model.eos:
            break
        tokens.append(token)
        if len(tokens) == max_new_tokens:
            break
        logits = ctx.decode(np.asarray([token], dtype=np.int32))
        step_ms += ctx.last_timings["compute_ms"] + ctx.last_timings["kv_io_ms"]
    found, text = parse_output(model.decode_text(tokens), forced_language=language)
    return Qwen3Chunk(start=offset, end=offset + len(piece) / SAMPLE_RATE, language=found, text=text,
                      tokens=tuple(tokens), prompt_tokens=len(prompt), encode_ms=encode_ms,
                      prefill_ms=prefill_ms, step_ms=step_ms / max(1, len(tokens) - 1),
                      avg_logprob=float(np.mean(logprobs)) if logprobs else float("nan"))


def _greedy_logprob(logits: np.ndarray) -> float:
    """log softmax(logits)[argmax] = -log sum exp(logits - max), in float64 (0.5 ms over 151936 logits, against
    about 50 ms for the step that made them at the 0.6B shape)."""
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return -float(np.log(np.exp(shifted).sum()))
