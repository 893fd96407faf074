// The tiled (FlashAttention-2 style) backward, written once over the SIMD wrapper (cpu/vec.h) and compiled
// per instruction set.
//
// Nothing of size Sq x Skv is ever held: for a tile of BR query rows and BC keys the probabilities are
// recomputed from Q, K and the row's statistics (P = e^(scale·QKᵀ + mask − m) · inv_l), and then
//   dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D)  with D_i = Σ_j P_ij dP_ij (= dO_i · O_i),
//   dK += dSᵀ Q,   dQ += dS K
// (the scale of dK and dQ is taken once, in dS).
//
// Sweeps over work items that own their outputs, so no atomics and no order that depends on the schedule:
// results are bitwise identical at every thread count.
//   0. the largest row norm of every query block and key tile (which decides the two choices below).
//   1. row_statistics, per (batch, query head, query block): m_i = the forward's LSE, and inv_l_i = 1,
//      D_i = dO_i · O_i; or, when some tile may have large logits, l_i and D_i from the scores recomputed
//      here (see there for why).
//   2. key_chunk, per (batch, KV head, chunk of keys): for each key block of the chunk, over the group's
//      query heads and query blocks in order: the five products above. dK and dV of the block are complete
//      when it ends and are stored; dQ is summed into the item's own rows: the caller's dQ itself (fp32, one
//      chunk) or an fp32 partial per chunk.
//   3. with partials only: dQ = Σ_chunks partial, the chunks in order. The number of chunks depends on the
//      shape only (never on the thread count), and is 1 unless B·Hkv alone gives too few items.
// Memory: per-thread tiles, the per-row statistics, and the partials (chunks x |dQ| in fp32) when there are
// any; never Sq x Skv.
//
// The five products are one register-blocked micro-kernel (gemm below): C[i][·] (+)= Σ_k A(i, k) · B[k][·]
// with B's rows in SIMD lanes and A read as broadcast scalars at any two strides, so Pᵀ and dSᵀ need no
// transpose. Scores, probabilities and every sum are fp32 (scores fp64 on tiles with large logits); the
// exponential is exp2v (vec.h). Tile sizes, micro-kernel shapes (4x4 and 8x2 vectors, 6x4), and a variant
// loading each query block once per 4 key blocks were measured here: none moved the time beyond the noise.
//
// Included by one translation unit per instruction set (src/cpu/backward_<isa>.cc) inside its
// `#pragma GCC target` region with ATTN_VEC_<ISA> defined, like flash_kernel.h.
#ifndef ATTN_ISA_NS
#error "define ATTN_ISA_NS (the per-ISA namespace) before including backward_kernel.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backward_problem.h"
#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "cpu/aligned.h"
#include "cpu/kernels.h"
#include "cpu/pick.h"

