// The 16-bit operand types of the tensor-core MMA and their conversions, host and device alike.
//
// The conversions are written on the bits, so that the kernels, the host model of a warp and the GPU self-test
// round exactly alike: float -> bf16 / f16 rounds to nearest, ties to even (as cvt.rn does and as core/convert.h
// does on the CPU), overflow goes to infinity, NaN stays a quiet NaN. A register holds two elements, the
// lower-numbered one in the low 16 bits (PTX: "elements low to high").
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace attn::cuda {

enum class MmaType : std::uint8_t { bf16, f16 };

ATTN_HD const char* mma_type_name(MmaType t) { return t == MmaType::bf16 ? "bf16" : "f16"; }

ATTN_HD std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
ATTN_HD float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

ATTN_HD std::uint16_t float_to_bf16(float x) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
ATTN_HD float bf16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

ATTN_HD std::uint16_t float_to_f16(float x) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  // 65520 = 0x477ff000 lies halfway between the largest f16 (65504) and 2^16: from there on, infinity.
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) {  // a normal f16 (>= 2^-14): rebias the exponent (127 - 15 = 112), round 13 bits off
    std::uint32_t r = ax - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  // Subnormal f16 (units of 2^-24) or zero: the value is mant·2^(e-150), i.e. mant >> (126 - e) units.
  const int e = static_cast<int>(ax >> 23);
  if (e < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
  const std::uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  const int shift = 126 - e;  // 14 .. 24
  std::uint32_t q = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may carry into the smallest normal: still right
  return static_cast<std::uint16_t>(sign | q);
}
ATTN_HD float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m·2^-24, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

template <MmaType T>
ATTN_HD std::uint16_t to_bits(float x) {
  if constexpr (T == MmaType::bf16) {
    return float_to_bf16(x);
  } else {
    return float_to_f16(x);
  }
}
template <MmaType T>
ATTN_HD float from_bits(std::uint16_t h) {
  if constexpr (T == MmaType::bf16) {
    return bf16_to_float(h);
  } else {
    return f16_to_float(h);
  }
}
// x rounded to the operand type and back.
template <MmaType T>
ATTN_HD float round_to(float x) {
  return from_bits<T>(to_bits<T>(x));
}

ATTN_HD std::uint32_t pack_halves(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}
ATTN_HD std::uint16_t half_of(std::uint32_t r, int half) { return static_cast<std::uint16_t>(r >> (16 * half)); }

// Two floats rounded to the operand type and packed into one register, lo in the low half.
template <MmaType T>
ATTN_HD std::uint32_t pack2(float lo, float hi) {
  return pack_halves(to_bits<T>(lo), to_bits<T>(hi));
}
template <MmaType T>
ATTN_HD float unpack(std::uint32_t r, int half) {
  return from_bits<T>(half_of(r, half));
}

}  // namespace attn::cuda
