"""`aural serve` soaked by many clients that misbehave: does it stay up, bounded and flat in memory?

One server (`--config`, bench/serve.py's syntax) on loopback; `--clients` threads for `--minutes`. Each
client loops over actions, in a fixed rotation per client (client i starts at action i):

- transcribe: a dev clip, json; the answer's words are scored (WER over all answers);
- leave mid-upload: half of a clip's multipart body on a raw socket, then close;
- leave mid-transcription: the whole request on a raw socket, closed 0.3 s later without reading;
- malformed: a multipart body that ends inside its first part (the server answers 400);
- live: a clip's PCM over the WebSocket as fast as it goes, then stop; the commits are scored too.

Every 10 s the server's RSS, running streams and queue are sampled. The report gives each action's answers
by status, transcription latency p50/p95, the RSS at the first sample after the warm-up minute, at the end,
its slope over the run's second half (MiB per hour, least squares), the medians of the first and last third
of the samples after the warm-up, and whether the server stayed up.
Writes bench/results/<name>.json and .md.

Usage: .venv/bin/python bench/serve_soak.py [--config s2] [--clients 50] [--minutes 10] [--name serve-soak]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, fmt, machine_info, md_table, word_errors  # noqa: E402
from serve import ServerProcess, _machine, request_clips, server_args  # noqa: E402

ACTIONS = ("transcribe", "leave-upload", "leave-transcribing", "malformed", "live")
_SAMPLE_S = 10.0
_WARMUP_S = 60.0


class Soak:
    def __init__(self, server: ServerProcess, clips: list, minutes: float):
        self.server, self.clips = server, clips
        self.until = time.monotonic() + 60 * minutes
        self.lock = threading.Lock()
        self.statuses: dict[str, Counter] = {a: Counter() for a in ACTIONS}
        self.latencies: list[float] = []
        self.errors = [0, 0]  # word errors, reference words (transcribe and live)
        self.samples: list[dict] = []

    def client(self, index: int) -> None:
        k = index
        while time.monotonic() < self.until:
            action, clip = ACTIONS[k % len(ACTIONS)], self.clips[k % len(self.clips)]
            try:
                status = getattr(self, "_" + action.replace("-", "_"))(clip)
            except Exception as exc:  # noqa: BLE001 - a client's failure is counted, never fatal to the soak
                status = type(exc).__name__
            with self.lock:
                self.statuses[action][str(status)] += 1
            k += 1

    def _score(self, reference: str, text: str) -> None:
        errors, words = word_errors(reference, text)
        with self.lock:
            self.errors[0] += errors
            self.errors[1] += words

    def _transcribe(self, clip) -> int:
        import httpx

        sent = time.perf_counter()
        with open(clip.path, "rb") as fh:
            r = httpx.post(f"{self.server.url}/v1/audio/transcriptions", files={"file": (clip.path.name, fh)},
                           timeout=900)
        if r.status_code == 200:
            with self.lock:
                self.latencies.append(time.perf_counter() - sent)
            self._score(clip.reference, r.json()["text"])
        return r.status_code

    def _raw(self, clip, fraction: float, linger_s: float) -> str:
        import httpx

        request = httpx.Request("POST", f"{self.server.url}/v1/audio/transcriptions",
                                files={"file": (clip.path.name, clip.path.read_bytes())})
        body = request.read()
        head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
        with socket.create_connection(("127.0.0.1", self.server.port)) as sock:
            sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\n{head}\r\n".encode()
                         + body[:round(len(body) * fraction)])
            time.sleep(linger_s)
        return "closed"

    def _leave_upload(self, clip) -> str:
        return self._raw(clip, 0.5, 0.0)

    def _leave_transcribing(self, clip) -> str:
        return self._raw(clip, 1.0, 0.3)

    def _malformed(self, clip) -> int:
        import httpx

        r = httpx.post(f"{self.server.url}/v1/audio/transcriptions", content=b"--xyz\r\nContent-Disposition: form",
                       headers={"Content-Type": "multipart/form-data; boundary=xyz"}, timeout=60)
        return r.status_code

    def _live(self, clip) -> str:
        from websockets.sync.client import connect

        from aural.engine.audio import load_audio

        pcm = (np.clip(load_audio(clip.path), -1, 1) * 32767).astype("<i2").tobytes()
        url = self.server.url.replace("http://", "ws://") + "/v1/audio/live"
        committed = []
        with connect(url, open_timeout=60, close_timeout=900) as ws:
            first = json.loads(ws.recv(timeout=900))
            if first["type"] != "ready":
                return "busy" if "busy" in first.get("message", "") else first["type"]
            for start in range(0, len(pcm), 32000):
                ws.send(pcm[start:start + 32000])
            ws.send(json.dumps({"type": "stop"}))
            for message in ws:
                event = json.loads(message)
                if event["type"] == "commit":
                    committed.append(event["text"])
        self._score(clip.reference, " ".join(committed))
        return "done"

    def sample(self, started: float) -> None:
        import httpx

        while time.monotonic() < self.until:
            time.sleep(_SAMPLE_S)
            try:
                health = httpx.get(f"{self.server.url}/health", timeout=30).json()
            except httpx.HTTPError as exc:
                health = {"error": type(exc).__name__}
            self.samples.append({"t_s": time.monotonic() - started, "rss_mb": self.server.rss_mb(),
                                 "active": health.get("streams_active"), "queue": health.get("queue_length")})


def slope_mib_per_h(samples: list[dict]) -> float | None:
    late = [s for s in samples if s["t_s"] >= samples[-1]["t_s"] / 2] if samples else []
    if len(late) < 3:
        return None
    t = np.array([s["t_s"] for s in late]) / 3600
    return float(np.polyfit(t, np.array([s["rss_mb"] for s in late]), 1)[0])


def thirds_mb(samples: list[dict]) -> tuple[float | None, float | None]:
    """Median RSS of the first and the last third of the samples after the warm-up minute: steadier than a
    fitted slope against the spikes of requests held in the queue."""
    after = [s["rss_mb"] for s in samples if s["t_s"] >= _WARMUP_S]
    n = len(after) // 3
    return (statistics.median(after[:n]), statistics.median(after[-n:])) if n else (None, None)


def markdown(report: dict) -> str:
    rows = [(a, sum(c.values()), ", ".join(f"{k}: {v}" for k, v in sorted(c.items())))
            for a, c in report["statuses"].items()]
    r = report
    summary = [(r["config"], r["clients"], fmt(r["minutes"], 0), fmt(r["latency_p50_s"]), fmt(r["latency_p95_s"]),
                fmt(100 * r["wer"], 1), fmt(r["rss_after_warmup_mb"], 0), fmt(r["rss_end_mb"], 0),
                f"{fmt(r['rss_thirds_mb'][0], 0)} / {fmt(r['rss_thirds_mb'][1], 0)}",
                fmt(r["rss_slope_mib_per_h"], 1), "yes" if r["server_up"] else "NO")]
    return "\n".join([
        f"# aural serve soak ({r['clients']} clients, {r['minutes']:g} minutes)", "",
        "Clients rotate through transcriptions, uploads and transcriptions they abandon, malformed bodies and "
        "live WebSocket streams (bench/serve_soak.py). RSS is the server process's; the slope is fitted over "
        "the run's second half.", "",
        md_table(("config", "clients", "minutes", "latency p50 s", "latency p95 s", "WER %", "RSS after warm-up MiB",
                  "RSS end MiB", "RSS median, first / last third MiB", "RSS slope MiB/h", "server up"), summary), "",
        md_table(("action", "count", "answers"), rows), "",
        f"Machine: {_machine(r['machine'])}", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="s2")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--name", default="serve-soak")
    args = parser.parse_args()
    server = ServerProcess([*server_args(args.config), "--max-queue", "100"])
    soak = Soak(server, request_clips(), args.minutes)
    started = time.monotonic()
    threads = [threading.Thread(target=soak.client, args=(i,), daemon=True) for i in range(args.clients)]
    sampler = threading.Thread(target=soak.sample, args=(started,), daemon=True)
    for t in [*threads, sampler]:
        t.start()
    for t in [*threads, sampler]:
        t.join()
    up = server.proc.poll() is None
    server.close()
    after = [s for s in soak.samples if s["t_s"] >= _WARMUP_S]
    latencies = sorted(soak.latencies)
    report = {
        "config": args.config, "clients": args.clients, "minutes": args.minutes, "machine": machine_info(),
        "statuses": {a: dict(c) for a, c in soak.statuses.items()}, "server_up": up,
        "latency_p50_s": statistics.median(latencies) if latencies else None,
        "latency_p95_s": latencies[round(0.95 * (len(latencies) - 1))] if latencies else None,
        "wer": soak.errors[0] / max(1, soak.errors[1]),
        "rss_after_warmup_mb": after[0]["rss_mb"] if after else None,
        "rss_end_mb": soak.samples[-1]["rss_mb"] if soak.samples else None,
        "rss_slope_mib_per_h": slope_mib_per_h(soak.samples), "rss_thirds_mb": thirds_mb(soak.samples),
        "samples": soak.samples,
    }
    out = RESULTS / args.name
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
