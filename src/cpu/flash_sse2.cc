// The flash kernel compiled for the x86-64 baseline (SSE2).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "cpu/kernels.h"
#include "cpu/pick.h"

#pragma GCC push_options

#define ATTN_ISA_NS sse2
#define ATTN_VEC_SSE2
#include "cpu/flash_kernel.h"

namespace attn::cpu::sse2 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask) { return pick_flash(q, kv, mask); }
}  // namespace attn::cpu::sse2
#pragma GCC pop_options
