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
// results are bitwise identical at every thread count. All of them run in one parallel region (cpu/schedule.h).
//   0. the largest row norm of every query block, dO block, key tile and value tile (rows the masks can reach
//      only: keys past a batch's length are never read). A non-finite norm marks a block or tile holding NaN
//      or inf; a large product of norms marks tiles whose scores are formed in fp64.
//   1. row_statistics, per (batch, query head, query block): each row's online-softmax state (core::OnlineSoftmax,
//      the forward's) over the scores the row's keys get here, the same scores sweep 2 recomputes; and D_i.
//   2. key_chunk, per (batch, KV head, chunk of keys): for each key block of the chunk, over the group's
//      query heads and query blocks in order: the five products above. dK and dV of the block are complete
//      when it ends and are stored; dQ is summed into the item's own rows: the caller's dQ itself (fp32, one
//      chunk) or an fp32 partial per chunk.
//   3. with partials only: dQ = Σ_chunks partial, the chunks in order. The number of chunks depends on the
//      shape only (never on the thread count), and is 1 unless B·Hkv alone gives too few items.
// Memory (Plan::bytes): per-thread tiles, the per-row statistics, and the partials (chunks x |dQ| in fp32) when
// there are any; never Sq x Skv.
//
// Non-finite inputs follow IEEE arithmetic over the pairs that carry weight (attended keys whose score is not
// -inf; a row that is empty in the forward contributes nothing): a tile that meets a NaN or inf in Q, dO, K or V
// (or a row whose statistics are not finite) takes the tile steps pair by pair (tile_exact), since the
// vector products would turn 0·NaN into NaN for pairs that carry no weight.
//
// The five products are one register-blocked micro-kernel (gemm below): C[i][·] (+)= Σ_k A(i, k) · B[k][·]
// with B's rows in SIMD lanes and A read as broadcast scalars at any two strides, so Pᵀ and dSᵀ need no
// transpose. Scores, probabilities and every sum are fp32 (scores fp64 on tiles with large logits); the
// exponential is the online-softmax state's weight (exp2v). Tile sizes, micro-kernel shapes (4x4 and 8x2
// vectors, 6x4), and a variant loading each query block once per 4 key blocks were measured here: none moved the
// time beyond the noise.
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

// (Vec, exp2v, the micro-kernel mma and the row sources: cpu/vec.h, cpu/microkernel.h and cpu/row_source.h,
// included by cpu/flash_kernel.h in the enclosing namespace.)

using V = Vec::T;
constexpr int W = Vec::W;
constexpr std::int64_t BR = 64;       // query rows per tile
constexpr std::int64_t BC = 64;       // keys per tile (a multiple of every W)
// Rows of C per micro-kernel step (leftover rows take steps of GT, then 1) and vectors of C (GR x GV accumulators).
// AVX-512's 32 registers: 6 x 4, as the forward's scores (its products alone, in a micro-benchmark of 64 or 128 rows
// of C, 1.03-1.11x as fast as 4 x 4 on a Cascade Lake Xeon); 16 registers: 4 x 2.
constexpr int GR = W == 16 ? 6 : 4;
constexpr int GT = 4;
constexpr int GV = W == 16 ? 4 : 2;

inline std::int64_t padded(std::int64_t dim) { return (dim + W - 1) / W * W; }

// The softmax's units here: scores x in natural-log units (scale·q·k + mask, through the variant's hooks), so the
// online-softmax state runs with c = log2 e.
using RowState = core::OnlineSoftmax<core::WideLanes>;  // one row, fp64 sums (D must cancel exactly: dscores)
using LaneState = core::OnlineSoftmax<VecLanes>;         // the weight function over SIMD lanes
constexpr double kC = core::kLog2e;

// ---- the micro-kernel ------------------------------------------------------------------------------------

// C[i][·] for rows i0 .. i0+R-1 and vectors n0 .. n0+CV-1: (ACC ? C : 0) + Σ_{k<kn} A(i, k) · B[k][·], with
// A(i, k) = a[i·a_row + k·a_k]: the micro-kernel (cpu/microkernel.h) with a strided A, sums over k in chunks of
// kDotChunk (as the forward's scores: the two sweeps' scores must be the same bits).
template <int R, int CV, bool ACC>
inline void gemm_step(const float* a, std::int64_t a_row, std::int64_t a_k, const float* b, std::int64_t b_row,
                      std::int64_t kn, float* c, std::int64_t c_row) {
  mma<R, CV, ACC ? mk::Init::load : mk::Init::zero, false, kDotChunk>(mk::Strided{a, a_row, a_k}, b, b_row, kn, c, c_row);
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
    if constexpr (GT < GR)
      for (; i + GT <= m; i += GT)
        gemm_rows<GT, ACC>(cv, a + i * a_row, a_row, a_k, b + n0, b_row, kn, c + i * c_row + n0, c_row);
    for (; i < m; ++i) gemm_rows<1, ACC>(cv, a + i * a_row, a_row, a_k, b + n0, b_row, kn, c + i * c_row + n0, c_row);
  }
}

// ---- rows ------------------------------------------------------------------------------------------------

// max(a, b), NaN when either is NaN (a block's norm must show a NaN anywhere in it).
inline float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b); }

// The largest L2 norm of n rows readable to `pitch` values (a multiple of W; zeros past the row's own values).
inline float max_row_norm(const RowBlock& rows, std::int64_t n, std::int64_t pitch) {
  float norm2 = 0.0f;
  for (std::int64_t r = 0; r < n; ++r) {
    const float* x = rows.base + r * rows.ld;
    V acc = Vec::zero();
    for (std::int64_t d = 0; d < pitch; d += W) acc = Vec::fmadd(Vec::load(x + d), Vec::load(x + d), acc);
    norm2 = nan_max(norm2, Vec::reduce_add(acc));
  }
  return std::sqrt(norm2);
}

// ---- per-thread tiles --------------------------------------------------------------------------------------

// All fp32 (the fp64 scores aside); row lengths padded to a multiple of W (Dkp, Dvp) with zeros.
struct Workspace {
  struct Shape {
    std::int64_t dk = 0, dv = 0, marks = 0;  // marks: query blocks of a KV head's group (written)
    bool operator==(const Shape&) const = default;
    std::int64_t dkp() const { return padded(dk); }
    std::int64_t dvp() const { return padded(dv); }
  };
  std::int64_t dkp, dvp;
  AlignedVector<float> qbuf, doutbuf;  // [BR][Dkp], [BR][Dvp]  query and dO rows, when not read in place
  AlignedVector<float> s;        // [BR][BC]   scores, then P (sweep 1: Sᵀ [BC][BR])
  AlignedVector<double> sd;      // [BR][BC]   fp64 scores (tiles with large logits)
  AlignedVector<float> ds;       // [BR][BC]   dP, then dS (sweep 1: dPᵀ [BC][BR])
  AlignedVector<float> dfac;     // [BR][BC]   d logit / dx of each pair (variants with a logits transform)
  AlignedVector<float> drop;     // [BR][BC]   dropout factors z, then the dropped weights P ∘ z (sweep 1: [BC][BR])
  AlignedVector<float> kt, vt;   // [Dk][BC], [Dv][BC]  the key tile transposed (keys in lanes; zero past its keys)
  AlignedVector<float> kbuf, vbuf;  // [BC][Dkp], [BC][Dvp]  its key and value rows, when not read in place
  AlignedVector<float> dk, dv;   // [BC][Dkp], [BC][Dvp]  the key block's accumulators
  AlignedVector<float> qt, dot;  // [Dk][BR], [Dv][BR]  sweep 1: the block's Q and dO transposed (rows in lanes)
  std::vector<char> written;     // sweep 2: which query blocks of the item's heads hold a dQ sum already
  // The query block in hand: its Q and dO rows, their largest norms, each row's key range and statistics
  // (P = e^(s − m) · inv_l; m = 0, inv_l = 0 for rows past the block and for empty rows), and D.
  RowBlock q{}, dout{};
  float qnorm = 0, donorm = 0;
  double m[BR];
  float inv_l[BR];
  double d[BR];
  core::KeyRange range[BR];

