"""The device tier (`pytest -m device`, `make test-vulkan`): the engine on the ggml device named by
AURAL_TEST_BACKEND (e.g. Vulkan0), compared with the same model on the CPU. Skipped when it is unset.

The CPU runs Aural's own kernels (int8 projections, the int8 output screen, its GELU and encoder attention);
a device runs ggml's ops on the f16 weights, so the two differ by rounding and their words are compared by
WER, not token for token."""

from __future__ import annotations

import os
import signal

import jiwer
import numpy as np
import pytest
from conftest import argmax_tokens, assert_one_error_line, end_device_process, english_dev_clips, run_cli
from whisper_normalizer.english import EnglishTextNormalizer

from aural.engine import audio, doctor, features  # first: the engine package sets the OpenMP spin limit
from aural import _native  # noqa: I001
from aural.engine.live.capture import ReplaySource
from aural.engine.live.streaming import Commit, Metrics, live_events
from aural.engine.runtime import WhisperModel
from aural.engine.transcribe import TranscribeOptions, transcribe

BACKEND = os.environ.get("AURAL_TEST_BACKEND", "")
pytestmark = [pytest.mark.device, pytest.mark.skipif(not BACKEND, reason="AURAL_TEST_BACKEND names no device")]

# JFK's 22 words: at most one may differ from the CPU's (f16 ggml ops against the CPU's int8 kernels).
WER_BOUND = 1 / 22
# Aural's CPU-only ops (ggml_map_custom1/3: GELU, encoder attention; ggml_custom_4d: int8 products and
# activation quantisation): no device runs them, so one on a device's graph would show as a fallback.
CUSTOM_OPS = {"CUSTOM", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3"}
DEV_CLIPS = ("en_libri_1089-134686-0001.flac", "en_picovoice_test_1272-128104-0000.wav", "en_speechbrain_example1.wav")

normalize = EnglishTextNormalizer()


@pytest.fixture(scope="module")
def device_model(tiny_gguf):
    return WhisperModel(tiny_gguf, device=BACKEND)


@pytest.fixture(scope="module")
def cpu_model(tiny_gguf):
    return WhisperModel(tiny_gguf, device="cpu")


@pytest.fixture(scope="module")
def jfk_mel(jfk_wav):
    """JFK's 11 s as a 15 s window (1500 frames, the context transcribe encodes it with): on Mesa's llvmpipe
    a 30 s window takes 40 s to encode."""
    mel = features.log_mel_spectrogram(features.pad_or_trim(audio.load_audio(jfk_wav), features.N_SAMPLES))
    return np.ascontiguousarray(mel[:, : features.N_FRAMES // 2])


def text_of(model, wav, **options) -> tuple[str, list, object]:
    """The normalised text, the segments and the timings of one transcription."""
    result = transcribe(model, wav, TranscribeOptions(language="en", **options))
    segments = list(result)
    return normalize("".join(s.text for s in segments)), segments, result.timings


def test_a_device_process_that_dies_hands_the_file_to_the_cpu(tiny_gguf, cpu_model, jfk_wav):
    model = WhisperModel(tiny_gguf, device=BACKEND)
    assert model.isolated  # every device but the CPU runs in a device process
    end_device_process(model._model, signal.SIGKILL)  # as a driver's fault that ends it without a word
    fallbacks = []
    result = transcribe(model, jfk_wav, TranscribeOptions(language="en"), on_fallback=fallbacks.append)
    segments = list(result)
    [fallback] = fallbacks
    assert fallback.device == BACKEND and "the device process ended (killed by SIGKILL" in fallback.reason
    assert result.timings.device == "CPU"
    assert [s.tokens for s in segments] == [s.tokens for s in text_of(cpu_model, jfk_wav)[1]]


def test_the_model_loads_on_the_device_without_aurals_cpu_kernels(device_model):
    assert BACKEND.lower() in (device_model.device.lower(), device_model.backend.lower())
    assert device_model._model.device_info["type"] != "cpu"
    native = device_model._model
    assert not (native.int8 or native.simd_gelu or native.simd_attention or native.simd_cross or native.simd_self
                or native.screen_bytes)


@pytest.mark.parametrize("beam_size", [None, 5], ids=["greedy", "beam5"])
def test_jfk_words_match_the_cpu(device_model, cpu_model, jfk_wav, beam_size):
    device_text, _, device_t = text_of(device_model, jfk_wav, beam_size=beam_size)
    cpu_text, _, cpu_t = text_of(cpu_model, jfk_wav, beam_size=beam_size)
    print(f"{BACKEND} {device_t.wall_s:.2f} s, CPU {cpu_t.wall_s:.2f} s: {device_text!r}")
    assert device_text == cpu_text or jiwer.wer(cpu_text, device_text) <= WER_BOUND, (device_text, cpu_text)


def test_dev_clips_keep_the_cpus_wer(device_model, cpu_model):
    """Three short dev clips (a 15 s window each: 10 s apiece on llvmpipe) at most one word worse than the CPU."""
    clips = [c for c in english_dev_clips() if c.path.name in DEV_CLIPS]
    assert len(clips) == len(DEV_CLIPS)
    references = [normalize(c.reference) for c in clips]

    def wer(model):
        return jiwer.wer(references, [text_of(model, c.path, beam_size=None)[0] for c in clips])

    device_wer, cpu_wer = wer(device_model), wer(cpu_model)
    print(f"WER on {len(clips)} dev clips: {BACKEND} {device_wer:.2%}, CPU {cpu_wer:.2%}")
    assert device_wer <= cpu_wer + 1 / sum(len(r.split()) for r in references)


def test_word_times_match_the_cpu(device_model, cpu_model, jfk_wav):
    _, device_segments, _ = text_of(device_model, jfk_wav, beam_size=None, word_timestamps=True)
    _, cpu_segments, _ = text_of(cpu_model, jfk_wav, beam_size=None, word_timestamps=True)
    device_words = [w for s in device_segments for w in s.words]
    cpu_words = [w for s in cpu_segments for w in s.words]
    assert [w.word for w in device_words] == [w.word for w in cpu_words]
    # Word times come in 20 ms steps of the alignment's DTW: most boundaries may move by a step or two of
    # rounding. One that falls in a pause may move within it: on llvmpipe, "you | ask" (a 0.7 s pause after
    # 7.3 s) moved by 0.20 s, every other boundary by 0.02 s at most.
    shifts = sorted(abs(d.start - c.start) for d, c in zip(device_words, cpu_words))
    assert shifts[int(0.9 * len(shifts)) - 1] <= 0.04 and shifts[-1] <= 0.3, shifts


def test_streaming_jfk_keeps_the_cpus_words(device_model, cpu_model, jfk_wav):
    """JFK replayed as fast as it decodes (70 s on llvmpipe). A stream commits a word once two hypotheses
    agree, so a rounding change in one partial can change a commit: on llvmpipe "ask not" came out as
    "asked" + "not". Bound: two of JFK's 22 words."""
    def stream(model):
        events = list(live_events(model, ReplaySource(jfk_wav, speed=0)))
        return normalize(" ".join(e.text for e in events if isinstance(e, Commit))), events[-1]

    (device_text, metrics), (cpu_text, _) = stream(device_model), stream(cpu_model)
    print(f"{BACKEND} stream: {device_text!r}, CPU {cpu_text!r}")
    assert isinstance(metrics, Metrics) and metrics.device == device_model.device and metrics.kv_io_ms_per_token == 0
    assert not CUSTOM_OPS & set(metrics.fallback_ops)
    assert jiwer.wer(cpu_text, device_text) <= 2 / 22, (device_text, cpu_text)


def test_a_long_prompt_then_single_token_steps_keep_the_cpus_words(device_model, cpu_model, jfk_wav):
    """A prompt of 32 tokens or more, then one token per step, in a session of 5 sequences: on Vulkan the
    prompt's graph took ggml-vulkan's flash-attention mask pre-pass and the next step crashed the process
    (the sonnet's second window, or JFK with this prompt). Batches now run in pieces of at most 31 tokens
    there (backend.h decoder_ubatch_limit)."""
    prompt = ("From fairest creatures we desire increase, that thereby beauty's rose might never die, but as "
              "the riper should by time decease, his tender heir might bear his memory.")
    device_text, _, device_t = text_of(device_model, jfk_wav, beam_size=None, initial_prompt=prompt)
    cpu_text, _, _ = text_of(cpu_model, jfk_wav, beam_size=None, initial_prompt=prompt)
    print(f"{BACKEND} with a prompt, {device_t.wall_s:.2f} s: {device_text!r}")
    assert device_text == cpu_text or jiwer.wer(cpu_text, device_text) <= WER_BOUND, (device_text, cpu_text)


def test_device_kv_moves_no_bytes_and_host_kv_gives_the_same_tokens(device_model, jfk_mel):
    device = device_model.new_session(kv_mode="device")
    host = device_model.new_session(kv_mode="host")
    tokens = argmax_tokens(device, jfk_mel)
    assert len(tokens) > 10
    assert argmax_tokens(host, jfk_mel) == tokens
    assert device.stats["kv_io_bytes_total"] == 0 and device.last_encode["kv_io_bytes"] == 0
    assert host.stats["kv_io_bytes_total"] > 0 and host.last_encode["kv_io_bytes"] > 0


def test_backend_report_names_the_fallbacks_and_no_custom_op(device_model, jfk_mel):
    ctx = device_model.new_session()
    argmax_tokens(ctx, jfk_mel, max_tokens=2)
    report = ctx.backend_report
    print(f"{BACKEND} falls back to the CPU for: {report['fallback_ops']}; encoder "
          f"{report['encoder']['nodes_per_backend']}, decoder {report['decoder']['nodes_per_backend']}")
    assert report["primary"] == device_model.device
    assert not CUSTOM_OPS & set(report["fallback_ops"])
    for graph in ("encoder", "decoder"):
        nodes = report[graph]["nodes_per_backend"]
        assert nodes.get(report["primary"], 0) > 50
        # A fallback op is named exactly when some node of the graph runs on the CPU.
        assert bool(report[graph]["fallback_ops"]) == (nodes.get("CPU", 0) > 0), report[graph]


@pytest.fixture
def only_software_gpus():
    """Skips on a machine with a hardware GPU: the tests below are about one with none (Mesa's llvmpipe as
    ggml's only Vulkan device, which runs slower than the CPU backend)."""
    gpus = [d for d in _native.devices() if d["type"] in ("gpu", "igpu")]
    if not all(d["software"] for d in gpus):
        pytest.skip("this machine has a hardware GPU")


def test_a_software_device_is_named_and_auto_keeps_the_cpu(device_model, only_software_gpus):
    assert _native.select_device("auto") == "CPU"
    text = doctor.format_report(doctor.report())
    assert f"only software ones: {device_model.device} (" in text
    assert "gpu (software)" in text


def test_without_visible_devices_a_software_vulkan_device_is_hidden_and_named(device_model, only_software_gpus,
                                                                              jfk_wav):
    """ggml lists llvmpipe only when GGML_VK_VISIBLE_DEVICES names it: without it, the doctor and a load on
    the device say so rather than list only the CPU."""
    if device_model.backend != "Vulkan":
        pytest.skip("not a Vulkan device")
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    proc = run_cli(env, "doctor")
    assert proc.returncode == 0, proc.stderr
    assert "the Vulkan backend found no device" in proc.stdout and "GGML_VK_VISIBLE_DEVICES=0" in proc.stdout
    assert_one_error_line(run_cli(env, "transcribe", "--backend", device_model.device, jfk_wav),
                          "the Vulkan backend found no device", "GGML_VK_VISIBLE_DEVICES")
