"""One long upload to `aural serve`: an N-hour WAV (the dev clips end to end, repeated), POSTed whole.

The file (16 kHz mono 16-bit, 115 MB an hour) is written to a temporary folder, then sent to a fresh server
(`--config`, bench/serve.py's syntax) as one multipart request. The server's RSS is sampled every 5 s from
the first byte sent to the answer. Reports the upload's size, the wall time to the answer, the real-time
factor, the server's RSS before, at its peak and after, and the WER of the answer against the clips'
references end to end. Writes bench/results/<name>.json and .md.

Usage: .venv/bin/python bench/serve_upload.py [--hours 2] [--config s2/greedy] [--name serve-upload]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import soundfile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, fmt, machine_info, md_table, word_errors  # noqa: E402
from serve import ServerProcess, _machine, request_clips, server_args  # noqa: E402

from aural.engine.audio import SAMPLE_RATE, load_audio  # noqa: E402


def long_wav(folder: Path, hours: float) -> tuple[Path, str]:
    """The dev clips end to end, each followed by 1 s of silence, until `hours`; and the reference text."""
    clips = request_clips()
    pieces = [(np.concatenate([load_audio(c.path), np.zeros(SAMPLE_RATE, np.float32)]), c.reference) for c in clips]
    path, total, words = folder / "long.wav", round(hours * 3600 * SAMPLE_RATE), []
    with soundfile.SoundFile(path, "w", SAMPLE_RATE, 1, subtype="PCM_16") as out:
        written, k = 0, 0
        while written < total:
            audio, reference = pieces[k % len(pieces)]
            out.write(audio)
            written += audio.size
            words.append(reference)
            k += 1
    return path, " ".join(words)


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--config", default="s2/greedy")
    parser.add_argument("--name", default="serve-upload")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aural-bench-") as tmp:
        path, reference = long_wav(Path(tmp), args.hours)
        server = ServerProcess(server_args(args.config))
        try:
            rss = [server.rss_mb()]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(5.0):
                    rss.append(server.rss_mb())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.perf_counter()
            with open(path, "rb") as fh:
                response = httpx.post(f"{server.url}/v1/audio/transcriptions", files={"file": (path.name, fh)},
                                      data={"response_format": "text"}, timeout=6 * 3600)
            wall_s = time.perf_counter() - started
            done.set()
            sampler.join()
            rss.append(server.rss_mb())
        finally:
            server.close()
        size_mb = path.stat().st_size / 2**20
    errors, n_words = word_errors(reference, response.text) if response.status_code == 200 else (0, 0)
    report = {"config": args.config, "hours": args.hours, "machine": machine_info(), "status": response.status_code,
              "upload_mib": size_mb, "wall_s": wall_s, "rtf": wall_s / (args.hours * 3600),
              "rss_before_mb": rss[0], "rss_peak_mb": max(rss), "rss_after_mb": rss[-1], "rss_mb": rss,
              "wer": errors / max(1, n_words), "reference_words": n_words,
              "error": None if response.status_code == 200 else response.text[:500]}
    out = RESULTS / args.name
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    r = report
    out.with_suffix(".md").write_text("\n".join([
        f"# One {args.hours:g}-hour upload to aural serve ({args.config})", "",
        "The dev clips end to end with 1 s of silence after each, repeated, as one 16 kHz 16-bit WAV, POSTed "
        "whole (bench/serve_upload.py); RSS is the server process's, sampled every 5 s.", "",
        md_table(("status", "upload MiB", "wall s", "RTF", "RSS before MiB", "RSS peak MiB", "RSS after MiB",
                  "WER %", "reference words"),
                 [(r["status"], fmt(r["upload_mib"], 0), fmt(r["wall_s"], 0), fmt(r["rtf"], 3),
                   fmt(r["rss_before_mb"], 0), fmt(r["rss_peak_mb"], 0), fmt(r["rss_after_mb"], 0),
                   fmt(100 * r["wer"], 1), r["reference_words"])]), "",
        f"Machine: {_machine(r['machine'])}", ""]))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