  // The buffers and their lengths (cpu/aligned.h: the one formula, allocated by the constructor, counted by
  // bytes() before a call and by held() after it).
  template <class F>
  static void layout(const Shape& s, F f) {
    f(&Workspace::qbuf, BR * s.dkp());
    f(&Workspace::doutbuf, BR * s.dvp());
    f(&Workspace::s, BR * BC);
    f(&Workspace::sd, BR * BC);
    f(&Workspace::ds, BR * BC);
    f(&Workspace::dfac, BR * BC);
    f(&Workspace::drop, BR * BC);
    f(&Workspace::kt, s.dk * BC);
    f(&Workspace::vt, s.dv * BC);
    f(&Workspace::kbuf, BC * s.dkp());
    f(&Workspace::vbuf, BC * s.dvp());
    f(&Workspace::dk, BC * s.dkp());
    f(&Workspace::dv, BC * s.dvp());
    f(&Workspace::qt, s.dk * BR);
    f(&Workspace::dot, s.dv * BR);
    f(&Workspace::written, s.marks);
  }
  explicit Workspace(const Shape& s) : dkp(s.dkp()), dvp(s.dvp()) { allocate_layout(*this, s); }
  static std::int64_t bytes(const Shape& s) { return layout_bytes<Workspace>(s); }
};

// What the sweeps share, [B, Hq, Sq] per row: m, inv_l and D (P_ij = e^(s_ij − m_i) · inv_l_i); the largest query
// and dO norms of each query block, [B, Hq, Sq / BR]; the largest key and value norms of each key tile,
// [B, Hkv, Skv / BC]; and the dQ partial sums.
struct Statistics {
  std::vector<double> m, d;
  std::vector<float> inv_l, qnorm, donorm, knorm, vnorm;
  std::vector<float> dq_part;
};