namespace attn::cpu::ATTN_ISA_NS::bwd {

#include "cpu/vec.h"

using V = Vec::T;
constexpr int W = Vec::W;
constexpr std::int64_t BR = 64;       // query rows per tile
constexpr std::int64_t BC = 64;       // keys per tile (a multiple of every W)
constexpr int GR = 4;                 // rows of C per micro-kernel step
constexpr int GV = W == 16 ? 4 : 2;   // vectors of C per micro-kernel step (GR x GV accumulators)

inline std::int64_t padded(std::int64_t dim) { return (dim + W - 1) / W * W; }

// ---- the micro-kernel ------------------------------------------------------------------------------------

// C[i][·] for rows i0 .. i0+R-1 and vectors n0 .. n0+CV-1: (ACC ? C : 0) + Σ_{k<kn} A(i, k) · B[k][·], with
// A(i, k) = a[i·a_row + k·a_k].
template <int R, int CV, bool ACC>
inline void gemm_step(const float* a, std::int64_t a_row, std::int64_t a_k, const float* b, std::int64_t b_row,
                      std::int64_t kn, float* c, std::int64_t c_row) {
  V acc[R][CV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < CV; ++v) acc[r][v] = ACC ? Vec::load(c + r * c_row + v * W) : Vec::zero();
  for (std::int64_t k = 0; k < kn; ++k) {
    V bv[CV];
    for (int v = 0; v < CV; ++v) bv[v] = Vec::load(b + k * b_row + v * W);
    for (int r = 0; r < R; ++r) {
      const V ab = Vec::set1(a[r * a_row + k * a_k]);
      for (int v = 0; v < CV; ++v) acc[r][v] = Vec::fmadd(ab, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < CV; ++v) Vec::store(c + r * c_row + v * W, acc[r][v]);
}

template <int R, bool ACC>
inline void gemm_rows(int cv, const float* a, std::int64_t a_row, std::int64_t a_k, const float* b,
                      std::int64_t b_row, std::int64_t kn, float* c, std::int64_t c_row) {
  static_assert(GV <= 4);
  switch (cv) {
    case 4: if constexpr (GV >= 4) gemm_step<R, 4, ACC>(a, a_row, a_k, b, b_row, kn, c, c_row); break;
    case 3: if constexpr (GV >= 3) gemm_step<R, 3, ACC>(a, a_row, a_k, b, b_row, kn, c, c_row); break;
    case 2: gemm_step<R, 2, ACC>(a, a_row, a_k, b, b_row, kn, c, c_row); break;
    default: gemm_step<R, 1, ACC>(a, a_row, a_k, b, b_row, kn, c, c_row); break;
  }
}

// C[i][0..n) (ACC ? += : =) Σ_{k<kn} A(i, k) · B[k][0..n) for rows i < m; n is a multiple of W.
// Every element's sum runs over k in order: the result does not depend on how rows are blocked.
template <bool ACC>
inline void gemm(std::int64_t m, std::int64_t n, std::int64_t kn, const float* a, std::int64_t a_row,
                 std::int64_t a_k, const float* b, std::int64_t b_row, float* c, std::int64_t c_row) {
  for (std::int64_t n0 = 0; n0 < n; n0 += GV * W) {
    const int cv = static_cast<int>(std::min<std::int64_t>(GV, (n - n0) / W));
    std::int64_t i = 0;
    for (; i + GR <= m; i += GR)
      gemm_rows<GR, ACC>(cv, a + i * a_row, a_row, a_k, b + n0, b_row, kn, c + i * c_row + n0, c_row);
    for (; i < m; ++i) gemm_rows<1, ACC>(cv, a + i * a_row, a_row, a_k, b + n0, b_row, kn, c + i * c_row + n0, c_row);
  }
}

// ---- loading (any storage dtype -> fp32) ---------------------------------------------------------------

// Rows [s0, s0 + rows) of head h as dst[r][0..dim) with row stride ld, zero elsewhere up to `pad` rows;
// returns the largest row norm.
template <class T>
float load_rows(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                std::int64_t pad, std::int64_t dim, std::int64_t ld, float* dst) {
  float norm2 = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* src = static_cast<const T*>(t.data) + t.offset(b, h, s0 + r, 0);
    float* out = dst + r * ld;
    float n2 = 0.0f;
    for (std::int64_t d = 0; d < dim; ++d) out[d] = core::to_float(src[d * t.stride[3]]), n2 += out[d] * out[d];
    std::fill(out + dim, out + ld, 0.0f);
    norm2 = std::max(norm2, n2);
  }
  std::fill(dst + rows * ld, dst + pad * ld, 0.0f);
  return std::sqrt(norm2);
}

// ---- per-thread tiles --------------------------------------------------------------------------------------

// All fp32 (the fp64 scores aside); row lengths padded to a multiple of W (Dkp, Dvp) with zeros.
struct Workspace {
  std::int64_t dkp, dvp;
  AlignedVector<float> qbuf, doutbuf;  // [BR][Dkp], [BR][Dvp]  query and dO rows, when not read in place
  const float* q = nullptr;            // the block's query rows, row stride ldq (qbuf or the caller's memory)
  const float* dout = nullptr;         // its dO rows, row stride ldo
  std::int64_t ldq = 0, ldo = 0;
  float qnorm = 0;                     // max_i ‖q_i‖ over the block
  AlignedVector<float> s;        // [BR][BC]   scores, then P
  AlignedVector<double> sd;      // [BR][BC]   fp64 scores (tiles with large logits)
  AlignedVector<float> ds;       // [BR][BC]   dP, then dS
  AlignedVector<float> kt, vt;   // [Dk][BC], [Dv][BC]  the key tile transposed (keys in lanes; zero past its keys)
  AlignedVector<float> kbuf;     // [BC][Dkp]  its key rows, when not read in place
  AlignedVector<float> dk, dv;   // [BC][Dkp], [BC][Dvp]  the key block's accumulators
  AlignedVector<float> l, pd;    // [BR][W]    row_statistics' per-lane sums
  float m[BR], inv_l[BR], d[BR];  // the rows' statistics (m = 0, inv_l = 0 for rows past the block)
  core::KeyRange range[BR];
  Workspace(std::int64_t dk_, std::int64_t dv_)
      : dkp(padded(dk_)), dvp(padded(dv_)), qbuf(BR * dkp), doutbuf(BR * dvp), s(BR * BC), sd(BR * BC),
        ds(BR * BC), kt(dk_ * BC), vt(dv_ * BC), kbuf(BC * dkp), dk(BC * dkp), dv(BC * dvp), l(BR * W),
        pd(BR * W) {}
};

// Per-row values the later sweeps read, [B, Hq, Sq] each: P_ij = e^(s_ij − m_i) · inv_l_i, and D_i; and the
// largest query norm of each query block, [B, Hq, Sq / BR].
struct RowStats {
  std::vector<float> m, inv_l, d, qnorm;
  std::vector<float> knorm;  // the largest key norm of each key tile, [B, Hkv, Skv / BC]
};

// Rows [s0, s0 + rows) of head h as fp32 rows: in place when the caller's are fp32 with unit stride and
// whole vectors, else converted into buf. Returns the largest row norm when `norm`.
template <class T>
float block_rows(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                 std::int64_t pad, std::int64_t dim, std::int64_t ldp, float* buf, const float** out, std::int64_t* ld,
                 bool norm = false) {
  if (std::is_same_v<T, float> && t.stride[3] == 1 && dim == ldp) {
    const float* base = static_cast<const float*>(t.data) + t.offset(b, h, s0, 0);
    float norm2 = 0.0f;
    for (std::int64_t r = 0; r < rows && norm; ++r) {
      V acc = Vec::zero();
      for (std::int64_t d = 0; d < dim; d += W) acc = Vec::fmadd(Vec::load(base + r * t.stride[2] + d),
                                                                  Vec::load(base + r * t.stride[2] + d), acc);
      norm2 = std::max(norm2, Vec::reduce_add(acc));
    }
    *out = base, *ld = t.stride[2];
    return std::sqrt(norm2);
  }
  *out = buf, *ld = ldp;
  return load_rows<T>(t, b, h, s0, rows, pad, dim, ldp, buf);
}

// Query rows [i0, i0 + rows) of head h: Q, dO, each row's key range and (when stats is given) its statistics.
template <class QT>
void load_query_block(const core::BackwardProblem& bp, const RowStats& stats, bool with_stats, std::int64_t b,
                      std::int64_t h, std::int64_t i0, std::int64_t rows, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  block_rows<QT>(p.q, b, h, i0, rows, BR, p.Dk, ws.dkp, ws.qbuf.data(), &ws.q, &ws.ldq);
  block_rows<QT>(bp.dout, b, h, i0, rows, BR, p.Dv, ws.dvp, ws.doutbuf.data(), &ws.dout, &ws.ldo);
  ws.qnorm = stats.qnorm[static_cast<std::size_t>((b * p.Hq + h) * ((p.Sq + BR - 1) / BR) + i0 / BR)];
  for (std::int64_t r = 0; r < BR; ++r) {
    ws.m[r] = 0.0f, ws.inv_l[r] = 0.0f, ws.d[r] = 0.0f, ws.range[r] = {0, 0};
    if (r >= rows) continue;
    ws.range[r] = core::key_range(p, b, i0 + r);
    if (!with_stats) continue;
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    ws.m[r] = stats.m[row], ws.inv_l[r] = stats.inv_l[row], ws.d[r] = stats.d[row];
  }
}

// The key tile [j0, j0 + cols) of KV head hk in the layouts the tile steps read: Kᵀ and Vᵀ (keys in lanes:
// S = Q Kᵀ, dP = dO Vᵀ) and K rows (dQ += dS K), and the largest key norm of the tile (from sweep 0).
struct KeyTile {
  const float* kt;  // [Dk][BC]
  const float* vt;  // [Dv][BC]
  const float* k;   // rows, row stride ldk
  std::int64_t ldk;
  float knorm;
};

template <class KVT>
KeyTile load_key_tile(const core::Problem& p, const std::vector<float>& knorms, std::int64_t b, std::int64_t hk,
                      std::int64_t j0, std::int64_t cols, Workspace& ws) {
  KeyTile kt{ws.kt.data(), ws.vt.data(), nullptr, 0, 0.0f};
  block_rows<KVT>(p.k, b, hk, j0, cols, BC, p.Dk, ws.dkp, ws.kbuf.data(), &kt.k, &kt.ldk);
  std::fill(ws.kt.begin(), ws.kt.end(), 0.0f);
  std::fill(ws.vt.begin(), ws.vt.end(), 0.0f);
  for (std::int64_t c = 0; c < cols; ++c) {
    const KVT* v = static_cast<const KVT*>(p.v.data) + p.v.offset(b, hk, j0 + c, 0);
    for (std::int64_t d = 0; d < p.Dk; ++d) ws.kt[d * BC + c] = kt.k[c * kt.ldk + d];
    for (std::int64_t d = 0; d < p.Dv; ++d) ws.vt[d * BC + c] = core::to_float(v[d * p.v.stride[3]]);
  }
  kt.knorm = knorms[static_cast<std::size_t>((b * p.Hkv + hk) * ((p.Skv + BC - 1) / BC) + j0 / BC)];
  return kt;
}

// ---- the tile steps ------------------------------------------------------------------------------------

// Above this bound on |scale·q·k| over a tile, scores are formed in fp64. An fp32 dot product is as good as
// a naive fp32 backward's (errors ~ ε·scale·‖q‖‖k‖ in the logit), but with large logits softmax rows are
// near one-hot and the few near-tied rows decide the largest gradient error, so which of two equally
// rounded computations wins is luck: the registry's large-logit cases (|logit| ~ 10^3 to 10^4) measured
// 5-20x a naive backward's error with fp32 scores, within the rule with fp64 ones. Ordinary inputs (P1, P2,
// unit-scale activations: bound ~ 4) never come near it.
constexpr float kWideLogits = 256.0f;

// S = Q Kᵀ (unscaled dot products) [BR][BC] in fp32, or in fp64 into ws.sd when the tile's logits are large.
// Returns whether it took fp64.
inline bool scores(const core::Problem& p, std::int64_t rows, const KeyTile& kt, Workspace& ws) {
  if (static_cast<float>(p.scale) * ws.qnorm * kt.knorm <= kWideLogits) {
    gemm<false>(rows, BC, p.Dk, ws.q, ws.ldq, 1, kt.kt, BC, ws.s.data(), BC);
    return false;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    double acc[BC] = {};
    for (std::int64_t d = 0; d < p.Dk; ++d) {
      const double x = ws.q[r * ws.ldq + d];
      for (std::int64_t c = 0; c < BC; ++c) acc[c] += x * kt.kt[d * BC + c];
    }
    std::copy(acc, acc + BC, ws.sd.data() + r * BC);
  }
  return true;
}

// dP = dO Vᵀ  [BR][BC]
inline void dprobs(const core::Problem& p, std::int64_t rows, const KeyTile& kt, const Workspace& ws, float* dp) {
  gemm<false>(rows, BC, p.Dv, ws.dout, ws.ldo, 1, kt.vt, BC, dp, BC);
}

// P = e^(scale·S + mask − m) · inv_l in ws.s, for the block's rows; 0 for keys a row may not see and for rows
// past the block (inv_l = 0). Tiles every row sees whole, without a dense mask, take the vector path; the
// others form each exponent key by key (in fp64 from ws.sd when `wide`).
template <class DenseMask>
void probabilities(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols, bool wide, Workspace& ws) {
  bool interior = !DenseMask::kActive && !wide && cols == BC;
  for (std::int64_t r = 0; r < rows && interior; ++r) interior = ws.range[r].lo <= j0 && j0 + BC <= ws.range[r].hi;
  const float scale_f = static_cast<float>(p.scale);
  const V log2e = Vec::set1(static_cast<float>(core::kLog2e)), scale = Vec::set1(scale_f);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = ws.s.data() + r * BC;
    V neg_m = Vec::set1(-ws.m[r]);
    if (!interior) {  // the exponent key by key, −inf where the row may not look
      const auto mask = DenseMask::row(p, b, h, i0 + r);
      for (std::int64_t c = 0; c < BC; ++c) {
        const std::int64_t j = j0 + c;
        float x = core::kNegInf;
        if (c < cols && j >= ws.range[r].lo && j < ws.range[r].hi) {
          if (wide) {
            x = static_cast<float>(ws.sd[r * BC + c] * p.scale + mask.bias(j) - ws.m[r]);
          } else {  // rounded as the vector path rounds: scale·s, then + mask, then − m below
            x = row[c] * scale_f;
            if constexpr (DenseMask::kActive) x += mask.bias(j);
          }
        }
        row[c] = x;
      }
      if (wide) neg_m = Vec::zero();
    }
    const V inv_l = Vec::set1(ws.inv_l[r]);
    for (std::int64_t c = 0; c < BC; c += W) {
      const V t = interior ? Vec::mul(Vec::load(row + c), scale) : Vec::load(row + c);
      Vec::store(row + c, Vec::mul(exp2v(Vec::mul(Vec::add(t, neg_m), log2e)), inv_l));
    }
  }
}

// scale · dS = scale · P ∘ (dP − D), in place over dP (the scale of dK = scale · dSᵀ Q and dQ = scale · dS K
// taken once here).
inline void dscores(const float* pt, std::int64_t rows, const float* d, float scale, float* ds) {
  const V sc = Vec::set1(scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    const V neg_d = Vec::set1(-d[r]);
    for (std::int64_t c = 0; c < BC; c += W)
      Vec::store(ds + r * BC + c, Vec::mul(Vec::mul(Vec::load(pt + r * BC + c), sc),
                                           Vec::add(Vec::load(ds + r * BC + c), neg_d)));
  }
}

// acc[c][·] (+)= Σ_r w[r][c] · x[r][·] over the tile's keys c and the block's rows r  (dV += Pᵀ dO, dK += dSᵀ Q);
// `add` false on the first term (instead of zeroing acc first).
inline void cols_times_rows(const float* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx,
                            std::int64_t n, float* acc, bool add) {
  if (add) gemm<true>(cols, n, rows, w, 1, BC, x, ldx, acc, n);
  else gemm<false>(cols, n, rows, w, 1, BC, x, ldx, acc, n);
}

// acc[r][·] (+)= Σ_c w[r][c] · x[c][·]   (dQ += dS K)
inline void rows_times_rows(const float* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx,
                            std::int64_t n, float* acc, std::int64_t ldacc, bool add) {
  if (add) gemm<true>(rows, n, cols, w, BC, 1, x, ldx, acc, ldacc);
  else gemm<false>(rows, n, cols, w, BC, 1, x, ldx, acc, ldacc);
}

// Per-row sums of one tile: l += Σ_c P̃, pd += Σ_c P̃ · dP, lane by lane (reduced in row_statistics).
inline void row_sums(const float* pt, const float* dp, std::int64_t rows, float* l, float* pd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    V lv = Vec::load(l + r * W), pv = Vec::load(pd + r * W);
    for (std::int64_t c = 0; c < BC; c += W) {
      const V pw = Vec::load(pt + r * BC + c);
      lv = Vec::add(lv, pw);
      pv = Vec::fmadd(pw, Vec::load(dp + r * BC + c), pv);
    }
    Vec::store(l + r * W, lv), Vec::store(pd + r * W, pv);
  }
}

