// The backward kernel compiled for AVX-512 (F, BW, VL, DQ).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 warns that the `__m512 __Y = __Y;` inside _mm512_undefined_ps (the pass-through operand of the
// unmasked max, roundscale and convert intrinsics that exp2v uses) "may be used uninitialized": it is not read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ATTN_ISA_NS avx512
#define ATTN_VEC_AVX512
#include "cpu/backward_kernel.h"

namespace attn::cpu::avx512 {
BackwardFn backward_kernel(DType q, DType kv, core::MaskKind mask) { return bwd::pick_backward(q, kv, mask); }
}  // namespace attn::cpu::avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