// Query rows [i0, i0 + rows) of head h: Q, dO (as fp32 rows, zero-padded to whole vectors), their norms, each
// row's key range and (with_stats) its statistics.
template <class QT>
void load_query_block(const core::BackwardProblem& bp, const Statistics& stats, bool with_stats, std::int64_t b,
                      std::int64_t h, std::int64_t i0, std::int64_t rows, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  ws.q = head_rows<QT>(p, p.q, p.Dk, b, h).as_float_block(i0, rows, ws.dkp, ws.qbuf.data());
  ws.dout = head_rows<QT>(p, bp.dout, p.Dv, b, h).as_float_block(i0, rows, ws.dvp, ws.doutbuf.data());
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
// S = Q Kᵀ, dP = dO Vᵀ), K and V rows (dQ += dS K; sweep 1's products), and the largest key and value norms of
// the tile (from sweep 0).
struct KeyTile {
  const float* kt;  // [Dk][BC]
  const float* vt;  // [Dv][BC]
  RowBlock k, v;    // rows, zero-padded to whole vectors
  float knorm, vnorm;
};

// `cols` keys from j0, all below the batch's key length (the rest of the tile stays zero). Sweep 2 reads K rows,
// Kᵀ and Vᵀ (transposed); sweep 1 K rows, and V rows when it forms dP (values).
enum class TileForm { rows, rows_and_values, transposed };
template <class KVT>
KeyTile load_key_tile(const core::Problem& p, const Statistics& stats, std::int64_t b, std::int64_t hk,
                      std::int64_t j0, std::int64_t cols, Workspace& ws, TileForm form) {
  KeyTile kt{ws.kt.data(), ws.vt.data(), {}, {}, 0.0f, 0.0f};
  const bool transposed = form == TileForm::transposed;
  kt.k = key_rows<KVT>(p, b, hk).as_float_block(j0, cols, ws.dkp, ws.kbuf.data());
  if (form != TileForm::rows) kt.v = value_rows<KVT>(p, b, hk).as_float_block(j0, cols, ws.dvp, ws.vbuf.data());
  if (transposed) {
    std::fill(ws.kt.begin(), ws.kt.end(), 0.0f);
    std::fill(ws.vt.begin(), ws.vt.end(), 0.0f);
    for (std::int64_t c = 0; c < cols; ++c) {
      for (std::int64_t d = 0; d < p.Dk; ++d) ws.kt[d * BC + c] = kt.k.base[c * kt.k.ld + d];
      for (std::int64_t d = 0; d < p.Dv; ++d) ws.vt[d * BC + c] = kt.v.base[c * kt.v.ld + d];
    }
  }
  const auto tile = static_cast<std::size_t>((b * p.Hkv + hk) * ((p.Skv + BC - 1) / BC) + j0 / BC);
  kt.knorm = stats.knorm[tile], kt.vnorm = stats.vnorm[tile];
  return kt;
}

// ---- how a tile is computed --------------------------------------------------------------------------------

// Above this bound on |scale·q·k| over a tile, scores are formed in fp64. An fp32 dot product is as good as
// a naive fp32 backward's (errors ~ ε·scale·‖q‖‖k‖ in the logit), but with large logits softmax rows are
// near one-hot and the few near-tied rows decide the largest gradient error, so which of two equally
// rounded computations wins is luck: the registry's large-logit cases (|logit| ~ 10^3 to 10^4) measured
// 5-20x a naive backward's error with fp32 scores, within the rule with fp64 ones. Ordinary inputs (P1, P2,
// unit-scale activations: bound ~ 4) never come near it.
constexpr float kWideLogits = 256.0f;

// Above this scale, D = Σ_j P_ij dP_ij always (row_statistics): dS = scale·P·(dP − D) multiplies D's rounding
// by the scale. Ordinary scales (1/√Dk, and the registry's peaked cases up to 30) keep D = dO·O (an f32 O only:
// mild_block).
constexpr double kExactDScale = 64.0;

// Blocks whose scores are bounded by this in magnitude take D = dO·O when O is f32 (row_statistics, mild_block).
constexpr float kMildLogits = 8.0f;
constexpr float kMildLse = 64.0f;  // (and whose LSEs are at most this: a dense mask can move them anywhere)

// How a (query block, key tile) pair is computed: `exact` when either holds a NaN or inf (a non-finite norm),
// then pair by pair (tile_exact); `wide` (fp64 scores) when its logits may be large, or exact. Both sweeps take
// the same decision for the same pair, so the scores sweep 1 normalises are the scores sweep 2 uses.
struct TileKind {
  bool exact, wide;
};
inline TileKind tile_kind(const core::Problem& p, float qnorm, float donorm, float knorm, float vnorm) {
  const bool finite = std::isfinite(qnorm) && std::isfinite(donorm) && std::isfinite(knorm) && std::isfinite(vnorm);
  return {!finite, !finite || !(static_cast<float>(p.scale) * qnorm * knorm <= kWideLogits)};
}

// A (query block, key tile) pair: query rows [i0, i0 + rows) of head h of batch b, keys [j0, j0 + cols) of its KV
// head (all below the batch's key length).
struct TilePair {
  std::int64_t b, h, i0, rows, j0, cols;
};

// The score of pair (row r of the block, key c of the tile) in fp64 from fp32 rows q and k, -inf for a key the row
// may not see (its key range or the dense mask); *dx (if given) gets d logit / dx for the pair.
template <class Variant>
double pair_score(const core::Problem& p, const TilePair& t, std::int64_t r, std::int64_t c,
                  const core::KeyRange& range, const float* q, const float* k, std::int64_t k_step,
                  double* dx = nullptr) {
  const std::int64_t j = t.j0 + c;
  if (j < range.lo || j >= range.hi) return -std::numeric_limits<double>::infinity();
  const auto row = Variant::row(p, t.b, t.h, t.i0 + r);
  if (row.hidden(j)) return -std::numeric_limits<double>::infinity();
  double dot = 0;
  for (std::int64_t d = 0; d < p.Dk; ++d) dot += static_cast<double>(q[d]) * k[d * k_step];
  if (dx) *dx = row.dx(dot * p.scale);
  return row.logit(j, dot * p.scale);
}

// ---- the tile steps of sweep 2 --------------------------------------------------------------------------

// S = Q Kᵀ (unscaled dot products) [BR][BC] in fp32, or in fp64 into ws.sd for a wide tile.
inline void scores(const core::Problem& p, std::int64_t rows, const KeyTile& kt, bool wide, Workspace& ws) {
  if (!wide) {
    gemm<false>(rows, BC, p.Dk, ws.q.base, ws.q.ld, 1, kt.kt, BC, ws.s.data(), BC);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    double acc[BC] = {};
    for (std::int64_t d = 0; d < p.Dk; ++d) {
      const double x = ws.q.base[r * ws.q.ld + d];
      for (std::int64_t c = 0; c < BC; ++c) acc[c] += x * kt.kt[d * BC + c];
    }
    std::copy(acc, acc + BC, ws.sd.data() + r * BC);
  }
}

// dP = dO Vᵀ  [BR][BC]
inline void dprobs(const core::Problem& p, std::int64_t rows, const KeyTile& kt, const Workspace& ws, float* dp) {
  gemm<false>(rows, BC, p.Dv, ws.dout.base, ws.dout.ld, 1, kt.vt, BC, dp, BC);
}

// The scores of the block's rows in natural-log units, -inf for keys a row may not see (and for the tile's
// columns past `cols`): in place over ws.s (fp32: the variant's logit of scale·S, rounded as sweep 1 rounds) or
// over ws.sd (wide: in fp64). `interior` tiles (every row sees every key, no per-element variant) are only scaled,
// in vectors.
template <class Variant>
void masked_scores(const core::Problem& p, const TilePair& t, bool wide, bool interior, Workspace& ws) {
  const float scale_f = static_cast<float>(p.scale);
  for (std::int64_t r = 0; r < t.rows; ++r) {
    float* row = ws.s.data() + r * BC;
    double* rowd = ws.sd.data() + r * BC;
    if (interior && !wide) {
      const V scale = Vec::set1(scale_f);
      for (std::int64_t c = 0; c < BC; c += W) Vec::store(row + c, Vec::mul(Vec::load(row + c), scale));
      continue;
    }
    const auto vrow = Variant::row(p, t.b, t.h, t.i0 + r);
    float* dfac = ws.dfac.data() + r * BC;
    for (std::int64_t c = 0; c < BC; ++c) {
      const std::int64_t j = t.j0 + c;
      const bool hidden = c >= t.cols || j < ws.range[r].lo || j >= ws.range[r].hi || vrow.hidden(j);
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

// P = e^(x − m) · inv_l from the masked scores x (masked_scores), the online-softmax state's weight function, in
// place over ws.s; 0 for hidden keys and for rows past the block (inv_l = 0).
inline void probabilities(std::int64_t rows, bool wide, Workspace& ws) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = ws.s.data() + r * BC;
    if (wide) {
      const double* rowd = ws.sd.data() + r * BC;
      for (std::int64_t c = 0; c < BC; ++c) row[c] = static_cast<float>(RowState::weight(rowd[c], ws.m[r], kC) * ws.inv_l[r]);
      continue;
    }
    const V m = Vec::set1(static_cast<float>(ws.m[r])), inv_l = Vec::set1(ws.inv_l[r]), c = Vec::set1(static_cast<float>(kC));
    for (std::int64_t k = 0; k < BC; k += W)
      Vec::store(row + k, Vec::mul(LaneState::weight(Vec::load(row + k), m, c), inv_l));
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
inline void cols_times_rows(const float* w, std::int64_t rows, std::int64_t cols, const RowBlock& x, std::int64_t n,
                            float* acc, bool add) {
  if (add) gemm<true>(cols, n, rows, w, 1, BC, x.base, x.ld, acc, n);
  else gemm<false>(cols, n, rows, w, 1, BC, x.base, x.ld, acc, n);
}

// acc[r][·] (+)= Σ_c w[r][c] · x[c][·]   (dQ += dS K)
inline void rows_times_rows(const float* w, std::int64_t rows, std::int64_t cols, const RowBlock& x, std::int64_t n,
                            float* acc, std::int64_t ldacc, bool add) {
  if (add) gemm<true>(rows, n, cols, w, BC, 1, x.base, x.ld, acc, ldacc);
  else gemm<false>(rows, n, cols, w, BC, 1, x.base, x.ld, acc, ldacc);
}

// Dropout (core/dropout.h) of a tile whose P (ws.s) and dP (ws.ds) are formed: the weights P ∘ z that dV takes
// into ws.drop, and dP ∘ z in place (the gradient reaching P through the dropped weights). Rows past the block
// and keys past `cols` get z = 0. False when the call has no dropout (core/variant.h: Variant::dropout).
template <class Variant>
bool drop_tile(const core::Problem& p, const TilePair& t, Workspace& ws) {
  if (!Variant::dropout(p)) return false;
  std::fill(ws.drop.begin(), ws.drop.end(), 0.0f);
  for (std::int64_t r = 0; r < t.rows; ++r) p.dropout.factors(t.b, t.h, t.i0 + r, t.j0, t.cols, ws.drop.data() + r * BC, 1);
  for (std::int64_t e = 0; e < BR * BC; e += W) {
    const V z = Vec::load(ws.drop.data() + e);
    Vec::store(ws.ds.data() + e, Vec::mul(Vec::load(ws.ds.data() + e), z));
    Vec::store(ws.drop.data() + e, Vec::mul(Vec::load(ws.s.data() + e), z));
  }
  return true;
}

// Where a pair's gradients go: the key block's dK and dV accumulators (ws.dk, ws.dv) and the query block's dQ rows
// (dq, row stride ldq). kv_add / dq_add: the accumulator holds a sum already (else the pair's terms are stored).
struct Accumulators {
  float* dq;
  std::int64_t ldq;
  bool dq_add, kv_add;
};

// Where tile_exact takes a pair's score from: recomputed in fp64 from the rows (a tile holding NaN or inf), or
// as scores() and masked_scores() formed them (a finite tile whose rows' statistics are not finite), fp32 or fp64.
enum class ExactScores { recompute, fp32, fp64 };

// The tile steps pair by pair, for a tile that meets a NaN or inf (in Q, dO, K, V or a row's statistics), where
// the vector products would turn 0·NaN into NaN for pairs that carry no weight: over the pairs that carry weight
// only, in fp64, P = e^(s − m)·inv_l, dP = dO·v, dS = scale·P·(dP − D), then dV += P dO, dK += dS q, dQ += dS k.
// Scores formed already (ExactScores::fp32 / fp64) are read, not recomputed: recomputing them in fp64 here would
// normalise sweep 1's fp32 scores by scores of another rounding (by hundreds for scores of 1e10).
template <class Variant>
void tile_exact(const core::Problem& p, const TilePair& t, const KeyTile& kt, const Accumulators& acc,
                ExactScores from, Workspace& ws) {
  if (!acc.kv_add) {
    std::fill(ws.dk.begin(), ws.dk.end(), 0.0f);
    std::fill(ws.dv.begin(), ws.dv.end(), 0.0f);
  }
  if (!acc.dq_add)
    for (std::int64_t r = 0; r < t.rows; ++r) std::fill_n(acc.dq + r * acc.ldq, ws.dkp, 0.0f);
  float z[BC];  // the row's dropout factors (1 without dropout)
  std::fill_n(z, BC, 1.0f);
  for (std::int64_t r = 0; r < t.rows; ++r) {
    if (ws.inv_l[r] == 0.0f) continue;  // an empty row contributes nothing
    const float* q = ws.q.base + r * ws.q.ld;
    const float* g = ws.dout.base + r * ws.dout.ld;
    if (Variant::dropout(p)) p.dropout.factors(t.b, t.h, t.i0 + r, t.j0, t.cols, z, 1);
    for (std::int64_t c = 0; c < t.cols; ++c) {
      double dx = 1;
      double s = 0;
      switch (from) {
        case ExactScores::recompute: s = pair_score<Variant>(p, t, r, c, ws.range[r], q, kt.kt + c, BC, &dx); break;
        case ExactScores::fp32: s = ws.s[r * BC + c]; break;
        case ExactScores::fp64: s = ws.sd[r * BC + c]; break;
      }
      if (from != ExactScores::recompute && Variant::kTransform) dx = ws.dfac[r * BC + c];
      if (s == -std::numeric_limits<double>::infinity()) continue;
      const double prob = RowState::weight(s, ws.m[r], kC) * ws.inv_l[r];
      double dp = 0;
      for (std::int64_t e = 0; e < p.Dv; ++e) dp += static_cast<double>(g[e]) * kt.vt[e * BC + c];
      const double ds = p.scale * prob * (dp * z[c] - ws.d[r]) * dx;
      const double dropped = prob * z[c];
      for (std::int64_t e = 0; e < p.Dv; ++e) ws.dv[c * ws.dvp + e] += static_cast<float>(dropped * g[e]);
      for (std::int64_t e = 0; e < p.Dk; ++e) {
        ws.dk[c * ws.dkp + e] += static_cast<float>(ds * q[e]);
        acc.dq[r * acc.ldq + e] += static_cast<float>(ds * kt.kt[e * BC + c]);
      }
    }
  }
}

// Whether the block's statistics (inv_l, D, m) are all finite.
inline bool stats_finite(std::int64_t rows, const Workspace& ws) {
  for (std::int64_t r = 0; r < rows; ++r)
    if (!std::isfinite(ws.inv_l[r]) || !std::isfinite(ws.d[r]) || !std::isfinite(ws.m[r])) return false;
  return true;
}

// The five products of one pair, all tiles finite (S = Q Kᵀ then P, dP, dS; dV, dK, dQ accumulated).
template <class Variant>
void tile_products(const core::Problem& p, const TilePair& t, const KeyTile& kt, const TileKind& kind,
                   bool interior, const Accumulators& acc, Workspace& ws) {
  scores(p, t.rows, kt, kind.wide, ws);                                                   // S = Q Kᵀ
  masked_scores<Variant>(p, t, kind.wide, interior, ws);                                  // logits (scale·S, mask)
  probabilities(t.rows, kind.wide, ws);                                                   // P
  dprobs(p, t.rows, kt, ws, ws.ds.data());                                                // dP = dO Vᵀ
  const bool dropped = drop_tile<Variant>(p, t, ws);                                      // P ∘ z, dP ∘ z
  dscores<Variant::kTransform>(ws.s.data(), t.rows, ws.d, p.scale, ws.dfac.data(), ws.ds.data());  // scale·dS
  cols_times_rows(dropped ? ws.drop.data() : ws.s.data(), t.rows, t.cols, ws.dout, ws.dvp, ws.dv.data(),
                  acc.kv_add);                                                            // dV += Pᵀ dO
  cols_times_rows(ws.ds.data(), t.rows, t.cols, ws.q, ws.dkp, ws.dk.data(), acc.kv_add);  // dK += dSᵀ Q
  rows_times_rows(ws.ds.data(), t.rows, t.cols, kt.k, ws.dkp, acc.dq, acc.ldq, acc.dq_add);  // dQ += dS K
}

// ---- sweep 1: the rows' statistics ---------------------------------------------------------------------------

// The keys some row of the block [i0, i0 + rows) sees lie in [first.lo, last.hi): both ends are
// non-decreasing in the row.
inline core::KeyRange block_keys(const core::Problem& p, std::int64_t b, std::int64_t i0, std::int64_t rows) {
  return {core::key_range(p, b, i0).lo, core::key_range(p, b, i0 + rows - 1).hi};
}

// One key tile of sweep 1 in vectors, the forward's layout (the block's rows in SIMD lanes: Sᵀ = K Qᵀ and
// dPᵀ = V dOᵀ with K and V rows read as broadcast scalars, so no tile is transposed; each score and dP is the same
// sequence of fused multiply-adds over d as sweep 2's, so the same bits): the scores through the variant's hooks
// (rounded as sweep 2 rounds them), then each row's state advances over the tile and takes its weights, and,
// with_dp, the weights times dP (dropped weights' dP times z) for D.
template <class Variant>
void statistics_tile(const core::Problem& p, const TilePair& t, const KeyTile& kt, bool with_dp, Workspace& ws,
                     RowState* state) {
  float* st = ws.s.data();    // Sᵀ [BC][BR]
  float* dpt = ws.ds.data();  // dPᵀ [BC][BR]
  gemm<false>(t.cols, BR, p.Dk, kt.k.base, kt.k.ld, 1, ws.qt.data(), BR, st, BR);                 // Sᵀ = K Qᵀ
  if (with_dp) {
    gemm<false>(t.cols, BR, p.Dv, kt.v.base, kt.v.ld, 1, ws.dot.data(), BR, dpt, BR);              // dPᵀ = V dOᵀ
    if (Variant::dropout(p)) {                                                                  // dPᵀ ∘ zᵀ
      float* zt = ws.drop.data();  // [BC][BR]
      for (std::int64_t r = 0; r < t.rows; ++r) p.dropout.factors(t.b, t.h, t.i0 + r, t.j0, t.cols, zt + r, BR);
      for (std::int64_t c = 0; c < t.cols; ++c)
        for (std::int64_t r = 0; r < t.rows; ++r) dpt[c * BR + r] *= zt[c * BR + r];
    }
  }
  // x = scale·S through the variant's hooks (rounded as sweep 2 rounds), -inf where a row may not look
  bool interior = !Variant::kPerElement;
  for (std::int64_t r = 0; r < t.rows && interior; ++r) interior = ws.range[r].lo <= t.j0 && t.j0 + t.cols <= ws.range[r].hi;
  const float scale_f = static_cast<float>(p.scale);
  if (interior) {
    const V sc = Vec::set1(scale_f);
    for (std::int64_t c = 0; c < t.cols; ++c)
      for (std::int64_t v = 0; v < BR; v += W) Vec::store(st + c * BR + v, Vec::mul(Vec::load(st + c * BR + v), sc));
  } else {
    for (std::int64_t r = 0; r < t.rows; ++r) {
      const auto vrow = Variant::row(p, t.b, t.h, t.i0 + r);
      for (std::int64_t c = 0; c < t.cols; ++c) {
        const std::int64_t j = t.j0 + c;
        float& x = st[c * BR + r];
        x = (j < ws.range[r].lo || j >= ws.range[r].hi || vrow.hidden(j)) ? core::kNegInf : vrow.logit(j, x * scale_f);
      }
    }
  }
  // Each row's state over the tile: advance to the tile's max, then add its weights (and weights times dP).
  const V c_v = Vec::set1(static_cast<float>(kC));
  for (std::int64_t v0 = 0; v0 < t.rows; v0 += W) {
    V mx = Vec::set1(core::kNegInf);
    for (std::int64_t c = 0; c < t.cols; ++c) mx = Vec::max(mx, Vec::load(st + c * BR + v0));
    alignas(64) float tmax[W], origin[W];
    Vec::store(tmax, mx);
    for (int lane = 0; lane < W; ++lane) {
      RowState& s = state[v0 + lane];
      s.advance(tmax[lane], kC);
      origin[lane] = static_cast<float>(s.origin());
    }
    const V o = Vec::load(origin);
    V sum = Vec::zero(), sum_dp = Vec::zero();
    for (std::int64_t c = 0; c < t.cols; ++c) {
      const V e = LaneState::weight(Vec::load(st + c * BR + v0), o, c_v);
      sum = Vec::add(sum, e);
      if (with_dp) sum_dp = Vec::fmadd(e, Vec::load(dpt + c * BR + v0), sum_dp);
    }
    alignas(64) float sums[W], dps[W];
    Vec::store(sums, sum), Vec::store(dps, sum_dp);
    for (int lane = 0; lane < W; ++lane) state[v0 + lane].add(sums[lane], dps[lane]);
  }
}

// The same pair by pair in fp64 (a tile with large scores, or with NaN or inf: sweep 2's exact arithmetic too):
// each attended pair's score from a double dot product, the row's state advanced to it and taking its weight; dP
// as sweep 2 forms it (fp32 from dPᵀ = V dOᵀ on a wide tile, fp64 on an exact one).
template <class Variant>
void statistics_pairs(const core::Problem& p, const TilePair& t, const KeyTile& kt, const TileKind& kind,
                      bool with_dp, Workspace& ws, RowState* state) {
  float* dpt = ws.ds.data();  // dPᵀ [BC][BR]
  if (with_dp && !kind.exact) gemm<false>(t.cols, BR, p.Dv, kt.v.base, kt.v.ld, 1, ws.dot.data(), BR, dpt, BR);
  float* z = ws.drop.data();  // the row's dropout factors, when on
  for (std::int64_t r = 0; r < t.rows; ++r) {
    const float* q = ws.q.base + r * ws.q.ld;
    const float* g = ws.dout.base + r * ws.dout.ld;
    if (with_dp && Variant::dropout(p)) p.dropout.factors(t.b, t.h, t.i0 + r, t.j0, t.cols, z, 1);
    for (std::int64_t c = 0; c < t.cols; ++c) {
      const double x = pair_score<Variant>(p, t, r, c, ws.range[r], q, kt.k.base + c * kt.k.ld, 1);
      if (x == -std::numeric_limits<double>::infinity()) continue;  // hidden, or a -inf score: no weight
      double dp = 0;
      if (with_dp) {
        if (kind.exact)
          for (std::int64_t d = 0; d < p.Dv; ++d) dp += static_cast<double>(g[d]) * kt.v.base[c * kt.v.ld + d];
        else
          dp = dpt[c * BR + r];
        if (Variant::dropout(p)) dp *= z[c];
      }
      state[r].absorb(x, kC, dp);
    }
  }
}

// D_i = dO_i · O_i in fp64, from the forward's O.
template <class QT>
double output_dot(const core::BackwardProblem& bp, std::int64_t b, std::int64_t h, std::int64_t i, const float* g) {
  const core::Problem& p = bp.fwd;
  const QT* o = static_cast<const QT*>(p.out.data) + p.out.offset(b, h, i, 0);
  double d = 0;
  for (std::int64_t e = 0; e < p.Dv; ++e) d += static_cast<double>(g[e]) * core::to_float(o[e * p.out.stride[3]]);
  return d;
}

// m = LSE, inv_l = 1 and D = dO·O for every row of the block (Params::backward_statistics = from_forward, ring
// attention: the keys here may be a subset of those the LSE and O were formed over, so only the given ones are
// right). An empty row (LSE = -inf) contributes nothing.
template <class QT>
void statistics_from_forward(const core::BackwardProblem& bp, std::int64_t b, std::int64_t h, std::int64_t i0,
                             std::int64_t rows, const Workspace& ws, Statistics& stats) {
  const core::Problem& p = bp.fwd;
  const auto* saved = static_cast<const float*>(p.lse->data);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    const float lse = saved[p.lse->offset(b, h, i0 + r, 0)];
    const bool empty = lse == core::kNegInf;
    stats.m[row] = empty ? 0.0 : lse;
    stats.inv_l[row] = empty ? 0.0f : 1.0f;
    stats.d[row] = empty ? 0.0 : output_dot<QT>(bp, b, h, i0 + r, ws.dout.base + r * ws.dout.ld);
  }
}

// Whether D = dO·O serves a block: O is f32, its scores are small (every |scale·q·k| <= kMildLogits by the norms of its Q and
// its keys, every LSE within ±kMildLse: no dense mask moved them far) and its scale ordinary, everything finite;
// with a sink, also every dO value finite (D must stay Σ over the row's keys, which dO·O is not when dO holds a NaN
// or inf and the row attends no key: O = 0). Elsewhere D = Σ_j P_ij dP_ij from the same P and dP as sweep 2, since
// in a peaked row dS = scale·P·(dP − D) cancels and D = dO·O from the forward's differently rounded O leaves scale
// times its rounding (measured: 10x a naive backward's error on peaked rows; 1e23 for scale 1e30, inf in f16
// gradients), where D from the same P and dP cancels as the naive computation does.
inline bool mild_block(const core::Problem& p, const Statistics& stats, std::int64_t b, std::int64_t h,
                       std::int64_t i0, std::int64_t rows, const Workspace& ws) {
  if (p.scale > kExactDScale) return false;
  // O given in bf16 or f16 carries its rounding (2^-9, 2^-12 of |O|) into D = dO·O, and a row that peaks within the
  // bound (weights up to e^16 apart; ALiBi and masks peak rows the bound does not see) cancels dS = P(dP − D) down
  // to that rounding: dq and dk up to 16x a naive backward's error from fp32 on the same inputs, dq = 1e-3 where it
  // is 0 with one visible key under dropout (found by an outside check). Those take D = Σ_j P_ij dP_ij.
  if (p.out.dtype != DType::f32) return false;
  const std::int64_t hk = h / p.group, tiles_per_head = (p.Skv + BC - 1) / BC;
  const core::KeyRange keys = block_keys(p, b, i0, rows);
  float bound = 0;  // scale·max‖q‖·max‖k‖ over the block's tiles; NaN with a NaN or inf in Q, dO, K or V
  for (std::int64_t j0 = keys.lo / BC * BC; j0 < keys.hi; j0 += BC) {
    const auto tile = static_cast<std::size_t>((b * p.Hkv + hk) * tiles_per_head + j0 / BC);
    bound = nan_max(bound, static_cast<float>(p.scale) * ws.qnorm * stats.knorm[tile]);
    bound = nan_max(bound, (stats.vnorm[tile] + ws.donorm) * 0.0f);  // (NaN for inf too: inf·0)
  }
  if (!(bound <= kMildLogits)) return false;
  const auto* saved = static_cast<const float*>(p.lse->data);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float x = saved[p.lse->offset(b, h, i0 + r, 0)];
    if (!((std::isfinite(x) && std::fabs(x) <= kMildLse) || x == core::kNegInf)) return false;
  }
  for (std::int64_t r = 0; r < rows && p.sinks; ++r)
    for (std::int64_t e = 0; e < p.Dv; ++e)
      if (!std::isfinite(ws.dout.base[r * ws.dout.ld + e])) return false;
  return true;
}

// Qᵀ and dOᵀ of the block in hand (sweep 1's vector tiles), rows past the block zero.
inline void transpose_block(const core::Problem& p, std::int64_t rows, Workspace& ws) {
  std::fill(ws.qt.begin(), ws.qt.end(), 0.0f);
  std::fill(ws.dot.begin(), ws.dot.end(), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < p.Dk; ++d) ws.qt[d * BR + r] = ws.q.base[r * ws.q.ld + d];
    for (std::int64_t d = 0; d < p.Dv; ++d) ws.dot[d * BR + r] = ws.dout.base[r * ws.dout.ld + d];
  }
}

// Sweep 1, the statistics of query rows [i0, i0 + rows) of head h: each row's online-softmax state (core::
// OnlineSoftmax: the forward's, here in fp64) over the scores its keys get, recomputed with the same arithmetic as
// sweep 2 (so a row with one allowed key gets P = 1 exactly), its head's sink absorbed first; then m, inv_l = 1/l
// and D (the state's second sum over l, or dO·O for a mild block). The forward's LSE is not used for P: it is
// fp32, and its rounding (half an ulp of |LSE|) would be an error of that size in every recomputed exponent (for
// |LSE| ~ 10-30 that made gradients 2-18x less accurate than a naive fp32 backward's; with |LSE| ~ 1e10, from a
// -1e10 mask, no normalisation at all).
template <class QT, class KVT, class Variant>
void row_statistics(const core::BackwardProblem& bp, std::int64_t b, std::int64_t h, std::int64_t i0,
                    std::int64_t rows, Workspace& ws, Statistics& stats) {
  const core::Problem& p = bp.fwd;
  load_query_block<QT>(bp, stats, false, b, h, i0, rows, ws);
  if (p.stats_from_forward) return statistics_from_forward<QT>(bp, b, h, i0, rows, ws, stats);
  const bool d_from_output = mild_block(p, stats, b, h, i0, rows, ws);
  RowState state[BR];
  for (std::int64_t r = 0; r < rows; ++r)
    if (p.sinks) state[r].absorb(p.sink(h), kC);  // a logit with no value (dP = 0)
  transpose_block(p, rows, ws);  // Qᵀ, dOᵀ for the vector tiles
  const core::KeyRange keys = block_keys(p, b, i0, rows);
  const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)];
  for (std::int64_t j0 = keys.lo / BC * BC; j0 < keys.hi; j0 += BC) {  // the grid sweep 2 uses: the same scores
    const TilePair t{b, h, i0, rows, j0, std::min(BC, len - j0)};
    const KeyTile kt = load_key_tile<KVT>(p, stats, b, h / p.group, j0, t.cols, ws,
                                          d_from_output ? TileForm::rows : TileForm::rows_and_values);
    const TileKind kind = tile_kind(p, ws.qnorm, ws.donorm, kt.knorm, kt.vnorm);
    if (kind.wide) statistics_pairs<Variant>(p, t, kt, kind, !d_from_output, ws, state);
    else statistics_tile<Variant>(p, t, kt, !d_from_output, ws, state);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i0 + r);
    const RowState::Statistics s = state[r].statistics();
    stats.m[row] = s.m;
    stats.inv_l[row] = static_cast<float>(s.inv_l);
    stats.d[row] = s.inv_l == 0 ? 0.0 : d_from_output ? output_dot<QT>(bp, b, h, i0 + r, ws.dout.base + r * ws.dout.ld) : s.mean_w;
  }
}

