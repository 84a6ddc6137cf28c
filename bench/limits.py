#!/usr/bin/env python3
"""How close Aural's decoder step and encoder window come to this machine's physical limits, per CPU level.

- Decoder: bytes one step must read (int8 layer projections a token multiplies, the output screen, the
  window's cross-attention K/V, the self K/V so far) over the read bandwidth measured here with 2 threads
  (numpy sums, one half of the buffer per thread, best of 5). A step cannot take less. The buffer is the
  step's own size where the last-level cache holds it (steps read the same weights again, so they come from
  that cache: the Sapphire Rapids-class VM reports 480 MiB of L3), else 4 times that cache, at least 512 MiB;
  the memory rate is reported beside it.
- Encoder: multiply-adds of one 30 s window (projections in int8 where the level runs Aural's int8 kernel,
  attention and convolutions in f32) over the peak rate of 2 cores at the clock /proc/cpuinfo reports:
  f32 16 FMA lanes per core per cycle (two 256-bit FMA pipes: Zen 4, and Intel since Haswell; 32 on an Intel
  core running AVX-512, whose two pipes are 512 bits wide on the Xeons; rows before 2026-12-05 took 16
  there too), int8 64 lanes
  with VNNI (VPDPBUSD on both pipes) and 32 with AVX2 (VPMADDUBSW + VPMADDWD pairs), 1024 on AMX tiles
  (one TDPBUSD, 16 x 16 x 64 multiply-adds, every 16 cycles). The lane counts are the vendors' published
  throughputs (AMD's Zen 4 and Intel's optimisation manuals), not measured here.

Measured: Aural's own times, one process, after a warm-up: encoder ms per 30 s window (median of 5) and
decoder ms per call (median of 200 greedy and 200 beam-5 calls at 30 past tokens), 2 threads.

    .venv/bin/python bench/limits.py                       # tiny.en at this process's level (AURAL_CPU_VARIANT)
    AURAL_CPU_VARIANT=haswell .venv/bin/python bench/limits.py
    .venv/bin/python bench/limits.py base                  # a model name or .gguf path

Writes bench/results/limits-<level>[-<core>][-amx][-<model>].json (no model suffix: tiny.en) and rewrites bench/results/limits.md from every level's JSON
(`--render`: only the latter).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 2**30


def read_bandwidth(threads: int = 2, nbytes: int = 512 * 2**20) -> float:
    """Bytes per second that `threads` threads read from one buffer of `nbytes`, each its share, as many
    times over as make 1 GiB (thread start-up then costs little against a buffer the caches hold)."""
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    parts = np.array_split(buf, threads)
    passes = max(1, GIB // buf.nbytes)

    def read(part: np.ndarray) -> None:
        for _ in range(passes):
            np.add.reduce(part)  # releases the GIL

    best = 0.0
    for _ in range(5):
        workers = [threading.Thread(target=read, args=(p,)) for p in parts]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, passes * buf.nbytes / (time.perf_counter() - start))
    return best


def cache_bytes() -> int:
    """The last-level cache as sysfs reports it (the largest index of cpu0), 0 where unknown. VMs may report
    their host's: a Sapphire Rapids-class guest reported 480 MiB of L3."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=0)


def clock_hz() -> float:
    text = Path("/proc/cpuinfo").read_text()
    return float(re.search(r"cpu MHz\s*:\s*([\d.]+)", text).group(1)) * 1e6


