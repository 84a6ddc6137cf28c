#!/usr/bin/env python3
"""Qwen3-ASR's text decoder at the 0.6B shape (issue #23): prompt and per-token cost, KV on the device
against the host baseline, per weight type.

No real checkpoint is available, so the weights are random ones of the release's shape, made by Qwen's own code
(tools/qwen-reference, `make qwen-reference`; 1.9 GB bf16, about 40 s and 6 GB of memory once) and converted
by `aural models convert`. Where that code cannot run (the device machine has no qwen-asr package and no
network), `--maker numpy` makes them with the tests' numpy tooling instead (tests/test_qwen3_asr.py
make_checkpoint at the same widths, 44 s and 9.5 GB on 2 cores; its small synthetic vocabulary keeps the
official special ids out, which timing does not read). Timing does not depend on the values. The prompt is a
transcription prompt of 30 s of audio as the official processor builds it: the system and user turns around 390
audio vectors (random here), 405 tokens in all (421 with the numpy checkpoint's tokenizer); the audio tower's
time on 30 s of log-mel. Each configuration runs in a process of its own (its peak RSS is its own): load, prompt
batch, then --steps greedy steps.

KV bytes per token: 2 (K, V) x 28 layers x 8 K/V heads x 128 x 2 bytes (f16) = 112 KiB. Host mode moves the
whole history to the device before every call and the new rows back after it: the traffic a decoder pays
that rebuilds its KV prefix every token (the design's 80.6 ms/token on one AMD GPU).

    .venv/bin/python bench/qwen3_asr.py --rounds 3
    GGML_VK_VISIBLE_DEVICES=0 .venv-vulkan/bin/python bench/qwen3_asr.py --device Vulkan0 --wtypes q8_0 --rounds 1 \
        --steps 8 --name qwen3-asr-vulkan-llvmpipe   # make setup-vulkan first
    python3 bench/qwen3_asr.py --device CUDA0 --maker numpy --ckpt /tmp/q06 --wtypes q8_0,f16 --rounds 1 \
        --name qwen3-asr-cuda                        # tools/device-run.sh, on a lent GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CACHE, RESULTS, machine_info, md_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_PYTHON = ROOT / "build" / "qwen-reference" / "bin" / "python"
N_AUDIO = 390  # 30 s: 3000 mel frames in 30 chunks of 100, 13 vectors each

WORKER = r"""
import json, resource, sys, time
import numpy as np
from tokenizers import Tokenizer
from aural import _native
import gguf

path, kv_mode, steps, n_audio, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t = time.perf_counter()
model = _native.Qwen3Model(path, n_threads=2, device=device)
load_s = time.perf_counter() - t
field = gguf.GGUFReader(path).fields["tokenizer.huggingface.json"]
tok = Tokenizer.from_str(bytes(field.parts[field.data[0]]).decode())
ids = lambda text: tok.encode(text, add_special_tokens=False).ids
prompt = (ids("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>") + [model.audio_token] * n_audio
          + ids("<|audio_end|><|im_end|>\n<|im_start|>assistant\n"))
encoder = _native.Qwen3AudioEncoder(model)
mel = np.random.default_rng(1).normal(0, 1, (128, 3000)).astype(np.float32)  # 30 s
encoder.encode(mel[:, :800])  # warm-up: the compute buffer
t = time.perf_counter()
audio = encoder.encode(mel)
encode_ms = (time.perf_counter() - t) * 1e3
assert audio.shape[0] == n_audio
ctx = _native.Qwen3Context(model, n_ctx=len(prompt) + steps + 8, kv_mode=kv_mode)
t = time.perf_counter()
logits = ctx.decode(np.array(prompt, dtype=np.int32), audio=audio)
prefill_ms = (time.perf_counter() - t) * 1e3
prefill = ctx.last_timings
per_step = []
for _ in range(steps):
    t = time.perf_counter()
    logits = ctx.decode(np.array([logits.argmax()], dtype=np.int32))
    per_step.append({**ctx.last_timings, "wall_ms": (time.perf_counter() - t) * 1e3})
