// y = x Wᵀ + b for row-major x [rows, in] (row pitch ldx), W [out, in] (nn.Linear layout), y [rows, out]
// (row pitch ldy); b may be null. One OpenBLAS sgemm call.
#pragma once

#include <cstdint>

namespace attn::mha {

void linear(const float* x, std::int64_t rows, std::int64_t in, std::int64_t ldx, const float* w, std::int64_t out,
            const float* b, float* y, std::int64_t ldy);

// C [m, n] = op(A) op(B) + beta·C, row-major, op = transpose where asked (A is [k, m] when trans_a, else
// [m, k]; B is [n, k] when trans_b, else [k, n]). One OpenBLAS sgemm call; k = 0 gives beta·C.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

}  // namespace attn::mha
