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
//                      an fp32 form (rounded as the kernels' vector paths round: x, then + bias) and an fp64
//                      form (the wide and exact paths)
//   same_row(other)    the two rows share their bias row (a key-padding mask, broadcast over rows and heads):
//                      the vector kernel then adds it to a whole tile of lanes at once
// and per variant:
//   kPerElement        scores must go through logit() (else the kernel may keep unscaled or log2-premultiplied
//                      dot products, with the scale folded into its exponent)
//   kBiasOnly          logit(j, x) = x + bias(j): the tile-wide vector path applies
// Adding a variant: a policy here (and its case in cpu/pick.h), its definition in src/reference, its Params
// field and validation, and tests; the kernels call only these hooks.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/problem.h"

namespace attn::core {

// ---- dense masks ----------------------------------------------------------------------------------------

struct NoDenseMask {
  static constexpr bool kActive = false;
  struct Row {
    float bias(std::int64_t) const { return 0.0f; }
    bool same(const Row&) const { return true; }
  };
  static Row row(const Problem&, std::int64_t, std::int64_t, std::int64_t) { return {}; }
};

struct AdditiveMask {
  static constexpr bool kActive = true;
  struct Row {
    const float* base;
    std::int64_t stride;
    float bias(std::int64_t j) const { return base[j * stride]; }
    bool same(const Row& o) const { return base == o.base && stride == o.stride; }
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
    float bias(std::int64_t j) const { return base[j * stride] ? 0.0f : -std::numeric_limits<float>::infinity(); }
    bool same(const Row& o) const { return base == o.base && stride == o.stride; }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {static_cast<const unsigned char*>(p.mask.data) + p.mask.offset(b, h, i, 0), p.mask.stride[3]};
  }
};

// A dense mask of any kind, chosen at run time (the `mods` variants: one instantiation for every mask kind, so
// score transforms do not multiply the kernels by the mask kinds).
struct AnyMask {
  static constexpr bool kActive = true;
  struct Row {
    MaskKind kind = MaskKind::none;
    const float* add = nullptr;          // the additive row (kind additive)
    const unsigned char* keep = nullptr;  // the keep row (kind keep)
    std::int64_t stride = 0;
    float bias(std::int64_t j) const {
      switch (kind) {
        case MaskKind::additive: return add[j * stride];
        case MaskKind::keep: return keep[j * stride] ? 0.0f : -std::numeric_limits<float>::infinity();
        default: return 0.0f;
      }
    }
    bool same(const Row& o) const { return kind == o.kind && add == o.add && keep == o.keep && stride == o.stride; }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    switch (p.mask_kind) {
      case MaskKind::additive: return {MaskKind::additive, AdditiveMask::row(p, b, h, i).base, nullptr, p.mask.stride[3]};
      case MaskKind::keep: return {MaskKind::keep, nullptr, KeepMask::row(p, b, h, i).base, p.mask.stride[3]};
      default: return {};
    }
  }
};

// ---- logits transforms ------------------------------------------------------------------------------------
// T(j, x): the row's score of key j from x = scale·q·k, before the dense mask's bias; dx(x): dT/dx, the factor
// the backward's dS takes (the ALiBi bias, a constant, has none).

struct Identity {
  static constexpr bool kActive = false;
  static constexpr bool kDropout = false;
  struct Row {
    float apply(std::int64_t, float x) const { return x; }
    double apply(std::int64_t, double x) const { return x; }
    float dx(float) const { return 1.0f; }
    double dx(double) const { return 1.0; }
  };
  static Row row(const Problem&, std::int64_t, std::int64_t, std::int64_t) { return {}; }
};

// Soft-capping and ALiBi (attn::Params::softcap, alibi_slopes), each off when its parameter is 0:
//   T(j, x) = cap·tanh(x / cap) − slope·|diag − j|,   diag = i + Skv_b − Sq (bottom-right, as FlashAttention).
struct ScoreMods {
  static constexpr bool kActive = true;
  static constexpr bool kDropout = true;  // and the call's dropout (core/dropout.h), applied to the weights
  struct Row {
    float cap = 0, slope = 0;
    std::int64_t diag = 0;
    float apply(std::int64_t j, float x) const {
      const float y = cap > 0 ? cap * std::tanh(x / cap) : x;
      return slope != 0 ? y - slope * static_cast<float>(diag > j ? diag - j : j - diag) : y;
    }
    double apply(std::int64_t j, double x) const {
      const double y = cap > 0 ? cap * std::tanh(x / cap) : x;
      return slope != 0 ? y - static_cast<double>(slope) * static_cast<double>(diag > j ? diag - j : j - diag) : y;
    }
    float dx(float x) const {
      if (!(cap > 0)) return 1.0f;
      const float t = std::tanh(x / cap);
      return 1.0f - t * t;
    }
    double dx(double x) const {
      if (!(cap > 0)) return 1.0;
      const double t = std::tanh(x / cap);
      return 1.0 - t * t;
    }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {p.softcap, p.alibi_slope(b, h), i + p.kv_len[static_cast<std::size_t>(b)] - p.Sq};
  }
};

// ---- the composition ------------------------------------------------------------------------------------------

template <class Mask, class Transform = Identity>
struct Variant {
  static constexpr bool kPerElement = Mask::kActive || Transform::kActive;
  static constexpr bool kBiasOnly = !Transform::kActive;
  static constexpr bool kTransform = Transform::kActive;
  // The call's dropout (Problem::dropout, when on) multiplies the weights P by its factors z after the softmax
  // has summed them: the kernels call core::Dropout::factors where this holds.
  static constexpr bool kDropout = Transform::kDropout;

  struct Row {
    typename Mask::Row mask;
    typename Transform::Row transform;
    bool hidden(std::int64_t j) const { return mask.bias(j) == -std::numeric_limits<float>::infinity(); }
    float logit(std::int64_t j, float x) const {
      const float b = mask.bias(j);
      return b == -std::numeric_limits<float>::infinity() ? b : transform.apply(j, x) + b;
    }
    double logit(std::int64_t j, double x) const {
      const float b = mask.bias(j);
      return b == -std::numeric_limits<float>::infinity() ? -std::numeric_limits<double>::infinity()
                                                          : transform.apply(j, x) + b;
    }
    // d logit / dx at x (1 without a transform)
    float dx(float x) const { return transform.dx(x); }
    double dx(double x) const { return transform.dx(x); }
    float bias(std::int64_t j) const { return mask.bias(j); }
    bool same_row(const Row& o) const { return mask.same(o.mask); }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {Mask::row(p, b, h, i), Transform::row(p, b, h, i)};
  }
};

// The variant of the `mods` kind (softcap, ALiBi or dropout, with any dense mask).
using ModsVariant = Variant<AnyMask, ScoreMods>;

}  // namespace attn::core
