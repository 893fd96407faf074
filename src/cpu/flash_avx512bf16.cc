// The flash kernel compiled for AVX-512 with AVX512-BF16 (the level below amx, and what amx runs for all
// but bf16 prefill). The body is flash_avx512.cc's; vdpbf16ps pair products in the decode micro-kernels
// measured 7-14% slower than widening to fp32 FMAs on D1/D2 (decode waits on memory, not on multiplies),
// so the level differs from avx512 only in what the compiler may use (branch exp/bf16-pairs-decode).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#define ATTN_ISA_NS avx512bf16
#define ATTN_VEC_AVX512
#include "cpu/flash_kernel.h"

namespace attn::cpu::avx512bf16 {
FlashFn flash_kernel(DType q, DType kv, core::MaskKind mask) { return pick_flash(q, kv, mask); }
}  // namespace attn::cpu::avx512bf16
#pragma GCC pop_options