// ---- the sweeps --------------------------------------------------------------------------------------

// The keys some row of the block [i0, i0 + rows) sees lie in [first.lo, last.hi): both ends are
// non-decreasing in the row.
inline core::KeyRange block_keys(const core::Problem& p, std::int64_t b, std::int64_t i0, std::int64_t rows) {
  return {core::key_range(p, b, i0).lo, core::key_range(p, b, i0 + rows - 1).hi};
}

// Sweep 1, the statistics of query rows [i0, i0 + rows) of head h. Always m_i = the forward's LSE (an upper
// bound of every score: no max pass, no overflow). Then either, from the forward alone,
//   inv_l_i = 1 and D_i = dO_i · O_i   (FlashAttention-2's; two cheap row reads), or, when `exact`,
//   inv_l_i = 1 / Σ_j e^(s_ij − m_i) and D_i = Σ_j P_ij dP_ij, from the scores recomputed here.
// The forward rounded its scores differently (another summation order, another tiling), and its LSE is
// fp32. With ordinary logits that is noise. With large ones (|s| ~ 10^3 and more) an fp32 LSE is only good to
// ~10^-4, so e^(s − lse_forward) does not sum to 1, and D = dO · O_forward does not match P and dP;
// dS = P ∘ (dP − D) turns either into gradient error far above a naive fp32 backward's. Normalising by l and
// taking D from the same P̃ and dP the next sweep recomputes (the same operations on the same tiles, bit for
// bit) keeps Σ_j dS_ij = 0 up to rounding, at the cost of two more products per tile. flash_backward asks
// for it exactly when some tile may have large logits (kWideLogits).
template <class QT, class KVT, class DenseMask>
void row_statistics(const core::BackwardProblem& bp, bool exact, std::int64_t b, std::int64_t h, std::int64_t i0,
                    std::int64_t rows, Workspace& ws, RowStats& stats) {
  const core::Problem& p = bp.fwd;
  const auto* saved = static_cast<const float*>(p.lse->data);
  load_query_block<QT>(bp, stats, false, b, h, i0, rows, ws);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float lse = saved[p.lse->offset(b, h, i0 + r, 0)];
    ws.m[r] = lse == core::kNegInf ? 0.0f : lse;
    ws.inv_l[r] = lse == core::kNegInf ? 0.0f : 1.0f;
  }
  if (!exact) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
      const QT* o = static_cast<const QT*>(p.out.data) + p.out.offset(b, h, i0 + r, 0);
      const float* g = ws.dout + r * ws.ldo;
      double d = 0;
      for (std::int64_t e = 0; e < p.Dv; ++e) d += static_cast<double>(g[e]) * core::to_float(o[e * p.out.stride[3]]);
      stats.m[row] = ws.m[r];
      stats.inv_l[row] = ws.inv_l[r];
      stats.d[row] = ws.inv_l[r] > 0.0f ? static_cast<float>(d) : 0.0f;
    }
    return;
  }
  std::fill(ws.l.begin(), ws.l.end(), 0.0f);
  std::fill(ws.pd.begin(), ws.pd.end(), 0.0f);
  const core::KeyRange keys = block_keys(p, b, i0, rows);
  // Key tiles on the grid of BC that sweep 2 uses, so each score is formed the same way in both.
  for (std::int64_t j0 = keys.lo / BC * BC; j0 < keys.hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, p.Skv - j0);
    const KeyTile kt = load_key_tile<KVT>(p, stats.knorm, b, h / p.group, j0, cols, ws);
    const bool wide = scores(p, rows, kt, ws);                                   // S = Q Kᵀ
    probabilities<DenseMask>(p, b, h, i0, rows, j0, cols, wide, ws);             // P̃ = e^(scale·S + mask − m)
    dprobs(p, rows, kt, ws, ws.ds.data());                                       // dP = dO Vᵀ
    row_sums(ws.s.data(), ws.ds.data(), rows, ws.l.data(), ws.pd.data());        // l += Σ P̃, pd += Σ P̃ dP
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    const float l = Vec::reduce_add(Vec::load(ws.l.data() + r * W));
    const float pd = Vec::reduce_add(Vec::load(ws.pd.data() + r * W));
    const bool seen = ws.inv_l[r] > 0.0f && l > 0.0f;
    stats.m[row] = ws.m[r];
    stats.inv_l[row] = seen ? 1.0f / l : 0.0f;
    stats.d[row] = seen ? pd / l : 0.0f;
  }
}

