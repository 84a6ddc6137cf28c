"""The model catalog and `aural models pull`: downloads from a real HTTP server on loopback (tests/model_mirror.py)
serving a whisper.cpp file exported from tiny.en and a test catalog, named by AURAL_MODEL_MIRROR. A pulled
model converts and transcribes JFK; a cut resumes with Range; a cancel keeps a resumable partial; a wrong
checksum, a 404, a full disk, an unwritable cache and a missing server each fail in one line and leave nothing
installed; HTTPS_PROXY is honoured; nothing touches the network unless a pull (or `list --available`) asks."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import assert_one_error_line, run_cli
from model_mirror import catalog_entry, connect_recorder, mirror, reset, use_mirror, write_catalog

from aural.engine import cli
from aural.engine.errors import DownloadError, ModelError
from aural.engine.models import download
from aural.engine.models.catalog import MIRROR_ENV, find_entry, load_catalog, parse_catalog
from aural.engine.models.store import catalog_models, format_catalog_table, pull, remove_pulled, resolve_model

SIZES = ["tiny", "tiny.en", "base", "base.en", "small", "small.en", "medium", "medium.en", "large-v3",
         "large-v3-turbo"]
HUB = ["qwen3-asr-0.6b"]  # the catalog's hub_models (tests/test_hub_pull.py pulls it)
HF = "https://huggingface.co/ggerganov/whisper.cpp/resolve/main"  # whisper.cpp models/download-ggml-model.sh
JFK_WORDS = ("and so my fellow americans ask not what your country can do for you "
             "ask what you can do for your country").split()


def words(text: str) -> list[str]:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text).replace(".", " ").split()


@pytest.fixture(scope="module")
def served(tiny_ggml, tmp_path_factory):
    """The mirror: ggml-tiny.en.bin (exported from tiny.en) and a catalog naming it three ways."""
    root = tmp_path_factory.mktemp("mirror")
    ggml = root / tiny_ggml.name
    ggml.hardlink_to(tiny_ggml)
    write_catalog(root, [
        catalog_entry("tiny.en", ggml),
        catalog_entry("tiny.en-bad", ggml, sha256="0" * 64),  # served, but not what the catalog promises
        catalog_entry("gone", ggml, file="ggml-gone.bin"),  # listed, not served: 404
    ])
    with mirror(root) as (url, state):
        yield url, state, ggml


@pytest.fixture
def site(served, tmp_path, monkeypatch):
    """A clean cache and the mirror's URL in the environment, no proxy; returns (url, state, ggml, cache)."""
    url, state, ggml = served
    reset(state)
    use_mirror(monkeypatch, url, tmp_path / "cache")
    return url, state, ggml, tmp_path / "cache" / "models"


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def model_gets(state) -> list[str | None]:
    """The Range header of each GET of the model file."""
    return [rng for path, rng in state.requests if path == "/ggml-tiny.en.bin"]


def download_only(name: str, **kwargs) -> list:
    """pull() up to its conversion, then stop iterating (the verified download stays)."""
    steps = []
    for step in pull(name, **kwargs):
        steps.append(step)
        if step.stage in ("convert", "cancelled"):
            break
    return steps


# -- the built-in catalog ------------------------------------------------------------------------------


