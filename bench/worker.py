"""One benchmark measurement in its own process: load one engine, warm it up, transcribe the inputs.

Runs under either interpreter: Aural's (.venv) for engine "aural", bench/.venv for "faster-whisper" and
"whisper.cpp". Needs only numpy at import time. Usage: worker.py '<json spec>'; prints one JSON line.

Spec keys: engine; model (GGUF / CT2 dir / ggml .bin); threads; beam (1 = greedy); inputs [{key, path
(.npy float32 16 kHz)}]; warmup_s (seconds of the first input transcribed once before timing, 0: none);
word_timestamps (aural and faster-whisper: each result gets "words", [[word, start_s, end_s,
probability], ...]); aural: kv_mode, device; faster-whisper: compute_type.

Aural results also carry "session_stats": the native context's counters for that input (decode calls,
tokens decoded, graph builds and reuses, beam reorders, alignment passes).

Every engine gets the same decoding set-up where it has the knob: English, openai-whisper's temperature
fallback (0.0..1.0 step 0.2), compression-ratio 2.4 (whisper.cpp: entropy 2.4), log-prob -1.0,
no-speech 0.6, conditioning on previous text, non-speech tokens suppressed, timestamps on, no VAD.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
# faster-whisper's side of that set-up (bench/timestamp_mode.py decodes with it too).
FW_DECODING: dict[str, Any] = {
    "language": "en", "vad_filter": False, "condition_on_previous_text": True,
    "temperature": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], "compression_ratio_threshold": 2.4, "log_prob_threshold": -1.0,
    "no_speech_threshold": 0.6, "suppress_tokens": [-1], "without_timestamps": False,
}


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class Unsupported(Exception):
    """The engine has no such mode (e.g. beam search); reported as n/a, not as a failure."""


# -- Aural -----------------------------------------------------------------------------------------


class AuralEngine:
    def __init__(self, spec: dict[str, Any]):
        import dataclasses

        from aural.engine.runtime import WhisperModel
        from aural.engine.transcribe import TranscribeOptions

        fields = {f.name for f in dataclasses.fields(TranscribeOptions)}
        self.beam = int(spec.get("beam", 1))
        if self.beam > 1 and "beam_size" not in fields:
            raise Unsupported("TranscribeOptions has no beam_size (no beam search in Aural yet)")
        kwargs: dict[str, Any] = {"language": "en"}
        if "beam_size" in fields:
            kwargs["beam_size"] = self.beam
        if spec.get("word_timestamps"):
            kwargs["word_timestamps"] = True
        if "audio_ctx" in spec and "audio_ctx" in fields:
            kwargs["audio_ctx"] = spec["audio_ctx"]
        # Other TranscribeOptions by name (bench/accuracy.py's configs); ones this build lacks are left out.
        kwargs.update({k: v for k, v in spec.get("options", {}).items() if k in fields})
        self.options = TranscribeOptions(**kwargs)
        self.kv_mode = spec.get("kv_mode", "device")
        self.model = WhisperModel(spec["model"], device=spec.get("device", "auto"), n_threads=int(spec["threads"]))
        self.info = {"backend": self.model.backend, "device": self.model.device, "kv_mode": self.kv_mode}
        # transcribe() keeps its native session to itself: remember the last one made, for its counters.
        self._session = None
        new_session = self.model.new_session

        def remembered_session(*args, **kwargs):
            self._session = new_session(*args, **kwargs)
            return self._session

        self.model.new_session = remembered_session

    def transcribe(self, samples: np.ndarray) -> dict[str, Any]:
        from aural.engine.transcribe import transcribe

        start = time.perf_counter()
        tr = transcribe(self.model, samples, self.options, kv_mode=self.kv_mode)
        segments = list(tr)
        processing_s = time.perf_counter() - start
        t = tr.timings.to_dict()
        per_call = t["compute_ms"] + t["kv_io_ms"] + t["logits_ms"] + t["sampling_ms"]
        stats = self._session.stats
        out = {
            "processing_s": processing_s,
            "text": "".join(s.text for s in segments).strip(),
            "out_tokens": sum(len(s.tokens) for s in segments),
            "decode_steps": t["n_decode_calls"],
            "encoder_ms": t["encoder_ms_list"],
            "encoder_frames": t.get("encoder_frames_list", []),
            "native_token_ms": per_call,
            "native": {k: t[k] for k in ("compute_ms", "step_compute_ms", "n_prefill_calls", "prefill_ms",
                                         "prefill_tokens", "kv_io_ms", "kv_io_bytes", "logits_ms", "sampling_ms",
                                         "n_decode_calls", "n_tokens", "graph_builds", "graph_reuses",
                                         "kv_bytes", "wall_s")},
            "session_stats": {k: stats[k] for k in ("decode_calls", "tokens_decoded", "graph_builds",
                                                    "graph_reuses", "reorders", "align_calls", "n_seq")},
        }
        if self.options.word_timestamps:
            out["words"] = [[w.word, w.start, w.end, w.probability] for s in segments for w in s.words or []]
        return out


# -- faster-whisper --------------------------------------------------------------------------------


class FasterWhisperEngine:
    def __init__(self, spec: dict[str, Any]):
        import faster_whisper

        self.beam = int(spec.get("beam", 1))
        self.word_timestamps = bool(spec.get("word_timestamps", False))
        self.model = faster_whisper.WhisperModel(
            spec["model"], device="cpu", compute_type=spec.get("compute_type", "int8"),
            cpu_threads=int(spec["threads"]), num_workers=1)
        self._encoder_ms: list[float] = []
        encode = self.model.encode

        def timed_encode(features, *args, **kwargs):  # CTranslate2 computes synchronously on CPU
            t0 = time.perf_counter()
            out = encode(features, *args, **kwargs)
            self._encoder_ms.append((time.perf_counter() - t0) * 1000)
            return out

        self.model.encode = timed_encode
        self.info = {"version": faster_whisper.__version__, "compute_type": spec.get("compute_type", "int8")}

    def transcribe(self, samples: np.ndarray) -> dict[str, Any]:
        self._encoder_ms = []
        start = time.perf_counter()
        segments, _ = self.model.transcribe(samples, beam_size=self.beam, word_timestamps=self.word_timestamps,
                                            **FW_DECODING)
        segments = list(segments)
        processing_s = time.perf_counter() - start
        out = {
            "processing_s": processing_s,
            "text": "".join(s.text for s in segments).strip(),
            "out_tokens": sum(len(s.tokens) for s in segments),
            "decode_steps": None,
            "encoder_ms": list(self._encoder_ms),
            "native_token_ms": None,  # CTranslate2 does not expose per-token decoder time
            "native": {},
        }
        if self.word_timestamps:
            out["words"] = [[w.word, w.start, w.end, w.probability] for s in segments for w in s.words or []]
        return out


# -- whisper.cpp (pywhispercpp) --------------------------------------------------------------------

_TIMING_RE = re.compile(r"(\w+) time =\s*([\d.]+) ms(?: /\s*(\d+) runs)?")


def whispercpp_timings(pw, ctx) -> dict[str, tuple[float, int]]:
    """whisper.cpp's own timings (it only prints them): captured from fd 2. Name -> (ms, runs)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            pw.whisper_print_timings(ctx)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    return {m.group(1): (float(m.group(2)), int(m.group(3) or 0)) for m in _TIMING_RE.finditer(text)}


