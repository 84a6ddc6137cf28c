#!/usr/bin/env python3
"""Aural's int8 product alone (`_native.kernel_int8_matmul`), per CPU level, in GMAC/s.

One child process per build × level (`AURAL_CPU_VARIANT`), in interleaved rounds; each times the product
of x (m, cols) by the packed w (rows, cols)^T for the encoder's shapes of tiny.en (384) and base (512) with
m = 1500 columns (one 30 s window), best of 7 calls. A call includes packing w and quantising x, so the
figures are a floor on the kernel's own rate; at the decoder's 1 to 5 columns that overhead is all a call
measures, so bench/decoder_ab.py times the decoder instead. Writes bench/results/<name>.json and .md.

    .venv/bin/python bench/int8_kernel.py --levels sapphirerapids,alderlake,haswell \\
        --build "before=/tmp/before/bin/python" --build "after=.venv/bin/python" --name int8-kernel-spr
    .venv/bin/python bench/int8_kernel.py --levels sapphirerapids --build "amx=.venv/bin/python" \\
        --build "no amx=.venv/bin/python,AURAL_NO_AMX=1" --name int8-kernel-amx-spr
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
from common import RESULTS, machine_info, md_table  # noqa: E402

SHAPES = [(384, 384), (1536, 384), (384, 1536), (512, 512), (2048, 512), (512, 2048)]  # (rows, cols)
WORKER = """
import json, sys, time
import numpy as np
from aural import _native
from aural.engine import cpu
cpu.configure()  # the probe's verdicts: AMX tiles only where they passed (AURAL_NO_AMX=1 keeps them out)
shapes = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
out = {}
for rows, cols in shapes:
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((1500, cols)).astype(np.float32)
    _native.kernel_int8_matmul(w, x)
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        _native.kernel_int8_matmul(w, x)
        best = min(best, time.perf_counter() - t)
    out[f"{rows}x{cols}"] = rows * cols * 1500 / best / 1e9
print(json.dumps({"kernel": _native.cpu_level()["int8_kernel"], "gmacs": out}))
"""


def run(build: str, level: str) -> dict:
    python, *assignments = build.split(",")
    env = {**os.environ, **dict(a.split("=", 1) for a in assignments), "AURAL_CPU_VARIANT": level}
    out = subprocess.run([python, "-c", WORKER, json.dumps(SHAPES)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{python} at {level}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="haswell", help="comma-separated ggml CPU variants")
    p.add_argument("--build", action="append", help="name=PYTHON[,VAR=VALUE...] (default: this interpreter)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--name", default="int8-kernel")
    args = p.parse_args(argv)
    builds = [b.split("=", 1) for b in args.build or [f"this={sys.executable}"]]
    levels = args.levels.split(",")
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for level in levels:
            for name, python in builds:
                runs.setdefault(f"{name} {level}", []).append(run(python, level))
    keys = list(next(iter(runs.values()))[0]["gmacs"])
    table = {v: {k: statistics.median(r["gmacs"][k] for r in rs) for k in keys} for v, rs in runs.items()}
    meta = {**machine_info(), "rounds": args.rounds, "levels": levels, "builds": dict(builds)}
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "median_gmacs": table,
                                                           "kernel": {v: rs[0]["kernel"] for v, rs in runs.items()},
                                                           "runs": runs}, indent=1))
    rows = [[v, runs[v][0]["kernel"], *(f"{table[v][k]:.0f}" for k in keys)] for v in table]
    text = (f"# int8 product alone: {args.name}\n\nCPU: {meta['cpu']}, 2 threads; median over {args.rounds} "
            f"interleaved rounds of the best of 7 calls, GMAC/s, rows x cols by 1500 columns (packing and "
            f"quantising included).\n\n"
            + md_table(["build level", "kernel", *keys], rows) + "\n")
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
