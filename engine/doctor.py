"""`aural doctor`: what Aural can use on this machine (CPU level, ggml devices, packages, audio input, model).

    print(format_report(report()))      # the CLI's text; json.dumps(report()) for --json

Used by the CLI and by the app's Help → About. It imports the native engine and probes the audio input,
which take up to a second: the app calls it off the GUI thread. No Qt.
"""

from __future__ import annotations

import ctypes
import importlib
import platform
import sys
from typing import Any

from . import __version__, cpu

__all__ = ["format_report", "report"]


def report() -> dict[str, Any]:
    """What Aural can use on this machine (the `aural doctor --json` object); never raises for a missing
    package, library or device: each is reported as unavailable."""
    report: dict[str, Any] = {
        "aural": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
    }
    report.update(_native_report())
    report["packages"] = {name: _package_status(module) for name, module in _DOCTOR_PACKAGES.items()}
    report["audio_input"] = _audio_input_status()
    report["model"] = _model_status()
    report["architectures"] = dict(_ARCHITECTURES)
    return report


# Model architectures (GGUF general.architecture) and what Aural does with each (#23: Qwen3-ASR's file
# transcription runs on the CPU backend; the rest of the app is Whisper's).
_ARCHITECTURES = {"whisper": "runs", "qwen3-asr": "converts (aural models convert), transcribes files and live audio on the CPU"}


# name shown -> module imported; PySide6.QtWidgets rather than PySide6 because it is the import that
# needs Qt's shared libraries (libGL, libEGL), which is what fails on a bare system.
_DOCTOR_PACKAGES = {"numpy": "numpy", "av": "av", "PySide6": "PySide6.QtWidgets", "sounddevice": "sounddevice"}


def _native_report() -> dict[str, Any]:
    try:
        from aural import _native
    except ImportError as exc:
        return {"native": {"available": False, "error": str(exc)}, "devices": []}
    from . import runtime

    level = cpu.configure()  # before the first device query: it picks the CPU variant ggml loads
    devices = [{**d, "weight_types": list(_native.supported_weight_types(d["name"]))} for d in _native.devices()]
    return {
        "native": {"available": True, "ggml_version": _native.ggml_version()},
        "cpu": cpu.cpu_class(),
        "cpu_level": {"variant": level.variant, "reason": level.reason, "kernel_isa": level.kernel_isa,
                      "int8_kernel": level.int8_kernel,
                      "runnable": list(level.runnable), "extra_buffers": level.bufts, "excluded": list(level.excluded)},
        "devices": devices,
        "backend_problems": list(_native.backend_problems()),
        "selected_device": _native.select_device("auto"),
        "device_process": runtime.isolates_devices(),
        "cpu_features": dict(_native.cpu_features()),
        "cpu_kernels": dict(_native.cpu_kernels()),
        "default_threads": _native.default_threads(),
    }


def _format_buffers(level: dict[str, Any]) -> str:
    """Each extra buffer type's probe verdict; AMX is named even where this variant offers none."""
    probed = level["extra_buffers"]
    shown = [f"{name}: {verdict}" + ("" if verdict == "ok" else ", not used") for name, verdict in sorted(probed.items())]
    if "AMX" not in probed:
        shown.insert(0, "AMX: not offered (this CPU or variant has no AMX)")
    return "; ".join(shown)


def _package_status(module: str) -> dict[str, Any]:
    """Imports `module` without letting a failure (missing package or system library) escape."""
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # an OSError from a missing shared library is as telling as an ImportError
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    top = sys.modules[module.split(".")[0]]
    return {"available": True, "version": getattr(top, "__version__", getattr(imported, "__version__", None))}


def _audio_input_status() -> dict[str, Any]:
    try:
        import sounddevice
    except ImportError:
        return {"available": False, "detail": "sounddevice not installed (pip install 'aural[live]')"}
    except OSError:  # sounddevice raises OSError when it cannot load the PortAudio shared library
        return {"available": False, "detail": "libportaudio2 missing"}
    try:
        device = sounddevice.query_devices(kind="input")
    except (sounddevice.PortAudioError, ValueError) as exc:
        return {"available": False, "detail": f"no input device ({exc})"}
    return {"available": True, "detail": f"{device['name']} ({device['default_samplerate']:.0f} Hz)"}


def _model_status() -> dict[str, Any]:
    """The model used when none is named: where converted models live and which types are converted."""
    from .models.store import DEFAULT_MODEL, cache_dir, list_models

    (entry,) = (e for e in list_models() if e.name == DEFAULT_MODEL)
    return {
        "cache_dir": str(cache_dir()),
        "default": DEFAULT_MODEL,
        "installed": entry.installed,
        "converted": [c.wtype for c in entry.cached],
    }