class WhisperCppEngine:
    def __init__(self, spec: dict[str, Any]):
        import _pywhispercpp as pw
        from pywhispercpp.model import Model

        self.pw = pw
        self.beam = int(spec.get("beam", 1))
        self.threads = int(spec["threads"])
        params: dict[str, Any] = dict(
            n_threads=self.threads, print_progress=False, print_realtime=False, language="en",
            no_context=False, suppress_nst=True, temperature=0.0, temperature_inc=0.2, entropy_thold=2.4,
            logprob_thold=-1.0, no_speech_thold=0.6)
        if self.beam > 1:
            params["beam_search"] = {"beam_size": self.beam, "patience": -1.0}
        self._new_model = lambda: Model(spec["model"], params_sampling_strategy=0 if self.beam == 1 else 1,
                                        redirect_whispercpp_logs_to=None, **params)
        self.model = self._new_model()
        self.ctx = self.model._ctx
        self._used = False
        self.info = {"system_info": pw.whisper_print_system_info()}

    def _fresh_context(self) -> None:
        # whisper.cpp keeps the decoded text (prompt_past) in its context between whisper_full calls and,
        # with no_context=False, prompts the next input with it; Aural and faster-whisper start every
        # transcription clean, so each input after the first gets a freshly loaded context (untimed).
        self.model = None  # pywhispercpp frees the old context in __del__
        self.model = self._new_model()
        self.ctx = self.model._ctx

    def warm_up(self, samples: np.ndarray) -> None:
        # Not whisper_full: that would leave the warm-up text in whisper.cpp's prompt_past, which the
        # timed run (no_context=False) would then use as its prompt. mel + encoder + one decoder step
        # touch the same weights, buffers and thread pool.
        pw = self.pw
        pw.whisper_pcm_to_mel(self.ctx, samples, len(samples), self.threads)
        pw.whisper_encode(self.ctx, 0, self.threads)
        pw.whisper_decode(self.ctx, pw.whisper_token_sot(self.ctx), 1, 0, self.threads)

    def _timings(self) -> dict[str, tuple[float, int]]:
        return whispercpp_timings(self.pw, self.ctx)

    def transcribe(self, samples: np.ndarray) -> dict[str, Any]:
        pw = self.pw
        if self._used:
            self._fresh_context()
        self._used = True
        pw.whisper_reset_timings(self.ctx)
        start = time.perf_counter()
        segments = self.model.transcribe(samples)
        processing_s = time.perf_counter() - start
        n_tokens = sum(pw.whisper_full_n_tokens(self.ctx, i) for i in range(pw.whisper_full_n_segments(self.ctx)))
        t = self._timings()
        enc_ms, enc_runs = t.get("encode", (0.0, 0))
        dec_ms, dec_runs = t.get("decode", (0.0, 0))
        batch_ms, batch_runs = t.get("batchd", (0.0, 0))
        sample_ms, _ = t.get("sample", (0.0, 0))
        steps = dec_runs + batch_runs
        return {
            "processing_s": processing_s,
            "text": " ".join(s.text.strip() for s in segments).strip(),
            "out_tokens": n_tokens,
            "decode_steps": steps,
            # whisper.cpp reports the encoder total and run count, not each window
            "encoder_ms": [enc_ms / enc_runs] * enc_runs if enc_runs else [],
            "native_token_ms": (dec_ms + batch_ms + sample_ms) / steps if steps else None,
            "native": {k: {"ms": v[0], "runs": v[1]} for k, v in t.items()},
        }


