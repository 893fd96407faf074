// The one register-blocked micro-kernel of the vector kernels (a kernel body: included by cpu/flash_kernel.h
// inside its instruction set's namespace, after cpu/vec.h). For R rows and CV vectors of W lanes,
//   C[r][v] = init(r, v) + Σ_{k<kn} A(r, k) · B[k][v]          (then, optionally, times a factor as it is stored)
// with B's rows in SIMD lanes and A read as broadcast scalars through an operand-access policy. The forward's
// Sᵀ = K Qᵀ (A = K rows through their pointers, B = Qᵀ), its Oᵀ = α·Oᵀ + Vᵀ Pᵀ (A = V rows indexed by key,
// B = Pᵀ) and the backward's five products (A at any two strides) are all this loop. Every element's sum runs
// over k in order (in chunks of KC, see mma), so how rows and vectors are blocked never changes a bit.

// Operand-access policies: A(r, k) for the block's rows r < R.
namespace mk {
// A(r, k) = rows[r0 + r][k]: one row per pointer (the forward's K rows: A(c, d) = K[c][d]).
struct RowPtrs {
  const float* const* rows;
  std::int64_t r0;
  float at(int r, std::int64_t k) const { return rows[r0 + r][k]; }
};
// A(r, k) = rows[k][c0 + r]: the rows indexed by k, column c0 + r of each (the forward's V rows: A(d, c) = V[c][d]).
struct RowsByK {
  const float* const* rows;
  std::int64_t c0;
  float at(int r, std::int64_t k) const { return rows[k][c0 + r]; }
};
// A(r, k) = a[r·row + k·step] (the backward's rows and columns of P, dS, Q, dO, K, V).
struct Strided {
  const float* a;
  std::int64_t row, step;
  float at(int r, std::int64_t k) const { return a[r * row + k * step]; }
};
enum class Init { zero, load, load_scaled };  // C starts at 0, at C, or at α[v]·C
}  // namespace mk

// Sums over long k run in chunks of KC (KC > 0): each chunk's chain of fused multiply-adds starts from zero, and
// the chunks' sums are added in order through C, so a sum of kn terms carries the rounding of about KC + kn/KC
// additions instead of kn: one chain's error grows with its running sum, and a sequential fp32 chain of 256
// products (Dk = 256 scores) measured 2-4x the error of a blocked one (as BLAS and the GPU's tensor cores sum).
inline constexpr int kDotChunk = 32;  // the chunk of the dot products' sums over a head dimension

// One chunk of the sums: k in [k0, k1), the chunk's own chain of fused multiply-adds from zero, then added to C
// (first: C is not read; Init decides what C starts at) and, for the last chunk, times out_scale as it is stored.
// The loops over the accumulators are fully unrolled (GCC 12 left the two outside the k loop rolled, with first and
// last tested in them, so the R x CV accumulators went through the stack on every chunk; unrolled, they stay
// in registers, and the Sᵀ product alone ran 1.12-1.13x as fast on a Cascade Lake Xeon).
template <int R, int CV, mk::Init I, bool ScaleOut, class A>
inline void mma_chunk(const A& a, const float* b, std::int64_t b_row, std::int64_t k0, std::int64_t k1, bool first,
                      bool last, float* c, std::int64_t c_row, const Vec::T* alpha, Vec::T out_scale) {
  Vec::T acc[R][CV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < CV; ++v) {
      if (!first || I == mk::Init::zero) acc[r][v] = Vec::zero();
      else if constexpr (I == mk::Init::load) acc[r][v] = Vec::load(c + r * c_row + v * Vec::W);
      else acc[r][v] = Vec::mul(Vec::load(c + r * c_row + v * Vec::W), alpha[v]);
    }
  for (std::int64_t k = k0; k < k1; ++k) {
    Vec::T bv[CV];
    for (int v = 0; v < CV; ++v) bv[v] = Vec::load(b + k * b_row + v * Vec::W);
    for (int r = 0; r < R; ++r) {
      const Vec::T ab = Vec::set1(a.at(r, k));
      for (int v = 0; v < CV; ++v) acc[r][v] = Vec::fmadd(ab, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < CV; ++v) {
      Vec::T x = first ? acc[r][v] : Vec::add(acc[r][v], Vec::load(c + r * c_row + v * Vec::W));
      if (ScaleOut && last) x = Vec::mul(x, out_scale);
      Vec::store(c + r * c_row + v * Vec::W, x);
    }
}

template <int R, int CV, mk::Init I, bool ScaleOut, int KC = 0, class A>
inline void mma(const A& a, const float* b, std::int64_t b_row, std::int64_t kn, float* c, std::int64_t c_row,
                const Vec::T* alpha = nullptr, Vec::T out_scale = Vec::zero()) {
  const std::int64_t step = KC > 0 ? KC : kn;
  std::int64_t k0 = 0;
  do {
    const std::int64_t k1 = std::min(kn, k0 + step);
    mma_chunk<R, CV, I, ScaleOut>(a, b, b_row, k0, k1, k0 == 0, k1 >= kn, c, c_row, alpha, out_scale);
    k0 = k1;
  } while (k0 < kn);
}
