#!/usr/bin/env bash
# `make package`: the wheel and sdist (dist/*.whl, dist/*.tar.gz) and the one-folder PyInstaller bundle
# (dist/aural/), all built in build/package-venv against a portable ggml:
#   GGML_NATIVE=OFF          no -march=native: the build machine's CPU is not assumed
#   GGML_BACKEND_DL=ON       backends are shared objects that Aural loads at run time (native/cpu.h)
#   GGML_CPU_ALL_VARIANTS=ON one libggml-cpu-<variant>.so per x86-64 level (sse42 ... avx512, amx);
#                            Aural scores them against the running CPU and loads the best that passes
#                            its probe (or AURAL_CPU_VARIANT)
#   GGML_LLAMAFILE=ON        tinyBLAS kernels for batched f16/q8_0 matrix products in every variant, as in
#                            the Makefile's build (bench/results/speed-ablation.md)
# Steps are stamped, so a second run rebuilds only Aural and the bundle.
#
# Environment: PYTHON (the interpreter the venv is made from, default python3; it must be built with
# --enable-shared, which PyInstaller needs), PACKAGE_VENV (default build/package-venv), JOBS (parallel
# compile jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${PACKAGE_VENV:-build/package-venv}
GGML_PYTHON="ggml-python==0.0.45"
GGML_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_LLAMAFILE=ON"
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2}
STAGE=${1:-all}   # all | venv (stop after the build venv)

log() { printf '\n== %s\n' "$*"; }

if [[ ! -x $VENV/bin/python ]]; then
    log "build venv $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q -c packaging/constraints.txt --upgrade pip
fi
PY=$VENV/bin/python
PIP=$VENV/bin/pip

# One stamp per ggml configuration (as the Makefile does for .venv).
GGML_STAMP=$VENV/.ggml-$(echo "$GGML_PYTHON $GGML_CMAKE_ARGS" | md5sum | cut -c1-8)
if [[ ! -f $GGML_STAMP ]]; then
    log "portable ggml: $GGML_PYTHON with $GGML_CMAKE_ARGS (compiles every CPU variant: many minutes)"
    rm -f "$VENV"/.ggml-*
    CMAKE_ARGS="$GGML_CMAKE_ARGS" nice -n 19 "$PIP" install -q --no-cache-dir --force-reinstall --no-deps \
        "$GGML_PYTHON"
    touch "$GGML_STAMP"
fi
[[ $STAGE == venv ]] && exit 0

log "build tools"
# typing_extensions: ggml-python's own dependency (it was installed with --no-deps above).
"$PIP" install -q -c packaging/constraints.txt "scikit-build-core>=0.11" "pybind11>=2.12" numpy "typing_extensions>=4.6.3" "build>=1.2" \
    "pyinstaller>=6.6,<7"

# The wheel and sdist: `python -m build` makes the sdist, then the wheel from the unpacked sdist, so the
# sdist is proven to build. No isolation: the build compiles against the ggml above instead of building
# ggml-python once more in a temporary environment (the module is linked by name and finds ggml-python's
# libraries through its RPATH, so the wheel works with any ggml-python 0.0.45 install).
log "wheel and sdist"
mkdir -p dist
rm -f dist/aural-*.whl dist/aural-*.tar.gz
nice -n 19 "$PY" -m build --no-isolation --outdir dist . > build/package-build.log 2>&1 \
    || { tail -40 build/package-build.log; exit 1; }
WHEEL=$(ls dist/aural-*.whl)
SDIST=$(ls dist/aural-*.tar.gz)
"$PY" packaging/check_dists.py "$WHEEL" "$SDIST"

log "install the wheel into $VENV"
"$PIP" install -q -c packaging/constraints.txt "$WHEEL[gui,live]"
"$PIP" install -q --force-reinstall --no-deps "$WHEEL"  # the same version number: replace the files

MODELS=build/package/models
if [[ ! -f $MODELS/tiny.en-f16.gguf ]]; then
    log "convert the default model (tiny.en, f16) for the bundle"
    mkdir -p "$MODELS"
    # Without -o the named model is converted from its installed package into the cache given here.
    converted=$(AURAL_CACHE_DIR=build/package/cache "$VENV/bin/aural" models convert tiny.en --type f16)
    cp "$converted" "$MODELS/tiny.en-f16.gguf"
    rm -rf build/package/cache
fi

log "PyInstaller bundle dist/aural"
rm -rf dist/aural
AURAL_BUNDLE_MODELS=$MODELS nice -n 19 "$VENV/bin/pyinstaller" --noconfirm --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/aural.spec

log "smoke test"
dist/aural/aural --version
dist/aural/aural doctor
du -sh dist/aural "$WHEEL" "$SDIST"
