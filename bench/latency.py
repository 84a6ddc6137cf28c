"""Live captioning latency: how long after a word is spoken it shows up tentatively, and when it is committed.

Each English dev clip is replayed through `ReplaySource` at `--speed` (1.0: real-time pace, as from a
microphone) into `streaming.live_events`. Word end times come from an offline run of the same clip
(`transcribe`): each segment's [start, end] timestamps, spread over its words by character count (no
forced alignment). A streamed word is matched to an offline word by aligning the two word sequences;
its latencies are

- partial: wall time of the first Partial that shows the word at its final position, minus the wall
  time at which the replay "spoke" the word's end (the earlier of that and its commit, when a word was
  committed without being shown first, e.g. at the end of the stream);
- commit: wall time of the Commit containing it, minus the same.

- final: wall time of the last Commit minus the spoken end of the clip's last word: end of utterance to
  final text. Each clip is followed by `--tail-s` of silence (default 3 s) before the replay ends, so that
  the final text comes from the pause commit, as from a microphone, not from the end of the stream.

Steadiness: rewrites per minute of audio, the tentative words a viewer saw replaced or dropped
(`Metrics.rewrites`, which tests/test_streaming.py recounts from the events).

`--policy` (local-agreement, alignatt), `--frames` (StreamOptions.alignatt_frames), `--audio-ctx`, `--step`,
`--hold` (StreamOptions.hold_steps), `--commit-after` (min_silence_commit_s), `--pause-step` (1/0),
`--margin` (commit_margin_s), `--agree-gap` (agree_gap_s), `--beam` (beam_size), `--prompt-ts`
(prompt_timestamps) and `--draft` (draft, 1/0) take
comma-separated values; every combination is a configuration, and
the configurations are interleaved clip by clip (each clip runs them all, starting with a different one
each time), so that a shared machine's changing load falls on all of them alike. The 1-minute load
average is recorded before every run. The offline transcription is made once per clip.

`--long-minutes N` also streams the dev clips concatenated to N minutes at speed 0 with the first
configuration (throughput and memory: RSS after model load and at the end, RTF, WER). Runs under the
project venv (.venv), since it imports Aural. Writes bench/results/latency.json and latency.md.

`--source system` plays each clip into a private PulseAudio daemon's null sink and captions the sink's monitor
(tests/audio_harness.VirtualMic), the path of captioning what the computer plays, at real-time pace.

Usage: .venv/bin/python bench/latency.py [--speed 1.0] [--policy local-agreement,alignatt] [--frames 15,25]
       [--audio-ctx auto,full] [--step 1.0,0.5] [--hold 0,1] [--commit-after 2.0,0.5] [--pause-step 0,1]
       [--tail-s 3] [--source replay|system] [--threads 1] [--clips a.wav,b.flac] [--long-minutes 10]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from difflib import SequenceMatcher
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, english_dev_clips, fmt, machine_info, md_table, word_errors  # noqa: E402

from aural.engine.audio import load_audio  # noqa: E402
from aural.engine.live.capture import MicrophoneSource, ReplaySource  # noqa: E402
from aural.engine.live.streaming import Commit, Metrics, Partial, StreamOptions, live_events  # noqa: E402
from aural.engine.models.store import resolve_model  # noqa: E402
from aural.engine.runtime import WhisperModel  # noqa: E402
from aural.engine.transcribe import transcribe  # noqa: E402

logger = logging.getLogger("bench.latency")

TIMING_SOURCE = ("offline segment timestamps (transcribe, tiny.en), each word's end linearly interpolated "
                 "by character count inside its segment; no forced alignment")
SAMPLE_RATE = 16000
GAP_S = 0.3  # silence between clips in the long run


@dataclass
class ClipResult:
    """Latencies and costs of one replayed clip.

    Attributes:
        name: the clip's file name.
        duration_s: seconds of audio.
        words: offline words.
        matched: offline words matched to a streamed word.
        partial_s: per matched word, seconds from its spoken end to its first showing.
        commit_s: per matched word, seconds from its spoken end to its commit.
        final_s: seconds from the spoken end of the clip's last word to the last commit (None: nothing
            committed).
        reference_words: words of the (normalised) reference transcript.
        errors_offline: word errors of the offline transcript against the reference.
        errors_stream: word errors of the concatenated commits against the reference.
        rtf_mean: streaming processing time over audio (from the last Metrics).
        first_partial_s: wall seconds from the first speech read to the first partial.
        n_steps: decode steps.
        dropped_blocks: audio blocks the replay ring dropped.
        rewrites: shown tentative words later replaced or dropped (Metrics.rewrites).
        encoder_ms: mean encoder time per decode step.
        step_ms: mean wall time per decode step (mel, encoder, decoder, agreement).
        tokens_per_step: mean decoder calls per decode step.
        decode_ms_per_token: mean decoder wall time per token (compute, KV/IO, logits, sampling;
            Metrics.decode_ms_per_token).
        decode_ms_per_step: mean decoder wall time per decode step (the same, over all its calls).
        draft_fed_per_step: mean tokens of the previous hypothesis fed ahead per step (StreamOptions.draft).
        draft_kept_per_step: mean of those sampled per step: decoder calls saved.
        loadavg_1m: the machine's 1-minute load average when the run started.
        text_stream: the concatenated commits, to read what the errors were.
    """

    name: str
    duration_s: float
    words: int
    matched: int = 0
    partial_s: list[float] = field(default_factory=list)
    commit_s: list[float] = field(default_factory=list)
    final_s: float | None = None
    reference_words: int = 0
    errors_offline: int = 0
    errors_stream: int = 0
    rtf_mean: float = 0.0
    first_partial_s: float | None = None
    n_steps: int = 0
    dropped_blocks: int = 0
    rewrites: int = 0
    encoder_ms: float = 0.0
    step_ms: float = 0.0
    tokens_per_step: float = 0.0
    decode_ms_per_token: float = 0.0
    decode_ms_per_step: float = 0.0
    draft_fed_per_step: float = 0.0
    draft_kept_per_step: float = 0.0
    loadavg_1m: float = 0.0
    text_stream: str = ""


@dataclass(frozen=True)
class Config:
    """One streaming configuration under test: its name in the report and its options."""

    name: str
    options: StreamOptions


@dataclass(frozen=True)
class Offline:
    """The offline transcription of a clip: words, each word's estimated end, the text."""

    words: list[str]
    ends: list[float]
    text: str