// ---- sweep 2: the gradients ------------------------------------------------------------------------------

template <class T>
void store_rows(const core::Strided& t, std::int64_t b, std::int64_t h, std::int64_t s0, std::int64_t rows,
                std::int64_t dim, const float* src, std::int64_t ld) {
  T* base = static_cast<T*>(const_cast<void*>(t.data));
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dst = base + t.offset(b, h, s0 + r, 0);
    for (std::int64_t d = 0; d < dim; ++d) dst[d * t.stride[3]] = core::from_float<T>(src[r * ld + d]);
  }
}

// How the keys are cut into chunks (sweep 2's items are (batch, KV head, chunk)), and what a call allocates:
// Plan::bytes() is the one formula of a call's scratch (Scratch holds exactly that). Shape only.
struct Plan {
  std::int64_t chunks = 1, chunk_len = 0, items = 0;
  std::int64_t kblocks = 0, tiles = 0, qblocks = 0, q_items = 0, rows = 0;
  bool dq_in_place = false;  // dQ summed in the caller's fp32 rows (one chunk), else in partials
  Workspace::Shape shape;
  explicit Plan(const core::BackwardProblem& bp) {
    const core::Problem& p = bp.fwd;
    // Key chunks only when B·Hkv alone gives too few items (cpu/schedule.h: the shape only).
    constexpr std::int64_t kMinItems = 8, kMinChunkKeys = 4 * BC;
    const Cut cut = cut_length(p.B * p.Hkv, p.Skv, kMinItems, kMinChunkKeys, BC);
    chunks = cut.pieces, chunk_len = cut.piece_len;
    items = p.B * p.Hkv * chunks;
    kblocks = (p.Skv + BC - 1) / BC, tiles = p.B * p.Hkv * kblocks;
    qblocks = (p.Sq + BR - 1) / BR, q_items = p.B * p.Hq * qblocks;
    rows = p.B * p.Hq * p.Sq;
    shape = {p.Dk, p.Dv, p.group * qblocks};
    dq_in_place = chunks == 1 && p.q.dtype == DType::f32 && bp.dq.stride[3] == 1 && p.Dk == shape.dkp();
  }
  std::int64_t most_items() const { return std::max(tiles + q_items, items); }
  std::int64_t dq_part_len() const { return dq_in_place ? 0 : rows * shape.dkp(); }  // one chunk's
  std::int64_t bytes(int threads) const {
    return team_size(threads, most_items()) * Workspace::bytes(shape) + rows * (8 + 8 + 4) +
           4 * 2 * (q_items + tiles) + 4 * chunks * dq_part_len();
  }
};

