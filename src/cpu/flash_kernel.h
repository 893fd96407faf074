// The tiled (FlashAttention-style) forward, written once.
//
// For one (batch, query head, block of query rows) the kernel walks the key tiles the masks leave
// visible, keeps one online-softmax state per row, and never holds more than one Br x Bc tile of
// scores. The inner steps (load a tile, scores, mask, row max, exp, P·V) are small functions in
// TileOps so that a SIMD micro-kernel can replace each of them; this header is meant to be included
// by one translation unit per instruction set (src/cpu/flash_<isa>.cc). That unit includes its
// dependencies first, then this header inside `#pragma GCC target(...)`, with ATTN_ISA_NS naming a
// namespace of its own: the kernel's symbols never collide across instruction sets, and the library
// and std code it calls stay compiled for the baseline (the same scheme as google/highway).
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

// Per-thread scratch: one query block, one K and V tile, one score tile, the row accumulators.
struct Workspace {
  std::vector<float> q, k, v, s, o;
  std::vector<core::SoftmaxState> state;

  Workspace(const TileShape& t, std::int64_t dk, std::int64_t dv)
      : q(t.br * dk), k(t.bc * dk), v(t.bc * dv), s(t.br * t.bc), o(t.br * dv), state(t.br) {}
};

// Portable tile steps. Matrices are row-major and dense: q [rows][dk], k [cols][dk], v [cols][dv],
// s [rows][bc], o [rows][dv].
struct TileOps {
  // dst[r][d] = float(src[b, h, s0 + r, d]) * mul
  template <class T>
  static void load(const core::Strided& src, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                   std::int64_t dim, float* dst, float mul) {
    const T* base = static_cast<const T*>(src.data);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = base + src.offset(b, h, s0 + r, 0);
      for (std::int64_t d = 0; d < dim; ++d) dst[r * dim + d] = core::to_float(row[d * src.stride[3]]) * mul;
    }
  }

  // s[r][c] = Σ_d q[r][d] k[c][d]
  static void scores(const float* q, const float* k, float* s, std::int64_t rows, std::int64_t cols,
                     std::int64_t ldS, std::int64_t dk) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        float acc = 0.0f;
        for (std::int64_t d = 0; d < dk; ++d) acc += q[r * dk + d] * k[c * dk + d];
        s[r * ldS + c] = acc;
      }
  }

  static float row_max(const float* s, std::int64_t cols) {
    float m = core::kNegInf;
    for (std::int64_t c = 0; c < cols; ++c) m = std::max(m, s[c]);
    return m;
  }

  // s[c] = 2^(s[c]·log2e + offset) = e^(s[c] - m); returns Σ s[c].
  static float exp_sum(float* s, std::int64_t cols, double offset) {
    float sum = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c)
      sum += (s[c] = std::exp2(static_cast<float>(s[c] * core::kLog2e + offset)));
    return sum;
  }

  static void scale(float* o, std::int64_t dv, float alpha) {
    for (std::int64_t d = 0; d < dv; ++d) o[d] *= alpha;
  }

  // o[r][d] += Σ_c p[r][c] v[c][d]
  static void accumulate_pv(const float* p, const float* v, float* o, std::int64_t rows, std::int64_t cols,
                            std::int64_t ldP, std::int64_t dv) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const float w = p[r * ldP + c];
        if (w == 0.0f) continue;
        for (std::int64_t d = 0; d < dv; ++d) o[r * dv + d] += w * v[c * dv + d];
      }
  }

  // out[b, h, s0 + r, d] = T(o[r][d])
  template <class T>
  static void store(const core::Strided& dst, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                    std::int64_t dim, const float* o) {
    T* base = static_cast<T*>(const_cast<void*>(dst.data));
    for (std::int64_t r = 0; r < rows; ++r) {
      T* row = base + dst.offset(b, h, s0 + r, 0);
      for (std::int64_t d = 0; d < dim; ++d) row[d * dst.stride[3]] = core::from_float<T>(o[r * dim + d]);
    }
  }
};

