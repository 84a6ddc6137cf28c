#!/usr/bin/env python3
"""Qwen3-ASR's decoder steps of S sessions at once (issue #21): each session's own call in turn against one
shared Qwen3StreamBatch graph, and S threads decoding through the serve batcher (`DecodeBatcher`) against S
threads each on its own.

The 0.6B shape with random weights (bench/qwen3_asr.py's checkpoint: no real one can be fetched here; timing
does not depend on the values). Every session holds a transcription prompt of 30 s of audio (390 random audio
vectors in the official prompt: 421 tokens with the numpy checkpoint's tokenizer), prefilled once; each
measurement rewinds the sessions to it and takes --steps greedy steps (a fixed token: the cost does not
depend on which). A step of a session reads every weight of the text decoder (0.8 GB in q8_0): a shared step
reads them once for all S sessions.

- native: wall ms of one step of all S sessions, median over the steps after the first (which builds the
  graph), median over interleaved rounds; tokens/s = S / that.
- threads: S threads each taking --steps steps, with the model's batcher (shared steps) and without it (each
  thread's own graph, the threads sharing the cores); tokens/s = S x steps / wall time of all.

    .venv/bin/python bench/qwen3_batch.py [--wtypes q8_0,f16] [--streams 1,2,4,8,16] [--rounds 3] [--steps 8]
        [--ckpt /tmp/q06] [--name qwen3-batch]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, fmt, machine_info, md_table  # noqa: E402
from qwen3_asr import ROOT, checkpoint, gguf_of  # noqa: E402

from aural import _native  # noqa: E402
from aural.engine.qwen3asr import Qwen3AsrModel  # noqa: E402
from aural.engine.serve.batching import DecodeBatcher  # noqa: E402

N_AUDIO = 390  # audio vectors of 30 s (bench/qwen3_asr.py)
TOKEN = np.array([100], np.int32)


def sessions(model: Qwen3AsrModel, n: int, steps: int) -> tuple[list, int]:
    """n native contexts holding the same prompt; its length."""
    prompt = np.asarray(model.prompt(N_AUDIO), np.int32)
    audio = np.random.default_rng(0).normal(0, 1, (N_AUDIO, model.native.n_state)).astype(np.float32)
    ctxs = []
    for _ in range(n):
        ctx = _native.Qwen3Context(model.native, n_ctx=len(prompt) + steps + 1)
        ctx.decode(prompt, audio=audio)
        ctxs.append(ctx)
    return ctxs, len(prompt)


def native_ms(batch, ctxs: list, n_prompt: int, steps: int, shared: bool) -> float:
    for ctx in ctxs:
        ctx.rewind(n_prompt)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if shared:
            batch.decode(contexts=ctxs, tokens=[TOKEN] * len(ctxs))
        else:
            for ctx in ctxs:
                ctx.decode(TOKEN)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[1:])


def threads_tps(model: Qwen3AsrModel, ctxs: list, n_prompt: int, steps: int, batched: bool) -> float:
    """Tokens per second of len(ctxs) threads each taking `steps` steps, through a batcher or each alone."""
    batcher = DecodeBatcher(model) if batched else None
    for ctx in ctxs:
        ctx.rewind(n_prompt)
    start = threading.Barrier(len(ctxs) + 1)

    def run(ctx) -> None:
        start.wait()
        for _ in range(steps):
            batcher.decode(ctx, TOKEN) if batcher else ctx.decode(TOKEN)

    threads = [threading.Thread(target=run, args=(c,)) for c in ctxs]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return len(ctxs) * steps / (time.perf_counter() - t0)


def measure(path: Path, streams: list[int], rounds: int, steps: int) -> list[dict]:
    model = Qwen3AsrModel(path, isolate=False)
    all_ctxs, n_prompt = sessions(model, max(streams), steps)
    batch = _native.Qwen3StreamBatch(model.native)
    rows = []
    for n in streams:
        ctxs = all_ctxs[:n]
        alone, shared, t_alone, t_shared = [], [], [], []
        for _ in range(rounds):
            alone.append(native_ms(batch, ctxs, n_prompt, steps, False))
            shared.append(native_ms(batch, ctxs, n_prompt, steps, True))
            t_alone.append(threads_tps(model, ctxs, n_prompt, steps, False))
            t_shared.append(threads_tps(model, ctxs, n_prompt, steps, True))
        row = {"streams": n, "alone_ms": statistics.median(alone), "shared_ms": statistics.median(shared),
               "threads_alone_tps": statistics.median(t_alone), "threads_batched_tps": statistics.median(t_shared)}
        rows.append(row)
        print(f"{path.name} S={n:2d}: native {row['alone_ms']:.1f} -> {row['shared_ms']:.1f} ms/step; threads "
              f"{row['threads_alone_tps']:.1f} -> {row['threads_batched_tps']:.1f} tokens/s", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wtypes", default="q8_0,f16")
    p.add_argument("--streams", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ckpt", type=Path, default=ROOT / "build" / "qref" / "0.6b")
    p.add_argument("--maker", choices=("auto", "official", "numpy"), default="auto")
    p.add_argument("--name", default="qwen3-batch")
    args = p.parse_args()
    ckpt = checkpoint(args.ckpt, args.maker)
    streams = [int(s) for s in args.streams.split(",")]
    results = {w: measure(gguf_of(ckpt, w), streams, args.rounds, args.steps) for w in args.wtypes.split(",")}
    meta = {**machine_info(), "rounds": args.rounds, "steps": args.steps, "checkpoint": str(ckpt),
            "threads": _native.default_threads()}
    out = RESULTS / args.name
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    rows = [(w, r["streams"], fmt(r["alone_ms"]), fmt(r["shared_ms"]), f"{r['alone_ms'] / r['shared_ms']:.2f}x",
             fmt(r["streams"] * 1000 / r["shared_ms"]), fmt(r["threads_alone_tps"]), fmt(r["threads_batched_tps"]),
             f"{r['threads_batched_tps'] / r['threads_alone_tps']:.2f}x")
            for w, rs in results.items() for r in rs]
    table = md_table(("weights", "sessions", "one by one ms/step", "shared ms/step", "speed-up", "shared tokens/s",
                      "threads alone tokens/s", "threads batched tokens/s", "speed-up"), rows)
    out.with_suffix(".md").write_text("\n".join([
        "# Qwen3-ASR decoder steps of several sessions: one by one against one shared graph (0.6B shape, random "
        "weights)", "",
        f"{meta['cpu']}, {meta['cpus']} CPUs, CPU backend, {meta['threads']} threads per graph (the default); "
        f"{args.rounds} interleaved "
        f"rounds of {args.steps} steps per session from a 30 s transcription prompt. Method: bench/qwen3_batch.py's "
        "docstring. Command: `.venv/bin/python bench/qwen3_batch.py " + " ".join(sys.argv[1:]) + "`.", "",
        table, ""]))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
