// What a kernel does to a score between the dot product and the softmax, and which pairs it hides: the one
// policy axis of the kernels (FlashInfer's variants.cuh is the model). Every kernel (the vector forward and
// backward, the AMX forward) is a template over one Variant, instantiated for each variant by cpu/pick.h (the
// one switch from a call's runtime description, core::Problem::mask_kind, to a type); the reference
// (src/reference) implements the same definitions independently, from the formula.
//
// A Variant composes
//   - a dense mask (None, Additive f32, Keep bool): per pair a bias (0, the value, or -inf to hide the key);
//   - a logits transform (Identity today; softcap, ALiBi slopes and sinks are next): the score from the scaled
//     dot product x = scale·q·k, before the bias.
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

// ---- logits transforms ------------------------------------------------------------------------------------

struct Identity {
  static constexpr bool kActive = false;
  static float apply(float x) { return x; }
  static double apply(double x) { return x; }
};

// ---- the composition ------------------------------------------------------------------------------------------

template <class Mask, class Transform = Identity>
struct Variant {
  static constexpr bool kPerElement = Mask::kActive || Transform::kActive;
  static constexpr bool kBiasOnly = !Transform::kActive;

  struct Row {
    typename Mask::Row mask;
    bool hidden(std::int64_t j) const { return mask.bias(j) == -std::numeric_limits<float>::infinity(); }
    float logit(std::int64_t j, float x) const {
      const float b = mask.bias(j);
      return b == -std::numeric_limits<float>::infinity() ? b : Transform::apply(x) + b;
    }
    double logit(std::int64_t j, double x) const {
      const float b = mask.bias(j);
      return b == -std::numeric_limits<float>::infinity() ? -std::numeric_limits<double>::infinity()
                                                          : Transform::apply(x) + b;
    }
    float bias(std::int64_t j) const { return mask.bias(j); }
    bool same_row(const Row& o) const { return mask.same(o.mask); }
  };
  static Row row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
    return {Mask::row(p, b, h, i)};
  }
};

}  // namespace attn::core