def test_builtin_catalog_lists_every_whisper_size(monkeypatch):
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    entries = load_catalog()
    assert list(entries) == SIZES + HUB
    for name, entry in ((name, entries[name]) for name in SIZES):
        assert entry.file == f"ggml-{name}.bin" and entry.url == f"{HF}/ggml-{name}.bin"
        assert len(entry.sha256) == 64 and len(entry.sha1) == 40 and entry.license == "MIT"
        assert entry.languages == (1 if name.endswith(".en") else 100 if name.startswith("large-v3") else 99)
    # whisper.cpp models/README.md "Available models" (SHA-1) and its Disk column, to the MiB it rounds to.
    assert entries["tiny.en"].sha1 == "c78c86eb1a8faa21b369bcd33207cc90d64ae9df"
    assert entries["large-v3-turbo"].sha1 == "4af2b29d7ec73d781377bfd1758ca957a807e941"
    assert round(entries["base"].size / 2**20) == 141 and round(entries["large-v3"].size / 2**30, 1) == 2.9
    qwen = entries["qwen3-asr-0.6b"]  # the model card's repository and the files the converter reads
    assert (qwen.repo, qwen.revision, qwen.architecture, qwen.license) == ("Qwen/Qwen3-ASR-0.6B", "main",
                                                                          "qwen3-asr", "Apache-2.0")
    assert set(qwen.files) == {"config.json", "generation_config.json", "preprocessor_config.json",
                               "tokenizer_config.json", "vocab.json", "merges.txt", "model.safetensors"}


def test_mirror_replaces_the_base_url(monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, "https://models.example/whisper/")
    assert find_entry("small").url == "https://models.example/whisper/ggml-small.bin"
    monkeypatch.setenv(MIRROR_ENV, "ftp://models.example")
    with pytest.raises(ModelError, match="must be an http://, https:// or file:// URL"):
        load_catalog()


@pytest.mark.parametrize("change, message", [
    ({"name": "../../etc"}, "'name' must be letters, digits"),
    ({"file": ".hidden.bin"}, "'file' must be letters, digits"),
    ({"sha256": "ABC"}, "'sha256' must be a lower-case hex sha256 digest"),
    ({"sha256": None, "sha1": None}, "has neither sha256 nor sha1"),
    ({"size": -1}, "'size' must be a positive whole number"),
])
def test_bad_catalog_entries_are_refused(change, message):
    entry = {"name": "x", "file": "ggml-x.bin", "size": 1, "sha256": "0" * 64, **change}
    with pytest.raises(ModelError, match=message):
        parse_catalog({"schema": 1, "models": [entry]}, "http://m", origin="test")
    with pytest.raises(ModelError, match="not an Aural model catalog"):
        parse_catalog({"models": []}, "http://m", origin="test")


@pytest.mark.parametrize("change, message", [
    ({"repo": "../x"}, "'repo' must be 'owner/name'"),
    ({"files": ["../config.json"]}, "'file' must be letters, digits"),
    ({"files": []}, "'files' must be a list of file names"),
    ({"architecture": "whisper"}, "'architecture' must be one of qwen3-asr"),
    ({"revision": "a/b"}, "'revision' must be letters, digits"),
])
def test_bad_hub_entries_are_refused(change, message):
    entry = {"name": "x", "repo": "o/x", "revision": "main", "architecture": "qwen3-asr", "files": ["a.json"],
             **change}
    with pytest.raises(ModelError, match=message):
        parse_catalog({"schema": 1, "models": [], "hub_models": [entry]}, "http://m", origin="test")


def test_a_mirror_without_catalog_serves_the_builtin_entries(tmp_path, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, tmp_path.as_uri())  # a file:// mirror: a folder, no catalog.json
    entries = load_catalog(remote=True)
    assert list(entries) == SIZES + HUB and entries["tiny"].url == f"{tmp_path.as_uri()}/ggml-tiny.bin"


# -- pull, convert, transcribe -------------------------------------------------------------------------


def test_pull_converts_and_transcribes_jfk(site, jfk_wav):
    from aural.engine.runtime import WhisperModel
    from aural.engine.transcribe import transcribe

    _, state, ggml, cache = site
    steps = list(pull("tiny.en"))
    stages = [s.stage for s in steps]
    assert stages[0] == "download" and stages[-3:] == ["verify", "convert", "done"]
    done = [s.done_bytes for s in steps if s.stage == "download"]
    assert done == sorted(done) and done[-1] == ggml.stat().st_size == steps[0].total_bytes
    path = steps[-1].path
    assert path == cache / "pulled" / "tiny.en" / "tiny.en-f16.gguf"
    assert (cache / "pulled" / "tiny.en" / "ggml-tiny.en.bin").read_bytes() == ggml.read_bytes()
    assert resolve_model("tiny.en") == path  # the pulled model wins over the packaged tiny.en
    result = transcribe(WhisperModel(path), jfk_wav)
    assert words(" ".join(s.text for s in result)) == JFK_WORDS
    assert model_gets(state) == [None]  # one request, from byte 0


