// Kernels of the GPU layout self-tests: one warp per block, each running a per-warp body of
// cuda/selftest_tiles.h through DeviceWarp (the real mma.sync, ldmatrix and shuffles), and their launchers.
#include "cuda/selftest.h"

#include <cuda_runtime.h>

#include <string>

#include "cuda/runtime.h"
#include "cuda/selftest_tiles.h"
#include "cuda/warp.h"

namespace attn::cuda::selftest {
namespace {

template <MmaType T>
__global__ void __launch_bounds__(32) onehot_mma_kernel(float* out) {
  const int c = static_cast<int>(blockIdx.x);
  onehot_mma<T>(DeviceWarp{}, onehot_m(c), onehot_k(c), onehot_n(c), out + c * frag::kMmaM * frag::kMmaN);
}

template <int Num, bool Trans>
__global__ void __launch_bounds__(32) ldmatrix_probe_kernel(std::uint32_t* out) {
  __shared__ alignas(16) std::uint16_t smem[kProbeSmemElems];
  ldmatrix_probe<Num, Trans>(DeviceWarp{}, smem, out);
}

__device__ __forceinline__ TileOut tile_out(float* s, float* rowmax, float* rowsum, float* o, int c) {
  return {s + c * kTileS, rowmax + c * kTileStat, rowsum + c * kTileStat, o + c * kTileO};
}

template <MmaType T, bool Softmax>
__global__ void __launch_bounds__(32) attention_tile_kernel(const std::uint16_t* q, const std::uint16_t* k,
                                                            const std::uint16_t* v, float* s, float* rowmax,
                                                            float* rowsum, float* o) {
  __shared__ alignas(16) std::uint16_t smem[kTileSmemElems];
  const int c = static_cast<int>(blockIdx.x);
  const DeviceWarp w;
  tile_fill(w, q + c * kTileRows * kTileDk, k + c * kTileKeys * kTileDk, v + c * kTileKeys * kTileDv, smem);
  attention_tile<T, Softmax>(w, smem, tile_out(s, rowmax, rowsum, o, c));
}

template <MmaType T>
__global__ void __launch_bounds__(32) attention_tile_onehot_kernel(float* s, float* rowmax, float* rowsum,
                                                                   float* o) {
  __shared__ alignas(16) std::uint16_t smem[kTileSmemElems];
  const int c = static_cast<int>(blockIdx.x);
  const DeviceWarp w;
  tile_fill_onehot<T>(w, c / (kTileDk * kTileKeys), (c / kTileKeys) % kTileDk, c % kTileKeys, smem);
  attention_tile<T, false>(w, smem, tile_out(s, rowmax, rowsum, o, c));
}

// Device buffers freed on every path.
struct Buffers {
  std::vector<void*> ptrs;
  ~Buffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <class T>
  cudaError_t alloc(T** p, std::size_t n) {
    void* raw = nullptr;
    const cudaError_t e = cudaMalloc(&raw, n * sizeof(T) + 1);
    if (e == cudaSuccess) ptrs.push_back(raw);
    *p = static_cast<T*>(raw);
    return e;
  }
};

Status fail(const char* what, cudaError_t e) {
  (void)cudaGetLastError();
  return Status::Unsupported("device", std::string(what) + " failed: " + cudaGetErrorName(e) + ": " +
                                           cudaGetErrorString(e));
}

#define ATTN_CUDA_TRY(what, call)             \
  do {                                        \
    const cudaError_t e_ = (call);            \
    if (e_ != cudaSuccess) return fail(what, e_); \
  } while (0)

template <class T>
Status copy_back(std::vector<T>* host, const T* dev) {
  ATTN_CUDA_TRY("cudaMemcpy", cudaMemcpy(host->data(), dev, host->size() * sizeof(T), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status finish(const char* kernel) {
  ATTN_CUDA_TRY(kernel, cudaGetLastError());
  ATTN_CUDA_TRY(kernel, cudaDeviceSynchronize());
  return Status::Ok();
}

Status tile_results_back(TileResults* out, float* s, float* rowmax, float* rowsum, float* o) {
  for (auto [h, d] : {std::pair{&out->s, s}, {&out->rowmax, rowmax}, {&out->rowsum, rowsum}, {&out->o, o}})
    if (Status st = copy_back(h, d); !st.ok()) return st;
  return Status::Ok();
}

}  // namespace

Status gpu_onehot_mma(MmaType t, std::vector<float>* out) {
  if (Status st = require_device(); !st.ok()) return st;
  out->assign(static_cast<std::size_t>(kOnehotCases) * frag::kMmaM * frag::kMmaN, -1.0f);
  Buffers b;
  float* d = nullptr;
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&d, out->size()));
  if (t == MmaType::bf16) {
    onehot_mma_kernel<MmaType::bf16><<<kOnehotCases, 32>>>(d);
  } else {
    onehot_mma_kernel<MmaType::f16><<<kOnehotCases, 32>>>(d);
  }
  if (Status st = finish("onehot_mma_kernel"); !st.ok()) return st;
  return copy_back(out, d);
}

Status gpu_ldmatrix_probe(int num, bool trans, std::vector<std::uint32_t>* out) {
  if (Status st = require_device(); !st.ok()) return st;
  if (num != 1 && num != 2 && num != 4) return Status::Invalid("num", "ldmatrix loads 1, 2 or 4 matrices");
  out->assign(static_cast<std::size_t>(frag::kWarp) * num, 0u);
  Buffers b;
  std::uint32_t* d = nullptr;
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&d, out->size()));
  switch (num * 2 + (trans ? 1 : 0)) {
    case 2: ldmatrix_probe_kernel<1, false><<<1, 32>>>(d); break;
    case 3: ldmatrix_probe_kernel<1, true><<<1, 32>>>(d); break;
    case 4: ldmatrix_probe_kernel<2, false><<<1, 32>>>(d); break;
    case 5: ldmatrix_probe_kernel<2, true><<<1, 32>>>(d); break;
    case 8: ldmatrix_probe_kernel<4, false><<<1, 32>>>(d); break;
    default: ldmatrix_probe_kernel<4, true><<<1, 32>>>(d); break;
  }
  if (Status st = finish("ldmatrix_probe_kernel"); !st.ok()) return st;
  return copy_back(out, d);
}

