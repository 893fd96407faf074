// The cuDNN path of the CUDA backend (cuda/backend.h): cuDNN's fused attention (its SDPA graph, forward and
// backward) through the cuDNN frontend. Plain C++ (no CUDA or cuDNN type): the backend and the host tests include it
// in every build.
//
// Which problems it takes is a host rule (takes / takes_backward, src/cuda/cudnn_rules.cc, unit-tested without a
// GPU): bf16/f16 Q, K, V (and out, dQ, dK, dV, as the entry points require), head dims multiples of 8 up to 256,
// unit-stride rows on 16-byte boundaries, no causal alignment cuDNN and attn could read differently, none of what
// attn defines its own way (dense masks, windows, softcap, ALiBi slopes, sinks, attn's Philox dropout, i8 K/V).
// Within that rule cuDNN may still refuse (its version, the GPU, a layout its engines lack): prepare() builds the
// graph, and the backend then runs attn's own kernel (Backend::automatic) or returns cuDNN's reason
// (Backend::cudnn). Graphs are built once per shape and kept (plan / run); key lengths and page tables are
// run-time tensors, so a decode loop reuses one graph.
//
// The library is loaded at run time (dlopen of libcudnn.so.9, or $ATTN_CUDNN_LIBRARY): a machine without cuDNN
// loads attn and answers "cuDNN is not available" here.
#pragma once

#include <cstdint>
#include <string>

#include "attn/status.h"

namespace attn::core {
struct Problem;
struct BackwardProblem;
}  // namespace attn::core

namespace attn::cuda::cudnn {

// Whether this build has the cuDNN path (the frontend's headers were found at configure time: ATTN_HAVE_CUDNN).
bool built();

// The host rule: Ok when the problem is one cuDNN's SDPA computes with attn's meaning; otherwise why not,
// naming the parameter.
Status takes(const core::Problem& p);
Status takes_backward(const core::BackwardProblem& bp);

// The graph for p (built on first use, then kept) and the device workspace it runs with, or why cuDNN refuses it
// (a refusal is kept too). p must pass takes().
Status prepare(const core::Problem& p, std::int64_t* workspace_bytes);
Status prepare_backward(const core::BackwardProblem& bp, std::int64_t* workspace_bytes);

// Runs the prepared graph on p's device and stream.
Status run(const core::Problem& p);
Status run_backward(const core::BackwardProblem& bp);

// The loaded cuDNN's version (e.g. "9.19.0"), or why none is loaded.
std::string version();

}  // namespace attn::cuda::cudnn
