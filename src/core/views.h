// Checks of strided views shared by every entry point's validation (core/validate.cc, core/merge.cc), and one
// element of a float view read as fp32 or written from it (the KV caches' appends, ring attention's packing, the
// rotary embedding).
#pragma once

#include <cstdint>
#include <string>

#include "attn/status.h"
#include "attn/tensor.h"
#include "core/convert.h"

namespace attn::core {

// Element `off` (counted in elements from data) of a float view (f32, bf16 or f16), as fp32.
inline float float_at(const TensorView& t, std::int64_t off) {
  switch (t.dtype) {
    case DType::bf16: return to_float(static_cast<const bf16*>(t.data)[off]);
    case DType::f16: return to_float(static_cast<const f16*>(t.data)[off]);
    default: return static_cast<const float*>(t.data)[off];
  }
}

// Element `off` of a float view (f32, bf16 or f16) set to x, rounded once to the view's dtype (to nearest).
inline void store_float(const TensorView& t, std::int64_t off, float x) {
  switch (t.dtype) {
    case DType::bf16: static_cast<bf16*>(t.data)[off] = from_float<bf16>(x); break;
    case DType::f16: static_cast<f16*>(t.data)[off] = from_float<f16>(x); break;
    default: static_cast<float*>(t.data)[off] = x;
  }
}

// Structural checks common to every view: the expected rank, a known dtype, sizes >= 0, an element count that
// fits in 64 bits, strides whose reach stays below 2^60 elements, and data present when there are elements.
Status check_view(const std::string& name, const TensorView& t, int expected_rank);

// An output may not write one element through two indices: no zero stride on a dimension of size > 1, and no
// two elements at one address.
Status check_output_strides(const std::string& name, const TensorView& t);

// The byte range [lo, hi) a view (that passed check_view) can touch; empty (lo == hi) when it has no elements.
struct Extent {
  std::uintptr_t lo = 0, hi = 0;
};
Extent extent_of(const TensorView& t);
bool overlaps(const Extent& a, const Extent& b);

}  // namespace attn::core
