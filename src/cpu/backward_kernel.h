// The tiled (FlashAttention-2 style) backward, written once over the SIMD wrapper (cpu/vec.h) and compiled
// per instruction set.
//
// Nothing of size Sq x Skv is ever held: for a tile of BR query rows and BC keys the probabilities are
// recomputed from Q, K and the row's statistics (P = e^(scale·QKᵀ + mask − m) · inv_l), and then
//   dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D)  with D_i = dO_i · O_i,
//   dK += dSᵀ Q,   dQ += dS K
// (the scale of dK and dQ is taken once, in dS). With dropout (core/dropout.h) the factors z regenerated from the
// seed enter as dV += (P ∘ z)ᵀ dO and dP ∘ z in place of dP; D = dO·O (O is dropout's output) is unchanged.
//
// Sweeps over work items that own their outputs, so no atomics and no order that depends on the schedule:
// results are bitwise identical at every thread count.
//   0. the largest row norm of every query block, dO block, key tile and value tile (rows the masks can reach
//      only: keys past a batch's length are never read). A non-finite norm marks a block or tile holding NaN
//      or inf; a large product of norms marks tiles whose scores are formed in fp64.
//   1. row_statistics, per (batch, query head, query block): the row's max m_i and l_i = Σ_j e^(s_ij − m_i),
//      recomputed here from the scores (one product per tile; see there for why not from the forward's LSE),
//      and D_i = dO_i · O_i.
//   2. key_chunk, per (batch, KV head, chunk of keys): for each key block of the chunk, over the group's
//      query heads and query blocks in order: the five products above. dK and dV of the block are complete
//      when it ends and are stored; dQ is summed into the item's own rows: the caller's dQ itself (fp32, one
//      chunk) or an fp32 partial per chunk.
//   3. with partials only: dQ = Σ_chunks partial, the chunks in order. The number of chunks depends on the
//      shape only (never on the thread count), and is 1 unless B·Hkv alone gives too few items.
// Memory: per-thread tiles, the per-row statistics, and the partials (chunks x |dQ| in fp32) when there are
// any; never Sq x Skv.
//
// Non-finite inputs follow IEEE arithmetic over the pairs that carry weight (attended keys whose score is not
// -inf; a row that is empty in the forward contributes nothing): a tile that meets a NaN or inf in Q, dO, K or V
// (or a row whose statistics are not finite) takes the tile steps pair by pair (tile_exact), since the
// vector products would turn 0·NaN into NaN for pairs that carry no weight.
//
// The five products are one register-blocked micro-kernel (gemm below): C[i][·] (+)= Σ_k A(i, k) · B[k][·]
// with B's rows in SIMD lanes and A read as broadcast scalars at any two strides, so Pᵀ and dSᵀ need no
// transpose. Scores, probabilities and every sum are fp32 (scores fp64 on tiles with large logits); the
// exponential is exp2v (vec.h). Tile sizes, micro-kernel shapes (4x4 and 8x2 vectors, 6x4), and a variant
// loading each query block once per 4 key blocks were measured here: none moved the time beyond the noise.
//
// Compiled once per instruction-set level by the unit generated from src/cpu/isa_unit.cc.in, after
// cpu/flash_kernel.h and like it (cpu/isa_prelude.h first, this body inside the target region). This body
// includes nothing itself.
#ifndef ATTN_ISA_NS
#error "define ATTN_ISA_NS (the per-ISA namespace) before including backward_kernel.h"
#endif
#ifndef ATTN_ISA_PRELUDE
#error "include cpu/isa_prelude.h before the target region, then backward_kernel.h inside it"
#endif

namespace attn::cpu::ATTN_ISA_NS::bwd {

// (Vec, exp2v and the micro-kernel mma: cpu/vec.h and cpu/microkernel.h, included by cpu/flash_kernel.h in the
// enclosing namespace.)

using V = Vec::T;
constexpr int W = Vec::W;
constexpr std::int64_t BR = 64;       // query rows per tile
constexpr std::int64_t BC = 64;       // keys per tile (a multiple of every W)
constexpr int GR = 4;                 // rows of C per micro-kernel step
constexpr int GV = W == 16 ? 4 : 2;   // vectors of C per micro-kernel step (GR x GV accumulators)

inline std::int64_t padded(std::int64_t dim) { return (dim + W - 1) / W * W; }

// ---- the micro-kernel ------------------------------------------------------------------------------------

// C[i][·] for rows i0 .. i0+R-1 and vectors n0 .. n0+CV-1: (ACC ? C : 0) + Σ_{k<kn} A(i, k) · B[k][·], with
// A(i, k) = a[i·a_row + k·a_k]: the micro-kernel (cpu/microkernel.h) with a strided A.
template <int R, int CV, bool ACC>
inline void gemm_step(const float* a, std::int64_t a_row, std::int64_t a_k, const float* b, std::int64_t b_row,
                      std::int64_t kn, float* c, std::int64_t c_row) {
  mma<R, CV, ACC ? mk::Init::load : mk::Init::zero, false>(mk::Strided{a, a_row, a_k}, b, b_row, kn, c, c_row);
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

// max(a, b), NaN when either is NaN (a block's norm must show a NaN anywhere in it).
inline float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b); }

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
    norm2 = nan_max(norm2, n2);
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
  float qnorm = 0, donorm = 0;         // max_i ‖q_i‖, max_i ‖dO_i‖ over the block
  AlignedVector<float> s;        // [BR][BC]   scores, then P
  AlignedVector<double> sd;      // [BR][BC]   fp64 scores (tiles with large logits)
  AlignedVector<float> ds;       // [BR][BC]   dP, then dS
  AlignedVector<float> dfac;     // [BR][BC]   d logit / dx of each pair (variants with a logits transform)
  AlignedVector<float> drop;     // [BR][BC]   dropout factors z, then the dropped weights P ∘ z (sweep 1: [BC][BR])
  AlignedVector<float> kt, vt;   // [Dk][BC], [Dv][BC]  the key tile transposed (keys in lanes; zero past its keys)
  AlignedVector<float> kbuf;     // [BC][Dkp]  its key rows, when not read in place
  AlignedVector<float> dk, dv;   // [BC][Dkp], [BC][Dvp]  the key block's accumulators
  AlignedVector<float> qt, dot;  // [Dk][BR], [Dv][BR]  sweep 1: the block's Q and dO transposed (rows in lanes)
  double m[BR];                   // the rows' statistics: P = e^(s − m) · inv_l (m = 0, inv_l = 0 for rows past
  float inv_l[BR];                // the block and for empty rows), D
  double d[BR];
  double lsum[BR], pdsum[BR];     // row_statistics' running sums
  core::KeyRange range[BR];
  Workspace(std::int64_t dk_, std::int64_t dv_)
      : dkp(padded(dk_)), dvp(padded(dv_)), qbuf(BR * dkp), doutbuf(BR * dvp), s(BR * BC), sd(BR * BC),
        ds(BR * BC), dfac(BR * BC), drop(BR * BC), kt(dk_ * BC), vt(dv_ * BC), kbuf(BC * dkp), dk(BC * dkp), dv(BC * dvp), qt(dk_ * BR),
        dot(dv_ * BR) {}
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(sizeof(Workspace)) +
           4 * static_cast<std::int64_t>(qbuf.size() + doutbuf.size() + s.size() + ds.size() + dfac.size() + drop.size() + kt.size() + vt.size() +
                                         kbuf.size() + dk.size() + dv.size() + qt.size() + dot.size()) +
           8 * static_cast<std::int64_t>(sd.size());
  }
};

