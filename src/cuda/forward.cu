// The device kernel of attn's own forward (cuda/forward_block.h's block program with DeviceWarp) and its launch:
// one thread block per 64 packed query rows of one (batch, KV head) (cuda/schedule.h), 128 threads, the tiles in
// dynamic shared memory.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "cuda/exact_row.h"
#include "cuda/forward.h"
#include "cuda/runtime.h"
#include "cuda/scratch.h"

namespace attn::cuda::fwd {
namespace {

template <class C, class V>
__global__ void __launch_bounds__(C::kThreads) forward_kernel(DeviceProblem p) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto* smem = reinterpret_cast<std::uint16_t*>(shared_bytes);
  const DeviceWarp w;
  const int wi = static_cast<int>(threadIdx.x) / frag::kWarp;
  const ForwardBlock<C, V, DeviceWarp> blk(p, smem, static_cast<i64>(blockIdx.x), static_cast<i64>(blockIdx.y));
  typename ForwardBlock<C, V, DeviceWarp>::Warp st;
  // Two stages: tile t + 1's copies are in flight while tile t is computed (cp.async; the element-by-element
  // copies of unaligned views are done when load_kv returns). The host model (tests/test_cuda_forward.cc) runs
  // the same steps in the same order.
  blk.begin(w, wi, st);
  const bool active = blk.warp_active(wi);
  const sched::TileRange tiles = blk.tiles();
  if (tiles.first < tiles.end) blk.load_kv(w, wi, tiles.first, 0);
  DeviceWarp::commit();
  for (i64 t = tiles.first; t < tiles.end; ++t) {
    const int stage = static_cast<int>((t - tiles.first) & 1);
    if (t + 1 < tiles.end) {
      blk.load_kv(w, wi, t + 1, stage ^ 1);  // its stage was last read by tile t - 1, before the barrier below
      DeviceWarp::commit();
      DeviceWarp::wait<1>();  // this thread's copies of Q and tile t are done
    } else {
      DeviceWarp::wait<0>();
    }
    __syncthreads();  // ... and every thread's
    if (active) blk.compute(w, wi, st, t, stage, tiles.masked(t));
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }
  DeviceWarp::wait<0>();
  blk.finish(w, wi, st);
}

// The exact path (cuda/exact_row.h): one thread per query row and chunk of output dimensions.
template <class V>
__global__ void __launch_bounds__(exact::kThreads) exact_kernel(DeviceProblem p, i64 total) {
  const i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < total) exact::exact_thread<V>(p, t);
}

// Split-KV's combine step: one thread per output element (cuda/forward_block.h combine_split), blocks of 64 so
// that a decode step's few rows still spread over many SMs.
constexpr int kCombineThreads = 64;
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(DeviceProblem p) {
  const i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.B * p.Hq * p.Sq * p.Dv) return;
  const i64 d = e % p.Dv, row = e / p.Dv;
  const i64 i = row % p.Sq, h = (row / p.Sq) % p.Hq, b = row / (p.Sq * p.Hq);
  store_combined(p, b, h, i, d, combine_split(p, b, h, i, d));
}

// ATTN_CUDA_KV_SPLITS=n (tests): every launch splits the keys into n parts, whatever the heuristic says.
i64 forced_splits() {
  const char* v = std::getenv("ATTN_CUDA_KV_SPLITS");
  const long n = v ? std::strtol(v, nullptr, 10) : 0;
  return n > 0 && n <= 1024 ? n : 0;
}

Status launch_error(cudaError_t e, const char* what) {
  return Status::Unsupported("q", std::string("the CUDA forward kernel: ") + what + " failed (" + cudaGetErrorName(e) +
                                      ": " + cudaGetErrorString(e) + ")");
}

}  // namespace
}  // namespace attn::cuda::fwd

namespace attn::cuda {

// attn's own stream-ordered memory pool on device `dev` (cuda/scratch.h): what a launch allocates (the key
// lengths, split-KV's parts, cuDNN's workspace) stays cached in it between calls (release threshold: unlimited),
// so a decode step's allocation costs no mapping of memory, and the device's default pool (which other libraries
// share) keeps its settings. It keeps at most the largest amount the calls in flight at one time have needed.
// Devices past kPools use the default pool.
cudaError_t scratch_alloc(void** ptr, std::size_t bytes, int dev, cudaStream_t stream) {
  static std::mutex mutex;
  constexpr int kPools = 64;  // devices with a pool of attn's own (more: the device's default pool)
  static cudaMemPool_t pools[kPools] = {};
  cudaMemPool_t pool = nullptr;
  if (dev >= 0 && dev < kPools) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (pools[dev] == nullptr) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      if (cudaMemPoolCreate(&pools[dev], &props) == cudaSuccess) {
        std::uint64_t keep = ~std::uint64_t{0};
        (void)cudaMemPoolSetAttribute(pools[dev], cudaMemPoolAttrReleaseThreshold, &keep);
      } else {
        pools[dev] = nullptr;
        (void)cudaGetLastError();
      }
    }
    pool = pools[dev];
  }
  return pool ? cudaMallocFromPoolAsync(ptr, bytes, pool, stream) : cudaMallocAsync(ptr, bytes, stream);
}

}  // namespace attn::cuda

