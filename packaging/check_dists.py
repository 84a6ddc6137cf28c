"""Check that the wheel and the sdist of `make package` hold what an install needs.

    python packaging/check_dists.py dist/aural-*.whl dist/aural-*.tar.gz

The sdist must carry the sources (native/, engine/, app/, resources/ and the build files); the wheel the
compiled module, both Python packages, the resources the app loads (icon PNGs, stylesheet) and the model catalog.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from fnmatch import fnmatch

WHEEL_NEEDS = [
    "aural/_native*.so", "aural/engine/__init__.py", "aural/engine/cli.py", "aural/app/__init__.py",
    "aural/app/main.py", "aural/resources/style.qss", "aural/resources/icons/aural-256.png",
    "aural/resources/aural.desktop", "aural/engine/models/catalog.json",
]
SDIST_NEEDS = [
    "pyproject.toml", "CMakeLists.txt", "native/CMakeLists.txt", "native/backend.cpp",
    "native/bindings/module.cpp", "engine/cli.py", "engine/models/catalog.json", "app/main.py", "resources/style.qss",
    "resources/icons/aural-256.png", "resources/aural.desktop", "resources/io.github.aural.Aural.metainfo.xml",
]


def missing(names: list[str], patterns: list[str]) -> list[str]:
    return [p for p in patterns if not any(fnmatch(n, p) for n in names)]


def wheel_names(path: str) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return zf.namelist()


def sdist_names(path: str) -> list[str]:
    with tarfile.open(path) as tf:
        # Members are <name>-<version>/<path>: drop the top folder.
        return [m.name.partition("/")[2] for m in tf.getmembers()]


def main(wheel: str, sdist: str) -> int:
    problems = [f"{wheel} lacks {p}" for p in missing(wheel_names(wheel), WHEEL_NEEDS)]
    problems += [f"{sdist} lacks {p}" for p in missing(sdist_names(sdist), SDIST_NEEDS)]
    for line in problems:
        print(f"check_dists: {line}", file=sys.stderr)
    if not problems:
        print(f"check_dists: {wheel} and {sdist} hold what they need")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