template <class T>
void store_rows(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                std::int64_t dim, const float* src, std::int64_t ld, float factor) {
  T* base = static_cast<T*>(const_cast<void*>(t.data));
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dst = base + t.offset(b, h, s0 + r, 0);
    for (std::int64_t d = 0; d < dim; ++d) dst[d * t.stride[3]] = core::from_float<T>(src[r * ld + d] * factor);
  }
}

// How the keys are cut into chunks (sweep 2's items are (batch, KV head, chunk)). Shape only.
struct Plan {
  std::int64_t chunks = 1, chunk_len = 0, items = 0;
  explicit Plan(const core::Problem& p) {
    constexpr std::int64_t kMinItems = 8, kMinChunkKeys = 4 * BC;
    const std::int64_t heads = std::max<std::int64_t>(p.B * p.Hkv, 1);
    if (heads < kMinItems && p.Skv >= 2 * kMinChunkKeys)
      chunks = std::min((kMinItems + heads - 1) / heads, p.Skv / kMinChunkKeys);
    chunk_len = std::max<std::int64_t>((p.Skv + chunks - 1) / chunks + BC - 1, BC) / BC * BC;
    chunks = std::max<std::int64_t>((p.Skv + chunk_len - 1) / chunk_len, 1);
    items = p.B * p.Hkv * chunks;
  }
};

