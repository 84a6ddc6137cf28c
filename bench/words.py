#!/usr/bin/env python3
"""Word timestamps of Aural against faster-whisper's on the 18 English dev clips (tiny.en).

Both engines decode the same way (greedy, temperature fallback and the rest as bench/worker.py, the
same threads) with word timestamps on; faster-whisper reads the CTranslate2 directory Aural's GGUF was
converted from. Both follow openai-whisper timing.py (cross-attention of the alignment heads, median
filter, DTW, the same boundary heuristics), so their times should agree closely where their words do.

Words are matched by sequence alignment (difflib.SequenceMatcher) of the two word lists, each word
normalised as for WER (openai-whisper's English normaliser); words that normalise to nothing (lone marks)
take no part. For every matched pair: |Δstart| and |Δend| in seconds. Reported per clip and pooled over
all clips: median and 90th percentile, and the share of each engine's words that found a match. The
goal is a pooled median within 0.3 s (TARGET_S). faster-whisper is the yardstick, not the truth: a
difference says the two disagree, not which one is right.

Outputs bench/results/words.json and bench/results/words.md.

    .venv/bin/python bench/words.py
    .venv/bin/python bench/words.py --compute-type int8 --name words-int8
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RESULTS, aural_python, fmt, md_table, run_prep, run_worker  # noqa: E402

# The goal for the median start/end difference, seconds.
TARGET_S = 0.3
# Matched words listed in the Markdown as the largest disagreements.
N_WORST = 10

def norm_word(word: str) -> str:
    """The word through the WER normaliser, spaces removed: " Country." and "country" match, and so
    do "Eight" and "8"; a lone mark becomes ""."""
    return common.normalize(word).replace(" ", "")


def match_words(aural: Sequence[Sequence[Any]], peer: Sequence[Sequence[Any]]) -> list[tuple[list, list]]:
    """Pairs (aural word, peer word) that sequence alignment of the normalised word lists matches.

    Each word is [word, start_s, end_s, probability]. autojunk is off: it would ignore frequent words.
    """
    matcher = difflib.SequenceMatcher(None, [norm_word(w[0]) for w in aural], [norm_word(w[0]) for w in peer],
                                      autojunk=False)
    return [(aural[block.a + k], peer[block.b + k])
            for block in matcher.get_matching_blocks() for k in range(block.size)]


def deviation_stats(pairs: Sequence[tuple[list, list]], n_aural: int, n_peer: int) -> dict[str, Any]:
    """Median and p90 of |Δstart| and |Δend| (seconds) over matched pairs, and the matched shares."""
    d_start = np.array([abs(a[1] - b[1]) for a, b in pairs])
    d_end = np.array([abs(a[2] - b[2]) for a, b in pairs])

    def pct(x: np.ndarray, q: float) -> float | None:
        return float(np.percentile(x, q)) if x.size else None

    return {
        "matched": len(pairs), "aural_words": n_aural, "peer_words": n_peer,
        "matched_of_aural": len(pairs) / n_aural if n_aural else None,
        "matched_of_peer": len(pairs) / n_peer if n_peer else None,
        "start_median_s": pct(d_start, 50), "start_p90_s": pct(d_start, 90),
        "end_median_s": pct(d_end, 50), "end_p90_s": pct(d_end, 90),
    }


def compare(aural_out: dict[str, Any], peer_out: dict[str, Any]) -> dict[str, Any]:
    """Per-clip and pooled statistics of two workers' outputs (results in the same clip order)."""
    peer_by_key = {r["key"]: r for r in peer_out["results"]}
    clips: dict[str, Any] = {}
    all_pairs: list[tuple[list, list]] = []
    n_aural = n_peer = 0
    for r in aural_out["results"]:
        # Words that normalise to nothing (lone marks) take no part.
        a_words = [w for w in r["words"] if norm_word(w[0])]
        p_words = [w for w in peer_by_key[r["key"]]["words"] if norm_word(w[0])]
        pairs = match_words(a_words, p_words)
        all_pairs += pairs
        n_aural, n_peer = n_aural + len(a_words), n_peer + len(p_words)
        clips[r["key"]] = {**deviation_stats(pairs, len(a_words), len(p_words)),
                           "pairs": [[a[0], a[1], a[2], b[1], b[2]] for a, b in pairs]}
    overall = deviation_stats(all_pairs, n_aural, n_peer)
    overall["meets_target"] = (overall["start_median_s"] is not None
                               and max(overall["start_median_s"], overall["end_median_s"]) <= TARGET_S)
    return {"clips": clips, "overall": overall}


