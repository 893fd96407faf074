// What a kernel does to a score between the dot product and the softmax, and which pairs it hides: the one
// policy axis of the kernels (FlashInfer's variants.cuh is the model). Every kernel (the vector forward and
// backward, the AMX forward) is a template over one Variant, instantiated for each variant by cpu/pick.h (the
// one switch from a call's runtime description, core::Problem::mask_kind, to a type); the reference
// (src/reference) implements the same definitions independently, from the formula.
//
// A Variant composes
//   - a dense mask (None, Additive f32, Keep bool): per pair a bias (0, the value, or -inf to hide the key);
//   - a logits transform (Identity, or ScoreMods: softcap and ALiBi): the score from the scaled dot product
//     x = scale·q·k, before the bias.
// Dropout rides on the `mods` variant (kDropout): a runtime switch there, compiled out of every other variant.
// Sinks are no variant: a per-head logit with no value, absorbed into each row's state as it finishes
// (core::finish_with_sink), so every kernel and split-KV take it the same way, once per row.
// The hooks a kernel calls, per query row (Variant::row(problem, b, h, i)):
//   hidden(j)          the key is hidden from the row (the kernel then never reads it: -inf, no weight)
//   logit(j, x)        the row's score of key j from x = scale·q·k, in natural-log units (-inf when hidden);
//                      an fp32 form and an fp64 form (the wide and exact paths)
//   dx(x)              d logit / dx, the factor the backward's dS takes
// and their vector form, for a kernel that holds up to N query rows in the lanes of its vectors and takes a tile
// of keys one key at a time (Variant::Lanes<L, N>, L the lane arithmetic: core::ScalarLanes, or a CPU instruction
// set's VecLanes):
//   Lanes(problem, b, h[], i[], n, j0)   the rows of lanes 0 .. n-1 for the tile of keys starting at j0
//   logit(v, c, x, hidden)               the scores of the lanes of vector v for key j0 + c from x = scale·q·k per
//                                        lane (-inf where the dense mask hides the key; `hidden` then set)
// and per variant:
//   kPerElement        scores must go through logit() (else the kernel may keep unscaled or log2-premultiplied
//                      dot products, with the scale folded into its exponent)
//   kTransform         logit() transforms x (its dx() is not 1)
//   kDropout           the call's dropout may apply (dropout(problem))
//   from_far_side(p)   the kernel should walk a row's key tiles from the last back (ALiBi: a row's largest scores
//                      sit at its diagonal, the far keys' are large and negative)
// Adding a variant: a policy here (and its case in cpu/pick.h), its definition in src/reference, its Params
// field and validation, and tests; the kernels call only these hooks.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/online_softmax.h"
#include "core/problem.h"

