// Masks for the tiled kernels.
//
// The causal mask, the local window and the key length each allow, for query row i of batch b,
// one contiguous interval of keys; their intersection is the interval KeyRange. Both ends are
// non-decreasing in i, which is what lets a kernel skip whole tiles and find the tiles that need
// no per-element masking. The dense mask is arbitrary and is a compile-time policy of the kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/online_softmax.h"
#include "core/problem.h"

namespace attn::core {

struct KeyRange {
  std::int64_t lo = 0, hi = 0;  // allowed keys j: lo <= j < hi (empty when hi <= lo)
};

inline KeyRange key_range(const Problem& p, std::int64_t b, std::int64_t i) {
  const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)];
  KeyRange r{0, len};
  if (p.causal != Causal::none) {
    const std::int64_t diag = i + (p.causal == Causal::bottom_right ? len - p.Sq : 0);
    r.hi = std::min(r.hi, diag + 1);
  }
  if (p.window.enabled()) {
    const std::int64_t diag = i + (p.window.align == Align::bottom_right ? len - p.Sq : 0);
    if (p.window.left >= 0) r.lo = std::max(r.lo, diag - p.window.left);
    if (p.window.right >= 0) r.hi = std::min(r.hi, diag + p.window.right + 1);
  }
  r.lo = std::clamp<std::int64_t>(r.lo, 0, len);  // clamping keeps both ends non-decreasing in i
  r.hi = std::max(r.hi, r.lo);
  return r;
}

// Dense-mask policies: bias(j) is added to the (natural-log) score of key j in one query row.
struct NoDenseMask {
  static constexpr bool kActive = false;
  struct Row {
    float bias(std::int64_t) const { return 0.0f; }
  };
  static Row row(const Problem&, std::int64_t, std::int64_t, std::int64_t) { return {}; }
};

struct AdditiveMask {
  static constexpr bool kActive = true;
  struct Row {
    const float* base;
    std::int64_t stride;
    float bias(std::int64_t j) const { return base[j * stride]; }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {static_cast<const float*>(p.mask.data) + p.mask.offset(b, h, i, 0), p.mask.stride[3]};
  }
};

struct KeepMask {
  static constexpr bool kActive = true;
  struct Row {
    const unsigned char* base;
    std::int64_t stride;
    float bias(std::int64_t j) const {
      return base[j * stride] ? 0.0f : -std::numeric_limits<float>::infinity();
    }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {static_cast<const unsigned char*>(p.mask.data) + p.mask.offset(b, h, i, 0), p.mask.stride[3]};
  }
};

// The conversion factors of a kernel's score units (core/online_softmax.h): without a dense mask the scores are
// the unscaled dot products (k = scale), with one they are scale·q·k + mask (k = 1); c = k·log2 e.
template <class DenseMask>
double score_nat_factor(const Problem& p) {
  return DenseMask::kActive ? 1.0 : p.scale;
}
template <class DenseMask>
float score_log2_factor(const Problem& p) {
  return static_cast<float>(score_nat_factor<DenseMask>(p) * kLog2e);
}

}  // namespace attn::core
