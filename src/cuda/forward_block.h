// attn's own forward kernel on the GPU, FlashAttention-2 style, written once as a block program over the warp
// policy of cuda/warp.h: the device kernel (cuda/forward.cu) runs it with DeviceWarp, the host tests
// (tests/test_cuda_forward.cc) run the very same functions with HostWarp, warp by warp, against the fp64
// reference on the registry's cases.
//
// A thread block takes C::kBlockM = 64 rows of one KV head's packed query rows (cuda/schedule.h: its query
// heads one after the other; a decode step's whole GQA group shares a block and each K/V tile is read once for
// it): four warps of 16 rows each (a warp whose rows are all padding, as most are in a decode step's block,
// copies its share of the tiles and computes nothing), each lane's rows with their own query head and row. It walks the key tiles
// of C::kBlockN keys its rows may attend (cuda/schedule.h key_tiles: causal, window and
// key-length bounds; tiles allowed whole skip the per-element mask), and for each tile:
//
//   load_kv   all warps copy the tile's K and V rows to shared memory (zeros past the key length and the head
//             dims: padded columns add 0 to every dot product, padded V rows 0 to every output)
//   compute   each warp: S = Q·Kᵀ on tensor cores (Q and K through ldmatrix, mma.m16n8k16, fp32 accumulators);
//             the variant's scores (core/variant.h hooks; -inf outside the row's keys); the online-softmax step
//             (core::OnlineSoftmax, the CPU kernels' state, one per row half a lane holds); P = 2^((s - m)·c)
//             rounded to the operand type and kept in registers as the A operand of O += P·V (V through the
//             transposing ldmatrix); dropout's factors (core::Dropout, the CPU's Philox counters) on P·V only
//   finish    each warp: the quad's partial sums added, the row finished with its sink (core::finish_with_sink),
//             O and the LSE stored in the caller's dtype and strides
//
// Scores are in the CPU kernels' units (core/online_softmax.h): without a per-element variant the raw q·k with the
// scale folded into the exponent (c = scale·log2 e), else the logits in natural-log units (c = log2 e). Each
// lane keeps its own share of a row's sum l (advance() rescales it by the row's α, the same on the four lanes
// of a quad); the quad adds the shares once, at the end.
//
// Head dims: Q·Kᵀ and P·V run over C::kD (64, 128 or 256), Dk and Dv padded with zeros up to it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dropout.h"
#include "core/hd.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/variant.h"
#include "cuda/device_problem.h"
#include "cuda/elem.h"
#include "cuda/fragment.h"
#include "cuda/schedule.h"
#include "cuda/warp.h"