// Where sweep 2 adds dQ: row i of the group's head g at base + g·hs + i·rs (fp32, Dkp wide).
struct DqTarget {
  float* base;
  std::int64_t hs, rs;
};

// Sweep 2: keys [k_lo, k_hi) of KV head hk. Per key block: over the group's query heads (in order) and every
// query block whose rows see the block (in order), the tile steps; then the block's dK and dV are stored.
// dQ is added into dqt (this item's own rows); ws.written marks its query blocks holding a sum already (the
// first term of a block is stored, not added: nothing needs zeroing first). Keys at or past the batch's key
// length are never read (their dK and dV are zero).
template <class QT, class KVT, class Variant>
void key_chunk(const core::BackwardProblem& bp, const Statistics& stats, std::int64_t b, std::int64_t hk,
               std::int64_t k_lo, std::int64_t k_hi, const DqTarget& dqt, Workspace& ws) {
  const core::Problem& p = bp.fwd;
  const std::int64_t qblocks = (p.Sq + BR - 1) / BR;
  const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)];
  for (std::int64_t j0 = k_lo; j0 < k_hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, k_hi - j0);       // the block's keys
    const std::int64_t seen = std::min(cols, len - j0);      // those below the key length
    bool kv_add = false;  // dK and dV of this key block hold a sum
    if (seen > 0) {
      const KeyTile kt = load_key_tile<KVT>(p, stats, b, hk, j0, seen, ws, TileForm::transposed);
      for (std::int64_t g = 0; g < p.group; ++g)
        for (std::int64_t i0 = 0; i0 < p.Sq; i0 += BR) {
          const TilePair t{b, hk * p.group + g, i0, std::min(BR, p.Sq - i0), j0, seen};
          const core::KeyRange keys = block_keys(p, b, i0, t.rows);
          if (keys.lo >= j0 + cols || keys.hi <= j0 || keys.hi <= keys.lo) continue;
          char& dq_add = ws.written[static_cast<std::size_t>(g * qblocks + i0 / BR)];
          const Accumulators acc{dqt.base + g * dqt.hs + i0 * dqt.rs, dqt.rs, dq_add != 0, kv_add};
          load_query_block<QT>(bp, stats, true, b, t.h, i0, t.rows, ws);
          const TileKind kind = tile_kind(p, ws.qnorm, ws.donorm, kt.knorm, kt.vnorm);
          bool interior = !Variant::kPerElement && seen == BC;
          for (std::int64_t r = 0; r < t.rows && interior; ++r) interior = ws.range[r].lo <= j0 && j0 + BC <= ws.range[r].hi;
          if (kind.exact) {  // NaN or inf in the tile: pair by pair
            tile_exact<Variant>(p, t, kt, acc, ExactScores::recompute, ws);
          } else if (!stats_finite(t.rows, ws)) {  // a finite tile, rows with NaN statistics: its scores as sweep 1's
            scores(p, t.rows, kt, kind.wide, ws);
            masked_scores<Variant>(p, t, kind.wide, interior, ws);
            tile_exact<Variant>(p, t, kt, acc, kind.wide ? ExactScores::fp64 : ExactScores::fp32, ws);
          } else {
            tile_products<Variant>(p, t, kt, kind, interior, acc, ws);
          }
          kv_add = true, dq_add = 1;
        }
    }
    float* dk = ws.dk.data();
    float* dv = ws.dv.data();
    if (!kv_add) {  // no query sees these keys
      std::fill(dk, dk + BC * ws.dkp, 0.0f);
      std::fill(dv, dv + BC * ws.dvp, 0.0f);
    } else if (seen < cols) {  // keys past the length
      std::fill(dk + std::max<std::int64_t>(seen, 0) * ws.dkp, dk + cols * ws.dkp, 0.0f);
      std::fill(dv + std::max<std::int64_t>(seen, 0) * ws.dvp, dv + cols * ws.dvp, 0.0f);
    }
    store_rows<KVT>(bp.dk, b, hk, j0, cols, p.Dk, dk, ws.dkp);
    store_rows<KVT>(bp.dv, b, hk, j0, cols, p.Dv, dv, ws.dvp);
  }
}

