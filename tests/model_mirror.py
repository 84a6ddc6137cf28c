"""A model mirror on loopback for the download tests (and tools/models_cli_transcript.py): a real HTTP server
(the standard library's http.server, in a thread) that serves a folder with `Range: bytes=N-` support, records
every request, and can misbehave on purpose: drop the connection after some bytes the first time a file is
asked for, or ignore Range as some servers do. Also a forward proxy that only records CONNECT requests."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from aural.engine.models.catalog import MIRROR_ENV

if TYPE_CHECKING:
    import pytest

_RANGE = re.compile(r"bytes=(\d+)-")
PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
_SLOW_PIECE, _SLOW_PAUSE_S = 1 << 16, 0.01


@dataclass
class MirrorState:
    """What the server serves and how.

    Attributes:
        root: the folder served at /.
        cut_once: file name -> bytes after which its first response is cut (the entry is then dropped).
        ignore_range: answer every GET with the whole file (200), as a server without Range support does.
        slow: send bodies at about 6 MiB/s (64 KiB every 10 ms), so a client can be interrupted mid-file.
        requests: (path, Range header or None) of every GET, in order.
    """

    root: Path
    cut_once: dict[str, int] = field(default_factory=dict)
    ignore_range: bool = False
    slow: bool = False
    requests: list[tuple[str, str | None]] = field(default_factory=list)


def _handler(state: MirrorState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            name = self.path.lstrip("/")
            state.requests.append((self.path, self.headers.get("Range")))
            path = state.root / name
            if "/" in name or not path.is_file():
                self.send_error(404)
                return
            self._serve(name, path.read_bytes())

        def _serve(self, name: str, data: bytes) -> None:
            """data from the Range's start (206) or whole (200), cut as state.cut_once says."""
            start = self._start(len(data))
            if start is None:
                return
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            self._send(name, data[start:])

        def _start(self, size: int) -> int | None:
            match = _RANGE.fullmatch(self.headers.get("Range", ""))
            if match is None or state.ignore_range:
                return 0
            if int(match[1]) >= size:
                self.send_error(416)
                return None
            return int(match[1])

        def _send(self, name: str, body: bytes) -> None:
            cut = state.cut_once.pop(name, None)
            body = body if cut is None else body[:cut]
            step = _SLOW_PIECE if state.slow else len(body) or 1
            try:
                for at in range(0, len(body), step):
                    self.wfile.write(body[at:at + step])
                    if state.slow:
                        time.sleep(_SLOW_PAUSE_S)
            except (BrokenPipeError, ConnectionResetError):  # the client went away (an interrupted test)
                return
            if cut is not None:  # the client sees the connection end mid-body
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, *args) -> None:  # keep the test output clean
            pass

    return Handler


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Run handler on a free loopback port in a thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def mirror(root: Path) -> Iterator[tuple[str, MirrorState]]:
    """A mirror serving root; yields (base URL, its state)."""
    state = MirrorState(root)
    with serve(_handler(state)) as url:
        yield url, state


@contextmanager
def connect_recorder() -> Iterator[tuple[str, list[str]]]:
    """A forward proxy that records each CONNECT target and refuses it (403); yields (URL, targets)."""
    targets: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def do_CONNECT(self) -> None:  # noqa: N802
            targets.append(self.path)
            self.send_error(403)

        def log_message(self, *args) -> None:
            pass

    with serve(Proxy) as url:
        yield url, targets


def use_mirror(monkeypatch: pytest.MonkeyPatch, url: str, cache: Path) -> None:
    """Models come from the mirror at url, with no proxy in between, into the cache folder `cache`."""
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv(MIRROR_ENV, url)
    monkeypatch.setenv("AURAL_CACHE_DIR", str(cache))


def reset(state: MirrorState) -> None:
    """Serve normally again, with an empty request log (a module's mirror is shared by its tests)."""
    state.cut_once.clear()
    state.requests.clear()
    state.ignore_range = state.slow = False


def catalog_entry(name: str, path: Path, **overrides) -> dict:
    """A catalog.json entry (engine/catalog.json's schema) for the file at path, with its real size and digests."""
    data = path.read_bytes()
    entry = {"name": name, "file": path.name, "languages": 1, "parameters": 39_000_000, "size": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "sha1": hashlib.sha1(data).hexdigest(), "license": "MIT"}
    return {**entry, **overrides}


def write_catalog(root: Path, entries: list[dict]) -> Path:
    path = root / "catalog.json"
    path.write_text(json.dumps({"schema": 1, "models": entries}, indent=1), encoding="utf-8")
    return path


# -- a Hugging Face hub ------------------------------------------------------------------------------------------


def git_blob_sha1(data: bytes) -> str:
    """git hash-object: what the hub sends as the ETag of a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubState:
    """A hub serving one repository at one commit.

    Attributes:
        repo: "owner/name".
        root: the folder holding its files.
        commit: the 40-hex commit "main" names.
        lfs: files kept in LFS: HEAD and GET redirect to /cdn/<sha256> with X-Linked-Etag and X-Linked-Size.
        lie: file name -> the etag sent for it instead of its own.
        renamed_from: an earlier name of the repository, answered with a relative redirect to its name now,
            as the hub answers for a renamed repository.
        cut_once: as MirrorState's, by file name, for GETs of files kept in git and of /cdn/ objects.
        requests: (method, path, Range header or None) of every request, in order.
    """

    repo: str
    root: Path
    commit: str
    lfs: tuple[str, ...] = ()
    lie: dict[str, str] = field(default_factory=dict)
    renamed_from: str | None = None
    cut_once: dict[str, int] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)


def _hub_handler(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(_handler(MirrorState(state.root, cut_once=state.cut_once))):
        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            state.requests.append((self.command, self.path, self.headers.get("Range")))
            if state.renamed_from and self.path.startswith(f"/{state.renamed_from}/"):
                self.send_response(307)
                self.send_header("Location", self.path.replace(state.renamed_from, state.repo, 1))
                self.send_header("Content-Length", "0")
                return self.end_headers()
            prefix = f"/{state.repo}/resolve/"
            if self.path.startswith("/cdn/") and body:
                lfs = {hashlib.sha256((state.root / n).read_bytes()).hexdigest(): n for n in state.lfs}
                name = lfs.get(self.path.removeprefix("/cdn/"))
                return self._serve(name, (state.root / name).read_bytes()) if name else self.send_error(404)
            revision, _, name = self.path.removeprefix(prefix).partition("/")
            path = state.root / name
            if not self.path.startswith(prefix) or revision not in ("main", state.commit) or not path.is_file():
                return self.send_error(404)
            data = path.read_bytes()
            if name in state.lfs:
                self.send_response(302)
                self.send_header("Location", f"http://{self.headers['Host']}/cdn/{hashlib.sha256(data).hexdigest()}")
                self.send_header("X-Linked-Etag", f'"{state.lie.get(name, hashlib.sha256(data).hexdigest())}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("X-Repo-Commit", state.commit)
                self.send_header("Content-Length", "0")
                return self.end_headers()
            if body:
                return self._serve(name, data)
            self.send_response(200)
            self.send_header("ETag", f'"{state.lie.get(name, git_blob_sha1(data))}"')
            self.send_header("X-Repo-Commit", state.commit)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

    return Handler


@contextmanager
def hub(state: HubState) -> Iterator[str]:
    """A hub serving state's repository; yields its base URL (for HF_ENDPOINT)."""
    with serve(_hub_handler(state)) as url:
        yield url
