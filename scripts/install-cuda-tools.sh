#!/usr/bin/env bash
# cuobjdump and nvdisasm for the CUDA static gates (scripts/check_cuda_gates.py, ctest cuda.static_gates): the
# toolkit's own where it ships them; otherwise NVIDIA's PyPI packages nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm (of the toolkit's major version) in the virtual environment .venv-cuda-tools. Does
# nothing without nvcc (no CUDA build, no gates) or when the tools are already there; never fails the build:
# without network (the GPU machine) it says so, and the gates then name what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
[ -z "$nvcc" ] && exit 0
bin=$(dirname "$(readlink -f "$nvcc")")
[ -x "$bin/cuobjdump" ] && [ -x "$bin/nvdisasm" ] && exit 0
venv=.venv-cuda-tools
if compgen -G "$venv/lib/python*/site-packages/nvidia/*/bin/cuobjdump" >/dev/null &&
   compgen -G "$venv/lib/python*/site-packages/nvidia/*/bin/nvdisasm" >/dev/null; then
  exit 0
fi
major=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
echo "attn: installing cuobjdump and nvdisasm ${major}.x from PyPI into $venv (the CUDA toolkit at $bin lacks them)"
{ [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
  "$venv/bin/python" -m pip install -q "nvidia-cuda-cuobjdump==${major}.*" "nvidia-cuda-nvdisasm==${major}.*" ||
  echo "attn: could not install cuobjdump / nvdisasm (no network?): the CUDA static gates will report them missing" >&2
exit 0
