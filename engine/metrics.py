"""Timings of one transcription: load, encoder, per-token decoder and sampling costs, memory.

`TokenTimer` collects the per-token numbers during decoding; `Timings` aggregates them per run.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import Mapping

__all__ = ["TokenTimer", "Timings", "peak_rss_mb"]

# Per-token native timings read from `Context.last_timings` after each decode call.
_NATIVE_KEYS = ("compute_ms", "kv_io_ms", "kv_io_bytes", "logits_ms")


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


@dataclass
class TokenTimer:
    """Running sums over decode calls, one call per sampled token (the prompt batch counts once).

    Attributes:
        n_calls: decode calls recorded.
        n_tokens: tokens fed to the decoder (a prompt batch counts all its tokens).
        compute_ms: summed native graph compute time.
        kv_io_ms: summed time moving KV rows between host and device (0 in device KV mode).
        kv_io_bytes: summed bytes moved for KV rows.
        logits_ms: summed time reading logits back.
        sampling_ms: summed Python-side time filtering logits and picking the token.
        reused_calls: decode calls that reused a cached decoder graph.
        prefill_calls: the calls among them that fed a window's initial sequence (the SOT tokens and the
            prompt: up to 224 previous-text tokens at once) rather than one sampled token per sequence.
        prefill_tokens: tokens those calls fed.
        prefill_compute_ms: their summed native compute time (part of compute_ms).
        draft_tokens: draft tokens fed after a sampled token (DecodingOptions.draft; part of n_tokens).
        draft_accepted: those whose rows gave the next sampled token: each saved a decode call.
    """

    n_calls: int = 0
    n_tokens: int = 0
    compute_ms: float = 0.0
    kv_io_ms: float = 0.0
    kv_io_bytes: float = 0.0
    logits_ms: float = 0.0
    sampling_ms: float = 0.0
    reused_calls: int = 0
    prefill_calls: int = 0
    prefill_tokens: int = 0
    prefill_compute_ms: float = 0.0
    draft_tokens: int = 0
    draft_accepted: int = 0

    def add_call(self, timings: Mapping[str, float], *, prefill: bool = False) -> None:
        """Adds one `Context.last_timings` dict; `prefill` marks a window's initial-sequence call."""
        self.n_calls += 1
        n_tokens = int(timings.get("n_tokens", 1))
        self.n_tokens += n_tokens
        self.reused_calls += int(bool(timings.get("reused", False)))
        for key in _NATIVE_KEYS:
            setattr(self, key, getattr(self, key) + float(timings.get(key, 0.0)))
        if prefill:
            self.prefill_calls += 1
            self.prefill_tokens += n_tokens
            self.prefill_compute_ms += float(timings.get("compute_ms", 0.0))

    def add_sampling(self, seconds: float) -> None:
        self.sampling_ms += seconds * 1000.0

    def merge(self, other: "TokenTimer") -> None:
        for key in self.__dataclass_fields__:
            setattr(self, key, getattr(self, key) + getattr(other, key))


@dataclass
class Timings:
    """Where the time of one transcription went. Complete once its segments have all been read.

    Attributes:
        load_s: model load time (from `WhisperModel.load_s`).
        audio_s: seconds of audio transcribed.
        wall_s: wall time from the start of transcription to its last segment.
        rtf: real-time factor, wall_s / audio_s (below 1 is faster than real time).
        n_windows: windows encoded (each up to 30 s of audio).
        encoder_ms: mean encoder time per window.
        encoder_ms_list: encoder time of each window, in order.
        encoder_frames_list: mel frames each window was encoded with, in order (3000 = the full 30 s;
            fewer for a shortened context, see TranscribeOptions.audio_ctx).
        n_decode_calls: decoder calls, one per sampled token plus one prompt batch per attempt.
        n_tokens: tokens fed to the decoder.
        compute_ms: mean native compute time per decode call (per token), prefill calls included.
        step_compute_ms: mean native compute time per sampling step (one new token per sequence): the
            decoder's per-token cost, without the prefill calls that feed a window's prompt at once.
        n_prefill_calls: the decode calls that fed a window's initial sequence (one per attempt).
        prefill_ms: mean native compute time per prefill call.
        prefill_tokens: mean tokens per prefill call (SOT sequence plus prompt).
        kv_io_ms: mean host<->device KV transfer time per decode call.
        kv_io_bytes: mean KV bytes moved per decode call (0 when the KV cache lives on the device).
        logits_ms: mean logits read-back time per decode call.
        sampling_ms: mean Python-side logit filtering and sampling time per decode call.
        graph_builds: decoder graphs built (native stats).
        graph_reuses: decoder graphs reused (native stats).
        kv_capacity_tokens: KV arena capacity in tokens.
        kv_bytes: KV arena size in bytes.
        backend: primary ggml backend.
        device: device the model runs on.
        kv_mode: "device" or "host".
        peak_rss_mb: peak resident memory of the process, MiB.
    """

    load_s: float = 0.0
    audio_s: float = 0.0
    wall_s: float = 0.0
    rtf: float = 0.0
    n_windows: int = 0
    encoder_ms: float = 0.0
    encoder_ms_list: list[float] = field(default_factory=list)
    encoder_frames_list: list[int] = field(default_factory=list)
    n_decode_calls: int = 0
    n_tokens: int = 0
    compute_ms: float = 0.0
    step_compute_ms: float = 0.0
    n_prefill_calls: int = 0
    prefill_ms: float = 0.0
    prefill_tokens: float = 0.0
    kv_io_ms: float = 0.0
    kv_io_bytes: float = 0.0
    logits_ms: float = 0.0
    sampling_ms: float = 0.0
    graph_builds: int = 0
    graph_reuses: int = 0
    kv_capacity_tokens: int = 0
    kv_bytes: int = 0
    backend: str = ""
    device: str = ""
    kv_mode: str = ""
    peak_rss_mb: float = 0.0

    def add_window(self, encoder_ms: float, frames: int) -> None:
        self.encoder_ms_list.append(float(encoder_ms))
        self.encoder_frames_list.append(int(frames))
        self.n_windows = len(self.encoder_ms_list)
        self.encoder_ms = sum(self.encoder_ms_list) / self.n_windows

    def finish(self, *, audio_s: float, wall_s: float, tokens: TokenTimer,
               stats: Mapping[str, float]) -> None:
        """Fills the totals from the run's token sums and the native context's `stats`."""
        self.audio_s = audio_s
        self.wall_s = wall_s
        self.rtf = wall_s / audio_s if audio_s > 0 else 0.0
        self.n_decode_calls = tokens.n_calls
        self.n_tokens = tokens.n_tokens
        calls = max(tokens.n_calls, 1)
        for key in (*_NATIVE_KEYS, "sampling_ms"):
            setattr(self, key, getattr(tokens, key) / calls)
        steps = tokens.n_calls - tokens.prefill_calls
        self.step_compute_ms = (tokens.compute_ms - tokens.prefill_compute_ms) / steps if steps > 0 else 0.0
        self.n_prefill_calls = tokens.prefill_calls
        prefills = max(tokens.prefill_calls, 1)
        self.prefill_ms = tokens.prefill_compute_ms / prefills
        self.prefill_tokens = tokens.prefill_tokens / prefills
        for key in ("graph_builds", "graph_reuses", "kv_capacity_tokens", "kv_bytes"):
            setattr(self, key, int(stats.get(key, 0)))
        self.peak_rss_mb = peak_rss_mb()

    def to_dict(self) -> dict:
        return asdict(self)
