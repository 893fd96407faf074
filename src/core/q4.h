// attn/tensor.h's i4 packing, one definition for the host and the device: element n of packed data lies in byte
// n / 2, the low nibble when n is even, the high one when odd, stored as q + 8 (q in [-8, 7]).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace attn::core {

// The signed value q of nibble `high` (0 low, 1 high) of a byte.
ATTN_HD int q4_value(std::uint8_t byte, int high) { return static_cast<int>(high ? byte >> 4 : byte & 15u) - 8; }

// Element `off` (>= 0, counted in values) of packed i4 data.
ATTN_HD int q4_at(const void* data, std::int64_t off) {
  return q4_value(static_cast<const std::uint8_t*>(data)[off >> 1], static_cast<int>(off & 1));
}

}  // namespace attn::core