// A call's scratch, as Plan::bytes() counts it: the team's workspaces, the statistics and the dQ partial sums,
// kept between calls in the caller's attn::Workspace (under kScratchKey, one per instruction set) when it gives
// one. bytes() measures what it holds.
struct Scratch {
  Workspace::Shape shape{-1, -1, -1};
  std::vector<Workspace> team;
  Statistics stats;
  std::int64_t bytes() const {
    std::int64_t n = static_cast<std::int64_t>(
        8 * (stats.m.capacity() + stats.d.capacity()) +
        4 * (stats.inv_l.capacity() + stats.qnorm.capacity() + stats.donorm.capacity() + stats.knorm.capacity() +
             stats.vnorm.capacity() + stats.dq_part.capacity()));
    for (const Workspace& w : team) n += held_bytes(w, shape);
    return n;
  }
};
inline constexpr char kScratchKey = 0;

// Sweep 0 for key tile t (every KV head's tiles in order) and query block q_item: the largest row norms.
template <class KVT>
void key_tile_norms(const core::Problem& p, const Plan& plan, std::int64_t t, Workspace& ws, Statistics& stats) {
  const std::int64_t kb = t % plan.kblocks, hk = (t / plan.kblocks) % p.Hkv, b = t / (plan.kblocks * p.Hkv);
  const std::int64_t n = std::clamp<std::int64_t>(p.kv_len[static_cast<std::size_t>(b)] - kb * BC, 0, BC);
  const auto at = static_cast<std::size_t>(t);
  stats.knorm[at] = max_row_norm(key_rows<KVT>(p, b, hk).as_float_block(kb * BC, n, ws.dkp, ws.kbuf.data()), n, ws.dkp);
  stats.vnorm[at] = max_row_norm(value_rows<KVT>(p, b, hk).as_float_block(kb * BC, n, ws.dvp, ws.vbuf.data()), n, ws.dvp);
}
template <class QT>
void query_block_norms(const core::BackwardProblem& bp, const Plan& plan, std::int64_t it, Workspace& ws,
                       Statistics& stats) {
  const core::Problem& p = bp.fwd;
  const std::int64_t qb = it % plan.qblocks, h = (it / plan.qblocks) % p.Hq, b = it / (plan.qblocks * p.Hq);
  const std::int64_t n = std::min(BR, p.Sq - qb * BR);
  const auto at = static_cast<std::size_t>(it);
  stats.qnorm[at] = max_row_norm(head_rows<QT>(p, p.q, p.Dk, b, h).as_float_block(qb * BR, n, ws.dkp, ws.qbuf.data()), n, ws.dkp);
  stats.donorm[at] =
      max_row_norm(head_rows<QT>(p, bp.dout, p.Dv, b, h).as_float_block(qb * BR, n, ws.dvp, ws.doutbuf.data()), n, ws.dvp);
}

