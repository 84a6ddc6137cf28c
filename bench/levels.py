#!/usr/bin/env python3
"""One table and one plot of Aural against faster-whisper int8 at every CPU level, from bench/run.py's results.

Reads bench/results/peers.json (tiny.en, native level) and every peers-<model>-<level>.json that
`bench/run.py --level L [--model base]` wrote; writes bench/results/speed-levels.{json,md,png}. Ratios are
Aural's median processing time over faster-whisper int8's median at the same level, clip and mode (the
target is 0.7 or less), and over the fastest peer's, per round then the median (run.py's column).

    bench/.venv/bin/python bench/levels.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, fmt, md_table  # noqa: E402

LEVEL_ORDER = ("native", "icelake", "skylakex", "alderlake", "haswell", "sse42")
TARGET = 0.7


def load_runs() -> list[dict[str, Any]]:
    runs = []
    for path in sorted(RESULTS.glob("peers*.json")):
        data = json.loads(path.read_text())
        meta = data["meta"]
        runs.append({"file": path.name, "model": meta.get("model", "tiny.en"), "level": meta.get("level", "native"),
                     "cpu": meta["machine"].get("cpu", "?"), "date": meta["date"], "commit": meta["git"]["commit"],
                     "rounds": meta["rounds"], "rows": data["rows"], "clips": data["clips"]})
    runs.sort(key=lambda r: (r["model"] != "tiny.en", LEVEL_ORDER.index(r["level"])))
    return runs


def table_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    by = {(r["config"], r["clip"]): r for r in run["rows"]}
    out = []
    for clip in run["clips"]:
        for mode, sfx in (("greedy", ""), ("beam5", "-beam5")):
            aural, fw = by.get((f"aural-device{sfx}", clip)), by.get((f"fw-int8{sfx}", clip))
            if not aural or not fw or aural.get("processing_s_median") is None:
                continue
            wcpp = by.get((f"whispercpp-native{sfx}", clip))
            ratio = aural["processing_s_median"] / fw["processing_s_median"]
            out.append({
                "clip": clip, "audio_s": aural["audio_s"], "mode": mode,
                "aural_s": aural["processing_s_median"], "fw_int8_s": fw["processing_s_median"],
                "whispercpp_native_s": wcpp["processing_s_median"] if wcpp else None,
                "ratio_fw_int8": ratio, "ratio_fastest_peer": aural.get("ratio_to_fastest_peer_median"),
                "aural_decoder_ms": aural.get("native_token_ms_median"),
                "aural_wer": aural.get("wer_median"), "fw_wer": fw.get("wer_median"), "meets": ratio <= TARGET,
            })
    return out


def render(runs: list[dict[str, Any]]) -> str:
    lines = ["# Aural against faster-whisper int8 at each CPU level", "",
             "From bench/run.py (`--level`, `--model`): Aural's default (KV on the device) against faster-whisper "
             "int8 with CTranslate2 forced to the same instruction set (CT2_FORCE_CPU_ISA; from 2026-12-03 the "
             "oneMKL and oneDNN inside it as well: MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA), 2 threads, "
             "processing time after load and a warm-up pass, medians over interleaved rounds. "
             f"Target: Aural / faster-whisper int8 ≤ {TARGET}. Decoder ms = Aural's own time per decoder "
             "call (compute + KV I/O + logits + sampling; a beam-5 call advances all 5 beams). Each run names "
             "its CPU: the ones that read only \"AMD EPYC\" were taken before reports named the core, on the "
             "Zen 4 VM (AVX-512 VNNI) of 2026-12-01; a KVM guest names Zen 2, 3 and 4 alike.", ""]
    for run in runs:
        rows = table_rows(run)
        met = sum(r["meets"] for r in rows)
        lines += [f"## {run['model']}, level {run['level']}, {run['cpu']}", "",
                  f"CPU: {run['cpu']} · {run['date']} · commit {run['commit']} · {run['rounds']} round(s) · "
                  f"`{run['file']}` · target met in {met} of {len(rows)}", "",
                  md_table(["clip", "mode", "Aural s", "faster-whisper int8 s", "whisper.cpp native s",
                            "Aural / fw int8", "Aural / fastest peer", "Aural decoder ms", "WER Aural / fw %"],
                           [[r["clip"], r["mode"], fmt(r["aural_s"]), fmt(r["fw_int8_s"]),
                             fmt(r["whispercpp_native_s"]), f"**{fmt(r['ratio_fw_int8'])}**" if not r["meets"]
                             else fmt(r["ratio_fw_int8"]), fmt(r["ratio_fastest_peer"]), fmt(r["aural_decoder_ms"]),
                             f"{fmt(100 * r['aural_wer'], 1) if r['aural_wer'] is not None else 'n/a'} / "
                             f"{fmt(100 * r['fw_wer'], 1) if r['fw_wer'] is not None else 'n/a'}"]
                            for r in rows]), ""]
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, mode in zip(axes, ("greedy", "beam5")):
        labels, width = [], 0.8 / max(1, len(runs))
        clips = list(dict.fromkeys(r["clip"] for run in runs for r in table_rows(run)))
        for i, run in enumerate(runs):
            rows = {r["clip"]: r for r in table_rows(run) if r["mode"] == mode}
            xs = [k + i * width for k, c in enumerate(clips) if c in rows]
            ax.bar(xs, [rows[c]["ratio_fw_int8"] for c in clips if c in rows], width,
                   label=f"{run['model']} {run['level']} {run['cpu'].split(';')[0]}")
        labels = [c.split(".")[0].replace("en_librivox_shakespeare_", "").replace("_whispercpp", "") for c in clips]
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(clips))])
        ax.set_xticklabels(labels, fontsize=8)
        ax.axhline(TARGET, color="k", linestyle="--", linewidth=1)
        ax.set_title(f"Aural / faster-whisper int8, {mode}", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("processing time ratio (lower is faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    runs = load_runs()
    out = {"target": TARGET, "runs": [{k: v for k, v in run.items() if k not in ("rows", "clips")}
                                      | {"table": table_rows(run)} for run in runs]}
    (RESULTS / "speed-levels.json").write_text(json.dumps(out, indent=1))
    (RESULTS / "speed-levels.md").write_text(render(runs))
    plot(runs, RESULTS / "speed-levels.png")
    print(f"wrote {RESULTS / 'speed-levels.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