// Per-row values the later sweeps read, [B, Hq, Sq] each: P_ij = e^(s_ij − m_i) · inv_l_i, and D_i; the
// largest query and dO norms of each query block, [B, Hq, Sq / BR]; the largest key and value norms of each key
// tile, [B, Hkv, Skv / BC].
struct RowStats {
  std::vector<double> m, d;
  std::vector<float> inv_l, qnorm, donorm;
  std::vector<float> knorm, vnorm;
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
      norm2 = nan_max(norm2, Vec::reduce_add(acc));
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
  const auto block = static_cast<std::size_t>((b * p.Hq + h) * ((p.Sq + BR - 1) / BR) + i0 / BR);
  ws.qnorm = stats.qnorm[block], ws.donorm = stats.donorm[block];
  for (std::int64_t r = 0; r < BR; ++r) {
    ws.m[r] = 0.0, ws.inv_l[r] = 0.0f, ws.d[r] = 0.0, ws.range[r] = {0, 0};
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
  float knorm, vnorm;
};

// `cols` keys from j0, all below the batch's key length (the rest of the tile stays zero).
template <class KVT>
KeyTile load_key_tile(const core::Problem& p, const RowStats& stats, std::int64_t b, std::int64_t hk,
                      std::int64_t j0, std::int64_t cols, Workspace& ws) {
  KeyTile kt{ws.kt.data(), ws.vt.data(), nullptr, 0, 0.0f, 0.0f};
  block_rows<KVT>(p.k, b, hk, j0, cols, BC, p.Dk, ws.dkp, ws.kbuf.data(), &kt.k, &kt.ldk);
  std::fill(ws.kt.begin(), ws.kt.end(), 0.0f);
  std::fill(ws.vt.begin(), ws.vt.end(), 0.0f);
  for (std::int64_t c = 0; c < cols; ++c) {
    const KVT* v = static_cast<const KVT*>(p.v.data) + p.v.offset(b, hk, j0 + c, 0);
    for (std::int64_t d = 0; d < p.Dk; ++d) ws.kt[d * BC + c] = kt.k[c * kt.ldk + d];
    for (std::int64_t d = 0; d < p.Dv; ++d) ws.vt[d * BC + c] = core::to_float(v[d * p.v.stride[3]]);
  }
  const auto tile = static_cast<std::size_t>((b * p.Hkv + hk) * ((p.Skv + BC - 1) / BC) + j0 / BC);
  kt.knorm = stats.knorm[tile], kt.vnorm = stats.vnorm[tile];
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

// Above this scale, D = Σ_j P_ij dP_ij always (row_statistics): dS = scale·P·(dP − D) multiplies D's rounding
// by the scale. Ordinary scales (1/√Dk, and the registry's peaked cases up to 30) keep D = dO·O.
constexpr double kExactDScale = 64.0;

// Blocks whose scores are bounded by this in magnitude take the forward's LSE as their statistics (row_statistics).
constexpr float kMildLogits = 8.0f;
constexpr float kMildLse = 64.0f;  // (and whose LSEs are at most this: a dense mask can move them anywhere)

// How a (query block, key tile) pair is computed: `exact` when either holds a NaN or inf (a non-finite norm),
// then pair by pair (tile_exact); `wide` (fp64 scores) when its logits may be large, or exact. Both sweeps take
// the same decision for the same pair, so the scores sweep 1 normalises are the scores sweep 2 uses.
struct TileKind {
  bool exact, wide;
};
inline TileKind tile_kind(const core::Problem& p, const Workspace& ws, const KeyTile& kt) {
  const bool finite = std::isfinite(ws.qnorm) && std::isfinite(ws.donorm) && std::isfinite(kt.knorm) &&
                      std::isfinite(kt.vnorm);
  return {!finite, !finite || !(static_cast<float>(p.scale) * ws.qnorm * kt.knorm <= kWideLogits)};
}

// S = Q Kᵀ (unscaled dot products) [BR][BC] in fp32, or in fp64 into ws.sd for a wide tile.
inline void scores(const core::Problem& p, std::int64_t rows, const KeyTile& kt, bool wide, Workspace& ws) {
  if (!wide) {
    gemm<false>(rows, BC, p.Dk, ws.q, ws.ldq, 1, kt.kt, BC, ws.s.data(), BC);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    double acc[BC] = {};
    for (std::int64_t d = 0; d < p.Dk; ++d) {
      const double x = ws.q[r * ws.ldq + d];
      for (std::int64_t c = 0; c < BC; ++c) acc[c] += x * kt.kt[d * BC + c];
    }
    std::copy(acc, acc + BC, ws.sd.data() + r * BC);
  }
}

// dP = dO Vᵀ  [BR][BC]
inline void dprobs(const core::Problem& p, std::int64_t rows, const KeyTile& kt, const Workspace& ws, float* dp) {
  gemm<false>(rows, BC, p.Dv, ws.dout, ws.ldo, 1, kt.vt, BC, dp, BC);
}

// The scores of the block's rows in natural-log units, -inf for keys a row may not see (and for the tile's
// columns past `cols`): in place over ws.s (fp32: scale·S + mask, rounded as the vector path rounds) or over
// ws.sd (wide: scale·S + mask in fp64). `interior` tiles (every row sees every key, no dense mask) are only
// scaled, in vectors.
template <class Variant>
void masked_scores(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                   std::int64_t j0, std::int64_t cols, bool wide, bool interior, Workspace& ws) {
  const float scale_f = static_cast<float>(p.scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = ws.s.data() + r * BC;
    double* rowd = ws.sd.data() + r * BC;
    if (interior && !wide) {
      const V scale = Vec::set1(scale_f);
      for (std::int64_t c = 0; c < BC; c += W) Vec::store(row + c, Vec::mul(Vec::load(row + c), scale));
      continue;
    }
    const auto vrow = Variant::row(p, b, h, i0 + r);
    float* dfac = ws.dfac.data() + r * BC;
    for (std::int64_t c = 0; c < BC; ++c) {
      const std::int64_t j = j0 + c;
      const bool hidden = c >= cols || j < ws.range[r].lo || j >= ws.range[r].hi || vrow.hidden(j);
      if (wide) {
        const double x = rowd[c] * p.scale;
        rowd[c] = hidden ? -std::numeric_limits<double>::infinity() : vrow.logit(j, x);
        if constexpr (Variant::kTransform) dfac[c] = hidden ? 0.0f : static_cast<float>(vrow.dx(x));
      } else {
        const float x = row[c] * scale_f;
        row[c] = hidden ? core::kNegInf : vrow.logit(j, x);
        if constexpr (Variant::kTransform) dfac[c] = hidden ? 0.0f : vrow.dx(x);
      }
    }
  }
}

// P = e^(x − m) · inv_l from the masked scores x (masked_scores), in place over ws.s; 0 for hidden keys and for
// rows past the block (inv_l = 0).
inline void probabilities(std::int64_t rows, bool wide, Workspace& ws) {
  const V log2e = Vec::set1(static_cast<float>(core::kLog2e));
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = ws.s.data() + r * BC;
    if (wide) {
      const double* rowd = ws.sd.data() + r * BC;
      for (std::int64_t c = 0; c < BC; ++c)
        row[c] = static_cast<float>(std::exp(rowd[c] - ws.m[r]) * ws.inv_l[r]);
      continue;
    }
    const V neg_m = Vec::set1(-static_cast<float>(ws.m[r])), inv_l = Vec::set1(ws.inv_l[r]);
    for (std::int64_t c = 0; c < BC; c += W)
      Vec::store(row + c, Vec::mul(exp2v(Vec::mul(Vec::add(Vec::load(row + c), neg_m), log2e)), inv_l));
  }
}

// scale · dS = scale · P ∘ (dP − D), in place over dP (the scale of dK = scale · dSᵀ Q and dQ = scale · dS K
// taken once here); with a logits transform, times its derivative dfac (the gradient reaching x = scale·q·k).
// Above kExactDScale, dP − D is formed in fp64 (D as row_statistics summed it, never rounded to fp32 first): the
// scale multiplies whatever that difference carries, and with tied keys (P = ½, ½) the two differences must stay
// exact opposites so that their dQ terms cancel as the naive computation's do (else rounding noise ×1e20 turns an
// exact 0 into ±inf in f16).
template <bool Transform>
inline void dscores(const float* pt, std::int64_t rows, const double* d, double scale_d, const float* dfac, float* ds) {
  const float scale = static_cast<float>(scale_d);
  if (scale_d > kExactDScale) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < BC; ++c) {
        double x = scale_d * pt[r * BC + c] * (static_cast<double>(ds[r * BC + c]) - d[r]);
        if constexpr (Transform) x *= dfac[r * BC + c];
        ds[r * BC + c] = static_cast<float>(x);
      }
    return;
  }
  const V sc = Vec::set1(scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    const V neg_d = Vec::set1(-static_cast<float>(d[r]));
    for (std::int64_t c = 0; c < BC; c += W) {
      V x = Vec::mul(Vec::mul(Vec::load(pt + r * BC + c), sc), Vec::add(Vec::load(ds + r * BC + c), neg_d));
      if constexpr (Transform) x = Vec::mul(x, Vec::load(dfac + r * BC + c));
      Vec::store(ds + r * BC + c, x);
    }
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

// Dropout (core/dropout.h) of a tile whose P (ws.s) and dP (ws.ds) are formed: the weights P ∘ z that dV takes
// into ws.drop, and dP ∘ z in place (the gradient reaching P through the dropped weights). Rows past the block
// and keys past `cols` get z = 0. Compiled into the `mods` variant only; false when the call has no dropout.
template <class Variant>
bool drop_tile(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
               std::int64_t j0, std::int64_t cols, Workspace& ws) {
  if constexpr (Variant::kDropout) {
    if (!p.dropout.on()) return false;
    std::fill(ws.drop.begin(), ws.drop.end(), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) p.dropout.factors(b, h, i0 + r, j0, cols, ws.drop.data() + r * BC, 1);
    for (std::int64_t e = 0; e < BR * BC; e += W) {
      const V z = Vec::load(ws.drop.data() + e);
      Vec::store(ws.ds.data() + e, Vec::mul(Vec::load(ws.ds.data() + e), z));
      Vec::store(ws.drop.data() + e, Vec::mul(Vec::load(ws.s.data() + e), z));
    }
    return true;
  }
  return false;
}

// ---- the sweeps --------------------------------------------------------------------------------------

// The keys some row of the block [i0, i0 + rows) sees lie in [first.lo, last.hi): both ends are
// non-decreasing in the row.
inline core::KeyRange block_keys(const core::Problem& p, std::int64_t b, std::int64_t i0, std::int64_t rows) {
  return {core::key_range(p, b, i0).lo, core::key_range(p, b, i0 + rows - 1).hi};
}

// The score of pair (row r of the block, key c of the tile) in fp64 from the block's and the tile's fp32 rows,
// -inf for a key the row may not see: what tile_exact and the exact statistics use.
// *dx (if given) gets d logit / dx for the pair (1 without a logits transform).
template <class Variant>
double pair_score(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                  core::KeyRange range, const float* q, const KeyTile& kt, std::int64_t c, double* dx = nullptr) {
  if (j < range.lo || j >= range.hi) return -std::numeric_limits<double>::infinity();
  const auto row = Variant::row(p, b, h, i);
  if (row.hidden(j)) return -std::numeric_limits<double>::infinity();
  double dot = 0;
  for (std::int64_t d = 0; d < p.Dk; ++d) dot += static_cast<double>(q[d]) * kt.kt[d * BC + c];
  if (dx) *dx = row.dx(dot * p.scale);
  return row.logit(j, dot * p.scale);
}

// Sweep 1, the statistics of query rows [i0, i0 + rows) of head h: P_ij = e^(s_ij − m_i)·inv_l_i and D_i.
// Mild blocks (small scores, finite inputs) take them from the forward, as FlashAttention-2 does: m = LSE,
// inv_l = 1, D = dO·O. Every other block recomputes them here, with the same arithmetic as sweep 2: the row's
// max m_i, l_i = Σ_j e^(s_ij − m_i) and D_i = Σ_j P_ij dP_ij (two products per tile), because
//   - the LSE is fp32: its rounding (half an ulp of |LSE|) is an error of that size in every recomputed
//     exponent; for |LSE| ~ 10-30 (peaked rows, scale·|q·k| ≳ 10) that made gradients 2-18x less accurate than
//     a naive fp32 backward's, and with |LSE| ~ 1e10 (a -1e10 mask) it is no normalisation at all;
//   - in a peaked row dS = scale·P·(dP − D) cancels, and D = dO·O from the forward's differently rounded O leaves
//     scale times its rounding (measured: 10x a naive backward's error on peaked rows; 1e23 for scale 1e30, inf in
//     f16 gradients), where D from the same P and dP cancels as the naive computation does.
// Layout: the forward's (the block's rows in SIMD lanes, Sᵀ = K Qᵀ and dPᵀ = V dOᵀ with K and V rows read as
// broadcast scalars, so no tile is transposed); each score and dP is the same sequence of fused multiply-adds
// over d as sweep 2's, so the same bits.
template <class QT, class KVT, class Variant>
void row_statistics(const core::BackwardProblem& bp, const RowStats& norms, std::int64_t b, std::int64_t h,
                    std::int64_t i0, std::int64_t rows, Workspace& ws, RowStats& stats) {
  const core::Problem& p = bp.fwd;
  load_query_block<QT>(bp, norms, false, b, h, i0, rows, ws);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // A sink (natural-log units) starts every row's sums: a weight e^(sink − m) with no value (dP = 0).
  const double sink = p.sink(h);
  for (std::int64_t r = 0; r < BR; ++r)
    ws.m[r] = sink, ws.lsum[r] = sink == neg_inf ? 0.0 : 1.0, ws.pdsum[r] = 0.0;
  const core::KeyRange keys = block_keys(p, b, i0, rows);
  const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)], hk = h / p.group;
  const std::int64_t tiles_per_head = (p.Skv + BC - 1) / BC;
  // Key tiles on the grid of BC that sweep 2 uses, so each score is formed the same way in both.
  const std::int64_t first = keys.lo / BC * BC;
  float bound = 0;  // scale·max‖q‖·max‖k‖ over the block's tiles; NaN with a NaN or inf in Q, dO, K or V
  for (std::int64_t j0 = first; j0 < keys.hi; j0 += BC) {
    const auto tile = static_cast<std::size_t>((b * p.Hkv + hk) * tiles_per_head + j0 / BC);
    bound = nan_max(bound, static_cast<float>(p.scale) * ws.qnorm * stats.knorm[tile]);
    bound = nan_max(bound, (stats.vnorm[tile] + ws.donorm) * 0.0f);  // (NaN for inf too: inf·0)
  }
  // Mild blocks (every |score| <= kMildLogits from q·k, every LSE within ±kMildLse, everything finite): the
  // forward's statistics, FlashAttention-2's way: m = LSE, l = 1, D = dO·O, no product. The LSE's rounding (half an
  // ulp of at most kMildLse) is then of the order of a naive backward's own rounding.
  // With Params::backward_statistics = from_forward every block does, whatever its scores: the keys here may be
  // a subset of those the LSE and O were formed over (ring attention), so only the given ones are right.
  if ((bound <= kMildLogits && p.scale <= kExactDScale) || p.stats_from_forward) {
    const auto* saved = static_cast<const float*>(p.lse->data);
    bool lse_ok = true;
    for (std::int64_t r = 0; r < rows && lse_ok && !p.stats_from_forward; ++r) {
      const float x = saved[p.lse->offset(b, h, i0 + r, 0)];
      lse_ok = (std::isfinite(x) && std::fabs(x) <= kMildLse) || x == core::kNegInf;
    }
    // With a sink, D = dO·O must stay the sum over the row's keys (Σ_j P_ij dP_ij: the sink has no value), which
    // dO·O is not when dO holds a NaN or inf and the row attends no key (O = 0): such a block recomputes.
    for (std::int64_t r = 0; r < rows && lse_ok && p.sinks; ++r)
      for (std::int64_t e = 0; e < p.Dv && lse_ok; ++e) lse_ok = std::isfinite(ws.dout[r * ws.ldo + e]);
    if (lse_ok) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
        const float lse = saved[p.lse->offset(b, h, i0 + r, 0)];
        const bool empty = lse == core::kNegInf;
        double d = 0;
        if (!empty) {
          const QT* o = static_cast<const QT*>(p.out.data) + p.out.offset(b, h, i0 + r, 0);
          const float* g = ws.dout + r * ws.ldo;
          for (std::int64_t e = 0; e < p.Dv; ++e) d += static_cast<double>(g[e]) * core::to_float(o[e * p.out.stride[3]]);
        }
        stats.m[row] = empty ? 0.0 : lse;
        stats.inv_l[row] = empty ? 0.0f : 1.0f;
        stats.d[row] = d;
      }
      return;
    }
  }
  // Every other block: m, l and D = Σ_j P_ij dP_ij recomputed from the same scores, P and dP as sweep 2.
  // Qᵀ and dOᵀ, rows past the block zero.
  std::fill(ws.qt.begin(), ws.qt.end(), 0.0f);
  std::fill(ws.dot.begin(), ws.dot.end(), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < p.Dk; ++d) ws.qt[d * BR + r] = ws.q[r * ws.ldq + d];
    for (std::int64_t d = 0; d < p.Dv; ++d) ws.dot[d * BR + r] = ws.dout[r * ws.ldo + d];
  }
  const float scale_f = static_cast<float>(p.scale);
  const V log2e = Vec::set1(static_cast<float>(core::kLog2e));
  float* st = ws.s.data();   // Sᵀ [BC][BR]
  float* dpt = ws.ds.data();  // dPᵀ [BC][BR]
  for (std::int64_t j0 = first; j0 < keys.hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, len - j0);
    const auto tile = static_cast<std::size_t>((b * p.Hkv + hk) * tiles_per_head + j0 / BC);
    const TileKind kind = tile_kind(p, ws, KeyTile{nullptr, nullptr, nullptr, 0, stats.knorm[tile], stats.vnorm[tile]});
    const float* k;
    std::int64_t ldk;
    block_rows<KVT>(p.k, b, hk, j0, cols, BC, p.Dk, ws.dkp, ws.kbuf.data(), &k, &ldk);
    if (kind.wide) {  // pair by pair in fp64 (large scores, or NaN/inf: the exact tiles' arithmetic too)
      const float* v;
      std::int64_t ldv;
      block_rows<KVT>(p.v, b, hk, j0, cols, BC, p.Dv, ws.dvp, ws.dv.data(), &v, &ldv);
      // dP as sweep 2 forms it: in fp32 (dprobs) on a wide tile, in fp64 (tile_exact) on an exact one.
      if (!kind.exact) gemm<false>(cols, BR, p.Dv, v, ldv, 1, ws.dot.data(), BR, dpt, BR);
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto vrow = Variant::row(p, b, h, i0 + r);
        float* z = ws.drop.data();  // the row's dropout factors, when on
        if constexpr (Variant::kDropout)
          if (p.dropout.on()) p.dropout.factors(b, h, i0 + r, j0, cols, z, 1);
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::int64_t j = j0 + c;
          if (j < ws.range[r].lo || j >= ws.range[r].hi || vrow.hidden(j)) continue;
          double dot = 0;
          for (std::int64_t d = 0; d < p.Dk; ++d) dot += static_cast<double>(ws.q[r * ws.ldq + d]) * k[c * ldk + d];
          const double x = vrow.logit(j, dot * p.scale);
          if (x == neg_inf) continue;  // a -inf score: no weight
          if (!(x <= ws.m[r])) {       // a new max (or NaN, which poisons the row)
            const double rescale = ws.m[r] == neg_inf ? 0.0 : std::exp(ws.m[r] - x);
            ws.lsum[r] *= rescale, ws.pdsum[r] *= rescale;
            ws.m[r] = x;
          }
          const double e = std::exp(x - ws.m[r]);
          ws.lsum[r] += e;
          double dp = dpt[c * BR + r];
          if (kind.exact) {
            dp = 0;
            for (std::int64_t d = 0; d < p.Dv; ++d) dp += static_cast<double>(ws.dout[r * ws.ldo + d]) * v[c * ldv + d];
          }
          if constexpr (Variant::kDropout)
            if (p.dropout.on()) dp *= z[c];
          ws.pdsum[r] += e * dp;
        }
      }
      continue;
    }
    gemm<false>(cols, BR, p.Dk, k, ldk, 1, ws.qt.data(), BR, st, BR);  // Sᵀ = K Qᵀ
    {
      const float* v;
      std::int64_t ldv;
      block_rows<KVT>(p.v, b, hk, j0, cols, BC, p.Dv, ws.dvp, ws.dv.data(), &v, &ldv);
      gemm<false>(cols, BR, p.Dv, v, ldv, 1, ws.dot.data(), BR, dpt, BR);  // dPᵀ = V dOᵀ
    }
    if constexpr (Variant::kDropout)  // dPᵀ ∘ zᵀ: D sums P ∘ z ∘ dP
      if (p.dropout.on()) {
        float* zt = ws.drop.data();  // [BC][BR]
        for (std::int64_t r = 0; r < rows; ++r) p.dropout.factors(b, h, i0 + r, j0, cols, zt + r, BR);
        for (std::int64_t c = 0; c < cols; ++c)
          for (std::int64_t r = 0; r < rows; ++r) dpt[c * BR + r] *= zt[c * BR + r];
      }
    // x = scale·S + mask (rounded as sweep 2 rounds), -inf where a row may not look
    bool interior = !Variant::kPerElement;
    for (std::int64_t r = 0; r < rows && interior; ++r) interior = ws.range[r].lo <= j0 && j0 + cols <= ws.range[r].hi;
    if (interior) {
      const V sc = Vec::set1(scale_f);
      for (std::int64_t c = 0; c < cols; ++c)
        for (std::int64_t v = 0; v < BR; v += W) Vec::store(st + c * BR + v, Vec::mul(Vec::load(st + c * BR + v), sc));
    } else {
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto vrow = Variant::row(p, b, h, i0 + r);
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::int64_t j = j0 + c;
          float& x = st[c * BR + r];
          x = (j < ws.range[r].lo || j >= ws.range[r].hi || vrow.hidden(j)) ? core::kNegInf : vrow.logit(j, x * scale_f);
        }
      }
    }
    // per row (lane): m = max x, l = Σ e^(x − m) (and Σ e^(x − m)·dP), rescaled when m moves
    for (std::int64_t v0 = 0; v0 < BR; v0 += W) {
      V mx = Vec::set1(core::kNegInf);
      for (std::int64_t c = 0; c < cols; ++c) mx = Vec::max(mx, Vec::load(st + c * BR + v0));
      alignas(64) float tmax[W], origin[W];
      Vec::store(tmax, mx);
      for (int lane = 0; lane < W; ++lane) {
        const std::int64_t r = v0 + lane;
        if (tmax[lane] > ws.m[r]) {
          const double rescale = ws.m[r] == neg_inf ? 0.0 : std::exp(ws.m[r] - tmax[lane]);
          ws.lsum[r] *= rescale, ws.pdsum[r] *= rescale;
          ws.m[r] = tmax[lane];
        }
        origin[lane] = ws.m[r] == neg_inf ? 0.0f : static_cast<float>(ws.m[r]);
      }
      const V neg_m = Vec::sub(Vec::zero(), Vec::load(origin));
      V acc = Vec::zero(), acc_pd = Vec::zero();
      for (std::int64_t c = 0; c < cols; ++c) {
        const V e = exp2v(Vec::mul(Vec::add(Vec::load(st + c * BR + v0), neg_m), log2e));
        acc = Vec::add(acc, e);
        acc_pd = Vec::fmadd(e, Vec::load(dpt + c * BR + v0), acc_pd);
      }
      alignas(64) float sums[W], pds[W];
      Vec::store(sums, acc), Vec::store(pds, acc_pd);
      for (int lane = 0; lane < W; ++lane) ws.lsum[v0 + lane] += sums[lane], ws.pdsum[v0 + lane] += pds[lane];
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    const double l = ws.lsum[r];
    const bool empty = l == 0.0;  // no key with a score above -inf (NaN is not empty: it poisons)
    stats.m[row] = empty ? 0.0 : ws.m[r];
    stats.inv_l[row] = empty ? 0.0f : static_cast<float>(1.0 / l);
    stats.d[row] = empty ? 0.0 : ws.pdsum[r] / l;
  }
}

