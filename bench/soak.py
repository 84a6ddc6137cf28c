"""Soak test: long live captioning and many back-to-back file transcriptions, watching memory and drops.

(a) live: the English dev clips, concatenated (0.3 s of silence between them) to `--minutes` of audio,
    are replayed through `streaming.live_events` at speed 0 (as fast as decoding goes, nothing dropped
    by design, so any dropped block is a bug). A sampler thread records VmRSS every `--rss-every` seconds.
(b) files: `--files` dev clips transcribed back-to-back through `transcribe.transcribe` on one loaded
    model; each is cancelled (its stop event set from a timer) with probability `--cancel-rate` at a
    random moment of its expected run time. Reports RSS after every file and WER of the completed ones.

Memory growth is what a soak is for: the live stream keeps one native Context, its window is trimmed,
and the file loop opens a Context per file, so RSS should level off after the first minutes. Runs
under the project venv (it imports Aural). Writes bench/results/soak.json and soak.md.

Usage:
    nice -n 5 .venv/bin/python bench/soak.py --minutes 20 --files 50      # what was run on the 2-core VM
    nice -n 5 .venv/bin/python bench/soak.py --minutes 120 --files 50     # the issue's two hours of speech
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, english_dev_clips, fmt, machine_info, md_table, word_errors  # noqa: E402

from aural.engine.audio import SAMPLE_RATE, load_audio  # noqa: E402
from aural.engine.cancel import StopEvent  # noqa: E402
from aural.engine.live.capture import ReplaySource  # noqa: E402
from aural.engine.live.streaming import Commit, Error, Metrics, StreamOptions, live_events  # noqa: E402
from aural.engine.metrics import peak_rss_mb  # noqa: E402
from aural.engine.models.store import resolve_model  # noqa: E402
from aural.engine.runtime import WhisperModel  # noqa: E402
from aural.engine.transcribe import transcribe  # noqa: E402

logger = logging.getLogger("bench.soak")

GAP_S = 0.3  # silence between concatenated clips, seconds (as bench/latency.py's long run)


def rss_mb() -> float:
    """Current resident set size (VmRSS) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RssSampler:
    """Samples VmRSS every `every_s` seconds on a daemon thread: [(seconds since start, MiB), ...]."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> "RssSampler":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic() - self._started, rss_mb()))

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self._started, rss_mb()))
            logger.info("RSS %.0f MiB after %.0f s", self.samples[-1][1], self.samples[-1][0])
            if self._stop.wait(self.every_s):
                return


def clip_audio(clip) -> Path:
    """The clip's file; for headerless PCM its WAV copy (a replay and transcribe() need a header)."""
    return clip.path.with_suffix(".16k.wav") if clip.raw_pcm else clip.path


def concatenated_clips(clips, minutes: float, path: Path) -> str:
    """Writes the clips cycled up to `minutes` into a 16 kHz WAV, clip by clip; returns the reference."""
    target, written, refs = minutes * 60 * SAMPLE_RATE, 0, []
    gap = np.zeros(round(GAP_S * SAMPLE_RATE), dtype=np.float32)
    with sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype="PCM_16") as out:
        while written < target:
            for clip in clips:
                samples = load_audio(clip_audio(clip))
                out.write(np.concatenate([samples, gap]))
                refs.append(clip.reference)
                written += samples.size + gap.size
                if written >= target:
                    break
    return " ".join(refs)


# -- (a) live --------------------------------------------------------------------------------------


