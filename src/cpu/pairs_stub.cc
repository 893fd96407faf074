// The bf16 pair-product kernels' entry points in a build without the avx512bf16 level (ATTN_ISA_LEVELS=host on a
// CPU without AVX512-BF16; CMakeLists.txt): they take no problem, and the dispatcher never asks them (the amx and
// avx512bf16 levels are unusable there).
#include "cpu/kernels.h"

namespace attn::cpu {
namespace amx {
FlashFn flash_kernel(const core::Problem&) { return nullptr; }
std::int64_t flash_workspace(const core::Problem&, int) { return 0; }
}  // namespace amx
namespace bf16dot {
FlashFn flash_kernel(const core::Problem&) { return nullptr; }
std::int64_t flash_workspace(const core::Problem&, int) { return 0; }
}  // namespace bf16dot
}  // namespace attn::cpu
