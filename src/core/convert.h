// Element conversion: every storage type is widened to fp32 once on load and narrowed once on store.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/q4.h"

namespace attn::core {

// Storage-only 16-bit types (arithmetic always happens in fp32).
struct bf16 {
  std::uint16_t bits;
};
struct f16 {
  std::uint16_t bits;
};
// Two 4-bit K/V values (attn/tensor.h's i4): element 2n in the low nibble of byte n, 2n + 1 in the high one, each
// stored as q + 8. Storage only: the kernels read i4 rows through cpu/row_source.h, which widens them with their
// block scales.
struct q4x2 {
  std::uint8_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(std::int8_t x) { return x; }  // an 8-bit K/V value, before its row's scale
inline float to_float(bf16 x) {
  const std::uint32_t u = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float to_float(f16 x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}

template <class T>
T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
// Round to nearest, ties to even; NaN stays NaN.
template <>
inline bf16 from_float<bf16>(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}
template <>
inline f16 from_float<f16>(float x) {
  const _Float16 h = static_cast<_Float16>(x);  // IEEE round-to-nearest-even
  f16 r;
  std::memcpy(&r.bits, &h, 2);
  return r;
}

}  // namespace attn::core