def measure(model_path: str) -> dict:
    from aural.engine.cpu import configure, cpu_class
    from aural.engine.features import window_mel
    from aural.engine.runtime import WhisperModel

    level = configure()
    model = WhisperModel(model_path, n_threads=2)
    hp = model._model.hparams
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(480_000)).astype(np.float32)
    mel = window_mel(audio, model.mel_filters, 3000)
    times = {}
    for beam in (1, 5):
        ctx = model.new_session(n_seq=beam)
        enc = []
        for _ in range(6):
            start = time.perf_counter()
            ctx.encode(mel)
            enc.append((time.perf_counter() - start) * 1000)
        times["encoder_ms"] = statistics.median(enc[1:])
        prompt = np.asarray(list(model.tokenizer.sot_sequence) + [440] * 27, dtype=np.int32)
        ctx.decode(prompt, 0)
        ctx.reorder([0] * beam)
        lanes = list(range(beam))
        calls = []
        for i in range(220):
            tokens = np.full(beam, 440 + i % 7, dtype=np.int32)
            start = time.perf_counter()
            ctx.decode(tokens, prompt.size, lanes, lanes)  # the same position: the step's cost at 30 past tokens
            calls.append((time.perf_counter() - start) * 1000)
        times[f"decoder_ms_beam{beam}"] = statistics.median(calls[20:])
    native = model._model
    n, n_vocab, n_layer = hp["n_text_state"], hp["n_vocab"], hp["n_text_layer"]
    int8 = bool(native.int8)
    per_weight = 1 if int8 else 2  # int8 copies, else the f16 matrices
    # A step multiplies self q, k, v, o, cross q, o (n x n each) and fc1, fc2 (4n x n each) per layer.
    layer_bytes = n_layer * (6 * n * n + 8 * n * n) * per_weight
    screen = native.screen_bytes or n_vocab * n * 2
    cross_kv = n_layer * 2 * hp["n_audio_ctx"] * n * 2  # f16 K and V of a 30 s window
    self_kv = n_layer * 2 * 30 * n * 2
    bytes_per_step = layer_bytes + screen + cross_kv + self_kv
    # Memory: a buffer 4 times the last-level cache (at least 512 MiB). A step's bytes, read again every
    # step, stay in a cache that holds them: its floor is the rate of reading a buffer of that size.
    llc = cache_bytes()
    memory_bw = read_bandwidth(nbytes=max(512 * 2**20, 4 * llc))
    bw = read_bandwidth(nbytes=bytes_per_step) if bytes_per_step <= llc else memory_bw
    n_audio, n_ctx = hp["n_audio_state"], hp["n_audio_ctx"]
    proj = hp["n_audio_layer"] * (4 * n_audio * n_audio + 8 * n_audio * n_audio) * n_ctx
    attention = hp["n_audio_layer"] * 2 * n_ctx * n_ctx * n_audio
    conv = hp["n_mels"] * 3 * n_audio * 2 * n_ctx + n_audio * 3 * n_audio * n_ctx
    isa = level.kernel_isa
    int8_lanes = (1024 if level.int8_kernel == "amx" else 64 if isa == "avx512_vnni" else 32) if int8 else 0
    intel = "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    f32_lanes = (32 if intel and isa in ("avx512", "avx512_vnni") else 16) if isa != "baseline" else 4
    hz = clock_hz()
    f32_rate = 2 * f32_lanes * hz
    int8_rate = 2 * int8_lanes * hz
    enc_floor_s = (proj / int8_rate if int8 else proj / f32_rate) + (attention + conv) / f32_rate
    return {
        "model": Path(model_path).stem.removesuffix("-f16"), "cpu": cpu_class(), "level": level.variant,
        "kernel_isa": isa, "int8_kernel": level.int8_kernel, "int8": int8, "clock_ghz": hz / 1e9,
        "llc_mib": llc / 2**20, "memory_gib_s": memory_bw / GIB, "read_gib_s": bw / GIB,
        "decoder": {"bytes_per_step": bytes_per_step, "layers": layer_bytes, "screen": screen, "cross_kv": cross_kv,
                    "self_kv": self_kv, "floor_ms": bytes_per_step / bw * 1000,
                    "greedy_ms": times["decoder_ms_beam1"], "beam5_ms": times["decoder_ms_beam5"]},
        "encoder": {"macs": proj + attention + conv, "projection_macs": proj, "attention_macs": attention,
                    "conv_macs": conv, "f32_gmacs": f32_rate / 1e9, "int8_gmacs": int8_rate / 1e9,
                    "floor_ms": enc_floor_s * 1000, "measured_ms": times["encoder_ms"]},
    }


def _rates(r: dict) -> str:
    """The decoder floor's read rate, and the memory's where the floor read from a cache (runs before
    2026-12-05 measured memory alone)."""
    memory = r.get("memory_gib_s", r["read_gib_s"])
    step = f"{r['read_gib_s']:.1f}"
    return step if abs(memory - r["read_gib_s"]) < 0.05 else f"{step} in cache ({memory:.1f})"


def render() -> str:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("limits-*.json"))]
    lines = ["# Decoder and encoder against the physical limits", "",
             "2 threads. `bench/limits.py` (its docstring has the method). A CPU that reads only \"AMD EPYC\" is the "
             "Zen 4 VM of 2026-12-01, measured before reports named the core.", "",
             "| model | CPU | level | kernels | read GiB/s (2 threads; memory where not the same) | decoder bytes/step MiB | decoder floor ms | greedy ms (fraction of floor reached) "
             "| beam-5 step ms | encoder GMAC / 30 s window | peak GMAC/s f32 · int8 | encoder floor ms | measured ms (fraction) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        d, e = r["decoder"], r["encoder"]
        lines.append(
            f"| {r.get('model', 'tiny.en')} | {r['cpu']} | {r['level']} | {r['kernel_isa']}{' + int8' if r['int8'] else ''}{' (AMX)' if r.get('int8_kernel') == 'amx' else ''} | {_rates(r)} "
            f"| {d['bytes_per_step'] / 2**20:.1f} | {d['floor_ms']:.2f} | {d['greedy_ms']:.2f} "
            f"({d['floor_ms'] / d['greedy_ms']:.0%}) | {d['beam5_ms']:.2f} | {e['macs'] / 1e9:.1f} "
            f"| {e['f32_gmacs']:.0f} · {e['int8_gmacs']:.0f} | {e['floor_ms']:.0f} | {e['measured_ms']:.0f} "
            f"({e['floor_ms'] / e['measured_ms']:.0%}) |")
    lines += ["", "Decoder bytes: int8 (or f16) projections a token multiplies, the int8 (or q8_0) output screen, "
              "the f16 cross K/V of a 30 s window and the self K/V of 30 tokens; a beam-5 step reads the same "
              "weights once for its 5 rows. Encoder floor: projections at the int8 peak where the level runs "
              "Aural's int8 kernel, attention and convolutions at the f32 peak.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--render" in argv:
        (RESULTS / "limits.md").write_text(render())
        return 0
    from aural.engine.models.store import resolve_model

    from aural.engine.cpu import cpu_core

    out = measure(str(resolve_model(argv[0] if argv else None)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    # One file per level and core: the haswell level of a Zen 2 is not the haswell level run on a Zen 4.
    core = cpu_core().lower().replace(" ", "").removesuffix("-sp")
    tag = ((f"-{core}" if core else "") + ("-amx" if out["int8_kernel"] == "amx" else "")
           + ("" if out["model"] == "tiny.en" else f"-{out['model']}"))
    (RESULTS / f"limits-{out['level']}{tag}.json").write_text(json.dumps(out, indent=1))
    (RESULTS / "limits.md").write_text(render())
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
