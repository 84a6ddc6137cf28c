"""The CPU level Aural runs at: which of ggml's CPU variants, which extra buffer types may hold weights,
and the instruction set Aural's own kernels are capped to (native/cpu.h).

    level = aural.engine.cpu.configure()  # once, before the first model; idempotent
    # AURAL_CPU_VARIANT=haswell (the CLI's --cpu-variant sets it) names the level instead

The default is the best-scoring variant that passes its probe. The probe runs each weight type's matrix
product in each buffer type ggml-cpu offers (AMX, CPU_REPACK), and Aural's int8 product on AMX tiles
(AURAL_AMX), in a child process: AMX tiles need OS and hypervisor support that CPUID does not prove, and
ggml's AMX kernels built by GCC 12 raise SIGILL even where tiles work (native/cpu-probe.cpp says why). A
buffer type that faults or computes wrong numbers is left out; a variant whose plain products fail is
passed over for the next best. Verdicts are cached per machine in <cache>/cpu-probe.json.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AuralError

__all__ = ["CpuLevel", "CpuLevelError", "configure", "cpu_class", "cpu_core", "cpu_model", "current"]

logger = logging.getLogger(__name__)

VARIANT_ENV = "AURAL_CPU_VARIANT"
# AMX tiles are used only where the probe ran them right: ggml's AMX buffer type, and Aural's int8 products on
# tiles ("AURAL_AMX"). AURAL_NO_AMX=1 keeps both out where the probe let them in: the A/B switch of
# bench/encoder_ab.py, and a way round a hypervisor that faults on them later.
_AMX = ("AMX", "AURAL_AMX")
NO_AMX_ENV = "AURAL_NO_AMX"
BUILT_IN = "built-in"
# The child loads one variant and runs 2 x 4 x (number of buffer types) small products: well under 1 s;
# the limit is for a child that hangs instead of faulting.
_PROBE_TIMEOUT_S = 120
_OK = "ok"


class CpuLevelError(AuralError):
    """A CPU variant that is not installed, that this CPU cannot run, or that fails its probe."""


@dataclass(frozen=True)
class CpuLevel:
    """variant: ggml's CPU variant in use ("built-in" without variants); reason: why it was chosen;
    kernel_isa: the widest instruction set Aural's kernels use; int8_kernel: the int8 products' kernel
    ("amx", "avx512_vnni", "avx_vnni" beside the line of kernel_isa, "avx2", "none"); bufts: each extra
    buffer type's probe verdict ("ok" or why not), and AURAL_AMX's (Aural's int8 products on AMX tiles);
    excluded: the buffer types that hold no weights, and AURAL_AMX where the tiles are not used; runnable:
    the variants this CPU runs, best first."""

    variant: str
    reason: str
    kernel_isa: str
    int8_kernel: str = "none"
    bufts: dict[str, str] = field(default_factory=dict)
    excluded: tuple[str, ...] = ()
    runnable: tuple[str, ...] = ()


_current: CpuLevel | None = None
_lock = threading.Lock()  # the app's workers may open their first models at once


def current() -> CpuLevel | None:
    """The level configure() chose in this process, None before."""
    return _current


def configure() -> CpuLevel:
    """Choose, vet and load the CPU level: $AURAL_CPU_VARIANT, else the best that passes its probe. Later
    calls return the same level (another $AURAL_CPU_VARIANT after the first device use raises
    CpuLevelError)."""
    with _lock:
        return _configure()


def _configure() -> CpuLevel:
    global _current
    want = os.environ.get(VARIANT_ENV, "")
    if _current is not None and (not want or want == _current.variant):
        return _current
    from aural import _native

    installed = list(_native.cpu_variants())
    runnable = tuple(v["name"] for v in installed if v["score"] > 0)
    candidates = _candidates(_native, installed, want)
    passed_over: list[str] = []
    for candidate in candidates:
        verdicts = _verdicts(candidate, installed)
        plain = verdicts.get("CPU", _OK)
        if plain == _OK:
            break
        if want:
            raise CpuLevelError(f"CPU variant '{want}' fails its probe: {plain}")
        passed_over.append(f"{candidate} ({plain})")
    else:
        raise CpuLevelError("no CPU variant passes its probe: " + "; ".join(passed_over))
    bufts = {name: verdict for name, verdict in verdicts.items() if name != "CPU"}
    no_amx = os.environ.get(NO_AMX_ENV) == "1"
    excluded = tuple(sorted({name for name, verdict in bufts.items() if verdict != _OK} | {
        name for name in _AMX if no_amx or bufts.get(name) != _OK}))
    reason = _reason(want, candidate, len(runnable), passed_over)
    try:
        _native.configure_cpu(variant="" if candidate == BUILT_IN else candidate, excluded_bufts=list(excluded),
                              reason=reason)
        native = _native.cpu_level()
    except (ValueError, RuntimeError) as exc:  # logic_error: another variant is loaded already
        raise CpuLevelError(str(exc)) from exc
    _current = CpuLevel(variant=native["variant"], reason=native["reason"], kernel_isa=native["kernel_isa"],
                        int8_kernel=native["int8_kernel"], bufts=bufts, excluded=excluded, runnable=runnable)
    logger.info("CPU level %s (%s); kernels up to %s, int8 products %s; extra buffers %s", _current.variant,
                _current.reason, _current.kernel_isa, _current.int8_kernel, bufts or "none")
    return _current


def _candidates(native, installed: list[dict], want: str) -> list[str]:
    if want:
        try:
            native.check_cpu_variant(want)  # not installed, or this CPU cannot run it
        except ValueError as exc:
            raise CpuLevelError(str(exc)) from exc
    if not installed:
        return [BUILT_IN]
    return [want] if want else [v["name"] for v in installed if v["score"] > 0]


def _reason(want: str, chosen: str, runnable: int, passed_over: list[str]) -> str:
    if want:
        return f"{VARIANT_ENV}={want}"
    if chosen == BUILT_IN:
        return "this ggml build links its CPU backend in"
    reason = f"the best of the {runnable} installed variants this CPU runs that passes its probe"
    return reason + (f"; passed over: {', '.join(passed_over)}" if passed_over else "")


# ------------------------------------------------------------------------------------------------ probe


def _verdicts(variant: str, installed: list[dict]) -> dict[str, str]:
    """Buffer type -> "ok" or why not, for `variant`: from the cache, else from the probe."""
    key = _machine_key(variant, installed)
    cache = _cache_path()
    stored = _read_cache(cache)
    if key in stored:
        return stored[key]
    verdicts = _probe(variant)
    stored[key] = verdicts
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
        tmp.replace(cache)
    except OSError as exc:  # a read-only cache only costs the probe again next time
        logger.warning("cannot cache the CPU probe in %s: %s", cache, exc)
    return verdicts


def _probe(variant: str) -> dict[str, str]:
    """Runs the child until it completes, skipping each buffer type that killed an earlier run."""
    verdicts: dict[str, str] = {}
    while True:
        done, started, failure = _run_child(variant, [b for b, v in verdicts.items() if v != _OK])
        if done is not None:
            for result in done:
                if result["error"] > 1.0 and verdicts.get(result["buft"], _OK) == _OK:
                    verdicts[result["buft"]] = (f"wrong results ({result['type']} x {result['batch']} columns off by "
                                                f"{result['error']:.2g} of the rounding bound)")
                verdicts.setdefault(result["buft"], _OK)
            return verdicts
        if started is None or started[0] in verdicts:
            return {"CPU": failure}  # it died before any product, or again where it died before
        verdicts[started[0]] = f"{failure} in its {started[1]} product"
        if started[0] == "CPU":
            return verdicts


def _run_child(variant: str, skip: list[str]) -> tuple[list[dict] | None, tuple[str, str] | None, str]:
    """(results, None, "") when the child completes; else (None, the last case it started, what befell it)."""
    command = [*_child_command(), "" if variant == BUILT_IN else variant]
    for buft in skip:
        command += ["--skip", buft]
    env = {k: v for k, v in os.environ.items() if k != VARIANT_ENV}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        out, why = exc.stdout or "", f"no answer within {_PROBE_TIMEOUT_S} s"
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return None, _last_start(out), why
    for line in proc.stdout.splitlines():
        if line.startswith("results "):
            return json.loads(line[len("results "):]), None, ""
    if proc.returncode < 0:
        why = signal.Signals(-proc.returncode).name
    else:
        tail = proc.stderr.strip().splitlines()
        why = f"exit status {proc.returncode}" + (f": {tail[-1]}" if tail else "")
    return None, _last_start(proc.stdout), why


def _last_start(stdout: str) -> tuple[str, str] | None:
    starts = [line.split()[1:3] for line in stdout.splitlines() if line.startswith("start ")]
    return (starts[-1][0], starts[-1][1]) if starts else None


def _child_command() -> list[str]:
    if getattr(sys, "frozen", False):  # the PyInstaller bundle: its executable takes the probe's flag
        return [sys.executable, "--cpu-probe"]
    return [sys.executable, "-m", "aural.engine.cpu.probe"]


def _cache_path() -> Path:
    from ..models.store import cache_dir

    return cache_dir().parent / "cpu-probe.json"


def _read_cache(path: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it ("AMD EPYC"), for reports."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


# (vendor, family, model) -> microarchitecture. A KVM guest names Rome, Milan and Genoa all "AMD EPYC", and
# figures measured on them differ by 2x: reports name the core too (family/model numbers: Linux's
# arch/x86/include/asm/intel-family.h and AMD's processor programming references).
_MICROARCH = {
    ("AuthenticAMD", 23, 1): "Zen", ("AuthenticAMD", 23, 8): "Zen+", ("AuthenticAMD", 23, 49): "Zen 2",
    ("AuthenticAMD", 23, 113): "Zen 2", ("AuthenticAMD", 25, 1): "Zen 3", ("AuthenticAMD", 25, 33): "Zen 3",
    ("AuthenticAMD", 25, 17): "Zen 4", ("AuthenticAMD", 25, 97): "Zen 4", ("AuthenticAMD", 26, 2): "Zen 5",
    ("GenuineIntel", 6, 63): "Haswell", ("GenuineIntel", 6, 79): "Broadwell", ("GenuineIntel", 6, 85): "Skylake-SP",
    ("GenuineIntel", 6, 106): "Ice Lake-SP", ("GenuineIntel", 6, 143): "Sapphire Rapids",
    ("GenuineIntel", 6, 207): "Emerald Rapids", ("GenuineIntel", 6, 151): "Alder Lake", ("GenuineIntel", 6, 183): "Raptor Lake",
}
# The widest matrix-product instructions first: what decides which of Aural's kernels run.
_ISA_ORDER = (("amx_tile", "AMX"), ("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"), ("avx_vnni", "AVX-VNNI"),
              ("avx2", "AVX2"))


def _family_model() -> tuple[str, int, int] | None:
    info = _cpuinfo()
    try:
        return info.get("vendor_id", ""), int(info["cpu family"]), int(info["model"])
    except (KeyError, ValueError):
        return None


def cpu_core() -> str:
    """The microarchitecture ("Zen 2", "Sapphire Rapids"), "" where the family and model are not in the table."""
    return _MICROARCH.get(_family_model(), "")


def cpu_class() -> str:
    """The CPU for a figure's caption: name, core and widest ISA, e.g. "AMD EPYC (Zen 2, family 23 model 49;
    AVX2, no AVX-512)"."""
    flags = set(_cpuinfo().get("flags", "").split())
    isa = next((label for flag, label in _ISA_ORDER if flag in flags), "no AVX2")
    if isa == "AVX2" or isa == "AVX-VNNI":
        isa += ", no AVX-512"
    key = _family_model()
    if key is None:
        return f"{cpu_model()} ({isa})"
    core = cpu_core()
    return f"{cpu_model()} ({core + ', ' if core else ''}family {key[1]} model {key[2]}; {isa})"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def _machine_key(variant: str, installed: list[dict]) -> str:
    """What the verdict depends on: the CPU (model, flags, microcode), the kernel (AMX permission is the
    OS's), and the variant's library file."""
    info = _cpuinfo()
    cpu = {name: info[name] for name in ("model name", "flags", "microcode") if name in info} or {
        "machine": platform.processor()}
    library = next((v["path"] for v in installed if v["name"] == variant), "")
    try:
        stat = os.stat(library) if library else None
    except OSError:
        stat = None
    parts = [json.dumps(cpu, sort_keys=True), platform.release(), variant, library,
             f"{stat.st_size}:{stat.st_mtime_ns}" if stat else ""]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
