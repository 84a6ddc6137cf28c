"""The catalog of models Aural can download: whisper.cpp's ggml files of every size, with their sizes, checksums
and licence, and models published as a Hugging Face repository's files (Qwen3-ASR: `HubEntry`, checked against
the hub's own digests, hub.py). The data is catalog.json beside this file; its "sources" field cites where each
number comes from.

    entries = load_catalog()                 # the built-in catalog, read from the package (no network)
    entry = find_entry("small", remote=True) # with AURAL_MODEL_MIRROR set, the mirror's catalog.json first

Mirrors: AURAL_MODEL_MIRROR=URL (http://, https:// or file://) replaces the base URL every file is fetched
from. A mirror may publish URL/catalog.json in the same schema; it is fetched only when the user acts (`aural
models pull`, `aural models list --available`, never at start-up), and its entries replace the built-in ones of
the same name and add others. Names and file names become paths in the cache, so a catalog is validated
before use: a bad entry is a one-line error naming the catalog, the entry and the field.

Why JSON: a mirror publishes the same file, and it is data rather than code, so it can be checked.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import DownloadError, ModelError

__all__ = ["MIRROR_ENV", "CatalogEntry", "HubEntry", "base_url", "find_entry", "is_safe_name", "load_catalog",
           "parse_catalog"]

MIRROR_ENV = "AURAL_MODEL_MIRROR"
SCHEMA = 1
_BUILTIN = Path(__file__).resolve().with_name("catalog.json")
_MIRROR_CATALOG = "catalog.json"
_SCHEMES = ("http://", "https://", "file://")
# A name or file name becomes a folder or file in the cache: letters, digits, '.', '_' and '-', starting with a
# letter or digit (so no '..', no separators, no hidden files).
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HEX = {"sha256": re.compile(r"[0-9a-f]{64}"), "sha1": re.compile(r"[0-9a-f]{40}")}


@dataclass(frozen=True)
class CatalogEntry:
    """One downloadable model.

    Attributes:
        name: what `aural models pull NAME` and `-m NAME` take (tiny ... large-v3-turbo).
        file: the file's name at the base URL (ggml-<name>.bin).
        url: where it is downloaded from (base URL / file).
        size: bytes, or None where the catalog does not say (the server's Content-Length is then trusted).
        sha256: hex digest, or None.
        sha1: hex digest (whisper.cpp's README publishes SHA-1), or None; at least one digest is known.
        languages: how many languages it transcribes (1: English only), or None.
        parameters: number of weights, or None.
        license: SPDX identifier of the weights' licence, or None.
    """

    name: str
    file: str
    url: str
    size: int | None
    sha256: str | None
    sha1: str | None
    languages: int | None
    parameters: int | None
    license: str | None

    @property
    def checksums(self) -> dict[str, str]:
        """The known digests by hashlib name: what a download is verified against."""
        return {algo: value for algo, value in (("sha256", self.sha256), ("sha1", self.sha1)) if value}


@dataclass(frozen=True)
class HubEntry:
    """One model whose files are a Hugging Face repository's, converted to GGUF once downloaded.

    Attributes:
        name: what `aural models pull NAME` and `-m NAME` take (qwen3-asr-0.6b).
        repo: the repository ("Qwen/Qwen3-ASR-0.6B").
        revision: the branch, tag or commit fetched; the pull fixes every file to the commit it names then.
        files: the repository's files the converter reads.
        architecture: the GGUF architecture they convert to ("qwen3-asr").
        size: None: the hub says each file's size when the pull starts.
        languages, parameters, license: as CatalogEntry's.
    """

    name: str
    repo: str
    revision: str
    files: tuple[str, ...]
    architecture: str
    languages: int | None
    parameters: int | None
    license: str | None
    size: None = None


def is_safe_name(name: str) -> bool:
    """Whether name can be a file or folder name in the cache as it is (no separator, no '..', not hidden)."""
    return bool(_SAFE_NAME.fullmatch(name)) and ".." not in name


def base_url() -> str:
    """The URL files are fetched from: AURAL_MODEL_MIRROR, else the built-in catalog's (Hugging Face)."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return _builtin_data()["base_url"]
    if not mirror.startswith(_SCHEMES):
        raise ModelError(f"{MIRROR_ENV} must be an http://, https:// or file:// URL, not '{mirror}'.")
    return mirror.rstrip("/")


def load_catalog(*, remote: bool = False) -> dict[str, CatalogEntry | HubEntry]:
    """Every entry by name, in catalog order. remote=True (a user's action only) also reads the mirror's
    catalog.json when AURAL_MODEL_MIRROR is set; without a mirror nothing is fetched either way."""
    base = base_url()
    entries = parse_catalog(_builtin_data(), base, origin=str(_BUILTIN))
    if remote and os.environ.get(MIRROR_ENV, "").strip():
        entries.update(_mirror_entries(base))
    return entries


def find_entry(name: str, *, remote: bool = False) -> CatalogEntry | HubEntry:
    """The entry called name; ModelError listing the names otherwise."""
    entries = load_catalog(remote=remote)
    if name not in entries:
        raise ModelError(f"'{name}' is not in the model catalog; available: {', '.join(entries)}.")
    return entries[name]


def parse_catalog(data: Any, base: str, *, origin: str) -> dict[str, CatalogEntry | HubEntry]:
    """Validate a catalog document (the schema of the built-in catalog.json) and make its entries, files at base;
    its optional 'hub_models' come after its 'models'."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("models"), list):
        raise ModelError(f"{origin} is not an Aural model catalog (schema {SCHEMA} with a 'models' list).")
    if not isinstance(data.get("hub_models", []), list):
        raise ModelError(f"{origin}: 'hub_models' must be a list.")
    entries = [*(_entry(item, base, origin) for item in data["models"]),
               *(_hub_entry(item, origin) for item in data.get("hub_models", []))]
    return {entry.name: entry for entry in entries}


@cache
def _builtin_data() -> dict[str, Any]:
    return json.loads(_BUILTIN.read_text(encoding="utf-8"))


def _mirror_entries(base: str) -> dict[str, CatalogEntry]:
    from .download import fetch_small

    url = f"{base}/{_MIRROR_CATALOG}"
    raw = fetch_small(url)
    if raw is None:  # the mirror only hosts files: the built-in entries, at the mirror's URL
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise DownloadError(f"The mirror's {url} is not valid JSON ({exc}).") from exc
    return parse_catalog(data, base, origin=url)


def _entry(item: Any, base: str, origin: str) -> CatalogEntry:
    if not isinstance(item, dict):
        raise ModelError(f"{origin}: every item of 'models' must be an object.")
    name = _safe(item, "name", origin)
    where = f"{origin}, model '{name}'"
    fields = {
        "file": _safe(item, "file", where),
        "size": _count(item, "size", where),
        "sha256": _digest(item, "sha256", where),
        "sha1": _digest(item, "sha1", where),
        "languages": _count(item, "languages", where),
        "parameters": _count(item, "parameters", where),
        "license": _text(item, "license", where),
    }
    if not fields["sha256"] and not fields["sha1"]:
        raise ModelError(f"{where} has neither sha256 nor sha1; Aural installs only files it can verify.")
    return CatalogEntry(name=name, url=f"{base}/{fields['file']}", **fields)


_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_ARCHITECTURES = ("qwen3-asr",)  # what the converter makes of a repository (models/qwen3_asr.py)


def _hub_entry(item: Any, origin: str) -> HubEntry:
    if not isinstance(item, dict):
        raise ModelError(f"{origin}: every item of 'hub_models' must be an object.")
    name = _safe(item, "name", origin)
    where = f"{origin}, model '{name}'"
    repo, files = item.get("repo"), item.get("files")
    if not isinstance(repo, str) or not _REPO.fullmatch(repo) or ".." in repo:
        raise ModelError(f"{where}: 'repo' must be 'owner/name' (got {repo!r}).")
    if not isinstance(files, list) or not files:
        raise ModelError(f"{where}: 'files' must be a list of file names.")
    if item.get("architecture") not in _ARCHITECTURES:
        raise ModelError(f"{where}: 'architecture' must be one of {', '.join(_ARCHITECTURES)} "
                         f"(got {item.get('architecture')!r}).")
    return HubEntry(name=name, repo=repo, revision=_safe(item, "revision", where),
                    files=tuple(_safe({"file": f}, "file", where) for f in files),
                    architecture=item["architecture"], languages=_count(item, "languages", where),
                    parameters=_count(item, "parameters", where), license=_text(item, "license", where))


def _safe(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not is_safe_name(value):
        raise ModelError(f"{where}: '{key}' must be letters, digits, '.', '_' or '-' (got {value!r}).")
    return value


def _count(item: dict[str, Any], key: str, where: str) -> int | None:
    value = item.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ModelError(f"{where}: '{key}' must be a positive whole number or null (got {value!r}).")
    return value


def _digest(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and (not isinstance(value, str) or not _HEX[key].fullmatch(value)):
        raise ModelError(f"{where}: '{key}' must be a lower-case hex {key} digest or null (got {value!r}).")
    return value


def _text(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise ModelError(f"{where}: '{key}' must be a string or null (got {value!r}).")
    return value
