// The tiled (FlashAttention-2 style) backward, written once in portable C++ and compiled per instruction set.
//
// Nothing of size Sq x Skv is ever held: for a tile of BR query rows and BC keys the probabilities are
// recomputed from Q, K and the row's LSE (P = e^(scale·QKᵀ + mask − LSE)), and then
//   dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D)  with D_i = Σ_j P_ij dP_ij (= dO_i · O_i),
//   dK += dSᵀ Q,   dQ += dS K
// (dK and dQ are multiplied by the scale once, when stored). A first sweep over the query blocks refines
// each row's LSE and takes D from the scores recomputed here (see row_statistics for why).
//
// Determinism: every output element is owned by exactly one work item, which sums its terms in a fixed
// order, so results are bitwise identical at every thread count and schedule. dK and dV are computed per
// (batch, KV head, key block), looping over the group's query heads and all query blocks; dQ is computed in
// a separate sweep per (batch, query head, query block), recomputing P and dS. No atomics, no reductions
// across threads. Tiles the causal mask, the window or the key length hide are skipped whole.
//
// The tile steps are small loops over fp32 rows with unit stride (matrix products as rank-1 updates, so the
// compiler vectorises the inner loop without reassociating any sum). Included by one translation unit per
// instruction set (src/cpu/backward_<isa>.cc) inside its `#pragma GCC target` region, like flash_kernel.h.
#ifndef ATTN_ISA_NS
#error "define ATTN_ISA_NS (the per-ISA namespace) before including backward_kernel.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backward_problem.h"
#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "cpu/kernels.h"

namespace attn::cpu::ATTN_ISA_NS::bwd {

constexpr std::int64_t BR = 32;  // query rows per tile
constexpr std::int64_t BC = 64;  // keys per tile

// Per-thread scratch, all fp32 with unit stride.
struct Workspace {
  std::vector<float> q;     // [BR][Dk]  query rows
  std::vector<float> dout;  // [BR][Dv]  dO rows
  std::vector<float> k;     // [BC][Dk]  key rows
  std::vector<float> kt;    // [Dk][BC]  keys transposed (zero past the tile's keys)
  std::vector<float> vt;    // [Dv][BC]  values transposed
  std::vector<double> s;    // [BR][BC]  scores (unscaled dot products)
  std::vector<float> p;     // [BR][BC]  probabilities
  std::vector<float> ds;    // [BR][BC]  dP, then dS
  std::vector<float> acc_a, acc_b;  // dK [BC][Dk] and dV [BC][Dv], or dQ [BR][Dk]
  double lse[BR];  // the row's log-sum-exp (the forward's, refined by row_statistics)
  float d[BR];
  core::KeyRange range[BR];
  Workspace(std::int64_t dk, std::int64_t dv)
      : q(BR * dk), dout(BR * dv), k(BC * dk), kt(dk * BC), vt(dv * BC), s(BR * BC), p(BR * BC), ds(BR * BC),
        acc_a(std::max(BC, BR) * dk), acc_b(BC * dv) {}
};

// ---- loading (any storage dtype -> fp32) -------------------------------------------------------------

// Rows [s0, s0 + rows) of head h as dst[r][0..dim), zero rows up to `pad` rows.
template <class T>
void load_rows(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
               std::int64_t pad, std::int64_t dim, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* src = static_cast<const T*>(t.data) + t.offset(b, h, s0 + r, 0);
    for (std::int64_t d = 0; d < dim; ++d) dst[r * dim + d] = core::to_float(src[d * t.stride[3]]);
  }
  std::fill(dst + rows * dim, dst + pad * dim, 0.0f);
}

// The same rows transposed: dst[d][r], BC columns, zero past `rows`.
inline void transpose_tile(const float* rows_in, std::int64_t rows, std::int64_t dim, float* dst) {
  std::fill(dst, dst + dim * BC, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < dim; ++d) dst[d * BC + r] = rows_in[r * dim + d];
}

// ---- the tile steps ------------------------------------------------------------------------------------