// Where sweep 2 adds dQ: row i of the group's head g at base + g·hs + i·rs (fp32, Dkp wide).
struct DqTarget {
  float* base;
  std::int64_t hs, rs;
};

// Sweep 2: keys [k_lo, k_hi) of KV head hk. Per key block: over the group's query heads (in order) and every
// query block whose rows see the block (in order), the tile steps; then the block's dK and dV are stored.
// dQ is added into dqt (this item's own rows); `written` marks its query blocks holding a sum already (the
// first term of a block is stored, not added: nothing needs zeroing first).
template <class QT, class KVT, class DenseMask>
void key_chunk(const core::BackwardProblem& bp, const RowStats& stats, std::int64_t b, std::int64_t hk,
               std::int64_t k_lo, std::int64_t k_hi, const DqTarget& dqt, std::vector<char>& written, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  const std::int64_t dkp = ws.dkp, dvp = ws.dvp, qblocks = (p.Sq + BR - 1) / BR;
  const float scale = static_cast<float>(p.scale);
  float* dk = ws.dk.data();
  float* dv = ws.dv.data();
  for (std::int64_t j0 = k_lo; j0 < k_hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, k_hi - j0);
    bool add = false;  // dK and dV of this key block hold a sum
    if (j0 < p.kv_len[static_cast<std::size_t>(b)]) {
      const KeyTile kt = load_key_tile<KVT>(p, stats.knorm, b, hk, j0, cols, ws);
      for (std::int64_t g = 0; g < p.group; ++g) {
        const std::int64_t h = hk * p.group + g;
        for (std::int64_t i0 = 0; i0 < p.Sq; i0 += BR) {
          const std::int64_t rows = std::min(BR, p.Sq - i0);
          const core::KeyRange keys = block_keys(p, b, i0, rows);
          if (keys.lo >= j0 + cols || keys.hi <= j0 || keys.hi <= keys.lo) continue;
          float* dq = dqt.base + g * dqt.hs + i0 * dqt.rs;
          char& dq_add = written[static_cast<std::size_t>(g * qblocks + i0 / BR)];
          load_query_block<QT>(bp, stats, true, b, h, i0, rows, ws);
          const bool wide = scores(p, rows, kt, ws);                                    // S = Q Kᵀ
          probabilities<DenseMask>(p, b, h, i0, rows, j0, cols, wide, ws);              // P
          dprobs(p, rows, kt, ws, ws.ds.data());                                        // dP = dO Vᵀ
          dscores(ws.s.data(), rows, ws.d, scale, ws.ds.data());                        // dS = scale·P ∘ (dP − D)
          cols_times_rows(ws.s.data(), rows, cols, ws.dout, ws.ldo, dvp, dv, add);      // dV += Pᵀ dO
          cols_times_rows(ws.ds.data(), rows, cols, ws.q, ws.ldq, dkp, dk, add);        // dK += dSᵀ Q
          rows_times_rows(ws.ds.data(), rows, cols, kt.k, kt.ldk, dkp, dq, dqt.rs, dq_add);  // dQ += dS K
          add = true, dq_add = 1;
        }
      }
    }
    if (!add) {  // no query sees these keys
      std::fill(dk, dk + BC * dkp, 0.0f);
      std::fill(dv, dv + BC * dvp, 0.0f);
    }
    store_rows<KVT>(bp.dk, b, hk, j0, cols, p.Dk, dk, dkp, 1.0f);
    store_rows<KVT>(bp.dv, b, hk, j0, cols, p.Dv, dv, dvp, 1.0f);
  }
}

