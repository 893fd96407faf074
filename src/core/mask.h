// The interval masks for the tiled kernels.
//
// The causal mask, the local window and the key length each allow, for query row i of batch b,
// one contiguous interval of keys; their intersection is the interval KeyRange. Both ends are
// non-decreasing in i, which is what lets a kernel skip whole tiles and find the tiles that need
// no per-element masking. The dense mask is arbitrary: it is part of the kernel's Variant (core/variant.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/online_softmax.h"
#include "core/problem.h"
#include "core/variant.h"

namespace attn::core {

struct KeyRange {
  std::int64_t lo = 0, hi = 0;  // allowed keys j: lo <= j < hi (empty when hi <= lo)
};

template <class P>
ATTN_HD KeyRange key_range(const P& p, std::int64_t b, std::int64_t i) {
  const std::int64_t len = p.key_len(b);
  KeyRange r{0, len};
  if (p.causal != Causal::none) {
    const std::int64_t diag = i + (p.causal == Causal::bottom_right ? len - p.Sq : 0);
    r.hi = std::min(r.hi, diag + 1);
  }
  if (p.window.left >= 0 || p.window.right >= 0) {  // (Window::enabled(), readable in device code)
    const std::int64_t diag = i + (p.window.align == Align::bottom_right ? len - p.Sq : 0);
    if (p.window.left >= 0) r.lo = std::max(r.lo, diag - p.window.left);
    if (p.window.right >= 0) r.hi = std::min(r.hi, diag + p.window.right + 1);
  }
  r.lo = std::clamp<std::int64_t>(r.lo, 0, len);  // clamping keeps both ends non-decreasing in i
  r.hi = std::max(r.hi, r.lo);
  return r;
}

// The conversion factors of the AMX kernel's score units (core/online_softmax.h): without per-element scores
// they are the unscaled dot products (k = scale), with them scale·q·k + mask (k = 1); c = k·log2 e. (The vector
// kernel's units are its own: cpu/flash_kernel.h, Units.)
template <class Variant>
double score_nat_factor(const Problem& p) {
  return Variant::kPerElement ? 1.0 : p.scale;
}
template <class Variant>
float score_log2_factor(const Problem& p) {
  return static_cast<float>(score_nat_factor<Variant>(p) * kLog2e);
}

}  // namespace attn::core