namespace attn::core {

// ---- dense masks ----------------------------------------------------------------------------------------
// Each: Row (one query row: bias(j), 0 or the additive value or -inf) and Lanes<L, N> (the rows of up to N lanes:
// bias(v, c), the biases of the lanes of vector v at key j0 + c; one broadcast when every lane reads the same row,
// as a key-padding mask broadcast over rows and heads does).

struct NoDenseMask {
  static constexpr bool kActive = false;
  struct Row {
    ATTN_HD float bias(std::int64_t) const { return 0.0f; }
  };
  template <class P>
  ATTN_HD static Row row(const P&, std::int64_t, std::int64_t, std::int64_t) { return {}; }
  template <class L, int N>
  struct Lanes {
    ATTN_INLINE Lanes(const Problem&, std::int64_t, const std::int64_t*, const std::int64_t*, std::int64_t,
                      std::int64_t) {}
    ATTN_INLINE bool active() const { return false; }
    ATTN_INLINE typename L::T bias(int, std::int64_t) const { return L::set1(0.0f); }
  };
};

// A dense mask row of element type E, read as a bias by Bias(e) (additive: the value; keep: 0 or -inf).
template <class E, float (*Bias)(E)>
struct DenseRow {
  const E* base;
  std::int64_t stride;
  ATTN_HD float bias(std::int64_t j) const { return Bias(base[j * stride]); }
};

// The rows of up to N lanes of a dense mask (lanes past n read lane 0's row), from key j0 on; `on` false: the
// problem's mask is of another kind (AnyMask), nothing is read.
template <class L, int N, class E, float (*Bias)(E)>
struct DenseLanes {
  const E* base[N] = {};
  std::int64_t stride = 0;
  bool shared = true;  // every lane reads one row
  ATTN_INLINE DenseLanes(const Problem& p, std::int64_t b, const std::int64_t* h, const std::int64_t* i, std::int64_t n,
                         std::int64_t j0, bool on = true) {
    if (!on) return;
    stride = p.mask.stride[3];
    for (int r = 0; r < N; ++r) {
      const std::int64_t s = r < n ? r : 0;
      base[r] = static_cast<const E*>(p.mask.data) + p.mask.offset(b, h[s], i[s], 0) + j0 * stride;
      shared = shared && base[r] == base[0];
    }
  }
  ATTN_INLINE bool active() const { return true; }
  ATTN_INLINE typename L::T bias(int v, std::int64_t c) const {
    if (shared) return L::set1(Bias(base[0][c * stride]));
    alignas(64) float x[L::W];
    for (int w = 0; w < L::W; ++w) x[w] = Bias(base[v * L::W + w][c * stride]);
    return L::load(x);
  }
};

ATTN_HD float additive_bias(float x) { return x; }
ATTN_HD float keep_bias(unsigned char x) { return x ? 0.0f : -std::numeric_limits<float>::infinity(); }

struct AdditiveMask {
  static constexpr bool kActive = true;
  using Row = DenseRow<float, additive_bias>;
  template <class P>
  ATTN_HD static Row row(const P& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {static_cast<const float*>(p.mask.data) + p.mask.offset(b, h, i, 0), p.mask.stride[3]};
  }
  template <class L, int N>
  using Lanes = DenseLanes<L, N, float, additive_bias>;
};

struct KeepMask {
  static constexpr bool kActive = true;
  using Row = DenseRow<unsigned char, keep_bias>;
  template <class P>
  ATTN_HD static Row row(const P& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {static_cast<const unsigned char*>(p.mask.data) + p.mask.offset(b, h, i, 0), p.mask.stride[3]};
  }
  template <class L, int N>
  using Lanes = DenseLanes<L, N, unsigned char, keep_bias>;
};

// A dense mask of any kind, chosen at run time (the `mods` variants: one instantiation for every mask kind, so
// score transforms do not multiply the kernels by the mask kinds).
struct AnyMask {
  static constexpr bool kActive = true;
  struct Row {
    MaskKind kind = MaskKind::none;
    AdditiveMask::Row add{nullptr, 0};
    KeepMask::Row keep{nullptr, 0};
    ATTN_HD float bias(std::int64_t j) const {
      switch (kind) {
        case MaskKind::additive: return add.bias(j);
        case MaskKind::keep: return keep.bias(j);
        default: return 0.0f;
      }
    }
  };
  template <class P>
  ATTN_HD static Row row(const P& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    Row r;
    r.kind = p.mask_kind;
    if (r.kind == MaskKind::additive) r.add = AdditiveMask::row(p, b, h, i);
    if (r.kind == MaskKind::keep) r.keep = KeepMask::row(p, b, h, i);
    return r;
  }
  template <class L, int N>
  struct Lanes {
    // (No std::optional here: its members are compiled outside the kernels' target regions; see ATTN_INLINE.)
    MaskKind kind;
    typename AdditiveMask::template Lanes<L, N> add;
    typename KeepMask::template Lanes<L, N> keep;
    ATTN_INLINE Lanes(const Problem& p, std::int64_t b, const std::int64_t* h, const std::int64_t* i, std::int64_t n,
                      std::int64_t j0)
        : kind(p.mask_kind), add(p, b, h, i, n, j0, kind == MaskKind::additive),
          keep(p, b, h, i, n, j0, kind == MaskKind::keep) {}
    ATTN_INLINE bool active() const { return kind != MaskKind::none; }
    ATTN_INLINE typename L::T bias(int v, std::int64_t c) const {
      switch (kind) {
        case MaskKind::additive: return add.bias(v, c);
        case MaskKind::keep: return keep.bias(v, c);
        default: return L::set1(0.0f);
      }
    }
  };
};

// ---- logits transforms ------------------------------------------------------------------------------------
// T(j, x): the row's score of key j from x = scale·q·k, before the dense mask's bias; dx(x): dT/dx, the factor
// the backward's dS takes (the ALiBi bias, a constant, has none). Row: one query row, fp32 and fp64; Lanes<L, N>:
// the rows of up to N lanes, apply(v, c, x) for key j0 + c.

struct Identity {
  static constexpr bool kActive = false;
  static constexpr bool kDropout = false;
  struct Row {
    ATTN_HD float apply(std::int64_t, float x) const { return x; }
    ATTN_HD double apply(std::int64_t, double x) const { return x; }
    ATTN_HD float dx(float) const { return 1.0f; }
    ATTN_HD double dx(double) const { return 1.0; }
  };
  template <class P>
  ATTN_HD static Row row(const P&, std::int64_t, std::int64_t, std::int64_t) { return {}; }
  static bool from_far_side(const Problem&) { return false; }
  template <class L, int N>
  struct Lanes {
    ATTN_INLINE Lanes(const Problem&, std::int64_t, const std::int64_t*, const std::int64_t*, std::int64_t,
                      std::int64_t) {}
    ATTN_INLINE typename L::T apply(int, std::int64_t, typename L::T x) const { return x; }
  };
};

// Soft-capping and ALiBi (attn::Params::softcap, alibi_slopes), each off when its parameter is 0:
//   T(j, x) = cap·tanh(x / cap) − slope·|diag − j|,   diag = i + Skv_b − Sq (bottom-right, as FlashAttention).
struct ScoreMods {
  static constexpr bool kActive = true;
  static constexpr bool kDropout = true;  // and the call's dropout (core/dropout.h), applied to the weights
  struct Row {
    float cap = 0, slope = 0;
    std::int64_t diag = 0;
    ATTN_HD float apply(std::int64_t j, float x) const {
      const float y = cap > 0 ? cap * std::tanh(x / cap) : x;
      return slope != 0 ? y - slope * static_cast<float>(diag > j ? diag - j : j - diag) : y;
    }
    ATTN_HD double apply(std::int64_t j, double x) const {
      const double y = cap > 0 ? cap * std::tanh(x / cap) : x;
      return slope != 0 ? y - static_cast<double>(slope) * static_cast<double>(diag > j ? diag - j : j - diag) : y;
    }
    ATTN_HD float dx(float x) const {
      if (!(cap > 0)) return 1.0f;
      const float t = std::tanh(x / cap);
      return 1.0f - t * t;
    }
    ATTN_HD double dx(double x) const {
      if (!(cap > 0)) return 1.0;
      const double t = std::tanh(x / cap);
      return 1.0 - t * t;
    }
  };
  template <class P>
  ATTN_HD static Row row(const P& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {p.softcap, p.alibi_slope(b, h), i + p.key_len(b) - p.Sq};
  }
  // ALiBi makes the scores of far keys large and negative: walking a row's tiles from its diagonal back finds the
  // running max first, so the far tiles' scores lie far below it (cpu/flash_kernel.h: kFarBelow).
  static bool from_far_side(const Problem& p) { return p.alibi.has_value(); }
  // The vector form: cap·tanh(x·(1/cap)) with the lane arithmetic's tanh, and the ALiBi distance |diag − j| formed
  // as |(diag − j0) − c| in fp32, exact while it is below 2^24.
  template <class L, int N>
  struct Lanes {
    using T = typename L::T;
    bool cap_on = false, alibi = false;
    T cap, inv_cap;
    alignas(64) float slope[N], base[N];  // base = diag − j0
    ATTN_INLINE Lanes(const Problem& p, std::int64_t b, const std::int64_t* h, const std::int64_t* i, std::int64_t n,
                      std::int64_t j0)
        : cap_on(p.softcap > 0), alibi(p.alibi.has_value()), cap(L::set1(p.softcap)),
          inv_cap(L::set1(p.softcap > 0 ? 1.0f / p.softcap : 0.0f)) {
      for (int r = 0; r < N; ++r) {
        const Row row = r < n ? ScoreMods::row(p, b, h[r], i[r]) : Row{};
        slope[r] = row.slope;
        base[r] = r < n ? static_cast<float>(row.diag - j0) : 0.0f;
      }
    }
    ATTN_INLINE T apply(int v, std::int64_t c, T x) const {
      if (cap_on) x = L::mul(cap, L::tanh(L::mul(x, inv_cap)));
      if (alibi) x = L::sub(x, L::mul(L::load(slope + v * L::W), L::abs(L::sub(L::load(base + v * L::W),
                                                                                 L::set1(static_cast<float>(c))))));
      return x;
    }
  };
};

// ---- the composition ------------------------------------------------------------------------------------------

template <class Mask, class Transform = Identity>
struct Variant {
  static constexpr bool kPerElement = Mask::kActive || Transform::kActive;
  static constexpr bool kTransform = Transform::kActive;
  // The call's dropout (Problem::dropout, when on) multiplies the weights P by its factors z after the softmax
  // has summed them: the kernels call core::Dropout::factors where dropout(p) holds.
  static constexpr bool kDropout = Transform::kDropout;
  static bool dropout(const Problem& p) { return kDropout && p.dropout.on(); }
  static bool from_far_side(const Problem& p) { return Transform::from_far_side(p); }

