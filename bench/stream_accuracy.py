"""Streaming WER on the widened English sets, per live commit policy: what choosing a policy costs in words.

bench/latency.py measures latency on the 18 dev clips, too few to choose on (issue #17). Here every file
of bench/accuracy.py's sets (dev, long, phone, noisy; 3681 words) is streamed through
`streaming.live_events` as fast as it decodes (ReplaySource at speed 0: the same steps as at real-time
pace, without the waiting), and the concatenated commits are scored against the reference with the same
normaliser. Each configuration runs in its own process with one CPU thread, the configurations side by
side. "offline" (greedy) and "offline/b5" (beam 5, the file default) transcribe each file whole with the
same model and thread count, so the streaming cost (issue #20: stream WER <= offline + 0.5 points) is read
from one run on one CPU at one commit, not across runs whose kernels round differently.

    .venv/bin/python bench/stream_accuracy.py --configs offline,local-agreement,alignatt-f25
    .venv/bin/python bench/stream_accuracy.py --configs offline,local-agreement --sets noise --name N

--sets noise streams the noisy set and six more noises over the same files (accuracy.WIDE_NOISE), where the
one noisy set's gap came from two files. The Markdown counts, per file, where each configuration beats or
loses to the first.

Writes bench/results/<--name>.json and .md (default stream-accuracy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import build_sets, wide_noise_sets  # noqa: E402
from common import RESULTS, fmt, machine_info, md_table, word_errors  # noqa: E402

SAMPLE_RATE = 16000


def options_of(config: str):
    """"local-agreement" or "alignatt-f<frames>", then optionally "/s<seconds>" (step_s), "/c<seconds>"
    (min_silence_commit_s), "/pause0" or "/pause1" (pause_step), "/d<words>" (doubled_run_words, d0:
    None), "/g<seconds>" (commit_margin_s), "/a<seconds>" (agree_gap_s), "/b<beams>" (beam_size), "/p0" or
    "/p1" (prompt_timestamps), "/t<seconds>" (stall_s) and "/nodraft" (draft off), as StreamOptions:
    "local-agreement/s0.5/a1.0"."""
    from aural.engine.live.streaming import StreamOptions

    policy, *extras = config.split("/")
    fields = {"policy": policy}
    if policy.startswith("alignatt-f"):
        fields = {"policy": "alignatt", "alignatt_frames": int(policy.removeprefix("alignatt-f"))}
    for extra in extras:
        if extra.startswith("c"):
            fields["min_silence_commit_s"] = float(extra[1:])
        elif extra.startswith("s"):
            fields["step_s"] = float(extra[1:])
        elif extra == "nodraft":
            fields["draft"] = False
        elif extra.startswith("d"):
            fields["doubled_run_words"] = int(extra[1:]) or None
        elif extra.startswith("g"):
            fields["commit_margin_s"] = float(extra[1:])
        elif extra.startswith("a"):
            fields["agree_gap_s"] = float(extra[1:])
        elif extra.startswith("b"):
            fields["beam_size"] = int(extra[1:])
        elif extra in ("p0", "p1"):
            fields["prompt_timestamps"] = extra == "p1"
        elif extra.startswith("t"):
            fields["stall_s"] = float(extra[1:])
        elif extra in ("pause0", "pause1"):
            fields["pause_step"] = extra == "pause1"
        else:
            raise ValueError(f"unknown configuration part {extra!r} in {config!r}")
    return StreamOptions(**fields)


def offline_options(config: str):
    """"offline" (greedy) or "offline/b<beams>", as TranscribeOptions: the file path's defaults otherwise, as
    bench/accuracy.py sets them."""
    from aural.engine.transcribe import TranscribeOptions

    _, *extras = config.split("/")
    beam = 1
    for extra in extras:
        if not extra.startswith("b"):
            raise ValueError(f"unknown configuration part {extra!r} in {config!r}")
        beam = int(extra[1:])
    return TranscribeOptions(beam_size=beam)


def text_of(config: str):
    """A function (model, wav path) -> the text one configuration makes of a file."""
    from aural.engine.live.capture import ReplaySource
    from aural.engine.live.streaming import Commit, live_events
    from aural.engine.transcribe import transcribe

    if config == "offline" or config.startswith("offline/"):
        options = offline_options(config)
        return lambda model, wav: " ".join(s.text for s in transcribe(model, wav, options))
    options = options_of(config)
    return lambda model, wav: " ".join(
        e.text for e in live_events(model, ReplaySource(wav, speed=0), options) if isinstance(e, Commit))


def stream_sets(config: str, sets: dict) -> dict:
    """{set: [errors, reference words]} of one configuration, in its own process, and "files": {key: errors}."""
    from aural.engine.models.store import resolve_model
    from aural.engine.runtime import WhisperModel

    model = WhisperModel(resolve_model(None), n_threads=1)
    text = text_of(config)
    out: dict = {"files": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name, files in sets.items():
            errors = words = 0
            for k, f in enumerate(files):
                wav = Path(folder) / f"{k}.wav"
                sf.write(wav, np.load(f["path"]), SAMPLE_RATE, subtype="FLOAT")
                e, n = word_errors(f["reference"], text(model, wav))
                errors, words = errors + e, words + n
                out["files"][f["key"]] = e
            out[name] = [errors, words]
    return out


def paired(report: dict) -> list[str]:
    """Per file against the first configuration: how many files each other one decodes with fewer, more or as
    many errors. A policy that costs words on some kind of speech loses on most of its files; one that only
    moves rounding chaos loses on some and wins on others."""
    results = list(report["results"].items())
    (first, base), rows = results[0], []
    if "files" not in base:
        return []
    for config, per in results[1:]:
        diffs = [per["files"][k] - e for k, e in base["files"].items()]
        rows.append((config, sum(d < 0 for d in diffs), sum(d > 0 for d in diffs), sum(d == 0 for d in diffs),
                     sum(d for d in diffs)))
    return [f"Per file against {first} ({len(base['files'])} files):", "",
            md_table(("config", "fewer errors", "more errors", "as many", "errors net"), rows), ""]


def markdown(report: dict) -> str:
    names = list(report["words"])
    header = ("config", *(f"{s} ({report['words'][s]} words)" for s in names), f"all ({sum(report['words'].values())} words)")
    rows = []
    for config, per_set in report["results"].items():
        cells = [f"{fmt(100 * e / n, 2)} ({e})" for e, n in (per_set[s] for s in names)]
        e_all = sum(per_set[s][0] for s in names)
        rows.append((config, *cells, f"{fmt(100 * e_all / sum(report['words'].values()), 2)} ({e_all})"))
    return "\n".join([
        "# Streaming WER on the widened sets, per commit policy", "",
        f"{report['started']} · CPU: {report['machine']['cpu']}, 1 thread per configuration · commit "
        f"{report['commit']} · command: `{report['command']}`", "",
        "Sets as in accuracy.md (dev, long, phone 8 kHz, noisy: pink noise at 10 dB; '<colour> <snr> dB': the "
        "same 21 files under sox's white, pink or brown noise). Each file streamed at speed 0 through "
        "live_events with the default StreamOptions but what the config names (offline: transcribed whole with "
        "the default TranscribeOptions, greedy or beam b); cells: corpus WER % of the commits (word errors).", "",
        md_table(header, rows), "", *paired(report)])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="local-agreement,alignatt-f25",
                   help="comma-separated: local-agreement or alignatt-f<frames>, each with optional /s<s> /c<s> "
                        "/pause0|1 /d<words> /g<s> /a<s> /b<beams>; offline or offline/b<beams>")
    p.add_argument("--name", default="stream-accuracy", help="results file stem")
    p.add_argument("--sets", choices=("widened", "noise"), default="widened",
                   help="widened: dev, long, phone, noisy; noise: noisy and six more noises over the same files")
    args = p.parse_args(argv)
    import datetime as dt
    import subprocess

    sets, _ = build_sets()
    if args.sets == "noise":
        sets = {"noisy": sets["noisy"], **wide_noise_sets(sets)}
    configs = args.configs.split(",")
    for config in configs:
        text_of(config)  # a bad name fails here, before any work
    with ProcessPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 1)) as pool:
        results = dict(zip(configs, pool.map(stream_sets, configs, [sets] * len(configs))))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"started": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine_info(), "commit": commit,
              "command": "bench/stream_accuracy.py " + " ".join(argv),
              "words": {s: results[configs[0]][s][1] for s in sets}, "results": results}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    (RESULTS / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
