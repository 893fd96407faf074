"""Where the GPU machine keeps libcudnn.so.9 and libcudart.so.13 (scripts/test-gpu.sh puts them on LD_LIBRARY_PATH).

attn loads cuDNN at run time (src/cuda/cudnn_sdpa.cc) and the cuDNN frontend loads libcudart.so.13: the CUDA
toolkit's copies where it has them, else those of PyTorch's NVIDIA wheels (nvidia-cudnn-cu13, the CUDA runtime).
Prints the directories, ':'-separated (nothing when none is found).
"""
import os
import site

roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
try:
    roots += [os.path.join(p, sub) for p in site.getsitepackages()
              for sub in ("nvidia/cudnn/lib", "nvidia/cu13/lib", "nvidia/cuda_runtime/lib", "torch/lib")]
except AttributeError:  # a virtual environment without getsitepackages
    pass
found = []
for name in ("libcudnn.so.9", "libcudart.so.13"):
    for r in roots:
        if os.path.exists(os.path.join(r, name)):
            if r not in found:
                found.append(r)
            break
print(":".join(found))
