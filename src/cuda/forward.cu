// The device kernel of attn's own forward (cuda/forward_block.h's block program with DeviceWarp) and its launch:
// one thread block per 64 packed query rows of one (batch, KV head) (cuda/schedule.h), 128 threads, the tiles in
// dynamic shared memory.
#include <cuda_runtime.h>

#include <string>

#include "cuda/forward.h"
#include "cuda/runtime.h"

namespace attn::cuda::fwd {
namespace {

template <class C, class V>
__global__ void __launch_bounds__(C::kThreads) forward_kernel(DeviceProblem p) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto* smem = reinterpret_cast<std::uint16_t*>(shared_bytes);
  const DeviceWarp w;
  const int wi = static_cast<int>(threadIdx.x) / frag::kWarp;
  const ForwardBlock<C, V, DeviceWarp> blk(p, smem, static_cast<i64>(blockIdx.x));
  typename ForwardBlock<C, V, DeviceWarp>::Warp st;
  blk.begin(w, wi, st);
  const sched::TileRange tiles = blk.tiles();
  for (i64 t = tiles.first; t < tiles.end; ++t) {
    __syncthreads();  // every warp is done with the previous tile's K and V
    blk.load_kv(w, wi, t);
    __syncthreads();
    blk.compute(w, wi, st, t, tiles.masked(t));
  }
  blk.finish(w, wi, st);
}

Status launch_error(cudaError_t e, const char* what) {
  return Status::Unsupported("q", std::string("the CUDA forward kernel: ") + what + " failed (" + cudaGetErrorName(e) +
                                      ": " + cudaGetErrorString(e) + ")");
}

}  // namespace

Status launch(const core::Problem& p) {
  if (Status s = require_device(); !s) return s;
  if (p.B * p.Hq * p.Sq == 0) return Status::Ok();
  int previous = 0;
  (void)cudaGetDevice(&previous);
  struct Restore {
    int device;
    ~Restore() { (void)cudaSetDevice(device); }
  } restore{previous};
  if (cudaError_t e = cudaSetDevice(p.device.index); e != cudaSuccess) return launch_error(e, "cudaSetDevice");
  const auto stream = static_cast<cudaStream_t>(p.stream);
  // The key lengths (a host vector in the problem) go to the device with the launch, on its stream.
  std::int64_t* kv_len = nullptr;
  const std::size_t bytes = p.kv_len.size() * sizeof(std::int64_t);
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&kv_len), bytes, stream); e != cudaSuccess)
    return launch_error(e, "cudaMallocAsync of the key lengths");
  cudaError_t e = cudaMemcpyAsync(kv_len, p.kv_len.data(), bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    const DeviceProblem dp = device_problem(p, kv_len);
    with_config(p, [&](auto cfg, auto variant) {
      using C = decltype(cfg);
      using V = decltype(variant);
      const auto kernel = forward_kernel<C, V>;
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
      if (e != cudaSuccess) return;
      const auto blocks = static_cast<unsigned>(sched::packed_grid_blocks(p.B, p.Hkv, p.group, p.Sq, C::kBlockM));
      kernel<<<blocks, C::kThreads, C::kSmemBytes, stream>>>(dp);
      e = cudaGetLastError();
    });
  }
  const cudaError_t freed = cudaFreeAsync(kv_len, stream);
  if (e != cudaSuccess) return launch_error(e, "the launch");
  if (freed != cudaSuccess) return launch_error(freed, "cudaFreeAsync of the key lengths");
  return Status::Ok();
}

}  // namespace attn::cuda::fwd
