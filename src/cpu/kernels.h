// What the CPU kernels offer the entry point: one function per instruction set that answers
// "which kernel runs this problem?" (null = none).
#pragma once

#include <cstdint>

#include "attn/tensor.h"
#include "core/problem.h"

namespace attn::cpu {

// The tile of the flash kernels: query rows per block, keys per tile.
struct TileShape {
  std::int64_t br = 64;
  std::int64_t bc = 64;
};

// Bytes of scratch one thread of the flash kernel holds (its whole working set beyond inputs/outputs).
inline std::int64_t flash_workspace_bytes(std::int64_t dk, std::int64_t dv, const TileShape& t = {}) {
  return 4 * (t.br * dk + t.bc * dk + t.bc * dv + t.br * t.bc + t.br * dv) + 8 * t.br;
}

using FlashFn = void (*)(const core::Problem& problem, int threads);

namespace portable {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask);
}

// Chooses the kernel for a validated problem; the only place a kernel is selected.
struct Choice {
  FlashFn fn = nullptr;
  const char* isa = "none";
};
Choice select_flash(const core::Problem& problem);

// The thread count a call will use: params.threads, else ATTN_NUM_THREADS, else OpenMP's default.
int resolve_threads(int requested);

}  // namespace attn::cpu
