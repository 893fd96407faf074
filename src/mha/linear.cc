#include "mha/linear.h"

#include <cblas.h>

#include <algorithm>

namespace attn::mha {

void linear(const float* x, std::int64_t rows, std::int64_t in, std::int64_t ldx, const float* w, std::int64_t out,
            const float* b, float* y, std::int64_t ldy) {
  if (rows == 0 || out == 0) return;
  if (b)
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(b, out, y + r * ldy);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), static_cast<blasint>(out),
              static_cast<blasint>(in), 1.0f, x, static_cast<blasint>(ldx), w, static_cast<blasint>(in), b ? 1.0f : 0.0f,
              y, static_cast<blasint>(ldy));
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace attn::mha