  struct Row {
    typename Mask::Row mask;
    typename Transform::Row transform;
    ATTN_HD bool hidden(std::int64_t j) const { return mask.bias(j) == -std::numeric_limits<float>::infinity(); }
    ATTN_HD float logit(std::int64_t j, float x) const {
      const float b = mask.bias(j);
      return b == -std::numeric_limits<float>::infinity() ? b : transform.apply(j, x) + b;
    }
    ATTN_HD double logit(std::int64_t j, double x) const {
      const float b = mask.bias(j);
      return b == -std::numeric_limits<float>::infinity() ? -std::numeric_limits<double>::infinity()
                                                          : transform.apply(j, x) + b;
    }
    // d logit / dx at x (1 without a transform)
    ATTN_HD float dx(float x) const { return transform.dx(x); }
    ATTN_HD double dx(double x) const { return transform.dx(x); }
  };
  template <class P>
  ATTN_HD static Row row(const P& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {Mask::row(p, b, h, i), Transform::row(p, b, h, i)};
  }

  // The vector form (see the top of this file): the rows of lanes 0 .. n-1 (lane r: query row i[r] of head h[r]
  // in batch b), for the tile of keys starting at j0.
  template <class L, int N>
  struct Lanes {
    using T = typename L::T;
    typename Mask::template Lanes<L, N> mask;
    typename Transform::template Lanes<L, N> transform;
    ATTN_INLINE Lanes(const Problem& p, std::int64_t b, const std::int64_t* h, const std::int64_t* i, std::int64_t n,
                      std::int64_t j0)
        : mask(p, b, h, i, n, j0), transform(p, b, h, i, n, j0) {}
    // The lanes' scores at key j0 + c from x = scale·q·k (the fp32 form of Row::logit); `hidden` is set when the
    // dense mask hides the key from some lane.
    ATTN_INLINE T logit(int v, std::int64_t c, T x, bool& hidden) const {
      const T y = transform.apply(v, c, x);
      if (!mask.active()) return y;
      const T b = mask.bias(v, c);
      if (L::any_neg_inf(b)) hidden = true;
      return L::if_neg_inf(b, b, L::add(y, b));
    }
  };
};

// The variant of the `mods` kind (softcap, ALiBi or dropout, with any dense mask).
using ModsVariant = Variant<AnyMask, ScoreMods>;

}  // namespace attn::core