// The tile steps pair by pair, for a tile that meets a NaN or inf (in Q, dO, K, V or a row's statistics), where
// the vector products would turn 0·NaN into NaN for pairs that carry no weight: over the pairs that carry
// weight only, in fp64, P = e^(s − m)·inv_l, dP = dO·v, dS = scale·P·(dP − D), then dV += P dO, dK += dS q,
// dQ += dS k. The accumulators (dk, dv: the key block's rows; dq: the block's rows at stride ldq_acc) are
// stored into, not added to, when kv_add / dq_add are false. `scored`: the tile itself is finite and only a row's
// statistics are not; its scores were formed by scores() and masked_scores() (fp32, or fp64 when `wide`), as
// sweep 1 formed them, and are read from there: recomputing them in fp64 here would normalise fp32 scores of
// sweep 1 by scores of another rounding (by hundreds for scores of 1e10).
template <class Variant>
void tile_exact(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                std::int64_t j0, std::int64_t cols, const KeyTile& kt, Workspace& ws, bool kv_add, float* dq,
                std::int64_t ldq_acc, bool dq_add, bool scored = false, bool wide = false) {
  if (!kv_add) {
    std::fill(ws.dk.begin(), ws.dk.end(), 0.0f);
    std::fill(ws.dv.begin(), ws.dv.end(), 0.0f);
  }
  if (!dq_add)
    for (std::int64_t r = 0; r < rows; ++r) std::fill_n(dq + r * ldq_acc, ws.dkp, 0.0f);
  float z[BC];  // the row's dropout factors (1 without dropout)
  std::fill_n(z, BC, 1.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (ws.inv_l[r] == 0.0f) continue;  // an empty row contributes nothing
    const float* q = ws.q + r * ws.ldq;
    const float* g = ws.dout + r * ws.ldo;
    if constexpr (Variant::kDropout)
      if (p.dropout.on()) p.dropout.factors(b, h, i0 + r, j0, cols, z, 1);
    for (std::int64_t c = 0; c < cols; ++c) {
      double dx = 1;
      const double s = !scored ? pair_score<Variant>(p, b, h, i0 + r, j0 + c, ws.range[r], q, kt, c, &dx)
                       : wide  ? ws.sd[r * BC + c]
                               : static_cast<double>(ws.s[r * BC + c]);
      if (scored && Variant::kTransform) dx = ws.dfac[r * BC + c];
      if (s == -std::numeric_limits<double>::infinity()) continue;
      const double prob = std::exp(s - ws.m[r]) * ws.inv_l[r];
      double dp = 0;
      for (std::int64_t e = 0; e < p.Dv; ++e) dp += static_cast<double>(g[e]) * kt.vt[e * BC + c];
      const double ds = p.scale * prob * (dp * z[c] - ws.d[r]) * dx;
      const double dropped = prob * z[c];
      for (std::int64_t e = 0; e < p.Dv; ++e) ws.dv[c * ws.dvp + e] += static_cast<float>(dropped * g[e]);
      for (std::int64_t e = 0; e < p.Dk; ++e) {
        ws.dk[c * ws.dkp + e] += static_cast<float>(ds * q[e]);
        dq[r * ldq_acc + e] += static_cast<float>(ds * kt.kt[e * BC + c]);
      }
    }
  }
}