def soak_live(model: WhisperModel, minutes: float, rss_every_s: float, options: StreamOptions,
              max_wall_s: float | None) -> dict:
    """Streams `minutes` of clips; stops early (and says so) after `max_wall_s` seconds of wall time."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"dev-{minutes:g}min.wav"
        reference = concatenated_clips(english_dev_clips(), minutes, path)
        rss_start = rss_mb()
        started = time.perf_counter()
        committed, errors, last = [], [], None
        stop = threading.Event()
        deadline = threading.Timer(max_wall_s, stop.set) if max_wall_s else None
        with RssSampler(rss_every_s) as sampler:
            if deadline is not None:
                deadline.start()
            for event in live_events(model, ReplaySource(path, speed=0), options, stop=stop):
                if isinstance(event, Commit):
                    committed.append(event.text)
                elif isinstance(event, Metrics):
                    last = event
                elif isinstance(event, Error):
                    errors.append(event.message)
            if deadline is not None:
                deadline.cancel()
        wall = time.perf_counter() - started
    text = " ".join(committed)
    # Stopped early, the reference keeps the share of its words that the audio consumed has (approximate).
    n_errors, n_ref = word_errors(_reference_prefix(reference, last.audio_s / (minutes * 60)), text)
    rss = [mb for _, mb in sampler.samples]
    return {"minutes": minutes, "stopped_early": stop.is_set(), "audio_s": last.audio_s, "wall_s": wall,
            "rtf": wall / last.audio_s, "n_steps": last.n_steps, "rss_start_mb": rss_start, "rss_end_mb": rss[-1],
            "rss_max_mb": max(rss),
            "peak_rss_mb": peak_rss_mb(), "rss_samples": sampler.samples, "dropped_blocks": last.dropped_blocks,
            "committed_words": len(text.split()), "reference_words": n_ref,
            "wer": n_errors / n_ref if n_ref else None, "errors": errors,
            "graph_builds": last.graph_builds, "graph_reuses": last.graph_reuses}


def _reference_prefix(reference: str, fraction: float) -> str:
    words = reference.split()
    return " ".join(words[:round(len(words) * min(fraction, 1.0))])


# -- (b) files -------------------------------------------------------------------------------------


@dataclass
class FileRun:
    """One file of the back-to-back loop.

    Attributes:
        name: the clip's file name.
        cancel_after_s: when its stop event was set (seconds after the call), None if not cancelled.
        cancelled: the stop event fired before the transcription ended.
        wall_s: seconds from the call to the end of the segments.
        cancel_latency_s: seconds from the stop event to the end of the segments (cancelled files).
        text: the transcript (partial when cancelled).
        errors: word errors against the reference (completed files only).
        reference_words: words in the reference.
        rss_mb: VmRSS after the file.
        failure: an exception's "Type: message" if one escaped, else None.
    """

    name: str
    cancel_after_s: float | None
    cancelled: bool = False
    wall_s: float = 0.0
    cancel_latency_s: float | None = None
    text: str = ""
    errors: int = 0
    reference_words: int = 0
    rss_mb: float = 0.0
    failure: str | None = None


def transcribe_file(model: WhisperModel, clip, cancel_after_s: float | None) -> FileRun:
    run = FileRun(clip.name, cancel_after_s)
    stop = StopEvent()  # as the app's file queue: a cancel interrupts the native call in progress
    stopped_at: list[float] = []

    def cancel() -> None:
        stopped_at.append(time.perf_counter())
        stop.set()

    timer = threading.Timer(cancel_after_s, cancel) if cancel_after_s is not None else None
    started = time.perf_counter()
    try:
        if timer is not None:
            timer.start()
        run.text = " ".join(s.text for s in transcribe(model, clip_audio(clip), stop=stop))
    except Exception as exc:  # noqa: BLE001 - a soak records every failure instead of stopping at the first
        run.failure = f"{type(exc).__name__}: {exc}"
    finally:
        if timer is not None:
            timer.cancel()
    ended = time.perf_counter()
    run.wall_s = ended - started
    run.cancelled = stop.is_set()
    if stopped_at:
        run.cancel_latency_s = ended - stopped_at[0]
    if not run.cancelled and run.failure is None:
        run.errors, run.reference_words = word_errors(clip.reference, run.text)
    run.rss_mb = rss_mb()
    return run


def soak_files(model: WhisperModel, n_files: int, cancel_rate: float, seed: int) -> dict:
    rng = random.Random(seed)
    clips = english_dev_clips()
    rss_start = rss_mb()
    started = time.perf_counter()
    runs = []
    for i in range(n_files):
        clip = clips[i % len(clips)]
        # Cancel somewhere in the first ~half of a run: at RTF ~0.3 on this VM, duration * 0.15 s.
        cancel = rng.uniform(0.0, 0.15 * clip.duration_s) if rng.random() < cancel_rate else None
        runs.append(transcribe_file(model, clip, cancel))
        logger.info("file %d/%d %s: %s in %.1f s, RSS %.0f MiB%s", i + 1, n_files, clip.name,
                    "cancelled" if runs[-1].cancelled else "done", runs[-1].wall_s, runs[-1].rss_mb,
                    f" FAILED {runs[-1].failure}" if runs[-1].failure else "")
    done = [r for r in runs if not r.cancelled and r.failure is None]
    ref_words = sum(r.reference_words for r in done)
    latencies = [r.cancel_latency_s for r in runs if r.cancel_latency_s is not None]
    return {"files": n_files, "cancelled": sum(r.cancelled for r in runs), "completed": len(done),
            "cancel_latency_max_s": max(latencies, default=None),
            "cancel_latency_median_s": float(np.median(latencies)) if latencies else None,
            "failures": [r.failure for r in runs if r.failure], "wall_s": time.perf_counter() - started,
            "rss_start_mb": rss_start, "rss_end_mb": runs[-1].rss_mb, "rss_max_mb": max(r.rss_mb for r in runs),
            "wer_completed": sum(r.errors for r in done) / ref_words if ref_words else None,
            "runs": [asdict(r) for r in runs]}


# -- report ----------------------------------------------------------------------------------------


RSS_BLOCK_S = 1200.0  # the live part's RSS trend is shown as one median per 20 minutes of wall time


def rss_block_medians(samples: list[tuple[float, float]]) -> list[float]:
    """Median RSS of each RSS_BLOCK_S of wall time: a leak shows as a rising sequence."""
    blocks: dict[int, list[float]] = {}
    for t, mb in samples:
        blocks.setdefault(int(t // RSS_BLOCK_S), []).append(mb)
    return [float(np.median(blocks[k])) for k in sorted(blocks)]


def _threads(part: dict) -> str:
    return f"{part.get('threads') or 'auto'} thread(s)"


def markdown(report: dict) -> str:
    parts = [f"# Soak ({report['model']}, {report['device']})", ""]
    if report.get("live"):
        lv = report["live"]
        parts += [f"## Live: {lv['minutes']:g} minutes of dev clips at speed 0, {_threads(lv)} (RSS sampled every "
                  f"{report['rss_every_s']:g} s)", "", md_table(
                      ("audio s", "wall s", "RTF", "steps", "RSS start MiB", "RSS end MiB", "RSS max MiB",
                       "peak RSS MiB", "dropped blocks", "committed words", "WER %", "errors"),
                      [(fmt(lv["audio_s"], 0), fmt(lv["wall_s"], 0), fmt(lv["rtf"]), lv["n_steps"],
                        fmt(lv["rss_start_mb"], 0), fmt(lv["rss_end_mb"], 0), fmt(lv["rss_max_mb"], 0),
                        fmt(lv["peak_rss_mb"], 0), lv["dropped_blocks"], lv["committed_words"],
                        fmt(lv["wer"] * 100 if lv["wer"] is not None else None, 1), len(lv["errors"]))]), ""]
        parts += [f"RSS median per {RSS_BLOCK_S // 60:.0f} min of wall time (MiB): "
                  + ", ".join(fmt(m, 0) for m in rss_block_medians(lv["rss_samples"])), ""]
        if lv["stopped_early"]:
            parts += [f"Stopped early by --max-wall-min after {lv['audio_s'] / 60:.1f} of {lv['minutes']:g} minutes "
                      "of audio.", ""]
        parts += [f"Machine: {lv.get('machine')}", ""]
    if report.get("files"):
        fl = report["files"]
        parts += [f"## Files: {fl['files']} dev clips back to back, {_threads(fl)}, cancel rate "
                  f"{report['cancel_rate']:g} (seed {report['seed']})", "", md_table(
                      ("files", "completed", "cancelled", "cancel latency median / max s", "failures", "wall s",
                       "RSS start MiB", "RSS end MiB", "RSS max MiB", "WER completed %"),
                      [(fl["files"], fl["completed"], fl["cancelled"],
                        f"{fmt(fl['cancel_latency_median_s'])} / {fmt(fl['cancel_latency_max_s'])}",
                        len(fl["failures"]), fmt(fl["wall_s"], 0),
                        fmt(fl["rss_start_mb"], 0), fmt(fl["rss_end_mb"], 0), fmt(fl["rss_max_mb"], 0),
                        fmt(fl["wer_completed"] * 100 if fl["wer_completed"] is not None else None, 1))]), "",
                  f"Machine: {fl.get('machine')}", ""]
    parts.append("Commands: `nice -n 5 .venv/bin/python bench/soak.py --minutes 120 --files 0 --threads 1 --update` "
                 "(live), `.venv/bin/python bench/soak.py --minutes 0 --files 50 --update` (files).")
    return "\n".join(parts).rstrip() + "\n"


def write(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown(report))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=20.0, help="live part: minutes of audio (0 skips it)")
    p.add_argument("--files", type=int, default=50, help="files part: transcriptions (0 skips it)")
    p.add_argument("--cancel-rate", type=float, default=0.3, help="files part: share of files cancelled")
    p.add_argument("--seed", type=int, default=0, help="files part: seed of the cancel choices")
    p.add_argument("--rss-every", type=float, default=30.0, help="live part: seconds between RSS samples")
    p.add_argument("--step", type=float, default=1.0, help="live part: StreamOptions.step_s")
    p.add_argument("--model", help="model name or .gguf path (default: the bundled tiny.en)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the model (default 0: automatic)")
    p.add_argument("--max-wall-min", type=float, help="live part: stop after this many minutes of wall time")
    p.add_argument("--update", action="store_true",
                   help="keep the part not run now from the existing report (run the parts separately)")
    p.add_argument("--out", type=Path, default=RESULTS / "soak", help="output stem (.json and .md)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    model = WhisperModel(resolve_model(args.model), n_threads=args.threads)
    previous = json.loads(args.out.with_suffix(".json").read_text()) if args.update else {}
    report = {"model": model.name, "device": model.device, "backend": model.backend, "threads": args.threads,
              "rss_every_s": args.rss_every, "cancel_rate": args.cancel_rate, "seed": args.seed,
              "rss_after_load_mb": rss_mb(), "files": previous.get("files"), "live": previous.get("live")}
    if args.files:
        machine = machine_info()  # before the run: loadavg_start is the load the run started under
        report["files"] = {**soak_files(model, args.files, args.cancel_rate, args.seed), "machine": machine,
                           "threads": args.threads}
        write(report, args.out)
    if args.minutes:
        machine = machine_info()
        max_wall_s = args.max_wall_min * 60 if args.max_wall_min else None
        live = soak_live(model, args.minutes, args.rss_every, StreamOptions(step_s=args.step), max_wall_s)
        report["live"] = {**live, "step_s": args.step, "machine": machine, "threads": args.threads}
        write(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