def _key(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum() or c == "'")


def audio_path(clip) -> Path:
    """The clip's file; for headerless PCM, its WAV copy (a replay reads only files with a header)."""
    return clip.path.with_suffix(".16k.wav") if clip.raw_pcm else clip.path


def offline_words(model: WhisperModel, path: Path) -> Offline:
    """The offline transcription's words with the estimated end time of each."""
    texts, ends = [], []
    for segment in transcribe(model, path):
        seg_words = segment.text.split()
        total = max(1, sum(len(w) for w in seg_words))
        done = 0
        for w in seg_words:
            done += len(w)
            texts.append(w)
            ends.append(segment.start + (segment.end - segment.start) * done / total)
    return Offline(texts, ends, " ".join(texts))


class Replay:
    """Streams a file through ReplaySource at `speed`."""

    label = "replay"

    def __init__(self, speed: float):
        self.speed = speed

    def __call__(self, model: WhisperModel, path: Path, options: StreamOptions) -> tuple[list, float]:
        """(timed events as (wall time, event), wall time of the replay's sample 0)."""
        source = ReplaySource(path, speed=self.speed)
        timed = [(time.monotonic(), event) for event in live_events(model, source, options)]
        return timed, source.clock_start


class _SignalledSource(MicrophoneSource):
    """A capture that says when it has started, so that playback begins only once it listens."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.started = threading.Event()

    def start(self) -> None:
        super().start()
        self.started.set()


class SystemAudio:
    """Plays a file into a private PulseAudio daemon's null sink and captions the sink's monitor, the path of
    `aural live --device <monitor>` captioning what the computer plays (tests/audio_harness.VirtualMic). The
    clock starts when paplay is launched, so the player's start-up and the server's buffering (20 ms
    requested) count as latency, as they would for a user."""

    label = "system audio (paplay into a null sink, captured from its monitor)"
    speed = 1.0
    DRAIN_S = 0.5  # capture kept open after the player ends, for the server's and the ring's buffers

    def __init__(self, mic):
        self.mic = mic

    def __call__(self, model: WhisperModel, path: Path, options: StreamOptions) -> tuple[list, float]:
        source = _SignalledSource(server_source="vsink.monitor")
        stop = threading.Event()
        timed: list = []

        def consume() -> None:
            timed.extend((time.monotonic(), event) for event in live_events(model, source, options, stop=stop))

        worker = threading.Thread(target=consume, name="latency-system-audio")
        worker.start()
        try:
            if not source.started.wait(15):
                raise RuntimeError("the monitor capture did not start in 15 s")
            clock_start = time.monotonic()
            player = subprocess.run(["paplay", "--device=vsink", "--latency-msec=20", str(path)], env=self.mic.env,
                                    timeout=600)
            if player.returncode:
                raise RuntimeError(f"paplay failed with {player.returncode}")
            time.sleep(self.DRAIN_S)
        finally:
            stop.set()
            worker.join()
        return timed, clock_start


def word_times(timed: list) -> tuple[list[str], list[float], list[float]]:
    """Streamed words in commit order, with each one's first showing and commit wall times."""
    committed: list[str] = []
    commit_at: list[float] = []
    shown: dict[int, list[tuple[str, float]]] = {}  # position -> (key, wall time) of tentative showings
    for wall, event in timed:
        if isinstance(event, Partial):
            for i, w in enumerate(event.text.split()):
                shown.setdefault(len(committed) + i, []).append((_key(w), wall))
        elif isinstance(event, Commit):
            for w in event.text.split():
                committed.append(w)
                commit_at.append(wall)
    first = [min([t for k, t in shown.get(j, []) if k == _key(w)] + [commit_at[j]])
             for j, w in enumerate(committed)]
    return committed, first, commit_at


