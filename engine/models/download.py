"""Resumable, verified downloads of model files.

    for step in download(url, target, size=size, checksums={"sha256": hex}, stop=event):
        ...                       # step.done_bytes on disk so far; a lazy iterator the caller drives
    # target now exists (verified), unless `event` was set: then the partial stays for the next call

The file streams into a hidden partial, `.<target name>.part`, beside the target, so the final rename is atomic
and the target only ever appears verified. A partial left by a cut, a cancel or a crash is resumed with an HTTP
Range request (a server that ignores Range sends the whole file, which then starts again from byte 0); a
connection cut mid-file is resumed at once, as long as each attempt brought some bytes. A checksum mismatch
deletes the partial; every other failure keeps it for the next call. One process at a time writes a partial
(flock, where the OS has it).

Why urllib (standard library): one GET with a Range header is all a download needs, and urllib honours the
proxy settings of the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY: urllib.request.getproxies, read by the
ProxyHandler of each opener built) and follows Hugging Face's redirects to its CDN, keeping the Range header.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import logging
import os
import re
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .. import __version__
from ..errors import DownloadError

try:
    import fcntl
except ImportError:  # Windows: no flock, so nothing keeps two pulls of one model apart (nor renames an open file)
    fcntl = None

__all__ = ["Transfer", "TransferRate", "download", "fetch_small", "matches", "partial_path"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 18  # 256 KiB per read: ~10 progress steps a second at 20 Mbit/s, and a cancel is seen within one read
_HASH_CHUNK = 1 << 20  # bytes per read when verifying
# urllib applies the timeout to each socket operation (connect, every read), not to the whole download: a
# stalled connection becomes a cut after this long instead of hanging for ever.
_TIMEOUT_S = 30.0
# Resumes of one download in a row, each after a cut that brought bytes; beyond this the user is told.
_MAX_RESUMES = 5
_SMALL_LIMIT = 1 << 20  # the most a catalog.json may weigh (the built-in one is ~5 KiB)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")  # RFC 9110 section 14.4
_HEADERS = {"User-Agent": f"aural/{__version__}"}
_MIB = 2**20


@dataclass(frozen=True)
class Transfer:
    """How far a download is.

    Attributes:
        done_bytes: bytes of the file on disk.
        total_bytes: the whole file's bytes, or None while neither the catalog nor the server has said.
        verifying: the last byte is in and the checksums are being computed (seconds for a large model).
    """

    done_bytes: int
    total_bytes: int | None
    verifying: bool = False


class TransferRate:
    """Bytes per second of one download run, counted from the first step it sees: a resumed download is
    timed from where it resumed, not from byte 0 (the CLI's progress bar and the app's Models dialog)."""

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None  # (time.monotonic(), done_bytes) of the first step

    def update(self, done_bytes: int, now: float) -> float:
        """The rate after a step that has `done_bytes` on disk at `now`; 0.0 at the first step."""
        if self._first is None:
            self._first = (now, done_bytes)
        elapsed = now - self._first[0]
        return (done_bytes - self._first[1]) / elapsed if elapsed > 0 else 0.0


class _Cut(Exception):
    """The connection ended before the whole file arrived (the partial is resumable)."""


def partial_path(target: Path) -> Path:
    """Where the download of target collects: a hidden file beside it."""
    return target.with_name(f".{target.name}.part")


def download(url: str, target: Path, *, size: int | None, checksums: dict[str, str],
             stop: threading.Event | None = None, extra_space: int = 0) -> Iterator[Transfer]:
    """Stream url into target's partial, yielding its progress; verify the checksums; rename onto target.

    size: the file's bytes (None: the server's Content-Length is trusted). checksums: hashlib name (or
    "git-blob-sha1", hub.py) -> hex digest, at least one. stop: set it to cancel after the current read (the
    partial stays). extra_space: bytes the caller needs besides the file (a conversion), included in the
    free-space check made before any byte is fetched. Failures raise DownloadError with one line for the user.
    """
    partial = partial_path(target)
    _check_space(target.parent, size, _size_on_disk(partial), extra_space)
    with _locked(partial) as file:
        yield from _transfer(url, file, partial, size, stop)
        if stop is not None and stop.is_set():
            return
        yield Transfer(_file_size(file), _file_size(file), verifying=True)
        _verify(file, partial, url, checksums)
        # Renamed while open and locked (POSIX allows it), so a second pull cannot take the lock in between.
        os.replace(partial, target)


def fetch_small(url: str) -> bytes | None:
    """The body of a small file (a mirror's catalog.json), or None when the server has no such file."""
    response = _open(url, 0, missing_ok=True)
    if response is None:
        return None
    with response:
        data = _read(response, _SMALL_LIMIT + 1)
    if len(data) > _SMALL_LIMIT:
        raise DownloadError(f"{url} is larger than {_SMALL_LIMIT // _MIB} MiB; it is not a model catalog.")
    return data


def _size_on_disk(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _check_space(folder: Path, size: int | None, have: int, extra: int) -> None:
    if size is None:
        return
    need = max(size - have, 0) + extra
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        raise DownloadError(f"Cannot read the free space of {folder}: {exc.strerror or exc}.") from exc
    if free < need:
        raise DownloadError(f"Not enough free space in {folder}: this needs {need / _MIB:.1f} MiB and "
                            f"{free / _MIB:.1f} MiB are free.")


@contextmanager
def _locked(partial: Path) -> Iterator[BinaryIO]:
    """The partial, opened for appending (created if missing), locked; removed again if it stays empty."""
    try:
        file = open(partial, "a+b")  # closed in the finally below, which also removes an empty partial
    except OSError as exc:
        raise _disk_error(exc, partial) from exc
    try:
        if fcntl is not None:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DownloadError(f"Another process is downloading into {partial}; wait for it to finish.") from None
        yield file
    finally:
        file.close()
        if _size_on_disk(partial) == 0:
            partial.unlink(missing_ok=True)


def _transfer(url: str, file: BinaryIO, partial: Path, size: int | None,
              stop: threading.Event | None) -> Iterator[Transfer]:
    """Fill the partial, resuming after each cut that brought bytes (up to _MAX_RESUMES in a row)."""
    resumes = 0
    while True:
        have = _file_size(file)
        if size is not None and have > size:  # longer than the file: not a prefix of it
            _truncate(file, partial, 0)
            have = 0
        try:
            yield from _attempt(url, file, partial, have, size, stop)
            return
        except _Cut as cut:
            got = _file_size(file)
            if got == have or resumes == _MAX_RESUMES:
                raise DownloadError(
                    f"The download of {url} was cut off at {got / _MIB:.1f} MiB ({cut}); the bytes received are "
                    "kept and the next pull resumes from there.") from cut
            resumes += 1
            logger.warning("%s: cut at %.1f MiB (%s); resuming from there", url, got / _MIB, cut)


def _attempt(url: str, file: BinaryIO, partial: Path, have: int, size: int | None,
             stop: threading.Event | None) -> Iterator[Transfer]:
    """One GET from byte `have` on; raises _Cut when the connection ends early."""
    if size is not None and have == size:
        return  # complete already (a crash before the rename): the checksum decides
    response = _open(url, have)
    if response is None:  # 416: the partial holds the whole file already
        return
    with response:
        start, total = _range_of(response, have, url)
        if size is not None and total is not None and total != size:
            raise DownloadError(f"{url} is {total} bytes, but the catalog says {size}; not downloading it.")
        _truncate(file, partial, start)
        expected = size if size is not None else total
        done = start
        for chunk in _chunks(response, stop):
            _write(file, partial, chunk)
            done += len(chunk)
            if expected is not None and done > expected:
                raise DownloadError(f"{url} sent more than the {expected} bytes it should have; not installing it.")
            yield Transfer(done, expected)
    if stop is not None and stop.is_set():
        return
    if expected is not None and done < expected:
        raise _Cut(f"the connection closed {expected - done} bytes before the end")


def _open(url: str, have: int, *, missing_ok: bool = False) -> http.client.HTTPResponse | None:
    """The response to a GET from byte `have`; None for 416 (nothing left), or for a missing file if missing_ok."""
    headers = {**_HEADERS, "Range": f"bytes={have}-"} if have else _HEADERS
    try:
        # A new opener each time: its ProxyHandler reads the proxy variables when it is built, and urlopen's
        # shared one would keep those of the first request the process made.
        opener = urllib.request.build_opener()
        return opener.open(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        exc.close()
        if (exc.code == 416 and have) or (exc.code == 404 and missing_ok):
            return None
        raise DownloadError(f"Cannot download {url}: the server answered {exc.code} {exc.reason}.") from exc
    except urllib.error.URLError as exc:
        if missing_ok and isinstance(exc.reason, FileNotFoundError):  # a file:// mirror without the file
            return None
        host = urllib.parse.urlsplit(url).netloc or url
        reason = getattr(exc.reason, "strerror", None) or exc.reason
        raise DownloadError(f"Cannot reach {host} to download {url}: {reason} (check the network or the proxy "
                            "settings; AURAL_MODEL_MIRROR names another server).") from exc
    except (OSError, http.client.HTTPException) as exc:  # a timeout or a reset while reading the headers
        raise DownloadError(f"Cannot download {url}: {exc or type(exc).__name__}.") from exc


def _range_of(response: http.client.HTTPResponse, have: int, url: str) -> tuple[int, int | None]:
    """(first byte of the body, bytes of the whole file or None when not said)."""
    if response.status == 206:
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
        if match is None or int(match[1]) > have:
            raise DownloadError(f"{url}: the server sent an unusable partial response "
                                f"(Content-Range {response.headers.get('Content-Range')!r}).")
        return int(match[1]), None if match[3] == "*" else int(match[3])
    # 200, or a file:// URL (no status): the whole file, whatever Range asked for.
    length = response.headers.get("Content-Length", "")
    return 0, int(length) if length.isdigit() else None


def _chunks(response: http.client.HTTPResponse, stop: threading.Event | None) -> Iterator[bytes]:
    """The body in _CHUNK pieces, until it ends or stop is set."""
    while stop is None or not stop.is_set():
        chunk = _read(response, _CHUNK)
        if not chunk:
            return
        yield chunk


def _read(response: http.client.HTTPResponse, n: int) -> bytes:
    try:
        return response.read(n)
    except (OSError, http.client.HTTPException) as exc:  # reset, timeout, IncompleteRead
        raise _Cut(str(exc) or type(exc).__name__) from exc


def _file_size(file: BinaryIO) -> int:
    return os.fstat(file.fileno()).st_size


def _truncate(file: BinaryIO, partial: Path, length: int) -> None:
    try:
        file.truncate(length)
    except OSError as exc:
        raise _disk_error(exc, partial) from exc


def _write(file: BinaryIO, partial: Path, chunk: bytes) -> None:
    try:
        file.write(chunk)  # append mode: always at the end, which _truncate put at the resume offset
        file.flush()  # in the file, not only in Python's buffer, before it is counted: a killed process keeps it
    except OSError as exc:
        raise _disk_error(exc, partial) from exc


def _disk_error(exc: OSError, path: Path) -> DownloadError:
    if exc.errno == errno.ENOSPC:
        return DownloadError(f"The disk is full: cannot write {path}; the bytes received are kept, so free some "
                             "space and pull again to resume.")
    return DownloadError(f"Cannot write {path}: {exc.strerror or exc}.")


def matches(path: Path, size: int, checksums: dict[str, str]) -> bool:
    """Whether the file at path has that size and every one of those digests (a file kept from an earlier pull)."""
    if path.stat().st_size != size:
        return False
    with path.open("rb") as file:
        return all(digest.hexdigest() == checksums[algo] for algo, digest in _digests(file, checksums).items())


def _digests(file: BinaryIO, checksums: dict[str, str]) -> dict:
    """The file's digest for each algorithm checksums names, read once from its start."""
    digests = {algo: _new_digest(algo, _file_size(file)) for algo in checksums}
    file.seek(0)
    while chunk := file.read(_HASH_CHUNK):
        for digest in digests.values():
            digest.update(chunk)
    return digests


def _verify(file: BinaryIO, partial: Path, url: str, checksums: dict[str, str]) -> None:
    """Check the whole partial against every known digest; delete it on a mismatch."""
    for algo, digest in _digests(file, checksums).items():
        if digest.hexdigest() != checksums[algo]:
            partial.unlink(missing_ok=True)
            raise DownloadError(f"{url} does not match its {algo} (expected {checksums[algo]}, got "
                                f"{digest.hexdigest()}); the download was deleted and nothing was installed.")


def _new_digest(algo: str, size: int):
    """hashlib's algorithm of that name, or git's blob id ("git-blob-sha1": sha1 over "blob <size>\\0" and the
    bytes, what Hugging Face sends as the ETag of a file kept in git; hub.py)."""
    if algo != "git-blob-sha1":
        return hashlib.new(algo)
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % size)
    return digest
