"""The paged KV pool (native/kv-pool.h): sessions that share one pool of self-attention blocks decode the
same numbers as sessions with arenas of their own, take blocks as their text grows and give them back."""

from __future__ import annotations

import numpy as np
import pytest

from aural import _native
from aural.engine import audio, features
from aural.engine.runtime import WhisperModel
from aural.engine.transcribe import TranscribeOptions, transcribe

SOT, NO_TIMESTAMPS = 50257, 50362  # tiny.en
CELLS = _native.KVPool.block_cells


@pytest.fixture(scope="module")
def native_model(tiny_gguf):
    return _native.Model(str(tiny_gguf), n_threads=2)


@pytest.fixture(scope="module")
def jfk_mel(jfk_wav):
    mel = features.log_mel_spectrogram(features.pad_or_trim(audio.load_audio(jfk_wav), features.N_SAMPLES))
    return np.ascontiguousarray(mel)


def greedy(ctx, mel, n_steps: int, prompt: list[int] | None = None) -> tuple[list[int], list[np.ndarray]]:
    """Encodes `mel`, feeds the prompt and SOT, and takes `n_steps` greedy tokens; returns them and every
    step's logits."""
    ctx.encode(mel)
    first = np.asarray((prompt or []) + [SOT, NO_TIMESTAMPS], dtype=np.int32)
    rows = [ctx.decode(first, 0)[0]]
    tokens = [int(np.argmax(rows[-1]))]
    for _ in range(n_steps - 1):
        rows.append(ctx.decode(np.asarray(tokens[-1:], dtype=np.int32), len(first) + len(tokens) - 1)[0])
        tokens.append(int(np.argmax(rows[-1])))
    return tokens, rows


