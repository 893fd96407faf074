// The flash kernel compiled for AVX-512 (F, BW, VL, DQ).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define ATTN_ISA_NS avx512
#define ATTN_VEC_AVX512
#include "cpu/flash_kernel.h"

namespace attn::cpu::avx512 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask) { return pick_flash(q, kv, mask); }
}  // namespace attn::cpu::avx512
#pragma GCC pop_options
