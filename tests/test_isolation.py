"""A model in a device process (aural.engine.isolation): the same results as in process, and a process that
dies under a transcription (as when ggml ends it for a driver error) hands the work to the CPU in process.

The device process here runs the CPU backend (`isolate=True`), the only one these machines run: its
kernels, level and thread count are the parent's, so its results are the in-process ones bit for bit.
Driver faults are played by signalling the child: SIGSEGV as a driver's crash, SIGABRT as GGML_ABORT.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aural import _native
from aural.engine.audio import load_audio
from aural.engine.features import N_SAMPLES, pad_or_trim, window_mel
from aural.engine.isolation import DeviceProcessLost, RemoteModel
from aural.engine.live.capture import ReplaySource
from aural.engine.live.streaming import Commit, DeviceFallback, live_events
from aural.engine.runtime import CPU_DEVICE, FallbackSession, load_model
from aural.engine.transcribe import TranscribeOptions, transcribe
from conftest import argmax_tokens, end_device_process

SONNET = "en_librivox_shakespeare_sonnet001.mp3"  # 53 s: two windows
THREADS = 2


def children() -> set[int]:
    """This process's living children (pids), from /proc."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids |= {int(p) for p in (task / "children").read_text().split()}
    return pids


@pytest.fixture(scope="module")
def in_process(tiny_gguf):
    return load_model(tiny_gguf, n_threads=THREADS, isolate=False)


@pytest.fixture
def isolated(tiny_gguf):
    model = load_model(tiny_gguf, n_threads=THREADS, isolate=True)
    assert model.isolated and model._model.pid in children()
    return model


@pytest.fixture(scope="module")
def jfk_mel(jfk_wav, in_process):
    return window_mel(pad_or_trim(load_audio(jfk_wav)[:N_SAMPLES]), in_process.mel_filters)


@pytest.mark.parametrize("beam_size", [1, 5], ids=["greedy", "beam5"])
def test_an_isolated_model_transcribes_bit_for_bit_as_in_process(isolated, in_process, jfk_wav, beam_size):
    options = TranscribeOptions(beam_size=beam_size, word_timestamps=True)
    here = list(transcribe(in_process, jfk_wav, options))
    there = transcribe(isolated, jfk_wav, options)
    assert list(there) == here  # tokens, text, times, words and their probabilities
    assert there.timings.n_decode_calls > 0 and there.timings.compute_ms > 0  # timings crossed over
    assert (isolated.device, isolated.fallback) == (CPU_DEVICE, None)


def test_a_context_reports_its_timings_stats_and_backend_from_the_process(isolated, in_process, jfk_mel):
    there, here = isolated.new_session(), in_process.new_session()
    assert argmax_tokens(there, jfk_mel) == argmax_tokens(here, jfk_mel)
    assert there.last_encode["encoder_ms"] > 0 and there.last_timings["n_tokens"] == 1
    assert {k: v for k, v in there.stats.items() if not k.endswith("_total")} == \
        {k: v for k, v in here.stats.items() if not k.endswith("_total")}
    assert there.backend_report["primary"] == here.backend_report["primary"] == CPU_DEVICE
    assert isolated.hparams == in_process.hparams and isolated.weights_bytes == in_process.weights_bytes


def test_bad_input_is_the_native_error_and_the_process_goes_on(isolated, jfk_mel):
    ctx = isolated.new_session()
    with pytest.raises(ValueError, match="mel must be float32 of shape"):
        ctx.encode(np.zeros((3, 100), dtype=np.float32))
    with pytest.raises(ValueError, match="non-empty 1-D int32"):
        ctx.decode(np.zeros(0, dtype=np.int32), 0)
    assert argmax_tokens(ctx, jfk_mel)[:3] and isolated._model.lost is None


def test_a_file_the_process_cannot_load_is_a_model_error_and_leaves_no_process(tmp_path, tiny_gguf):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(Path(tiny_gguf).read_bytes()[:100_000])
    before = children()
    with pytest.raises((RuntimeError, ValueError)):
        RemoteModel(str(bad), device=CPU_DEVICE)
    assert children() == before