// c[r][0..BC) = Σ_d a[r][d] · bt[d][0..BC), accumulated in Acc   (S = Q Kᵀ in double, dP = dO Vᵀ in fp32)
//
// The scores are accumulated and kept in double: with large logits (|s| ~ 10^4) an fp32 score is only good
// to ~5·10^-4, and P = e^(s − lse) turns that into a relative error of the same size in a near-tie row, where
// dQ and dK are most sensitive; the registry's large-logit cases measured 5-20x a naive fp32 backward's error
// with fp32 scores, within the rule with double ones.
template <class Acc, class Out>
inline void rows_times_cols(const float* a, std::int64_t rows, std::int64_t inner, const float* bt, Out* c) {
  for (std::int64_t r = 0; r < rows; ++r) {
    Acc acc[BC] = {};
    for (std::int64_t d = 0; d < inner; ++d) {
      const Acc x = a[r * inner + d];
      const float* bt_row = bt + d * BC;
      for (std::int64_t j = 0; j < BC; ++j) acc[j] += x * static_cast<Acc>(bt_row[j]);
    }
    std::copy(acc, acc + BC, c + r * BC);
  }
}

// P = e^(scale·S + mask − LSE) inside each row's key range, 0 elsewhere (and for rows with LSE = −∞).
template <class DenseMask>
void probabilities(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols, const Workspace& ws, float* pt) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = pt + r * BC;
    const double* s = ws.s.data() + r * BC;
    const double lse = ws.lse[r];
    const std::int64_t c_lo = std::clamp<std::int64_t>(ws.range[r].lo - j0, 0, cols);
    const std::int64_t c_hi = std::clamp<std::int64_t>(ws.range[r].hi - j0, c_lo, cols);
    if (lse == -HUGE_VAL) {
      std::fill(row, row + BC, 0.0f);
      continue;
    }
    std::fill(row, row + c_lo, 0.0f);
    const auto mask = DenseMask::row(p, b, h, i0 + r);
    for (std::int64_t c = c_lo; c < c_hi; ++c) {
      const float bias = mask.bias(j0 + c);
      // The exponent is formed in double: huge logits lose nothing to a rounded difference.
      row[c] = bias == core::kNegInf
                   ? 0.0f
                   : std::exp(static_cast<float>(s[c] * p.scale + bias - lse));
    }
    std::fill(row + c_hi, row + BC, 0.0f);
  }
}

// dS = P ∘ (dP − D), in place over dP.
inline void dscores(const float* pt, std::int64_t rows, const float* d, float* ds) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < BC; ++c) ds[r * BC + c] = pt[r * BC + c] * (ds[r * BC + c] - d[r]);
}

// acc[c][0..dim) += Σ_r w[r][c] · x[r][0..dim) over the tile's columns   (dV += Pᵀ dO, dK += dSᵀ Q)
inline void cols_times_rows(const float* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t dim,
                            float* acc) {
  for (std::int64_t c = 0; c < cols; ++c) {
    float* out = acc + c * dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float wr = w[r * BC + c];
      if (wr == 0.0f) continue;
      const float* xr = x + r * dim;
      for (std::int64_t d = 0; d < dim; ++d) out[d] += wr * xr[d];
    }
  }
}

// acc[r][0..dim) += Σ_c w[r][c] · x[c][0..dim)   (dQ += dS K)
inline void rows_times_rows(const float* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t dim,
                            float* acc) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out = acc + r * dim;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float wc = w[r * BC + c];
      if (wc == 0.0f) continue;
      const float* xc = x + c * dim;
      for (std::int64_t d = 0; d < dim; ++d) out[d] += wc * xc[d];
    }
  }
}

// ---- blocks --------------------------------------------------------------------------------------------

// Per-row values both sweeps read: D_i = dO_i · O_i and the refined LSE, [B, Hq, Sq] each.
struct RowStats {
  std::vector<float> d;
  std::vector<double> lse;
};

