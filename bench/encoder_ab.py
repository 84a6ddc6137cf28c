#!/usr/bin/env python3
"""Interleaved A/B of Aural's encoder alone: builds (interpreters with Aural installed) × environments.

Each variant is `name=PYTHON[,VAR=VALUE...]`: the interpreter whose Aural build to time and environment
variables for it (e.g. AURAL_NO_WIDEN=1, AURAL_MODEL=path.gguf for another weight file). Every round
starts one process per variant, in order (A B C A B C ...); each loads the model, encodes the first
30 s window of the sonnet once to warm up, then --reps more times, reporting the native encoder time
(`Context.last_encode["encoder_ms"]`) and the argmax of the first decoder step (a cheap check that the
variants still agree). Writes bench/results/<name>.json and .md (median / min, and the median of
per-round ratios to the first variant).

    .venv/bin/python bench/encoder_ab.py --threads 2 --rounds 5 \\
        --variant "before=/tmp/before/bin/python" --variant "after=.venv/bin/python" \\
        --variant "after, no widening=.venv/bin/python,AURAL_NO_WIDEN=1"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, machine_info, md_table  # noqa: E402

CLIP = "en_librivox_shakespeare_sonnet001.16k.wav"
WORKER = """
import json, os, sys
import numpy as np
from aural.engine.audio import load_audio
from aural.engine.features import N_SAMPLES, pad_or_trim, window_mel
from aural.engine.models.store import resolve_model
from aural.engine.runtime import WhisperModel

path = os.environ.get("AURAL_MODEL") or str(resolve_model(None))
model = WhisperModel(path, n_threads=int(sys.argv[2]))
mel = window_mel(pad_or_trim(load_audio(sys.argv[1])[:N_SAMPLES]), model.mel_filters)
ctx = model.new_session()
ctx.encode(mel)
times = []
for _ in range(int(sys.argv[3])):
    ctx.encode(mel)
    times.append(ctx.last_encode["encoder_ms"])
logits = ctx.decode(np.array(model.tokenizer.sot_sequence_including_notimestamps, dtype=np.int32), 0)
print(json.dumps({"encoder_ms": times, "first_token": int(np.argmax(logits[-1]))}))
"""


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    name, _, spec = text.partition("=")
    python, *pairs = spec.split(",")
    return name, python, dict(pair.split("=", 1) for pair in pairs)


def run_once(python: str, env: dict[str, str], worker: str, *args: object) -> dict:
    """Runs `worker` (Python source) under `python` with `env` and `args`; returns its last line, parsed as JSON."""
    out = subprocess.run([python, "-c", worker, *map(str, args)], env={**os.environ, **env},
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{python}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_results(name: str, meta: dict, variants: dict, title: str, method: str, table: str) -> None:
    """bench/results/<name>.json (meta and per-variant figures) and <name>.md (title, note, method, table)."""
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "variants": variants}, indent=1))
    loads = meta["loadavg_per_round"]
    text = (f"# {title}: {name}\n\n{meta['note']}\n\n{meta['cpu']} ({meta['cpus']} CPUs). {method}; "
            f"1-minute load average per round {min(loads):.1f}–{max(loads):.1f}.\n\n{table}\n")
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="name=PYTHON[,VAR=VALUE...]")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3, help="timed encodes per process")
    p.add_argument("--name", default="encoder-ab", help="results file stem")
    p.add_argument("--note", default="", help="a line put under the title of the .md")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    clip = DATA / CLIP
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, python, env in variants:
            runs[name].append(run_once(python, env, WORKER, clip, args.threads, args.reps))
            print(f"round {r + 1} {name}: {[round(t) for t in runs[name][-1]['encoder_ms']]}", flush=True)
    first = variants[0][0]
    rows, summary = [], {}
    for name, python, env in variants:
        times = [t for run in runs[name] for t in run["encoder_ms"]]
        ratios = [statistics.median(a["encoder_ms"]) / statistics.median(b["encoder_ms"])
                  for a, b in zip(runs[name], runs[first])]
        tokens = {run["first_token"] for run in runs[name]}
        summary[name] = {"python": python, "env": env, "median_ms": statistics.median(times), "min_ms": min(times),
                         "ratio_to_first": statistics.median(ratios), "first_tokens": sorted(tokens), "runs": runs[name]}
        rows.append([name, " ".join(f"{k}={v}" for k, v in env.items()) or "-", f"{statistics.median(times):.0f}",
                     f"{min(times):.0f}", f"{statistics.median(ratios):.2f}", ", ".join(map(str, sorted(tokens)))])
    meta = {**machine_info(), "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
            "loadavg_per_round": loads, "clip": CLIP, "note": args.note}
    table = md_table(["variant", "env", "encoder ms/window median", "min", f"× {first} (per-round median)",
                      "first token"], rows)
    write_results(args.name, meta, summary, "Encoder A/B", f"{args.rounds} interleaved rounds × {args.reps} "
                  f"encodes, {args.threads} threads, first 30 s of {CLIP}", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