namespace attn::cuda::fwd {

using i64 = std::int64_t;

// The tile shape of one instantiation: operand type T, head dims padded to D.
template <MmaType T, int D, int BlockN = (D <= 128 ? 64 : 32)>
struct Config {
  static_assert(D % 16 == 0 && D >= 16 && D <= 256, "head dims are padded to a multiple of 16, at most 256");
  static constexpr MmaType kType = T;
  static constexpr int kD = D;
  // Four warps. Eight (128 rows sharing each K/V tile) measured slower on an H100: one block of 8 warps per SM
  // (registers) against two of 4, whose barriers interleave (d128 prefill 1.85 ms against 1.50).
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps;            // query rows per block, 16 per warp
  static constexpr int kBlockN = BlockN;  // keys per tile (D = 256: fewer, for the registers and shared memory)
  static_assert(BlockN % 16 == 0 && BlockN <= 128, "key tiles of whole k-steps");
  // 16-bit elements per shared-memory row: 16 bytes of padding keep each row 16-byte aligned (ldmatrix, cp.async)
  // and put the eight rows of an ldmatrix matrix in different banks.
  static constexpr int kLd = D + 8;
  // Q, then two stages of (K, V): tile t + 1 is copied into one while tile t is computed from the other.
  static constexpr int kStages = 2;
  static constexpr int kQ = 0;
  static constexpr int kStageElems = 2 * kBlockN * kLd;
  ATTN_HD static constexpr int k_at(int stage) { return kBlockM * kLd + stage * kStageElems; }
  ATTN_HD static constexpr int v_at(int stage) { return k_at(stage) + kBlockN * kLd; }
  static constexpr int kSmemElems = kBlockM * kLd + kStages * kStageElems;
  static constexpr int kSmemBytes = 2 * kSmemElems;
  // 16-byte chunks (8 elements) of a row, and of a K or V tile per thread.
  static constexpr int kChunks = D / 8;
  static constexpr int kTileChunksPerThread = kBlockN * kChunks / kThreads;
  static_assert(kBlockN * kChunks % kThreads == 0 && kThreads % kChunks == 0,
                "a K/V tile's chunks share out evenly over the threads, whole rows at a time");
  static constexpr int kRowStep = kThreads / kChunks;  // rows between a thread's chunks
  static constexpr int kSBlocks = kBlockN / 8;  // n-blocks of S (8 keys each)
  static constexpr int kOBlocks = D / 8;        // n-blocks of O (8 dims each)
  static constexpr int kKSteps = D / 16;        // k-steps of Q·Kᵀ
  static constexpr int kPSteps = kBlockN / 16;  // k-steps of P·V
};

// The padded head dim an instantiation must have for Dk and Dv (0: more than 256, not on the GPU).
ATTN_HD constexpr int padded_head_dim(i64 Dk, i64 Dv) {
  const i64 d = Dk > Dv ? Dk : Dv;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}

// 2^x: on the device the bare MUFU.EX2 (ex2.approx.ftz: about 2 ulp, results below 2^-126 flushed to 0, which a
// softmax weight that small is anyway after the sum); on the host std::exp2.
ATTN_HD float exp2_approx(float x) {
#if ATTN_DEVICE_PASS
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// The lane arithmetic of core::OnlineSoftmax for the rows a warp's lanes hold: one value per lane (Reg<float>).
template <class W>
struct WarpLanes {
  using T = typename W::template Reg<float>;
  ATTN_HD static T set1(float x) { return T(x); }
  ATTN_HD static T add(const T& a, const T& b) { return a + b; }
  ATTN_HD static T sub(const T& a, const T& b) { return a - b; }
  ATTN_HD static T mul(const T& a, const T& b) { return a * b; }
  ATTN_HD static T max(const T& a, const T& b) {
    return W::map([](float x, float y) { return x > y ? x : y; }, a, b);  // core::ScalarLanes::max
  }
  ATTN_HD static T exp2(const T& x) {
    return W::map([](float v) { return exp2_approx(v); }, x);
  }
  ATTN_HD static T if_neg_inf(const T& x, const T& a, const T& b) {
    return W::map([](float v, float p, float q) { return v == core::kNegInf ? p : q; }, x, a, b);
  }
};

// cuda/schedule.h's masks of a problem.
ATTN_HD sched::Masks masks_of(const DeviceProblem& p) {
  sched::Masks m;
  m.Sq = p.Sq;
  m.causal = static_cast<sched::CausalMode>(p.causal);
  m.window_left = p.window.left;
  m.window_right = p.window.right;
  m.window_bottom_right = p.window.align == Align::bottom_right;
  return m;
}

// One thread block's program. C: Config; V: the score variant (core/variant.h: Variant<NoDenseMask, Identity>
// for plain and causal attention, ModsVariant for dense masks, softcap, ALiBi and dropout); W: the warp policy.
template <class C, class V, class W>
struct ForwardBlock {
  using F32 = typename W::template Reg<float>;
  using U32 = typename W::template Reg<std::uint32_t>;
  using I64 = typename W::template Reg<i64>;
  using State = core::OnlineSoftmax<WarpLanes<W>>;
  static constexpr bool kPerElement = V::kPerElement;

  // The registers of one warp: its 16 rows' output accumulators (C layout: n-block of 8 dims, 4 registers) and the
  // state of the two rows each lane holds (g and g + 8).
  struct Warp {
    F32 o[C::kOBlocks][frag::kCRegs];
    State row[2];
  };

  using Row = sched::PackedRow;

  const DeviceProblem& p;
  std::uint16_t* smem;  // C::kSmemElems 16-bit elements, 16-byte aligned
  i64 b = 0, hk = 0;
  i64 Sr = 0, r0 = 0;      // packed rows per head; the block's first packed row
  i64 i_lo = 0, i_hi = 0;  // the query rows (within a head) the block's rows lie in
  i64 len = 0;
  i64 split = 0;  // the part of the keys (split-KV; 0 without)
  float c = 0;   // score units -> log2 units
  double k = 0;  // score units -> natural-log units

  ATTN_HD ForwardBlock(const DeviceProblem& problem, std::uint16_t* shared, i64 block, i64 part = 0)
      : p(problem), smem(shared), split(part) {
    const sched::PackedWork work = sched::packed_work(block, p.Hkv, p.group, p.Sq, C::kBlockM);
    b = work.b, hk = work.hk;
    Sr = sched::packed_rows_per_head(p.Sq, C::kBlockM);
    r0 = work.rblock * C::kBlockM;
    // A block inside one head (Sr >= 64): its rows i_lo.. ; a packed block: any row of the heads it holds.
    i_lo = Sr >= C::kBlockM ? r0 % Sr : 0;
    i_hi = Sr >= C::kBlockM ? sched::min64(i_lo + C::kBlockM, p.Sq) : p.Sq;
    len = p.key_len(b);
    k = kPerElement ? 1.0 : p.scale;
    c = static_cast<float>(k * core::kLog2e);
  }

  // The query head and row of packed row r0 + rr; padding rows read as the group's first head, row 0 (valid
  // memory for the hooks, never stored).
  ATTN_HD Row row_at(i64 rr) const { return sched::packed_row(r0 + rr, hk, p.group, p.Sq, Sr); }
  ATTN_HD i64 head_or_first(const Row& r) const { return r.valid ? r.h : hk * p.group; }

  // Whether warp wi holds any real row (padding rows are a block's last rows): a warp of padding rows only, as most
  // of a decode step's block are, copies its share of the tiles and skips compute(). Asked once per block (a
  // 64-bit division).
  ATTN_HD bool warp_active(int wi) const { return row_at(16 * wi).valid; }

  ATTN_HD sched::TileRange tiles() const {
    return sched::split_tiles(sched::key_tiles(masks_of(p), len, i_lo, i_hi, C::kBlockN), split, p.splits);
  }

  // The warp's accumulators cleared and its 16 query rows copied to shared memory (zeros past Sq and Dk).
  ATTN_HD void begin(const W& w, int wi, Warp& st) const {
    for (int d = 0; d < C::kOBlocks; ++d)
      for (int r = 0; r < frag::kCRegs; ++r) st.o[d][r] = F32(0.0f);
    st.row[0] = State();
    st.row[1] = State();
    const auto lane = W::lane();
    const auto* q = static_cast<const std::uint16_t*>(p.q.data);
    if (p.vec_q) {  // 16-byte copies (cp.async), the warp's 16 rows x kChunks chunks, lane by lane
      for (int c0 = 0; c0 < 16 * C::kChunks; c0 += frag::kWarp) {
        const auto id = lane + c0;
        const auto rr = W::map([](int x) { return x / C::kChunks; }, id);
        const auto col = W::map([](int x) { return 8 * (x % C::kChunks); }, id);
        const auto row = W::map([&](int r) { return row_at(16 * wi + r); }, rr);
        const auto ok = W::map([&](Row r, int cc) { return r.valid && cc < p.Dk; }, row, col);
        const auto src = W::map(
            [&](Row r, int cc, bool in) { return q + (in ? p.q.offset(b, r.h, r.i, cc) : 0); }, row, col, ok);
        w.copy16(smem, W::map([&](int r, int cc) { return C::kQ + (16 * wi + r) * C::kLd + cc; }, rr, col), src, ok);
      }
      return;
    }
    for (int r = 0; r < 16; ++r) {
      const Row row = row_at(16 * wi + r);
      for (int c0 = 0; c0 < C::kD; c0 += frag::kWarp) {
        const auto col = lane + c0;
        const auto v = W::map(
            [&](int cc) {
              return row.valid && cc < p.Dk ? q[p.q.offset(b, row.h, row.i, cc)] : std::uint16_t{0};
            },
            col);
        W::store(smem + C::kQ, (16 * wi + r) * C::kLd + col, v);
      }
    }
    W::sync();
  }

  // Key tile t's K and V rows to shared-memory stage `stage`. With 16-byte-aligned rows (p.vec_kv) as 16-byte
  // asynchronous copies, the tile's chunks shared out over the block's threads (the caller commits them and waits
  // before the barrier that precedes compute); else element by element, rows shared out over the warps.
  ATTN_HD void load_kv(const W& w, int wi, i64 t, int stage) const {
    const auto lane = W::lane();
    const auto* kp = static_cast<const std::uint16_t*>(p.k.data);
    const auto* vp = static_cast<const std::uint16_t*>(p.v.data);
    if (p.vec_kv && !p.is_paged()) {
      // The thread's chunks: one column, rows r0, r0 + kRowStep, ...; row j's address one multiply-add away.
      const auto id = lane + frag::kWarp * wi;
      const auto col = W::map([](int x) { return 8 * (x % C::kChunks); }, id);
      const auto r0 = W::map([](int x) { return x / C::kChunks; }, id);
      const i64 kb = p.k.offset(b, hk, 0, 0), vb = p.v.offset(b, hk, 0, 0), ks = p.k.stride[2], vs = p.v.stride[2];
      const auto kok = W::map([&](int cc) { return cc < p.Dk; }, col);
      const auto vok = W::map([&](int cc) { return cc < p.Dv; }, col);
ATTN_UNROLL
      for (int it = 0; it < C::kTileChunksPerThread; ++it) {
        const auto r = r0 + C::kRowStep * it;
        const auto j = W::map([&](int rr) { return t * C::kBlockN + rr; }, r);
        const auto in = W::map([&](i64 jj) { return jj < len; }, j);
        const auto dst = W::map([](int rr, int cc) { return rr * C::kLd + cc; }, r, col);
        w.copy16(smem, C::k_at(stage) + dst,
                 W::map([=](i64 jj, int cc) { return kp + (kb + jj * ks + cc); }, j, col), in && kok);
        w.copy16(smem, C::v_at(stage) + dst,
                 W::map([=](i64 jj, int cc) { return vp + (vb + jj * vs + cc); }, j, col), in && vok);
      }
      return;
    }
    if (p.vec_kv) {  // paged: each row through the page table
ATTN_UNROLL
      for (int it = 0; it < C::kTileChunksPerThread; ++it) {
        const auto id = lane + (frag::kWarp * wi + C::kThreads * it);
        const auto r = W::map([](int x) { return x / C::kChunks; }, id);
        const auto col = W::map([](int x) { return 8 * (x % C::kChunks); }, id);
        const auto j = W::map([&](int rr) { return t * C::kBlockN + rr; }, r);
        const auto in = W::map([&](i64 jj) { return jj < len; }, j);
        const auto krow = W::map([&](i64 jj, bool ok) { return ok ? p.kv_row_offset(p.k, b, hk, jj) : i64{0}; }, j, in);
        const auto vrow = W::map([&](i64 jj, bool ok) { return ok ? p.kv_row_offset(p.v, b, hk, jj) : i64{0}; }, j, in);
        const auto dst = W::map([](int rr, int cc) { return rr * C::kLd + cc; }, r, col);
        w.copy16(smem, C::k_at(stage) + dst, W::map([=](i64 o, int cc) { return kp + o + cc; }, krow, col),
                 W::map([&](bool ok, int cc) { return ok && cc < p.Dk; }, in, col));
        w.copy16(smem, C::v_at(stage) + dst, W::map([=](i64 o, int cc) { return vp + o + cc; }, vrow, col),
                 W::map([&](bool ok, int cc) { return ok && cc < p.Dv; }, in, col));
      }
      return;
    }
    for (int r = wi; r < C::kBlockN; r += C::kWarps) {
      const i64 j = t * C::kBlockN + r;
      const bool in = j < len;
      const i64 krow = in ? p.kv_row_offset(p.k, b, hk, j) : 0;
      const i64 vrow = in ? p.kv_row_offset(p.v, b, hk, j) : 0;
      for (int c0 = 0; c0 < C::kD; c0 += frag::kWarp) {
        const auto col = lane + c0;
        const auto kv = W::map(
            [&](int cc) { return in && cc < p.Dk ? kp[krow + cc * p.k.stride[3]] : std::uint16_t{0}; }, col);
        const auto vv = W::map(
            [&](int cc) { return in && cc < p.Dv ? vp[vrow + cc * p.v.stride[3]] : std::uint16_t{0}; }, col);
        W::store(smem + C::k_at(stage), r * C::kLd + col, kv);
        W::store(smem + C::v_at(stage), r * C::kLd + col, vv);
      }
    }
  }

  // One key tile for one warp, its K and V in shared-memory stage `stage`: S = Q·Kᵀ, scores, online softmax,
  // O += P·V. `masked`: the tile needs the per-element interval mask (TileRange::masked).
  ATTN_HD void compute(const W& w, int wi, Warp& st, i64 t, int stage, bool masked) const {
    const auto lane = W::lane();
    const std::uint32_t base = w.smem_address(smem);
    const i64 j0 = t * C::kBlockN;

    // ---- S = Q·Kᵀ ----
    F32 s[C::kSBlocks][frag::kCRegs];
ATTN_UNROLL
    for (int n = 0; n < C::kSBlocks; ++n)
ATTN_UNROLL
      for (int r = 0; r < frag::kCRegs; ++r) s[n][r] = F32(0.0f);
ATTN_UNROLL
    for (int ks = 0; ks < C::kKSteps; ++ks) {
      U32 a[frag::kARegs];
      w.ldmatrix(a, ldsm_address(base, C::kQ, 16 * wi, 16 * ks, [](int l) { return frag::ldsm_a_x4(l); }));
ATTN_UNROLL
      for (int n2 = 0; n2 < C::kSBlocks / 2; ++n2) {
        U32 kb[4];
        w.ldmatrix(kb, ldsm_address(base, C::k_at(stage), 16 * n2, 16 * ks, [](int l) { return frag::ldsm_b_nk(l, 4); }));
        mma_pair(w, s[2 * n2], s[2 * n2 + 1], a, kb);
      }
    }

    // ---- scores: lane holds rows g, g + 8 (halves h = 0, 1) at keys 8n + 2·tig + (r & 1) ----
    const auto g = lane >> 2, tig = lane & 3;
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      const auto pr = W::map([&](int gg) { return row_at(16 * wi + gg + 8 * h); }, g);
      if (kPerElement || masked) {
        // Padding rows (past Sq, or past the group) see no key, and their dense-mask row is never formed: reading
        // it would run past the mask (the host model under ASan found that).
        const auto range = W::map([&](Row r) { return r.valid ? core::key_range(p, b, r.i) : core::KeyRange{}; }, pr);
        const auto row = W::map([&](Row r) { return V::row(p, b, head_or_first(r), r.valid ? r.i : 0); }, pr);
ATTN_UNROLL
        for (int n = 0; n < C::kSBlocks; ++n)
ATTN_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int r = 2 * h + e;
            const auto j = W::map([=](int tg) { return j0 + 8 * n + 2 * tg + e; }, tig);
            const float scale = static_cast<float>(p.scale);
            s[n][r] = W::map(
                [=](float x, i64 jj, core::KeyRange kr, typename V::Row rw) {
                  if (jj < kr.lo || jj >= kr.hi) return core::kNegInf;
                  return kPerElement ? rw.logit(jj, scale * x) : x;
                },
                s[n][r], j, range, row);
          }
      }
    }

    // ---- online softmax: the tile's row max over the quad, α, P = 2^((s - origin)·c) in place ----
    const auto fmax = [](float x, float y) { return x > y ? x : y; };
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      F32 mx = s[0][2 * h];
ATTN_UNROLL
      for (int n = 0; n < C::kSBlocks; ++n)
        mx = W::map(fmax, mx, W::map(fmax, s[n][2 * h], s[n][2 * h + 1]));
      mx = W::map(fmax, mx, W::shfl_xor(mx, 1));
      mx = W::map(fmax, mx, W::shfl_xor(mx, 2));
      const F32 alpha = st.row[h].advance(mx, F32(c));
ATTN_UNROLL
      for (int d = 0; d < C::kOBlocks; ++d) st.o[d][2 * h] = st.o[d][2 * h] * alpha, st.o[d][2 * h + 1] = st.o[d][2 * h + 1] * alpha;
      const F32 origin = st.row[h].origin();
      F32 sum = F32(0.0f);
ATTN_UNROLL
      for (int n = 0; n < C::kSBlocks; ++n)
ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          s[n][2 * h + e] = State::weight(s[n][2 * h + e], origin, F32(c));
          sum = sum + s[n][2 * h + e];
        }
      st.row[h].add(sum);
    }

    // ---- dropout: the weights P·V takes (the sums above keep the undropped ones) ----
    if (V::kDropout && p.dropout.on()) {
ATTN_UNROLL
      for (int h = 0; h < 2; ++h) {
        const auto pr = W::map([&](int gg) { return row_at(16 * wi + gg + 8 * h); }, g);
ATTN_UNROLL
        for (int n = 0; n < C::kSBlocks; ++n)
ATTN_UNROLL
          for (int e = 0; e < 2; ++e) {
            const auto j = W::map([=](int tg) { return j0 + 8 * n + 2 * tg + e; }, tig);
            s[n][2 * h + e] = W::map(
                [&](float x, Row r, i64 jj) { return x * p.dropout.factor(b, r.h, r.i, jj); },
                s[n][2 * h + e], pr, j);
          }
      }
    }

    // ---- O += P·V: P's C registers of key blocks 2kk, 2kk + 1 are the A operand of k-step kk ----
    const auto pack = [](float lo, float hi) { return pack2<C::kType>(lo, hi); };
