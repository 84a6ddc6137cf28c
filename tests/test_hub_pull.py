"""`aural models pull qwen3-asr-0.6b`: the catalog's Hugging Face entry fetched from a hub on loopback
(tests/model_mirror.py `hub`, named by HF_ENDPOINT) that answers as huggingface.co does: X-Repo-Commit, a
redirect to a CDN with X-Linked-Etag (sha256) and X-Linked-Size for the LFS weights, the git blob id as the
ETag of the small files. It serves a random checkpoint in the official layout (test_qwen3_asr.make_checkpoint).

Every file comes from the commit the first answer names and is checked against the hub's digest; a file
that does not match, or a server that is not a hub, is one error line and leaves nothing installed; a
cancelled pull resumes without fetching again what it has; the pulled name converts and transcribes."""

from __future__ import annotations

import hashlib
import os
import threading

import gguf
import numpy as np
import pytest
from conftest import assert_one_error_line, run_cli
from model_mirror import HubState, hub, mirror, use_mirror
from test_qwen3_asr import make_checkpoint

from aural.engine.errors import DownloadError
from aural.engine.models.catalog import MIRROR_ENV, find_entry
from aural.engine.models.download import download
from aural.engine.models.hub import ENDPOINT_ENV, hub_files
from aural.engine.models.importers import convert_model
from aural.engine.models.store import cache_dir, catalog_models, pull, resolve_model

NAME = "qwen3-asr-0.6b"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub") / "Qwen3-ASR-0.6B"
    make_checkpoint(folder)
    return folder


@pytest.fixture
def served(checkpoint, tmp_path, monkeypatch):
    """The hub serving the catalog entry's repository, HF_ENDPOINT naming it, a clean cache; yields its state."""
    entry = find_entry(NAME)
    state = HubState(entry.repo, checkpoint, COMMIT, lfs=("model.safetensors",))
    with hub(state) as url:
        use_mirror(monkeypatch, url, tmp_path / "cache")  # no proxy, a clean cache...
        monkeypatch.delenv(MIRROR_ENV)  # ...and the built-in catalog
        monkeypatch.setenv(ENDPOINT_ENV, url)
        yield state


def tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data).copy() for t in gguf.GGUFReader(path).tensors}


def test_pull_fetches_every_file_at_one_commit_and_converts(served, checkpoint, tmp_path):
    steps = list(pull(NAME, wtype="f16"))
    assert steps[-1].stage == "done"
    total = sum((checkpoint / f).stat().st_size for f in find_entry(NAME).files)
    assert steps[-2].stage == "convert" and steps[-2].total_bytes == total
    assert all(s.total_bytes == total for s in steps if s.stage == "download")
    # The first HEAD asks for the revision; every other request names the commit it answered with.
    heads = [path for method, path, _ in served.requests if method == "HEAD"]
    assert heads[0].endswith("/resolve/main/config.json")
    assert all(f"/resolve/{COMMIT}/" in path for path in heads[1:])
    gets = [path for method, path, _ in served.requests if method == "GET"]
    assert len(gets) == 8 and all(f"/resolve/{COMMIT}/" in path for path in gets[:7])
    assert gets[7].startswith("/cdn/")  # the weights' GET follows the redirect to the CDN
    source = steps[-1].path.parent / "source"
    assert (source / "commit.txt").read_text() == f"{COMMIT}\n"
    # The pulled GGUF holds the checkpoint's weights, as converting the folder directly gives them.
    direct = tensors(convert_model(checkpoint, tmp_path / "direct.gguf", wtype="f16"))
    pulled = tensors(steps[-1].path)
    assert direct.keys() == pulled.keys()
    assert all(np.array_equal(direct[k], pulled[k]) for k in direct)
    assert resolve_model(NAME) == steps[-1].path
    (row,) = [r for r in catalog_models() if r.name == NAME]
    assert row.downloaded and [c.wtype for c in row.cached] == ["f16"] and row.partial_bytes == 0


@pytest.mark.parametrize("file, algorithm", [("config.json", "git-blob-sha1"), ("model.safetensors", "sha256")])
def test_a_file_that_is_not_what_the_hub_says_is_refused(served, file, algorithm):
    served.lie[file] = "0" * (40 if algorithm == "git-blob-sha1" else 64)
    with pytest.raises(DownloadError, match=f"does not match its {algorithm}"):
        list(pull(NAME))
    folder = cache_dir() / "pulled" / NAME
    assert not (folder / "source" / "commit.txt").exists()
    assert not list(folder.glob("*.gguf"))
    assert not (folder / "source" / file).exists()  # the mismatch was deleted; the files before it stay


