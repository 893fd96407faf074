// The rotary embedding's checks and its one row, shared by attn::apply_rotary and the KV caches' appends.
#pragma once

#include <cstdint>

#include "attn/rotary.h"

namespace attn::kvcache {

// rotary's tables for rows of head_dim dims, tokens at positions position0 .. position0 + tokens - 1.
Status check_rotary(const Rotary& rotary, std::int64_t head_dim, std::int64_t position0, std::int64_t tokens);

// One row x[0 .. head_dim) (fp32) turned in place at `position` (checked before).
void rotate_row(float* x, const Rotary& rotary, std::int64_t position);

}  // namespace attn::kvcache
