// The tiled (FlashAttention-style) forward, written once and compiled per instruction set.
//
// For one (batch, query head, block of Br query rows) the kernel walks the key tiles the masks leave
// visible, keeps the online-softmax state of every row, and never holds more than one Bc x Br tile of
// scores. Queries live in SIMD lanes: the block is held transposed (Qᵀ, Sᵀ = K Qᵀ, Oᵀ), so the
// row-wise softmax (max, exp, sum, rescale) is plain vertical vector arithmetic, and K and V are read
// as broadcast scalars straight from their rows (no transposes, no packing for fp32 inputs).
//
// Included by one translation unit per instruction set (src/cpu/flash_<isa>.cc). That unit includes
// its dependencies first, then this header inside `#pragma GCC target(...)`, with ATTN_ISA_NS naming
// a namespace of its own: kernel symbols never collide across instruction sets, and the library and
// std code they call stay compiled for the baseline (the scheme of google/highway).
#ifndef ATTN_ISA_NS
#error "define ATTN_ISA_NS (the per-ISA namespace) before including flash_kernel.h"
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "cpu/kernels.h"

namespace attn::cpu::ATTN_ISA_NS {

#include "cpu/vec.h"

using V = Vec::T;
constexpr int W = Vec::W;
constexpr int QV = 4;            // query vectors per block
constexpr std::int64_t BR = QV * W;  // query rows per block (lanes)
constexpr std::int64_t BC = 64;      // keys per tile
constexpr int RK = W == 16 ? 6 : 2;  // keys per step of the Sᵀ micro-kernel (RK x QV accumulators)
constexpr int RD = W == 16 ? 6 : 2;  // value dims per step of the Oᵀ micro-kernel (RD x QV accumulators)

// A block of rows [s0, s0 + rows) of one head as fp32 rows with unit stride: the caller's memory when
// it already is fp32 with unit stride, else converted into `buf`.
template <class T>
const float* rows_as_f32(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                         std::int64_t dim, float* buf, std::int64_t* ld) {
  const T* base = static_cast<const T*>(t.data) + t.offset(b, h, s0, 0);
  if constexpr (std::is_same_v<T, float>) {
    if (t.stride[3] == 1) {
      *ld = t.stride[2];
      return base;
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* src = base + r * t.stride[2];
    float* dst = buf + r * dim;
    std::int64_t d = 0;
    if constexpr (!std::is_same_v<T, float>) {
      if (t.stride[3] == 1)
        for (; d + W <= dim; d += W) {
          const auto* p = reinterpret_cast<const std::uint16_t*>(src + d);
          Vec::store(dst + d, std::is_same_v<T, core::bf16> ? Vec::load_bf16(p) : Vec::load_f16(p));
        }
    }
    for (; d < dim; ++d) dst[d] = core::to_float(src[d * t.stride[3]]);
  }
  *ld = dim;
  return buf;
}

// Per-thread scratch, all fp32: Qᵀ [Dk][BR], K and V tiles [BC][D] (used only when a conversion is
// needed), Sᵀ/Pᵀ [BC][BR], Oᵀ [Dv][BR], and the state of each row (m, l).
struct Workspace {
  std::vector<float> qt, k, v, st, ot, m, l;
  Workspace(std::int64_t dk, std::int64_t dv)
      : qt(dk * BR), k(BC * dk), v(BC * dv), st(BC * BR), ot(dv * BR), m(BR), l(BR) {}
};

// Sᵀ[c][·] = Σ_d K[c][d] Qᵀ[d][·] for keys c0 .. c0+R-1 and all BR query lanes.
template <int R>
inline void scores_step(const float* qt, const float* k, std::int64_t ldk, std::int64_t dk, float* st, std::int64_t c0) {
  V acc[R][QV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < QV; ++v) acc[r][v] = Vec::zero();
  for (std::int64_t d = 0; d < dk; ++d) {
    V q[QV];
    for (int v = 0; v < QV; ++v) q[v] = Vec::load(qt + d * BR + v * W);
    for (int r = 0; r < R; ++r) {
      const V kb = Vec::set1(k[(c0 + r) * ldk + d]);
      for (int v = 0; v < QV; ++v) acc[r][v] = Vec::fmadd(kb, q[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < QV; ++v) Vec::store(st + (c0 + r) * BR + v * W, acc[r][v]);
}

// Oᵀ[d][·] += Σ_c V[c][d] Pᵀ[c][·] for value dims d0 .. d0+R-1.
template <int R>
inline void pv_step(const float* pt, const float* vv, std::int64_t ldv, std::int64_t cols, float* ot, std::int64_t d0) {
  V acc[R][QV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < QV; ++v) acc[r][v] = Vec::load(ot + (d0 + r) * BR + v * W);
  for (std::int64_t c = 0; c < cols; ++c) {
    V p[QV];
    for (int v = 0; v < QV; ++v) p[v] = Vec::load(pt + c * BR + v * W);
    for (int r = 0; r < R; ++r) {
      const V vb = Vec::set1(vv[c * ldv + d0 + r]);
      for (int v = 0; v < QV; ++v) acc[r][v] = Vec::fmadd(vb, p[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < QV; ++v) Vec::store(ot + (d0 + r) * BR + v * W, acc[r][v]);
}

// Sᵀ = K Qᵀ over `cols` keys.
inline void scores(const float* qt, const float* k, std::int64_t ldk, std::int64_t dk, std::int64_t cols, float* st) {
  std::int64_t c = 0;
  for (; c + RK <= cols; c += RK) scores_step<RK>(qt, k, ldk, dk, st, c);
  for (; c < cols; ++c) scores_step<1>(qt, k, ldk, dk, st, c);
}

// Oᵀ += Vᵀ Pᵀ over `cols` keys.
inline void accumulate_pv(const float* pt, const float* vv, std::int64_t ldv, std::int64_t dv, std::int64_t cols,
                          float* ot) {
  std::int64_t d = 0;
  for (; d + RD <= dv; d += RD) pv_step<RD>(pt, vv, ldv, cols, ot, d);
  for (; d < dv; ++d) pv_step<1>(pt, vv, ldv, cols, ot, d);
}

// Turns dot products into scores: s = scale·s + mask, and -inf for keys a row may not see. Tiles every
// row sees in full and without a dense mask only need the scale.
template <class DenseMask>
void finish_scores(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols, bool interior, float* st) {
  if (interior && !DenseMask::kActive) {
    const V scale = Vec::set1(static_cast<float>(p.scale));
    for (std::int64_t c = 0; c < cols; ++c)
      for (int v = 0; v < QV; ++v) Vec::store(st + c * BR + v * W, Vec::mul(Vec::load(st + c * BR + v * W), scale));
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const core::KeyRange range = core::key_range(p, b, i0 + r);
    const auto mask = DenseMask::row(p, b, h, i0 + r);
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t j = j0 + c;
      float& s = st[c * BR + r];
      s = (j < range.lo || j >= range.hi) ? core::kNegInf : static_cast<float>(s * p.scale + mask.bias(j));
    }
  }
}

// The online-softmax step for one tile, lane by lane (the vector form of core::SoftmaxState::advance and
// its weights): m' = max(m, max_c Sᵀ[c]); α = e^(m - m'); l = α·l + Σ_c e^(Sᵀ[c] - m'); Oᵀ *= α;
// and Sᵀ is replaced by Pᵀ = e^(Sᵀ - m'). Empty rows (m' = -inf) keep α = 0 and weights 0, never NaN.
inline void softmax_step(float* st, std::int64_t cols, float* m, float* l, float* ot, std::int64_t dv) {
  const V log2e = Vec::set1(static_cast<float>(core::kLog2e)), neg_inf = Vec::set1(core::kNegInf);
  V alpha[QV], offset[QV], sum[QV];
  for (int v = 0; v < QV; ++v) {
    V mx = neg_inf;
    for (std::int64_t c = 0; c < cols; ++c) mx = Vec::max(mx, Vec::load(st + c * BR + v * W));
    const V m_old = Vec::load(m + v * W), m_new = Vec::max(m_old, mx);
    // e^(m_old - m_new); m_old = -inf gives 0 (and so does m_new = -inf, harmlessly: l and Oᵀ are 0).
    alpha[v] = exp2v(Vec::select_lt(m_old, Vec::set1(-3.0e38f), neg_inf,
                                    Vec::mul(Vec::add(m_old, Vec::mul(m_new, Vec::set1(-1.0f))), log2e)));
    // exponent offset -m'·log2e, or 0 while the row has seen no key
    offset[v] = Vec::select_lt(m_new, Vec::set1(-3.0e38f), Vec::zero(), Vec::mul(m_new, Vec::set1(-core::kLog2e)));
    Vec::store(m + v * W, m_new);
    sum[v] = Vec::zero();
  }
  for (std::int64_t c = 0; c < cols; ++c)
    for (int v = 0; v < QV; ++v) {
      const V pw = exp2v(Vec::fmadd(Vec::load(st + c * BR + v * W), log2e, offset[v]));
      Vec::store(st + c * BR + v * W, pw);
      sum[v] = Vec::add(sum[v], pw);
    }
  for (int v = 0; v < QV; ++v) Vec::store(l + v * W, Vec::fmadd(Vec::load(l + v * W), alpha[v], sum[v]));
  for (std::int64_t d = 0; d < dv; ++d)
    for (int v = 0; v < QV; ++v) Vec::store(ot + d * BR + v * W, Vec::mul(Vec::load(ot + d * BR + v * W), alpha[v]));
}

// One block of query rows [i0, i0 + rows) of head h in batch b, over keys [kv_lo, kv_hi) only
// (the whole visible range, or one split of it). Leaves the unnormalised state in ws (m, l, Oᵀ).
template <class QT, class KVT, class DenseMask>
void flash_block_partial(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                         std::int64_t kv_lo, std::int64_t kv_hi, Workspace& ws) {
  const std::int64_t hk = h / p.group, dk = p.Dk, dv = p.Dv;
  // Keys some row of the block may see (the union) and keys every row sees (the intersection):
  // both ends of a row's key range are non-decreasing in the row index.
  const core::KeyRange first = core::key_range(p, b, i0), last = core::key_range(p, b, i0 + rows - 1);
  const std::int64_t visible_lo = std::max(first.lo, kv_lo), visible_hi = std::min(last.hi, kv_hi);
  const std::int64_t shared_lo = last.lo, shared_hi = first.hi;

  // Qᵀ, zero in the lanes past the last row.
  std::fill(ws.qt.begin(), ws.qt.end(), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const QT* q = static_cast<const QT*>(p.q.data) + p.q.offset(b, h, i0 + r, 0);
    for (std::int64_t d = 0; d < dk; ++d) ws.qt[d * BR + r] = core::to_float(q[d * p.q.stride[3]]);
  }
  std::fill(ws.ot.begin(), ws.ot.end(), 0.0f);
  std::fill(ws.m.begin(), ws.m.end(), core::kNegInf);
  std::fill(ws.l.begin(), ws.l.end(), 0.0f);

  for (std::int64_t j0 = visible_lo; j0 < visible_hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, visible_hi - j0);
    const bool interior = j0 >= shared_lo && j0 + cols <= shared_hi;
    std::int64_t ldk, ldv;
    const float* k = rows_as_f32<KVT>(p.k, b, hk, j0, cols, dk, ws.k.data(), &ldk);        // K tile
    const float* v = rows_as_f32<KVT>(p.v, b, hk, j0, cols, dv, ws.v.data(), &ldv);        // V tile
    scores(ws.qt.data(), k, ldk, dk, cols, ws.st.data());                                  // Sᵀ = K Qᵀ
    finish_scores<DenseMask>(p, b, h, i0, rows, j0, cols, interior, ws.st.data());         // Sᵀ = scale·Sᵀ + mask
    softmax_step(ws.st.data(), cols, ws.m.data(), ws.l.data(), ws.ot.data(), dv);          // Pᵀ, m, l, Oᵀ *= α
    accumulate_pv(ws.st.data(), v, ldv, dv, cols, ws.ot.data());                           // Oᵀ += Vᵀ Pᵀ
  }
}

// Writes Oᵀ / l and the LSE of a finished block.
template <class QT>
void store_block(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                 const Workspace& ws) {
  QT* out = static_cast<QT*>(const_cast<void*>(p.out.data));
  for (std::int64_t r = 0; r < rows; ++r) {
    const core::SoftmaxState st{ws.m[r], ws.l[r]};
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
    QT* o = out + p.out.offset(b, h, i0 + r, 0);
    for (std::int64_t d = 0; d < p.Dv; ++d) o[d * p.out.stride[3]] = core::from_float<QT>(ws.ot[d * BR + r] * inv);
    if (p.lse) static_cast<float*>(const_cast<void*>(p.lse->data))[p.lse->offset(b, h, i0 + r, 0)] = st.lse();
  }
}

// All blocks of all heads, spread over threads. Blocks are independent, so the result does not
// depend on the thread count or the schedule.
template <class QT, class KVT, class DenseMask>
void flash_forward(const core::Problem& p, int threads) {
  const std::int64_t blocks = (p.Sq + BR - 1) / BR;
  const std::int64_t items = p.B * p.Hq * blocks;
#pragma omp parallel num_threads(threads) if (items > 1)
  {
    Workspace ws(p.Dk, p.Dv);
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < items; ++it) {
      const std::int64_t blk = it % blocks, h = (it / blocks) % p.Hq, b = it / (blocks * p.Hq);
      const std::int64_t i0 = blk * BR, rows = std::min(BR, p.Sq - i0);
      flash_block_partial<QT, KVT, DenseMask>(p, b, h, i0, rows, 0, p.Skv, ws);
      store_block<QT>(p, b, h, i0, rows, ws);
    }
  }
}

template <class QT, class KVT>
FlashFn pick_mask(core::MaskKind mask) {
  switch (mask) {
    case core::MaskKind::none: return &flash_forward<QT, KVT, core::NoDenseMask>;
    case core::MaskKind::additive: return &flash_forward<QT, KVT, core::AdditiveMask>;
    case core::MaskKind::keep: return &flash_forward<QT, KVT, core::KeepMask>;
  }
  return nullptr;
}

template <class QT>
FlashFn pick_kv(DType kv, core::MaskKind mask) {
  switch (kv) {
    case DType::f32: return pick_mask<QT, float>(mask);
    case DType::bf16: return pick_mask<QT, core::bf16>(mask);
    case DType::f16: return pick_mask<QT, core::f16>(mask);
    default: return nullptr;
  }
}

// The kernel of this instruction set for the given dtypes and dense-mask kind, or null.
inline FlashFn pick_flash(DType q, DType kv, core::MaskKind mask) {
  switch (q) {
    case DType::f32: return pick_kv<float>(kv, mask);
    case DType::bf16: return pick_kv<core::bf16>(kv, mask);
    case DType::f16: return pick_kv<core::f16>(kv, mask);
    default: return nullptr;
  }
}

}  // namespace attn::cpu::ATTN_ISA_NS
