// The backward kernel compiled for the x86-64 baseline (SSE2).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backward_problem.h"
#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "cpu/kernels.h"
#include "cpu/pick.h"

#pragma GCC push_options
#define ATTN_ISA_NS sse2
#define ATTN_VEC_SSE2
#include "cpu/backward_kernel.h"

namespace attn::cpu::sse2 {
BackwardFn backward_kernel(DType q, DType kv, core::MaskKind mask) { return bwd::pick_backward(q, kv, mask); }
}  // namespace attn::cpu::sse2
#pragma GCC pop_options