def test_a_cut_resumes_with_a_range_request(site):
    _, state, ggml, cache = site
    cut = 10 * 2**20
    state.cut_once["ggml-tiny.en.bin"] = cut
    download_only("tiny.en")
    assert model_gets(state) == [None, f"bytes={cut}-"]
    assert (cache / "pulled" / "tiny.en" / "ggml-tiny.en.bin").read_bytes() == ggml.read_bytes()


def test_cancel_keeps_a_resumable_partial(site):
    _, state, ggml, cache = site
    stop = threading.Event()
    steps = []
    for step in pull("tiny.en", stop=stop):
        steps.append(step)
        if step.stage == "download" and step.done_bytes >= 2**20:
            stop.set()
    assert steps[-1].stage == "cancelled"
    kept = steps[-1].done_bytes
    folder = cache / "pulled" / "tiny.en"
    assert files_under(cache) == [folder / ".ggml-tiny.en.bin.part"] and 0 < kept < ggml.stat().st_size
    (row,) = (r for r in catalog_models() if r.name == "tiny.en")
    assert row.partial_bytes == kept and not row.downloaded
    download_only("tiny.en")
    assert model_gets(state) == [None, f"bytes={kept}-"]
    assert (folder / "ggml-tiny.en.bin").read_bytes() == ggml.read_bytes()


def test_ctrl_c_keeps_a_resumable_partial(site):
    _, state, ggml, cache = site
    state.slow = True
    partial = cache / "pulled" / "tiny.en" / ".ggml-tiny.en.bin.part"
    # A shell without job control starts background jobs with SIGINT ignored (see test_cli's Ctrl-C test).
    proc = subprocess.Popen([sys.executable, "-m", "aural.engine.cli", "models", "pull", "tiny.en"],
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                                           signal.SIG_DFL))
    assert proc.stderr.readline() == "tiny.en: downloading 74.1 MiB\n"
    deadline = time.monotonic() + 60
    while (not partial.is_file() or partial.stat().st_size < 2**20) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.endswith("aural: interrupted; `aural models pull tiny.en` carries on from where it stopped\n")
    kept = partial.stat().st_size
    assert 2**20 <= kept < ggml.stat().st_size
    state.slow = False
    download_only("tiny.en")
    assert model_gets(state)[-1] == f"bytes={kept}-"


def test_a_server_that_ignores_range_restarts_from_zero(site):
    _, state, ggml, cache = site
    folder = cache / "pulled" / "tiny.en"
    folder.mkdir(parents=True)
    (folder / ".ggml-tiny.en.bin.part").write_bytes(ggml.read_bytes()[:12345])
    state.ignore_range = True
    download_only("tiny.en")
    assert model_gets(state) == ["bytes=12345-"]
    assert (folder / "ggml-tiny.en.bin").read_bytes() == ggml.read_bytes()


def test_another_type_converts_from_the_kept_download(site):
    _, state, _, cache = site
    download_only("tiny.en")
    path = list(pull("tiny.en", wtype="q8_0"))[-1].path
    assert path.name == "tiny.en-q8_0.gguf" and len(model_gets(state)) == 1  # no second download
    assert resolve_model("tiny.en") == path  # the only GGUF pulled
    assert resolve_model("tiny.en", wtype="q8_0") == path


