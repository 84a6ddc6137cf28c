"""The server's Prometheus metrics (`GET /metrics`), on prometheus-client: requests, audio seconds,
processing time and real-time factor, the queue, running streams, the live streams' KV arenas and the
shared KV pools.

Each server has a registry of its own, so tests may run several in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .registry import Admission, ModelRegistry

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

# Real-time factors from a fast GPU (0.01) to a slow machine falling behind (over 1).
_RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


class ServerMetrics:
    """Counters the routes update, and gauges read from the admission and the live streams on each scrape."""

    def __init__(self, admission: Admission, models: ModelRegistry):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("aural_requests", "HTTP requests and WebSocket streams by route and status",
                                ["route", "status"], registry=r)
        self.audio_seconds = Counter("aural_audio_seconds", "Seconds of audio transcribed", ["route"], registry=r)
        self.processing_seconds = Counter("aural_processing_seconds",
                                          "Wall seconds spent transcribing (model load excluded)", ["route"],
                                          registry=r)
        self.rtf = Histogram("aural_rtf", "Real-time factor of each finished file transcription",
                             buckets=_RTF_BUCKETS, registry=r)
        self.latency = Histogram("aural_request_seconds", "Wall seconds from a request's arrival to its response",
                                 ["route"], buckets=_SECONDS_BUCKETS, registry=r)
        Gauge("aural_streams_active", "Transcriptions and live streams running now", registry=r).set_function(
            lambda: admission.counts.active)
        Gauge("aural_queue_length", "Requests waiting for a stream slot", registry=r).set_function(
            lambda: admission.counts.waiting)
        Gauge("aural_streams_max", "Stream slots (--max-streams)", registry=r).set(admission.max_streams)
        # Per live stream: (KV cells in use, KV bytes held: its own arena, or its blocks of the shared pool),
        # from its latest Metrics event.
        self.live_kv: dict[int, tuple[int, int]] = {}
        Gauge("aural_live_kv_used_tokens", "KV arena cells in use by the live streams", registry=r).set_function(
            lambda: sum(used for used, _ in self.live_kv.values()))
        Gauge("aural_live_kv_reserved_bytes", "KV bytes the live streams hold (own arenas or pool blocks)", registry=r).set_function(
            lambda: sum(size for _, size in self.live_kv.values()))

        # Continuous batching (batching.DecodeBatcher): shared decoder steps, and the streams' steps they held.
        # getattr: a model in a device process has no batcher, and a Qwen3-ASR model no KV pool.
        batchers = lambda: [m.batcher for m in models.loaded() if getattr(m, "batcher", None)]  # noqa: E731
        Gauge("aural_decode_shared_steps", "Decoder graphs run for several streams' steps at once",
              registry=r).set_function(lambda: sum(b.steps for b in batchers()))
        Gauge("aural_decode_stream_steps", "Streams' decoder steps those graphs held (their ratio: the mean batch)",
              registry=r).set_function(lambda: sum(b.stream_steps for b in batchers()))

        # The shared KV pools (--kv-pool-mb): blocks held by the streams against blocks reserved.
        pools = lambda: [m.kv_pool for m in models.loaded() if getattr(m, "kv_pool", None)]  # noqa: E731
        Gauge("aural_kv_pool_used_bytes", "Bytes of the KV pools' blocks the streams hold now",
              registry=r).set_function(lambda: sum(p.used_blocks * p.block_bytes for p in pools()))
        Gauge("aural_kv_pool_peak_bytes", "The most bytes of the KV pools' blocks held at once",
              registry=r).set_function(lambda: sum(p.peak_blocks * p.block_bytes for p in pools()))
        Gauge("aural_kv_pool_reserved_bytes", "Bytes the KV pools reserve (--kv-pool-mb)",
              registry=r).set_function(lambda: sum(p.bytes for p in pools()))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
