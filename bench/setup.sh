#!/usr/bin/env bash
# Creates bench/.venv with the peer engines (faster-whisper, pywhispercpp) and the scoring tools.
# Aural is not installed here: bench/run.py runs Aural from the project venv and the peers from this one,
# each measurement in its own subprocess. Usage: bench/setup.sh [python3]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-python3}"
venv="$here/.venv"
start=$(date +%s)
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q -c "$here/constraints.txt" --upgrade pip
fi
# constraints.txt pins every package of a working bench venv (tools/constraints.sh bench/.venv writes it).
"$venv/bin/pip" install -q -c "$here/constraints.txt" -r "$here/requirements.txt"
"$venv/bin/python" - <<'PY'
import ctranslate2, faster_whisper, jiwer, matplotlib, pywhispercpp.model, whisper_normalizer
print("bench venv ok: faster-whisper", faster_whisper.__version__, "ctranslate2", ctranslate2.__version__)
PY
# whisper.cpp built from source for this CPU (GGML_NATIVE=ON), beside the generic prebuilt wheel: the
# pywhispercpp sdist vendors whisper.cpp's sources; its setup.py passes every environment variable to CMake
# as -D. Installed into its own folder, which the "whisper.cpp native" worker puts first on PYTHONPATH.
native="$here/.cache/whispercpp-native"
if [[ ! -f "$native/.ok" ]]; then
    rm -rf "$native"
    version=$(sed -n 's/^pywhispercpp==//p' "$here/constraints.txt")
    GGML_NATIVE=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/pip" install -q --no-deps --no-binary pywhispercpp \
        --target "$native" "pywhispercpp==$version"
    touch "$native/.ok"
fi
touch "$venv/.ok"
echo "bench/setup.sh: done in $(( $(date +%s) - start )) s"