def test_a_file_mirror_is_a_folder(site, tmp_path, monkeypatch):
    _, _, ggml, cache = site
    folder = tmp_path / "usb"
    folder.mkdir()
    (folder / ggml.name).write_bytes(ggml.read_bytes())
    write_catalog(folder, [catalog_entry("tiny.en", folder / ggml.name)])
    monkeypatch.setenv(MIRROR_ENV, folder.as_uri())
    download_only("tiny.en")
    assert (cache / "pulled" / "tiny.en" / "ggml-tiny.en.bin").read_bytes() == ggml.read_bytes()


# -- failures: one line, nothing installed ------------------------------------------------------------


def test_a_wrong_checksum_is_refused_and_nothing_stays(site):
    cache = site[3]
    with pytest.raises(DownloadError, match="does not match its sha256 .* nothing was installed"):
        list(pull("tiny.en-bad"))
    assert files_under(cache) == []


def test_a_missing_file_is_a_404_error(site):
    with pytest.raises(DownloadError, match="the server answered 404"):
        list(pull("gone"))
    assert files_under(site[3]) == []


def test_not_enough_space_is_refused_before_downloading(site, monkeypatch):
    monkeypatch.setattr(download.shutil, "disk_usage", lambda _: type("Usage", (), {"free": 2**20})())
    with pytest.raises(DownloadError, match=r"Not enough free space .* this needs 148\.2 MiB and 1\.0 MiB are free"):
        list(pull("tiny.en"))
    assert files_under(site[3]) == [] and model_gets(site[1]) == []


class _FullDisk(io.FileIO):
    """A partial file on a disk that fills up after 3 MiB."""

    def write(self, data):
        if os.fstat(self.fileno()).st_size + len(data) > 3 * 2**20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_full_disk_mid_download_keeps_the_partial(site, monkeypatch):
    monkeypatch.setattr(download, "open", lambda path, mode: _FullDisk(path, "a+"), raising=False)
    with pytest.raises(DownloadError, match="The disk is full: cannot write .*pull again to resume"):
        list(pull("tiny.en"))
    (partial,) = files_under(site[3])
    assert partial.name == ".ggml-tiny.en.bin.part" and 0 < partial.stat().st_size <= 3 * 2**20


def test_an_unwritable_cache_is_one_error_line(site, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")  # a file where a folder should be: mkdir fails even for root
    env = dict(os.environ, AURAL_CACHE_DIR=str(blocker / "cache"))
    assert_one_error_line(run_cli(env, "models", "pull", "tiny.en"), "is not writable")


def test_no_server_is_one_error_line(site):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, **{MIRROR_ENV: f"http://127.0.0.1:{port}"})
    assert_one_error_line(run_cli(env, "models", "pull", "tiny.en"), f"Cannot reach 127.0.0.1:{port}",
                          "Connection refused")
    assert files_under(site[3]) == []


def test_https_proxy_is_honoured(site, monkeypatch):
    with connect_recorder() as (proxy, targets):
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        monkeypatch.setenv(MIRROR_ENV, "https://models.example")
        with pytest.raises(DownloadError, match="Cannot reach models.example .* Tunnel connection failed: 403"):
            list(pull("tiny"))
    assert targets == ["models.example:443"]  # urllib tunnelled through the proxy: the catalog request


def test_resolving_and_listing_never_touch_the_network(site, monkeypatch):
    download_only("tiny.en")

    def no_network(*args):
        raise AssertionError("network used")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    assert resolve_model("tiny.en").name == "tiny.en-f16.gguf"  # converted from the kept download
    assert [r.name for r in catalog_models() if r.disk_bytes] == ["tiny.en"]
    with pytest.raises(ModelError, match="'small' is not downloaded yet: `aural models pull small`"):
        resolve_model("small")


# -- list and rm ---------------------------------------------------------------------------------------