ATTN_UNROLL
    for (int kk = 0; kk < C::kPSteps; ++kk) {
      const U32 pa[frag::kARegs] = {W::map(pack, s[2 * kk][0], s[2 * kk][1]), W::map(pack, s[2 * kk][2], s[2 * kk][3]),
                                    W::map(pack, s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    W::map(pack, s[2 * kk + 1][2], s[2 * kk + 1][3])};
ATTN_UNROLL
      for (int d2 = 0; d2 < C::kOBlocks / 2; ++d2) {
        U32 vb[4];
        w.ldmatrix_trans(vb, ldsm_address(base, C::v_at(stage), 16 * kk, 16 * d2, [](int l) { return frag::ldsm_b_kn_trans(l, 4); }));
        mma_pair(w, st.o[2 * d2], st.o[2 * d2 + 1], pa, vb);
      }
    }
  }

  // The warp's rows finished and stored: O in the output's dtype, the LSE (fp32) when asked for. A part of
  // split-KV stores its normalised O and its LSE (f32) in part_o / part_lse instead, the sink left to the combine.
  ATTN_HD void finish(const W&, int wi, Warp& st) const {
    const auto lane = W::lane();
    const auto g = lane >> 2, tig = lane & 3;
    const bool part = p.splits > 1;
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      F32 l = st.row[h].l;
      l = l + W::shfl_xor(l, 1);
      l = l + W::shfl_xor(l, 2);
      const F32 m = st.row[h].m;
      const auto pr = W::map([&](int gg) { return row_at(16 * wi + gg + 8 * h); }, g);
      const auto fin = W::map(
          [&](float mm, float ll, Row r) {
            return core::finish_with_sink(mm, ll, k, part ? core::kNegInf : p.sink(head_or_first(r)));
          },
          m, l, pr);
ATTN_UNROLL
      for (int d = 0; d < C::kOBlocks; ++d)
ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          const auto col = W::map([=](int tg) { return 8 * d + 2 * tg + e; }, tig);
          const auto ok = W::map([&](Row r, int cc) { return r.valid && cc < p.Dv; }, pr, col);
          const F32 val = W::map([](float o, float ll, core::Finish f) { return core::finish_output(o, ll, f.factor); },
                                 st.o[d][2 * h + e], l, fin);
          if (part) {
            const auto idx = W::map([&](Row r, int cc) { return p.part_row(split, b, r.h, r.i) * p.Dv + cc; }, pr, col);
            W::store_if(p.part_o, idx, val, ok);
          } else {
            const auto idx = W::map([&](Row r, int cc) { return p.out.offset(b, r.h, r.i, cc); }, pr, col);
            store_out(idx, val, ok);
          }
        }
      if (part) {
        const auto ok = W::map([](Row r, int tg) { return r.valid && tg == 0; }, pr, tig);
        const auto idx = W::map([&](Row r) { return p.part_row(split, b, r.h, r.i); }, pr);
        W::store_if(p.part_lse, idx, W::map([](core::Finish f) { return f.lse; }, fin), ok);
      } else if (p.lse.data != nullptr) {
        const auto ok = W::map([](Row r, int tg) { return r.valid && tg == 0; }, pr, tig);
        const auto idx = W::map([&](Row r) { return p.lse.offset(b, r.h, r.i, 0); }, pr);
        W::store_if(static_cast<float*>(const_cast<void*>(p.lse.data)), idx, W::map([](core::Finish f) { return f.lse; }, fin), ok);
      }
    }
  }

 private:
  // The shared-memory address each lane gives ldmatrix for the operand tile at (row0, col0) of the region starting
  // at element `region`: the lane's (row, col) within the tile from `at`, one of cuda/fragment.h's ldsm_* layouts.
  template <class At>
  ATTN_HD static U32 ldsm_address(std::uint32_t base, int region, int row0, int col0, At at) {
    return base + W::map(
                      [=](int l) {
                        const frag::Coord q = at(l);
                        return static_cast<std::uint32_t>(2 * (region + (row0 + q.row) * C::kLd + col0 + q.col));
                      },
                      W::lane());
  }

  // Two n-blocks of 8 from one x4 ldmatrix of B (registers 0, 1: the first n-block's fragment; 2, 3: the
  // second's): d0 += a·B0, d1 += a·B1.
  ATTN_HD static void mma_pair(const W& w, F32 (&d0)[frag::kCRegs], F32 (&d1)[frag::kCRegs],
                               const U32 (&a)[frag::kARegs], const U32 (&b)[4]) {
    const U32 b0[frag::kBRegs] = {b[0], b[1]}, b1[frag::kBRegs] = {b[2], b[3]};
    w.mma(MmaTag<C::kType>{}, d0, a, b0, d0);
    w.mma(MmaTag<C::kType>{}, d1, a, b1, d1);
  }

  ATTN_HD void store_out(const I64& idx, const F32& val, const typename W::template Reg<bool>& ok) const {
    void* out = const_cast<void*>(p.out.data);
    if (p.out.dtype == DType::f32) {
      W::store_if(static_cast<float*>(out), idx, val, ok);
    } else if (p.out.dtype == DType::bf16) {
      W::store_if(static_cast<std::uint16_t*>(out), idx, W::map([](float x) { return float_to_bf16(x); }, val), ok);
    } else {
      W::store_if(static_cast<std::uint16_t*>(out), idx, W::map([](float x) { return float_to_f16(x); }, val), ok);
    }
  }
};

