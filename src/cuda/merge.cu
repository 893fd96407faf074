// merge_attention on CUDA tensors (cuda/backend.h): one thread per row, the online-softmax merge of
// core/online_softmax.h (merge_weights and the finish), so the GPU merges exactly as the CPU does.
#include <cuda_runtime.h>

#include <string>

#include "core/online_softmax.h"
#include "cuda/backend.h"
#include "cuda/runtime.h"

namespace attn::cuda {
namespace {

struct View {  // a rank-3 or rank-4 f32 view
  float* data;
  std::int64_t s[4];
  __host__ __device__ std::int64_t at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d = 0) const {
    return a * s[0] + b * s[1] + c * s[2] + d * s[3];
  }
};

View view_of(const TensorView& t) {
  View v{static_cast<float*>(t.data), {t.strides[0], t.strides[1], t.strides[2], t.rank == 4 ? t.strides[3] : 0}};
  return v;
}

__global__ void merge_rows(View oa, View la, View ob, View lb, View o, View l, std::int64_t B, std::int64_t H,
                           std::int64_t S, std::int64_t D) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= B * H * S) return;
  const std::int64_t i = row % S, h = (row / S) % H, b = row / (S * H);
  const core::Merged r = core::merge_weights(core::state_from_lse(la.data[la.at(b, h, i)]),
                                             core::state_from_lse(lb.data[lb.at(b, h, i)]),
                                             static_cast<float>(core::kLog2e));
  const float factor = core::finish_factor(r.state.l);
  for (std::int64_t d = 0; d < D; ++d) {  // (every value read before its slot is written: in place is safe)
    const float x = oa.data[oa.at(b, h, i, d)], y = ob.data[ob.at(b, h, i, d)];
    const float v = r.take == core::Merged::Take::a ? x : r.take == core::Merged::Take::b ? y : x * r.wa + y * r.wb;
    o.data[o.at(b, h, i, d)] = core::finish_output(v, r.state.l, factor);
  }
  l.data[l.at(b, h, i)] = core::finish_lse(r.state.m, r.state.l, 1.0);
}

}  // namespace

Status merge(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b, const TensorView& lse_b,
             const TensorView& out, const TensorView& lse, void* stream) {
  if (Status s = require_device(); !s) return s;
  const std::int64_t B = out_a.shape[0], H = out_a.shape[1], S = out_a.shape[2], D = out_a.shape[3];
  const std::int64_t rows = B * H * S;
  if (rows == 0) return Status::Ok();
  int previous = 0;
  (void)cudaGetDevice(&previous);
  cudaError_t e = cudaSetDevice(out_a.device.index);
  constexpr int kThreads = 128;
  if (e == cudaSuccess) {
    merge_rows<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        view_of(out_a), view_of(lse_a), view_of(out_b), view_of(lse_b), view_of(out), view_of(lse), B, H, S, D);
    e = cudaGetLastError();
  }
  (void)cudaSetDevice(previous);
  if (e != cudaSuccess)
    return Status::Unsupported("out", std::string("the merge kernel could not be launched (") + cudaGetErrorName(e) +
                                          ": " + cudaGetErrorString(e) + ")");
  return Status::Ok();
}

}  // namespace attn::cuda
