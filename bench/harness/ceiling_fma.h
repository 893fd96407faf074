// The peak-FMA loop of attn bench, written once over the kernels' vector wrapper (cpu/vec.h) and compiled
// per instruction set by ceilings.cc: included inside each ISA's namespace and `#pragma GCC target`,
// after ATTN_VEC_<ISA> is defined, exactly as the kernels are.
//
// kAcc independent accumulators (more than FMA latency x FMA ports, so the units never wait), each updated
// acc = acc * m + a per iteration: no memory traffic, kFlops flops per iteration.
#include "cpu/vec.h"

constexpr int kAcc = Vec::W == 16 ? 16 : 12;  // 16 of the 32 zmm registers, else 12 of the 16
constexpr double kFlops = 2.0 * kAcc * Vec::W;

inline float fma_loop(std::int64_t iters, float seed) {
  Vec::T acc[kAcc];
  const Vec::T m = Vec::set1(0.9999999f), a = Vec::set1(1e-7f);
  for (int i = 0; i < kAcc; ++i) acc[i] = Vec::set1(seed + static_cast<float>(i));
  for (std::int64_t n = 0; n < iters; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = Vec::fmadd(acc[i], m, a);
  }
  Vec::T s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = Vec::add(s, acc[i]);
  return Vec::reduce_add(s);
}
