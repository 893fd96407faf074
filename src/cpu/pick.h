// The one place a call's runtime description becomes a kernel instantiation: (Q dtype, K/V dtype, variant)
// -> Kernel<QT, KVT, Variant>::fn, the variant (core/variant.h) from the problem's dense-mask kind (and, as
// variants are added, their parameters). The forward and the backward of every instruction set and the AMX
// kernel use it, each with its own Kernel adapter (a struct template holding a pointer to its kernel function
// template).
#pragma once

#include "attn/tensor.h"
#include "core/convert.h"
#include "core/mask.h"
#include "core/problem.h"

namespace attn::cpu {

template <class Fn, template <class, class, class> class Kernel, class QT, class KVT>
Fn pick_for_mask(core::MaskKind mask) {
  switch (mask) {
    case core::MaskKind::none: return Kernel<QT, KVT, core::Variant<core::NoDenseMask>>::fn;
    case core::MaskKind::additive: return Kernel<QT, KVT, core::Variant<core::AdditiveMask>>::fn;
    case core::MaskKind::keep: return Kernel<QT, KVT, core::Variant<core::KeepMask>>::fn;
  }
  return nullptr;
}

template <class Fn, template <class, class, class> class Kernel, class QT>
Fn pick_for_kv(DType kv, core::MaskKind mask) {
  switch (kv) {
    case DType::f32: return pick_for_mask<Fn, Kernel, QT, float>(mask);
    case DType::bf16: return pick_for_mask<Fn, Kernel, QT, core::bf16>(mask);
    case DType::f16: return pick_for_mask<Fn, Kernel, QT, core::f16>(mask);
    default: return nullptr;
  }
}

// The instantiation for these dtypes and this dense-mask kind, or null for dtypes no kernel takes.
template <class Fn, template <class, class, class> class Kernel>
Fn pick_kernel(DType q, DType kv, core::MaskKind mask) {
  switch (q) {
    case DType::f32: return pick_for_kv<Fn, Kernel, float>(kv, mask);
    case DType::bf16: return pick_for_kv<Fn, Kernel, core::bf16>(kv, mask);
    case DType::f16: return pick_for_kv<Fn, Kernel, core::f16>(kv, mask);
    default: return nullptr;
  }
}

}  // namespace attn::cpu