// ---- split-KV: the combine step ------------------------------------------------------------------------------

// Element (b, h, i, d) of the output and the row's LSE from the parts of split-KV: the parts' finished rows merged
// as core::merge merges states (state_from_lse: each part a state in natural-log units), then the sink absorbed
// (core::finish_with_sink), as the CPU's split-KV finishes a row. One thread per element on the device; the parts
// are read kCombineBatch at a time, their loads all issued before the first merge (one memory round trip per
// batch, not per part).
struct Combined {
  float out, lse;
};
inline constexpr int kCombineBatch = 8;
ATTN_HD Combined combine_split(const DeviceProblem& p, i64 b, i64 h, i64 i, i64 d) {
  core::RowState st;
  float acc = 0.0f;
  for (i64 s0 = 0; s0 < p.splits; s0 += kCombineBatch) {
    float lse[kCombineBatch], o[kCombineBatch];
ATTN_UNROLL
    for (int u = 0; u < kCombineBatch; ++u) {
      const bool in = s0 + u < p.splits;
      const i64 row = p.part_row(in ? s0 + u : s0, b, h, i);
      lse[u] = in ? p.part_lse[row] : core::kNegInf;  // past the last part: empty, merged as nothing
      o[u] = in ? p.part_o[row * p.Dv + d] : 0.0f;
    }
ATTN_UNROLL
    for (int u = 0; u < kCombineBatch; ++u) {
      const core::Merged r = core::merge_weights(st, core::state_from_lse(lse[u]), static_cast<float>(core::kLog2e));
      if (r.take == core::Merged::Take::b) acc = o[u];
      if (r.take == core::Merged::Take::both) acc = acc * r.wa + o[u] * r.wb;
      st = r.state;
    }
  }
  const core::Finish f = core::finish_with_sink(st.m, st.l, 1.0, p.sink(h));
  return {core::finish_output(acc, st.l, f.factor), f.lse};
}

