"""Live captions with Qwen3-ASR, as the official streaming does it (qwen-asr 0.0.6,
Qwen3ASRModel.streaming_transcribe, which runs on vLLM alone): the audio arrives in chunks of 2 s; after each
chunk, all the audio of the segment so far goes to the model again, with the text decoded so far, less its last
5 tokens, as the start of the answer (the first 2 chunks start from nothing); greedy decoding writes the rest.

    stream = Qwen3Stream(model, Qwen3StreamOptions(language="English"))
    for event in stream.feed(samples):     # 16 kHz mono float32, any length; Partial / Commit / Metrics
        ...
    for event in stream.finish():          # the tail, and the last segment's text committed
        ...
    for event in qwen3_live_events(model, source, options, stop=stop):  # a capture source, as live_events
        ...

The forced start of the answer never changes after that, so it is what `Commit` events carry; the text after
it is the `Partial`. What Aural does otherwise, none of which changes what the model is given:
- The audio tower attends within windows of 800 mel frames, so a window whose frames are unchanged keeps its
  vectors; and the decoder keeps the K/V of the longest unchanged head of its input (system turn, the vectors of
  the unchanged windows, and the forced text if the audio did not change): each chunk costs its new audio and its
  new text, not the segment's whole prompt again.
- The forced text never shrinks: when the model writes fewer than 5 tokens after it, the official code rolls
  back into text it had forced before; Aural keeps it, so that committed text stays committed.
- A segment ends once it holds max_segment_s of audio, cut at the quietest 100 ms of its last chunk: its text up
  to there is committed whole and the next segment starts after the cut. The official stream keeps every
  sample, so its cost grows with the square of the stream's length.
There are no word timings (the official streaming has none either): a Commit's start and end are the audio
consumed when the previous commit and this one were made.

A device that fails under a chunk's decode (`Qwen3AsrModel.run`) hands the stream to the CPU: the segment's audio
is encoded and decoded there again from nothing, with its forced text, so nothing committed changes, and a
`DeviceFallback` event says so before the chunk's Partial.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from aural.engine.features import log_mel_spectrogram
from aural.engine.live.streaming import (Commit, DeviceFallback, Error, Metrics, Partial, StreamOptions, live_events,
                                         source_events)
from aural.engine.qwen3asr.model import Qwen3AsrModel
from aural.engine.qwen3asr.text import parse_output
from aural.engine.qwen3asr.transcribe import SAMPLE_RATE, quietest_point

__all__ = ["Qwen3Stream", "Qwen3StreamOptions", "any_live_events", "qwen3_live_events"]

# Text tokens a segment's context holds besides its prompt: the forced text and one chunk's new tokens. A
# segment whose text outgrows it ends there (Qwen3Stream._decode).
TEXT_BUDGET = 1024
# The tower's conv stem takes the mel in chunks of this many frames (2 * n_window; native/qwen3-audio.h).
_STEM_CHUNK_FRAMES = 100


@dataclass(frozen=True)
class Qwen3StreamOptions:
    """How a Qwen3-ASR stream is decoded.

    Attributes:
        chunk_s: audio between two decodes (init_streaming_state's chunk_size_sec).
        unfixed_chunks: the first chunks of a segment are decoded with no forced text (unfixed_chunk_num).
        unfixed_tokens: the last tokens of the text decoded so far that are decoded again (unfixed_token_num).
        max_segment_s: audio a segment holds before it ends at a quiet point of its last chunk.
        max_new_tokens: the most tokens one decode writes: a chunk's text and the unfixed tokens need a few
            dozen; a repetition loop stops there instead of stalling the captions.
        language: a language name to force ("English"), or None to let the model name it.
        context: words to bias towards (the system turn), as in file transcription.
        reuse: keep the unchanged windows' vectors and the prompt head's K/V; False re-encodes and re-decodes
            the whole segment every chunk, as the official code does (the baseline: the same tokens, more work).
    """

    chunk_s: float = 2.0
    unfixed_chunks: int = 2
    unfixed_tokens: int = 5
    max_segment_s: float = 24.0
    max_new_tokens: int = 128
    language: str | None = None
    context: str = ""
    reuse: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.chunk_s < self.max_segment_s:
            raise ValueError(f"chunk_s must be positive and below max_segment_s, got {self.chunk_s}")
        if self.unfixed_chunks < 0 or self.unfixed_tokens < 0 or self.max_new_tokens < 1:
            raise ValueError("unfixed_chunks and unfixed_tokens must be >= 0 and max_new_tokens >= 1")


def qwen3_live_events(model: Qwen3AsrModel, source, options: Qwen3StreamOptions | None = None, *,
                      kv_mode: str = "device", stop: threading.Event | None = None,
                      ) -> Iterator[Partial | Commit | Metrics | Error | DeviceFallback]:
    """Captions of a live source (`capture.MicrophoneSource`, `ReplaySource`, a mix), lazily, as
    `live.streaming.live_events` gives them for Whisper: the source starts on the first iteration and stops at
    the end (`stop` set, the source ended, or the generator closed); a source that cannot start or fails
    yields an Error, and what was heard is decoded and committed either way."""
    stream = Qwen3Stream(model, options, kv_mode=kv_mode)
    if (yield from source_events(source, stop or threading.Event(), stream.feed)):
        yield from stream.finish()


def any_live_events(model, source, options: StreamOptions, *, kv_mode: str = "device",
                    stop: threading.Event | None = None,
                    ) -> Iterator[Partial | Commit | Metrics | Error | DeviceFallback]:
    """A live source's events by the model's own policy, for callers that take either model (the app, `aural
    serve`): Whisper's `live_events` with `options`, or Qwen3-ASR's stream, which takes the options' language
    alone (a code, as the app and the server are given it)."""
    from aural.engine.qwen3asr.model import language_name

    if not isinstance(model, Qwen3AsrModel):
        return live_events(model, source, options, kv_mode=kv_mode, stop=stop)
    language = language_name(options.language) if options.language else None
    return qwen3_live_events(model, source, Qwen3StreamOptions(language=language), kv_mode=kv_mode, stop=stop)


class Qwen3Stream:
    """One live stream on a Qwen3-ASR model: feed() it audio, read the events; finish() at the end.

    Attributes:
        audio_s: seconds of input consumed.
        language: the language of the last decode ("" before any, or when the model named none).
        frames_encoded: mel frames the audio tower has run on, over the stream.
        tokens_decoded: tokens the decoder has run on (prompts, forced text and new tokens), over the stream.
    """

    def __init__(self, model: Qwen3AsrModel, options: Qwen3StreamOptions | None = None, *,
                 kv_mode: str = "device", kv_type: str = "f16"):
        from aural import _native

        self.model, self.options = model, options or Qwen3StreamOptions()
        self._kv = dict(kv_mode=kv_mode, kv_type=kv_type)
        self._chunk = round(self.options.chunk_s * SAMPLE_RATE)
        self._window = model.native.audio_window_frames
        self._window_vectors = model.native.audio_vectors(self._window)
        # Where the audio pads start in every prompt of the stream: the tokens before never change.
        self._head_len = self._prompt(1).index(model.native.audio_token)
        most_frames = int((self.options.max_segment_s + self.options.chunk_s) * SAMPLE_RATE) // 160 + 1
        n_ctx = len(self._prompt(model.native.audio_vectors(most_frames))) + TEXT_BUDGET
        self._ctx = model.new_context(n_ctx=n_ctx, **self._kv)
        self._ctx_tokens = n_ctx
        self._fallbacks: list[DeviceFallback] = []  # not yet reported
        self._context_full = _native.ContextFullError
        self._cost = _StepCost()
        self._pending = np.zeros(0, dtype=np.float32)  # input not yet in a chunk
        self.audio_s = 0.0
        self.language = ""
        self._n_steps = 0
        self._spent_s = 0.0
        self.frames_encoded = self.tokens_decoded = 0
        self._new_segment(0.0)

    # -- input -----------------------------------------------------------------------------------------

    def feed(self, samples: np.ndarray) -> Iterator[Partial | Commit | Metrics]:
        """Takes 16 kHz mono samples; decodes once per full chunk, yielding what changed."""
        self._pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        while len(self._pending) >= self._chunk:
            chunk, self._pending = self._pending[:self._chunk], self._pending[self._chunk:]
            yield from self._step(chunk)

    def finish(self) -> Iterator[Partial | Commit | Metrics]:
        """Decodes what is left (a shorter last chunk, as finish_streaming_transcribe) and commits the rest."""
        tail, self._pending = self._pending, np.zeros(0, dtype=np.float32)
        if len(tail) or len(self._audio):
            yield from self._step(tail, final=True)
        else:
            yield self._metrics(0.0)

    # -- one chunk -------------------------------------------------------------------------------------

    def _step(self, chunk: np.ndarray, *, final: bool = False) -> Iterator[Partial | Commit | Metrics]:
        began = time.perf_counter()
        self._cost = _StepCost()
        self._audio = np.concatenate([self._audio, chunk])
        self.audio_s += len(chunk) / SAMPLE_RATE
        if final:
            yield from self._end_segment(len(self._audio))
        elif len(self._audio) >= self.options.max_segment_s * SAMPLE_RATE:
            yield from self._end_segment(self._quiet_cut(len(chunk)))
        else:
            raw = self._decode(self._audio)
            yield from self._reported()
            yield from self._advance(raw)
        self._n_steps += 1
        self._spent_s += time.perf_counter() - began
        yield self._metrics((time.perf_counter() - began) * 1e3)

    def _advance(self, raw: list[int]) -> Iterator[Partial | Commit]:
        """Takes the segment's decoded ids: the forced text grows (never shrinks), its new words are committed,
        the rest is the partial."""
        self._chunks += 1
        if self._chunks >= self.options.unfixed_chunks:
            forced = raw[:max(0, len(raw) - self.options.unfixed_tokens)]
            while forced and self.model.decode_text(forced).endswith("\ufffd"):  # half a character
                forced = forced[:-1]
            if len(forced) > len(self._forced) and forced[:len(self._forced)] == self._forced:
                self._forced = forced
        committed = self._text(self._forced)
        if len(committed) > len(self._committed):
            yield from self._commit(committed)
        whole = self._text(raw)
        tail = whole[len(self._committed):] if whole.startswith(self._committed) else whole
        yield Partial(text=tail.strip(), audio_end_s=self.audio_s, language=self.language or None)

    def _end_segment(self, cut: int) -> Iterator[Partial | Commit]:
        """Decodes the segment's audio up to `cut` (samples) with its forced text, commits all of it, and starts
        the next segment with the audio after the cut."""
        rest = self._audio[cut:]
        raw = self._decode(self._audio[:cut])
        yield from self._reported()
        committed = self._text(raw)
        if not committed.startswith(self._committed):  # parsed otherwise as a whole (a repetition cut short)
            committed = f"{self._committed} {self.model.decode_text(raw[len(self._forced):])}"
        if len(committed) > len(self._committed):
            yield from self._commit(committed)
        yield Partial(text="", audio_end_s=self.audio_s, language=self.language or None)
        self._new_segment(self.audio_s - len(rest) / SAMPLE_RATE)
        self._audio = rest

    def _commit(self, text: str) -> Iterator[Commit]:
        new = text[len(self._committed):]
        self._committed = text
        if new.strip():
            yield Commit(text=new.strip(), start=self._last_commit_s, end=self.audio_s,
                         language=self.language or None, spaced=new[:1].isspace() or self._first_commit)
            self._first_commit = False
        self._last_commit_s = self.audio_s

    # -- the model -------------------------------------------------------------------------------------

    def _decode(self, audio: np.ndarray) -> list[int]:
        """Greedy ids of the segment's `audio` after its forced text (the forced ids first), on the CPU from
        nothing if the device fails under it."""
        return self.model.run(partial(self._decode_on_model, audio), self._moved_to_cpu)

    def _moved_to_cpu(self, fallback: DeviceFallback) -> None:
        """The device is gone with the context and the tower's vectors it kept: a new context on the CPU, and
        nothing kept."""
        self._ctx = self.model.new_context(n_ctx=self._ctx_tokens, **self._kv)
        self._forget_kept()
        self._fallbacks.append(fallback)

    def _reported(self) -> Iterator[DeviceFallback]:
        yield from self._fallbacks
        self._fallbacks.clear()

    def _decode_on_model(self, audio: np.ndarray) -> list[int]:
        mel = log_mel_spectrogram(audio, 128)
        t = time.perf_counter()
        vectors = self._encode(mel)
        self._cost.encoder_ms += (time.perf_counter() - t) * 1e3
        tokens = self._prompt(len(vectors)) + self._forced
        keep = min(self._unchanged(tokens, vectors), len(tokens) - 1)
        self._ctx.rewind(keep)
        head = self._head_len
        audio_in = vectors[max(0, keep - head):] if keep < head + len(vectors) else None
        generated: list[int] = []
        try:
            logits = self._call(tokens[keep:], audio_in)
            self._fed, self._fed_vectors = list(tokens), vectors
            while (token := int(np.argmax(logits))) not in self.model.eos:
                generated.append(token)
                if len(generated) == self.options.max_new_tokens:
                    break
                logits = self._call([token], None)
                self._fed.append(token)
        except self._context_full:  # the segment's text outgrew TEXT_BUDGET: what was decoded stands
            self._fed = self._fed[:self._ctx.n_past]
        raw = self._forced + generated
        self.language, _ = parse_output(self.model.decode_text(raw), forced_language=self.options.language)
        return raw

    def _call(self, tokens: list[int], audio: np.ndarray | None) -> np.ndarray:
        t = time.perf_counter()
        logits = self._ctx.decode(np.asarray(tokens, dtype=np.int32), audio=audio)
        self.tokens_decoded += len(tokens)
        self._cost.add(self._ctx.last_timings, (time.perf_counter() - t) * 1e3)
        return logits

    def _encode(self, mel: np.ndarray) -> np.ndarray:
        """The tower's vectors of `mel`, re-using those of the windows whose frames are the same as last time
        (a window's vectors depend on its own frames alone; native/qwen3-audio.h)."""
        old, w, n = self._mel, self._window, mel.shape[1]
        same = 0
        while self.options.reuse and (same + 1) * w <= min(n, old.shape[1]) and np.array_equal(mel[:, same * w:(same + 1) * w],
                                                                     old[:, same * w:(same + 1) * w]):
            same += 1
        # A call of under 100 frames is one chunk of its own length, where the whole clip's call pads its short
        # last chunk: start a window earlier then, so that the tail is encoded as in the whole clip.
        if same and n - same * w < _STEM_CHUNK_FRAMES:
            same -= 1
        same = min(same, (n - 1) // w)
        vectors = np.concatenate([self._vectors[:same * self._window_vectors],
                                  self.model.encode_audio(mel[:, same * w:])])
        self.frames_encoded += n - same * w
        self._mel, self._vectors = mel, vectors
        return vectors

    def _unchanged(self, tokens: list[int], vectors: np.ndarray) -> int:
        """How many of `tokens` the context already holds with the same input: tokens equal to what it was fed,
        and the audio pads among them carrying equal vectors."""
        fed = self._fed[:self._ctx.n_past] if self.options.reuse else []
        n = 0
        while n < min(len(tokens), len(fed)) and tokens[n] == fed[n]:
            n += 1
        head, old = self._head_len, self._fed_vectors
        if n > head:
            m = min(n - head, len(vectors), len(old))
            differ = np.flatnonzero(np.any(vectors[:m] != old[:m], axis=1))
            n = min(n, head + (int(differ[0]) if len(differ) else m))
        return n

    def _prompt(self, n_audio: int) -> list[int]:
        return self.model.prompt(n_audio, context=self.options.context, language=self.options.language)

    def _text(self, ids: list[int]) -> str:
        return parse_output(self.model.decode_text(ids), forced_language=self.options.language)[1]

    def _quiet_cut(self, last: int) -> int:
        """Where the segment ends: the quietest 100 ms of its last `last` samples, at its quietest sample."""
        return quietest_point(self._audio, len(self._audio) - last, len(self._audio), default=len(self._audio))

    def _new_segment(self, start_s: float) -> None:
        self._audio = np.zeros(0, dtype=np.float32)
        self._forget_kept()
        self._forced: list[int] = []
        self._committed = ""
        self._chunks = 0
        self._last_commit_s = start_s
        self._first_commit = True

    def _forget_kept(self) -> None:
        """Nothing of the decodes before is reused: no mel windows or tower vectors, no tokens the context holds."""
        self._mel = np.zeros((128, 0), dtype=np.float32)
        self._vectors = self._fed_vectors = np.zeros((0, self.model.native.n_state), dtype=np.float32)
        self._fed: list[int] = []

    def _metrics(self, step_ms: float) -> Metrics:
        cost, stats, calls = self._cost, self._ctx.stats, max(self._cost.calls, 1)
        row_mib = self._ctx.kv_bytes / self._ctx_tokens / 2**20
        return Metrics(
            audio_s=self.audio_s, window_s=len(self._audio) / SAMPLE_RATE, n_steps=self._n_steps, step_ms=step_ms,
            rtf=step_ms / 1e3 / self.options.chunk_s, rtf_mean=self._spent_s / max(self.audio_s, 1e-9),
            encoder_ms=cost.encoder_ms, n_tokens=cost.calls, decode_ms_per_token=cost.decode_ms / calls,
            compute_ms_per_token=cost.compute_ms / calls, kv_io_ms_per_token=cost.kv_io_ms / calls,
            kv_tokens=self._ctx.n_past, kv_capacity_tokens=self._ctx_tokens, kv_mib=self._ctx.n_past * row_mib,
            kv_capacity_mib=self._ctx.kv_bytes / 2**20, graph_builds=stats["graph_builds"],
            graph_reuses=stats["graph_reuses"], first_partial_s=None, commit_lag_s=None, dropped_blocks=0,
            rewrites=0, backend=self.model.backend, device=self.model.device, kv_mode=self._ctx.kv_mode)


@dataclass
class _StepCost:
    """One chunk's costs, for its Metrics (milliseconds; calls: decoder calls, the prompt batch counting one)."""

    encoder_ms: float = 0.0
    decode_ms: float = 0.0
    compute_ms: float = 0.0
    kv_io_ms: float = 0.0
    calls: int = 0

    def add(self, timings: dict, wall_ms: float) -> None:
        self.decode_ms += wall_ms
        self.compute_ms += timings["compute_ms"]
        self.kv_io_ms += timings["kv_io_ms"]
        self.calls += 1
