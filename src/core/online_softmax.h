// The online-softmax state of one query row, and its exact merge.
//
// A state (m, l, o) over a set of keys holds the running max m of the scores (natural-log units),
// the running sum l = Σ e^(s - m) and the unnormalised output o = Σ e^(s - m) v. Processing a tile of
// keys and merging two states over disjoint key sets are the same operation; prefill tiles, split-KV
// partial results and results from other processes all go through merge(). The empty state
// (m = -inf, l = 0, o = 0) is safe everywhere: no -inf - (-inf) is ever formed.
//
// Exponentials are taken as 2^(s·log2e - m·log2e) with the product and difference formed at higher
// precision (fma in the SIMD kernels, double in portable code), so huge logits lose no accuracy to a
// rounded intermediate.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace attn::core {

inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// e^(a - b) for a <= b, with e^(-inf - b) = 0 (and b finite or a == -inf).
inline float exp_diff(float a, float b) {
  return a == kNegInf ? 0.0f : static_cast<float>(std::exp2((static_cast<double>(a) - b) * kLog2e));
}

struct SoftmaxState {
  float m = kNegInf;  // running max of the scores seen
  float l = 0.0f;     // running sum of e^(s - m)

  // -m·log2(e) as the exponent offset for this state's weights: the weight of score s is
  // 2^(s·log2e + offset). 0 while no key has been seen, so masked (-inf) scores weigh 0, not NaN.
  double log2_offset() const { return m == kNegInf ? 0.0 : -static_cast<double>(m) * kLog2e; }

  // Moves the running max to cover a new tile whose largest score is tile_max. Returns the factor
  // by which the caller must multiply its accumulator o; l is rescaled here.
  float advance(float tile_max) {
    const float m_new = std::fmax(m, tile_max);
    const float alpha = exp_diff(m, m_new);
    m = m_new;
    l *= alpha;
    return alpha;
  }

  // The natural-log log-sum-exp of the scores seen; -inf for a row with no allowed key.
  float lse() const { return l > 0.0f ? static_cast<float>(m + std::log(static_cast<double>(l))) : kNegInf; }

  // Divides the accumulator by l; an empty row (l = 0) becomes exactly 0, whatever it held.
  void normalize(float* o, std::int64_t dv) const {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (std::int64_t d = 0; d < dv; ++d) o[d] = l > 0.0f ? o[d] * inv : 0.0f;
  }
};

// Merges state b (with accumulator ob) into state a (accumulator oa), both over dv values.
inline void merge(SoftmaxState& a, float* oa, const SoftmaxState& b, const float* ob, std::int64_t dv) {
  const float m = std::fmax(a.m, b.m);
  if (m == kNegInf) return;  // both empty: a stays empty
  const float wa = exp_diff(a.m, m), wb = exp_diff(b.m, m);
  // A side with weight 0 is skipped, not multiplied: its accumulator may hold anything (even NaN).
  for (std::int64_t d = 0; d < dv; ++d) oa[d] = (wa > 0.0f ? oa[d] * wa : 0.0f) + (wb > 0.0f ? ob[d] * wb : 0.0f);
  a.l = a.l * wa + b.l * wb;
  a.m = m;
}

// A finished row (normalised output and natural-log LSE) seen as a state, so that finished partial
// results can be merged: m = lse, l = 1, o = out.
inline SoftmaxState state_from_lse(float lse) { return lse == kNegInf ? SoftmaxState{} : SoftmaxState{lse, 1.0f}; }

}  // namespace attn::core
