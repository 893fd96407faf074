#!/usr/bin/env bash
# `make fuzz-campaign`: a long fuzzing run measured in CPU time, not wall time. Every target of
# $FUZZ_TARGETS runs at once (nice 19, so interactive work keeps the cores) in chunks of $CHUNK wall seconds
# until the CPU time it used (user + system, read by /usr/bin/time) reaches $FUZZ_CPU_SECONDS. On a shared
# 2-core machine a wall-clock limit would overstate the fuzzing done; this counts what actually ran.
# Uses the build and folders of scripts/fuzz.sh (run `make fuzz` once first to build the targets).
# Writes one line per chunk and a summary to $FUZZ_BUILD/campaign/<target>.log; exits non-zero if any target
# found something (inputs in fuzz/crashes/<target>/).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${FUZZ_BUILD:-build-fuzz}
cpu_target=${FUZZ_CPU_SECONDS:-3600}
chunk=${CHUNK:-300}
# libFuzzer's -timeout is wall-clock time, and a nice-19 fuzzer on a busy machine can wait that long for a core:
# 10 s (scripts/fuzz.sh) reported three false timeouts here (each input then replayed in under 0.1 s).
timeout=${FUZZ_TIMEOUT:-120}
targets=${FUZZ_TARGETS:-fuzz_npy fuzz_cli_args fuzz_attention_params}
for t in $targets; do
  [ -x "$build/fuzz/$t" ] || { echo "attn fuzz-campaign: $build/fuzz/$t not built (run make fuzz first)" >&2; exit 2; }
done
symbolizer="$(command -v llvm-symbolizer-19 || true)"
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$build/campaign"

run_target() {
  local t=$1 used=0 runs=0 n=0
  local seeds="$root/fuzz/corpus/$t" crashes="$root/fuzz/crashes/$t" work="$root/$build/corpus/$t"
  local log="$root/$build/campaign/$t.log"
  mkdir -p "$crashes" "$work"
  : > "$log"
  while awk -v u="$used" -v c="$cpu_target" 'BEGIN { exit !(u < c) }'; do
    n=$((n + 1))
    local out="$root/$build/campaign/$t.chunk"
    if ! /usr/bin/time -f "%U %S" -o "$out.time" nice -n 19 "$root/$build/fuzz/$t" -max_total_time="$chunk" \
         -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/" \
         "$work" "$seeds" > "$out" 2>&1; then
      echo "chunk $n: FAILED (see $out)" >> "$log"
      tail -n 40 "$out" >> "$log"
      return 1
    fi
    local cpu execs
    cpu=$(awk 'NR == 1 { print $1 + $2 }' "$out.time")
    # grep -a: the chunk log holds raw fuzz bytes, on which mawk silently stops matching
    execs=$(grep -a 'number_of_executed_units' "$out" | tail -n 1 | awk '{ print $NF }')
    used=$(awk -v u="$used" -v c="$cpu" 'BEGIN { print u + c }')
    runs=$((runs + ${execs:-0}))
    echo "chunk $n: ${cpu} CPU s, ${execs:-0} executions; total ${used} CPU s, ${runs} executions" >> "$log"
  done
  echo "done: $t ran ${used} CPU seconds, ${runs} executions, corpus $(ls "$work" | wc -l) files, no crash" >> "$log"
}

pids=()
for t in $targets; do
  run_target "$t" & pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for t in $targets; do tail -n 1 "$build/campaign/$t.log"; done
exit $status
