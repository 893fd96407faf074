#!/usr/bin/env bash
# Installs the Debian packages that building and testing attn need (only those missing).
# `make demo` and `make test` call this first, so a fresh machine needs nothing by hand.
set -euo pipefail
# python3-dev and python3-venv: `make test` builds the Python package with pip in a virtual environment.
# libopenblas-dev: the multi-head module's projections; libcairo2-dev (found with pkg-config) and
# fonts-dejavu-core: the plots, PNG and SVG (a build without Cairo has no plots; the tests and CI want them).
# openmpi-bin, libopenmpi-dev: ring attention (attn_dist, Open MPI); iproute2: its test across namespaced hosts
# (ip, tc; tests/netns_ring.sh, skipped where namespaces are not permitted).
# ccache: `make test` compiles the library twice with the same flags (the C++ build and the Python package's);
# through scripts/compiler-launcher the second is served from the cache.
pkgs=(cmake g++ make pkg-config libgtest-dev libgmock-dev libcli11-dev libbenchmark-dev libopenblas-dev libcairo2-dev
      fonts-dejavu-core openmpi-bin libopenmpi-dev iproute2 python3 python3-dev python3-venv ccache)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "attn: installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
