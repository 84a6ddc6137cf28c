"""The decoder alone: one step of S sessions as S calls against one shared StreamBatch call.

For S = 1, 2, 4, 8, 16 sessions of tiny.en, each with its own encoded window (`--frames` mel frames of a
LibriSpeech clip) and prompt, greedy (1 token a step) and beam 5 (5 tokens, 5 outputs), the wall time of one
step of all S sessions: each session's own `Context.decode` in turn, against `StreamBatch.decode` of them
all. Rounds interleave the two (`--rounds`, medians), 20 steps each. The logits are the same bits either way
(tests/test_stream_batch.py); this measures only time. Writes bench/results/<name>.json and .md.

Usage: .venv/bin/python bench/stream_batch.py [--frames 1000,3000] [--rounds 5] [--name stream-batch]
       [--backend CUDA0]  (the model in this process: StreamBatch takes native contexts, not a device process's)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, fmt, machine_info, md_table  # noqa: E402

from aural import _native  # noqa: E402
from aural.engine.audio import load_audio  # noqa: E402
from aural.engine.features import window_mel  # noqa: E402
from aural.engine.models.store import resolve_model  # noqa: E402
from aural.engine.runtime import WhisperModel  # noqa: E402

STREAMS = (1, 2, 4, 8, 16)
STEPS = 20


def sessions(model, mel, n: int, n_seq: int) -> list:
    prompt = np.array(model.tokenizer.sot_sequence_including_notimestamps, dtype=np.int32)
    out = []
    for _ in range(n):
        ctx = model.new_session(n_seq=n_seq)
        ctx.encode(mel)
        ctx.decode(prompt, 0)
        if n_seq > 1:
            ctx.reorder([0] * n_seq)
        out.append(ctx)
    return out


def step_ms(model, mel, n: int, n_seq: int, shared: bool) -> float:
    """Median wall ms of one step of all n sessions over STEPS steps (each step one position further)."""
    ctxs = sessions(model, mel, n, n_seq)
    batch = _native.StreamBatch(model._model, n_threads=model.n_threads)
    n_past = len(model.tokenizer.sot_sequence_including_notimestamps)
    tokens, beams = np.full(n_seq, 440, np.int32), list(range(n_seq))
    times = []
    for k in range(STEPS):
        t0 = time.perf_counter()
        if shared:
            batch.decode(contexts=ctxs, steps=[(tokens, n_past + k, beams, beams)] * n)
        else:
            for ctx in ctxs:
                ctx.decode(tokens, n_past + k, outputs=beams, seq_ids=beams)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[1:])  # the first builds the graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", default="1000,3000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="stream-batch")
    parser.add_argument("--backend", default="auto", help="the model's device (default: the best)")
    args = parser.parse_args()
    model = WhisperModel(resolve_model("tiny.en"), device=args.backend, isolate=False)
    audio = load_audio(DATA / "en_libri_1089-134686-0000.16k.wav")
    rows = []
    for frames in map(int, args.frames.split(",")):
        mel = window_mel(audio, model.mel_filters, frames)
        for n_seq in (1, 5):
            for n in STREAMS:
                alone, shared = [], []
                for _ in range(args.rounds):
                    alone.append(step_ms(model, mel, n, n_seq, False))
                    shared.append(step_ms(model, mel, n, n_seq, True))
                a, s = statistics.median(alone), statistics.median(shared)
                rows.append({"frames": frames, "n_seq": n_seq, "streams": n, "alone_ms": a, "shared_ms": s})
                print(f"frames {frames} n_seq {n_seq} streams {n:2d}: alone {a:6.2f} ms, shared {s:6.2f} ms, "
                      f"{a / s:.2f}x", flush=True)
    report = {"model": "tiny.en", "device": f"{model.backend}/{model.device}", "machine": machine_info(),
              "rounds": args.rounds, "steps": STEPS, "rows": rows}
    out = RESULTS / args.name
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    m = report["machine"]
    table = md_table(("context (mel frames)", "tokens a step", "sessions", "one by one ms", "shared ms", "speed-up"),
                     [(r["frames"], r["n_seq"], r["streams"], fmt(r["alone_ms"]), fmt(r["shared_ms"]),
                       f"{r['alone_ms'] / r['shared_ms']:.2f}x") for r in rows])
    out.with_suffix(".md").write_text("\n".join([
        f"# One decoder step of several sessions: one by one against one shared graph (tiny.en, {report['device']})",
        "",
        f"Wall ms of one step of every session, medians of {args.rounds} interleaved rounds of {STEPS} steps "
        "(bench/stream_batch.py). Greedy steps carry 1 token, beam-5 steps 5 tokens and 5 outputs.", "",
        table, "", f"Machine: {m['cpu']}, {m['cpus']} CPUs, Python {m['python']}", ""]))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