// Whether the block's statistics (inv_l, D) are all finite.
inline bool stats_finite(std::int64_t rows, const Workspace& ws) {
  for (std::int64_t r = 0; r < rows; ++r)
    if (!std::isfinite(ws.inv_l[r]) || !std::isfinite(ws.d[r]) || !std::isfinite(ws.m[r])) return false;
  return true;
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
    // Key chunks only when B·Hkv alone gives too few items (cpu/schedule.h: the shape only).
    constexpr std::int64_t kMinItems = 8, kMinChunkKeys = 4 * BC;
    const Cut cut = cut_length(p.B * p.Hkv, p.Skv, kMinItems, kMinChunkKeys, BC);
    chunks = cut.pieces, chunk_len = cut.piece_len;
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
// first term of a block is stored, not added: nothing needs zeroing first). Keys at or past the batch's key
// length are never read (their dK and dV are zero).
template <class QT, class KVT, class Variant>
void key_chunk(const core::BackwardProblem& bp, const RowStats& stats, std::int64_t b, std::int64_t hk,
               std::int64_t k_lo, std::int64_t k_hi, const DqTarget& dqt, std::vector<char>& written, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  const std::int64_t dkp = ws.dkp, dvp = ws.dvp, qblocks = (p.Sq + BR - 1) / BR;
  const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)];
  float* dk = ws.dk.data();
  float* dv = ws.dv.data();
  for (std::int64_t j0 = k_lo; j0 < k_hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, k_hi - j0);       // the block's keys
    const std::int64_t seen = std::min(cols, len - j0);      // those below the key length
    bool add = false;  // dK and dV of this key block hold a sum
    if (seen > 0) {
      const KeyTile kt = load_key_tile<KVT>(p, stats, b, hk, j0, seen, ws);
      for (std::int64_t g = 0; g < p.group; ++g) {
        const std::int64_t h = hk * p.group + g;
        for (std::int64_t i0 = 0; i0 < p.Sq; i0 += BR) {
          const std::int64_t rows = std::min(BR, p.Sq - i0);
          const core::KeyRange keys = block_keys(p, b, i0, rows);
          if (keys.lo >= j0 + cols || keys.hi <= j0 || keys.hi <= keys.lo) continue;
          float* dq = dqt.base + g * dqt.hs + i0 * dqt.rs;
          char& dq_add = written[static_cast<std::size_t>(g * qblocks + i0 / BR)];
          load_query_block<QT>(bp, stats, true, b, h, i0, rows, ws);
          const TileKind kind = tile_kind(p, ws, kt);
          bool interior = !Variant::kPerElement && seen == BC;
          for (std::int64_t r = 0; r < rows && interior; ++r)
            interior = ws.range[r].lo <= j0 && j0 + BC <= ws.range[r].hi;
          if (kind.exact || !stats_finite(rows, ws)) {  // NaN or inf somewhere: pair by pair
            if (!kind.exact) {  // a finite tile: its scores as sweep 1 formed them
              scores(p, rows, kt, kind.wide, ws);
              masked_scores<Variant>(p, b, h, i0, rows, j0, seen, kind.wide, interior, ws);
            }
            tile_exact<Variant>(p, b, h, i0, rows, j0, seen, kt, ws, add, dq, dqt.rs, dq_add, !kind.exact, kind.wide);
            add = true, dq_add = 1;
            continue;
          }
          scores(p, rows, kt, kind.wide, ws);                                            // S = Q Kᵀ
          masked_scores<Variant>(p, b, h, i0, rows, j0, seen, kind.wide, interior, ws);  // scale·S + mask
          probabilities(rows, kind.wide, ws);                                            // P
          dprobs(p, rows, kt, ws, ws.ds.data());                                         // dP = dO Vᵀ
          const bool dropped = drop_tile<Variant>(p, b, h, i0, rows, j0, seen, ws);       // P ∘ z, dP ∘ z
          dscores<Variant::kTransform>(ws.s.data(), rows, ws.d, p.scale, ws.dfac.data(), ws.ds.data());  // dS = scale·P ∘ (dP − D)
          cols_times_rows(dropped ? ws.drop.data() : ws.s.data(), rows, seen, ws.dout, ws.ldo, dvp, dv, add);  // dV += Pᵀ dO
          cols_times_rows(ws.ds.data(), rows, seen, ws.q, ws.ldq, dkp, dk, add);         // dK += dSᵀ Q
          rows_times_rows(ws.ds.data(), rows, seen, kt.k, kt.ldk, dkp, dq, dqt.rs, dq_add);  // dQ += dS K
          add = true, dq_add = 1;
        }
      }
    }
    if (!add) {  // no query sees these keys
      std::fill(dk, dk + BC * dkp, 0.0f);
      std::fill(dv, dv + BC * dvp, 0.0f);
    } else if (seen < cols) {  // keys past the length
      std::fill(dk + seen * dkp, dk + cols * dkp, 0.0f);
      std::fill(dv + seen * dvp, dv + cols * dvp, 0.0f);
    }
    store_rows<KVT>(bp.dk, b, hk, j0, cols, p.Dk, dk, dkp, 1.0f);
    store_rows<KVT>(bp.dv, b, hk, j0, cols, p.Dv, dv, dvp, 1.0f);
  }
}