def with_tail(clip, tail_s: float, folder: Path) -> Path:
    """The clip followed by `tail_s` of silence, as a WAV in `folder` (the clip's own file when 0)."""
    if not tail_s:
        return audio_path(clip)
    path = folder / f"{clip.path.stem}-tail.wav"
    samples = load_audio(audio_path(clip))
    sf.write(path, np.concatenate([samples, np.zeros(round(tail_s * SAMPLE_RATE), np.float32)]), SAMPLE_RATE,
             subtype="FLOAT")
    return path


def measure_clip(model: WhisperModel, clip, replay: Path, offline: Offline, streamer,
                 options: StreamOptions) -> ClipResult:
    result = ClipResult(clip.name, clip.duration_s, len(offline.words), loadavg_1m=os.getloadavg()[0])
    timed, clock_start = streamer(model, replay, options)
    speed = streamer.speed
    streamed, first, committed_at = word_times(timed)
    blocks = SequenceMatcher(None, [_key(w) for w in offline.words], [_key(w) for w in streamed], autojunk=False)
    for block in blocks.get_matching_blocks():
        for i, j in zip(range(block.a, block.a + block.size), range(block.b, block.b + block.size)):
            spoken = clock_start + offline.ends[i] / speed
            result.partial_s.append(first[j] - spoken)
            result.commit_s.append(committed_at[j] - spoken)
    result.matched = len(result.commit_s)
    if committed_at and offline.ends:
        result.final_s = max(committed_at) - (clock_start + offline.ends[-1] / speed)
    result.errors_offline, result.reference_words = word_errors(clip.reference, offline.text)
    result.text_stream = " ".join(streamed)
    result.errors_stream, _ = word_errors(clip.reference, result.text_stream)
    _add_costs(result, [e for _, e in timed if isinstance(e, Metrics)])
    return result


def _wer(reference: str, hypothesis: str) -> float:
    errors, n = word_errors(reference, hypothesis)
    return errors / n if n else float("nan")


def _add_costs(result: ClipResult, metrics: list[Metrics]) -> None:
    last = metrics[-1]
    result.rtf_mean = last.rtf_mean
    result.first_partial_s = last.first_partial_s
    result.n_steps = last.n_steps
    result.dropped_blocks = last.dropped_blocks
    result.rewrites = last.rewrites
    decoded = [m for m in metrics if m.n_tokens]
    if decoded:
        result.encoder_ms = float(np.mean([m.encoder_ms for m in decoded]))
        result.step_ms = float(np.mean([m.step_ms for m in decoded]))
        result.tokens_per_step = float(np.mean([m.n_tokens for m in decoded]))
        result.decode_ms_per_token = float(np.mean([m.decode_ms_per_token for m in decoded]))
        result.decode_ms_per_step = float(np.mean([m.decode_ms_per_token * m.tokens_given for m in decoded]))
        result.draft_fed_per_step = float(np.mean([m.draft_tokens for m in decoded]))
        result.draft_kept_per_step = float(np.mean([m.draft_accepted for m in decoded]))


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None}
    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90))}