Status gpu_attention_tile(MmaType t, bool softmax, int cases, const std::vector<std::uint16_t>& q,
                          const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
                          TileResults* out) {
  if (Status st = require_device(); !st.ok()) return st;
  const auto n = static_cast<std::size_t>(cases);
  if (cases <= 0 || q.size() != n * kTileRows * kTileDk || k.size() != n * kTileKeys * kTileDk ||
      v.size() != n * kTileKeys * kTileDv)
    return Status::Invalid("q", "q, k, v must hold `cases` tiles of 16x16, 16x16 and 16x8 elements");
  out->resize(cases);
  Buffers b;
  std::uint16_t *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *s = nullptr, *mx = nullptr, *sum = nullptr, *o = nullptr;
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&dq, q.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&dk, k.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&dv, v.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&s, out->s.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&mx, out->rowmax.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&sum, out->rowsum.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&o, out->o.size()));
  ATTN_CUDA_TRY("cudaMemcpy", cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  ATTN_CUDA_TRY("cudaMemcpy", cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  ATTN_CUDA_TRY("cudaMemcpy", cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  const bool bf = t == MmaType::bf16;
  if (bf && softmax) attention_tile_kernel<MmaType::bf16, true><<<cases, 32>>>(dq, dk, dv, s, mx, sum, o);
  if (bf && !softmax) attention_tile_kernel<MmaType::bf16, false><<<cases, 32>>>(dq, dk, dv, s, mx, sum, o);
  if (!bf && softmax) attention_tile_kernel<MmaType::f16, true><<<cases, 32>>>(dq, dk, dv, s, mx, sum, o);
  if (!bf && !softmax) attention_tile_kernel<MmaType::f16, false><<<cases, 32>>>(dq, dk, dv, s, mx, sum, o);
  if (Status st = finish("attention_tile_kernel"); !st.ok()) return st;
  return tile_results_back(out, s, mx, sum, o);
}

Status gpu_attention_tile_onehot(MmaType t, TileResults* out) {
  if (Status st = require_device(); !st.ok()) return st;
  out->resize(kTileOnehotCases);
  Buffers b;
  float *s = nullptr, *mx = nullptr, *sum = nullptr, *o = nullptr;
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&s, out->s.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&mx, out->rowmax.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&sum, out->rowsum.size()));
  ATTN_CUDA_TRY("cudaMalloc", b.alloc(&o, out->o.size()));
  if (t == MmaType::bf16) {
    attention_tile_onehot_kernel<MmaType::bf16><<<kTileOnehotCases, 32>>>(s, mx, sum, o);
  } else {
    attention_tile_onehot_kernel<MmaType::f16><<<kTileOnehotCases, 32>>>(s, mx, sum, o);
  }
  if (Status st = finish("attention_tile_onehot_kernel"); !st.ok()) return st;
  return tile_results_back(out, s, mx, sum, o);
}

}  // namespace attn::cuda::selftest