// ∂L/∂sink_h = −Σ_{b,i} P_sink · D_i with P_sink = e^(sink_h − m_i)·inv_l_i (the sink's weight in the row's
// softmax; it has no value, so its dP is 0), summed over the rows in order: the same bits at any thread count.
inline void sink_gradients(const core::BackwardProblem& bp, const Statistics& stats) {
  const core::Problem& p = bp.fwd;
  auto* out = static_cast<float*>(const_cast<void*>(bp.dsinks->data));
  for (std::int64_t h = 0; h < p.Hq; ++h) {
    const double sink = p.sink(h);
    double acc = 0;
    for (std::int64_t b = 0; b < p.B && sink != -std::numeric_limits<double>::infinity(); ++b)
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const auto row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i);
        if (stats.inv_l[row] != 0.0f) acc += RowState::weight(sink, stats.m[row], kC) * stats.inv_l[row] * stats.d[row];
      }
    out[h * bp.dsinks->stride[1]] = static_cast<float>(-acc);
  }
}

template <class QT, class KVT, class Variant>
void flash_backward(const core::BackwardProblem& bp, int threads) {
  const core::Problem& p = bp.fwd;
  const Plan plan(bp);
  // The call's scratch, allocated before the work starts (the team's workspaces by their own threads, in
  // run_team), kept in the caller's attn::Workspace when it gives one. Every buffer is reset here or written before
  // it is read (dq_part: every row of a chunk's partial is stored before it is added to, blocks that see none of
  // the chunk's keys are zero-filled, so a reused workspace's partials are not cleared serially on every call).
  Scratch local;
  Scratch& sc = core::scratch(p.workspace, &kScratchKey, local, plan.bytes(threads));
  if (!(sc.shape == plan.shape)) sc.team.clear(), sc.shape = plan.shape;
  Statistics& stats = sc.stats;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  stats.m.assign(n(plan.rows), 0.0);
  stats.d.assign(n(plan.rows), 0.0);
  stats.inv_l.assign(n(plan.rows), 0.0f);
  stats.qnorm.assign(n(plan.q_items), 0.0f);
  stats.donorm.assign(n(plan.q_items), 0.0f);
  stats.knorm.assign(n(plan.tiles), 0.0f);
  stats.vnorm.assign(n(plan.tiles), 0.0f);
  stats.dq_part.resize(n(plan.chunks * plan.dq_part_len()));
  const std::int64_t dkp = plan.shape.dkp(), part_len = plan.dq_part_len();
  // dQ of item it's heads: the caller's own fp32 rows (one chunk per KV head, rows of whole vectors; each item owns
  // its heads' rows), else its chunk's partial [chunk][B][Hq][Sq][Dkp] that sweep 3 adds up.
  const auto dq_target = [&](std::int64_t b, std::int64_t hk, std::int64_t chunk) -> DqTarget {
    const std::int64_t h0 = hk * p.group;
    if (p.Sq == 0) return {nullptr, 0, 0};  // (no offset is formed from a null data pointer)
    if (plan.dq_in_place)
      return {static_cast<float*>(const_cast<void*>(bp.dq.data)) + bp.dq.offset(b, h0, 0, 0), bp.dq.stride[1], bp.dq.stride[2]};
    return {stats.dq_part.data() + chunk * part_len + (b * p.Hq + h0) * p.Sq * dkp, p.Sq * dkp, dkp};
  };
  run_team(&sc.team, threads, plan.most_items(), [&](int) { return Workspace(plan.shape); },
           // Sweep 0: the largest row norm of every key and value tile (keys below the batch's key length only),
           // and of every query and dO block.
           loop(plan.tiles, [&](std::int64_t t, Workspace& ws) { key_tile_norms<KVT>(p, plan, t, ws, stats); },
                Spread::even, /*wait=*/false),
           loop(plan.q_items, [&](std::int64_t it, Workspace& ws) { query_block_norms<QT>(bp, plan, it, ws, stats); },
                Spread::even),
           // Sweep 1: every row's statistics (complete before sweep 2 reads them).
           loop(plan.q_items, [&](std::int64_t it, Workspace& ws) {
             const std::int64_t qb = it % plan.qblocks, h = (it / plan.qblocks) % p.Hq, b = it / (plan.qblocks * p.Hq);
             row_statistics<QT, KVT, Variant>(bp, b, h, qb * BR, std::min(BR, p.Sq - qb * BR), ws, stats);
           }),
           // Sweep 2: dK and dV of each chunk of keys, dQ summed into the item's rows.
           loop(plan.items, [&](std::int64_t it, Workspace& ws) {
             const std::int64_t c = it % plan.chunks, hk = (it / plan.chunks) % p.Hkv, b = it / (plan.chunks * p.Hkv);
             const DqTarget dqt = dq_target(b, hk, c);
             std::fill(ws.written.begin(), ws.written.end(), 0);
             key_chunk<QT, KVT, Variant>(bp, stats, b, hk, c * plan.chunk_len, std::min(p.Skv, (c + 1) * plan.chunk_len),
                                         dqt, ws);
             for (std::int64_t g = 0; g < p.group; ++g)  // query blocks that saw none of the chunk's keys
               for (std::int64_t qb = 0; qb < plan.qblocks; ++qb)
                 if (!ws.written[static_cast<std::size_t>(g * plan.qblocks + qb)])
                   for (std::int64_t i = qb * BR; i < std::min(p.Sq, (qb + 1) * BR); ++i)
                     std::fill_n(dqt.base + g * dqt.hs + i * dqt.rs, dkp, 0.0f);
           }),
           // Sweep 3 (partials only): dQ = Σ_chunks partial, per query block, chunks in order.
           loop(plan.dq_in_place ? 0 : plan.q_items, [&](std::int64_t it, Workspace&) {
             const std::int64_t qb = it % plan.qblocks, h = (it / plan.qblocks) % p.Hq, b = it / (plan.qblocks * p.Hq);
             const std::int64_t i0 = qb * BR, rows = std::min(BR, p.Sq - i0);
             float* sum = stats.dq_part.data() + ((b * p.Hq + h) * p.Sq + i0) * dkp;
             for (std::int64_t c = 1; c < plan.chunks; ++c)
               for (std::int64_t e = 0; e < rows * dkp; ++e) sum[e] += sum[c * part_len + e];
             store_rows<QT>(bp.dq, b, h, i0, rows, p.Dk, sum, dkp);
           }, Spread::even));
  if (bp.dsinks) sink_gradients(bp, stats);
}

// The bytes a call allocates at `threads` threads (Plan::bytes).
inline std::int64_t workspace_bytes(const core::BackwardProblem& bp, int threads) { return Plan(bp).bytes(threads); }

// The backward kernel of this instruction set for the given dtypes and variant, or null (cpu/pick.h).
template <class QT, class KVT, class Variant>
struct BackwardKernel {
  static constexpr BackwardFn fn = &flash_backward<QT, KVT, Variant>;
};
inline BackwardFn pick_backward(DType q, DType kv, core::VariantKind variant) {
  return pick_kernel<BackwardFn, BackwardKernel>(q, kv, variant);
}

}  // namespace attn::cpu::ATTN_ISA_NS::bwd