ENGINES = {"aural": AuralEngine, "faster-whisper": FasterWhisperEngine, "whisper.cpp": WhisperCppEngine}


def main() -> int:
    spec = json.loads(sys.argv[1])
    out: dict[str, Any] = {"engine": spec["engine"], "rss_start_mb": _rss_mb()}
    try:
        t0 = time.perf_counter()
        engine = ENGINES[spec["engine"]](spec)
        out["load_s"] = time.perf_counter() - t0
    except Unsupported as exc:
        out["unsupported"] = str(exc)
        print(json.dumps(out))
        return 0
    out["rss_after_load_mb"] = _rss_mb()
    out["info"] = engine.info
    inputs = spec["inputs"]
    warmup_s = float(spec.get("warmup_s", 0))
    if warmup_s > 0 and inputs:
        samples = np.load(inputs[0]["path"])[: int(warmup_s * SAMPLE_RATE)]
        t0 = time.perf_counter()
        if hasattr(engine, "warm_up"):
            engine.warm_up(samples)
        else:
            engine.transcribe(samples)
        out["warmup_s"] = time.perf_counter() - t0
    results = []
    for item in inputs:
        samples = np.load(item["path"])
        r = engine.transcribe(samples)
        r["key"] = item["key"]
        r["audio_s"] = samples.size / SAMPLE_RATE
        r["rtf"] = r["processing_s"] / r["audio_s"] if r["audio_s"] else None
        enc_total = sum(r["encoder_ms"])
        r["n_windows"] = len(r["encoder_ms"])
        r["encoder_ms_mean"] = enc_total / len(r["encoder_ms"]) if r["encoder_ms"] else None
        # The same yardstick for every engine: wall time outside the encoder per output token.
        r["decode_ms_per_token"] = ((r["processing_s"] * 1000 - enc_total) / r["out_tokens"]
                                    if r["out_tokens"] else None)
        r["peak_rss_mb"] = _peak_rss_mb()
        results.append(r)
    out["results"] = results
    out["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
