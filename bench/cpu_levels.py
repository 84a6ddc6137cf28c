#!/usr/bin/env python3
"""Aural at every CPU level this machine runs (issue #16): for each of ggml's CPU variants named, the dev-clip
WER greedy and beam 5, the fraction of tokens identical to the best level's, JFK in every weight type
(f16, q8_0, q5_0, q4_0), and optionally the engine tests' pass count at that level.

Each level runs in its own process with AURAL_CPU_VARIANT set, from the project venv (no peers needed):

    .venv/bin/python bench/cpu_levels.py                          # haswell, skylakex, icelake and the best
    .venv/bin/python bench/cpu_levels.py --levels haswell,zen4 --tests

Outputs bench/results/cpu-levels.json, .md and .png (`--render` redraws the Markdown and the plot from the
JSON; the plot needs matplotlib, which bench/.venv has). Token agreement, per mode over all clips, against the reference level (the best this CPU runs):
"same tokens" counts the tokens in the blocks difflib matches between the two token lists, over the
reference's tokens; "same prefix" only those before the first difference (the strict reading: after a
divergence every later token counts as different).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, RESULTS, english_dev_clips, machine_info, md_table, word_errors  # noqa: E402

WEIGHT_TYPES = ("f16", "q8_0", "q5_0", "q4_0")
TEST_FILES = ("tests/test_native.py", "tests/test_transcribe.py", "tests/test_decoding.py", "tests/test_cpu.py")
JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."


def worker() -> dict[str, Any]:
    """In a process whose AURAL_CPU_VARIANT is set: every dev clip greedy and beam 5, JFK per weight type."""
    from aural.engine import cpu
    from aural.engine.models.store import resolve_model
    from aural.engine.runtime import WhisperModel
    from aural.engine.transcribe import TranscribeOptions, transcribe

    level = cpu.configure()
    model = WhisperModel(resolve_model("tiny.en"))
    out: dict[str, Any] = {"variant": level.variant, "kernel_isa": level.kernel_isa, "bufts": level.bufts,
                           "modes": {}, "jfk": {}}
    for mode, beam in (("greedy", None), ("beam5", 5)):
        clips = {}
        for clip in english_dev_clips():
            raw = {"raw_rate": 16000, "raw_format": "s16le"} if clip.path.suffix == ".raw" else {}
            segments = list(transcribe(model, clip.path, TranscribeOptions(beam_size=beam), **raw))
            clips[clip.name] = {"text": "".join(s.text for s in segments), "tokens": [t for s in segments for t in s.tokens]}
        out["modes"][mode] = clips
    jfk = next(c for c in english_dev_clips() if c.name.startswith("en_jfk"))
    for wtype in WEIGHT_TYPES:
        try:
            m = WhisperModel(resolve_model("tiny.en", wtype=wtype))
            text = "".join(s.text for s in transcribe(m, jfk.path))
            out["jfk"][wtype] = {"text": text, "errors": word_errors(JFK, text)[0]}
        except Exception as exc:  # a weight type that fails at a level is a result, not a crash of the run
            out["jfk"][wtype] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def run_level(name: str, with_tests: bool) -> dict[str, Any]:
    env = {**os.environ, "AURAL_CPU_VARIANT": name}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"variant": name, "failed": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["seconds"] = round(time.perf_counter() - start, 1)
    if with_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_FILES],
                               capture_output=True, text=True, env=env, cwd=REPO)
        lines = tests.stdout.strip().splitlines()
        result["tests"] = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "no summary")
    return result


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def matched(a: list[int], b: list[int]) -> int:
    return sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())


def summarise(levels: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    ref = next(lv for lv in levels if lv.get("variant") == reference)
    clips = {c.name: c.reference for c in english_dev_clips()}
    rows = []
    for lv in levels:
        if "failed" in lv:
            rows.append({"variant": lv["variant"], "failed": lv["failed"]})
            continue
        row: dict[str, Any] = {"variant": lv["variant"], "kernel_isa": lv["kernel_isa"], "tests": lv.get("tests")}
        for mode, per_clip in lv["modes"].items():
            errors = words = same = prefix = total = 0
            for file, got in per_clip.items():
                e, w = word_errors(clips[file], got["text"])
                errors, words = errors + e, words + w
                theirs = ref["modes"][mode][file]["tokens"]
                same += matched(got["tokens"], theirs)
                prefix += common_prefix(got["tokens"], theirs)
                total += len(theirs)
            row[f"wer_{mode}"] = errors / words
            row[f"same_tokens_{mode}"] = same / total
            row[f"same_prefix_{mode}"] = prefix / total
        row["jfk"] = {w: r.get("errors", r.get("error")) for w, r in lv["jfk"].items()}
        rows.append(row)
    return rows


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    header = ["level", "kernels", "WER greedy", "WER beam 5", "same tokens (prefix) greedy",
              "same tokens (prefix) beam 5", "JFK errors f16 / q8_0 / q5_0 / q4_0", "engine tests"]
    body = []
    for r in rows:
        if "failed" in r:
            body.append([r["variant"], "failed: " + " ".join(r["failed"]), "", "", "", "", "", ""])
            continue
        jfk = " / ".join(str(r["jfk"][w]) for w in WEIGHT_TYPES)
        same = [f"{r[f'same_tokens_{m}']:.1%} ({r[f'same_prefix_{m}']:.1%})" for m in ("greedy", "beam5")]
        body.append([r["variant"], r["kernel_isa"], f"{r['wer_greedy']:.1%}", f"{r['wer_beam5']:.1%}", *same, jfk,
                     r.get("tests") or "not run"])
    return "\n".join([
        "# Aural at each CPU level",
        "",
        f"CPU: {meta['machine'].get('cpu')}, {meta['machine'].get('cpus')} cores; {meta['date']}; commit {meta['commit']}.",
        f"Reference level for token agreement: {meta['reference']}. Command: `{meta['command']}`.",
        "",
        "Dev clips: the 18 English clips of shared/data (WER: all errors over all reference words, openai-whisper's",
        "normaliser). Same tokens: tokens in difflib's matching blocks with the reference level, over its tokens;",
        "in brackets, only those before the first difference. Kernels: the widest instructions Aural's own use.",
        "JFK errors: word errors against the 22-word reference for each weight type.",
        "",
        md_table(header, body),
        "",
    ])


def plot(meta: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> bool:
    """WER and token agreement per level as bars; False where matplotlib is missing (the project venv has
    none: `bench/.venv/bin/python bench/cpu_levels.py --render` draws it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in rows if "failed" not in r]
    names = [f"{r['variant']}\n({r['kernel_isa']})" for r in rows]
    fig, (wer_ax, same_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (mode, label) in enumerate((("greedy", "greedy"), ("beam5", "beam 5"))):
        xs = [j + 0.4 * i for j in range(len(rows))]
        wer_ax.bar(xs, [100 * r[f"wer_{mode}"] for r in rows], width=0.4, label=label)
        same_ax.bar(xs, [100 * r[f"same_tokens_{mode}"] for r in rows], width=0.4, label=label)
    for ax, title in ((wer_ax, "dev-clip WER (%)"), (same_ax, "tokens the same as the best level (%)")):
        ax.set_xticks([j + 0.2 for j in range(len(rows))], names, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Aural tiny.en per CPU level, on {meta['machine'].get('cpu')} ({meta['machine'].get('cpus')} cores)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--levels", default="", help="comma-separated ggml CPU variants (default: haswell, "
                                                     "skylakex, icelake and the best this CPU runs)")
    parser.add_argument("--tests", action="store_true", help="also run the engine tests at each level")
    parser.add_argument("--name", default="cpu-levels")
    parser.add_argument("--render", action="store_true", help="only redraw <name>.md from <name>.json")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker()))
        return 0
    if args.render:
        stored = json.loads((RESULTS / f"{args.name}.json").read_text())
        stored["rows"] = summarise(stored["levels"], stored["meta"]["reference"])
        (RESULTS / f"{args.name}.json").write_text(json.dumps(stored, indent=1))
        (RESULTS / f"{args.name}.md").write_text(render(stored["meta"], stored["rows"]))
        plot(stored["meta"], stored["rows"], RESULTS / f"{args.name}.png")
        print(render(stored["meta"], stored["rows"]))
        return 0
    from aural import _native

    runnable = [v["name"] for v in _native.cpu_variants() if v["score"] > 0]
    wanted = args.levels.split(",") if args.levels else [
        *[n for n in ("haswell", "skylakex", "icelake") if n in runnable], runnable[0]]
    wanted = list(dict.fromkeys([*wanted, runnable[0]]))  # the reference level always runs
    levels = [run_level(name, args.tests) for name in wanted]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
            "commit": commit, "reference": runnable[0], "command": "bench/cpu_levels.py " + " ".join(argv)}
    rows = summarise(levels, runnable[0])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "levels": levels}, indent=1))
    (RESULTS / f"{args.name}.md").write_text(render(meta, rows))
    plot(meta, rows, RESULTS / f"{args.name}.png")
    print(render(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
