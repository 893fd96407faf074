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

// The loops over the accumulators outside the k loop are unrolled by force: GCC 12 left them rolled for R x CV = 24
// (6 x 4, the forward's Sᵀ step at avx512), with first and last tested inside, and so kept all 24 accumulators and
// one B vector on the stack (stored and reloaded every chunk, one B operand read from memory by six FMAs a step).
// Unrolled, they stay in registers at any block size (with the chunks of Dk outermost in the forward's scores,
// flash_kernel.h, the Sᵀ product alone, bench/micro/products.cc at Dk = 128 on 1 thread of a Cascade Lake Xeon, went
// from 42-45 to 79-116 GFLOP/s), and the backward's products step 6 x 4 too (backward_kernel.h, GR). (Calling a chunk
// function of its own from this loop instead ran the backward's 4 x 4 blocks of the time 3-8 % slower.)

// k_begin > 0 (a multiple of KC): the sums over k in [k_begin, kn) only, added to C as the chunks after the first
// are (the forward's scores run the chunks of Dk outermost, a call per chunk: see flash_kernel.h's scores).
// ScaleOut: the last chunk's sums are stored times *out_scale, read as they are stored. (Passed as a vector, the
// factor stayed in a register through the k loop: with 24 accumulators, 4 B vectors and the broadcast, GCC 12 then
// kept one B vector on the stack, stored every step and read back by six FMAs; the forward's last score chunk ran
// 15 % slower than its others, at avx512 on a Zen 4.)
template <int R, int CV, mk::Init I, bool ScaleOut, int KC = 0, class A>
inline void mma(const A& a, const float* b, std::int64_t b_row, std::int64_t kn, float* c, std::int64_t c_row,
                const Vec::T* alpha = nullptr, const float* out_scale = nullptr, std::int64_t k_begin = 0) {
  const std::int64_t step = KC > 0 ? KC : kn;
  std::int64_t k0 = k_begin;
  do {
    const std::int64_t k1 = std::min(kn, k0 + step);
    const bool first = k0 == 0, last = k1 >= kn;
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
        if (ScaleOut && last) x = Vec::mul(x, Vec::set1(*out_scale));
        Vec::store(c + r * c_row + v * Vec::W, x);
      }
    k0 = k1;
  } while (k0 < kn);
}