mean = lambda k: sum(s[k] for s in per_step) / len(per_step)
print(json.dumps({"load_s": load_s, "encode_ms": encode_ms, "prompt_tokens": len(prompt), "prefill_ms": prefill_ms,
                  "prefill_kv_io_ms": prefill["kv_io_ms"], "step_ms": mean("wall_ms"),
                  "step_compute_ms": mean("compute_ms"), "step_kv_io_ms": mean("kv_io_ms"),
                  "step_build_ms": mean("build_ms"), "steps_reused": sum(s["reused"] for s in per_step),
                  "step_kv_io_mib": mean("kv_io_bytes") / 2**20, "kv_bytes": ctx.kv_bytes,
                  "weights_mib": model.weights_bytes / 2**20,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


# --maker numpy, in a process of its own (a child forked from a process of 9 GB would report that as its peak RSS):
# the tests' checkpoint at the released model's widths (tools/qwen-reference/checkpoint.py, _AUDIO_0_6B, _TEXT_0_6B).
NUMPY_MAKER = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_qwen3_asr import make_checkpoint

def widths(config):
    thinker = config["thinker_config"]
    thinker["audio_config"].update(num_mel_bins=128, encoder_layers=18, encoder_attention_heads=14,
                                   encoder_ffn_dim=3584, d_model=896, output_dim=1024, downsample_hidden_size=480)
    thinker["text_config"].update(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                  num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    thinker["text_config"]["rope_scaling"]["mrope_section"] = [24, 20, 20]  # 64 rotary pairs

make_checkpoint(Path(sys.argv[1]), edit=widths)
"""


def checkpoint(path: Path, maker: str) -> Path:
    """The random 0.6B checkpoint at path, made first if it is not there: by Qwen's code ("official"), by numpy
    ("numpy"), or by the first of them that can run here ("auto")."""
    if (path / "model.safetensors").is_file():
        return path
    if maker == "auto":
        maker = "official" if REFERENCE_PYTHON.is_file() else "numpy"
    if maker == "numpy":
        subprocess.run([sys.executable, "-c", NUMPY_MAKER, str(path), str(ROOT / "tests")], check=True)
    elif not REFERENCE_PYTHON.is_file():
        raise SystemExit(f"no checkpoint at {path} and no reference venv to make one: make qwen-reference")
    else:
        subprocess.run([str(REFERENCE_PYTHON), str(ROOT / "tools" / "qwen-reference" / "reference.py"),
                        "make-checkpoint", str(path), "--shape", "0.6b", "--seed", "0"], check=True)
    return path


def gguf_of(ckpt: Path, wtype: str) -> Path:
    out = CACHE / "qwen3" / f"{ckpt.name}-{wtype}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "aural.engine.cli", "models", "convert", str(ckpt), "--type", wtype,
                        "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


# Configurations per weight type: KV mode, and graph reuse off (AURAL_NO_GRAPH_REUSE=1) to show what it saves.
MODES = {"device": ("device", {}), "host": ("host", {}),
         "device, no graph reuse": ("device", {"AURAL_NO_GRAPH_REUSE": "1"})}


def run_script(script: str, *args: str, env: dict[str, str] | None = None):
    """The JSON that `python -c script args` prints last; a failure ends the benchmark with its stderr."""
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=False,
                         env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_once(path: Path, mode: str, steps: int, device: str) -> dict:
    kv_mode, env = MODES[mode]
    return run_script(WORKER, str(path), kv_mode, str(steps), str(N_AUDIO), device, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", type=Path, default=ROOT / "build" / "qref" / "0.6b")
    p.add_argument("--wtypes", default="f16,q8_0")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--name", default="qwen3-asr")
    p.add_argument("--device", default="cpu", help="ggml device: cpu, Vulkan0, CUDA0 (default: cpu)")
    p.add_argument("--maker", choices=("auto", "official", "numpy"), default="auto",
                   help="what makes the checkpoint when --ckpt has none (default: Qwen's code where it runs)")
    args = p.parse_args(argv)
    ckpt = checkpoint(args.ckpt, args.maker)
    configs = [(w, mode) for w in args.wtypes.split(",") for mode in MODES]
    runs: dict[str, list[dict]] = {f"{w}/{m}": [] for w, m in configs}
    for r in range(args.rounds):  # interleaved
        for w, mode in configs:
            runs[f"{w}/{mode}"].append(run_once(gguf_of(ckpt, w), mode, args.steps, args.device))
            print(f"round {r + 1} {w}/{mode}: {runs[f'{w}/{mode}'][-1]['step_ms']:.2f} ms/token", flush=True)
    med = {k: {f: statistics.median(run[f] for run in v) for f in v[0]} for k, v in runs.items()}
    rows = [[k, f"{m['weights_mib']:.0f}", f"{m['encode_ms']:.0f}", m["prompt_tokens"], f"{m['prefill_ms']:.0f}",
             f"{m['step_ms']:.1f}", f"{m['step_compute_ms']:.1f}", f"{m['step_build_ms']:.2f}",
             f"{m['step_kv_io_ms']:.2f}", f"{m['step_kv_io_mib']:.1f}", f"{m['kv_bytes'] / 2**20:.1f}",
             f"{m['peak_rss_mib']:.0f}"] for k, m in med.items()]
    table = md_table(["weights / KV mode", "weights MiB", "audio tower ms / 30 s", "prompt tokens", "prompt ms",
                      "ms/token", "compute ms/token", "graph build ms/token", "KV I/O ms/token", "KV MiB moved/token",
                      "KV arena MiB", "peak RSS MiB"], rows)
    meta = {**machine_info(), "rounds": args.rounds, "steps": args.steps, "checkpoint": str(ckpt),
            "device": args.device}
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "runs": runs, "median": med}, indent=1))
    text = (f"# Qwen3-ASR text decoder, 0.6B shape (random weights)\n\n{meta['cpu']}, 2 threads, ggml device "
            f"{args.device}; "
            f"median of {args.rounds} interleaved rounds, each a process: load, the audio tower on 30 s of log-mel "
            "(3000 frames: 30 chunks, 4 attention windows), the prompt of that clip "
            f"({N_AUDIO} audio vectors) in one batch, then {args.steps} greedy steps (ms/token: their mean, "
            "wall time of the call). KV arena f16: 112 KiB per token. Host: the history goes up before every "
            "call and the new row comes back (the baseline). Graph build: building and allocating a step's graph, "
            "0 where the step reuses the first step's (the default; `AURAL_NO_GRAPH_REUSE=1` turns reuse off)."
            + "".join(f" Set: `{k}={v}`." for k, v in meta["env"].items()) + f"\n\n{table}\n")
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
