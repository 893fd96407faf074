// What the CPU kernels offer the entry point. Each instruction set's translation unit exports one
// function that answers "which kernel runs these dtypes and this mask?" (null = none), and
// select_flash() is the one place that decides, per call, which instruction set to use.
#pragma once

#include <cstdint>
#include <string>

#include "attn/tensor.h"
#include "core/problem.h"

namespace attn::core {
struct BackwardProblem;
}

namespace attn::cpu {

using FlashFn = void (*)(const core::Problem& problem, int threads);

// Instruction-set levels, lowest first.
// avx512bf16 = AVX-512 with AVX512-BF16 (the vector kernels compiled with it).
// amx = avx512bf16 with AMX-BF16 (tile data granted by the OS): bf16 prefill runs on the tile unit,
// everything else on the avx512bf16 kernels.
enum class Isa : int { sse2, avx2, avx512, avx512bf16, amx };
const char* isa_name(Isa isa);

namespace sse2 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask);
}
namespace avx2 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask);
}
namespace avx512 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask);
}
namespace avx512bf16 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask);
}
namespace amx {
// The AMX kernel for this problem, or null (it takes bf16 Q, K and V).
FlashFn flash_kernel(const core::Problem& problem);
}

// The best level this CPU and OS support.
Isa best_isa();
// The level calls use: best_isa(), lowered by the ATTN_ISA environment variable
// (sse2 | avx2 | avx512 | avx512bf16 | amx; a level above what the machine supports is clamped to best_isa()).
Isa active_isa();

// Chooses the kernel for a validated problem; the only place a kernel is selected.
struct Choice {
  FlashFn fn = nullptr;
  Isa isa = Isa::sse2;
};
Choice select_flash(const core::Problem& problem);

// The thread count a call will use: params.threads, else ATTN_NUM_THREADS, else OpenMP's default.
int resolve_threads(int requested);

// Bytes of scratch one thread of the flash kernel holds (its whole working set beyond inputs/outputs),
// at the active instruction set's tile shape.
std::int64_t flash_workspace_bytes(std::int64_t dk, std::int64_t dv);

// The backward kernels (backward_kernel.h), one per instruction set like the forward's, chosen the same way.
using BackwardFn = void (*)(const core::BackwardProblem& problem, int threads);
namespace sse2 {
BackwardFn backward_kernel(DType q, DType kv, core::MaskKind mask);
}
namespace avx2 {
BackwardFn backward_kernel(DType q, DType kv, core::MaskKind mask);
}
namespace avx512 {
BackwardFn backward_kernel(DType q, DType kv, core::MaskKind mask);
}
BackwardFn select_backward(const core::Problem& problem);

}  // namespace attn::cpu
