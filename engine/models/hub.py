"""What a Hugging Face repository's files are at one commit: their URLs, sizes and the digests to verify.

    commit, files = hub_files("Qwen/Qwen3-ASR-0.6B", "main", ("config.json", "model.safetensors"))
    for f in files:                # f.url names the commit, so every file comes from the same one
        download(f.url, folder / f.name, size=f.size, checksums=f.checksums)

For checkpoints whose digests no catalog can pin (Qwen/Qwen3-ASR-0.6B: its safetensors were never hashed
where Aural was written), the hub's own record of each file is what a download is checked against, as
huggingface_hub does it (file_download.py get_hf_file_metadata): a HEAD request on `resolve/<revision>/<file>`
that does not follow the redirect to the CDN. Its `X-Repo-Commit` header names the commit the revision points
at; a file kept in Git LFS answers with a redirect whose `X-Linked-Etag` is the LFS object id (the file's
sha256) and `X-Linked-Size` its bytes; a file kept in git itself answers 200 with an `ETag` that is its git
blob id (sha1 over "blob <bytes>\\0" and the bytes, as `git hash-object` makes it) and its Content-Length.

What this guards against: a cut, a truncated or damaged download, a CDN serving another object, and files of
two commits mixed when the repository changes mid-pull (each file is fetched at the commit the first HEAD
named). What it cannot: a hub that lies about its own files, since the digests come from the same server.

The endpoint is HF_ENDPOINT (huggingface_hub's variable: hf-mirror.com and private hubs answer the same way),
https://huggingface.co otherwise. Nothing here runs but at a user's `aural models pull` or Download.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message

from .. import __version__
from ..errors import DownloadError

__all__ = ["ENDPOINT_ENV", "GIT_BLOB_SHA1", "HubFile", "endpoint", "hub_files"]

ENDPOINT_ENV = "HF_ENDPOINT"
_DEFAULT_ENDPOINT = "https://huggingface.co"
# download.py's name for git's blob id (hashlib has none): sha1 over "blob <bytes>\0" then the bytes.
GIT_BLOB_SHA1 = "git-blob-sha1"
_TIMEOUT_S = 30.0
_MAX_RELATIVE_REDIRECTS = 5  # a renamed repository answers with a relative redirect to its new name
_COMMIT = re.compile(r"[0-9a-f]{40}")
_DIGESTS = {64: "sha256", 40: GIT_BLOB_SHA1}  # hex length of an etag -> what it is


@dataclass(frozen=True)
class HubFile:
    """One file of a repository at a commit.

    Attributes:
        name: its path in the repository (and the file name it is saved as).
        url: `<endpoint>/<repo>/resolve/<commit>/<name>`: fixed to the commit, so a resumed download gets the
            same bytes.
        size: its bytes.
        checksums: download.py's {algorithm: hex digest}: sha256 for an LFS file, git-blob-sha1 otherwise.
    """

    name: str
    url: str
    size: int
    checksums: dict[str, str]


def endpoint() -> str:
    value = os.environ.get(ENDPOINT_ENV, "").strip() or _DEFAULT_ENDPOINT
    if not value.startswith(("http://", "https://")):
        raise DownloadError(f"{ENDPOINT_ENV} must be an http:// or https:// URL, not '{value}'.")
    return value.rstrip("/")


def hub_files(repo: str, revision: str, names: tuple[str, ...]) -> tuple[str, list[HubFile]]:
    """The commit `revision` names in `repo` and each of `names` at that commit (one HEAD request each,
    the first at `revision` itself). DownloadError, one line, when the hub cannot be reached or a file is
    missing or comes without a digest."""
    base = f"{endpoint()}/{repo}/resolve"
    first = _metadata(f"{base}/{urllib.parse.quote(revision, safe='')}/{names[0]}")
    commit = first.get("X-Repo-Commit", "")
    if not _COMMIT.fullmatch(commit):
        raise DownloadError(f"{base}/{revision}/{names[0]} did not name its commit (X-Repo-Commit): the server "
                            f"at {endpoint()} does not answer as a Hugging Face hub.")
    files = [_file(f"{base}/{commit}/{name}", name, _metadata(f"{base}/{commit}/{name}") if k else first)
             for k, name in enumerate(names)]
    return commit, files


def _file(url: str, name: str, headers: Message) -> HubFile:
    etag = (headers.get("X-Linked-Etag") or headers.get("ETag") or "").removeprefix("W/").strip('"')
    size = headers.get("X-Linked-Size") or headers.get("Content-Length") or ""
    algorithm = _DIGESTS.get(len(etag)) if re.fullmatch(r"[0-9a-f]+", etag) else None
    if algorithm is None or not size.isdigit():
        raise DownloadError(f"{url} came without a digest and size Aural can check (ETag {etag!r}, size "
                            f"{size!r}), so it is not downloaded.")
    return HubFile(name=name, url=url, size=int(size), checksums={algorithm: etag})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Lets a redirect come back as an HTTPError: its headers carry the LFS file's digest and size."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
        return None


def _metadata(url: str) -> Message:
    """The headers of a HEAD on url, following relative redirects only (huggingface_hub's rule)."""
    opener = urllib.request.build_opener(_NoRedirect)  # proxies from the environment, as download.py's
    for _ in range(_MAX_RELATIVE_REDIRECTS + 1):
        request = urllib.request.Request(url, method="HEAD", headers={
            "User-Agent": f"aural/{__version__}", "Accept-Encoding": "identity"})
        try:
            with opener.open(request, timeout=_TIMEOUT_S) as response:
                return response.headers
        except urllib.error.HTTPError as exc:
            location = exc.headers.get("Location", "") if 300 <= exc.code < 400 else ""
            if location and urllib.parse.urlsplit(location).netloc == "":
                url = urllib.parse.urljoin(url, location)
                continue
            if location:  # an LFS file: its digest and size are on this redirect to the CDN
                return exc.headers
            raise DownloadError(f"{url} answered HTTP {exc.code} {exc.reason}"
                                + (": no such file or repository." if exc.code == 404 else ".")) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DownloadError(f"Cannot reach {url}: {reason}.") from exc
    raise DownloadError(f"{url} redirected more than {_MAX_RELATIVE_REDIRECTS} times.")
