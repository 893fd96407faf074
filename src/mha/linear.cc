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

}  // namespace attn::mha