def test_an_interrupt_from_another_thread_stops_the_call_in_the_process(isolated, jfk_mel):
    ctx = isolated.new_session()
    raised: list[BaseException] = []
    started = threading.Event()

    def encode_until_stopped():
        started.set()
        try:
            while True:
                ctx.encode(jfk_mel)
        except RuntimeError as exc:
            raised.append(exc)

    worker = threading.Thread(target=encode_until_stopped)
    worker.start()
    assert started.wait(30)
    ctx.interrupt()
    worker.join(60)
    assert not worker.is_alive() and isinstance(raised[0], _native.Interrupted) and ctx.interrupted
    # The native flag is set through the control socket (served by a thread of its own in the child, so it
    # may land just after the call that raised), and only on this context.
    deadline = time.monotonic() + 30
    while not ctx._process.call("get", ctx._id, "interrupted"):
        assert time.monotonic() < deadline, "the interrupt never reached the device process"
        time.sleep(0.01)
    assert argmax_tokens(isolated.new_session(), jfk_mel)[:3]


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT], ids=["segfault", "abort"])
def test_a_process_that_dies_mid_file_hands_the_file_to_the_cpu_in_process(isolated, in_process, data_dir, sig):
    here = list(transcribe(in_process, data_dir / SONNET))
    segments, fallbacks = [], []
    result = transcribe(isolated, data_dir / SONNET, on_fallback=fallbacks.append)
    for segment in result:
        segments.append(segment)
        if len(segments) == 1:
            end_device_process(isolated._model, sig)
    [fallback] = fallbacks
    assert fallback.device == CPU_DEVICE and f"the device process ended (killed by {sig.name}" in fallback.reason
    # The first window's segments came from the process; the second window was decoded again in process.
    assert segments == here
    assert (isolated.isolated, result.timings.device) == (False, CPU_DEVICE)


def test_a_process_that_dies_mid_stream_keeps_the_commits(isolated, in_process, jfk_wav):
    here = [e for e in live_events(in_process, ReplaySource(jfk_wav, speed=0)) if isinstance(e, Commit)]
    events = []
    for event in live_events(isolated, ReplaySource(jfk_wav, speed=0)):
        events.append(event)
        if isinstance(event, Commit) and sum(isinstance(e, Commit) for e in events) == 1:
            end_device_process(isolated._model, signal.SIGSEGV)
    [at] = [i for i, e in enumerate(events) if isinstance(e, DeviceFallback)]
    assert "killed by SIGSEGV" in events[at].reason
    assert any(isinstance(e, Commit) for e in events[:at]) and any(isinstance(e, Commit) for e in events[at:])
    assert [e for e in events if isinstance(e, Commit)] == here  # nothing lost, nothing said twice


def test_a_call_after_the_process_died_says_why(isolated, jfk_mel):
    ctx = isolated.new_session()
    end_device_process(isolated._model, signal.SIGABRT)
    with pytest.raises(DeviceProcessLost, match=r"the device process ended \(killed by SIGABRT"):
        ctx.encode(jfk_mel)
    with pytest.raises(DeviceProcessLost):  # and every later one, at once
        ctx.decode(np.array([1], dtype=np.int32), 0)
    assert not ctx.interrupted and isolated._model.pid not in children()


def test_the_reason_quotes_the_last_line_the_process_logged(tiny_gguf, jfk_mel):
    level = _native.get_log_level()
    _native.set_log_level(20)  # the child takes the parent's level: its INFO lines (KV arena, ...) come out
    try:
        model = RemoteModel(str(tiny_gguf), device=CPU_DEVICE)
    finally:
        _native.set_log_level(level)
    ctx = model.new_context()
    ctx.encode(jfk_mel)
    end_device_process(model, signal.SIGABRT)  # as GGML_ABORT, whose message would be that last line
    with pytest.raises(DeviceProcessLost, match=r"\(killed by SIGABRT; its last log line: aural\.native .+\)$"):
        ctx.encode(jfk_mel)


def test_a_session_that_cannot_open_in_a_dead_process_opens_on_the_cpu(isolated, in_process, jfk_mel):
    end_device_process(isolated._model, signal.SIGSEGV)
    fallbacks = []
    session = FallbackSession(isolated, fallbacks.append, n_seq=1)
    assert (session.device, session.isolated, len(fallbacks)) == (CPU_DEVICE, False, 1)
    assert argmax_tokens(session.ctx, jfk_mel) == argmax_tokens(in_process.new_session(), jfk_mel)


def test_a_closed_model_ends_its_process(tiny_gguf):
    model = RemoteModel(str(tiny_gguf), device=CPU_DEVICE)
    pid = model.pid
    assert pid in children()
    model.close()
    assert pid not in children()