def test_a_cancelled_pull_resumes_without_fetching_what_it_has(served, checkpoint):
    small = sum((checkpoint / f).stat().st_size for f in find_entry(NAME).files[:-1])
    stop = threading.Event()
    served.cut_once["model.safetensors"] = 4096  # the weights' first answer ends early...
    for step in pull(NAME, stop=stop):
        if step.stage == "download" and step.done_bytes > small:
            stop.set()  # ...and the user cancels once some of them are in
    assert step.stage == "cancelled" and small < step.done_bytes < step.total_bytes
    served.requests.clear()
    steps = list(pull(NAME))
    assert steps[-1].stage == "done"
    gets = [(path, rng) for method, path, rng in served.requests if method == "GET"]
    # Only the weights again (their resolve URL, then the CDN it redirects to), from where the cut left them.
    assert [path.rsplit("/", 1)[-1] for path, _ in gets][0] == "model.safetensors" and gets[1][0].startswith("/cdn/")
    assert len(gets) == 2 and all(rng == "bytes=4096-" for _, rng in gets)


def test_a_renamed_repository_is_followed_to_its_name_now(served, checkpoint, tmp_path):
    served.renamed_from = "Qwen/Qwen3-ASR-0.6B-old"
    commit, files = hub_files(served.renamed_from, "main", ("config.json", "model.safetensors"))
    assert commit == COMMIT and [f.size for f in files] == [(checkpoint / f.name).stat().st_size for f in files]
    assert files[1].checksums == {"sha256": hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()}
    for f in files:  # the GET follows the same redirect
        list(download(f.url, tmp_path / f.name, size=f.size, checksums=f.checksums))
        assert (tmp_path / f.name).read_bytes() == (checkpoint / f.name).read_bytes()


def test_a_server_that_is_not_a_hub_is_one_error_line(served, tmp_path, monkeypatch):
    served.commit = "v1.0"  # a header of that name, but no commit in it
    with pytest.raises(DownloadError, match="did not name its commit .* does not answer as a Hugging Face hub"):
        list(pull(NAME))
    with mirror(tmp_path) as (url, _state):  # a plain file server: no HEAD
        monkeypatch.setenv(ENDPOINT_ENV, url)
        with pytest.raises(DownloadError, match="answered HTTP 501"):
            list(pull(NAME))
    monkeypatch.setenv(ENDPOINT_ENV, "ftp://hub.example")
    with pytest.raises(DownloadError, match="must be an http:// or https:// URL"):
        list(pull(NAME))
    assert not (cache_dir() / "pulled" / NAME).exists()


def test_cli_lists_pulls_and_transcribes_the_hub_model(served, jfk_wav, monkeypatch):
    env = dict(os.environ)
    listed = run_cli(env, "models", "list", "--available")
    assert listed.returncode == 0, listed.stderr
    table, footer = listed.stdout.split("\n\n")
    (line,) = [line for line in table.splitlines() if line.startswith(NAME)]
    assert "30" in line and "Apache-2.0" in line
    assert f"{NAME} (Qwen/Qwen3-ASR-0.6B): the repository's files from {os.environ[ENDPOINT_ENV]}" in footer
    pulled = run_cli(env, "models", "pull", NAME, "--type", "q8_0")
    assert pulled.returncode == 0, pulled.stderr
    installed = run_cli(env, "models", "list")
    (line,) = [line for line in installed.stdout.splitlines() if line.startswith(NAME)]
    assert "q8_0" in line
    # The CLI runs a GGUF by its architecture (Whisper's loader refuses this one), here the random weights'.
    done = run_cli(env, "transcribe", jfk_wav, "-m", NAME)
    assert done.returncode == 0 and "11.0 s audio" in done.stderr, done.stderr
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:9")  # nothing listens: resolving never asks the hub
    again = run_cli(dict(os.environ), "transcribe", jfk_wav, "-m", NAME)
    assert again.returncode == 0, again.stderr
    gone = run_cli(env, "models", "pull", "qwen3-asr-1.7b")
    assert_one_error_line(gone, "not in the model catalog")