// A call's scratch: the team's workspaces, its dQ-block marks, the row statistics and the dQ partial sums, kept
// between calls in the caller's attn::Workspace (under kScratchKey, one per instruction set) when it gives one.
struct Scratch {
  std::int64_t dk = -1, dv = -1;
  std::vector<Workspace> team;
  std::vector<std::vector<char>> written;
  RowStats stats;
  std::vector<float> dq_part;
  std::int64_t bytes() const {
    std::int64_t n = 0;
    for (const Workspace& ws : team) n += ws.bytes();
    for (const auto& w : written) n += static_cast<std::int64_t>(w.capacity());
    n += static_cast<std::int64_t>(8 * (stats.m.capacity() + stats.d.capacity()) +
                                   4 * (stats.inv_l.capacity() + stats.qnorm.capacity() + stats.donorm.capacity() +
                                        stats.knorm.capacity() + stats.vnorm.capacity() + dq_part.capacity()));
    return n;
  }
};
inline constexpr char kScratchKey = 0;

template <class QT, class KVT, class Variant>
void flash_backward(const core::BackwardProblem& bp, int threads) {
  const core::Problem& p = bp.fwd;
  const std::int64_t dkp = padded(p.Dk);
  const Plan plan(p);
  const std::int64_t kblocks = (p.Skv + BC - 1) / BC, tiles = p.B * p.Hkv * kblocks;
  const std::int64_t qblocks = (p.Sq + BR - 1) / BR, q_items = p.B * p.Hq * qblocks;
  const auto nrows = static_cast<std::size_t>(p.B * p.Hq * p.Sq);
  // The call's scratch, allocated before the work starts (the team's workspaces by their own threads; an
  // allocation failure reaches the caller as std::bad_alloc, never an exception leaving a parallel region), kept in the caller's attn::Workspace when it gives one. Every buffer is reset here or
  // written before it is read (dq_part), so nothing of an earlier call is read.
  Scratch local;
  Scratch& sc = core::scratch(p.workspace, &kScratchKey, local);
  if (sc.dk != p.Dk || sc.dv != p.Dv) sc.team.clear(), sc.dk = p.Dk, sc.dv = p.Dv;
  RowStats& stats = sc.stats;
  stats.m.assign(nrows, 0.0);
  stats.d.assign(nrows, 0.0);
  stats.inv_l.assign(nrows, 0.0f);
  stats.qnorm.assign(static_cast<std::size_t>(q_items), 0.0f);
  stats.donorm.assign(static_cast<std::size_t>(q_items), 0.0f);
  stats.knorm.assign(static_cast<std::size_t>(tiles), 0.0f);
  stats.vnorm.assign(static_cast<std::size_t>(tiles), 0.0f);
  const int team = team_size(threads, std::max(tiles + q_items, plan.items));
  grow_team(&sc.team, team, [&](int) { return Workspace(p.Dk, p.Dv); });
  std::vector<Workspace>& wss = sc.team;
  sc.written.resize(static_cast<std::size_t>(team));
  for (auto& w : sc.written) w.assign(static_cast<std::size_t>(p.group * qblocks), 0);
  std::vector<std::vector<char>>& writtens = sc.written;
  // Sweep 0: the largest row norm of every query and dO block, and of every key and value tile (keys below the
  // batch's key length only).
#pragma omp parallel num_threads(team) if (team > 1)
  {
    Workspace& ws = wss[static_cast<std::size_t>(omp_get_thread_num())];
    const float* rows_at;
    std::int64_t ld;
#pragma omp for schedule(static) nowait
    for (std::int64_t t = 0; t < tiles; ++t) {
      const std::int64_t kb = t % kblocks, hk = (t / kblocks) % p.Hkv, b = t / (kblocks * p.Hkv);
      const std::int64_t n = std::clamp<std::int64_t>(p.kv_len[static_cast<std::size_t>(b)] - kb * BC, 0, BC);
      stats.knorm[static_cast<std::size_t>(t)] =
          block_rows<KVT>(p.k, b, hk, kb * BC, n, BC, p.Dk, ws.dkp, ws.kbuf.data(), &rows_at, &ld, true);
      stats.vnorm[static_cast<std::size_t>(t)] =
          block_rows<KVT>(p.v, b, hk, kb * BC, n, BC, p.Dv, ws.dvp, ws.dv.data(), &rows_at, &ld, true);
    }
#pragma omp for schedule(static)
    for (std::int64_t it = 0; it < q_items; ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      const std::int64_t n = std::min(BR, p.Sq - qb * BR);
      stats.qnorm[static_cast<std::size_t>(it)] =
          block_rows<QT>(p.q, b, h, qb * BR, n, BR, p.Dk, ws.dkp, ws.qbuf.data(), &rows_at, &ld, true);
      stats.donorm[static_cast<std::size_t>(it)] =
          block_rows<QT>(bp.dout, b, h, qb * BR, n, BR, p.Dv, ws.dvp, ws.doutbuf.data(), &rows_at, &ld, true);
    }
  }
  // dQ: with one chunk per KV head and fp32 rows of whole vectors, summed in place in the caller's dQ (each
  // item owns its heads' rows); else in fp32 partials [chunk][B][Hq][Sq][Dkp] that sweep 3 adds up.
  const bool in_place = plan.chunks == 1 && std::is_same_v<QT, float> && bp.dq.stride[3] == 1 && p.Dk == dkp;
  const std::int64_t part_len = in_place ? 0 : p.B * p.Hq * p.Sq * dkp;
  std::vector<float>& dq_part = sc.dq_part;
  // Not zeroed: every row of a chunk's partial is stored before it is added to (key_chunk's first term of a
  // block stores; blocks that see none of the chunk's keys are zero-filled below), so a reused workspace's
  // partials (up to chunks x the size of dQ) are not cleared serially on every call.
  dq_part.resize(static_cast<std::size_t>(plan.chunks * part_len));
#pragma omp parallel num_threads(team) if (team > 1)
  {
    Workspace& ws = wss[static_cast<std::size_t>(omp_get_thread_num())];
    std::vector<char>& written = writtens[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < q_items; ++it) {
      const std::int64_t qb = it % qblocks, h = (it / qblocks) % p.Hq, b = it / (qblocks * p.Hq);
      const std::int64_t i0 = qb * BR;
      row_statistics<QT, KVT, Variant>(bp, stats, b, h, i0, std::min(BR, p.Sq - i0), ws, stats);
    }
    // (implicit barrier: the statistics are complete before sweep 2 reads them)
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < plan.items; ++it) {
      const std::int64_t c = it % plan.chunks, hk = (it / plan.chunks) % p.Hkv, b = it / (plan.chunks * p.Hkv);
      const std::int64_t h0 = hk * p.group;
      // (no offset is formed from a null data pointer: dq_part is empty in place, and so may be dQ when Sq = 0)
      const DqTarget dqt =
          p.Sq == 0  ? DqTarget{nullptr, 0, 0}
          : in_place ? DqTarget{static_cast<float*>(const_cast<void*>(bp.dq.data)) + bp.dq.offset(b, h0, 0, 0),
                              bp.dq.stride[1], bp.dq.stride[2]}
                   : DqTarget{dq_part.data() + c * part_len + (b * p.Hq + h0) * p.Sq * dkp, p.Sq * dkp, dkp};
      std::fill(written.begin(), written.end(), 0);
      key_chunk<QT, KVT, Variant>(bp, stats, b, hk, c * plan.chunk_len, std::min(p.Skv, (c + 1) * plan.chunk_len),
                                    dqt, written, ws);
      for (std::int64_t g = 0; g < p.group; ++g)  // query blocks that saw none of the chunk's keys
        for (std::int64_t qb = 0; qb < qblocks; ++qb)
          if (!written[static_cast<std::size_t>(g * qblocks + qb)])
            for (std::int64_t i = qb * BR; i < std::min(p.Sq, (qb + 1) * BR); ++i)
              std::fill_n(dqt.base + g * dqt.hs + i * dqt.rs, dkp, 0.0f);
    }
    // Sweep 3 (partials only): dQ = Σ_chunks partial, per query block, chunks in order.
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
  // ∂L/∂sink_h = −Σ_{b,i} P_sink · D_i with P_sink = e^(sink_h − m_i)·inv_l_i (the sink's weight in the row's
  // softmax; it has no value, so its dP is 0), summed over the rows in order: the same bits at any thread count.
  if (bp.dsinks) {
    auto* out = static_cast<float*>(const_cast<void*>(bp.dsinks->data));
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      const double sink = p.sink(h);
      double acc = 0;
      for (std::int64_t b = 0; b < p.B && sink != -std::numeric_limits<double>::infinity(); ++b)
        for (std::int64_t i = 0; i < p.Sq; ++i) {
          const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i);
          if (stats.inv_l[row] != 0.0f) acc += std::exp(sink - stats.m[row]) * stats.inv_l[row] * stats.d[row];
        }
      out[h * bp.dsinks->stride[1]] = static_cast<float>(-acc);
    }
  }
}