// Stores the combined element (and, for d = 0, the LSE when asked for) in the caller's output dtype and strides.
ATTN_HD void store_combined(const DeviceProblem& p, i64 b, i64 h, i64 i, i64 d, Combined v) {
  void* out = const_cast<void*>(p.out.data);
  const i64 at = p.out.offset(b, h, i, d);
  if (p.out.dtype == DType::f32) {
    static_cast<float*>(out)[at] = v.out;
  } else {
    static_cast<std::uint16_t*>(out)[at] = p.out.dtype == DType::bf16 ? float_to_bf16(v.out) : float_to_f16(v.out);
  }
  if (d == 0 && p.lse.data != nullptr) static_cast<float*>(const_cast<void*>(p.lse.data))[p.lse.offset(b, h, i, 0)] = v.lse;
}

// The kernels there are: operand type (bf16, f16) x padded head dim (64, 128, 256) x variant (plain: no dense
// mask and no score transform, the scale folded into the exponent; general: any dense mask, softcap, ALiBi,
// dropout). cuda/forward_config.h's with_config calls f(Config{}, Variant{}) for the one a problem takes, after
// supports() has accepted it: the device launcher and the host model choose through that one function.
using PlainVariant = core::Variant<core::NoDenseMask, core::Identity>;
using GeneralVariant = core::ModsVariant;

}  // namespace attn::cuda::fwd