# -- the encoder alone -----------------------------------------------------------------------------

ENCODER_FRAMES = (200, 400, 800, 1500, 3000)  # mel frames: 2, 4, 8, 15 and 30 s of audio context


def encoder_costs(model: WhisperModel, repeats: int = 5) -> dict:
    """Median native encoder ms per context length, and the cost of rebuilding the encoder graph.

    The rebuild cost is measured on 20-22 frames, where the compute is small: alternating two lengths
    rebuilds the graph on every call, repeating one reuses it; the difference of medians is the rebuild.
    """
    ctx = model.new_session()
    mel = np.random.default_rng(0).normal(size=(model.n_mels, 3000)).astype(np.float32)

    def encode_ms(frames: int) -> float:
        ctx.encode(np.ascontiguousarray(mel[:, :frames]))
        return float(ctx.last_encode["encoder_ms"])

    by_frames = {}
    for frames in ENCODER_FRAMES:
        encode_ms(frames)  # builds this length's graph
        by_frames[frames] = float(np.median([encode_ms(frames) for _ in range(repeats)]))
    reused = [encode_ms(20) for _ in range(2 * repeats)]
    rebuilt = [encode_ms(20 + 2 * (i % 2)) for i in range(2 * repeats)]
    return {"encoder_ms": by_frames, "rebuild_ms": float(np.median(rebuilt) - np.median(reused)),
            "loadavg_1m": os.getloadavg()[0]}


# -- the long run ----------------------------------------------------------------------------------