// The bytes a call allocates at `threads` threads: the team's scratch, the per-row statistics and norms, and
// the dQ partial sums (flash_backward).
inline std::int64_t workspace_bytes(const core::Problem& p, int threads) {
  const Plan plan(p);
  const std::int64_t dkp = padded(p.Dk), dvp = padded(p.Dv);
  const std::int64_t kblocks = (p.Skv + BC - 1) / BC, tiles = p.B * p.Hkv * kblocks;
  const std::int64_t qblocks = (p.Sq + BR - 1) / BR, q_items = p.B * p.Hq * qblocks;
  const std::int64_t team = std::clamp<std::int64_t>(std::max(tiles + q_items, plan.items), 1, std::max(threads, 1));
  const bool in_place = plan.chunks == 1 && p.q.dtype == DType::f32 && p.Dk == dkp;  // (the dq stride aside)
  const std::int64_t rows = p.B * p.Hq * p.Sq;
  const std::int64_t per_thread =
      4 * (BR * dkp + BR * dvp + 3 * BR * BC + p.Dk * BC + p.Dv * BC + BC * dkp + BC * dkp + BC * dvp) +
      8 * BR * BC + static_cast<std::int64_t>(sizeof(Workspace)) + p.group * qblocks;
  return team * per_thread + rows * (8 + 8 + 4) + 4 * 2 * (q_items + tiles) +
         (in_place ? 0 : 4 * plan.chunks * rows * dkp);
}

// The backward kernel of this instruction set for the given dtypes and dense-mask kind, or null (cpu/pick.h).
template <class QT, class KVT, class Variant>
struct BackwardKernel {
  static constexpr BackwardFn fn = &flash_backward<QT, KVT, Variant>;
};
inline BackwardFn pick_backward(DType q, DType kv, core::VariantKind variant) {
  return pick_kernel<BackwardFn, BackwardKernel>(q, kv, variant);
}

}  // namespace attn::cpu::ATTN_ISA_NS::bwd