template <class QT, class KVT, class DenseMask>
void flash_backward(const core::BackwardProblem& bp, int threads) {
  const core::Problem& p = bp.fwd;
  const std::int64_t dkp = padded(p.Dk);
  const Plan plan(p);
  const std::int64_t kblocks = (p.Skv + BC - 1) / BC, tiles = p.B * p.Hkv * kblocks;
  const std::int64_t qblocks = (p.Sq + BR - 1) / BR, q_items = p.B * p.Hq * qblocks;
  const auto nrows = static_cast<std::size_t>(p.B * p.Hq * p.Sq);
  RowStats stats{std::vector<float>(nrows), std::vector<float>(nrows), std::vector<float>(nrows),
                 std::vector<float>(static_cast<std::size_t>(q_items)),
                 std::vector<float>(static_cast<std::size_t>(tiles))};
  // Sweep 0: the largest row norm of every query block and key tile.
#pragma omp parallel num_threads(threads) if (tiles + q_items > 1)
  {
    Workspace ws(p.Dk, p.Dv);
    const float* rows_at;
    std::int64_t ld;
#pragma omp for schedule(static) nowait
    for (std::int64_t t = 0; t < tiles; ++t) {
      const std::int64_t kb = t % kblocks, hk = (t / kblocks) % p.Hkv, b = t / (kblocks * p.Hkv);
      stats.knorm[static_cast<std::size_t>(t)] = block_rows<KVT>(
          p.k, b, hk, kb * BC, std::min(BC, p.Skv - kb * BC), BC, p.Dk, ws.dkp, ws.kbuf.data(), &rows_at, &ld, true);
    }
#pragma omp for schedule(static)
    for (std::int64_t it = 0; it < q_items; ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      stats.qnorm[static_cast<std::size_t>(it)] = block_rows<QT>(
          p.q, b, h, qb * BR, std::min(BR, p.Sq - qb * BR), BR, p.Dk, ws.dkp, ws.qbuf.data(), &rows_at, &ld, true);
    }
  }
  // The exact statistics only when some tile may have large logits.
  const float qmax = q_items ? *std::max_element(stats.qnorm.begin(), stats.qnorm.end()) : 0.0f;
  const float kmax = tiles ? *std::max_element(stats.knorm.begin(), stats.knorm.end()) : 0.0f;
  const bool exact = static_cast<float>(p.scale) * qmax * kmax > kWideLogits;
  // dQ: with one chunk per KV head and fp32 rows of whole vectors, summed in place in the caller's dQ (each
  // item owns its heads' rows); else in fp32 partials [chunk][B][Hq][Sq][Dkp] that sweep 3 adds up.
  const bool in_place = plan.chunks == 1 && std::is_same_v<QT, float> && bp.dq.stride[3] == 1 && p.Dk == dkp;
  const std::int64_t part_len = in_place ? 0 : p.B * p.Hq * p.Sq * dkp;
  std::vector<float> dq_part(static_cast<std::size_t>(plan.chunks * part_len));
#pragma omp parallel num_threads(threads) if (plan.items + q_items > 1)
  {
    Workspace ws(p.Dk, p.Dv);
    std::vector<char> written(static_cast<std::size_t>(p.group * qblocks));
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < q_items; ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      const std::int64_t i0 = qb * BR;
      row_statistics<QT, KVT, DenseMask>(bp, exact, b, h, i0, std::min(BR, p.Sq - i0), ws, stats);
    }
    // (implicit barrier: the statistics are complete before sweep 2 reads them)
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < plan.items; ++it) {
      const std::int64_t c = it % plan.chunks, hk = (it / plan.chunks) % p.Hkv, b = it / (plan.chunks * p.Hkv);
      const std::int64_t h0 = hk * p.group;
      DqTarget dqt{dq_part.data() + c * part_len + (b * p.Hq + h0) * p.Sq * dkp, p.Sq * dkp, dkp};
      if (in_place)
        dqt = {static_cast<float*>(const_cast<void*>(bp.dq.data)) + bp.dq.offset(b, h0, 0, 0), bp.dq.stride[1],
               bp.dq.stride[2]};
      std::fill(written.begin(), written.end(), 0);
      key_chunk<QT, KVT, DenseMask>(bp, stats, b, hk, c * plan.chunk_len, std::min(p.Skv, (c + 1) * plan.chunk_len),
                                    dqt, written, ws);
      for (std::int64_t g = 0; g < p.group; ++g)  // query blocks that saw none of the chunk's keys
        for (std::int64_t qb = 0; qb < qblocks; ++qb)
          if (!written[static_cast<std::size_t>(g * qblocks + qb)])
            for (std::int64_t i = qb * BR; i < std::min(p.Sq, (qb + 1) * BR); ++i)
              std::fill_n(dqt.base + g * dqt.hs + i * dqt.rs, dkp, 0.0f);
    }
    // Sweep 3 (partials only): dQ = scale · Σ_chunks partial, per query block, chunks in order.
#pragma omp for schedule(static)
    for (std::int64_t it = 0; it < (in_place ? 0 : q_items); ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      const std::int64_t i0 = qb * BR, rows = std::min(BR, p.Sq - i0);
      float* sum = dq_part.data() + ((b * p.Hq + h) * p.Sq + i0) * dkp;
      for (std::int64_t c = 1; c < plan.chunks; ++c)
        for (std::int64_t e = 0; e < rows * dkp; ++e) sum[e] += sum[c * part_len + e];
      store_rows<QT>(bp.dq, b, h, i0, rows, p.Dk, sum, dkp, 1.0f);
    }
  }
}

// The backward kernel of this instruction set for the given dtypes and dense-mask kind, or null (cpu/pick.h).
template <class QT, class KVT, class DenseMask>
struct BackwardKernel {
  static constexpr BackwardFn fn = &flash_backward<QT, KVT, DenseMask>;
};
inline BackwardFn pick_backward(DType q, DType kv, core::MaskKind mask) {
  return pick_kernel<BackwardFn, BackwardKernel>(q, kv, mask);
}

}  // namespace attn::cpu::ATTN_ISA_NS::bwd
