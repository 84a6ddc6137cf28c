"""The device policy's fallback to the CPU: a device that is gone, cannot initialise, has no room for a
session, or is lost mid-file or mid-stream. The real tiny.en on the CPU, under tests/fake_device.py's
"Vulkan0" where a GPU must fail."""

from __future__ import annotations

import logging

import pytest

from aural.engine import cli
from aural.engine.live.capture import ReplaySource
from aural.engine.live.streaming import Commit, DeviceFallback, Metrics, event_dict, live_events
from aural.engine.runtime import CPU_DEVICE, compute_devices, load_model, resolve_device
from aural.engine.transcribe import TranscribeOptions, transcribe
from fake_device import COMPUTE_FAILURE, INIT_FAILURE, NAME, RESERVE_FAILURE, FakeGpu

SONNET = "en_librivox_shakespeare_sonnet001.mp3"  # 53 s: two windows


def lost_message(reason: str = COMPUTE_FAILURE) -> str:
    return f"{NAME} could not be used ({reason}): running on the CPU"


@pytest.fixture
def cpu_model(tiny_gguf):
    return load_model(tiny_gguf, device="cpu")


def test_the_devices_are_listed_with_their_memory():
    cpu = next(d for d in compute_devices() if d.name == CPU_DEVICE)
    assert cpu.type == "cpu" and cpu.description and 0 < cpu.memory_free <= cpu.memory_total
    assert resolve_device("auto") in {d.name for d in compute_devices()}


def test_a_device_that_works_is_used(tiny_gguf, monkeypatch):
    FakeGpu().install(monkeypatch)
    assert NAME in {d.name for d in compute_devices()}
    model = load_model(tiny_gguf, device=NAME)
    assert (model.device, model.backend, model.fallback) == (NAME, "Vulkan", None)


def test_a_device_that_cannot_initialise_loads_the_model_on_the_cpu(tiny_gguf, monkeypatch, caplog):
    FakeGpu(fails_to_initialise=True).install(monkeypatch)
    model = load_model(tiny_gguf, device=NAME)
    assert model.device == CPU_DEVICE
    assert model.fallback.message == lost_message(INIT_FAILURE)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [lost_message(INIT_FAILURE)]


def test_a_device_that_is_gone_loads_the_model_on_the_cpu(tiny_gguf):
    model = load_model(tiny_gguf, device="CUDA7")  # named in the settings, since unplugged
    assert model.device == CPU_DEVICE
    assert model.fallback.device == "CUDA7" and "no backend or device named 'CUDA7'" in model.fallback.reason


@pytest.fixture(scope="module")
def sonnet_on_cpu(tiny_gguf, data_dir):
    return list(transcribe(load_model(tiny_gguf, device="cpu"), data_dir / SONNET, WORDS))


WORDS = TranscribeOptions(word_timestamps=True)


# Lost as the second window is encoded, or once its segments are cut and join the prompt, as its words are
# aligned: what the failed attempt changed must be undone before the window is decoded again.
@pytest.mark.parametrize("lost_at", [("encode", 2), ("align", 2)], ids=["encode", "align"])
def test_a_device_lost_mid_file_resumes_at_the_window_in_progress_on_the_cpu(tiny_gguf, sonnet_on_cpu, data_dir,
                                                                           monkeypatch, lost_at):
    FakeGpu(lost_at=lost_at).install(monkeypatch)
    model = load_model(tiny_gguf, device=NAME)
    segments, fallbacks = [], []
    result = transcribe(model, data_dir / SONNET, WORDS, on_fallback=lambda f: fallbacks.append((f, len(segments))))
    for segment in result:
        segments.append(segment)
    [(fallback, done_before)] = fallbacks
    assert fallback.message == lost_message()
    # The first window's segments came from the device and stand; the second window, in progress when the
    # device went, was decoded again on the CPU: the same segments as a run on the CPU alone.
    assert 0 < done_before < len(segments)
    assert segments == sonnet_on_cpu
    assert (result.info.device, result.timings.device, model.device) == (NAME, CPU_DEVICE, CPU_DEVICE)


def test_a_session_without_room_on_the_device_opens_on_the_cpu(tiny_gguf, cpu_model, jfk_wav, monkeypatch):
    beams = TranscribeOptions(beam_size=5)
    on_cpu = [s.tokens for s in transcribe(cpu_model, jfk_wav, beams)]
    FakeGpu(max_sequences=1).install(monkeypatch)  # loads (one sequence) but has no room for five beams
    model = load_model(tiny_gguf, device=NAME)
    assert model.device == NAME
    fallbacks = []
    result = transcribe(model, jfk_wav, beams, on_fallback=fallbacks.append)
    assert [s.tokens for s in result] == on_cpu
    assert [f.message for f in fallbacks] == [lost_message(RESERVE_FAILURE)]
    assert result.timings.device == CPU_DEVICE


def test_a_device_lost_mid_stream_keeps_the_commits_and_goes_on_on_the_cpu(tiny_gguf, cpu_model, jfk_wav,
                                                                           monkeypatch):
    on_cpu = [e for e in live_events(cpu_model, ReplaySource(jfk_wav, speed=0)) if isinstance(e, Commit)]
    FakeGpu(lost_at=("encode", 5)).install(monkeypatch)
    events = list(live_events(load_model(tiny_gguf, device=NAME), ReplaySource(jfk_wav, speed=0)))
    [at] = [i for i, e in enumerate(events) if isinstance(e, DeviceFallback)]
    assert events[at].message == lost_message()
    assert event_dict(events[at]) == {"type": "fallback", "device": NAME, "reason": COMPUTE_FAILURE}  # --json
    before, after = events[:at], events[at:]
    assert any(isinstance(e, Commit) for e in before) and any(isinstance(e, Commit) for e in after)
    # Nothing committed on the device is lost or said again: the stream is the CPU's alone, word for word.
    assert [e for e in events if isinstance(e, Commit)] == on_cpu
    devices = [e.device for e in events if isinstance(e, Metrics)]
    assert devices[0] == NAME and set(devices[devices.index(CPU_DEVICE):]) == {CPU_DEVICE}


def test_transcribe_command_warns_once_and_finishes_on_the_cpu(tiny_gguf, jfk_wav, monkeypatch, capsys, caplog):
    FakeGpu(lost_at=("decode", 1)).install(monkeypatch)
    assert cli.main(["transcribe", "--backend", NAME, "--beam-size", "1", "-f", "txt", str(jfk_wav)]) == 0
    out, err = capsys.readouterr()
    assert "ask not what your country can do for you" in out
    assert "CPU, KV on device" in err  # the summary names where the work ended up
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [lost_message()]


def test_transcribe_command_refuses_a_backend_that_names_no_device(jfk_wav, capsys):
    assert cli.main(["transcribe", "--backend", "Vulkan7", str(jfk_wav)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("aural: error: no backend or device named 'Vulkan7'")
