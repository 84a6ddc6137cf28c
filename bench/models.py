#!/usr/bin/env python3
"""Accuracy and speed of each model and weight type: WER on the 18 English dev clips, CER on the Mandarin
clips, and the real-time factor, all greedy (beam_size=1; files default to beam 5 since).

Rows: tiny.en and base, each as f16, q8_0 and q5_0 GGUF (converted into Aural's model cache on first use).
Settings are `TranscribeOptions(beam_size=1)`: the language is detected for base and English for tiny.en,
temperature fallback, no beam search. English-only tiny.en gets no CER (it cannot write Chinese).

Scoring: English as in bench/wer.py (openai-whisper's English normaliser, then jiwer); Mandarin as
characters: the hypothesis is converted to Simplified (the references' script) with OpenCC, punctuation,
symbols and spaces are dropped from both sides, and jiwer counts character edits. Corpus WER/CER = all
edits / all reference words (characters). RTF = processing seconds / audio seconds over every clip of the
row; the audio is decoded once beforehand (bench/prep.py's cache), so only transcription is timed.

Runs in Aural's interpreter (it imports Aural), one model loaded at a time in this process:

    nice -n 5 .venv/bin/python bench/models.py                        # all six rows
    .venv/bin/python bench/models.py --models base --wtypes q8_0      # one row
    .venv/bin/python bench/models.py --render                         # models.md again from models.json

Outputs bench/results/models.json and bench/results/models.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import RESULTS, english_dev_clips, fmt, load_manifest, md_table, word_errors  # noqa: E402
from prep import SAMPLE_RATE, clip_audio  # noqa: E402

MODELS = ("tiny.en", "base")
WTYPES = ("f16", "q8_0", "q5_0")


def han_only(text: str) -> str:
    """Text without punctuation, symbols or spaces (Unicode categories P*, S*, Z*)."""
    return "".join(c for c in text if unicodedata.category(c)[0] not in "PSZ" and not c.isspace())


def char_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(character edits, reference characters) of a Mandarin hypothesis, compared in Simplified."""
    import jiwer

    from aural.engine.text.chinese import to_script

    ref, hyp = han_only(reference), han_only(to_script(hypothesis, "hans"))
    if not hyp:
        return len(ref), len(ref)
    out = jiwer.process_characters(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, out.substitutions + out.deletions + out.hits


def run_row(name: str, wtype: str, clips: list[common.Clip], threads: int) -> dict[str, Any]:
    """Transcribes every clip with one model; per-clip text, detected language, errors and timing."""
    from aural.engine.models.store import resolve_model
    from aural.engine.runtime import WhisperModel
    from aural.engine.transcribe import TranscribeOptions, transcribe

    path = resolve_model(name, wtype=wtype)
    model = WhisperModel(path, n_threads=threads)
    results = {}
    for clip in clips:
        samples = np.load(clip_audio(clip))
        start = time.perf_counter()
        tr = transcribe(model, samples, TranscribeOptions(beam_size=1))
        text = "".join(s.text for s in tr).strip()
        processing_s = time.perf_counter() - start
        errors, units = (word_errors if clip.language == "en" else char_errors)(clip.reference, text)
        results[clip.name] = {"language": clip.language, "detected": tr.info.language, "text": text,
                              "errors": errors, "ref_units": units, "audio_s": samples.size / SAMPLE_RATE,
                              "processing_s": processing_s}
        print(f"models: {name} {wtype} {clip.name}: {processing_s:.1f} s, {errors}/{units} errors",
              file=sys.stderr, flush=True)
    return {"model": name, "wtype": wtype, "path": str(path), "size_mib": path.stat().st_size / 2**20,
            "load_s": model.load_s, "clips": results, **_totals(results)}


def _totals(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def rate(language: str) -> float | None:
        rows = [r for r in results.values() if r["language"] == language]
        units = sum(r["ref_units"] for r in rows)
        return sum(r["errors"] for r in rows) / units if units else None

    audio_s = sum(r["audio_s"] for r in results.values())
    processing_s = sum(r["processing_s"] for r in results.values())
    return {"en_wer": rate("en"), "zh_cer": rate("zh"), "audio_s": audio_s, "processing_s": processing_s,
            "rtf": processing_s / audio_s if audio_s else None,
            "misdetected": sorted(k for k, r in results.items() if r["detected"] != r["language"])}


def clips_for(name: str) -> list[common.Clip]:
    """The 18 English dev clips, and for a multilingual model also every Mandarin clip with a reference."""
    clips = english_dev_clips()
    if not name.endswith(".en"):
        clips += [c for c in load_manifest() if c.language == "zh" and c.reference]
    return clips


def render(meta: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    lines = ["# Accuracy and speed per model and weight type", "",
             f"{meta['date']} · {meta['threads']} threads · greedy `TranscribeOptions(beam_size=1)` (base detects "
             "the language) · English: whisper_normalizer + jiwer WER over the 18 dev clips · Mandarin: CER "
             "after OpenCC to Simplified, punctuation and spaces dropped · RTF = processing / audio over every "
             f"clip of the row. Load average at start: {meta['machine'].get('loadavg_start')} on "
             f"{meta['machine'].get('cpus')} CPUs: the RTF of a busy machine, compare rows run together only.",
             ""]
    lines += [md_table(["model", "weights", "MiB", "en WER %", "zh CER %", "RTF", "audio s", "processing s",
                        "wrong language"],
                       [[r["model"], r["wtype"], fmt(r["size_mib"], 1), _pct(r["en_wer"]), _pct(r["zh_cer"]),
                         fmt(r["rtf"], 3), fmt(r["audio_s"], 1), fmt(r["processing_s"], 1),
                         ", ".join(r["misdetected"]) or "-"]
                        for r in rows.values()]), ""]
    names = list(meta["clips"])
    lines += ["## Errors per clip (words for English, characters for Mandarin)", ""]
    lines += [md_table(["clip", "s", *(f"{r['model']} {r['wtype']}" for r in rows.values())],
                       [[k, fmt(meta["clips"][k]["duration_s"], 1),
                         *(f"{r['clips'][k]['errors']}/{r['clips'][k]['ref_units']}" if k in r["clips"] else "-"
                           for r in rows.values())]
                        for k in names]), ""]
    zh_rows = [r for r in rows.values() if r["zh_cer"] is not None]
    if zh_rows:
        zh_names = [k for k, c in zh_rows[0]["clips"].items() if c["language"] == "zh"]
        lines += ["## Mandarin transcripts", ""]
        for k in zh_names:
            lines += [f"**{k}** — reference: {meta['clips'][k]['reference']}", ""]
            lines += [f"- {r['model']} {r['wtype']} ({r['clips'][k]['errors']}/{r['clips'][k]['ref_units']}): "
                      f"{r['clips'][k]['text']}" for r in zh_rows]
            lines.append("")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else fmt(100 * value, 1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated ({', '.join(MODELS)})")
    parser.add_argument("--wtypes", default=",".join(WTYPES), help=f"comma-separated ({', '.join(WTYPES)})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="models", help="results file stem")
    parser.add_argument("--render", action="store_true", help="only rewrite <name>.md from <name>.json")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads((RESULTS / f"{args.name}.json").read_text(encoding="utf-8"))
        (RESULTS / f"{args.name}.md").write_text(render(saved["meta"], saved["rows"]), encoding="utf-8")
        return 0
    from aural.engine.errors import ModelError

    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "threads": args.threads,
            "machine": common.machine_info(), "clips": {}}
    rows: dict[str, dict[str, Any]] = {}
    for name in (m for m in args.models.split(",") if m):
        clips = clips_for(name)
        meta["clips"].update({c.name: {"duration_s": c.duration_s, "reference": c.reference} for c in clips})
        for wtype in (w for w in args.wtypes.split(",") if w):
            try:
                rows[f"{name}-{wtype}"] = run_row(name, wtype, clips, args.threads)
            except ModelError as exc:  # e.g. base's packages not installed: the other rows still run
                print(f"models: skipping {name} {wtype}: {exc}", file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False),
                                               encoding="utf-8")
    (RESULTS / f"{args.name}.md").write_text(render(meta, rows), encoding="utf-8")
    print(f"models: wrote {RESULTS / (args.name + '.json')} and {RESULTS / (args.name + '.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
