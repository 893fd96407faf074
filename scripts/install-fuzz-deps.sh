#!/usr/bin/env bash
# Installs what `make fuzz` needs (only what is missing): a clang with libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer, and its OpenMP runtime. Debian bookworm's default clang (14) cannot build the
# library: it has no _Float16 on x86-64 (src/core/convert.h, from clang 15 on); clang-16 has it but rejects
# __builtin_cpu_supports("f16c") (src/cpu/dispatch.cc). bookworm's clang-19 (19.1.7) builds everything:
#   clang-19            the compiler
#   libclang-rt-19-dev  compiler-rt: libclang_rt.fuzzer (-fsanitize=fuzzer), asan, ubsan
#   libomp-19-dev       LLVM's OpenMP runtime and omp.h, which CMake's FindOpenMP needs with clang
#                       (it replaces another version's libomp-*-dev, which Debian lets only one of be installed)
#   llvm-19             llvm-symbolizer, for sanitizer reports with function names and lines
# FUZZ_CLANG_VERSION picks another version. Prints the clang++ to use on its last line.
set -euo pipefail
version="${FUZZ_CLANG_VERSION:-19}"
pkgs=("clang-$version" "libclang-rt-$version-dev" "libomp-$version-dev" "llvm-$version")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "attn: installing Debian packages for the fuzzers: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
command -v "clang++-$version"
