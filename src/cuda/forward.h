// attn's own forward kernel on the GPU (cuda/forward_block.h) as the backend sees it: which problems it takes,
// the one choice of instantiation, and the launch. Plain C++ (no CUDA type), included by the backend
// (cuda/backend.cc) and by the host tests, which run the chosen instantiation's block program on the host.
#pragma once

#include <string>

#include "attn/status.h"
#include "core/problem.h"
#include "cuda/device_problem.h"
#include "cuda/elem.h"

namespace attn::cuda::fwd {

// Whether the kernel takes p (validated; its tensors on a device or, for the host model, in host memory): Q, K
// and V all bf16 or all f16, the output f32, bf16 or f16, head dims up to 256; every mask, variant, dropout,
// GQA, key lengths and paged K/V. Otherwise why not, naming the parameter.
Status supports(const core::Problem& p);

// Whether the exact path (cuda/exact_row.h) takes p: every validated problem whose launch fits a
// one-dimensional grid. It runs what supports() refuses (fp32 Q/K/V, 8-bit K/V, head dims above 256).
Status exact_supports(const core::Problem& p);
// ATTN_CUDA_EXACT=1 (tests): every launch takes the exact path, the tensor-core kernel's problems too.
bool exact_forced();

// The kernel's name for describe_attention, e.g. "flash forward (tensor cores, bf16, d128, general variant)", or
// "exact forward (f32 FMAs, ...)" for the exact path.
std::string kernel_name(const core::Problem& p);

// The instantiation a supported problem runs, as tags: f(Config{}, Variant{}) with the Config and the variant
// type of cuda/forward_block.h. The device launch and the host model both choose through this one function.
template <class F>
void with_config(const core::Problem& p, F&& f);

#if ATTN_HAVE_CUDA
// Runs the kernel on p's device and stream (Problem::stream): the tensor-core kernel where supports(p), else the
// exact path (p must pass exact_supports). Defined in cuda/forward.cu.
// Where the grid alone would leave SMs idle (sched::kv_splits: a decode step, few heads, long keys) the keys are
// split into parts, each its own block, and a second kernel merges the parts (split-KV).
Status launch(const core::Problem& p);
// ATTN_CUDA_KV_SPLITS=n (tests) forces n parts.
#endif

}  // namespace attn::cuda::fwd

#include "cuda/forward_config.h"
