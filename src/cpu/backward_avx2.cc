// The backward kernel compiled for AVX2 + FMA + F16C.
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
#pragma GCC target("avx2,fma,f16c")
#define ATTN_ISA_NS avx2
#define ATTN_VEC_AVX2
#include "cpu/backward_kernel.h"

namespace attn::cpu::avx2 {
BackwardFn backward_kernel(DType q, DType kv, core::MaskKind mask) { return bwd::pick_backward(q, kv, mask); }
}  // namespace attn::cpu::avx2
#pragma GCC pop_options
