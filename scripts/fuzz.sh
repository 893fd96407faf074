#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into $FUZZ_BUILD and runs
# each of $FUZZ_TARGETS for $FUZZ_SECONDS seconds.
#   corpus:  fuzz/corpus/<target>/ (the committed seeds, read only) and $FUZZ_BUILD/corpus/<target>/ (what
#            the fuzzer finds on top, kept between runs, not committed)
#   crashes: fuzz/crashes/<target>/ (libFuzzer's crash-*, leak-*, timeout-*, oom-* files); once the bug is
#            fixed they stay there as regression inputs that `make test` replays
# Exits non-zero if any target found something. FUZZ_ARGS passes extra libFuzzer flags (e.g. -jobs=2).
# ATTN_FUZZ_SKIP_PENDING (default 1): see below.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${FUZZ_BUILD:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-fuzz_npy fuzz_cli_args fuzz_attention_params}
jobs=${JOBS:-$(nproc)}

scripts/install-deps.sh
cxx=$(scripts/install-fuzz-deps.sh | tail -n 1)
if ! grep -qw avx512bw /proc/cpuinfo; then
  echo "attn fuzz: warning: this CPU lacks AVX-512; a clang build compiles the AVX-512 units whole for it" \
       "(see CMakeLists.txt) and may stop with SIGILL" >&2
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" -DATTN_FUZZ=ON \
      -DATTN_BUILD_TESTS=OFF ${CMAKE_FLAGS:-}
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $targets

symbolizer="$(dirname "$(readlink -f "$cxx")")/llvm-symbolizer"
[ -x "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in $targets; do
  seeds="$root/fuzz/corpus/$t" crashes="$root/fuzz/crashes/$t" work="$root/$build/corpus/$t"
  mkdir -p "$crashes" "$work"
  echo "== $t: ${seconds} s; corpus $work + $seeds; crashes to $crashes/"
  # shellcheck disable=SC2086
  if ! "$root/$build/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$crashes/" ${FUZZ_ARGS:-} "$work" "$seeds"; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "attn fuzz: found problems in: ${failed[*]} (inputs in fuzz/crashes/<target>/; replay one with" \
       "$build/fuzz/<target> FILE)" >&2
  exit 1
fi
echo "attn fuzz: no crash in ${seconds} s per target ($targets)"
