#!/usr/bin/env bash
# `make test-gpu` (see the Makefile): on a machine with an NVIDIA GPU (sm_80 or later), driver and CUDA toolkit.
#   usage: scripts/test-gpu.sh BUILD_DIR RESULTS_DIR JOBS SANITIZE_CASES [CMake flags...]
# 1. configure BUILD_DIR with the CUDA backend required (ATTN_CUDA=ON; tools and MPI off; the tests on where
#    GoogleTest is installed) and build the GPU programs;
# 2. the layout self-test (attn_gpu_selftest): without a usable GPU it says so in one line and this exits 77;
# 3. every bf16/f16 registry case through attention() on the GPU against the fp64 reference (CudaForwardDevice):
#    attn's own kernel (whole and split-KV), cuDNN's path on the cases it takes, the automatic choice, and the
#    backward (cuDNN's) on the backward registry's bf16/f16 cases;
# 4. the benchmark: attn_gpu_bench on bench/gpu/shapes.json (CUDA events), then, where PyTorch with CUDA is
#    installed, bench/gpu/peers.py: PyTorch's SDPA backends on the same inputs in the same run, the machine's
#    measured ceilings, and attn's output at full size against an fp64 reference;
# 5. the Python package on torch CUDA tensors (tests/python/test_cuda.py: scaled_dot_product_attention eager, with
#    autograd and under torch.compile, attention_paged, merge_attention, flash_attn_*, the Hugging Face
#    adapter), where PyTorch with CUDA is installed: the package from the wheel ATTN_GPU_WHEEL names (built
#    elsewhere for this machine's Python), else built here by pip (no download: scikit-build-core and nanobind
#    must be installed);
# 6. compute-sanitizer memcheck and racecheck on the first SANITIZE_CASES registry cases through attn's own kernels
#    (whole, split-KV, the merge), where it is installed (cuDNN's kernels are cuDNN's to sanitize);
# then a short table of every step (scripts/gpu_summary.py), last, whatever failed. Everything lands in RESULTS_DIR.
# ATTN_GPU_SKIP_BENCH=1 leaves out step 4 (a short run that checks correctness only).
# ATTN_GPU_PREBUILT=1: BUILD_DIR already holds the three programs (tests/cuda/attn_gpu_selftest, tests/cuda/
# attn_gpu_bench and, where GoogleTest was there, tests/test_cuda_forward), built on another machine: nothing is
# configured or built (a GPU machine without GoogleTest, or one whose time is short).
set -uo pipefail
build=$1 results=$2 jobs=$3 sanitize_cases=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
export PATH="$PATH:/usr/local/cuda/bin"
step_timeout=${GPU_STEP_TIMEOUT:-300}
if [ -n "${ATTN_GPU_PREBUILT:-}" ]; then
  tests=OFF
  [ -x "$build/tests/test_cuda_forward" ] && tests=ON
else
  tests=OFF
  [ -f /usr/include/gtest/gtest.h ] && tests=ON
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA=ON -DATTN_BUILD_TESTS=$tests -DATTN_BUILD_TOOLS=OFF \
    -DATTN_BUILD_DIST=OFF "$@" || exit 1
  targets=(attn_gpu_selftest attn_gpu_bench)
  [ $tests = ON ] && targets+=(test_cuda_forward)
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1
fi
# cuDNN for the cuDNN path (loaded at run time): the toolkit's where it has one, else PyTorch's wheels'
# (nvidia-cudnn-cu13); the cuDNN frontend also loads libcudart.so.13. Both directories go on LD_LIBRARY_PATH.
if [ -z "${ATTN_CUDNN_LIBRARY:-}" ]; then
  libdirs=$(python3 "$here/gpu_libdirs.py" 2>/dev/null)
  [ -n "$libdirs" ] && export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "cuDNN and libcudart from: ${libdirs:-the default search path}"
