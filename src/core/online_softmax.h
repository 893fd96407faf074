// The online-softmax state of a query row, and its exact merge: the one definition every kernel uses (the
// vector kernel with one row per SIMD lane, the AMX kernel with one row per scalar, split-KV and
// merge_attention on finished results, and device code: the functions are ATTN_HD).
//
// Units. A kernel's scores s are in its own "score units": the unscaled dot products q·k when it applies the
// softmax scale inside the exponent (no dense mask), or scale·q·k + mask otherwise. Two constants convert:
//   c = (score units -> log2 units)        = scale·log2(e), or log2(e)
//   k = (score units -> natural-log units) = scale, or 1                    (c = k·log2(e))
// A state (m, l) over a set of keys holds the running max m of their scores (score units) and the running sum
// l = Σ 2^((s - m)·c); the kernel keeps the unnormalised output o = Σ 2^((s - m)·c)·v in its own layout.
//
// Exponents are formed as (s - m)·c: the difference first (exact by Sterbenz's lemma when s is within a factor
// of two of m, so the largest score weighs exactly 1), then one product. Scores of any finite magnitude, up to
// FLT_MAX, lose nothing to a rounded intermediate, and no exponent is ever positive (no overflow; the lazy
// AMX form keeps them below `slack`).
//
// Non-finite values follow IEEE arithmetic over the keys a row attends: a NaN score gives a NaN weight (l, o
// and the LSE become NaN); a +inf score gives NaN (inf - inf); a -inf score weighs 0. A row that has seen no key
// with a score above -inf is empty: it finishes as O = 0 and LSE = -inf, never NaN, and merges as nothing.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/hd.h"  // ATTN_HD: host and device alike, always inlined

