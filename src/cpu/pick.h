// The one place a call's runtime description becomes a kernel instantiation: (Q dtype, K/V dtype, variant)
// -> Kernel<QT, KVT, Variant>::fn, the variant (core/variant.h) from core::variant_kind: the dense-mask kind, or
// the one `mods` variant (softcap / ALiBi over any dense mask). The forward and the backward of every instruction set and the AMX
// kernel use it, each with its own Kernel adapter (a struct template holding a pointer to its kernel function
// template).
#pragma once

#include "attn/tensor.h"
#include "core/convert.h"
#include "core/mask.h"
#include "core/problem.h"

namespace attn::cpu {

template <class Fn, template <class, class, class> class Kernel, class QT, class KVT>
Fn pick_for_variant(core::VariantKind variant) {
  switch (variant) {
    case core::VariantKind::none: return Kernel<QT, KVT, core::Variant<core::NoDenseMask>>::fn;
    case core::VariantKind::additive: return Kernel<QT, KVT, core::Variant<core::AdditiveMask>>::fn;
    case core::VariantKind::keep: return Kernel<QT, KVT, core::Variant<core::KeepMask>>::fn;
    case core::VariantKind::mods: return Kernel<QT, KVT, core::ModsVariant>::fn;
  }
  return nullptr;
}

template <class Fn, template <class, class, class> class Kernel, bool Quantised, class QT>
Fn pick_for_kv(DType kv, core::VariantKind variant) {
  switch (kv) {
    case DType::f32: return pick_for_variant<Fn, Kernel, QT, float>(variant);
    case DType::bf16: return pick_for_variant<Fn, Kernel, QT, core::bf16>(variant);
    case DType::f16: return pick_for_variant<Fn, Kernel, QT, core::f16>(variant);
    case DType::i8:
      if constexpr (Quantised) return pick_for_variant<Fn, Kernel, QT, std::int8_t>(variant);
      return nullptr;
    case DType::i4:
      if constexpr (Quantised) return pick_for_variant<Fn, Kernel, QT, core::q4x2>(variant);
      return nullptr;
    default: return nullptr;
  }
}

// The instantiation for these dtypes and this variant (core::variant_kind), or null for dtypes no kernel takes.
// Quantised: whether the kernel takes 8- and 4-bit K/V (the forward; the backward does not).
template <class Fn, template <class, class, class> class Kernel, bool Quantised = false>
Fn pick_kernel(DType q, DType kv, core::VariantKind variant) {
  switch (q) {
    case DType::f32: return pick_for_kv<Fn, Kernel, Quantised, float>(kv, variant);
    case DType::bf16: return pick_for_kv<Fn, Kernel, Quantised, core::bf16>(kv, variant);
    case DType::f16: return pick_for_kv<Fn, Kernel, Quantised, core::f16>(kv, variant);
    default: return nullptr;
  }
}

}  // namespace attn::cpu
