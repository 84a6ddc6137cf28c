"""System-audio soak: an hour of speech played into a sound server's sink, captioned live from its monitor.

What a user does when captioning a call or a lecture: the computer plays audio, Aural captures the sink's
monitor source ("Speakers — what this computer plays") through PortAudio and the sound server, in real
time. Here the server is a private PulseAudio daemon with one null sink (tests/audio_harness.VirtualMic,
the recipe of shared/docs/testing-gui-and-audio.md); `paplay` plays the English dev clips concatenated to
`--minutes` (0.3 s of silence between them) into the sink; `live_events` captions `vsink.monitor` with the
default StreamOptions until the player has finished and the stream has flushed.

Recorded: dropped blocks (the capture ring's and the device's, Metrics.dropped_blocks) and VmRSS every
`--rss-every` seconds; the report gives RSS at the start, after the first 5 minutes and at the end, and
the growth after those first minutes as a least-squares slope in MiB per hour (flat memory: close to 0),
plus the RTF, rewrites per minute and the WER of the commits against the clips' references.

    .venv/bin/python bench/system_soak.py --minutes 60 --threads 1

Runs under the project venv (it imports Aural). Writes bench/results/system-soak.json and .md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from audio_harness import VirtualMic, default_input_mic  # noqa: E402
from common import RESULTS, english_dev_clips, fmt, machine_info, md_table, word_errors  # noqa: E402
from latency import long_audio, rss_mb  # noqa: E402

from aural.engine.live.capture import MicrophoneSource  # noqa: E402
from aural.engine.live.streaming import Commit, Metrics, StreamOptions, live_events  # noqa: E402
from aural.engine.models.store import resolve_model  # noqa: E402
from aural.engine.runtime import WhisperModel  # noqa: E402

logger = logging.getLogger("bench.system_soak")
WARM_S = 300.0  # memory before this is the start-up's (graphs, arenas, caches), not growth
TAIL_S = 5.0  # the stream runs this long after the player ends, so the last audio reaches the monitor


def sample_rss(every_s: float, stop: threading.Event, started: float, out: list) -> None:
    while not stop.wait(every_s):
        out.append((time.monotonic() - started, rss_mb()))


def caption(model: WhisperModel, mic: VirtualMic, wav: Path, rss_every_s: float) -> dict:
    source = MicrophoneSource(server_source="vsink.monitor")
    stop, sampling = threading.Event(), threading.Event()
    started = time.monotonic()
    rss = [(0.0, rss_mb())]
    sampler = threading.Thread(target=sample_rss, args=(rss_every_s, sampling, started, rss), daemon=True)
    sampler.start()
    player = mic.play(wav, wait=False)

    def stop_after_player() -> None:
        player.wait()
        time.sleep(TAIL_S)
        stop.set()

    threading.Thread(target=stop_after_player, daemon=True).start()
    events = list(live_events(model, source, StreamOptions(), stop=stop))
    sampling.set()
    sampler.join()
    metrics = [e for e in events if isinstance(e, Metrics)]
    return {"events": events, "metrics": metrics, "rss": rss, "wall_s": time.monotonic() - started,
            "player_rc": player.returncode}


def summarize(run: dict, reference: str, minutes: float) -> dict:
    last = run["metrics"][-1]
    t, mib = (np.array(v) for v in zip(*run["rss"]))
    warm = t >= WARM_S
    slope = float(np.polyfit(t[warm], mib[warm], 1)[0] * 3600) if warm.sum() >= 3 else None
    text = " ".join(e.text for e in run["events"] if isinstance(e, Commit))
    errors, words = word_errors(reference, text)
    return {"minutes": minutes, "audio_s": last.audio_s, "wall_s": run["wall_s"], "n_steps": last.n_steps,
            "rtf_mean": last.rtf_mean, "dropped_blocks": last.dropped_blocks,
            "rewrites_per_min": last.rewrites / (last.audio_s / 60) if last.audio_s else None,
            "rss_start_mb": float(mib[0]), "rss_warm_mb": float(mib[warm][0]) if warm.any() else None,
            "rss_end_mb": float(mib[-1]), "rss_max_mb": float(mib.max()), "rss_slope_mib_per_hour": slope,
            "peak_rss_mb": last.peak_rss_mb, "wer_stream": errors / words if words else None,
            "player_rc": run["player_rc"], "rss_samples": list(zip(t.tolist(), mib.tolist()))}


def markdown(report: dict) -> str:
    s = report["summary"]
    row = (fmt(s["minutes"], 0), fmt(s["audio_s"], 0), fmt(s["wall_s"], 0), s["n_steps"], fmt(s["rtf_mean"]),
           s["dropped_blocks"], fmt(s["rewrites_per_min"], 1), fmt(s["rss_start_mb"], 0), fmt(s["rss_warm_mb"], 0),
           fmt(s["rss_end_mb"], 0), fmt(s["rss_max_mb"], 0), fmt(s["rss_slope_mib_per_hour"], 1),
           fmt(100 * s["wer_stream"], 1) if s["wer_stream"] is not None else "-")
    header = ("minutes", "audio s", "wall s", "steps", "RTF", "dropped blocks", "rewrites/min", "RSS start MiB",
              "RSS at 5 min MiB", "RSS end MiB", "RSS max MiB", "RSS slope after 5 min MiB/h", "WER stream %")
    return "\n".join([
        f"# System-audio soak ({report['model']}, {report['threads'] or 'auto'} threads)", "",
        "The English dev clips, concatenated, played by `paplay` into a private PulseAudio daemon's null sink "
        "in real time and captioned live from its monitor (`MicrophoneSource(server_source=\"vsink.monitor\")`: "
        "PortAudio, ALSA's pulse plugin, the server), default StreamOptions. Produced by "
        "`bench/system_soak.py` (its docstring has the method).", "",
        md_table(header, [row]), "",
        f"Machine: {report['machine']}. Started {report['started']}.", ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="minutes of speech to play")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of the model (0: automatic)")
    p.add_argument("--rss-every", type=float, default=10.0, help="seconds between RSS samples")
    p.add_argument("--out", type=Path, default=RESULTS / "system-soak", help="output stem (.json and .md)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    missing = VirtualMic.missing_tools()
    if missing:
        p.error(f"needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils)")
    model = WhisperModel(resolve_model(None), n_threads=args.threads)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    with tempfile.TemporaryDirectory() as folder:
        wav, reference = long_audio(english_dev_clips(), args.minutes, Path(folder))
        with default_input_mic() as mic:
            run = caption(model, mic, wav, args.rss_every)
    report = {"model": model.name, "threads": args.threads, "machine": machine_info(), "started": started,
              "summary": summarize(run, reference, args.minutes)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