def test_list_shows_a_pulled_model_and_rm_removes_it(site):
    cache = site[3]
    list(pull("tiny.en", wtype="q5_0"))
    rows = {r.name: r for r in catalog_models(remote=True)}
    assert list(rows) == [*SIZES, *HUB, "tiny.en-bad", "gone"]  # the mirror's entries replace and extend
    tiny = rows["tiny.en"]
    assert tiny.downloaded and [c.wtype for c in tiny.cached] == ["q5_0"]
    assert tiny.disk_bytes == sum(p.stat().st_size for p in files_under(cache))
    line = next(line for line in format_catalog_table(list(rows.values())).splitlines() if line.startswith("tiny.en "))
    assert line.split()[1:4] == ["English", "39", "M"] and "q5_0" in line and "MIT" in line
    assert remove_pulled("tiny.en") == tiny.disk_bytes
    assert files_under(cache) == []
    with pytest.raises(ModelError, match="'tiny.en' is not pulled"):
        remove_pulled("tiny.en")


# -- the command line ----------------------------------------------------------------------------------


def test_cli_session_list_pull_transcribe_rm(site, jfk_wav):
    cache = site[3]
    env = dict(os.environ)
    available = run_cli(env, "models", "list", "--available")
    assert available.returncode == 0, available.stderr
    assert available.stdout.splitlines()[0].split()[:4] == ["MODEL", "LANGUAGES", "PARAMETERS", "DOWNLOAD"]
    assert f"Whisper files come from {site[0]}." in available.stdout
    pulled = run_cli(env, "models", "pull", "tiny.en", "--type", "q8_0")
    assert pulled.returncode == 0, pulled.stderr
    assert Path(pulled.stdout.strip()) == cache / "pulled" / "tiny.en" / "tiny.en-q8_0.gguf"
    assert "tiny.en: downloading 74.1 MiB" in pulled.stderr and "100%" in pulled.stderr
    assert "converting to GGUF (q8_0)" in pulled.stderr
    listing = run_cli(env, "models", "list")
    assert "Pulled (aural models pull):" in listing.stdout and "q8_0" in listing.stdout
    transcript = run_cli(env, "transcribe", "-m", "tiny.en", "-f", "json", "-q", jfk_wav)
    assert transcript.returncode == 0, transcript.stderr
    doc = json.loads(transcript.stdout)
    assert words(" ".join(s["text"] for s in doc["segments"])) == JFK_WORDS
    removed = run_cli(env, "models", "rm", "tiny.en")
    assert removed.returncode == 0 and removed.stdout.startswith("Removed tiny.en (")
    assert files_under(cache) == []
    assert_one_error_line(run_cli(env, "models", "rm", "tiny.en"), "'tiny.en' is not pulled")
    assert_one_error_line(run_cli(env, "models", "pull", "huge"), "'huge' is not in the model catalog")


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def _steps(total: int = 100 * 2**20):
    from aural.engine.models.store import PullProgress

    yield from (PullProgress("download", "tiny", total * i // 20, total) for i in range(1, 21))
    yield PullProgress("verify", "tiny", total, total)
    yield PullProgress("convert", "tiny", total, total)


def test_pull_bar_prints_lines_in_a_log():
    stream = _Stream(tty=False)
    bar = cli._PullBar(stream, "q8_0")
    for step in _steps():
        bar(step)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "tiny: downloading 100.0 MiB" and "\r" not in stream.getvalue()
    assert len(lines) == 1 + 10 + 2 and " 10%" in lines[1] and "100%" in lines[10]
    assert lines[-2:] == ["tiny: verifying the download's checksums", "tiny: converting to GGUF (q8_0)"]


def test_pull_bar_redraws_in_place_on_a_terminal(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(cli.time, "monotonic", lambda: float(next(clock)))  # a second between steps
    stream = _Stream(tty=True)
    bar = cli._PullBar(stream, "f16")
    for step in _steps():
        bar(step)
    text = stream.getvalue()
    assert text.count("\r\033[K") == 20 and " 5% 5.0/100.0 MiB, 0.0 MiB/s, ETA ?" in text
    assert text.endswith("100% 100.0/100.0 MiB, 5.0 MiB/s, ETA 0:00\ntiny: verifying the download's checksums\n"
                         "tiny: converting to GGUF (f16)\n")

