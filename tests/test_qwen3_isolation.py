"""Qwen3-ASR in a device process (aural.engine.isolation, issue #23): the same results as in process, native
errors that cross as themselves, and a process that dies under a file or a live stream (as when ggml ends it for
a driver's error) hands the work to the CPU in process, losing nothing.

As in test_isolation.py, the device process runs the CPU backend (`isolate=True`), the only one these machines
run: its kernels, level and thread count are the parent's, so its results are the in-process ones bit for bit.
The model is the small random-weight checkpoint of test_qwen3_asr.py in f32, as in test_qwen3_streaming.py.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest

from aural import _native
from aural.engine.audio import load_audio
from aural.engine.isolation import DeviceProcessLost
from aural.engine.live.streaming import Commit, DeviceFallback, Metrics, Partial
from aural.engine.models.importers import convert_model
from aural.engine.qwen3asr import transcribe_qwen3
from aural.engine.qwen3asr.model import Qwen3AsrModel
from aural.engine.qwen3asr.streaming import Qwen3Stream, Qwen3StreamOptions
from aural.engine.runtime import CPU_DEVICE
from conftest import end_device_process
from test_isolation import children
from test_qwen3_asr import make_checkpoint

THREADS = 2


@pytest.fixture(scope="module")
def qwen_f32(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen3-isolation")
    make_checkpoint(directory / "ckpt")
    return convert_model(directory / "ckpt", directory / "q.gguf", wtype="f32")


@pytest.fixture(scope="module")
def in_process(qwen_f32):
    return Qwen3AsrModel(qwen_f32, n_threads=THREADS)


@pytest.fixture
def isolated(qwen_f32):
    model = Qwen3AsrModel(qwen_f32, n_threads=THREADS, isolate=True)
    assert model.isolated and model.native.pid in children()
    return model


@pytest.fixture(scope="module")
def jfk(jfk_wav):
    return load_audio(jfk_wav)


def _words(chunks) -> list:
    """What a transcription says, less its timings."""
    return [(c.start, c.end, c.language, c.text, c.tokens, c.prompt_tokens) for c in chunks]


def _transcribe(model, audio, **kwargs) -> list:
    return list(transcribe_qwen3(model, audio, max_new_tokens=8, max_chunk_s=8.0, kv_type="f32", **kwargs))


def test_an_isolated_qwen3_model_transcribes_bit_for_bit_as_in_process(isolated, in_process, jfk):
    here, there = _transcribe(in_process, jfk), _transcribe(isolated, jfk)
    assert len(here) == 2 and all(c.tokens for c in here)
    assert _words(there) == _words(here)
    assert all(c.encode_ms > 0 and c.prefill_ms > 0 for c in there)  # timings crossed over
    assert (isolated.device, isolated.backend, isolated.fallback) == (CPU_DEVICE, "CPU", None)
    assert isolated.eos == in_process.eos and isolated.native.n_state == in_process.native.n_state
    assert isolated.native.audio_vectors(1000) == in_process.native.audio_vectors(1000)


def test_a_context_in_the_process_reports_as_in_process_and_its_errors_cross_as_themselves(isolated, in_process, jfk):
    mel_frames = 400
    contexts = [model.new_context(n_ctx=100, kv_type="f32") for model in (in_process, isolated)]
    audio = [model.encode_audio(np.zeros((128, mel_frames), dtype=np.float32)) for model in (in_process, isolated)]
    assert np.array_equal(audio[0], audio[1])
    prompt = np.asarray(in_process.prompt(len(audio[0])), dtype=np.int32)
    logits = [ctx.decode(prompt, audio=a) for ctx, a in zip(contexts, audio)]
    assert np.array_equal(logits[0], logits[1])
    here, there = contexts
    assert there.n_past == here.n_past == len(prompt) and there.last_timings["compute_ms"] > 0
    assert (there.stats, there.kv_bytes, there.kv_mode) == (here.stats, here.kv_bytes, here.kv_mode)
    there.rewind(3)
    assert there.n_past == 3
    with pytest.raises(_native.ContextFullError):  # what streaming catches to end a segment whose text is full
        there.decode(np.zeros(98, dtype=np.int32))
    with pytest.raises(ValueError, match="audio must be float32 of shape"):
        there.decode(prompt[:1], audio=np.zeros((1, 3), dtype=np.float32))
    assert there.n_past == 3 and isolated.isolated  # nothing appended, and the process goes on


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT], ids=["segfault", "abort"])
def test_a_qwen3_process_that_dies_mid_file_hands_the_file_to_the_cpu(isolated, in_process, jfk, sig):
    here = _transcribe(in_process, jfk)
    chunks, fallbacks = [], []
    for chunk in transcribe_qwen3(isolated, jfk, max_new_tokens=8, max_chunk_s=8.0, kv_type="f32",
                                  on_fallback=fallbacks.append):
        chunks.append(chunk)
        if len(chunks) == 1:
            process = isolated.native
            end_device_process(process, sig)
    [fallback] = fallbacks
    assert fallback.device == CPU_DEVICE and f"the device process ended (killed by {sig.name}" in fallback.reason
    assert fallback is isolated.fallback
    # The first chunk came from the process; the second was transcribed again in process, from its start.
    assert _words(chunks) == _words(here)
    assert (isolated.isolated, isolated.device) == (False, CPU_DEVICE) and process.pid not in children()


def _stream(model, audio) -> list:
    stream = Qwen3Stream(model, Qwen3StreamOptions(max_new_tokens=8, max_segment_s=8.0), kv_type="f32")
    events, ended = [], not model.isolated
    for start in range(0, len(audio), 5000):
        events += stream.feed(audio[start:start + 5000])
        if not ended and any(isinstance(e, Commit) for e in events):
            end_device_process(model.native, signal.SIGSEGV)
            ended = True
    return events + list(stream.finish())


def test_a_qwen3_process_that_dies_mid_stream_keeps_the_commits(isolated, in_process, jfk):
    audio = np.concatenate([jfk, jfk])  # 22 s: segments of 8 s, so the stream goes on past a cut on the CPU
    here, events = _stream(in_process, audio), _stream(isolated, audio)
    [at] = [i for i, e in enumerate(events) if isinstance(e, DeviceFallback)]
    assert "killed by SIGSEGV" in events[at].reason
    assert isinstance(events[at + 1], (Partial, Commit))  # said before the chunk's text
    assert any(isinstance(e, Commit) for e in events[:at]) and any(isinstance(e, Commit) for e in events[at:])

    def said(evs):
        return [(type(e).__name__, e.text) for e in evs if isinstance(e, (Partial, Commit))]

    # The segment was decoded again from nothing on the CPU, with its forced text: nothing lost or said twice.
    assert said(events) == said(here)
    metrics = [e for e in events if isinstance(e, Metrics)]
    assert metrics[0].device == CPU_DEVICE and metrics[-1].audio_s == pytest.approx(len(audio) / 16000)


def test_a_call_after_the_qwen3_process_died_says_why(isolated):
    ctx = isolated.new_context(n_ctx=16)
    end_device_process(isolated.native, signal.SIGABRT)
    with pytest.raises(DeviceProcessLost, match=r"the device process ended \(killed by SIGABRT"):
        ctx.decode(np.array([1], dtype=np.int32))
    with pytest.raises(DeviceProcessLost):
        isolated.encode_audio(np.zeros((128, 100), dtype=np.float32))


def test_a_device_that_is_not_there_leaves_qwen3_on_the_cpu_saying_why(qwen_f32):
    model = Qwen3AsrModel(qwen_f32, n_threads=THREADS, device="NoSuchGPU7")
    assert (model.device, model.isolated) == (CPU_DEVICE, False)
    assert model.fallback.device == "NoSuchGPU7" and "NoSuchGPU7" in model.fallback.message
