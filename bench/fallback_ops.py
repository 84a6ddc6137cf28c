#!/usr/bin/env python3
"""Which ops of Aural's graphs leave the primary device for the CPU, per ggml backend (#18).

Run with the interpreter that has Aural built for the backend; no bench/.venv is needed:

    .venv/bin/python bench/fallback_ops.py                                       # the CPU backend
    GGML_VK_VISIBLE_DEVICES=0 .venv-vulkan/bin/python bench/fallback_ops.py --backend Vulkan0
    .venv/bin/python bench/fallback_ops.py --render                              # only the table
    python3 bench/fallback_ops.py --backend CUDA0 --out $OUT/fallback-ops-cuda0.json  # tools/device-run.sh

Each run loads tiny.en on the device and builds every graph shape a transcription uses: the encoder (a 15 s
and a 30 s window), the decoder's prompt, a one-token step, a step of 5 beams and a prompt longer than the
device's ubatch (decoded in pieces). The scheduler's own assignment is read back from each (the context's
backend_report): nodes per backend, the distinct ops that fell back to the CPU, the graph splits.
Writes bench/results/fallback-ops-<backend>.json; bench/results/fallback-ops.md tables every JSON there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, RESULTS, machine_info, md_table  # noqa: E402

JFK = "en_jfk_openai_whisper.16k.wav"
SOT, NO_TIMESTAMPS, TOKEN = 50257, 50362, 400  # tiny.en: start of transcript, no timestamps, " ("
LONG_PROMPT = 63  # tokens: three pieces where a device takes 31 per graph (Vulkan), one graph elsewhere


def probe(backend: str) -> dict:
    """Every graph shape of a transcription on `backend`, and where the scheduler put its nodes."""
    import numpy as np

    from aural.engine import audio, features
    from aural.engine.models.store import resolve_model
    from aural.engine.runtime import WhisperModel

    model = WhisperModel(resolve_model(None), device=backend)
    mel = features.log_mel_spectrogram(features.pad_or_trim(audio.load_audio(DATA / JFK), features.N_SAMPLES))
    ctx = model.new_session(n_seq=5)
    graphs = {}

    def record(name: str, part: str) -> None:
        graphs[name] = ctx.backend_report[part]

    for frames in (features.N_FRAMES // 2, features.N_FRAMES):
        ctx.encode(np.ascontiguousarray(mel[:, :frames]))
        record(f"encoder, {frames // 100} s window", "encoder")
    ctx.decode(np.array([SOT, NO_TIMESTAMPS], dtype=np.int32), 0)
    record("decoder prompt (2 tokens)", "decoder")
    ctx.decode(np.array([TOKEN], dtype=np.int32), 2)
    record("decoder step (1 token)", "decoder")
    ctx.reorder([0] * 5)
    ctx.decode(np.full(5, TOKEN, dtype=np.int32), 3, list(range(5)), list(range(5)))
    record("decoder step (5 beams)", "decoder")
    ctx.decode(np.full(LONG_PROMPT, TOKEN, dtype=np.int32), 0)
    record(f"decoder prompt ({LONG_PROMPT} tokens, {ctx.last_timings['n_graphs']} graph(s))", "decoder")
    info = next((d for d in model_devices() if d["name"] == model.device), {})
    return {"backend": model.device, "description": info.get("description", "?"), "ubatch": ctx.stats["ubatch"],
            "graphs": graphs}


def model_devices() -> list[dict]:
    from aural import _native

    return list(_native.devices())


def render() -> None:
    docs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("fallback-ops-*.json"))]
    rows = []
    for doc in docs:
        for graph, r in doc["graphs"].items():
            nodes = r["nodes_per_backend"]
            primary = nodes.get(r["primary"], 0)
            on_cpu = nodes.get("CPU", 0) if r["primary"] != "CPU" else 0
            rows.append((f"{doc['backend']} ({doc['description']})", graph, primary, on_cpu, r["n_splits"],
                         ", ".join(r["fallback_ops"]) or "none"))
    lines = [
        "# Ops that fall back to the CPU, per backend",
        "",
        "Graphs of tiny.en (f16) as a transcription builds them, with the scheduler's node assignment read "
        "back from each (`bench/fallback_ops.py`). Aural's own CPU kernels (int8 products, GELU, encoder "
        "attention) are never put in a non-CPU device's graph: there the graphs use ggml's ops.",
        "",
        *(f"- {d['backend']}: {d['date']} · CPU {d['machine'].get('cpu')}, {d['machine'].get('cpus')} cores · "
          f"decoder ubatch {d['ubatch']} tokens · `{d['command']}`" for d in docs),
        "",
        md_table(("device", "graph", "nodes on the device", "nodes on the CPU", "splits", "fallback ops"), rows),
        "",
        "CUDA: built by `make check-cuda`, not run here (no GPU on the dev VMs); `tools/device-run.sh` adds its "
        "JSON where a GPU is lent.",
        "",
    ]
    (RESULTS / "fallback-ops.md").write_text("\n".join(lines))
    print("wrote bench/results/fallback-ops.md", file=sys.stderr)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="CPU")
    parser.add_argument("--render", action="store_true", help="only rewrite the Markdown from the JSON files")
    parser.add_argument("--out", type=Path, help="write the JSON here instead (tools/device-run.sh), no Markdown")
    args = parser.parse_args(argv)
    if not args.render:
        doc = probe(args.backend)
        doc.update(date=time.strftime("%Y-%m-%dT%H:%M:%S"), machine=machine_info(),
                   command="bench/fallback_ops.py " + " ".join(argv))
        out = args.out or RESULTS / f"fallback-ops-{doc['backend'].lower()}.json"
        out.write_text(json.dumps(doc, indent=1))
        for graph, r in doc["graphs"].items():
            print(f"{doc['backend']} {graph}: {r['nodes_per_backend']} fallback {r['fallback_ops']}", flush=True)
        if args.out:
            return 0
    render()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
