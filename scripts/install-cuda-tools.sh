#!/usr/bin/env bash
# What the CUDA build takes from PyPI, in the virtual environment .venv-cuda-tools (nothing without nvcc: no CUDA
# build):
# - the cuDNN frontend's C++ headers (nvidia-cudnn-frontend, header-only; the library is the toolkit's cuDNN 9,
#   loaded at run time): the cuDNN path of the CUDA backend (src/cuda/cudnn_sdpa.cc); CMake finds them there;
# - cuobjdump and nvdisasm for the CUDA static gates (scripts/check_cuda_gates.py, ctest cuda.static_gates), where
#   the toolkit does not ship them: NVIDIA's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm of its major version.
# Never fails the build: without network (the GPU machine) it says so; a build without the frontend has no cuDNN
# path (Backend::cudnn says so) and the gates name what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
[ -z "$nvcc" ] && exit 0
bin=$(dirname "$(readlink -f "$nvcc")")
venv=.venv-cuda-tools
want=()
if ! compgen -G "$venv/lib/python*/site-packages/include/cudnn_frontend.h" >/dev/null; then
  want+=("nvidia-cudnn-frontend==1.*")
fi
if ! { [ -x "$bin/cuobjdump" ] && [ -x "$bin/nvdisasm" ]; } &&
   ! { compgen -G "$venv/lib/python*/site-packages/nvidia/*/bin/cuobjdump" >/dev/null &&
       compgen -G "$venv/lib/python*/site-packages/nvidia/*/bin/nvdisasm" >/dev/null; }; then
  major=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
  want+=("nvidia-cuda-cuobjdump==${major}.*" "nvidia-cuda-nvdisasm==${major}.*")
fi
[ ${#want[@]} -eq 0 ] && exit 0
echo "attn: installing ${want[*]} from PyPI into $venv (the CUDA build's headers and tools)"
{ [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
  "$venv/bin/python" -m pip install -q --no-deps "${want[@]}" ||
  echo "attn: could not install ${want[*]} (no network?): no cuDNN path in this build, and the CUDA static gates will report missing tools" >&2
exit 0
