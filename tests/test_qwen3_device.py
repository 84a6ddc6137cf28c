"""Qwen3-ASR on a ggml device (the device tier: `make test-vulkan`, AURAL_TEST_BACKEND=Vulkan0; skipped when it
names none): the audio tower and the decoder run there whole, the RoPE by ggml's ops, and stay within the
rounding bound the CPU is held to against Qwen's own code (tests/test_qwen3_asr.py), widened to f16's step: a
device may round activations to f16 in its weight products (ggml-vulkan's shaders do), where the CPU keeps f32.
The audio tower is held to the official code end to end: 5 s of JFK through the tower and the decoder on the
device give the official generate's tokens. (Its outputs alone strayed from the float64 mirror of
test_qwen3_audio.py by 6.8 times the bound of the f16 rounding model on Mesa's llvmpipe, in the conv stem:
something there rounds more than f16 activations, so no element-wise bound is claimed for it here.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from aural import _native
from aural.engine.models.importers import convert_model
from qwen_reference import needs_reference, official_generate
from test_qwen3_asr import F16_STEP, F32_STEP, follow_official_generate

BACKEND = os.environ.get("AURAL_TEST_BACKEND", "")
pytestmark = [pytest.mark.device, pytest.mark.skipif(not BACKEND, reason="AURAL_TEST_BACKEND names no device"),
              needs_reference]


@pytest.fixture(scope="module")
def models(qwen_official, tmp_path_factory):
    path = convert_model(qwen_official / "ckpt", tmp_path_factory.mktemp("qwen3-device") / "q.gguf", wtype="f32")
    return {device: _native.Qwen3Model(str(path), device=device) for device in ("cpu", BACKEND)}


def test_qwen3_runs_whole_on_the_device(models):
    model = models[BACKEND]
    assert model.device.lower() == BACKEND.lower()
    assert model.host_weights == []  # the small checkpoint's tensors all fit a device's buffers
    ctx = _native.Qwen3Context(model, n_ctx=64)
    ctx.decode(np.array([1, 2, 3], dtype=np.int32))
    assert ctx.fallback_ops == []  # RoPE by ggml's ops: nothing left for the CPU
    assert _native.Qwen3AudioEncoder(model).fallback_ops == []


def test_qwen3_decoder_on_the_device_follows_the_official_code(models, qwen_official):
    """The JFK prompt and 7 greedy steps, as the CPU test does: logits within f16's bound of the official
    float64 run, and the official generate's tokens."""
    ref32, ref64 = np.load(qwen_official / "f32.npz"), np.load(qwen_official / "f64.npz")
    e_ref = np.abs(ref32["logits"] - ref64["logits"]).max()
    ctx = _native.Qwen3Context(models[BACKEND], n_ctx=256, kv_type="f32")
    generated = follow_official_generate(ctx, ref64, e_ref * F16_STEP / F32_STEP)
    assert generated == ref64["generated"].tolist()


def test_qwen3_transcribes_on_the_device_as_the_official_code(models, qwen_official, jfk_wav, tmp_path):
    """As the CPU's end-to-end test: 5 s of JFK (one attention window), numpy log-mel, the tower and the decoder
    on the device with f32 weights and arena, in a device process: the 12 tokens of the official generate."""
    from aural.engine.audio import load_audio
    from aural.engine.qwen3asr import transcribe_qwen3
    from aural.engine.qwen3asr.model import Qwen3AsrModel

    clip, _, expected = official_generate(qwen_official / "ckpt", jfk_wav, tmp_path, seconds=5, new_tokens=12)
    model = Qwen3AsrModel(models[BACKEND].path, device=BACKEND)  # in a device process, as the app and CLI run it
    assert model.isolated and model.fallback is None and model.device.lower() == BACKEND.lower()
    (chunk,) = transcribe_qwen3(model, load_audio(clip), max_new_tokens=12, kv_type="f32")
    assert list(chunk.tokens) == expected