namespace attn::core {

inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The lane arithmetic of one scalar row, in fp32 (ScalarLanes) or fp64 (WideLanes): the Lanes concept (T, W lanes,
// set1, load, add, sub, mul, max, abs, exp2, tanh, if_neg_inf, any_neg_inf), which the CPU kernels' vector types
// (cpu/vec.h: VecLanes) implement too and core/variant.h's vector hooks use. max(a, b) returns b when either is
// NaN, as the x86 max instructions do.
template <class F>
struct ScalarOf {
  using T = F;
  static constexpr int W = 1;
  ATTN_HD static T set1(float x) { return x; }
  ATTN_HD static T load(const float* p) { return *p; }
  ATTN_HD static T add(T a, T b) { return a + b; }
  ATTN_HD static T sub(T a, T b) { return a - b; }
  ATTN_HD static T mul(T a, T b) { return a * b; }
  ATTN_HD static T max(T a, T b) { return a > b ? a : b; }
  ATTN_HD static T exp2(T x) { return static_cast<T>(std::exp2(static_cast<double>(x))); }
  // x == -inf ? a : b
  ATTN_HD static T if_neg_inf(T x, T a, T b) { return x == kNegInf ? a : b; }
  ATTN_HD static bool any_neg_inf(T x) { return x == kNegInf; }
  ATTN_HD static T abs(T x) { return std::fabs(x); }
  ATTN_HD static T tanh(T x) { return std::tanh(x); }
};
using ScalarLanes = ScalarOf<float>;
using WideLanes = ScalarOf<double>;

// The state of one row (Lanes = ScalarLanes or WideLanes) or of one row per SIMD lane (a vector Lanes of
// cpu/vec.h). Besides l it can keep a second sum weighted like l, w = Σ 2^((s - m)·c)·x_j, for a kernel that
// needs a weighted mean over the row's keys (the backward's D = Σ_j P_ij dP_ij); rescaled with l, it costs nothing
// where it is not used.
template <class Lanes>
struct OnlineSoftmax {
  using T = typename Lanes::T;
  T m;  // running max of the scores seen (score units)
  T l;  // running sum of 2^((s - m)·c)
  T w;  // running sum of 2^((s - m)·c)·x_j (the second sum)

  // Empty: m = -inf, l = w = 0. (Always inlined, like every function here, so that a vector state is built with
  // its kernel's instruction set.)
  ATTN_HD OnlineSoftmax() : m(Lanes::set1(kNegInf)), l(Lanes::set1(0.0f)), w(Lanes::set1(0.0f)) {}

  // Where weights are measured from: m, or 0 while the row has seen nothing (its scores are then all -inf and
  // weigh 2^(-inf) = 0 instead of NaN).
  ATTN_HD T origin() const { return Lanes::if_neg_inf(m, Lanes::set1(0.0f), m); }
  // The weight 2^((s - origin)·c) of score s; in log2 units (c = 1), 2^(s - origin).
  ATTN_HD static T weight(T s, T origin, T c) { return Lanes::exp2(Lanes::mul(Lanes::sub(s, origin), c)); }
  ATTN_HD static T weight_log2(T s, T origin) { return Lanes::exp2(Lanes::sub(s, origin)); }

  // Eager step: m' = max(m, tile_max), l *= α, w *= α; returns α = 2^((m - m')·c), the factor the caller multiplies
  // its accumulator o by (0 for a row that had seen nothing: its o holds only 0·v terms).
  ATTN_HD T advance(T tile_max, T c) {
    const T m_new = Lanes::max(m, tile_max);
    const T alpha = Lanes::if_neg_inf(m, Lanes::set1(0.0f), Lanes::exp2(Lanes::mul(Lanes::sub(m, m_new), c)));
    m = m_new;
    l = Lanes::mul(l, alpha);
    w = Lanes::mul(w, alpha);
    return alpha;
  }

  // Lazy step (one scalar row): moves m as advance() does only when a score of the tile passes it by more than
  // `slack` in log2 units (or is NaN), so weights stay at most 2^slack and the accumulator is rescaled only when
  // m moves. Returns α (exactly 1 when m did not move).
  ATTN_HD T advance_lazy(T tile_max, T c, float slack) {
    const T gap = Lanes::mul(Lanes::sub(tile_max, m), c);  // NaN for a NaN tile_max (and for -inf - (-inf))
    if (gap <= slack) return Lanes::set1(1.0f);
    return advance(tile_max, c);
  }

  // A tile's weights, summed relative to origin() after its advance (and their sum times x_j for w).
  ATTN_HD void add(T sum) { l = Lanes::add(l, sum); }
  ATTN_HD void add(T sum, T weighted) { l = Lanes::add(l, sum), w = Lanes::add(w, weighted); }

  // One score s joining the row as a key of its own, x its value for the second sum: a sink (a logit with no
  // value, x = 0) joins every row of its head this way.
  ATTN_HD void absorb(T s, T c, T x = Lanes::set1(0.0f)) {
    advance(s, c);
    const T e = weight(s, origin(), c);
    add(e, Lanes::mul(e, x));
  }

  // What a kernel that recomputes the row's weights later needs (the backward): P = 2^((s - m)·c)·inv_l, and the
  // second sum's mean w / l. An empty row (l = 0: no key above -inf) gets m = 0 and inv_l = 0, so every weight is
  // 0; a row that met a NaN stays NaN.
  struct Statistics {
    T m, inv_l, mean_w;
  };
  ATTN_HD Statistics statistics() const {
    if (l == 0) return {T(0), T(0), T(0)};
    return {m, T(1) / l, w / l};
  }
};

using RowState = OnlineSoftmax<ScalarLanes>;

// ---- finishing a row (scalar) ----------------------------------------------------------------------------

// The natural-log log-sum-exp m·k + ln l, in double; -inf for an empty row, NaN for a row that met a NaN.
ATTN_HD float finish_lse(float m, float l, double k) {
  if (l == 0.0f) return kNegInf;
  return static_cast<float>(static_cast<double>(m) * k + std::log(static_cast<double>(l)));
}

// The factor the accumulator is multiplied by: 1/l (NaN for a NaN row); an empty row uses finish_output.
ATTN_HD float finish_factor(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }

// One output value o/l: exactly 0 for an empty row (l = 0), whatever o holds (it may hold 0·NaN).
ATTN_HD float finish_output(float o, float l, float factor) { return l == 0.0f ? 0.0f : o * factor; }

// A row finished with a sink: a logit `sink` (natural-log units) that joins the denominator with no value
// (attn::Params::sinks). Absorbed once, as the row finishes (after any split-KV merge), in double:
//   M = max(m·k, sink),  α = e^(m·k − M),  l' = α·l + e^(sink − M),  out = o·α / l',  lse = M + ln l'.
// A row that saw no key (l = 0) gets out = 0 and lse = sink; sink = -inf is no sink (finish_factor/finish_lse);
// NaN rows stay NaN. `factor` multiplies the accumulator as finish_output does.
struct Finish {
  float factor, lse;
};
ATTN_HD Finish finish_with_sink(float m, float l, double k, float sink) {
  if (sink == kNegInf) return {finish_factor(l), finish_lse(m, l, k)};
  if (l == 0.0f) return {0.0f, sink};
  const double mk = static_cast<double>(m) * k, s = sink;
  const double M = (mk != mk || mk > s) ? mk : s;  // (NaN stays NaN)
  const double alpha = std::exp(mk - M), L = alpha * static_cast<double>(l) + std::exp(s - M);
  return {static_cast<float>(alpha / L), static_cast<float>(M + std::log(L))};
}

// ---- merging -------------------------------------------------------------------------------------------------

// How two states over disjoint key sets merge (both in the units of c): the merged state, and the factors each
// side's accumulator is multiplied by before the two are added. An empty side contributes nothing (its
// accumulator is not read: `take` says which accumulators the result is made of); otherwise both sides are
// weighted (IEEE: a NaN anywhere reaches the result, 0·NaN included).
// Empty means m = -inf and l = 0: a state whose tile max came out -inf while its weights were NaN (x86 max
// drops a NaN followed by a -inf score, so m can stay -inf while l is NaN) is poisoned, not empty, and poisons the
// merge.
struct Merged {
  enum class Take : std::uint8_t { a, b, both } take;  // a alone (b empty), b alone (a empty), or wa·a + wb·b
  float wa, wb;
  OnlineSoftmax<ScalarLanes> state;
};
ATTN_HD Merged merge_weights(const OnlineSoftmax<ScalarLanes>& a, const OnlineSoftmax<ScalarLanes>& b, float c) {
  if (b.m == kNegInf && b.l == 0.0f) return {Merged::Take::a, 1.0f, 0.0f, a};
  if (a.m == kNegInf && a.l == 0.0f) return {Merged::Take::b, 0.0f, 1.0f, b};
  Merged r{Merged::Take::both, 0.0f, 0.0f, a};
  const float m = ScalarLanes::max(a.m, b.m);  // NaN when either is NaN
  r.wa = ScalarLanes::exp2((a.m - m) * c), r.wb = ScalarLanes::exp2((b.m - m) * c);
  r.state.l = a.l * r.wa + b.l * r.wb;
  r.state.w = a.w * r.wa + b.w * r.wb;
  r.state.m = m;
  return r;
}

// Merges state b (accumulator ob) into state a (accumulator oa), n values each (merge_weights).
ATTN_HD void merge(OnlineSoftmax<ScalarLanes>& a, float* oa, const OnlineSoftmax<ScalarLanes>& b, const float* ob,
                   std::int64_t n, float c) {
  const Merged r = merge_weights(a, b, c);
  if (r.take == Merged::Take::b)
    for (std::int64_t d = 0; d < n; ++d) oa[d] = ob[d];
  if (r.take == Merged::Take::both)
    for (std::int64_t d = 0; d < n; ++d) oa[d] = oa[d] * r.wa + ob[d] * r.wb;
  a = r.state;
}

// A finished row (normalised output and natural-log LSE) seen as a state in natural-log units (c = log2 e), so
// that finished partial results merge: m = lse, l = 1, o = out; empty when lse = -inf.
ATTN_HD RowState state_from_lse(float lse) {
  RowState s;
  if (lse != kNegInf) s.m = lse, s.l = 1.0f;
  return s;
}

}  // namespace attn::core