// Loads query rows [i0, i0 + rows) of head h: Q, dO, LSE, D and each row's key range.
template <class QT>
void load_query_block(const core::BackwardProblem& bp, const RowStats& stats, std::int64_t b, std::int64_t h,
                      std::int64_t i0, std::int64_t rows, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  load_rows<QT>(p.q, b, h, i0, rows, BR, p.Dk, ws.q.data());
  load_rows<QT>(bp.dout, b, h, i0, rows, BR, p.Dv, ws.dout.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    ws.lse[r] = stats.lse[row];
    ws.d[r] = stats.d[row];
    ws.range[r] = core::key_range(p, b, i0 + r);
  }
}

// Loads keys [j0, j0 + cols) of KV head hk: K rows, Kᵀ and Vᵀ.
template <class KVT>
void load_key_block(const core::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t cols,
                    Workspace& ws) {
  load_rows<KVT>(p.k, b, hk, j0, cols, cols, p.Dk, ws.k.data());
  transpose_tile(ws.k.data(), cols, p.Dk, ws.kt.data());
  for (std::int64_t c = 0; c < cols; ++c) {
    const KVT* src = static_cast<const KVT*>(p.v.data) + p.v.offset(b, hk, j0 + c, 0);
    for (std::int64_t d = 0; d < p.Dv; ++d) ws.vt[d * BC + c] = core::to_float(src[d * p.v.stride[3]]);
  }
  for (std::int64_t d = 0; d < p.Dv; ++d) std::fill(ws.vt.begin() + d * BC + cols, ws.vt.begin() + (d + 1) * BC, 0.0f);
}

// P and dS of one (query block, key block) tile, left in ws.p and ws.ds.
template <class DenseMask>
void tile_probs_and_dscores(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                            std::int64_t j0, std::int64_t cols, Workspace& ws) {
  rows_times_cols<double>(ws.q.data(), rows, p.Dk, ws.kt.data(), ws.s.data());    // S = Q Kᵀ
  probabilities<DenseMask>(p, b, h, i0, rows, j0, cols, ws, ws.p.data());          // P
  rows_times_cols<float>(ws.dout.data(), rows, p.Dv, ws.vt.data(), ws.ds.data());  // dP = dO Vᵀ
  dscores(ws.p.data(), rows, ws.d, ws.ds.data());                                  // dS = P ∘ (dP − D)
}

template <class T>
void store_rows(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                std::int64_t dim, const float* src, float factor) {
  T* base = static_cast<T*>(const_cast<void*>(t.data));
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dst = base + t.offset(b, h, s0 + r, 0);
    for (std::int64_t d = 0; d < dim; ++d) dst[d * t.stride[3]] = core::from_float<T>(src[r * dim + d] * factor);
  }
}

// dK and dV of keys [j0, j0 + cols) of KV head hk: over the group's query heads (in order) and every query
// block whose key ranges meet the tile (in order).
template <class QT, class KVT, class DenseMask>
void key_block(const core::BackwardProblem& bp, const RowStats& stats, std::int64_t b, std::int64_t hk,
               std::int64_t j0, std::int64_t cols, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  float* dk = ws.acc_a.data();
  float* dv = ws.acc_b.data();
  std::fill(dk, dk + cols * p.Dk, 0.0f);
  std::fill(dv, dv + cols * p.Dv, 0.0f);
  if (j0 < p.kv_len[static_cast<std::size_t>(b)]) {
    load_key_block<KVT>(p, b, hk, j0, cols, ws);
    for (std::int64_t g = 0; g < p.group; ++g) {
      const std::int64_t h = hk * p.group + g;
      for (std::int64_t i0 = 0; i0 < p.Sq; i0 += BR) {
        const std::int64_t rows = std::min(BR, p.Sq - i0);
        // Keys the block's rows see lie in [first.lo, last.hi): both ends are non-decreasing in the row.
        const core::KeyRange first = core::key_range(p, b, i0), last = core::key_range(p, b, i0 + rows - 1);
        if (first.lo >= j0 + cols || last.hi <= j0 || last.hi <= first.lo) continue;
        load_query_block<QT>(bp, stats, b, h, i0, rows, ws);
        tile_probs_and_dscores<DenseMask>(p, b, h, i0, rows, j0, cols, ws);
        cols_times_rows(ws.p.data(), rows, cols, ws.dout.data(), p.Dv, dv);   // dV += Pᵀ dO
        cols_times_rows(ws.ds.data(), rows, cols, ws.q.data(), p.Dk, dk);     // dK += dSᵀ Q
      }
    }
  }
  store_rows<KVT>(bp.dk, b, hk, j0, cols, p.Dk, dk, static_cast<float>(p.scale));
  store_rows<KVT>(bp.dv, b, hk, j0, cols, p.Dv, dv, 1.0f);
}

