// The CUDA backend as the entry points see it (src/core/sdpa.cc, backward.cc, info.cc): validated problems whose
// tensors all live on one CUDA device (core::Problem::device, the caller's stream in Problem::stream). Plain C++:
// no CUDA type appears here, so the core includes it whether or not the build has CUDA.
//
// Two implementations, one decision (select_forward / select_backward, like cpu::select_flash):
//   cudnn   cuDNN's fused attention through the cuDNN frontend (src/cuda/cudnn_sdpa.{h,cc}, its host rule in
//           cudnn_rules.cc): bf16/f16 Q, K, V of the configurations the rule and the installed cuDNN take;
//           graphs built once per shape and kept (plan / run); the GPU's backward (deterministic).
//   flash   attn's own forward kernels: every configuration the CPU engine accepts (the FlashAttention-2-style
//           tensor-core kernel of forward_block.h for bf16/f16 up to head dim 256, with split-KV decode over
//           contiguous and paged caches; the exact fp32 path of exact_row.h for the rest). attn's own backward
//           on the GPU is not written yet.
// Params::backend picks: automatic = cuDNN where it takes the problem, else attn's own; cudnn = cuDNN only (a
// clear Unsupported where it refuses); flash = attn's own only. Without a device, or in a build without CUDA,
// every call answers "no CUDA device" (cuda/runtime.h).
#pragma once

#include <cstdint>
#include <string>

#include "attn/status.h"
#include "attn/tensor.h"

namespace attn::core {
struct Problem;
struct BackwardProblem;
}  // namespace attn::core

namespace attn::cuda {

enum class Path : std::uint8_t { none, cudnn, flash };

// The decision for one call: which path, which kernel (for describe_attention), the scratch it allocates on the
// device, or why none takes it (status).
struct Choice {
  Path path = Path::none;
  std::string kernel;               // e.g. "cudnn sdpa", "flash forward (tensor cores, bf16, d128)", "split-kv decode"
  std::string arch;                 // the device's compute capability, e.g. "sm_90"
  std::int64_t workspace_bytes = 0;  // device memory the call allocates (or takes from a kept workspace)
  Status status;                    // ok when path != none
};

Choice select_forward(const core::Problem& p);
Status run_forward(const core::Problem& p, const Choice& c);

Choice select_backward(const core::BackwardProblem& bp);
Status run_backward(const core::BackwardProblem& bp, const Choice& c);

// attn::merge_attention on CUDA tensors that passed its validation (all on one device), queued on `stream`.
Status merge(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b, const TensorView& lse_b,
             const TensorView& out, const TensorView& lse, void* stream);

}  // namespace attn::cuda