def rss_mb() -> float:
    """Current resident set size (VmRSS) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def long_audio(clips, minutes: float, folder: Path) -> tuple[Path, str]:
    """The clips cycled with GAP_S of silence between them up to `minutes`, as a WAV, and its reference."""
    pieces, refs, total = [], [], 0
    gap = np.zeros(round(GAP_S * SAMPLE_RATE), dtype=np.float32)
    while total < minutes * 60 * SAMPLE_RATE:
        for clip in clips:
            samples = load_audio(audio_path(clip))
            pieces += [samples, gap]
            refs.append(clip.reference)
            total += samples.size + gap.size
            if total >= minutes * 60 * SAMPLE_RATE:
                break
    path = folder / f"dev-{minutes:g}min.wav"
    sf.write(path, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    return path, " ".join(refs)


def measure_long(model: WhisperModel, clips, minutes: float, options: StreamOptions) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path, reference = long_audio(clips, minutes, Path(folder))
        offline = " ".join(segment.text for segment in transcribe(model, path))
        rss_start = rss_mb()
        started = time.perf_counter()
        events = list(live_events(model, ReplaySource(path, speed=0), options))
        wall = time.perf_counter() - started
    last = [e for e in events if isinstance(e, Metrics)][-1]
    text = " ".join(e.text for e in events if isinstance(e, Commit))
    windows = [e.window_s for e in events if isinstance(e, Metrics)]
    return {"minutes": minutes, "audio_s": last.audio_s, "wall_s": wall, "rtf": wall / last.audio_s,
            "n_steps": last.n_steps, "rss_start_mb": rss_start, "rss_end_mb": rss_mb(),
            "peak_rss_mb": last.peak_rss_mb, "max_window_s": max(windows), "wer_offline": _wer(reference, offline),
            "wer_stream": _wer(reference, text),
            "dropped_blocks": last.dropped_blocks, "graph_builds": last.graph_builds,
            "graph_reuses": last.graph_reuses}


# -- report ----------------------------------------------------------------------------------------

_CLIP_HEADER = ("clip", "audio s", "words matched", "partial p50 s", "partial p90 s", "commit p50 s", "commit p90 s",
                "final s", "RTF", "first partial s", "encoder ms", "step ms", "tokens/step", "rewrites", "dropped",
                "load 1m", "WER offline %", "WER stream %")
_SUMMARY_HEADER = ("config", "policy", "audio ctx", "step s", "hold steps", "pause commit s", "pause step",
                   "partial p50 s", "partial p90 s", "commit p50 s", "commit p90 s", "final p50 s", "final p90 s",
                   "rewrites/min", "first partial s", "RTF", "encoder ms/step", "step ms", "tokens/step",
                   "decode ms/token", "decode ms/step", "draft fed/kept per step", "dropped", "load 1m",
                   "WER offline %", "WER stream %")


def _clip_row(r: dict) -> tuple:
    partial, commit = percentiles(r["partial_s"]), percentiles(r["commit_s"])
    return (r["name"], fmt(r["duration_s"], 1), f"{r['matched']}/{r['words']}", fmt(partial["p50"]),
            fmt(partial["p90"]), fmt(commit["p50"]), fmt(commit["p90"]), fmt(r.get("final_s")), fmt(r["rtf_mean"]),
            fmt(r["first_partial_s"]), fmt(r["encoder_ms"], 0), fmt(r["step_ms"], 0), fmt(r["tokens_per_step"], 1),
            r.get("rewrites", "-"), r["dropped_blocks"], fmt(r["loadavg_1m"], 1),
            fmt(_percent(r["errors_offline"], r["reference_words"]), 1),
            fmt(_percent(r["errors_stream"], r["reference_words"]), 1))


def _summary_row(config: dict) -> tuple:
    s, o = config["summary"], config["options"]
    # Runs before hold_steps existed showed every hypothesis as it came (0) and counted no rewrites; runs
    # before pause_step existed decoded only every step_s, ended each clip with the stream (no final).
    final = s.get("final", {"p50": None, "p90": None})
    policy = o.get("policy", "local-agreement")
    if policy == "alignatt":
        policy += f" (f {o['alignatt_frames']})"
    return (config["name"], policy, o["audio_ctx"], o["step_s"], o.get("hold_steps", 0),
            o.get("min_silence_commit_s", 2.0), int(o.get("pause_step", False)), fmt(s["partial"]["p50"]),
            fmt(s["partial"]["p90"]),
            fmt(s["commit"]["p50"]), fmt(s["commit"]["p90"]), fmt(final["p50"]), fmt(final["p90"]),
            fmt(s.get("rewrites_per_min"), 1),
            fmt(s["first_partial_median_s"]), fmt(s["rtf_mean"]), fmt(s["encoder_ms"], 0), fmt(s["step_ms"], 0),
            fmt(s["tokens_per_step"], 1), fmt(s["decode_ms_per_token"], 1), fmt(s.get("decode_ms_per_step"), 0),
            _draft_cell(s), s["dropped_blocks"],
            fmt(s["loadavg_1m"], 1), fmt(s["wer_offline"] * 100, 1), fmt(s["wer_stream"] * 100, 1))


def _draft_cell(s: dict) -> str:
    if s.get("draft_fed_per_step") is None:  # runs before drafts
        return "-"
    return f"{fmt(s['draft_fed_per_step'], 1)} / {fmt(s['draft_kept_per_step'], 1)}"


def markdown(report: dict) -> str:
    parts = [f"# Live captioning latency ({report['model']}, {report['device']}, {report['threads'] or 'auto'} "
             f"threads, speed {report['speed']})", "",
             f"Source: {report.get('source', 'replay')}; {report.get('tail_s', 0):g} s of silence after each clip "
             "(final: the last word's spoken end to the last commit).", "",
             f"Word end times: {TIMING_SOURCE}. Latencies are over every matched word of every clip; encoder, "
             "step and token figures are means over decode steps (clip means, weighted by audio); load 1m is the "
             "mean 1-minute load average at the start of the runs. Configurations ran interleaved, clip by clip.",
             "", md_table(_SUMMARY_HEADER, [_summary_row(c) for c in report["configs"]]), "",
             f"Machine: {report['machine']}"]
    for config in report["configs"]:
        rows = [_clip_row(r) for r in config["clips"]]
        parts += ["", f"## {config['name']}", "", md_table(_CLIP_HEADER, rows)]
    for earlier in report.get("earlier_runs", []):
        parts += ["", f"## Earlier run ({earlier['threads'] or 'auto'} threads, speed {earlier['speed']}, "
                  f"{len(earlier['configs'][0]['clips'])} clips, {earlier.get('source', 'replay')}, "
                  f"{earlier.get('tail_s', 0):g} s of silence after each)", "",
                  md_table(_SUMMARY_HEADER, [_summary_row(c) for c in earlier["configs"]]), "",
                  f"Machine: {earlier['machine']}"]
    if report.get("encoder"):
        enc = report["encoder"]
        parts += ["", "## Encoder cost by audio context", "",
                  f"Median native encoder ms over repeated runs (load 1m {enc['loadavg_1m']:.1f}); rebuilding the "
                  f"encoder graph for a new length costs {enc['rebuild_ms']:.1f} ms.", "",
                  md_table(("mel frames", "context s", "encoder ms"),
                           [(f, fmt(int(f) / 100, 0), fmt(ms, 0)) for f, ms in enc["encoder_ms"].items()])]
    if report.get("long"):
        lr = report["long"]
        parts += ["", f"## {lr['minutes']:g} minutes of dev clips at speed 0 ({report['configs'][0]['name']})", "",
                  md_table(("audio s", "wall s", "RTF", "steps", "RSS start MiB", "RSS end MiB", "peak RSS MiB",
                            "max window s", "WER offline %", "WER stream %", "dropped"),
                           [(fmt(lr["audio_s"], 0), fmt(lr["wall_s"], 0), fmt(lr["rtf"]), lr["n_steps"],
                             fmt(lr["rss_start_mb"], 0), fmt(lr["rss_end_mb"], 0), fmt(lr["peak_rss_mb"], 0),
                             fmt(lr["max_window_s"], 1), fmt(lr["wer_offline"] * 100, 1),
                             fmt(lr["wer_stream"] * 100, 1), lr["dropped_blocks"])])]
    return "\n".join(parts) + "\n"


def _weighted(results: list[ClipResult], attr: str) -> float:
    """Mean of a per-clip figure weighted by audio length, over the clips that have it."""
    having = [r for r in results if getattr(r, attr)]
    return sum(getattr(r, attr) * r.duration_s for r in having) / max(1e-9, sum(r.duration_s for r in having))


def summarize(results: list[ClipResult]) -> dict:
    partial = [v for r in results for v in r.partial_s]
    commit = [v for r in results for v in r.commit_s]
    reference_words = sum(r.reference_words for r in results)
    return {
        "audio_s": sum(r.duration_s for r in results), "words": sum(r.words for r in results),
        "matched": sum(r.matched for r in results), "partial": percentiles(partial), "commit": percentiles(commit),
        "final": percentiles([r.final_s for r in results if r.final_s is not None]),
        "rtf_mean": _weighted(results, "rtf_mean"),
        "first_partial_median_s": float(np.median([r.first_partial_s for r in results if r.first_partial_s])),
        "encoder_ms": _weighted(results, "encoder_ms"), "step_ms": _weighted(results, "step_ms"),
        "tokens_per_step": _weighted(results, "tokens_per_step"),
        "decode_ms_per_token": _weighted(results, "decode_ms_per_token"),
        "decode_ms_per_step": _weighted(results, "decode_ms_per_step"),
        "draft_fed_per_step": _weighted(results, "draft_fed_per_step"),
        "draft_kept_per_step": _weighted(results, "draft_kept_per_step"),
        "loadavg_1m": float(np.mean([r.loadavg_1m for r in results])),
        "dropped_blocks": sum(r.dropped_blocks for r in results),
        "rewrites_per_min": sum(r.rewrites for r in results) / (sum(r.duration_s for r in results) / 60),
        # Errors over reference words, across all clips.
        "wer_offline": sum(r.errors_offline for r in results) / reference_words,
        "wer_stream": sum(r.errors_stream for r in results) / reference_words,
    }


def _percent(errors: int, words: int) -> float | None:
    return 100 * errors / words if words else None


def configs_of(policies: str, frames: str, audio_ctx: str, steps: str, holds: str, commit_after: str,
               pause_steps: str, margins: str = "0", gaps: str = "0", beams: str = "1",
               prompt_ts: str = str(int(StreamOptions.prompt_timestamps)), drafts: str = "1") -> list[Config]:
    """Every (policy, AlignAtt frames, audio context, step, hold, pause commit, pause step, commit margin,
    agreement gap, beams, prompt timestamps, drafts) combination, named like
    "alignatt-f25/auto/0.5/hold1/c0.5/pause1" (frames only vary AlignAtt; a margin adds "/g0.5", a gap "/a1.0",
    beams "/b5", a prompt layout other than the default's "/p0" or "/p1", decoding without drafts "/d0")."""
    configs = []
    for policy, ctx, step, hold, after, pause, margin, gap, beam, stamped, draft in itertools.product(
            policies.split(","), audio_ctx.split(","), steps.split(","), holds.split(","), commit_after.split(","),
            pause_steps.split(","), margins.split(","), gaps.split(","), beams.split(","), prompt_ts.split(","),
            drafts.split(",")):
        for f in frames.split(",") if policy == "alignatt" else [frames.split(",")[0]]:
            name = f"{policy}-f{int(f)}" if policy == "alignatt" else policy
            suffix = ((f"/g{float(margin)!r}" if float(margin) else "") + (f"/a{float(gap)!r}" if float(gap) else "")
                      + (f"/b{int(beam)}" if int(beam) > 1 else "")
                      + (f"/p{int(stamped)}" if bool(int(stamped)) != StreamOptions.prompt_timestamps else "")
                      + ("" if int(draft) else "/d0"))
            configs.append(Config(f"{name}/{ctx}/{float(step)!r}/hold{int(hold)}/c{float(after)!r}/pause{int(pause)}"
                                  f"{suffix}",
                                  StreamOptions(policy=policy, alignatt_frames=int(f), audio_ctx=ctx,
                                                step_s=float(step), hold_steps=int(hold),
                                                min_silence_commit_s=float(after), pause_step=bool(int(pause)),
                                                commit_margin_s=float(margin), agree_gap_s=float(gap),
                                                beam_size=int(beam), prompt_timestamps=bool(int(stamped)),
                                                draft=bool(int(draft)))))
    return configs


def run_interleaved(model: WhisperModel, clips, configs: list[Config], streamer,
                    tail_s: float) -> dict[str, list[ClipResult]]:
    """Each clip under every configuration, the starting configuration rotating from clip to clip."""
    results: dict[str, list[ClipResult]] = {c.name: [] for c in configs}
    for k, clip in enumerate(clips):
        offline = offline_words(model, audio_path(clip))
        with tempfile.TemporaryDirectory() as folder:
            replay = with_tail(clip, tail_s, Path(folder))
            for config in configs[k % len(configs):] + configs[:k % len(configs)]:
                r = measure_clip(model, clip, replay, offline, streamer, config.options)
                results[config.name].append(r)
                logger.info("%s %s: partial p50 %s s, commit p50 %s s, final %s s, RTF %.2f, encoder %.0f ms, "
                            "errors offline %d stream %d of %d words, load %.1f", config.name, clip.name,
                            fmt(percentiles(r.partial_s)["p50"]), fmt(percentiles(r.commit_s)["p50"]),
                            fmt(r.final_s), r.rtf_mean, r.encoder_ms, r.errors_offline, r.errors_stream,
                            r.reference_words, r.loadavg_1m)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--speed", type=float, default=1.0, help="replay pace (1.0 real time; 0 as fast as decoded)")
    p.add_argument("--step", default="1.0", help="StreamOptions.step_s, comma-separated values to compare")
    p.add_argument("--audio-ctx", default="auto", help="StreamOptions.audio_ctx, comma-separated: auto,full")
    p.add_argument("--policy", default=StreamOptions.policy, help="StreamOptions.policy, comma-separated")
    p.add_argument("--frames", default=str(StreamOptions.alignatt_frames),
                   help="StreamOptions.alignatt_frames (encoder positions of 20 ms), comma-separated")
    p.add_argument("--hold", default=str(StreamOptions.hold_steps),
                   help="StreamOptions.hold_steps, comma-separated values to compare")
    p.add_argument("--commit-after", default=str(StreamOptions.min_silence_commit_s),
                   help="StreamOptions.min_silence_commit_s (pause that commits the tail), comma-separated")
    p.add_argument("--pause-step", default=str(int(StreamOptions.pause_step)),
                   help="StreamOptions.pause_step (1: decode when the speech gate closes), comma-separated 1,0")
    p.add_argument("--margin", default=str(StreamOptions.commit_margin_s),
                   help="StreamOptions.commit_margin_s (LocalAgreement commits words ending this long before the "
                   "newest audio), comma-separated")
    p.add_argument("--agree-gap", default=str(StreamOptions.agree_gap_s),
                   help="StreamOptions.agree_gap_s (LocalAgreement against the hypothesis this much audio older), "
                        "comma-separated")
    p.add_argument("--beam", default=str(StreamOptions.beam_size),
                   help="StreamOptions.beam_size (1: greedy), comma-separated")
    p.add_argument("--prompt-ts", default=str(int(StreamOptions.prompt_timestamps)),
                   help="StreamOptions.prompt_timestamps (1: the prompt's sentences between timestamps; 0: bare "
                        "text), comma-separated")
    p.add_argument("--draft", default=str(int(StreamOptions.draft)),
                   help="StreamOptions.draft (1: greedy decodes check the last hypothesis' tokens in batches), "
                        "comma-separated 1,0")
    p.add_argument("--tail-s", type=float, default=3.0, help="silence replayed after each clip")
    p.add_argument("--source", choices=("replay", "system"), default="replay",
                   help="replay: ReplaySource at --speed; system: played into a private PulseAudio null sink and "
                        "captured from its monitor, at real-time pace")
    p.add_argument("--clips", help="comma-separated clip names (default: the 18 English dev clips)")
    p.add_argument("--model", help="model name or .gguf path (default: the bundled tiny.en)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the model (default 0: automatic)")
    p.add_argument("--long-minutes", type=float, default=0.0, help="also stream N minutes of clips at speed 0")
    p.add_argument("--out", type=Path, default=RESULTS / "latency", help="output stem (.json and .md)")
    p.add_argument("--keep-previous", action="store_true",
                   help="keep the run already in --out's JSON (its summary is shown after this run's)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.speed <= 0:
        p.error("--speed must be positive: latency needs a clock")
    try:
        configs = configs_of(args.policy, args.frames, args.audio_ctx, args.step, args.hold, args.commit_after,
                             args.pause_step, args.margin, args.agree_gap, args.beam, args.prompt_ts, args.draft)
    except ValueError as exc:
        p.error(str(exc))
    clips = english_dev_clips()
    if args.clips:
        unknown = set(args.clips.split(",")) - {c.name for c in clips}
        if unknown:
            p.error(f"not an English dev clip: {', '.join(sorted(unknown))}")
        clips = [c for c in clips if c.name in args.clips.split(",")]
    model = WhisperModel(resolve_model(args.model), n_threads=args.threads)
    machine = machine_info()
    encoder = encoder_costs(model)
    with _streamer(args.source, args.speed, p) as streamer:
        results = run_interleaved(model, clips, configs, streamer, args.tail_s)
    report = {"model": model.name, "device": model.device, "backend": model.backend, "threads": args.threads,
              "speed": streamer.speed, "source": streamer.label, "tail_s": args.tail_s, "timing_source": TIMING_SOURCE,
              "machine": machine, "encoder": encoder,
              "configs": [{"name": c.name, "options": _options_dict(c.options), "summary": summarize(results[c.name]),
                           "clips": [asdict(r) for r in results[c.name]]} for c in configs]}
    if args.keep_previous and args.out.with_suffix(".json").exists():
        previous = json.loads(args.out.with_suffix(".json").read_text())
        report["earlier_runs"] = [{k: v for k, v in previous.items() if k != "earlier_runs"},
                                  *previous.get("earlier_runs", [])]
    write(report, args.out)
    if args.long_minutes:
        report["long"] = measure_long(model, english_dev_clips(), args.long_minutes, configs[0].options)
        logger.info("long run: %s", report["long"])
        write(report, args.out)
    print(markdown(report))
    return 0


@contextlib.contextmanager
def _streamer(source: str, speed: float, parser: argparse.ArgumentParser):
    """The Replay, or a SystemAudio (system_audio)."""
    if source == "replay":
        yield Replay(speed)
        return
    with system_audio(parser, "--source system") as streamer:
        yield streamer


@contextlib.contextmanager
def system_audio(parser: argparse.ArgumentParser, flag: str):
    """A SystemAudio on a private PulseAudio daemon that lives as long as the context; `parser` reports the
    daemon's missing tools as an error of the command line's `flag`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from audio_harness import VirtualMic, default_input_mic

    missing = VirtualMic.missing_tools()
    if missing:
        parser.error(f"{flag} needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils)")
    with default_input_mic() as mic:
        yield SystemAudio(mic)


def _options_dict(options: StreamOptions) -> dict:
    return {k: v for k, v in asdict(options).items() if k != "vad"}


def write(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown(report))


if __name__ == "__main__":
    sys.exit(main())