// dQ of query rows [i0, i0 + rows) of head h: over the key blocks the rows see, in order.
template <class QT, class KVT, class DenseMask>
void query_block(const core::BackwardProblem& bp, const RowStats& stats, std::int64_t b, std::int64_t h,
                 std::int64_t i0, std::int64_t rows, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  float* dq = ws.acc_a.data();
  std::fill(dq, dq + rows * p.Dk, 0.0f);
  const core::KeyRange first = core::key_range(p, b, i0), last = core::key_range(p, b, i0 + rows - 1);
  if (first.lo < last.hi) {
    load_query_block<QT>(bp, stats, b, h, i0, rows, ws);
    const std::int64_t hk = h / p.group;
    for (std::int64_t j0 = first.lo; j0 < last.hi; j0 += BC) {
      const std::int64_t cols = std::min(BC, last.hi - j0);
      load_key_block<KVT>(p, b, hk, j0, cols, ws);
      tile_probs_and_dscores<DenseMask>(p, b, h, i0, rows, j0, cols, ws);
      rows_times_rows(ws.ds.data(), rows, cols, ws.k.data(), p.Dk, dq);  // dQ += dS K
    }
  }
  store_rows<QT>(bp.dq, b, h, i0, rows, p.Dk, dq, static_cast<float>(p.scale));
}

// The per-row values of query rows [i0, i0 + rows) of head h, from the scores recomputed here:
//   the LSE they normalise to, lse_i + log Σ_j e^(s_ij − lse_i), with lse_i the forward's (so no max pass);
//   D_i = Σ_j P_ij dP_ij, which equals dO_i · O_i in exact arithmetic.
// The forward rounded its scores differently (another summation order, fp32 scaling). With ordinary logits
// that is noise, but with large ones (|s| ~ 10^3 and more) P = e^(s − lse_forward) and D = dO · O_forward are
// off by far more than rounding, and dS = P ∘ (dP − D) turns that into gradient error 5-20x a naive fp32
// backward's (measured on the registry's large-logit cases). Taking both from the backward's own scores keeps
// P, dP and D consistent at the cost of one more pass over S and dP. The LSE stays in double: an fp32 LSE of
// 10^4 is itself only good to 10^-3.
template <class QT, class KVT, class DenseMask>
void row_statistics(const core::BackwardProblem& bp, std::int64_t b, std::int64_t h, std::int64_t i0,
                    std::int64_t rows, Workspace& ws, RowStats& stats) {
  const core::Problem& p = bp.fwd;
  const auto* saved = static_cast<const float*>(p.lse->data);
  double sum[BR] = {}, pdp[BR] = {};
  for (std::int64_t r = 0; r < rows; ++r) {
    const float lse = saved[p.lse->offset(b, h, i0 + r, 0)];
    ws.lse[r] = lse == core::kNegInf ? -HUGE_VAL : lse;
    ws.range[r] = core::key_range(p, b, i0 + r);
  }
  const core::KeyRange first = core::key_range(p, b, i0), last = core::key_range(p, b, i0 + rows - 1);
  load_rows<QT>(p.q, b, h, i0, rows, BR, p.Dk, ws.q.data());
  load_rows<QT>(bp.dout, b, h, i0, rows, BR, p.Dv, ws.dout.data());
  for (std::int64_t j0 = first.lo; j0 < last.hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, last.hi - j0);
    load_key_block<KVT>(p, b, h / p.group, j0, cols, ws);
    rows_times_cols<double>(ws.q.data(), rows, p.Dk, ws.kt.data(), ws.s.data());    // S = Q Kᵀ
    probabilities<DenseMask>(p, b, h, i0, rows, j0, cols, ws, ws.p.data());    // e^(s − lse_forward)
    rows_times_cols<float>(ws.dout.data(), rows, p.Dv, ws.vt.data(), ws.ds.data());  // dP = dO Vᵀ
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        sum[r] += ws.p[r * BC + c];
        pdp[r] += static_cast<double>(ws.p[r * BC + c]) * ws.ds[r * BC + c];
      }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    stats.lse[row] = sum[r] > 0 ? ws.lse[r] + std::log(sum[r]) : -HUGE_VAL;
    stats.d[row] = sum[r] > 0 ? static_cast<float>(pdp[r] / sum[r]) : 0.0f;
  }
}