// Turns raw dot products into scores: s = scale·s + bias (one rounding), -inf for keys the row may not
// see. Tiles that every row sees in full and that have no dense mask only need the scale.
template <class DenseMask, class Ops>
void finish_scores(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols, bool interior, float* s, std::int64_t ldS) {
  if (interior && !DenseMask::kActive) {
    for (std::int64_t r = 0; r < rows; ++r) Ops::scale(s + r * ldS, cols, static_cast<float>(p.scale));
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const core::KeyRange range = core::key_range(p, b, i0 + r);
    const auto bias = DenseMask::row(p, b, h, i0 + r);
    float* sr = s + r * ldS;
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t j = j0 + c;
      sr[c] = (j < range.lo || j >= range.hi) ? core::kNegInf
                                              : static_cast<float>(sr[c] * p.scale + bias.bias(j));
    }
  }
}

// One block of query rows [i0, i0 + rows) of head h in batch b.
template <class QT, class KVT, class DenseMask, class Ops = TileOps>
void flash_block(const core::Problem& p, const TileShape& t, std::int64_t b, std::int64_t h, std::int64_t i0,
                 std::int64_t rows, Workspace& ws) {
  const std::int64_t hk = h / p.group, dk = p.Dk, dv = p.Dv, ld = t.bc;
  // Keys that some row of the block may see (the union) and keys that every row sees (the intersection):
  // both ends of a row's range are non-decreasing in the row index.
  const core::KeyRange first = core::key_range(p, b, i0), last = core::key_range(p, b, i0 + rows - 1);
  const std::int64_t visible_lo = first.lo, visible_hi = last.hi;
  const std::int64_t shared_lo = last.lo, shared_hi = first.hi;

  Ops::template load<QT>(p.q, b, h, i0, rows, dk, ws.q.data(), 1.0f);
  std::fill(ws.o.begin(), ws.o.begin() + rows * dv, 0.0f);
  std::fill(ws.state.begin(), ws.state.begin() + rows, core::SoftmaxState{});

  for (std::int64_t j0 = visible_lo; j0 < visible_hi; j0 += t.bc) {
    const std::int64_t cols = std::min(t.bc, visible_hi - j0);
    const bool interior = j0 >= shared_lo && j0 + cols <= shared_hi;
    Ops::template load<KVT>(p.k, b, hk, j0, cols, dk, ws.k.data(), 1.0f);                   // K tile
    Ops::template load<KVT>(p.v, b, hk, j0, cols, dv, ws.v.data(), 1.0f);                   // V tile
    Ops::scores(ws.q.data(), ws.k.data(), ws.s.data(), rows, cols, ld, dk);                 // S = Q Kᵀ
    finish_scores<DenseMask, Ops>(p, b, h, i0, rows, j0, cols, interior, ws.s.data(), ld);  // S = scale·S + mask
    for (std::int64_t r = 0; r < rows; ++r) {
      core::SoftmaxState& st = ws.state[r];
      float* sr = ws.s.data() + r * ld;
      Ops::scale(ws.o.data() + r * dv, dv, st.advance(Ops::row_max(sr, cols)));  // m = max(m, rowmax S); O *= e^(m_old - m)
      st.l += Ops::exp_sum(sr, cols, st.log2_offset());                           // P = e^(S - m); l += rowsum P
    }
    Ops::accumulate_pv(ws.s.data(), ws.v.data(), ws.o.data(), rows, cols, ld, dv);  // O += P V
  }

  for (std::int64_t r = 0; r < rows; ++r) ws.state[r].normalize(ws.o.data() + r * dv, dv);
  Ops::template store<QT>(p.out, b, h, i0, rows, dv, ws.o.data());
  if (p.lse) {
    float* lse = static_cast<float*>(const_cast<void*>(p.lse->data));
    for (std::int64_t r = 0; r < rows; ++r) lse[p.lse->offset(b, h, i0 + r, 0)] = ws.state[r].lse();
  }
}

// All blocks of all heads, spread over threads. Blocks are independent, so the result does not
// depend on the thread count or the schedule.
template <class QT, class KVT, class DenseMask>
void flash_forward(const core::Problem& p, int threads) {
  const TileShape t{};
  const std::int64_t blocks = (p.Sq + t.br - 1) / t.br;
  const std::int64_t items = p.B * p.Hq * blocks;
#pragma omp parallel num_threads(threads) if (items > 1)
  {
    Workspace ws(t, p.Dk, p.Dv);
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < items; ++it) {
      const std::int64_t blk = it % blocks, h = (it / blocks) % p.Hq, b = it / (blocks * p.Hq);
      const std::int64_t i0 = blk * t.br;
      flash_block<QT, KVT, DenseMask>(p, t, b, h, i0, std::min(t.br, p.Sq - i0), ws);
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