def render(meta: dict[str, Any], report: dict[str, Any], peer_label: str) -> str:
    o, totals = report["overall"], meta["processing_s_total"]

    def row(name: str, dur: str, s: dict[str, Any]) -> list[str]:
        return [name, dur, f"{s['aural_words']} / {s['peer_words']}", fmt(100 * (s["matched_of_aural"] or 0), 0),
                fmt(100 * (s["matched_of_peer"] or 0), 0), fmt(s["start_median_s"]), fmt(s["start_p90_s"]),
                fmt(s["end_median_s"]), fmt(s["end_p90_s"])]

    header = ["clip", "s", "words Aural / fw", "matched % of Aural", "matched % of fw", "median |Δstart| s",
              "p90 |Δstart| s", "median |Δend| s", "p90 |Δend| s"]
    verdict = "met" if o["meets_target"] else "NOT met"
    lines = ["# Word timestamps: Aural vs faster-whisper (tiny.en, 18 English dev clips)", "",
             f"{meta['date']} · both greedy with word timestamps, {meta['threads']} threads · peer: {peer_label} · "
             "words matched by difflib.SequenceMatcher on normalised words · |Δ| in seconds.", "",
             f"**Pooled over {o['matched']} matched words: median |Δstart| {fmt(o['start_median_s'])} s, "
             f"median |Δend| {fmt(o['end_median_s'])} s (p90 {fmt(o['start_p90_s'])} / {fmt(o['end_p90_s'])} s). "
             f"Target: medians within {TARGET_S} s — {verdict}.**", "",
             md_table(header, [*(row(k, fmt(meta["clips"][k]["duration_s"], 1), s)
                                 for k, s in report["clips"].items()),
                               row("**all clips**", "", o)]), "",
             f"Total processing with word timestamps (one run, indicative): Aural {fmt(totals['aural'], 1)} s, "
             f"{peer_label} {fmt(totals['peer'], 1)} s.", ""]
    worst = sorted(((max(abs(p[1] - p[3]), abs(p[2] - p[4])), k, p) for k, c in report["clips"].items()
                    for p in c["pairs"]), reverse=True)[:N_WORST]
    lines += [f"## The {N_WORST} largest disagreements", "",
              md_table(["clip", "word", "Aural start–end s", "fw start–end s"],
                       [[k, p[0].strip(), f"{p[1]:.2f}–{p[2]:.2f}", f"{p[3]:.2f}–{p[4]:.2f}"]
                        for _, k, p in worst]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    common.ensure_bench_venv(Path(__file__).resolve(), argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute-type", default="float32",
                        help="faster-whisper compute type (float32: the CT2 float16 weights, unquantised)")
    parser.add_argument("--aural-device", default="auto")
    parser.add_argument("--name", default="words", help="results file stem")
    args = parser.parse_args(argv)

    prep = run_prep(["--all-dev", "--wtype", "f16"])
    audio = prep["audio"]
    inputs = [{"key": k, "path": v["path"]} for k, v in audio.items()]
    common_spec = {"threads": args.threads, "beam": 1, "warmup_s": 0, "word_timestamps": True, "inputs": inputs}
    peer_label = f"faster-whisper {args.compute_type}"
    print(f"words: Aural and {peer_label} on {len(inputs)} clips", file=sys.stderr, flush=True)
    aural_out = run_worker(aural_python(), {**common_spec, "engine": "aural", "model": prep["gguf"],
                                            "kv_mode": "device", "device": args.aural_device})
    peer_out = run_worker(str(common.BENCH_PYTHON), {**common_spec, "engine": "faster-whisper",
                                                      "model": prep["ct2_dir"], "compute_type": args.compute_type})
    report = compare(aural_out, peer_out)

    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
            "peer": peer_label, "target_s": TARGET_S, "models": {k: prep[k] for k in ("ct2_dir", "gguf")},
            "processing_s_total": {"aural": sum(r["processing_s"] for r in aural_out["results"]),
                                   "peer": sum(r["processing_s"] for r in peer_out["results"])},
            "machine": common.machine_info(),
            "clips": {k: {"duration_s": v["duration_s"]} for k, v in audio.items()}}
    texts = {r["key"]: {"aural": r["text"]} for r in aural_out["results"]}
    for r in peer_out["results"]:
        texts[r["key"]]["peer"] = r["text"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, **report, "texts": texts}, indent=1))
    (RESULTS / f"{args.name}.md").write_text(render(meta, report, peer_label), encoding="utf-8")
    o = report["overall"]
    print(f"words: median |Δstart| {o['start_median_s']:.3f} s, |Δend| {o['end_median_s']:.3f} s over "
          f"{o['matched']} matched words; wrote {RESULTS / (args.name + '.json')} and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