template <class QT, class KVT, class DenseMask>
void flash_backward(const core::BackwardProblem& bp, int threads) {
  const core::Problem& p = bp.fwd;
  RowStats stats;
  stats.d.resize(static_cast<std::size_t>(p.B * p.Hq * p.Sq));
  stats.lse.resize(static_cast<std::size_t>(p.B * p.Hq * p.Sq));
  const std::int64_t kblocks = (p.Skv + BC - 1) / BC, qblocks = (p.Sq + BR - 1) / BR;
  const std::int64_t kv_items = p.B * p.Hkv * kblocks, q_items = p.B * p.Hq * qblocks;
#pragma omp parallel num_threads(threads) if (kv_items + q_items > 1)
  {
    Workspace ws(p.Dk, p.Dv);
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < q_items; ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      const std::int64_t i0 = qb * BR;
      row_statistics<QT, KVT, DenseMask>(bp, b, h, i0, std::min(BR, p.Sq - i0), ws, stats);
    }
    // (implicit barrier: D and the LSE are complete before either sweep reads them)
#pragma omp for schedule(dynamic) nowait
    for (std::int64_t it = 0; it < kv_items; ++it) {
      const std::int64_t kb = it % kblocks, hk = (it / kblocks) % p.Hkv, b = it / (kblocks * p.Hkv);
      const std::int64_t j0 = kb * BC;
      key_block<QT, KVT, DenseMask>(bp, stats, b, hk, j0, std::min(BC, p.Skv - j0), ws);
    }
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < q_items; ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      const std::int64_t i0 = qb * BR;
      query_block<QT, KVT, DenseMask>(bp, stats, b, h, i0, std::min(BR, p.Sq - i0), ws);
    }
  }
}

template <class QT, class KVT>
BackwardFn pick_mask(core::MaskKind mask) {
  switch (mask) {
    case core::MaskKind::none: return &flash_backward<QT, KVT, core::NoDenseMask>;
    case core::MaskKind::additive: return &flash_backward<QT, KVT, core::AdditiveMask>;
    case core::MaskKind::keep: return &flash_backward<QT, KVT, core::KeepMask>;
  }
  return nullptr;
}

template <class QT>
BackwardFn pick_kv(DType kv, core::MaskKind mask) {
  switch (kv) {
    case DType::f32: return pick_mask<QT, float>(mask);
    case DType::bf16: return pick_mask<QT, core::bf16>(mask);
    case DType::f16: return pick_mask<QT, core::f16>(mask);
    default: return nullptr;
  }
}

// The backward kernel of this instruction set for the given dtypes and dense-mask kind, or null.
inline BackwardFn pick_backward(DType q, DType kv, core::MaskKind mask) {
  switch (q) {
    case DType::f32: return pick_kv<float>(kv, mask);
    case DType::bf16: return pick_kv<core::bf16>(kv, mask);
    case DType::f16: return pick_kv<core::f16>(kv, mask);
    default: return nullptr;
  }
}

}  // namespace attn::cpu::ATTN_ISA_NS::bwd
