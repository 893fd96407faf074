#!/usr/bin/env bash
# `make test-gpu` (see the Makefile): on a machine with an NVIDIA GPU (sm_80 or later), driver and CUDA toolkit.
#   usage: scripts/test-gpu.sh BUILD_DIR RESULTS_DIR JOBS SANITIZE_CASES [CMake flags...]
# 1. configure BUILD_DIR with the CUDA backend required (ATTN_CUDA=ON; tools and MPI off; the tests on where
#    GoogleTest is installed) and build the GPU programs;
# 2. the layout self-test (attn_gpu_selftest): without a usable GPU it says so in one line and this exits 77;
# 3. every bf16/f16 registry case through attention() on the GPU against the fp64 reference (CudaForwardDevice);
# 4. compute-sanitizer memcheck and racecheck on the first SANITIZE_CASES of them, where it is installed;
# then a short table of every step (scripts/gpu_summary.py), last, whatever failed. Everything lands in RESULTS_DIR.
set -uo pipefail
build=$1 results=$2 jobs=$3 sanitize_cases=$4
shift 4
tests=OFF
[ -f /usr/include/gtest/gtest.h ] && tests=ON
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA=ON -DATTN_BUILD_TESTS=$tests -DATTN_BUILD_TOOLS=OFF \
  -DATTN_BUILD_DIST=OFF "$@" || exit 1
targets=(attn_gpu_selftest)
[ $tests = ON ] && targets+=(test_cuda_forward)
cmake --build "$build" -j "$jobs" --target "${targets[@]}" || exit 1
mkdir -p "$results"
rm -f "$results"/registry.json "$results"/*.status
"$build/tests/cuda/attn_gpu_selftest" --out "$results"
status=$?
[ $status -eq 77 ] && exit 77
if [ $tests = ON ]; then
  "$build/tests/test_cuda_forward" --gtest_filter='CudaForwardDevice.*' --gtest_output=json:"$results/registry.json" ||
    status=1
  for tool in memcheck racecheck; do
    if ! command -v compute-sanitizer >/dev/null; then
      echo "not installed" > "$results/$tool.status"
    elif ATTN_DEVICE_CASES=$sanitize_cases compute-sanitizer --tool $tool --error-exitcode 1 \
        "$build/tests/test_cuda_forward" --gtest_filter='CudaForwardDevice.*' > "$results/$tool.txt" 2>&1; then
      echo "pass" > "$results/$tool.status"
    else
      echo "FAIL (see $tool.txt)" > "$results/$tool.status"
      status=1
    fi
  done
else
  echo "GoogleTest is not installed: the registry on the GPU and compute-sanitizer were not run" > "$results/tests.status"
fi
python3 "$(dirname "$0")/gpu_summary.py" "$results" "$sanitize_cases"
exit $status