def _format_kernels(kernels: dict[str, bool]) -> str:
    """Aural's own CPU kernels this CPU runs; the others fall back to ggml's (README: CPU-only speed-ups)."""
    names = {"int8_matmul": "int8 matmul", "encoder_attention": "encoder attention"}
    used = [names.get(k, k) for k, on in kernels.items() if on]
    return ", ".join(used) if used else "none (ggml's kernels only)"


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def format_report(report: dict[str, Any]) -> str:
    """`report()` as aligned text rows and a device table (what `aural doctor` prints)."""
    python = report["python"]
    rows = [("aural", report["aural"]), ("python", f"{python['version']} ({python['executable']})"),
            ("platform", report["platform"])]
    native = report["native"]
    if not native["available"]:
        rows.append(("native engine", f"NOT AVAILABLE: {native['error']}"))
    else:
        rows += [
            ("ggml", native["ggml_version"]),
            ("cpu", report["cpu"]),
            ("cpu level", f"{report['cpu_level']['variant']} ({report['cpu_level']['reason']})"),
            ("cpu variants", "runs " + ", ".join(report["cpu_level"]["runnable"] or ["built-in"])),
            ("extra buffers", _format_buffers(report["cpu_level"])),
            ("selected device", report["selected_device"]),
            ("device process", "every device but the CPU (a driver's crash ends it, not Aural)"
             if report["device_process"] else "off (AURAL_NO_ISOLATION is set): devices run in process"),
            ("ggml backends", _format_backends(report["devices"], report["backend_problems"])),
            *([("gpu", note)] if (note := _gpu_note(report["devices"], report["backend_problems"])) else []),
            ("default threads", str(report["default_threads"])),
            ("cpu features", " ".join(k if v == "1" else f"{k}={v}" for k, v in report["cpu_features"].items())),
            ("aural cpu kernels", _format_kernels(report["cpu_kernels"])
             + f" (up to {report['cpu_level']['kernel_isa']}; int8 by {report['cpu_level']['int8_kernel']})"),
        ]
    for name, status in report["packages"].items():
        shown = (status["version"] or "available") if status["available"] else f"missing ({status['error']})"
        rows.append((name, shown))
    audio_in = report["audio_input"]
    rows.append(("audio input", ("" if audio_in["available"] else "unavailable: ") + audio_in["detail"]))
    model = report["model"]
    converted = f"converted: {', '.join(model['converted'])}" if model["converted"] else "not converted yet"
    rows += [("model cache", model["cache_dir"]),
             ("default model", f"{model['default']} ({converted}{'' if model['installed'] else ', not installed'})"),
             ("architectures", "; ".join(f"{name}: {what}" for name, what in report["architectures"].items()))]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines + ["", "devices:", _device_table(report["devices"])])


def _format_backends(devices: list[dict[str, Any]], problems: list[dict[str, Any]]) -> str:
    """Every backend this ggml build has, those without a device marked: "CPU, CUDA (compiled in, no device)"."""
    names = list(dict.fromkeys(d["backend"] for d in devices))
    names += [f"{p['name']} (compiled in, no device)" if p["loaded"] else f"{p['name']} (did not load)"
              for p in problems]
    return ", ".join(names)


def _gpu_note(devices: list[dict[str, Any]], problems: list[dict[str, Any]]) -> str | None:
    """A plain line when a GPU backend is built but no hardware GPU is there: every GPU ggml offers is a
    software one (Mesa's llvmpipe), which auto skips, or a backend offers none or did not load, with why."""
    gpus = [d for d in devices if d["type"] in ("gpu", "igpu")]
    if gpus and all(d["software"] for d in gpus):
        names = ", ".join(f"{d['name']} ({d['description']})" for d in gpus)
        return (f"no hardware GPU; only software ones: {names}. They run on the CPU, slower than the CPU backend, "
                "so auto uses the CPU; --backend names one to use it anyway")
    if not gpus and problems:
        return "no GPU, so Aural runs on the CPU: " + "; ".join(_problem_text(p) for p in problems)
    return None


def _problem_text(problem: dict[str, Any]) -> str:
    """Why one backend offers no device, as ggml said it, and what is missing where Aural can tell."""
    if not problem["loaded"]:
        return f"{problem['name']} did not load ({problem['detail']})"
    why = [problem["detail"]] if problem["detail"] else []
    if problem["name"] == "CUDA" and not _cuda_driver_installed():
        why.append("the NVIDIA driver's libcuda.so.1 is not installed")
    if problem["name"] == "Vulkan":
        why.append("a software Vulkan device such as Mesa's llvmpipe shows only with GGML_VK_VISIBLE_DEVICES=0")
    return f"the {problem['name']} backend found no device" + (f" ({'; '.join(why)})" if why else "")


def _cuda_driver_installed() -> bool:
    """Whether the NVIDIA driver's user-space library loads: without it CUDA reports only an "insufficient
    driver", which reads like a version mismatch."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _device_table(devices: list[dict[str, Any]]) -> str:
    header = ("NAME", "TYPE", "BACKEND", "FREE", "TOTAL", "WEIGHT TYPES", "DESCRIPTION")
    rows = [header] + [
        (d["name"], d["type"] + (" (software)" if d["software"] else ""), d["backend"], _gib(d["memory_free"]),
         _gib(d["memory_total"]), " ".join(d["weight_types"]), d["description"])
        for d in devices
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