def test_sessions_on_one_pool_decode_the_same_numbers_as_their_own_arenas(native_model, jfk_mel):
    pool = _native.KVPool(native_model, n_blocks=64)
    prompts = [[440 + i % 50 for i in range(70)], [1000 + i % 30 for i in range(90)]]  # 3 blocks each
    own = [greedy(_native.Context(native_model), jfk_mel, 20, prompt) for prompt in prompts]
    # A session holding the pool's first block, then two stepped in turn: no session's cells are the pool's
    # rows of the same number, so each reads through its block table.
    spacer = _native.Context(native_model, kv_pool=pool)
    spacer.encode(jfk_mel)
    spacer.decode(np.array([SOT], dtype=np.int32), 0)
    sessions = [_native.Context(native_model, kv_pool=pool) for _ in prompts]
    for ctx in sessions:
        ctx.encode(jfk_mel)
    firsts = [np.asarray(prompt + [SOT, NO_TIMESTAMPS], dtype=np.int32) for prompt in prompts]
    runs = [([], []) for _ in sessions]
    for step in range(20):
        for ctx, first, (tokens, rows) in zip(sessions, firsts, runs):
            feed = first if step == 0 else np.asarray(tokens[-1:], dtype=np.int32)
            rows.append(ctx.decode(feed, 0 if step == 0 else len(first) + step - 1)[0])
            tokens.append(int(np.argmax(rows[-1])))
    for (tokens, rows), (own_tokens, own_rows) in zip(runs, own):
        assert tokens == own_tokens
        for mine, theirs in zip(rows, own_rows):
            np.testing.assert_array_equal(mine, theirs)  # the same values read in the same order: same bits
    held = [ctx.stats["kv_pool_blocks"] for ctx in sessions]
    assert held == [-(-(len(first) + 19) // CELLS) for first in firsts]  # the cells each holds, in whole blocks
    assert pool.used_blocks == 1 + sum(held) and pool.peak_blocks == pool.used_blocks
    assert sessions[0].stats["kv_bytes"] == held[0] * pool.block_bytes


def test_blocks_go_back_on_a_new_window_a_rewind_and_the_sessions_end(native_model, jfk_mel):
    pool = _native.KVPool(native_model, n_blocks=16)
    ctx = _native.Context(native_model, kv_pool=pool)
    ctx.encode(jfk_mel)
    ctx.decode(np.full(3 * CELLS, 440, dtype=np.int32), 0)
    assert pool.used_blocks == 3
    ctx.decode(np.array([441], dtype=np.int32), CELLS - 1)  # a rewind to position 31 forgets the rest
    assert pool.used_blocks == 1
    ctx.encode(jfk_mel)  # a new window forgets every cell
    assert pool.used_blocks == 0
    other = _native.Context(native_model, kv_pool=pool)
    other.encode(jfk_mel)
    other.decode(np.full(40, 440, dtype=np.int32), 0)
    assert pool.used_blocks == 2
    del other
    assert pool.used_blocks == 0 and pool.peak_blocks == 3


def test_a_full_pool_is_an_error_that_loses_nothing(native_model, jfk_mel):
    pool = _native.KVPool(native_model, n_blocks=2)
    a, b = _native.Context(native_model, kv_pool=pool), _native.Context(native_model, kv_pool=pool)
    for ctx in (a, b):
        ctx.encode(jfk_mel)
    a.decode(np.full(CELLS + 1, 440, dtype=np.int32), 0)  # two blocks: the pool's all
    with pytest.raises(_native.ContextFullError, match="KV pool full"):
        b.decode(np.array([SOT], dtype=np.int32), 0)
    assert pool.used_blocks == 2 and b.stats["kv_pool_blocks"] == 0
    del a
    assert b.decode(np.array([SOT, NO_TIMESTAMPS], dtype=np.int32), 0).shape == (1, 51864)


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_a_pool_on_the_cpu_is_resident_only_where_blocks_were_taken(native_model, jfk_mel):
    """Reserving a pool touches none of its blocks: each is zeroed when first handed out (a row nobody wrote
    stays a finite number), so a pool sized for every session's worst case costs the memory of the blocks
    taken. A pool zeroed whole when made would be resident at once (192 MiB here)."""
    before = resident_mib()
    pool = _native.KVPool(native_model, n_blocks=1024)
    assert resident_mib() - before < pool.bytes / 2**20 / 8
    ctx = _native.Context(native_model, kv_pool=pool)
    ctx.encode(jfk_mel)
    logits = ctx.decode(np.full(3 * CELLS, 440, dtype=np.int32), 0)
    assert pool.used_blocks == 3 and np.all(np.isfinite(logits))


def test_a_sessions_blocks_are_its_own_arenas_cells(native_model, jfk_mel):
    """session_blocks: the blocks of the arena a session of n_seq sequences would reserve (448 positions, 224
    more per further sequence, in 256-cell steps): a pool of one greedy session's fills its 448 positions."""
    assert _native.KVPool.session_blocks(native_model, 1) == 512 // CELLS
    assert _native.KVPool.session_blocks(native_model, 5) == 1536 // CELLS
    with pytest.raises(ValueError, match="n_seq"):
        _native.KVPool.session_blocks(native_model, 9)
    pool = _native.KVPool(native_model, n_blocks=_native.KVPool.session_blocks(native_model, 1))
    ctx = _native.Context(native_model, kv_pool=pool)
    ctx.encode(jfk_mel)
    ctx.decode(np.full(448, 440, dtype=np.int32), 0)
    assert pool.used_blocks == 448 // CELLS


def test_the_gathered_path_matches_the_cpu_op(tiny_gguf, jfk_mel, monkeypatch):
    """Where the graph cannot use Aural's self-attention op (other backends, prompts), the pool's rows are
    gathered for ggml's attention: AURAL_NO_SIMD_SELF takes that path on the CPU."""
    monkeypatch.setenv("AURAL_NO_SIMD_SELF", "1")
    model = _native.Model(str(tiny_gguf), n_threads=2)
    pool = _native.KVPool(model, n_blocks=16)
    spacer = _native.Context(model, kv_pool=pool)  # holds block 0: the session's cells are not rows of their number
    spacer.encode(jfk_mel)
    spacer.decode(np.array([SOT], dtype=np.int32), 0)
    own, own_rows = greedy(_native.Context(model), jfk_mel, 12)
    paged, rows = greedy(_native.Context(model, kv_pool=pool), jfk_mel, 12)
    assert paged == own
    for mine, theirs in zip(rows, own_rows):
        np.testing.assert_array_equal(mine, theirs)


def test_host_mode_and_bad_pools_are_refused(native_model):
    with pytest.raises(ValueError, match="at least one block"):
        _native.KVPool(native_model, n_blocks=0)
    pool = _native.KVPool(native_model, n_blocks=4)
    with pytest.raises(ValueError, match="host KV mode"):
        _native.Context(native_model, kv_mode="host", kv_pool=pool)
    assert pool.used_blocks == 0


def test_a_model_with_a_pool_transcribes_as_without(tiny_gguf, jfk_wav):
    plain = WhisperModel(tiny_gguf, n_threads=2)
    pooled = WhisperModel(tiny_gguf, n_threads=2)
    pooled.use_kv_pool(8.0)
    options = TranscribeOptions(beam_size=5)
    expected = [s.tokens for s in transcribe(plain, jfk_wav, options)]
    result = transcribe(pooled, jfk_wav, options)
    assert [s.tokens for s in result] == expected
    assert pooled.kv_pool.peak_blocks > 0 and pooled.kv_pool.used_blocks == 0  # the session ended
    with pytest.raises(ValueError, match="holds no block"):
        pooled.use_kv_pool(0.01)


# -- the cross-attention K/V and buffers of a session for a short recording ---------------------------


def test_a_session_for_short_audio_reserves_less_and_refuses_longer_windows(native_model, jfk_mel):
    whole, short = _native.Context(native_model), _native.Context(native_model, max_audio_ctx=600)
    assert (whole.stats["cross_capacity"], short.stats["cross_capacity"]) == (1500, 600)
    assert short.stats["cross_kv_bytes"] * 1500 == whole.stats["cross_kv_bytes"] * 600
    assert short.stats["compute_buffer_bytes"] < whole.stats["compute_buffer_bytes"]
    with pytest.raises(ValueError, match="at most 1200 mel frames"):
        short.encode(jfk_mel)  # 3000 frames: a whole window
    first = np.array([SOT, NO_TIMESTAMPS], dtype=np.int32)
    for ctx in (whole, short):
        ctx.encode(np.ascontiguousarray(jfk_mel[:, :1200]))
    np.testing.assert_array_equal(short.decode(first, 0), whole.decode(first, 0))
    with pytest.raises(ValueError, match="at most 1500 encoder positions"):
        _native.Context(native_model, max_audio_ctx=1501)


def test_transcribe_opens_its_session_for_the_recordings_length(tiny_gguf, jfk_wav, monkeypatch):
    from aural.engine import transcribe as transcribing
    from aural.engine.audio import load_audio
    from aural.engine.runtime import FallbackSession

    model = WhisperModel(tiny_gguf, n_threads=2)
    opened = []
    new_session = model.new_session
    monkeypatch.setattr(model, "new_session", lambda **kw: opened.append(kw) or new_session(**kw))
    samples = load_audio(jfk_wav)  # 11.0 s
    capped = [s.tokens for s in transcribe(model, samples, TranscribeOptions(beam_size=5))]
    monkeypatch.setattr(transcribing, "_audio_ctx_for", lambda duration_s, audio_ctx: 0)
    whole = [s.tokens for s in transcribe(model, samples, TranscribeOptions(beam_size=5))]
    assert capped == whole
    assert [kw["max_audio_ctx"] for kw in opened] == [transcribing.window_context_frames(11.5 * 16000, "auto") // 2, 0]
    # A recording longer than its header said: the window that does not fit reopens the session whole.
    session = FallbackSession(model, lambda fallback: None, max_audio_ctx=300)
    short_ctx = session.ctx
    session.fit(600)
    assert session.ctx is short_ctx
    session.fit(3000)
    assert session.ctx is not short_ctx and session.ctx.stats["cross_capacity"] == 1500