fi
mkdir -p "$results"
results=$(cd "$results" && pwd)  # absolute: the Python step runs from tests/python
rm -f "$results"/registry*.json "$results"/registry*.txt "$results"/*.status "$results"/attn-bench.json "$results"/gpu-bench.json \
  "$results"/python.txt
timeout "$step_timeout" "$build/tests/cuda/attn_gpu_selftest" --out "$results"
status=$?
[ $status -eq 77 ] && exit 77
if [ $tests = ON ]; then
  # Each device test in its own process, all at once (the fp64 references are computed on the host's cores).
  names=$("$build/tests/test_cuda_forward" --gtest_list_tests --gtest_filter='CudaForwardDevice.*' | sed -n 's/^  \([A-Za-z0-9_]*\).*/\1/p')
  pids=()
  for name in $names; do
    timeout "$step_timeout" "$build/tests/test_cuda_forward" --gtest_filter="CudaForwardDevice.$name" \
      --gtest_output=json:"$results/registry-$name.json" > "$results/registry-$name.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  for name in $names; do
    grep -E '^\[ (cudnn|backward) ' "$results/registry-$name.txt"
    tail -n 3 "$results/registry-$name.txt"
  done
fi
dump=$(mktemp -d)
if [ -n "${ATTN_GPU_SKIP_BENCH:-}" ]; then
  echo "not run (ATTN_GPU_SKIP_BENCH)" > "$results/bench.status"
  echo "not run (ATTN_GPU_SKIP_BENCH)" > "$results/peers.status"
elif timeout "$step_timeout" "$build/tests/cuda/attn_gpu_bench" --shapes bench/gpu/shapes.json \
    --out "$results/attn-bench.json" --dump "$dump"; then
  echo "pass" > "$results/bench.status"
else
  echo "FAIL (see attn-bench.json)" > "$results/bench.status"
  status=1
fi
if [ -n "${ATTN_GPU_SKIP_BENCH:-}" ]; then
  :
elif python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if timeout "$step_timeout" python3 bench/gpu/peers.py --attn "$results/attn-bench.json" --dump "$dump" \
      --out "$results/gpu-bench.json" > "$results/peers.txt" 2>&1; then
    echo "pass (attn's outputs within the tolerance rule at full size)" > "$results/peers.status"
  else
    echo "FAIL (see peers.txt)" > "$results/peers.status"
    status=1
  fi
  cat "$results/peers.txt"
else
  echo "not run (no PyTorch with CUDA)" > "$results/peers.status"
fi
rm -rf "$dump"
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  site="$(cd "$build" && pwd)/python-site"
  rm -rf "$site"
  if [ -n "${ATTN_GPU_WHEEL:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$ATTN_GPU_WHEEL"
  else
    CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install -q --no-build-isolation --no-deps --no-index \
      --config-settings=build-dir="$(cd "$build" && pwd)/python-build" --target "$site" .
  fi > "$results/python.txt" 2>&1
  if [ $? -ne 0 ]; then
    echo "FAIL (the package did not install: see python.txt)" > "$results/python.status"
    status=1
  elif (cd tests/python && PYTHONPATH="$site" timeout "$step_timeout" python3 -m pytest -q -rs -p no:cacheprovider \
        test_cuda.py >> "$results/python.txt" 2>&1); then
    echo "pass ($(tail -n 1 "$results/python.txt" | tr -d '=' | sed 's/^ *//'))" > "$results/python.status"
  else
    echo "FAIL ($(tail -n 1 "$results/python.txt" | tr -d '=' | sed 's/^ *//'); see python.txt)" > "$results/python.status"
    status=1
  fi
  tail -n 40 "$results/python.txt"
else
  echo "not run (no PyTorch with CUDA)" > "$results/python.status"
fi
if [ $tests = ON ]; then
  for tool in memcheck racecheck; do
    if ! command -v compute-sanitizer >/dev/null; then
      echo "not installed" > "$results/$tool.status"
    elif ATTN_DEVICE_CASES=$sanitize_cases timeout "$step_timeout" compute-sanitizer --tool $tool --error-exitcode 1 \
        "$build/tests/test_cuda_forward" \
        --gtest_filter='CudaForwardDevice.RegistryMatches*:CudaForwardDevice.SplitKv*:CudaForwardDevice.Merge*' \
        > "$results/$tool.txt" 2>&1; then
      echo "pass" > "$results/$tool.status"
    else
      echo "FAIL (see $tool.txt)" > "$results/$tool.status"
      status=1
    fi
  done
else
  echo "GoogleTest is not installed: the registry on the GPU and compute-sanitizer were not run" > "$results/tests.status"
fi
python3 "$here/gpu_summary.py" "$results" "$sanitize_cases"
exit $status
