// The flash kernel compiled for the baseline instruction set (plain C++, auto-vectorised at most).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "cpu/kernels.h"

#define ATTN_ISA_NS portable
#include "cpu/flash_kernel.h"

namespace attn::cpu::portable {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask) { return pick_flash(q, kv, mask); }
}  // namespace attn::cpu::portable
