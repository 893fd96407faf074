// Launch scratch on a device (key lengths, split-KV's parts, cuDNN's workspace): attn's own stream-ordered memory
// pool per device, kept between calls. Internal to the CUDA backend (a CUDA type appears here).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace attn::cuda {

// `bytes` from device `dev`'s pool, ordered on `stream`; released with cudaFreeAsync on the same stream. Defined
// in cuda/forward.cu.
cudaError_t scratch_alloc(void** ptr, std::size_t bytes, int dev, cudaStream_t stream);

}  // namespace attn::cuda
