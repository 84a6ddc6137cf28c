"""Shared pieces of the peer benchmarks: paths, interpreters, the data manifest, subprocess workers,
WER scoring and Markdown tables.

Runs inside bench/.venv (the orchestrators re-exec themselves there); Aural is never imported here.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# The environment that holds CTranslate2 to each of ggml's CPU levels, so both engines run the same instruction
# set ("native": each picks its best): its own kernels' ISA (CT2_FORCE_CPU_ISA), and the libraries inside it,
# which dispatch on their own (its int8 GEMM is oneMKL's, its convolutions oneDNN's; on an Intel CPU up to AMX)
# unless capped (MKL_ENABLE_INSTRUCTIONS: _E1 adds VNNI, and acts on Intel CPUs only; ONEDNN_MAX_CPU_ISA).
# CTranslate2 has no AVX-VNNI ISA of its own: at alderlake its kernels run AVX2 and oneMKL AVX-VNNI, as Aural's do.
CT2_ISA = {  # level -> (CT2_FORCE_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA)
    "native": None,
    "icelake": ("AVX512", "AVX512_E1", "AVX512_CORE_VNNI"),
    "skylakex": ("AVX512", "AVX512", "AVX512_CORE"),
    "alderlake": ("AVX2", "AVX2_E1", "AVX2_VNNI"),
    "haswell": ("AVX2", "AVX2", "AVX2"),
    "sse42": ("GENERIC", "SSE4_2", "SSE41"),
}


def ct2_env(level: str) -> dict[str, str]:
    """The environment that holds CTranslate2 and the libraries in it to ggml's CPU level `level`."""
    isas = CT2_ISA.get(level)
    return dict(zip(("CT2_FORCE_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"), isas)) if isas else {}


DATA = Path(os.environ.get("AURAL_DATA_DIR", REPO.parent / "shared" / "data"))
CACHE = BENCH / ".cache"
RESULTS = BENCH / "results"
RAW = RESULTS / "raw"
BENCH_VENV = BENCH / ".venv"
BENCH_PYTHON = BENCH_VENV / "bin" / "python"
WORKER = BENCH / "worker.py"
PREP = BENCH / "prep.py"

# Set by ensure_bench_venv before re-exec, so the orchestrator knows which interpreter runs Aural.
_AURAL_PY_ENV = "AURAL_BENCH_AURAL_PYTHON"


def aural_python() -> str:
    """The interpreter with Aural installed: the one `make bench` started with, else the repo's .venv."""
    return os.environ.get(_AURAL_PY_ENV) or str(REPO / ".venv" / "bin" / "python")


def ensure_bench_venv(script: Path, argv: Sequence[str]) -> None:
    """Re-exec `script` under bench/.venv (creating it with bench/setup.sh when missing); no-op inside it."""
    if Path(sys.prefix).resolve() == BENCH_VENV.resolve():
        return
    if not (BENCH_VENV / ".ok").exists():
        print("bench: creating bench/.venv (bench/setup.sh)", file=sys.stderr, flush=True)
        subprocess.run(["bash", str(BENCH / "setup.sh")], check=True)
    env = dict(os.environ)
    # Where this script was started from is the interpreter that has Aural (make bench uses .venv).
    env.setdefault(_AURAL_PY_ENV, sys.executable if _has_aural(sys.executable) else aural_python())
    os.execve(str(BENCH_PYTHON), [str(BENCH_PYTHON), str(script), *argv], env)


def _has_aural(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import aural.engine"], capture_output=True)
    return probe.returncode == 0


# -- data ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    """One row of shared/data/manifest.tsv.

    Attributes:
        name: file name in the data folder.
        path: full path.
        language: "en", "zh", ...
        duration_s: manifest duration.
        reference: reference transcript, None when the manifest says NONE.
        notes: manifest notes (DUPLICATE CONTENT ..., headerless PCM ...).
    """

    name: str
    path: Path
    language: str
    duration_s: float
    reference: str | None
    notes: str

    @property
    def raw_pcm(self) -> bool:
        return self.name.lower().endswith((".raw", ".pcm"))


def load_manifest() -> list[Clip]:
    with open(DATA / "manifest.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Clip(r["file"], DATA / r["file"], r["language"], float(r["duration_s"]),
                 None if r["reference_transcript"] == "NONE" else r["reference_transcript"], r["notes"])
            for r in rows]


def english_dev_clips() -> list[Clip]:
    """English clips with a reference, without the duplicate JFK recording (18 clips)."""
    return [c for c in load_manifest()
            if c.language == "en" and c.reference and not c.notes.startswith("DUPLICATE")]


# -- scoring ---------------------------------------------------------------------------------------

_normalizer = None


def normalize(text: str) -> str:
    """openai-whisper's English normaliser (whisper_normalizer package)."""
    global _normalizer
    if _normalizer is None:
        from whisper_normalizer.english import EnglishTextNormalizer

        _normalizer = EnglishTextNormalizer()
    return " ".join(_normalizer(text).split())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit operations, reference words) after normalising both sides."""
    import jiwer

    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return (len(hyp.split()), 0)
    out = jiwer.process_words(ref, hyp if hyp else "")
    return out.substitutions + out.deletions + out.insertions, out.substitutions + out.deletions + out.hits


def wer(reference: str, hypothesis: str) -> float:
    errors, words = word_errors(reference, hypothesis)
    return errors / words if words else float("nan")


# -- workers ---------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    pass


def run_worker(python: str, spec: dict[str, Any], *, timeout_s: float | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run bench/worker.py under `python` with one JSON spec (and `env` over this process's environment);
    return its JSON result.

    Each call is a fresh process, so model load, warm-up and peak RSS belong to that measurement alone.
    """
    cmd = [python, str(WORKER), json.dumps(spec)]
    env = {**os.environ, **(env or {})}
    env.setdefault("OMP_NUM_THREADS", str(spec.get("threads", 2)))
    # The same OpenMP spin limit for every engine: Aural defaults to it (long spinning barriers
    # stall ggml when another process holds a core), so the peers get it too.
    env.setdefault("GOMP_SPINCOUNT", "2000")
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    elapsed = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise WorkerError(f"worker {spec.get('engine')} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    result["process_s"] = elapsed
    return result


def run_prep(args: Sequence[str]) -> dict[str, Any]:
    """Run bench/prep.py under Aural's interpreter (decoding, series, model export); return its JSON."""
    proc = subprocess.run([aural_python(), str(PREP), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise WorkerError(f"bench/prep.py failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- statistics and tables -------------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def minimum(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        return f"{value:.{digits}f}"
    return str(value)


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_class() -> str:
    """Aural's caption of this CPU (name, core and widest ISA: "AMD EPYC" alone is Zen 2, 3 or 4 on a VM),
    asked of the interpreter that has Aural, since bench/.venv has none; the bare model name without it."""
    try:
        done = subprocess.run([aural_python(), "-c", "from aural.engine.cpu import cpu_class; print(cpu_class())"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    info["cpu"] = cpu_class()
    # Switches of ggml and Aural that change what runs (GGML_VK_DISABLE_GRAPH_OPTIMIZE, AURAL_NO_GRAPH_REUSE, ...)
    info["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("GGML_", "AURAL_"))}
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    return info
