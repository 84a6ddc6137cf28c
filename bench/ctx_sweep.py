#!/usr/bin/env python3
"""What a shorter encoder context and lighter decoder weights cost in words (issue #6: "a shorter audio context
for short inputs if and only if WER holds").

Aural's default (`TranscribeOptions.audio_ctx="auto"`) encodes a window holding less than 30 s of audio with
its audio plus AUDIO_CTX_PAD_S of zeros, at least AUDIO_CTX_MIN_S. This script measures WER and time for
several (padding, floor) pairs against 30 s windows, and for two decoder weight layouts (tied output
projection alone in q8_0; every decoder matrix in q8_0 but the cross-attention K/V), with greedy and beam 5,
on two sets:

- dev: the 18 English dev clips (286 words; all but the sonnet under 30 s, so every window is shortened);
- long: the sonnet (53 s) and the 1 min and 5 min series of bench/prep.py (941 words; only each file's
  last window is shortened).

One process, Aural's interpreter, 2 threads, one run each (time is the sum of the files' processing).
Outputs bench/results/ctx-sweep.json and ctx-sweep.md.

    .venv/bin/python bench/ctx_sweep.py                       # the committed sweep (~12 min)
    .venv/bin/python bench/ctx_sweep.py --contexts full,4:15 --no-layouts
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import prep  # noqa: E402
from common import RESULTS, fmt, md_table, word_errors  # noqa: E402

CONTEXTS = "full,2:0,3:0,4:0,6:0,4:10,6:10,4:15,6:15"
LAYOUTS = ("q8_0 output projection", "q8_0 decoder")


def load_sets() -> dict[str, list[tuple[str, np.ndarray, str]]]:
    """set name -> [(file key, 16 kHz samples, reference)]."""
    dev = [(c.name, np.load(prep.clip_audio(c)), c.reference) for c in common.english_dev_clips()]
    long = [next(clip for clip in dev if "sonnet" in clip[0])]
    for target in (60, 300):
        path, reference, _ = prep.series_audio(target)
        long.append((path.stem, np.load(path), reference))
    return {"dev": dev, "long": long}


def layout_model(name: str, out: Path) -> Path:
    """tiny.en with the named decoder layout: f16 elsewhere (the encoder is widened to f32 at load)."""
    import gguf

    from aural.engine.models import convert
    from aural.engine.models.store import _SOURCES, _ct2_dir

    def storage_type(t: Any, wtype: str) -> gguf.GGMLQuantizationType:
        f16 = plain(t, "f16")
        if name == "q8_0 output projection":
            return plain(t, "q8_0") if t.name == "dec.tok_emb" else f16
        cross_kv = ".cross.k." in t.name or ".cross.v." in t.name  # run once per window: encoder-like
        return plain(t, "q8_0") if t.name.startswith("dec.") and not cross_kv else f16

    plain = convert._storage_type
    convert._storage_type = storage_type
    try:
        with _ct2_dir(_SOURCES["tiny.en"], out.parent) as ct2:
            convert.convert_ct2(ct2, out, wtype="q8_0", name="tiny.en")
    finally:
        convert._storage_type = plain
    return out


def run(model: Any, files: list[tuple[str, np.ndarray, str]], beam: int, audio_ctx: str) -> dict[str, Any]:
    from aural.engine.transcribe import TranscribeOptions, transcribe

    errors = words = 0
    seconds = 0.0
    texts = {}
    for key, samples, reference in files:
        start = time.perf_counter()
        segments = list(transcribe(model, samples, TranscribeOptions(language="en", beam_size=beam,
                                                                      audio_ctx=audio_ctx)))
        seconds += time.perf_counter() - start
        texts[key] = "".join(s.text for s in segments).strip()
        e, w = word_errors(reference, texts[key])
        errors, words = errors + e, words + w
    return {"errors": errors, "words": words, "wer": errors / words, "seconds": seconds, "texts": texts}


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    from aural.engine import transcribe as transcribe_module
    from aural.engine.models.store import resolve_model
    from aural.engine.runtime import WhisperModel

    sets = load_sets()
    variants: list[tuple[str, Path, str, float, float]] = []
    default = (transcribe_module.AUDIO_CTX_PAD_S, transcribe_module.AUDIO_CTX_MIN_S)
    for spec in args.contexts.split(","):
        if spec == "full":
            variants.append(("30 s windows", resolve_model(None), "full", *default))
        else:
            pad, floor = (float(x) for x in spec.split(":"))
            variants.append((f"pad {pad:g} s, floor {floor:g} s", resolve_model(None), "auto", pad, floor))
    if not args.no_layouts:
        for name in LAYOUTS:
            path = layout_model(name, common.CACHE / f"tiny.en-{name.replace(' ', '-')}.gguf")
            variants.append((f"{name}, pad {default[0]:g} s, floor {default[1]:g} s", path, "auto", *default))
    rows = []
    for label, path, audio_ctx, pad, floor in variants:
        transcribe_module.AUDIO_CTX_PAD_S, transcribe_module.AUDIO_CTX_MIN_S = pad, floor
        model = WhisperModel(path, n_threads=args.threads)
        row: dict[str, Any] = {"variant": label, "model": path.name, "audio_ctx": audio_ctx, "pad_s": pad,
                               "floor_s": floor}
        for beam in (1, 5):
            for set_name, files in sets.items():
                row[f"{set_name}-beam{beam}"] = run(model, files, beam, audio_ctx)
        print(label, {k: f"{v['errors']}/{v['words']} {v['seconds']:.1f}s" for k, v in row.items()
                      if isinstance(v, dict)}, flush=True)
        rows.append(row)
    transcribe_module.AUDIO_CTX_PAD_S, transcribe_module.AUDIO_CTX_MIN_S = default
    return rows


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    cols = [f"{s}-beam{b}" for b in (1, 5) for s in ("dev", "long")]
    table = [[r["variant"], *(f"{fmt(100 * r[c]['wer'], 1)} % ({r[c]['errors']}) · {fmt(r[c]['seconds'], 1)} s"
                              for c in cols)] for r in rows]
    return "\n".join([
        "# Shorter encoder context and decoder weight layouts: WER and time (tiny.en)", "",
        f"{meta['date']} · {meta['machine'].get('cpu', '?')} · load average at start "
        f"{', '.join(f'{x:.1f}' for x in meta['machine'].get('loadavg_start', ()))} · {meta['threads']} threads · "
        "one run each. dev: the 18 English dev clips (286 words), long: the sonnet, 1 min and 5 min series "
        "(941 words). Cells: corpus WER (errors) · processing seconds summed over the set. 'pad' is the zero "
        "padding after a short window's audio, 'floor' the shortest context encoded. Switches: "
        f"{' '.join(f'{k}={v}' for k, v in meta.get('switches', {}).items()) or 'none (defaults)'}.", "",
        md_table(["variant", "dev greedy", "long greedy", "dev beam 5", "long beam 5"], table), "",
    ])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default=CONTEXTS, help="comma-separated: full, or pad_s:floor_s")
    parser.add_argument("--no-layouts", action="store_true", help="skip the decoder weight layouts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="ctx-sweep", help="results file stem")
    args = parser.parse_args(argv)
    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "machine": common.machine_info(),
            "threads": args.threads, "switches": {k: v for k, v in os.environ.items() if k.startswith("AURAL_NO_")}}
    rows = sweep(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (RESULTS / f"{args.name}.md").write_text(render(meta, rows))
    print(f"wrote {RESULTS / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
