// What the CPU kernels offer the entry points, and the one place that chooses among them (dispatch.cc).
//
// The levels are cpu/isa_list.h's (each compiled from src/cpu/isa_unit.cc.in), then amx. Each level's unit
// exports a KernelSet: "which kernel runs these dtypes and this mask?" (null = none) and how much scratch it
// takes. select_flash() / select_backward() decide once per call, from the level in use (best_isa(), lowered by
// set_isa_override or ATTN_ISA), and say which kernel and how much memory; the same answer serves "supported?"
// (a null fn) and "which kernel?".
#pragma once

#include <cstdint>
#include <optional>

#include "attn/tensor.h"
#include "core/problem.h"
#include "cpu/isa_list.h"

namespace attn::core {
struct BackwardProblem;
}

namespace attn::cpu {

using FlashFn = void (*)(const core::Problem& problem, int threads);
using BackwardFn = void (*)(const core::BackwardProblem& problem, int threads);

// Instruction-set levels, lowest first: cpu/isa_list.h's vector levels, then amx (avx512bf16 with AMX-BF16 and
// the OS's grant of tile data: bf16 prefill on the tile unit, everything else on avx512bf16's kernels).
#define ATTN_ISA_ENUM(name, target, vec, usable) name,
enum class Isa : int { ATTN_VECTOR_ISAS(ATTN_ISA_ENUM) amx };
#undef ATTN_ISA_ENUM
inline constexpr int kIsaCount = static_cast<int>(Isa::amx) + 1;
const char* isa_name(Isa isa);

// What one level's unit exports: the kernel for these dtypes and dense-mask kind (null: none), and the bytes a
// call of its kernel allocates (per-thread scratch for `threads` threads and whatever is shared).
struct KernelSet {
  FlashFn (*flash)(DType q, DType kv, core::VariantKind variant);
  BackwardFn (*backward)(DType q, DType kv, core::VariantKind variant);
  std::int64_t (*flash_workspace)(const core::Problem& problem, int threads);
  std::int64_t (*backward_workspace)(const core::BackwardProblem& problem, int threads);
  const char* (*flash_name)(const core::Problem& problem);  // which form of its forward runs (Choice::kernel)
};
#define ATTN_ISA_DECLARE(name, target, vec, usable) \
  namespace name {                                  \
  KernelSet kernels();                              \
  }
ATTN_VECTOR_ISAS(ATTN_ISA_DECLARE)
#undef ATTN_ISA_DECLARE
// The bf16 pair-product forward (cpu/flash_amx.cc) on AMX tiles and on AVX512-BF16 dot products: null unless
// it takes this problem (bf16 q, k, v).
namespace amx {
FlashFn flash_kernel(const core::Problem& problem);
std::int64_t flash_workspace(const core::Problem& problem, int threads);
}  // namespace amx
namespace bf16dot {
FlashFn flash_kernel(const core::Problem& problem);
std::int64_t flash_workspace(const core::Problem& problem, int threads);
}  // namespace bf16dot

// The best level this CPU and OS support (detected once).
Isa best_isa();
bool isa_supported(Isa isa);
// The level calls use: the override if set, else best_isa() lowered by the environment variable ATTN_ISA
// (read once; an unknown value or a level above best_isa() is reported once on stderr and ignored).
Isa active_isa();
// Overrides the level for this process (nullopt: back to the default); `isa` must be supported.
void set_isa_override(std::optional<Isa> isa);
// Whether the avx512bf16 level runs bf16 on vdpbf16ps (the pair-product prefill kernel, the decode kernel's pair
// products): CpuFeatures::bf16_dot_fast(), unless overridden (tests run both ways wherever the level is usable).
bool bf16_dot_preferred();
void set_bf16_dot_override(std::optional<bool> prefer);

// The kernel for a validated problem: the only place one is selected.
struct Choice {
  FlashFn fn = nullptr;
  Isa isa = Isa::sse2;            // the level whose kernel runs (amx: the tile kernel; else a vector level)
  const char* kernel = "vector";  // which kernel: "vector" (fp32 FMAs), "vector (bf16 pairs)" (its row-major decode
                                  // on vdpbf16ps), "amx" (tiles) or "bf16 dot" (the vdpbf16ps prefill)
  std::int64_t workspace_bytes = 0;  // what the call allocates, at `threads` threads
};
Choice select_flash(const core::Problem& problem, int threads);
struct BackwardChoice {
  BackwardFn fn = nullptr;
  Isa isa = Isa::sse2;
  std::int64_t workspace_bytes = 0;
};
BackwardChoice select_backward(const core::BackwardProblem& problem, int threads);

// The thread count a call will use: params.threads, else the process's default (attn::set_num_threads), else
// ATTN_NUM_THREADS (read once; an invalid value is reported once on stderr and ignored), else OpenMP's default.
int resolve_threads(int requested);

}  // namespace attn::cpu