namespace attn::cuda::fwd {

constexpr int kCachedDevices = 64;  // devices whose kernel attributes are remembered (more: asked every call)

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
  // The key lengths (a host vector in the problem) go to the device with the launch, on its stream, unless every
  // one is Skv (DeviceProblem::key_len reads a null pointer as Skv).
  std::int64_t* kv_len = nullptr;
  i64 longest = 0;
  bool uniform = true;
  for (i64 n : p.kv_len) longest = n > longest ? n : longest, uniform &= n == p.Skv;
  const std::size_t bytes = uniform ? 0 : p.kv_len.size() * sizeof(std::int64_t);
  if (bytes > 0)
    if (cudaError_t e = scratch_alloc(reinterpret_cast<void**>(&kv_len), bytes, p.device.index, stream);
        e != cudaSuccess)
      return launch_error(e, "the allocation of the key lengths");
  float* parts = nullptr;  // split-KV's partial results
  cudaError_t e = bytes > 0 ? cudaMemcpyAsync(kv_len, p.kv_len.data(), bytes, cudaMemcpyHostToDevice, stream) : cudaSuccess;
  if (e == cudaSuccess && (!supports(p) || exact_forced())) {  // the exact path: what the tensor cores do not take
    const DeviceProblem dp = device_problem(p, kv_len);
    const i64 total = exact::threads(dp);
    const auto blocks = static_cast<unsigned>(sched::ceil_div(total, exact::kThreads));
    if (general_variant(p)) {
      exact_kernel<GeneralVariant><<<blocks, exact::kThreads, 0, stream>>>(dp, total);
    } else {
      exact_kernel<PlainVariant><<<blocks, exact::kThreads, 0, stream>>>(dp, total);
    }
    e = cudaGetLastError();
  } else if (e == cudaSuccess) {
    DeviceProblem dp = device_problem(p, kv_len);
    with_config(p, [&](auto cfg, auto variant) {
      using C = decltype(cfg);
      using V = decltype(variant);
      const auto kernel = forward_kernel<C, V>;
      // Once per kernel and device: its shared-memory limit raised, and how many of its blocks an SM holds.
      static std::atomic<int> resident[kCachedDevices];
      const int dev = p.device.index;
      int per_sm = dev < kCachedDevices ? resident[dev].load(std::memory_order_relaxed) : 0;
      if (per_sm == 0) {
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
        if (e != cudaSuccess) return;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, C::kSmemBytes);
        if (e != cudaSuccess) return;
        if (dev < kCachedDevices) resident[dev].store(per_sm, std::memory_order_relaxed);
      }
      const i64 blocks = sched::packed_grid_blocks(p.B, p.Hkv, p.group, p.Sq, C::kBlockM);
      // Split-KV where the grid alone leaves SMs idle (a decode step, few heads, long keys).
      int sms = 0;
      (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      const i64 forced = forced_splits();
      dp.splits = forced > 0 ? forced
                             : sched::kv_splits(blocks, sched::ceil_div(longest, C::kBlockN),
                                                         static_cast<i64>(per_sm) * sms);
      if (dp.splits > 1) {
        const i64 rows = dp.splits * p.B * p.Hq * p.Sq;
        e = scratch_alloc(reinterpret_cast<void**>(&parts), static_cast<std::size_t>(rows * (p.Dv + 1)) * 4, dev, stream);
        if (e != cudaSuccess) return;
        dp.part_o = parts, dp.part_lse = parts + rows * p.Dv;
      }
      kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(dp.splits)), C::kThreads, C::kSmemBytes,
               stream>>>(dp);
      e = cudaGetLastError();
      if (e != cudaSuccess || dp.splits == 1) return;
      const i64 elems = p.B * p.Hq * p.Sq * p.Dv;
      combine_kernel<<<static_cast<unsigned>(sched::ceil_div(elems, kCombineThreads)), kCombineThreads, 0, stream>>>(dp);
      e = cudaGetLastError();
    });
  }
  const cudaError_t freed = kv_len ? cudaFreeAsync(kv_len, stream) : cudaSuccess;
  const cudaError_t freed_parts = parts ? cudaFreeAsync(parts, stream) : cudaSuccess;
  if (e != cudaSuccess) return launch_error(e, "the launch");
  if (freed != cudaSuccess) return launch_error(freed, "cudaFreeAsync of the key lengths");
  if (freed_parts != cudaSuccess) return launch_error(freed_parts, "cudaFreeAsync of the split-KV parts");
  return Status::Ok();
}

}  // namespace attn::cuda::fwd
