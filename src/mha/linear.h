// y = x Wᵀ + b for row-major x [rows, in] (row pitch ldx), W [out, in] (nn.Linear layout), y [rows, out]
// (row pitch ldy); b may be null. One OpenBLAS sgemm call.
#pragma once

#include <cstdint>

namespace attn::mha {

void linear(const float* x, std::int64_t rows, std::int64_t in, std::int64_t ldx, const float* w, std::int64_t out,
            const float* b, float* y, std::int64_t ldy);

}  // namespace attn::mha
