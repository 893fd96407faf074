// The tiled (FlashAttention-style) forward, written once and compiled per instruction set.
//
// For one (batch, query head, block of Br query rows) the kernel walks the key tiles the masks leave
// visible, keeps the online-softmax state of every row, and never holds more than one Bc x Br tile of
// scores. Queries live in SIMD lanes: the block is held transposed (Qᵀ, Sᵀ = K Qᵀ, Oᵀ), so the
// row-wise softmax (max, exp, sum, rescale) is plain vertical vector arithmetic, and K and V are read
// as broadcast scalars straight from their rows (no transposes, no packing for fp32 inputs).
//
// Compiled once per instruction-set level by the unit CMake generates from src/cpu/isa_unit.cc.in, which
// includes cpu/isa_prelude.h (everything this body uses) first, then this header inside its
// `#pragma GCC target` region, with ATTN_ISA_NS naming a namespace of its own: kernel symbols never collide
// across instruction sets, and the library and std code they call stay compiled for the baseline (the scheme
// of google/highway). This body includes nothing itself.
#ifndef ATTN_ISA_NS
#error "define ATTN_ISA_NS (the per-ISA namespace) before including flash_kernel.h"
#endif
#ifndef ATTN_ISA_PRELUDE
#error "include cpu/isa_prelude.h before the target region, then flash_kernel.h inside it"
#endif

namespace attn::cpu::ATTN_ISA_NS {

#include "cpu/vec.h"
#include "cpu/microkernel.h"
#include "cpu/row_source.h"

using V = Vec::T;
constexpr int W = Vec::W;
constexpr int QV_MAX = 4;                  // query vectors per block, at most
constexpr std::int64_t BR = QV_MAX * W;    // query lanes per block, at most
constexpr std::int64_t BC = 64;            // keys per tile
// Keys per step of the Sᵀ micro-kernel and value dims per step of the Oᵀ micro-kernel: R x QV accumulators plus
// QV + 1 operands in registers. Enough accumulators must be in flight to cover the FMA latency (4 cycles, 2 per
// cycle: 8 at least). AVX-512's 32 registers: 6 x 4 (measured 6-8% faster than 4 x 4). 16 registers (AVX2, SSE2):
// 3 x 4 (2 x 4 left the FMA units half idle: the micro-kernel alone ran at 50% of the FMA peak on Zen 3, 3 x 4 at
// 85-95%). The leftover keys or dims take steps of RT, then 1.
constexpr int RK = W == 16 ? 6 : 3;
constexpr int RD = W == 16 ? 6 : 3;
constexpr int RT = W == 16 ? 4 : 2;

// The lanes of one block: lane r holds query row i[r] of query head h[r]. All heads of a block share
// one KV head, so a long prefill fills the lanes with BR rows of one head, and a decode step (or any
// short Sq) with the rows of several heads of a GQA group at once.
struct Lanes {
  std::int64_t b = 0, hk = 0, n = 0;
  std::int64_t h[BR], i[BR];
};

// Per-thread scratch, all fp32: Q as Qᵀ [Dk][BR] (lane-major blocks) or rows [BR][Dk] (row-major blocks),
// widened K and V tiles [BC][D], Sᵀ/Pᵀ [BC][BR], O as Oᵀ [Dv][BR] or rows [BR][Dv], the state of each lane (m, l,
// and the last tile's rescale factor α), and the row pointers of the current K and V tiles. With a head cache of
// `cache_rows` rows (head_cache_rows: prefill from bf16, f16 or i8 K/V), also one KV head's K and V rows widened
// to fp32 [cache_rows][D], which rows of it hold their values (`have`), and which head (`head` = b·Hkv + hk, -1
// for none; reset at the start of every call).
struct Workspace {
  struct Shape {
    std::int64_t dk = 0, dv = 0, cache_rows = 0;
    bool operator==(const Shape&) const = default;
  };
  AlignedVector<float> q, k, v, st, o, m, l, alpha, kh, vh;
  std::vector<unsigned char> have;
  std::int64_t head = -1;
  std::int64_t read_head = -1;  // the KV head of this thread's last lane-major block (flash_block: NextRows)
  std::int64_t k_step = 64;  // decode's prefetch step over the far K rows (set per call: cpu/prefetch_tuner.h)
  // The block this thread runs next, when run_plan knows it (b < 0: none): its KV head and visible keys [lo, hi),
  // into which a row-major (decode) block's far rows continue past its own last key (StoredTile::locate).
  struct NextBlock {
    std::int64_t b = -1, hk = 0, lo = 0, hi = 0;
  } next;
  const float* krows[BC];
  const float* vrows[BC];

  // The buffers and their lengths (cpu/aligned.h: the one formula, allocated by the constructor, counted by
  // bytes() before a call and by held() after it).
  template <class F>
  static void layout(const Shape& s, F f) {
    f(&Workspace::q, s.dk * BR);
    f(&Workspace::k, BC * s.dk);
    f(&Workspace::v, BC * s.dv);
    f(&Workspace::st, BC * BR);
    f(&Workspace::o, s.dv * BR);
    f(&Workspace::m, BR);
    f(&Workspace::l, BR);
    f(&Workspace::alpha, BR);
    f(&Workspace::kh, s.cache_rows * s.dk);
    f(&Workspace::vh, s.cache_rows * s.dv);
    f(&Workspace::have, s.cache_rows);
  }
  explicit Workspace(const Shape& s) { allocate_layout(*this, s); }
  static std::int64_t bytes(const Shape& s) { return layout_bytes<Workspace>(s); }
};

// The fp32 rows of a K and V tile for a lane-major (prefill) block (the row source's as_float), or with the
// thread's head cache (ws.have non-empty) the cache's rows, widening on first use the rows no earlier block of
// this head (on this thread) has used. Query blocks of one head then widen each key once per thread instead of
// once per block (bf16 P2 at 2 threads: 15 % of the time went to widening tiles). Widening is the same
// conversion either way: the same bits.
template <class KVT>
void kv_tile(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, Workspace& ws) {
  const std::int64_t dk = p.Dk, dv = p.Dv;
  const RowSource<KVT> keys = key_rows<KVT>(p, lanes.b, lanes.hk), values = value_rows<KVT>(p, lanes.b, lanes.hk);
  if (ws.have.empty()) {
    keys.as_float(j0, cols, dk, ws.k.data(), ws.krows);
    values.as_float(j0, cols, dv, ws.v.data(), ws.vrows);
    return;
  }
  const std::int64_t head = lanes.b * p.Hkv + lanes.hk;
  if (ws.head != head) std::fill(ws.have.begin(), ws.have.end(), 0), ws.head = head;
  for (std::int64_t c = 0; c < cols;) {  // runs of rows not widened yet, widened into their slots
    if (ws.have[static_cast<std::size_t>(j0 + c)]) {
      ++c;
      continue;
    }
    std::int64_t n = 1;
    while (c + n < cols && !ws.have[static_cast<std::size_t>(j0 + c + n)]) ++n;
    keys.as_float(j0 + c, n, dk, ws.kh.data() + (j0 + c) * dk, ws.krows);
    values.as_float(j0 + c, n, dv, ws.vh.data() + (j0 + c) * dv, ws.vrows);
    std::fill_n(ws.have.begin() + j0 + c, n, 1);
    c += n;
  }
  for (std::int64_t c = 0; c < cols; ++c) ws.krows[c] = ws.kh.data() + (j0 + c) * dk, ws.vrows[c] = ws.vh.data() + (j0 + c) * dv;
}

// Sᵀ[c][·] (+)= Σ_{d0 <= d < d1} K[c][d] Qᵀ[d][·] for keys c0 .. c0+R-1 and QV·W query lanes: one chunk of
// kDotChunk dims of the sums (see mma; d0 > 0: added to Sᵀ), times mult (the call's score units) when it is the last
// (Last: d1 = Dk). The micro-kernel with A = K rows.
template <int QV, int R, bool Last>
inline void scores_step(const float* qt, const float* const* k, std::int64_t d0, std::int64_t d1, float* st,
                        std::int64_t c0, const float* mult) {
  mma<R, QV, mk::Init::zero, Last, kDotChunk>(mk::RowPtrs{k, c0}, qt, BR, d1, st + c0 * BR, BR, nullptr, mult, d0);
}

// Oᵀ[d][·] = α·Oᵀ[d][·] + Σ_c V[c][d] Pᵀ[c][·] for value dims d0 .. d0+R-1 (the online-softmax rescale of the
// accumulator folded into its load). The micro-kernel with A = V rows indexed by key.
template <int QV, int R>
inline void pv_step(const float* pt, const float* const* vrows, std::int64_t cols, const V* alpha, float* ot,
                    std::int64_t d0) {
  mma<R, QV, mk::Init::load_scaled, false>(mk::RowsByK{vrows, d0}, pt, BR, cols, ot + d0 * BR, BR, alpha);
}

// Sᵀ = mult · K Qᵀ over `cols` keys, a chunk of kDotChunk dims at a time over every key of the tile: the chunk's
// rows of Qᵀ (8 KiB at 64 lanes) stay in L1, where the whole Qᵀ (32 KiB at Dk = 128, all of a 32 KiB L1) was read
// again for each step of keys, its loads the score product's hottest stall. The same sums in the same order.
template <int QV>
inline void scores(const float* qt, const float* const* k, std::int64_t dk, std::int64_t cols, float mult, float* st,
                   const FarRow* next_k = nullptr, std::int64_t next_k_bytes = 0) {
  const float* m = &mult;
  for (std::int64_t d0 = 0; d0 < dk; d0 += kDotChunk) {
    const std::int64_t d1 = std::min(dk, d0 + kDotChunk);
    const FarRow* pk = d0 == 0 ? next_k : nullptr;
    const auto chunk = [&](auto last) {
      std::int64_t c = 0;
      for (; c + RK <= cols; c += RK)
        prefetch_rows(pk, c, RK, 0, next_k_bytes), scores_step<QV, RK, decltype(last)::value>(qt, k, d0, d1, st, c, m);
      for (; c + RT <= cols; c += RT)
        prefetch_rows(pk, c, RT, 0, next_k_bytes), scores_step<QV, RT, decltype(last)::value>(qt, k, d0, d1, st, c, m);
      for (; c < cols; ++c)
        prefetch_rows(pk, c, 1, 0, next_k_bytes), scores_step<QV, 1, decltype(last)::value>(qt, k, d0, d1, st, c, m);
      prefetch_rows(pk, cols, BC - cols, 0, next_k_bytes);  // (a next tile longer than this one)
    };
    if (d1 < dk) chunk(std::false_type{});
    else chunk(std::true_type{});
  }
}

// Oᵀ = α·Oᵀ + Vᵀ Pᵀ over `cols` keys.
template <int QV>
inline void accumulate_pv(const float* pt, const float* const* vrows, std::int64_t dv, std::int64_t cols,
                          const float* alpha, float* ot, const FarRow* next_v = nullptr, std::int64_t vb = 0) {
  V a[QV];
  for (int v = 0; v < QV; ++v) a[v] = Vec::load(alpha + v * W);
  std::int64_t d = 0;  // (each step prefetches bytes [d, d + R) of the next V rows; not through a lambda: GCC
                       // judged one that only prefetched free of effects and deleted its calls)
  for (; d + RD <= dv; d += RD)
    prefetch_rows(next_v, 0, BC, d * vb, (d + RD) * vb), pv_step<QV, RD>(pt, vrows, cols, a, ot, d);
  for (; d + RT <= dv; d += RT)
    prefetch_rows(next_v, 0, BC, d * vb, (d + RT) * vb), pv_step<QV, RT>(pt, vrows, cols, a, ot, d);
  for (; d < dv; ++d) prefetch_rows(next_v, 0, BC, d * vb, (d + 1) * vb), pv_step<QV, 1>(pt, vrows, cols, a, ot, d);
}

// Row-major forms for blocks of few lanes (decode): with NL <= 8 lanes, vectors run along the head
// dimension instead of across lanes, so no lane of a vector is wasted. K and V rows are read in their
// storage type (fp32, bf16, f16, i8, or i4 through Q4Row) and widened in registers: decode is bound by the bytes of
// K and V. R, the type of a row: a pointer to its stored values, or a Q4Row.


// A factor per key for a packed vector of W / NL keys (rows of NL lanes: rows_step_packed): lane i·NL + r holds
// f[i], the factor of the vector's key i.
#if defined(ATTN_VEC_AVX512)
template <int NL>
ATTN_INLINE V repeat_keys(const float* f) {
  constexpr int KPV = W / NL;
  if constexpr (NL == 1) {
    return Vec::load(f);  // a key per lane
  } else {
    const __m512i key_of_lane = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), NL == 8 ? 3 : NL == 4 ? 2 : 1);
    return _mm512_permutexvar_ps(key_of_lane, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << KPV) - 1), f));
  }
}
#elif defined(ATTN_VEC_AVX2)
template <int NL>
ATTN_INLINE V repeat_keys(const float* f) {
  if constexpr (NL == 1) {
    return Vec::load(f);  // a key per lane
  } else {
    const __m128 keys = NL == 4 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f))) : _mm_loadu_ps(f);
    const __m256i key_of_lane = _mm256_srli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), NL == 4 ? 2 : 1);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(keys), key_of_lane);
  }
}
#endif

// The scores of accumulators a0 .. a0+W-1 of a key group (accumulator a: key c + a / NL, lane a % NL; acc[a] holds
// the lane sums of its dot product over the first d_end dims): their lanes summed by one transposing add tree
// whose inputs are ordered so that lane a of its result is accumulator a0 + a, the last dk % W dims added one by
// one, times mult, stored NS lanes at a time into st rows of kRow (BR: Sᵀ's rows; NL: packed, key c's lanes at
// st + c·NL, for the packed decode step: rows_step_packed).
template <int NL, int NA, std::int64_t kRow = BR, class R>
inline void store_group_scores(const V* acc, int a0, const float* q, const R* k, std::int64_t dk,
                               std::int64_t d_end, std::int64_t c, float mult, float* st,
                               [[maybe_unused]] const float* kscale = nullptr) {
  constexpr int NS = NL < W ? NL : W;  // lanes per store
  V in[W];
  for (int a = 0; a < W; ++a) in[Vec::kSumOrder[a]] = a0 + a < NA ? acc[a0 + a] : Vec::zero();
  alignas(64) float sums[W];
  V sum = Vec::sum_each(in);
  if (d_end < dk) {  // the last dk % W dimensions, one by one
    Vec::store(sums, sum);
    for (int a = a0; a < a0 + W && a < NA; ++a)
      for (std::int64_t e = d_end; e < dk; ++e) sums[a - a0] += q[(a % NL) * dk + e] * core::to_float(k[c + a / NL][e]);
    sum = Vec::load(sums);
  }
  sum = Vec::mul(sum, Vec::set1(mult));
#if ATTN_VEC_BF16_DOT
  if (std::is_same_v<R, const std::int8_t*> && kscale) {  // i8 rows' scales: key c + a / NL's in lane a − a0 (after
                                                          // mult: the bits scale_keys gives)
    constexpr int kKeys = W / NL > 0 ? W / NL : 1;  // keys a vector of lanes covers
    const int keys = std::min<int>(kKeys, (std::min(NA - a0, W) + NL - 1) / NL);
    static_assert(NL >= W || NL == 1 || NL == 2 || NL == 4 || NL == 8, "lane a's key: a >> log2 NL");
    const __m512i key_of_lane = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  NL == 8 ? 3 : NL == 4 ? 2 : NL == 2 ? 1 : 0);
    const V f = NL >= W ? Vec::set1(kscale[c + a0 / NL])
                        : _mm512_permutexvar_ps(key_of_lane, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << keys) - 1),
                                                                                   kscale + c + a0 / NL));
    sum = Vec::mul(sum, f);
  }
#endif
  if constexpr (kRow == NL && NA % W == 0) {  // packed: accumulator a's score at st + c·NL + a
    Vec::store(st + c * NL + a0, sum);
    return;
  }
  Vec::store(sums, sum);
  for (int a = a0; a < a0 + W && a < NA; a += NS) std::memcpy(st + (c + a / NL) * kRow + a % NL, sums + (a - a0), NS * sizeof(float));
}

// 4-bit rows with fp32 products on AVX-512 and AVX2 (kQ4Split): each span of 2·W values (W bytes) is read as two
// vectors, its even values (the bytes' low nibbles) and its odd ones (the high), one zero-extension for both
// (Vec::load_q4_split; AVX-512: a shift and two lookups into the block's product table, 4 vector instructions per
// 32 values where two natural-order vectors (load_q4_scaled) took 10; AVX2: a mask or shift, a conversion and an
// FMA per vector, 7 per 16 values where natural order took 18). Each value is the same bits as q·scale. The scores
// read q's rows in that order (q4_split_rows: each span's even dims, then its odd ones, the dims past the last whole
// span as they are; a copy made once per block), and P·V holds o's dims in it between its load and its store
// (o_to_q4_order). A lane's sum then adds a span's dims in another order than fp32 rows' (the tolerance rule holds;
// the prefill widens 4-bit rows in their natural order: the same bits as fp32 rows of their values).
#if defined(ATTN_VEC_AVX512) || defined(ATTN_VEC_AVX2)
static_assert(kI4Block % (2 * W) == 0, "a span of 2·W values lies in one block");
template <class R>
inline constexpr bool kQ4Split = std::is_same_v<R, Q4Row>;
// The span of a tile's row (offset 0) at dim d, whose block's scale is r.scales[at] (at: (d / kI4Block) · the
// stride the tile's rows share, computed once for all of them).
ATTN_INLINE void load_q4_split(const Q4Row& r, std::int64_t d, std::int64_t at, V& even, V& odd) {
  Vec::load_q4_split(r.bytes + d / 2, r.scales[at], even, odd);
}
#else
template <class R>
inline constexpr bool kQ4Split = false;
inline void load_q4_split(const Q4Row&, std::int64_t, std::int64_t, V&, V&) {}
#endif
// Where the block scale of value d of a 4-bit row lies among the row's scales (adjacent: flash_block reads only such).
inline constexpr std::int64_t q4_scale_at(std::int64_t d) { return d / kI4Block; }
// The first dims of a row of `dim` values that whole spans of 2·W cover: kQ4Split reads those split, the rest in order.
inline constexpr std::int64_t q4_split_end(std::int64_t dim) { return dim / (2 * W) * (2 * W); }

// The accumulators of o's dims d .. d + 2·W − 1 (x0, x1): even dims (lo) and odd ones (hi), and back.
#if defined(ATTN_VEC_AVX512)
inline void o_to_q4_order(V x0, V x1, V& lo, V& hi) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  lo = _mm512_permutex2var_ps(x0, even, x1);
  hi = _mm512_permutex2var_ps(x0, _mm512_add_epi32(even, _mm512_set1_epi32(1)), x1);
}
inline void o_from_q4_order(V lo, V hi, V& x0, V& x1) {
  const __m512i i0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  x0 = _mm512_permutex2var_ps(lo, i0, hi);
  x1 = _mm512_permutex2var_ps(lo, _mm512_add_epi32(i0, _mm512_set1_epi32(8)), hi);
}
#elif defined(ATTN_VEC_AVX2)
inline void o_to_q4_order(V x0, V x1, V& lo, V& hi) {  // shuffles within 128-bit halves, then the halves' quarters
  lo = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0x88)), 0xD8));
  hi = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0xDD)), 0xD8));
}
inline void o_from_q4_order(V lo, V hi, V& x0, V& x1) {
  const V a = _mm256_unpacklo_ps(lo, hi), b = _mm256_unpackhi_ps(lo, hi);
  x0 = _mm256_permute2f128_ps(a, b, 0x20), x1 = _mm256_permute2f128_ps(a, b, 0x31);
}
#else
inline void o_to_q4_order(V, V, V&, V&) {}
inline void o_from_q4_order(V, V, V&, V&) {}
#endif

// q's rows [nl][dk] (fp32) into qs in the order kQ4Split's scores read them.
inline void q4_split_rows(const float* q, int nl, std::int64_t dk, float* qs) {
  const std::int64_t end = q4_split_end(dk);
  for (int r = 0; r < nl; ++r) {
    const float* x = q + r * dk;
    float* y = qs + r * dk;
    for (std::int64_t d = 0; d < end; d += 2 * W)
      for (int n = 0; n < W; ++n) y[d + n] = x[d + 2 * n], y[d + W + n] = x[d + 2 * n + 1];
    std::copy(x + end, x + dk, y + end);
  }
}

// Sᵀ[c][r] = q_r · k_c for KG keys c at a time and lanes r < NL (q rows [NL][dk], st rows of kRow): per group, its
// rows prefetched, then KG·NL dot-product vectors over whole vectors of d (one widened key vector feeds NL FMAs),
// then their scores stored. Returns the first key not done (cols less the last cols % KG).
template <int NL, int KG, std::int64_t kRow = BR, class R>
inline std::int64_t score_keys(const float* q, const R* k, std::int64_t dk, std::int64_t c, std::int64_t cols,
                               float mult, float* st, const FarRow* pk, std::int64_t kstep) {
  constexpr int NA = KG * NL;
  const std::int64_t d_end = dk / W * W, d_split = kQ4Split<R> ? q4_split_end(dk) : 0;
  for (; c + KG <= cols; c += KG) {
    prefetch_rows(pk, c, KG, 0, row_bytes<R>(dk), kstep);
    V acc[NA];  // (exactly NA: rounded up to whole vectors of W, GCC zeroed and spilled them to the stack)
    for (int a = 0; a < NA; ++a) acc[a] = Vec::zero();
    if constexpr (kQ4Split<R>)
      for (std::int64_t d = 0; d < d_split; d += 2 * W) {  // whole spans, even then odd dims (q's rows so too)
        const std::int64_t at = q4_scale_at(d);
        for (int g = 0; g < KG; ++g) {
          V even, odd;
          load_q4_split(k[c + g], d, at, even, odd);
          for (int r = 0; r < NL; ++r) {
            acc[g * NL + r] = Vec::fmadd(Vec::load(q + r * dk + d), even, acc[g * NL + r]);
            acc[g * NL + r] = Vec::fmadd(Vec::load(q + r * dk + d + W), odd, acc[g * NL + r]);
          }
        }
      }
    for (std::int64_t d = d_split; d < d_end; d += W)
      for (int g = 0; g < KG; ++g) {
        const V kv = load_as_float(k[c + g] + d);
        for (int r = 0; r < NL; ++r) acc[g * NL + r] = Vec::fmadd(Vec::load(q + r * dk + d), kv, acc[g * NL + r]);
      }
    for (int a0 = 0; a0 < NA; a0 += W) store_group_scores<NL, NA, kRow>(acc, a0, q, k, dk, d_end, c, mult, st);
  }
  return c;
}

// Sᵀ = K Qᵀ (times mult) for the lanes r < NL of a row-major block. 16 registers (AVX2, SSE2) hold 12
// accumulators for 8- and 16-bit rows and run at most 4 lanes at once (8 lanes in two passes over the tile, its
// rows then in L1); AVX-512's 32 hold 16. On Zen 3 (D = 128, int8 and bf16 keys, 4 lanes), 3 keys x 4 lanes ran
// the scores 1.8x as fast as 2 x 4 (8 accumulators are exactly the FMA latency x throughput: no slack) in a
// micro-benchmark, and 2 passes of 4 lanes ran 8 lanes 1.7x as fast as 1 key x 8 lanes; D2 and D3 decode from
// bf16 and int8 caches ran 5-35 % faster. f32 rows keep W / NL keys x NL lanes (8 accumulators): with 4-byte
// values a step's rows are twice the bytes, decode from them is bound by memory alone, and the larger groups
// measured slower on D1 and D3. The last cols % KG keys take groups of KG / 2 keys, then single keys. st rows of kRow
// (BR; NL where the packed decode step keeps Sᵀ packed: rows_step_packed).
template <int NL, std::int64_t kRow = BR, class R>
inline void scores_rows(const float* q, const R* k, std::int64_t dk, std::int64_t cols, float mult, float* st,
                        const FarRow* pk = nullptr, std::int64_t kstep = 64) {
  constexpr bool wide = W == 16 || std::is_same_v<R, const float*>;  // the W / NL x NL form
  constexpr int kAcc = wide ? W : 12, NS = wide ? NL : (NL < 4 ? NL : 4);
  // One lane on 16-register ISAs takes the key groups of two (6 keys of 8- and 16-bit rows, 4 of fp32): its own 12
  // and 8 put more rows' prefetches in one burst and ran MHA decode from memory 1.1-1.4x as long (AVX2 level, Zen 4).
  constexpr int NG = W == 8 && NL == 1 ? 2 : NS, KG = kAcc / NG > 1 ? kAcc / NG : 1;
  for (int r0 = 0; r0 < NL; r0 += NS) {
    const float* qs = q + r0 * dk;
    float* ss = st + r0;
    const FarRow* pks = r0 == 0 ? pk : nullptr;
    std::int64_t c = score_keys<NS, KG, kRow>(qs, k, dk, 0, cols, mult, ss, pks, kstep);
    if constexpr (KG > 2) c = score_keys<NS, KG / 2, kRow>(qs, k, dk, c, cols, mult, ss, pks, kstep);
    if constexpr (KG > 1) score_keys<NS, 1, kRow>(qs, k, dk, c, cols, mult, ss, pks, kstep);
  }
}

// o_r = α_r·o_r + Σ_c Pᵀ[c][r] v_c for lanes r < NL (o rows [BR][dv]; Pᵀ rows of kRow), DB vectors of value dims
// at a time (NL·DB accumulators: enough independent FMA chains to hide their latency).
template <int NL, int DB, std::int64_t kRow, class R>
inline void pv_rows_step(const float* pt, const R* vrows, std::int64_t dv, std::int64_t cols,
                         const float* alpha, float* o, std::int64_t d, const FarRow* pv = nullptr) {
  // kQ4Split (d a multiple of 2·W here): vectors e, e + 1 (e even) hold a span's even dims, then its odd ones
  constexpr bool split = kQ4Split<R> && DB % 2 == 0;
  V acc[NL][DB];
  for (int r = 0; r < NL; ++r)
    for (int e = 0; e < DB; ++e) acc[r][e] = Vec::mul(Vec::load(o + r * dv + d + e * W), Vec::set1(alpha[r]));
  std::int64_t at[DB / 2 + 1] = {};  // split: each span's scale index
  if constexpr (split)
    for (int e = 0; e < DB; e += 2) {
      at[e / 2] = q4_scale_at(d + e * W);
      for (int r = 0; r < NL; ++r) o_to_q4_order(acc[r][e], acc[r][e + 1], acc[r][e], acc[r][e + 1]);
    }
  // The pass prefetches the lines of the V rows that start within its bytes: none when its slice is narrower than a
  // line and holds no line's start (then no per-key checks either: AVX2 8-bit rows, three passes in four).
  const std::int64_t from = row_bytes<R>(d), to = row_bytes<R>(d + DB * W);
  const FarRow* pf = ((from + 63) & ~std::int64_t{63}) < to ? pv : nullptr;
  for (std::int64_t c = 0; c < cols; ++c) {
    prefetch_rows(pf, c, 1, from, to);
    V vv[DB];
    if constexpr (split)
      for (int e = 0; e < DB; e += 2) load_q4_split(vrows[c], d + e * W, at[e / 2], vv[e], vv[e + 1]);
    else
      for (int e = 0; e < DB; ++e) vv[e] = load_as_float(vrows[c] + d + e * W);
    for (int r = 0; r < NL; ++r) {
      const V pw = Vec::set1(pt[c * kRow + r]);
      for (int e = 0; e < DB; ++e) acc[r][e] = Vec::fmadd(pw, vv[e], acc[r][e]);
    }
  }
  if constexpr (split)
    for (int r = 0; r < NL; ++r)
      for (int e = 0; e < DB; e += 2) o_from_q4_order(acc[r][e], acc[r][e + 1], acc[r][e], acc[r][e + 1]);
  for (int r = 0; r < NL; ++r)
    for (int e = 0; e < DB; ++e) Vec::store(o + r * dv + d + e * W, acc[r][e]);
}

template <int NL, int DB, std::int64_t kRow, class R>
inline std::int64_t pv_rows_steps(const float* pt, const R* vrows, std::int64_t dv, std::int64_t cols,
                                  const float* alpha, float* o, std::int64_t d, const FarRow* pv) {
  for (; d + DB * W <= dv; d += DB * W) pv_rows_step<NL, DB, kRow>(pt, vrows, dv, cols, alpha, o, d, pv);
  if constexpr (DB > 1) return pv_rows_steps<NL, DB / 2, kRow>(pt, vrows, dv, cols, alpha, o, d, pv);
  else return d;
}

// pv: the V rows far ahead (prefetch_rows), each step prefetching its own dims of them. Pᵀ rows of kRow.
template <int NL, std::int64_t kRow = BR, class R>
inline void pv_rows(const float* pt, const R* vrows, std::int64_t dv, std::int64_t cols, const float* alpha,
                    float* o, const FarRow* pv = nullptr) {
  // NL·DB accumulators, DB value vectors and a broadcast weight in registers: 16 accumulators with AVX-512's 32
  // registers, 8 with the 16 of AVX2 and SSE2 (16 there spilled to the stack: measured on D2).
  // The dims a step of DB vectors leaves take steps of DB / 2, DB / 4, .. 1 (each dim's sum is the same whichever).
  constexpr int kAcc = W == 16 ? 16 : 8, DB = NL >= kAcc ? 1 : kAcc / NL;
  for (std::int64_t d = pv_rows_steps<NL, DB, kRow>(pt, vrows, dv, cols, alpha, o, 0, pv); d < dv; ++d)
    for (int r = 0; r < NL; ++r) {
      float acc = o[r * dv + d] * alpha[r];
      for (std::int64_t c = 0; c < cols; ++c) acc += pt[c * kRow + r] * core::to_float(vrows[c][d]);
      o[r * dv + d] = acc;
    }
}

// bf16 pair products for the row-major (decode) form, where the level has them (ATTN_VEC_BF16_DOT: avx512bf16) and
// Q is bf16 and K and V are bf16 or i8: vdpbf16ps multiplies a bf16 pair of each operand into an fp32 lane, so bf16
// rows are read as stored with no widening, and one instruction does the work of two FMAs; i8 rows are widened to
// bf16 (exactly), five instructions per 32 values, where the fp32 form spent four and twice the FMAs (D1/D2 from an
// i8 cache 1.15x as fast, Zen 5). The scores pair dims (q's bf16 values are exact: its widened fp32 rows rounded
// back); P·V pairs keys (bf16 rows c and c + 1 interleaved by one unpack, i8 rows by the permute that packs them:
// key_pairs; the weights, i8 rows' scales folded in, rounded
// to bf16 as the pair-product prefill and every bf16 flash kernel round P: with bf16 outputs that rounding is below
// the output's own). The accumulators, the sums and the stores are the fp32 forms' (store_group_scores; o rows in
// memory).
// Whether 4-bit rows of this problem take the pair products: whole blocks, and each row's block scales adjacent.
inline bool q4_pairs_usable(const core::Problem& p) {
  const auto adjacent = [](const core::Strided& s, std::int64_t dim) { return dim <= 32 || s.stride[3] == 1; };
  return p.Dk % 32 == 0 && p.Dv % 32 == 0 && adjacent(*p.k_scale, p.Dk) && adjacent(*p.v_scale, p.Dv);
}

// Whether this level's row-major blocks (decode) multiply bf16 pairs for this problem: bf16 Q over bf16, i8 or 4-bit
// (q4_pairs_usable) K/V read in place (unit-stride rows), where the dispatcher prefers the pair products
// (cpu::bf16_dot_preferred). The one rule flash_block follows and the kernel's name reports (flash_kernel_name).
inline bool rows_on_pairs([[maybe_unused]] const core::Problem& p) {
#if ATTN_VEC_BF16_DOT
  const DType kv = p.k.dtype;
  return p.q.dtype == DType::bf16 && (kv == DType::bf16 || kv == DType::i8 || (kv == DType::i4 && q4_pairs_usable(p))) &&
         p.k.stride[3] == 1 && p.v.stride[3] == 1 && bf16_dot_preferred();
#else
  return false;
#endif
}

#if ATTN_VEC_BF16_DOT
inline constexpr bool kBf16Dot = true;
using BH = __m512bh;
inline BH load_pairs(const void* p) { return (BH)_mm512_loadu_si512(p); }
// 32 values of a K or V row as bf16, in order: bf16 rows as stored; i8 rows widened (exact: |x| <= 128 has 8
// significant bits), their scale applied to the products' sums (scores) or folded into the weights (P·V).
inline BH load_pairs(const core::bf16* p) { return load_pairs(static_cast<const void*>(p)); }
// 16 i8 values as fp32 (exact), as bits: their lower halves are zero, so each value's bf16 is its upper half, and
// one word permute of two such vectors packs (or pairs) them, where vcvtne2ps2bf16 packed (1.09-1.11x the widening
// and products on Zen 4, bench/micro/widen.cc).
inline __m512i i8_as_f32(const std::int8_t* p) {
  return _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
}
// The upper halves of 32 fp32 values (a's 16, then b's), as 32 words: bf16 values that are exact as fp32.
inline __m512i upper_halves(__m512i a, __m512i b) {
  const __m512i upper = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(a, upper, b);
}
inline BH load_pairs(const std::int8_t* p) {  // values 0-15 from p, 16-31 from p + 16
  return (BH)upper_halves(i8_as_f32(p), i8_as_f32(p + 16));
}

template <int NL, int KG, std::int64_t kRow, class T>
inline std::int64_t score_keys_pairs(const std::uint16_t* qb, const float* q, const T* const* k,
                                     std::int64_t dk, std::int64_t c, std::int64_t cols, float mult, float* st,
                                     const FarRow* pk, std::int64_t kstep, const float* kscale) {
  constexpr int NA = KG * NL;
  const std::int64_t d_end = dk / 32 * 32;
  for (; c + KG <= cols; c += KG) {
    prefetch_rows(pk, c, KG, 0, row_bytes<const T*>(dk), kstep);
    V acc[NA];
    for (int a = 0; a < NA; ++a) acc[a] = Vec::zero();
    for (std::int64_t d = 0; d < d_end; d += 32)
      for (int g = 0; g < KG; ++g) {
        const BH kv = load_pairs(k[c + g] + d);
        for (int r = 0; r < NL; ++r) acc[g * NL + r] = _mm512_dpbf16_ps(acc[g * NL + r], load_pairs(qb + r * dk + d), kv);
      }
    for (int a0 = 0; a0 < NA; a0 += W) store_group_scores<NL, NA, kRow>(acc, a0, q, k, dk, d_end, c, mult, st, kscale);
  }
  return c;
}

// scores_rows for bf16 pairs (16 accumulators: W / NL keys x NL lanes, as the fp32 form's AVX-512 shape), from q's
// rows as bf16 (qb, made once per block: start_pairs) and as fp32 (q, for the last dk % 32 dims); i8 rows' scales
// (kscale; null for bf16 rows) multiply the scores as they are stored, in st rows of kRow (store_group_scores).
template <int NL, std::int64_t kRow = BR, class T>
inline void scores_rows_pairs(const float* q, const T* const* k, std::int64_t dk, std::int64_t cols,
                              float mult, float* st, const FarRow* pk, const std::uint16_t* qb,
                              std::int64_t kstep, const float* kscale) {
  constexpr int KG = W / NL > 1 ? W / NL : 1;
  std::int64_t c = score_keys_pairs<NL, KG, kRow>(qb, q, k, dk, 0, cols, mult, st, pk, kstep, kscale);
  if constexpr (KG > 2) c = score_keys_pairs<NL, KG / 2, kRow>(qb, q, k, dk, c, cols, mult, st, pk, kstep, kscale);
  if constexpr (KG > 1) score_keys_pairs<NL, 1, kRow>(qb, q, k, dk, c, cols, mult, st, pk, kstep, kscale);
}

// Unpacking rows a and b (32 dims each) by 16-bit words gives their key pairs for dims 0-3, 8-11, 16-19, 24-27 (lo)
// and 4-7, 12-15, 20-23, 28-31 (hi); the accumulators hold o's dims in that order between its load and store.
inline void o_to_pair_order(V x0, V x1, V& lo, V& hi) {
  const __m512i lo_idx = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
  const __m512i hi_idx = _mm512_set_epi32(31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12, 7, 6, 5, 4);
  lo = _mm512_permutex2var_ps(x0, lo_idx, x1), hi = _mm512_permutex2var_ps(x0, hi_idx, x1);
}
inline void o_from_pair_order(V lo, V hi, V& x0, V& x1) {
  const __m512i x0_idx = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i x1_idx = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  x0 = _mm512_permutex2var_ps(lo, x0_idx, hi), x1 = _mm512_permutex2var_ps(lo, x1_idx, hi);
}

// The weights Pᵀ[c][r] (lanes r < NL <= 16) rounded to bf16 (vcvtneps2bf16: to nearest even, as
// core::from_float), as pairs pw[c/2][r] = (key c, key c + 1), an odd last key paired with 0: two rows of Pᵀ per
// step (the scalar conversions took 9 % of bf16 decode's time).
// i8 V rows' scales (vscale; null for bf16 rows) multiply row c before it is rounded (the bits scale_keys gives).
// Rows of kRow floats: BR, or NL where the packed decode step (rows_step_packed) keeps Pᵀ packed (then W / NL keys
// are rounded at once and paired by one byte shuffle or word permute; the rest two rows at a time).
template <int NL, bool kScaled, std::int64_t kRow = BR>
inline void weight_pairs(const float* pt, std::int64_t cols, std::uint32_t* pw, const float* vscale) {
  static_assert(NL <= 16, "a row of Pᵀ's lanes in one vector");
  constexpr __mmask16 kLanes = static_cast<__mmask16>((1u << NL) - 1);
  const auto bf16_lanes = [&](std::int64_t c) {  // row c's 16 lanes as bf16, zero-extended to 32 bits
    V row = Vec::load(pt + c * kRow);
    if constexpr (kScaled) row = Vec::mul(row, Vec::set1(vscale[c]));
    return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(row));
  };
  std::int64_t c = 0;
  if constexpr (kRow == 1 && NL == 1) {  // a row of weights: 32 keys' bf16 in order are their 16 pairs
    const auto scaled = [&](std::int64_t at) {
      const V x = Vec::load(pt + at);
      return kScaled ? Vec::mul(x, Vec::load(vscale + at)) : x;
    };
    for (; c + 32 <= cols; c += 32)
      _mm512_storeu_si512(pw + c / 2, (__m512i)_mm512_cvtne2ps_pbh(scaled(c + 16), scaled(c)));
  } else if constexpr (kRow == NL && (NL == 2 || NL == 4 || NL == 8)) {
    constexpr int KPV = W / NL;  // keys per vector: lane i·NL + r is key c + i's lane r
    // bf16 words (key a's NL lanes, then key b's) to pairs (a_r, b_r): per 128-bit lane for NL = 4 (words 0 4 1 5
    // 2 6 3 7) and NL = 2 (two key pairs: 0 2 1 3 4 6 5 7), across the two for NL = 8 (one word permute)
    const __m128i lane_order = NL == 4 ? _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)
                                       : _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    const __m256i in_lanes = _mm256_broadcastsi128_si256(lane_order);
    const __m256i across = _mm256_setr_epi16(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const auto to_pairs = [&](__m256i b) {
      return NL == 8 ? _mm256_permutexvar_epi16(across, b) : _mm256_shuffle_epi8(b, in_lanes);
    };
    for (; c + KPV <= cols; c += KPV) {
      V x = Vec::load(pt + c * NL);
      if constexpr (kScaled) x = Vec::mul(x, repeat_keys<NL>(vscale + c));  // lane i·NL + r times key c + i's scale
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pw + (c / 2) * NL), to_pairs((__m256i)_mm512_cvtneps_pbh(x)));
    }
  }
  for (; c < cols; c += 2) {
    const __m512i hi = c + 1 < cols ? _mm512_slli_epi32(bf16_lanes(c + 1), 16) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(pw + (c / 2) * NL, kLanes, _mm512_or_si512(bf16_lanes(c), hi));
  }
}

// Once per block, before its tiles: q's rows rounded back to bf16 (exact: they were widened from bf16) into qb, and
// a zero V row of dv values (the partner of an odd last key).
inline void start_pairs(const float* q, std::int64_t n, std::uint16_t* qb, core::bf16* zero, std::int64_t dv) {
  for (std::int64_t i = 0; i < n; ++i) qb[i] = core::from_float<core::bf16>(q[i]).bits;
  std::fill(zero, zero + dv, core::bf16{0});
}

// 4-bit rows on the pair products (bf16 Q over i4 K/V; Dk and Dv multiples of 32, each row's block scales adjacent:
// q4_pairs_usable). A nibble u becomes its value u − 8 as bf16 by one table lookup (vpermw, exact: |x| <= 8; the
// table repeats its 16 entries, so the bit above a nibble is ignored), where the fp32 form spent four instructions
// per 16 values and twice the FMAs. The scores read a row in spans of J blocks (32·J dims, 16·J bytes): each word of
// the span's vector holds J dims (J = 4: two bytes as stored; J = 2: a byte, zero-extended to its word), the j-th
// of J lookups (the words shifted by 4j) gives each word w its dim J·w + j, and q's bf16 rows are laid out to match
// (start_pairs_q4). Lane l of each of the J products then sums 2·J dims of one block, the block's lanes take its
// scale, and one FMA per key, lane and span multiplies the span's sums by its block scales. One or two lanes take
// spans of 4 blocks: 4 lookups, 4 products and 1 FMA per 128 dims where spans of 2 took 4, 4 and 2 and a scale
// permute more (MHA decode 1.07x, GQA 2 1.12x as fast in cache, Zen 4). Four and eight lanes take spans of 2: their
// products outnumber the lookups, and the 4-product chains of a span of 4 waited on each other (1.1-1.3x as long).
// P·V pairs keys as the bf16 form does, each block's V scale folded into its own weights (rounded to bf16 after the
// scale, as the i8 form's); its accumulators hold a block's even dims, then its odd ones.
template <int NL>
inline constexpr int kQ4Lookups = NL <= 2 ? 4 : 2;  // J, the blocks of a span of the scores
inline __m512i q4_bf16_table() {  // entry i: bf16 of (i & 15) − 8 (vpermw reads 5 bits of each index word)
  alignas(64) static constexpr std::uint16_t kValues[16] = {0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040,
                                                            0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000, 0x4040,
                                                            0x4080, 0x40A0, 0x40C0, 0x40E0};
  const __m256i half = _mm256_load_si256(reinterpret_cast<const __m256i*>(kValues));
  return _mm512_inserti64x4(_mm512_castsi256_si512(half), half, 1);
}
// Words 0-31 of w (each a byte of packed values, zero-extended) as bf16: the low nibbles (lo) and the high (hi).
ATTN_INLINE void q4_nibbles(__m512i w, __m512i table, BH& lo, BH& hi) {
  lo = (BH)_mm512_permutexvar_epi16(w, table), hi = (BH)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), table);
}

// q's rows [nl][dk] (fp32, widened from bf16: exact, so each bf16 is its fp32's upper half) as bf16 in the scores'
// order: per row and span of 32·J dims, J vectors of 32 words, the j-th holding dims J·w + j (w = 0 .. 31; zero past
// dk). One or two word permutes (and a blend) per vector.
template <int J>
inline void start_pairs_q4(const float* q, int nl, std::int64_t dk, std::uint16_t* qb) {
  static_assert(J == 2 || J == 4, "spans of 2 or 4 blocks");
  constexpr std::int64_t SD = 32 * J;
  const __m512i word = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                        11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i jw = _mm512_and_si512(_mm512_mullo_epi16(word, _mm512_set1_epi16(J)), _mm512_set1_epi16(63));
  const auto dims = [](const float* x, std::int64_t left) {  // 32 dims as bf16, in order (none left: zero)
    return left > 0 ? upper_halves(_mm512_castps_si512(Vec::load(x)), _mm512_castps_si512(Vec::load(x + 16)))
                    : _mm512_setzero_si512();
  };
  const std::int64_t spans = (dk + SD - 1) / SD;
  for (int r = 0; r < nl; ++r)
    for (std::int64_t s = 0; s < spans; ++s, qb += SD) {
      const float* x = q + r * dk + SD * s;
      const std::int64_t left = dk - SD * s;  // (a multiple of 32)
      const __m512i a0 = dims(x, left), a1 = dims(x + 32, left - 32);
      for (int j = 0; j < J; ++j) {
        const __m512i at = _mm512_add_epi16(jw, _mm512_set1_epi16(static_cast<short>(j)));
        __m512i v = _mm512_permutex2var_epi16(a0, at, a1);
        if constexpr (J == 4)  // words 16-31: dims 64 + 4(w − 16) + j
          v = _mm512_mask_blend_epi16(0xFFFF0000u, v,
                                      _mm512_permutex2var_epi16(dims(x + 64, left - 64), at, dims(x + 96, left - 96)));
        _mm512_storeu_si512(qb + 32 * j, v);
      }
    }
}

// score_keys_pairs for 4-bit K rows: per key and span of J blocks, t = Σ_j q_j·k_j in lanes (block b's sums in lanes
// 16b/J .. 16(b + 1)/J − 1), then acc += t · (the span's block scales). A last span of fewer blocks reads only its
// own bytes and scales (masked loads: zero bytes, looked up as −8, meet q's zeros).
template <int NL, int KG, std::int64_t kRow>
inline std::int64_t score_keys_q4(const std::uint16_t* qb, const Q4Row* k, std::int64_t dk, std::int64_t c,
                                  std::int64_t cols, float mult, float* st, const FarRow* pk, std::int64_t kstep) {
  constexpr int NA = KG * NL, J = kQ4Lookups<NL>;
  constexpr std::int64_t SD = 32 * J;
  const std::int64_t spans = (dk + SD - 1) / SD, whole = dk / SD, last_blocks = dk / 32 - J * whole;
  const __mmask64 last_bytes = (std::uint64_t{1} << (16 * last_blocks)) - 1;  // (last_blocks < J)
  const __mmask8 last_scales = static_cast<__mmask8>((1u << last_blocks) - 1);
  const __m512i table = q4_bf16_table();
  const __m512i of_block = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             J == 4 ? 2 : 3);  // lane l: block l·J / 16
  for (; c + KG <= cols; c += KG) {
    prefetch_rows(pk, c, KG, 0, row_bytes<Q4Row>(dk), kstep);
    V acc[NA];
    for (int a = 0; a < NA; ++a) acc[a] = Vec::zero();
    for (std::int64_t s = 0; s < spans; ++s) {
      const __mmask64 in_bytes = s < whole ? ~__mmask64{0} : last_bytes;  // (J = 4)
      const __mmask8 in_scales = s < whole ? static_cast<__mmask8>((1u << J) - 1) : last_scales;
      for (int g = 0; g < KG; ++g) {
        const Q4Row& row = k[c + g];
        const std::uint8_t* bytes = row.bytes + 16 * J * s;
        __m512i w;
        if constexpr (J == 4)
          w = _mm512_maskz_loadu_epi8(in_bytes, bytes);
        else if (s < whole)  // (zero-extended as loaded: a masked load first took 1.5 % more of GQA 4's time)
          w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
        else
          w = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(static_cast<__mmask32>(last_bytes), bytes));
        const V scale =  // (q4_pairs_usable: a row's block scales adjacent)
            _mm512_permutexvar_ps(of_block, _mm512_castps128_ps512(_mm_maskz_loadu_ps(in_scales, row.scales + J * s)));
        BH kj[J];
        for (int j = 0; j < J; ++j) kj[j] = (BH)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4 * j), table);
        for (int r = 0; r < NL; ++r) {
          const std::uint16_t* qs = qb + (r * spans + s) * SD;
          V t = _mm512_dpbf16_ps(Vec::zero(), load_pairs(qs), kj[0]);
          for (int j = 1; j < J; ++j) t = _mm512_dpbf16_ps(t, load_pairs(qs + 32 * j), kj[j]);
          acc[g * NL + r] = Vec::fmadd(t, scale, acc[g * NL + r]);
        }
      }
    }
    for (int a0 = 0; a0 < NA; a0 += W) store_group_scores<NL, NA, kRow>(acc, a0, nullptr, k, dk, dk, c, mult, st);
  }
  return c;
}

template <int NL, std::int64_t kRow = BR>
inline void scores_rows_pairs(const float*, const Q4Row* k, std::int64_t dk, std::int64_t cols, float mult,
                              float* st, const FarRow* pk, const std::uint16_t* qb, std::int64_t kstep, const float*) {
  constexpr int KG = W / NL > 1 ? W / NL : 1;
  std::int64_t c = score_keys_q4<NL, KG, kRow>(qb, k, dk, 0, cols, mult, st, pk, kstep);
  if constexpr (KG > 2) c = score_keys_q4<NL, KG / 2, kRow>(qb, k, dk, c, cols, mult, st, pk, kstep);
  if constexpr (KG > 1) score_keys_q4<NL, 1, kRow>(qb, k, dk, c, cols, mult, st, pk, kstep);
}

// The weights of 4-bit V rows: pw[c/2][b][r] = the pair (Pᵀ[c][r]·scale_c(b), Pᵀ[c+1][r]·scale_c+1(b)) rounded to
// bf16, for the nb blocks b of a row (scales adjacent), 16 (block, lane) entries of a key at a time; an odd last key
// paired with 0. Rows of Pᵀ of kRow floats (weight_pairs).
template <int NL, std::int64_t kRow = BR>
inline void weight_pairs_q4(const float* pt, const Q4Row* vrows, std::int64_t cols, std::int64_t nb,
                            std::uint32_t* pw) {
  static_assert(16 % NL == 0, "whole blocks of lanes per vector");
  constexpr int BPV = 16 / NL;  // blocks per vector
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i of_lane = _mm512_and_si512(lane, _mm512_set1_epi32(NL - 1));    // entry i: lane i % NL
  const __m512i of_block = _mm512_srli_epi32(lane, NL == 1 ? 0 : NL == 2 ? 1 : NL == 4 ? 2 : 3);  // and block i / NL
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const std::int64_t n = nb * NL;  // entries per key
  std::int64_t c = 0;
  if constexpr (kRow == 1 && NL == 1) if (nb == 4) {
    // One lane (MHA) at d128: a vector holds 4 key pairs' entries, the even keys' (block scales times weight) in one
    // vector and the odd keys' in another, rounded by one vcvtne2ps2bf16 and paired by the interleave: entries
    // (c/2 + i, b) in order, one store. (Per key pair, 4 of a vector's 16 lanes used, this was a tenth of a 4-bit MHA
    // decode's time.)
    const __m512i key_of = _mm512_slli_epi32(_mm512_srli_epi32(lane, 2), 1);  // lane i: key 2·(i / 4)
    const auto scales = [&](std::int64_t c0) {  // keys c0, c0 + 2, c0 + 4, c0 + 6: their 4 block scales each
      const auto row = [&](std::int64_t i) { return _mm_loadu_ps(vrows[c0 + 2 * i].scales); };
      return _mm512_insertf32x4(_mm512_insertf32x4(_mm512_insertf32x4(_mm512_castps128_ps512(row(0)), row(1), 1),
                                                   row(2), 2), row(3), 3);
    };
    for (; c + 8 <= cols; c += 8) {
      const V p = Vec::load(pt + c);
      const V pe = _mm512_permutexvar_ps(key_of, p);
      const V po = _mm512_permutexvar_ps(_mm512_add_epi32(key_of, _mm512_set1_epi32(1)), p);
      const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(Vec::mul(po, scales(c + 1)), Vec::mul(pe, scales(c)));
      _mm512_storeu_si512(pw + (c / 2) * n, _mm512_permutexvar_epi16(interleave, w));
    }
  }
  for (; c < cols; c += 2) {
    const bool pair = c + 1 < cols;
    const V p0 = _mm512_permutexvar_ps(of_lane, Vec::load(pt + c * kRow));
    const V p1 = pair ? _mm512_permutexvar_ps(of_lane, Vec::load(pt + (c + 1) * kRow)) : Vec::zero();
    for (std::int64_t e = 0; e < n; e += 16) {
      const std::int64_t b0 = e / NL, blocks = std::min<std::int64_t>(BPV, nb - b0);
      const __mmask16 in_row = static_cast<__mmask16>((1u << blocks) - 1);
      const V s0 = _mm512_permutexvar_ps(of_block, _mm512_maskz_loadu_ps(in_row, vrows[c].scales + b0));
      const V s1 = pair ? _mm512_permutexvar_ps(of_block, _mm512_maskz_loadu_ps(in_row, vrows[c + 1].scales + b0))
                        : Vec::zero();
      // bf16 of key c in words 0-15 and of key c + 1 in 16-31, interleaved into pairs
      const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(Vec::mul(p1, s1), Vec::mul(p0, s0));
      const __mmask16 valid = static_cast<__mmask16>(n - e >= 16 ? 0xFFFF : (1u << (n - e)) - 1);
      _mm512_mask_storeu_epi32(pw + (c / 2) * n + e, valid, _mm512_permutexvar_epi16(interleave, w));
    }
  }
}

// A key pair's V rows (keys c and c + 1, 32 values each from where a and b point) as bf16 pairs, in the order their
// accumulators hold o's dims: bf16 rows as stored, interleaved by one 16-bit unpack (o_to_pair_order); i8 rows
// widened exactly to fp32 and the two rows' bf16 values (the fp32 values' upper halves) interleaved by the permute
// that packs them, dims in their natural order (10 instructions per 32 dims where widening each row, then
// unpacking, took 12); 4-bit rows' bytes interleaved and zero-extended to words (the pair of each byte's two dims),
// their nibbles looked up (even dims, then odd: o_to_q4_order).
template <class T>
ATTN_INLINE void key_pairs(const T* a, const T* b, BH& lo, BH& hi) {
  const __m512i x = (__m512i)load_pairs(a), y = (__m512i)load_pairs(b);
  lo = (BH)_mm512_unpacklo_epi16(x, y), hi = (BH)_mm512_unpackhi_epi16(x, y);
}
ATTN_INLINE void key_pairs(const std::int8_t* a, const std::int8_t* b, BH& lo, BH& hi) {
  // word 2i: a's value i (the upper half of its fp32), word 2i + 1: b's
  const __m512i pairs = _mm512_set_epi16(63, 31, 61, 29, 59, 27, 57, 25, 55, 23, 53, 21, 51, 19, 49, 17, 47, 15, 45, 13,
                                         43, 11, 41, 9, 39, 7, 37, 5, 35, 3, 33, 1);
  lo = (BH)_mm512_permutex2var_epi16(i8_as_f32(a), pairs, i8_as_f32(b));            // dims 0-15
  hi = (BH)_mm512_permutex2var_epi16(i8_as_f32(a + 16), pairs, i8_as_f32(b + 16));  // dims 16-31
}
ATTN_INLINE void key_pairs_q4(const std::uint8_t* a, const std::uint8_t* b, BH& lo, BH& hi) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  q4_nibbles(_mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(x, y), _mm_unpacklo_epi8(x, y))), q4_bf16_table(),
             lo, hi);
}

// o_r = α_r·o_r + Σ_c P[c][r] v_c for lanes r < NL and value dims d .. d + 32·DB, from the weights' bf16 pairs (keys
// c, c + 1) pw[(c/2)·pair_stride + (d/32 + e)·block_stride + r] for the e-th 32 dims (block_stride 0: one weight per
// key and lane, as bf16 and i8 rows have; NL: one per block of 32, as 4-bit rows' block scales give), and the V rows
// in pairs (an odd last key paired with `partner`, a row of finite values: its weight is 0). Each pass prefetches its
// dims of the V rows far ahead (pv).
template <int NL, int DB, class R>
inline void pv_rows_pairs_step(const std::uint32_t* pw, std::int64_t pair_stride, std::int64_t block_stride,
                               const R* vrows, R partner, std::int64_t dv, std::int64_t cols, const float* alpha,
                               float* o, std::int64_t d, const FarRow* pv) {
  constexpr bool kQ4 = std::is_same_v<R, Q4Row>;
  constexpr bool kI8 = std::is_same_v<R, const std::int8_t*>;  // (natural order: key_pairs)
  const auto to_order = [](V x0, V x1, V& lo, V& hi) {
    if constexpr (kQ4) o_to_q4_order(x0, x1, lo, hi);
    else if constexpr (kI8) lo = x0, hi = x1;
    else o_to_pair_order(x0, x1, lo, hi);
  };
  const auto from_order = [](V lo, V hi, V& x0, V& x1) {
    if constexpr (kQ4) o_from_q4_order(lo, hi, x0, x1);
    else if constexpr (kI8) x0 = lo, x1 = hi;
    else o_from_pair_order(lo, hi, x0, x1);
  };
  V acc[NL][2 * DB];
  for (int r = 0; r < NL; ++r)
    for (int e = 0; e < DB; ++e) {
      const V a = Vec::set1(alpha[r]);
      const float* x = o + r * dv + d + 32 * e;
      to_order(Vec::mul(Vec::load(x), a), Vec::mul(Vec::load(x + 16), a), acc[r][2 * e], acc[r][2 * e + 1]);
    }
  const std::uint32_t* wc = pw + (d / 32) * block_stride;
  for (std::int64_t c = 0; c < cols; c += 2, wc += pair_stride) {
    prefetch_rows(pv, c, std::min<std::int64_t>(2, cols - c), row_bytes<R>(d), row_bytes<R>(d + 32 * DB));
    const R v1 = c + 1 < cols ? vrows[c + 1] : partner;
    BH lo[DB], hi[DB];
    if constexpr (kQ4) {  // (the rows' bytes found once, not per 32 dims; d a multiple of 32)
      const std::uint8_t* a = vrows[c].bytes + d / 2;
      const std::uint8_t* b = v1.bytes + d / 2;
      for (int e = 0; e < DB; ++e) key_pairs_q4(a + 16 * e, b + 16 * e, lo[e], hi[e]);
    } else {
      for (int e = 0; e < DB; ++e) key_pairs(vrows[c] + (d + 32 * e), v1 + (d + 32 * e), lo[e], hi[e]);
    }
    for (int e = 0; e < DB; ++e)
      for (int r = 0; r < NL; ++r) {
        const BH w = (BH)_mm512_set1_epi32(static_cast<int>(wc[e * block_stride + r]));
        acc[r][2 * e] = _mm512_dpbf16_ps(acc[r][2 * e], w, lo[e]);
        acc[r][2 * e + 1] = _mm512_dpbf16_ps(acc[r][2 * e + 1], w, hi[e]);
      }
  }
  for (int r = 0; r < NL; ++r)
    for (int e = 0; e < DB; ++e) {
      V x0, x1;
      from_order(acc[r][2 * e], acc[r][2 * e + 1], x0, x1);
      float* x = o + r * dv + d + 32 * e;
      Vec::store(x, x0), Vec::store(x + 16, x1);
    }
}

// The tile's weights (Pᵀ in rows of kRow) as the bf16 pairs pv_rows_pairs reads: of bf16 and i8 rows (weight_pairs),
// of 4-bit rows with their block scales (weight_pairs_q4, below).
template <int NL, std::int64_t kRow, class T>
inline void pair_weights(const float* pt, std::int64_t cols, const T* const*, std::int64_t, const float* vscale,
                         std::uint32_t* pw) {
  weight_pairs<NL, std::is_same_v<T, std::int8_t>, kRow>(pt, cols, pw, vscale);
}

// Passes of 32·DB value dims while they fit, then of DB / 2, .. 1 (each dim's sum is the same whichever: one lane's
// 256-dim passes leave d128 to one pass of 128, not four of 32). Returns the first dim not done.
template <int NL, int DB, class R>
inline std::int64_t pv_rows_pairs_steps(const std::uint32_t* pw, std::int64_t pair_stride, std::int64_t block_stride,
                                        const R* vrows, R partner, std::int64_t dv, std::int64_t cols,
                                        const float* alpha, float* o, std::int64_t d, const FarRow* pv) {
  for (; d + 32 * DB <= dv; d += 32 * DB)
    pv_rows_pairs_step<NL, DB>(pw, pair_stride, block_stride, vrows, partner, dv, cols, alpha, o, d, pv);
  if constexpr (DB > 1)
    return pv_rows_pairs_steps<NL, DB / 2>(pw, pair_stride, block_stride, vrows, partner, dv, cols, alpha, o, d, pv);
  else
    return d;
}

// pv_rows for bf16 pairs, from the weights Pᵀ[c][r] as bf16 pairs (pair_weights): 32·DB value dims at a time
// (NL·2·DB <= 16 accumulators), the last dv % 32 dims as the fp32 form does them (from the same rounded weights).
template <int NL, class T>
inline void pv_rows_pairs(const std::uint32_t* pw, const T* const* vrows, std::int64_t dv, std::int64_t cols,
                          const float* alpha, float* o, const T* zero, const FarRow* pv) {
  constexpr int DB = NL >= 8 ? 1 : 8 / NL;
  std::int64_t d = pv_rows_pairs_steps<NL, DB>(pw, NL, 0, vrows, zero, dv, cols, alpha, o, 0, pv);
  for (; d < dv; ++d)
    for (int r = 0; r < NL; ++r) {
      float acc = o[r * dv + d] * alpha[r];
      for (std::int64_t c = 0; c < cols; ++c)
        acc += core::to_float(core::bf16{static_cast<std::uint16_t>(pw[(c / 2) * NL + r] >> (16 * (c & 1)))}) *
               core::to_float(vrows[c][d]);
      o[r * dv + d] = acc;
    }
}

// pair_weights for 4-bit V rows: the weights with their blocks' scales (cols / 2 · dv / 32 · NL pairs).
template <int NL, std::int64_t kRow>
inline void pair_weights(const float* pt, std::int64_t cols, const Q4Row* vrows, std::int64_t dv, const float*,
                         std::uint32_t* pw) {
  weight_pairs_q4<NL, kRow>(pt, vrows, cols, dv / 32, pw);
}
// pv_rows_pairs for 4-bit V rows (dv a multiple of 32), from those weights (pw), 32·DB value dims at a time (an odd
// last key paired with the tile's first row).
template <int NL>
inline void pv_rows_pairs(const std::uint32_t* pw, const Q4Row* vrows, std::int64_t dv, std::int64_t cols,
                          const float* alpha, float* o, const FarRow* pv) {
  const std::int64_t nb = dv / 32;
  constexpr int DB = NL >= 8 ? 1 : 8 / NL;
  pv_rows_pairs_steps<NL, DB>(pw, nb * NL, NL, vrows, vrows[0], dv, cols, alpha, o, 0, pv);
}
#else
inline constexpr bool kBf16Dot = false;
#endif

// The units of this kernel's scores, chosen per call so that a weight takes as few operations as possible and no
// score leaves the fp32 range that q·k (+ mask) itself has:
//   no dense mask, scale·log2 e <= 1 (every default scale of Dk >= 3): log2 units, s = q·k·scale·log2 e, which
//     scores() forms as it stores the dot products; the state runs with c = 1, a weight is 2^(s − m) (one
//     subtraction, exact near the max) and the scale costs nothing;
//   no dense mask, a larger scale: the unscaled dot products, c = scale·log2 e (a weight is 2^((s − m)·c));
//   a dense mask: natural units, s = scale·q·k + mask formed in double and rounded once (finish_scores),
//     c = log2 e (a finite mask up to ±FLT_MAX stays finite).
// k converts to natural-log units for the LSE (m·k + ln l).
struct Units {
  float dot = 1;        // the factor scores() applies to dot products
  float c = 1;          // score units -> log2 units (the state's c)
  double k = 1;         // score units -> natural-log units
  float wide_lo = 0;    // |tile max| above this (and below wide_hi), in score units: the wide path,
  float wide_hi = 0;
  float far = 0;        // unless the tile max lies this far below the lane's running max (score units)
};

// Scores of at least kWideScores in magnitude (natural-log units) make a softmax row's weights depend on the
// last bits of its fp32 dot products (an error ε·|s| in a score is an error ε·|s| in its weight's exponent), so
// which of two equally rounded computations, this kernel's or a naive one's, comes closer is luck. Tiles whose
// largest score per lane is that large are recomputed wide: double dot products, exponents (s - m)·c formed in
// double. Above kWideScoresMax the fp32 state itself cannot hold the max finely enough (its rounding would
// underflow the weights), and fp32 scores are as good as any fp32 computation gets. Ordinary inputs (unit-size
// activations, |scores| of tens) never come near it. A tile whose max lies kFarBelow (natural-log units) or more
// below the lane's running max needs no care: its weights are below e^-kFarBelow of the row's largest, invisible
// to fp32 sums. (ALiBi makes the scores of far keys large and negative: its rows are walked from the diagonal
// back, so the running max is found first and the far tiles stay on the fp32 path; see flash_block.)
constexpr double kWideScores = 256.0, kWideScoresMax = 1e8, kFarBelow = 128.0;

template <class Variant>
Units units(const core::Problem& p) {
  Units u;
  const double c = p.scale * core::kLog2e;
  if (Variant::kPerElement) u.c = static_cast<float>(core::kLog2e), u.k = 1.0;
  else if (c <= 1.0) u.dot = static_cast<float>(c), u.k = 1.0 / core::kLog2e;
  else u.c = static_cast<float>(c), u.k = p.scale;
  u.wide_lo = static_cast<float>(kWideScores / u.k);  // (inf for a tiny k: never wide)
  u.wide_hi = static_cast<float>(kWideScoresMax / u.k);
  u.far = static_cast<float>(kFarBelow / u.k);  // (inf for a tiny k: every tile in the band is wide)
  return u;
}

// The key range of every lane (core::key_range: causal, window, key length) relative to a tile's first key j0, as
// vectors: hide(v, c, x) is x where key j0 + c lies in the lane's range and -inf elsewhere. Lanes past lanes.n keep
// every key. (Offsets are clamped to [-1, BC + 1]: exact in fp32.)
struct KeyWindow {
  alignas(64) float lo[BR], hi[BR];
  KeyWindow(const core::Problem& p, const Lanes& lanes, std::int64_t j0) {
    const auto rel = [&](std::int64_t x) { return static_cast<float>(std::clamp<std::int64_t>(x - j0, -1, BC + 1)); };
    for (std::int64_t r = 0; r < BR; ++r) {
      lo[r] = -1, hi[r] = BC + 1;
      if (r >= lanes.n) continue;
      const core::KeyRange range = core::key_range(p, lanes.b, lanes.i[r]);
      lo[r] = rel(range.lo), hi[r] = rel(range.hi);
    }
  }
  V hide(int v, std::int64_t c, V x) const {
    const V cf = Vec::set1(static_cast<float>(c)), neg_inf = Vec::set1(core::kNegInf);
    x = Vec::select_lt(cf, Vec::load(lo + v * W), neg_inf, x);
    return Vec::select_lt(cf, Vec::load(hi + v * W), x, neg_inf);
  }
};

// Turns a tile's dot products into scores (Units) and hides what a lane may not see (-inf), every lane at once.
// Without per-element work (Variant::kPerElement) scores() already stored them in the call's units, so a tile every
// lane sees whole needs nothing at all; with it, each score is the variant's logit of x = scale·s (the vector form
// of core/variant.h's hooks: dense mask, softcap, ALiBi, whatever the variant is). Returns whether some (lane, key)
// pair of the tile is hidden (by a key range or the dense mask).
// The hooks of a variant without per-element work: none.
struct NoHooks {
  template <class... A>
  explicit NoHooks(const A&...) {}
};

template <int QV, class Variant>
bool finish_scores(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, bool interior,
                   float* st) {
  if (interior && !Variant::kPerElement) return false;
  bool hidden = !interior;
  std::optional<KeyWindow> window;
  if (!interior) window.emplace(p, lanes, j0);
  // The variant's vector hooks, built here in the kernel's target region (never through std::optional, whose
  // members are compiled for the baseline: see ATTN_INLINE in core/hd.h).
  using Hooks = std::conditional_t<Variant::kPerElement, typename Variant::template Lanes<VecLanes, BR>, NoHooks>;
  const Hooks hooks(p, lanes.b, lanes.h, lanes.i, lanes.n, j0);
  const V scale = Vec::set1(static_cast<float>(p.scale));
  for (std::int64_t c = 0; c < cols; ++c)
    for (int v = 0; v < QV; ++v) {
      V x = Vec::load(st + c * BR + v * W);
      if constexpr (Variant::kPerElement) x = hooks.logit(v, c, Vec::mul(x, scale), hidden);
      if (window) x = window->hide(v, c, x);
      Vec::store(st + c * BR + v * W, x);
    }
  return hidden;
}

// The largest score of each lane over the tile (lanes in QV vectors).
template <int QV>
inline void tile_max(const float* st, std::int64_t cols, V* mx) {
  for (int v = 0; v < QV; ++v) mx[v] = Vec::set1(core::kNegInf);
  for (std::int64_t k = 0; k < cols; ++k)
    for (int v = 0; v < QV; ++v) mx[v] = Vec::max(mx[v], Vec::load(st + k * BR + v * W));
}

// Whether some lane r < n has its largest score in the wide band (wide_lo, wide_hi) in magnitude. (Lanes past n
// hold no query: whatever they hold must not change how the block's lanes are computed.)
template <int QV>
inline bool needs_wide(const V* mx, const float* m, const Units& u, std::int64_t n) {
  const V lo = Vec::set1(u.wide_lo), hi = Vec::set1(u.wide_hi), far = Vec::set1(u.far), zero = Vec::zero();
  for (int v = 0; v < QV; ++v) {
    const V a = Vec::max(mx[v], Vec::sub(zero, mx[v]));  // |max| (NaN -> -max: not in the band)
    alignas(64) float in[W];
    Vec::store(in, Vec::select_lt(lo, a, Vec::select_lt(a, hi, Vec::set1(1.0f), zero), zero));
    // ... and not far below the running max m (m - far is -inf for a lane's first tile)
    Vec::store(in, Vec::select_lt(mx[v], Vec::sub(Vec::load(m + v * W), far), zero, Vec::load(in)));
    for (int i = 0; i < W && v * W + i < n; ++i)
      if (in[i] != 0.0f) return true;
  }
  return false;
}

// The online-softmax step for one tile, all lanes at once (core::OnlineSoftmax over the vector lanes), given
// the tile's max per lane: m' = max(m, mx), α = 2^((m - m')·c), Sᵀ replaced by Pᵀ = 2^((Sᵀ - m')·c),
// l = α·l + Σ_c Pᵀ[c]; in log2 units (c = 1) one operation fewer per weight. The accumulator is rescaled by α
// afterwards (alpha_out).
template <int QV, bool Log2Units>
inline void softmax_step(float* st, std::int64_t cols, const V* mx, float c_log2, float* m, float* l,
                         float* alpha_out) {
  using State = core::OnlineSoftmax<VecLanes>;
  const V c = Vec::set1(c_log2);
  State state[QV];
  V origin[QV], sum[QV];
  for (int v = 0; v < QV; ++v) {
    state[v].m = Vec::load(m + v * W), state[v].l = Vec::load(l + v * W);
    Vec::store(alpha_out + v * W, state[v].advance(mx[v], c));
    origin[v] = state[v].origin();
    sum[v] = Vec::zero();
  }
  for (std::int64_t k = 0; k < cols; ++k)
    for (int v = 0; v < QV; ++v) {
      const V s = Vec::load(st + k * BR + v * W);
      const V pw = Log2Units ? State::weight_log2(s, origin[v]) : State::weight(s, origin[v], c);
      Vec::store(st + k * BR + v * W, pw);
      sum[v] = Vec::add(sum[v], pw);
    }
  for (int v = 0; v < QV; ++v) {
    state[v].add(sum[v]);
    Vec::store(m + v * W, state[v].m);
    Vec::store(l + v * W, state[v].l);
  }
}

// The same step lane by lane, wide (see kWideScores) for the lanes whose largest fp32 score lies in the band:
// each score again from a double dot product (q from the block's fp32 Q: Qᵀ [Dk][BR] or rows [BR][Dk]; K rows
// of any storage type), the lane's max rounded up to fp32 (so no weight exceeds 1), and every exponent (s - m)
// formed in double. The other lanes take the fp32 scores as the vector step does. Same state, same outputs.
template <class Variant, class R>
void softmax_step_wide(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols,
                       const float* q, bool q_rows, const R* krows, const float* kscale, const Units& u,
                       float* st, float* m, float* l, float* alpha_out) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (std::int64_t r = 0; r < lanes.n; ++r) {
    float mx32 = core::kNegInf;
    for (std::int64_t c = 0; c < cols; ++c) mx32 = core::ScalarLanes::max(mx32, st[c * BR + r]);
    const bool wide = std::fabs(mx32) > u.wide_lo && std::fabs(mx32) < u.wide_hi && !(mx32 < m[r] - u.far);
    double s[BC], mx = neg_inf;
    bool nan = false;
    if (wide) {
      const core::KeyRange range = core::key_range(p, lanes.b, lanes.i[r]);
      const auto row = Variant::row(p, lanes.b, lanes.h[r], lanes.i[r]);
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t j = j0 + c;
        if (j < range.lo || j >= range.hi || row.hidden(j)) {
          s[c] = neg_inf;
          continue;
        }
        double dot = 0;
        for (std::int64_t d = 0; d < p.Dk; ++d)
          dot += static_cast<double>(q_rows ? q[r * p.Dk + d] : q[d * BR + r]) * core::to_float(krows[c][d]);
        if (kscale) dot *= kscale[c];  // (i8 rows)
        s[c] = row.logit(j, dot * p.scale) / u.k;  // the call's units (Units)
        if (std::isnan(s[c])) nan = true;
        else mx = std::max(mx, s[c]);
      }
    } else {
      for (std::int64_t c = 0; c < cols; ++c) s[c] = st[c * BR + r];
    }
    float mx_f = wide ? static_cast<float>(mx) : mx32;
    if (wide && mx_f < mx) mx_f = std::nextafter(mx_f, std::numeric_limits<float>::infinity());
    core::RowState state;
    state.m = m[r], state.l = l[r];
    alpha_out[r] = state.advance(nan ? std::numeric_limits<float>::quiet_NaN() : mx_f, u.c);
    const double origin = state.origin(), c_d = u.c;
    double sum = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float w = static_cast<float>(std::exp2((s[c] - origin) * c_d));
      st[c * BR + r] = w;
      sum += w;
    }
    state.add(static_cast<float>(sum));
    m[r] = state.m, l[r] = state.l;
  }
}

// Row-major blocks of NL = 2, 4 or 8 lanes on AVX-512, 2 or 4 on AVX2 (decode of GQA groups of 2, 4 and 8): the
// tile max and the softmax step run on W / NL rows of Sᵀ packed into one vector (row k + i in lanes i·NL ..) instead
// of one row per vector with W − NL lanes idle: the same operations on every score (the same weights) on W / NL
// times fewer vectors; a lane's weights are summed in another order (per row residue, then folded).
#if defined(ATTN_VEC_AVX512) || defined(ATTN_VEC_AVX2)
template <int NL>
inline constexpr bool kPackedRows = NL == 1 || NL == 2 || NL == 4 || (W == 16 && NL == 8);
// Rows k .. k + 4/NL − 1 (NL lanes each) as one __m128.
template <int NL>
ATTN_INLINE __m128 packed_piece(const float* st) {
  if constexpr (NL == 4) return _mm_loadu_ps(st);
  else return _mm_loadh_pi(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(st))),
                           reinterpret_cast<const __m64*>(st + BR));
}
template <int NL>
ATTN_INLINE void store_piece(float* st, __m128 piece) {
  if constexpr (NL == 4) _mm_storeu_ps(st, piece);
  else _mm_storel_pi(reinterpret_cast<__m64*>(st), piece), _mm_storeh_pi(reinterpret_cast<__m64*>(st + BR), piece);
}
#if defined(ATTN_VEC_AVX512)
// Rows k .. k + W/NL − 1 of Sᵀ (rows of kRow: BR, or NL where they are packed already) as one vector, and back.
template <int NL, std::int64_t kRow = BR>
ATTN_INLINE V load_packed(const float* st) {
  if constexpr (kRow == NL) {
    return Vec::load(st);
  } else if constexpr (NL == 8) {  // a row per 256-bit half
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(st)), _mm256_loadu_ps(st + BR), 1);
  } else {
    constexpr int R = 4 / NL;  // rows per piece
    const V x = _mm512_insertf32x4(_mm512_castps128_ps512(packed_piece<NL>(st)), packed_piece<NL>(st + R * BR), 1);
    return _mm512_insertf32x4(_mm512_insertf32x4(x, packed_piece<NL>(st + 2 * R * BR), 2), packed_piece<NL>(st + 3 * R * BR), 3);
  }
}
template <int NL, std::int64_t kRow = BR>
ATTN_INLINE void store_packed(float* st, V x) {
  if constexpr (kRow == NL) {
    Vec::store(st, x);
  } else if constexpr (NL == 8) {  // a row per 256-bit half
    _mm256_storeu_ps(st, _mm512_castps512_ps256(x));
    _mm256_storeu_ps(st + BR, _mm512_extractf32x8_ps(x, 1));
  } else {
    constexpr int R = 4 / NL;
    store_piece<NL>(st, _mm512_castps512_ps128(x));
    store_piece<NL>(st + R * BR, _mm512_extractf32x4_ps(x, 1));
    store_piece<NL>(st + 2 * R * BR, _mm512_extractf32x4_ps(x, 2));
    store_piece<NL>(st + 3 * R * BR, _mm512_extractf32x4_ps(x, 3));
  }
}
// Lanes i·NL + r of a packed vector combined by op into lane r (every lane r + j·NL holds the result).
template <int NL, class Op>
ATTN_INLINE V fold_packed(V x, Op op) {
  x = op(x, _mm512_shuffle_f32x4(x, x, 0x4E));                                   // 256-bit halves
  if constexpr (NL <= 4) x = op(x, _mm512_shuffle_f32x4(x, x, 0xB1));            // 128-bit quarters
  if constexpr (NL <= 2) x = op(x, _mm512_permute_ps(x, 0x4E));                 // 64-bit halves
  if constexpr (NL == 1) x = op(x, _mm512_permute_ps(x, 0xB1));                 // lanes
  return x;
}
// Lanes 0 .. NL − 1 of x repeated over the vector.
template <int NL>
ATTN_INLINE V repeat_lanes(V x) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_permutexvar_ps(_mm512_and_si512(lane, _mm512_set1_epi32(NL - 1)), x);
}
// Lanes 0 .. NL − 1 of x stored at p (the next keys' lanes of a packed row left as they are).
template <int NL>
ATTN_INLINE void store_lanes(float* p, V x) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << NL) - 1), x);
}
#else  // AVX2: a vector is two 128-bit pieces
template <int NL, std::int64_t kRow = BR>
ATTN_INLINE V load_packed(const float* st) {
  if constexpr (kRow == NL) {
    return Vec::load(st);
  } else {
    constexpr int R = 4 / NL;  // rows per piece
    return _mm256_insertf128_ps(_mm256_castps128_ps256(packed_piece<NL>(st)), packed_piece<NL>(st + R * BR), 1);
  }
}
template <int NL, std::int64_t kRow = BR>
ATTN_INLINE void store_packed(float* st, V x) {
  if constexpr (kRow == NL) {
    Vec::store(st, x);
  } else {
    constexpr int R = 4 / NL;
    store_piece<NL>(st, _mm256_castps256_ps128(x));
    store_piece<NL>(st + R * BR, _mm256_extractf128_ps(x, 1));
  }
}
template <int NL, class Op>
ATTN_INLINE V fold_packed(V x, Op op) {
  x = op(x, _mm256_permute2f128_ps(x, x, 0x01));                // 128-bit halves
  if constexpr (NL <= 2) x = op(x, _mm256_permute_ps(x, 0x4E));  // 64-bit halves
  if constexpr (NL == 1) x = op(x, _mm256_permute_ps(x, 0xB1));  // lanes
  return x;
}
template <int NL>
ATTN_INLINE V repeat_lanes(V x) {
  return _mm256_permutevar8x32_ps(x, _mm256_and_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(NL - 1)));
}
template <int NL>
ATTN_INLINE void store_lanes(float* p, V x) {
  _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(NL), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), x);
}
#endif
template <int NL, std::int64_t kRow = BR>
inline void tile_max_packed(const float* st, std::int64_t cols, V* mx) {
  constexpr int KPV = W / NL;
  V packed = Vec::set1(core::kNegInf), rest = packed;
  std::int64_t k = 0;
  for (; k + KPV <= cols; k += KPV) packed = Vec::max(packed, load_packed<NL, kRow>(st + k * kRow));
  for (; k < cols; ++k) rest = Vec::max(rest, Vec::load(st + k * kRow));
  mx[0] = Vec::max(fold_packed<NL>(packed, [](V a, V b) { return Vec::max(a, b); }), rest);
}
template <int NL, bool Log2Units, std::int64_t kRow = BR>
inline void softmax_step_packed(float* st, std::int64_t cols, const V* mx, float c_log2, float* m, float* l,
                                float* alpha_out) {
  using State = core::OnlineSoftmax<VecLanes>;
  constexpr int KPV = W / NL;
  const V c = Vec::set1(c_log2);
  State state;
  state.m = Vec::load(m), state.l = Vec::load(l);
  Vec::store(alpha_out, state.advance(mx[0], c));
  const V origin = state.origin(), origin_packed = repeat_lanes<NL>(origin);
  V packed = Vec::zero(), sum = Vec::zero();
  std::int64_t k = 0;
  for (; k + KPV <= cols; k += KPV) {
    const V s = load_packed<NL, kRow>(st + k * kRow);
    const V pw = Log2Units ? State::weight_log2(s, origin_packed) : State::weight(s, origin_packed, c);
    store_packed<NL, kRow>(st + k * kRow, pw);
    packed = Vec::add(packed, pw);
  }
  for (; k < cols; ++k) {  // (packed rows: lanes past NL are the next keys', written again by their own step)
    const V s = Vec::load(st + k * kRow);
    const V pw = Log2Units ? State::weight_log2(s, origin) : State::weight(s, origin, c);
    if constexpr (kRow == NL) store_lanes<NL>(st + k * kRow, pw);
    else Vec::store(st + k * kRow, pw);
    sum = Vec::add(sum, pw);
  }
  state.add(Vec::add(fold_packed<NL>(packed, [](V a, V b) { return Vec::add(a, b); }), sum));
  Vec::store(m, state.m);
  Vec::store(l, state.l);
}
#else
template <int NL>
inline constexpr bool kPackedRows = false;
template <int NL, std::int64_t kRow = BR>
inline void tile_max_packed(const float*, std::int64_t, V*) {}
template <int NL, bool Log2Units, std::int64_t kRow = BR>
inline void softmax_step_packed(float*, std::int64_t, const V*, float, float*, float*, float*) {}
#endif

// The softmax of one tile: Sᵀ (scores in the call's units, hidden pairs -inf) becomes Pᵀ, and every lane's
// state takes the tile; the vector step, or the wide one when the tile's scores are large (kscale: the scales of
// i8 K rows, null for rows of values).
template <int QV, class Variant, int NL = 0, class R>
inline void softmax_tile(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, bool q_rows,
                         const R* krows, const float* kscale, const Units& u, Workspace& ws) {
  V mx[QV];
  if constexpr (kPackedRows<NL> && NL > 1 && QV == 1) tile_max_packed<NL>(ws.st.data(), cols, mx);
  else tile_max<QV>(ws.st.data(), cols, mx);
  if (needs_wide<QV>(mx, ws.m.data(), u, lanes.n))
    softmax_step_wide<Variant>(p, lanes, j0, cols, ws.q.data(), q_rows, krows, kscale, u, ws.st.data(), ws.m.data(),
                                 ws.l.data(), ws.alpha.data());
  else if constexpr (kPackedRows<NL> && NL > 1 && QV == 1) {
    if (u.c == 1.0f) softmax_step_packed<NL, true>(ws.st.data(), cols, mx, u.c, ws.m.data(), ws.l.data(), ws.alpha.data());
    else softmax_step_packed<NL, false>(ws.st.data(), cols, mx, u.c, ws.m.data(), ws.l.data(), ws.alpha.data());
  } else if (u.c == 1.0f)
    softmax_step<QV, true>(ws.st.data(), cols, mx, u.c, ws.m.data(), ws.l.data(), ws.alpha.data());
  else
    softmax_step<QV, false>(ws.st.data(), cols, mx, u.c, ws.m.data(), ws.l.data(), ws.alpha.data());
}

// Dropout (core/dropout.h): every lane's weights of the tile times their factors z (1 / (1 − p) or 0), after the
// softmax has summed them into l. Compiled into the `mods` variant only.
template <class Variant>
inline void drop_weights(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, float* pt) {
  if (!Variant::dropout(p)) return;
  alignas(64) float z[BC];
  for (std::int64_t r = 0; r < lanes.n; ++r) {
    p.dropout.factors(lanes.b, lanes.h[r], lanes.i[r], j0, cols, z, 1);
    for (std::int64_t c = 0; c < cols; ++c) pt[c * BR + r] *= z[c];
  }
}

// O = α·O + P V over the tile's keys for the pairs a lane attends only: the exact path for a tile where a
// hidden (lane, key) pair meets a V row holding NaN or inf, which the vector products would turn into
// 0·NaN = NaN for lanes that never attend that key. Lane r's value d is o[d·d_stride + r·r_stride].
template <class Variant, class R>
void pv_attended(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, const float* pt,
                 const R* vrows, const float* alpha, float* o, std::int64_t d_stride, std::int64_t r_stride) {
  for (std::int64_t r = 0; r < lanes.n; ++r) {
    const core::KeyRange range = core::key_range(p, lanes.b, lanes.i[r]);
    const auto row = Variant::row(p, lanes.b, lanes.h[r], lanes.i[r]);
    for (std::int64_t d = 0; d < p.Dv; ++d) {
      float& out = o[d * d_stride + r * r_stride];
      float acc = out * alpha[r];
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t j = j0 + c;
        if (j < range.lo || j >= range.hi || row.hidden(j)) continue;
        acc += pt[c * BR + r] * core::to_float(vrows[c][d]);
      }
      out = acc;
    }
  }
}

// Rows of a tile times a factor per key: Sᵀ[c][r] *= f[c] for lanes r < NL (the scales of i8 K or V rows), a
// vector of lanes at a time (lanes past NL are scratch: scaling them changes nothing read).
template <int NL>
inline void scale_keys(float* st, const float* f, std::int64_t cols) {
  for (std::int64_t c = 0; c < cols; ++c) {
    const V fc = Vec::set1(f[c]);
    for (int r = 0; r < NL; r += W) Vec::store(st + c * BR + r, Vec::mul(Vec::load(st + c * BR + r), fc));
  }
}
#if defined(ATTN_VEC_AVX512) || defined(ATTN_VEC_AVX2)
// The same for Sᵀ packed (rows of NL lanes: rows_step_packed), W / NL keys a vector, each lane i·NL + r times key
// c + i's factor (the same products).
template <int NL>
inline void scale_keys_packed(float* st, const float* f, std::int64_t cols) {
  constexpr int KPV = W / NL;
  std::int64_t c = 0;
  for (; c + KPV <= cols; c += KPV) Vec::store(st + c * NL, Vec::mul(Vec::load(st + c * NL), repeat_keys<NL>(f + c)));
  for (; c < cols; ++c) store_lanes<NL>(st + c * NL, Vec::mul(Vec::load(st + c * NL), Vec::set1(f[c])));
}
#endif

#if ATTN_VEC_BF16_DOT
// O = α·O + P V on the pair products from the tile's weights Pᵀ (rows of kRow): the weights as bf16 pairs
// (pair_weights), then the products. 4-bit rows' pairs (with their block scales: cols / 2 · Dv / 32 · NL) go in the
// workspace's V tile and pair an odd last key with the tile's first row; bf16 and i8 rows' (BC / 2 · NL) go on the
// stack and pair it with the zero row start_pairs put in the V tile.
template <int NL, std::int64_t kRow, class R>
inline void pv_pairs(const float* pt, const R* vrows, const float* vscale, std::int64_t dv, std::int64_t cols,
                     Workspace& ws, const FarRow* v_far) {
  if constexpr (std::is_same_v<R, Q4Row>) {
    auto* pw = reinterpret_cast<std::uint32_t*>(ws.v.data());
    pair_weights<NL, kRow>(pt, cols, vrows, dv, vscale, pw);
    pv_rows_pairs<NL>(pw, vrows, dv, cols, ws.alpha.data(), ws.o.data(), v_far);
  } else {
    alignas(64) std::uint32_t pw[BC / 2 * NL];
    pair_weights<NL, kRow>(pt, cols, vrows, dv, vscale, pw);
    pv_rows_pairs<NL>(pw, vrows, dv, cols, ws.alpha.data(), ws.o.data(),
                      reinterpret_cast<std::remove_cv_t<std::remove_pointer_t<R>>*>(ws.v.data()), v_far);
  }
}
#endif

#if defined(ATTN_VEC_AVX512) || defined(ATTN_VEC_AVX2)
// O = α·O + P V from the tile's weights Pᵀ (rows of kRow: BR, or NL packed): on the pair products from the weights
// as bf16 pairs (Pairs), else by fp32 FMAs after i8 V rows' scales have multiplied the weights.
template <int NL, bool Pairs, std::int64_t kRow, class R>
inline void values_packed(float* pt, const R* vrows, const float* vscale, std::int64_t dv, std::int64_t cols,
                          Workspace& ws, const FarRow* v_far) {
#if ATTN_VEC_BF16_DOT
  if constexpr (Pairs)
    pv_pairs<NL, kRow>(pt, vrows, vscale, dv, cols, ws, v_far);                                   // O = α·O + P V
  else
#endif
  {
    if constexpr (kRow == NL) {
      if (vscale) scale_keys_packed<NL>(pt, vscale, cols);                                         // i8 V scales
    } else if (vscale) {
      scale_keys<NL>(pt, vscale, cols);
    }
    pv_rows<NL, kRow>(pt, vrows, dv, cols, ws.alpha.data(), ws.o.data(), v_far);                   // O = α·O + P V
  }
}

// rows_step for a GQA group of 2, 4 or 8 lanes (AVX-512; 2 or 4 on AVX2: kPackedRows), in a tile every lane sees
// whole, with no per-score variant and no dropout: decode's common tile, on the pair products (Pairs) or fp32 FMAs.
// Sᵀ stays packed, key c's NL lanes at sp[c·NL] (0.25-2 KiB, where rows of BR spread them over 64 lines): the
// lane-summing tree's vector of W / NL keys is stored as it is, and the scales, the max, the weights and (on the pair
// products) their rounding to bf16 pairs read and write whole vectors of keys, with none of the shuffles that packed
// and unpacked rows of BR. The same operations on the same values as rows_step: the same bits. A tile whose scores
// need the wide step (needs_wide) unpacks Sᵀ into rows of BR and takes that step.
template <int NL, class Variant, bool Pairs, class R>
void rows_step_packed(const core::Problem& p, const Lanes& lanes, const R* krows, const R* vrows, const float* kscale,
                      const float* vscale, std::int64_t j0, std::int64_t cols, const Units& u, Workspace& ws,
                      const FarRow* k_far, const FarRow* v_far) {
  alignas(64) float sp[BC * NL + W];  // (+ W: a last key's load reads a vector)
#if ATTN_VEC_BF16_DOT
  if constexpr (Pairs)
    scores_rows_pairs<NL, NL>(ws.q.data(), krows, p.Dk, cols, u.dot, sp, k_far,
                              reinterpret_cast<const std::uint16_t*>(ws.k.data()), ws.k_step, kscale);  // Sᵀ = K Qᵀ
  else
#endif
    scores_rows<NL, NL>(kQ4Split<R> ? ws.k.data() : ws.q.data(), krows, p.Dk, cols, u.dot, sp, k_far,
                        ws.k_step);                                                                     // Sᵀ = K Qᵀ
  Vec::store(sp + cols * NL, Vec::zero());
  if (!Pairs && kscale) scale_keys_packed<NL>(sp, kscale, cols);                                  // i8 K scales
  V mx;
  tile_max_packed<NL, NL>(sp, cols, &mx);                                                         // tile max
  if (needs_wide<1>(&mx, ws.m.data(), u, lanes.n)) {
    for (std::int64_t c = 0; c < cols; ++c) std::memcpy(ws.st.data() + c * BR, sp + c * NL, NL * sizeof(float));
    softmax_step_wide<Variant>(p, lanes, j0, cols, ws.q.data(), true, krows, kscale, u, ws.st.data(), ws.m.data(),
                               ws.l.data(), ws.alpha.data());                                      // Pᵀ; m, l
    values_packed<NL, Pairs, BR>(ws.st.data(), vrows, vscale, p.Dv, cols, ws, v_far);             // O = α·O + P V
  } else {
    if (u.c == 1.0f)
      softmax_step_packed<NL, true, NL>(sp, cols, &mx, u.c, ws.m.data(), ws.l.data(), ws.alpha.data());  // Pᵀ; m, l
    else
      softmax_step_packed<NL, false, NL>(sp, cols, &mx, u.c, ws.m.data(), ws.l.data(), ws.alpha.data());
    values_packed<NL, Pairs, NL>(sp, vrows, vscale, p.Dv, cols, ws, v_far);                       // O = α·O + P V
  }
}
#endif

// One tile of a row-major (decode) block, from K and V rows of any storage type. Decode streams K and V
// from memory once, so the score loop prefetches the K rows k_far[c] and the P·V loop the V rows v_far[c]
// (StoredTile: 32 KiB of K rows after key c) into L2 (prefetch_rows). Issued all at once before the scores, the
// prefetches stalled on full miss buffers: spreading them made D1-D3 24-33 % faster in f32 and bf16. Rows this far
// ahead (prefetcht2), instead of this tile's V rows into L1 and the K rows 48 keys ahead into L2, made D1-D3 1.27-1.54x
// as fast in f32, 1.16-1.25x in bf16, 1.08-1.42x from f16 K/V and 1.05-1.16x from i8 (i4, bound by its arithmetic,
// unchanged; Zen 5, 2 threads, bench/results_zen5_decode_prefetch.md; 32-128 KiB ahead alike, 16 KiB and less
// slower): the hardware's streams alone did not keep the lines of two row streams in flight while a tile computes. i8 rows (kscale,
// vscale: their scales; null otherwise) are widened in registers like the others; a key's scale then multiplies
// its dot product and a value's scale its weight (after the softmax has summed the weights; with the pair products
// as the scores are stored and as the weights are rounded to bf16: store_group_scores, weight_pairs). Pairs: both products
// on bf16 pairs (scores_rows_pairs, pv_rows_pairs; bf16 Q, K and V rows bf16 or i8), reading q's bf16 rows and a
// zero V row from the workspace's K and V tiles (unused for rows read as stored), where start_pairs put them; 4-bit
// rows on AVX-512 and AVX2 (kQ4Split) read q's rows in their split order from the K tile (q4_split_rows).
template <int QV, int NL, class Variant, bool Pairs = false, class R>
void rows_step(const core::Problem& p, const Lanes& lanes, const R* krows, const R* vrows, const float* kscale,
               const float* vscale, std::int64_t j0, std::int64_t cols, bool interior, const Units& u, Workspace& ws,
               const FarRow* k_far = nullptr, const FarRow* v_far = nullptr) {
#if defined(ATTN_VEC_AVX512) || defined(ATTN_VEC_AVX2)
  if constexpr (kPackedRows<NL> && QV == 1)
    if (interior && !Variant::kPerElement && !Variant::dropout(p))
      return rows_step_packed<NL, Variant, Pairs>(p, lanes, krows, vrows, kscale, vscale, j0, cols, u, ws, k_far,
                                                  v_far);
#endif
#if ATTN_VEC_BF16_DOT
  if constexpr (Pairs)
    scores_rows_pairs<NL>(ws.q.data(), krows, p.Dk, cols, u.dot, ws.st.data(), k_far,
                          reinterpret_cast<const std::uint16_t*>(ws.k.data()), ws.k_step, kscale);  // Sᵀ = K Qᵀ
  else
#endif
  {
    scores_rows<NL>(kQ4Split<R> ? ws.k.data() : ws.q.data(), krows, p.Dk, cols, u.dot, ws.st.data(), k_far,
                    ws.k_step);                                                                 // Sᵀ = K Qᵀ
    if (kscale) scale_keys<NL>(ws.st.data(), kscale, cols);                                     // i8 K scales
  }
  const bool hidden = finish_scores<QV, Variant>(p, lanes, j0, cols, interior, ws.st.data());  // units, masks
  softmax_tile<QV, Variant, NL>(p, lanes, j0, cols, true, krows, kscale, u, ws);               // Pᵀ; m, l
  drop_weights<Variant>(p, lanes, j0, cols, ws.st.data());                                     // dropout
  const bool exact_pv = hidden && !rows_finite(vrows, cols, p.Dv);
  if (vscale && (!Pairs || exact_pv)) scale_keys<NL>(ws.st.data(), vscale, cols);              // i8 V scales
  if (exact_pv)
    pv_attended<Variant>(p, lanes, j0, cols, ws.st.data(), vrows, ws.alpha.data(), ws.o.data(), 1, p.Dv);
#if ATTN_VEC_BF16_DOT
  else if constexpr (Pairs)
    pv_pairs<NL, BR>(ws.st.data(), vrows, vscale, p.Dv, cols, ws, v_far);                    // O = α·O + P V
#endif
  else
    pv_rows<NL>(ws.st.data(), vrows, p.Dv, cols, ws.alpha.data(), ws.o.data(), v_far);           // O = α·O + P V
}

// The stored K and V rows of a row-major (decode) block's tile, located one tile ahead of their use (i8 rows'
// scales, and i4 rows' block scales carried in their Q4Rows, are prefetched as soon as they are located), and the
// rows far_keys(Dk) keys after each of its keys (k_far, v_far: null past the block's keys), which its score and
// P·V loops prefetch into L2.
template <class KVT>
struct StoredTile {
  static constexpr bool kI4 = RowSource<KVT>::kI4;  // rows are Q4Rows, their block scales inside them
  static constexpr bool kScaled = std::is_same_v<KVT, std::int8_t>;
  static constexpr std::int64_t kFarBytes = std::int64_t{32} << 10;
  using Row = std::conditional_t<kI4, Q4Row, const KVT*>;
  std::int64_t cols = 0;
  Row k[BC];
  Row v[BC];
  const float* ks_at[BC];  // i8: where each row's scale is (4-bit rows' block scales: in their Q4Rows)
  const float* vs_at[BC];
  alignas(64) float ks[BC], vs[BC];  // i8: the scales themselves
  FarRow k_far[BC], v_far[BC];
  std::int64_t far_null_from = 0;  // k_far[c] and v_far[c] are null rows for c >= far_null_from

  // How far ahead the score loop prefetches: kFarBytes of K rows, 64 to 512 keys.
  static std::int64_t far_keys(std::int64_t dk) {
    return std::clamp<std::int64_t>(kFarBytes / std::max<std::int64_t>(row_bytes<Row>(dk), 1), BC, 8 * BC);
  }

  // The rows that follow a block's last key as far rows: the first keys of the block its thread runs next
  // (Workspace::next), [lo, hi) of that block's KV head, reached `shift` keys sooner than the prefetch distance
  // would (a block shorter than the distance: shift = distance - its keys, so each of its tiles prefetches the
  // next block's tile at the same place rather than keys past the next block's start). `keys` null: none.
  struct After {
    const RowSource<KVT>* keys = nullptr;
    const RowSource<KVT>* values = nullptr;
    std::int64_t lo = 0, hi = 0, shift = 0;
  };
  // Rows j0 .. j0+n-1, and as the far rows those from j_far up to j_end (none when j_far >= j_end; located
  // without their scales: only their bytes are prefetched), continued past j_end into `after`'s keys. The far rows
  // past those are null; only the ones a previous tile set are nulled again (a split of the keys shorter than the
  // prefetch distance has none).
  void locate(const RowSource<KVT>& keys, const RowSource<KVT>& values, std::int64_t j0, std::int64_t n,
              std::int64_t j_far, std::int64_t j_end, const After& after = {}) {
    cols = n;
    locate_rows(keys, values, j0, n, k, v, ks_at, vs_at);
    std::int64_t n_far = std::clamp<std::int64_t>(j_end - j_far, 0, n);
    if (n_far > 0) keys.locate_far(j_far, n_far, k_far), values.locate_far(j_far, n_far, v_far);
    if (after.keys && n_far < n) {  // column n_far is key j_far + n_far >= j_end: the next block's key lo + that - j_end
      const std::int64_t j = after.lo + std::max<std::int64_t>(j_far + n_far - j_end - after.shift, 0);
      const std::int64_t m = std::clamp<std::int64_t>(after.hi - j, 0, n - n_far);
      if (m > 0) after.keys->locate_far(j, m, k_far + n_far), after.values->locate_far(j, m, v_far + n_far);
      n_far += m;
    }
    for (std::int64_t c = n_far; c < far_null_from; ++c) k_far[c] = v_far[c] = nullptr;
    far_null_from = n_far;
  }
  // The scales of a run of m rows (the first at s0, then every s_step floats) prefetched into L1: every line of the
  // run's span where rows share lines (s_step below a line: contiguous rows, 4 rows' block scales a line for 4-bit
  // d128, 16 rows' for 8-bit), else each row's first. (A prefetch per row and array, 3 in 4 or 15 in 16 of them to
  // a line already asked for, and the pointer loads they need, were a third of locating a 4-bit MHA decode's tiles.)
  // Always inlined, as prefetch_rows is (else GCC may delete its calls), and called only where the caller has effects
  // of its own (the row walks of locate_rows): a walk that only prefetched was deleted whole, its prefetches with it.
  ATTN_INLINE static void prefetch_scales(const float* s0, std::int64_t m, std::int64_t s_step) {
    if (m <= 0) return;
    if (s_step > 0 && s_step < 16) {
      const auto first = reinterpret_cast<std::uintptr_t>(s0);
      const std::uintptr_t last = first + static_cast<std::uintptr_t>(m * s_step) * sizeof(float) - 1;
      for (std::uintptr_t line = first & ~std::uintptr_t{63}; line <= last; line += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
    } else {
      for (std::int64_t e = 0; e < m; ++e) __builtin_prefetch(s0 + e * s_step, 0, 3);
    }
  }
  struct PrefetchScales {  // (RowSource::locate's per-run hook)
    ATTN_INLINE void operator()(const float* s0, std::int64_t m, std::int64_t s_step) const {
      prefetch_scales(s0, m, s_step);
    }
  };
  // Once per block, before its first tile: every far row null.
  void start() {
    for (std::int64_t c = 0; c < BC; ++c) k_far[c] = v_far[c] = nullptr;
    far_null_from = 0;
  }
  static void locate_rows(const RowSource<KVT>& keys, const RowSource<KVT>& values, std::int64_t j0, std::int64_t n,
                          Row* kr, Row* vr, [[maybe_unused]] const float** kscales,
                          [[maybe_unused]] const float** vscales) {
    if constexpr (kI4) {  // each Q4Row (bytes, scales) written as the runs are walked, two rows a 32-byte store
      const auto fill = [n](const RowSource<KVT>& src, std::int64_t j, Row* rows) {
        src.runs(j, n, true,
                 [&](std::int64_t c, std::int64_t m, const KVT* r0, std::int64_t step, const float* s0,
                     std::int64_t s_step) {
                   // stepped by one add (GCC vectorised the addresses 8 rows at a time, then extracted each to store
                   // it alone); through a local `out` (stores through rows + c + e, which might alias the captured
                   // pointer for the compiler, made it reload that per row)
                   Row* const out = rows + c;
                   static_assert(sizeof(Q4Row) == 16 && offsetof(Q4Row, scales) == 8, "two 64-bit fields");
                   const std::int64_t s_bytes = s_step * std::int64_t{sizeof(float)};
                   const auto b0 = reinterpret_cast<std::intptr_t>(r0), f0 = reinterpret_cast<std::intptr_t>(s0);
                   std::int64_t e = 0;
#if defined(ATTN_VEC_AVX512) || defined(ATTN_VEC_AVX2)
                   __m256i two = _mm256_set_epi64x(f0 + s_bytes, b0 + step, f0, b0);
                   const __m256i by2 = _mm256_set_epi64x(2 * s_bytes, 2 * step, 2 * s_bytes, 2 * step);
                   for (; e + 2 <= m; e += 2, two = _mm256_add_epi64(two, by2))
                     _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + e), two);
#endif
                   __m128i one = _mm_set_epi64x(f0 + e * s_bytes, b0 + e * step);
                   const __m128i by = _mm_set_epi64x(s_bytes, step);
                   for (; e < m; ++e, one = _mm_add_epi64(one, by))
                     _mm_storeu_si128(reinterpret_cast<__m128i*>(out + e), one);
                   prefetch_scales(s0, m, s_step);
                 });
      };
      fill(keys, j0, kr), fill(values, j0, vr);
    } else {  // i8 rows' scales prefetched as their runs are located (a walk of its own that only prefetched was
              // judged free of effects and deleted by GCC: the scales were never prefetched, and waiting for them
              // in prepare() was a fifth of a paged 8-bit decode, Zen 4)
      keys.locate(j0, n, kr, kScaled ? kscales : nullptr, PrefetchScales{});
      values.locate(j0, n, vr, kScaled ? vscales : nullptr, PrefetchScales{});
    }
  }
  // Ready to be used: i8 rows' scales loaded.
  void prepare() {
    if constexpr (kScaled)
      for (std::int64_t c = 0; c < cols; ++c) ks[c] = *ks_at[c], vs[c] = *vs_at[c];
  }
  const float* kscale() const { return kScaled ? ks : nullptr; }
  const float* vscale() const { return kScaled ? vs : nullptr; }
};

// The keys of a block over [kv_lo, kv_hi): those some lane may see (the union of the lanes' ranges, `visible`), and
// those every lane sees (the intersection, `shared`: tiles inside it need no per-lane key range). Tiles lie on the
// grid of BC from visible_lo; where the variant asks (core/variant.h: from_far_side, ALiBi) they are walked from
// the last back, so a lane's largest scores, near its diagonal, come first and the far tiles' large negative
// scores lie far below the running max (no wide path; see kFarBelow).
struct BlockKeys {
  std::int64_t visible_lo, visible_hi, shared_lo = 0, shared_hi, tiles;
  bool backwards;
  BlockKeys(const core::Problem& p, const Lanes& lanes, std::int64_t kv_lo, std::int64_t kv_hi, bool from_far_side)
      : visible_lo(kv_hi), visible_hi(kv_lo), shared_hi(p.Skv), backwards(from_far_side) {
    for (std::int64_t r = 0; r < lanes.n; ++r) {
      const core::KeyRange range = core::key_range(p, lanes.b, lanes.i[r]);
      if (range.lo < range.hi) visible_lo = std::min(visible_lo, range.lo), visible_hi = std::max(visible_hi, range.hi);
      shared_lo = std::max(shared_lo, range.lo), shared_hi = std::min(shared_hi, range.hi);
    }
    visible_lo = std::max(visible_lo, kv_lo), visible_hi = std::min(visible_hi, kv_hi);
    tiles = visible_hi > visible_lo ? (visible_hi - visible_lo + BC - 1) / BC : 0;
  }
  std::int64_t j0(std::int64_t t) const { return visible_lo + (backwards ? tiles - 1 - t : t) * BC; }
  std::int64_t cols(std::int64_t t) const { return std::min(BC, visible_hi - j0(t)); }
  bool interior(std::int64_t t) const { return j0(t) >= shared_lo && j0(t) + cols(t) <= shared_hi; }
};

// W values of a row of q as fp32 (the conversion core::to_float makes).
template <class QT>
ATTN_INLINE V load_row_w(const QT* x) {
  if constexpr (std::is_same_v<QT, float>) return Vec::load(x);
  else if constexpr (std::is_same_v<QT, core::bf16>) return Vec::load_bf16(reinterpret_cast<const std::uint16_t*>(x));
  else return Vec::load_f16(reinterpret_cast<const std::uint16_t*>(x));
}

// Qᵀ [Dk][BR] of a lane-major block from the lanes' unit-stride rows, W lanes x W dims at a time through a register
// transpose (the scalar transpose, a store per value, and store_lanes' strided reads were 16 % of a batch of
// 128-token causal prefills, B 32, fp32, Zen 4; transposed, the batch takes 0.93 of the time: the rest is Q and O
// themselves coming from and going to memory); lanes past n are 0.
template <class QT>
void start_lanes_transposed(const core::Problem& p, const Lanes& lanes, Workspace& ws) {
  const std::int64_t dk = p.Dk, dw = dk / W * W, n = lanes.n;
  const QT* row[BR];
  for (std::int64_t r = 0; r < n; ++r)
    row[r] = static_cast<const QT*>(p.q.data) + p.q.offset(lanes.b, lanes.h[r], lanes.i[r], 0);
  float* qt = ws.q.data();
  for (std::int64_t r0 = 0; r0 < BR; r0 += W) {
    if (r0 >= n) {
      for (std::int64_t d = 0; d < dk; ++d) Vec::store(qt + d * BR + r0, Vec::zero());
      continue;
    }
    for (std::int64_t d0 = 0; d0 < dw; d0 += W) {
      V x[W];
      for (int i = 0; i < W; ++i) x[i] = r0 + i < n ? load_row_w(row[r0 + i] + d0) : Vec::zero();
      Vec::transpose(x);
      for (int i = 0; i < W; ++i) Vec::store(qt + (d0 + i) * BR + r0, x[i]);
    }
    for (std::int64_t d = dw; d < dk; ++d)
      for (std::int64_t i = 0; i < W; ++i) qt[d * BR + r0 + i] = r0 + i < n ? core::to_float(row[r0 + i][d]) : 0.0f;
  }
}

// Q of every lane (lanes past n stay 0 and are never stored) as Qᵀ [Dk][BR] (NL = 0) or rows [BR][Dk]; the
// accumulator and every lane's state empty.
template <int NL, class QT>
void start_block(const core::Problem& p, const Lanes& lanes, Workspace& ws) {
  // (row-major blocks read NL rows of q and o: clearing only those saved a 64 KiB fill per block of a decode step)
  const std::size_t o_used = NL ? static_cast<std::size_t>(NL * p.Dv) : ws.o.size();
  if (NL == 0 && p.q.stride[3] == 1) {
    start_lanes_transposed<QT>(p, lanes, ws);
  } else {
    const std::size_t q_used = NL ? static_cast<std::size_t>(NL * p.Dk) : ws.q.size();
    std::fill(ws.q.begin(), ws.q.begin() + q_used, 0.0f);
    for (std::int64_t r = 0; r < lanes.n; ++r) {
      const QT* q = static_cast<const QT*>(p.q.data) + p.q.offset(lanes.b, lanes.h[r], lanes.i[r], 0);
      for (std::int64_t d = 0; d < p.Dk; ++d) ws.q[NL ? r * p.Dk + d : d * BR + r] = core::to_float(q[d * p.q.stride[3]]);
    }
  }
  std::fill(ws.o.begin(), ws.o.begin() + o_used, 0.0f);
  std::fill(ws.m.begin(), ws.m.end(), core::kNegInf);
  std::fill(ws.l.begin(), ws.l.end(), 0.0f);
}

// The next tile's K and V rows of a lane-major (prefill) block, prefetched into L2 while this tile computes (the
// score loop's first chunk the K rows of its keys, each P·V step the V rows' slice of its value dims), where they
// will be read from their storage (fp32 rows in place, or rows the thread's head cache has not widened yet) and
// likely come from memory (flash_block: a KV head's first block on a thread, or rows past kPrefetchTilesBytes).
// Without it the first block of each KV head waited on its rows: X1's shape (32 heads of 128 queries over 1,024
// keys, d64, fp32), one thread of a Zen 4 VM, 77 GFLOP/s against 96.5 with the heads sharing one KV head's rows;
// with it 90.7-91.1, and X1 at 2 threads 71-72 % of the FMA peak where it was 54-59 %. Null lists: nothing to
// prefetch (4-bit rows are widened into the head cache first).
inline constexpr std::int64_t kPrefetchTilesBytes = std::int64_t{512} << 10;
template <class KVT>
struct NextRows {
  FarRow k[BC], v[BC];
  std::int64_t k_bytes = 0, value_bytes = 0;
  bool any = false;
  NextRows(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, const Workspace& ws,
           bool from_memory) {
    if (!from_memory || cols <= 0 || RowSource<KVT>::kI4) return;
    if (!ws.have.empty() && ws.head == lanes.b * p.Hkv + lanes.hk && ws.have[static_cast<std::size_t>(j0)]) return;
    std::fill(k, k + BC, nullptr), std::fill(v, v + BC, nullptr);
    key_rows<KVT>(p, lanes.b, lanes.hk).locate_far(j0, cols, k);  // (decode's far rows' walk)
    value_rows<KVT>(p, lanes.b, lanes.hk).locate_far(j0, cols, v);
    k_bytes = row_bytes<const KVT*>(p.Dk);
    value_bytes = static_cast<std::int64_t>(sizeof(KVT));
    any = true;
  }
};

// One tile of a lane-major (prefill) block: both products are the micro-kernel over fp32 rows.
template <int QV, class KVT, class Variant>
void lanes_step(const core::Problem& p, const Lanes& lanes, std::int64_t j0, std::int64_t cols, bool interior,
                const Units& u, Workspace& ws, std::int64_t next_j0 = 0, std::int64_t next_cols = 0,
                bool from_memory = false) {
  const NextRows<KVT> next(p, lanes, next_j0, next_cols, ws, from_memory);
  kv_tile<KVT>(p, lanes, j0, cols, ws);                                                         // K, V tiles
  scores<QV>(ws.q.data(), ws.krows, p.Dk, cols, u.dot, ws.st.data(), next.any ? next.k : nullptr, next.k_bytes);
  const bool hidden = finish_scores<QV, Variant>(p, lanes, j0, cols, interior, ws.st.data());  // units, masks
  softmax_tile<QV, Variant>(p, lanes, j0, cols, false, ws.krows, nullptr, u, ws);             // Pᵀ; m, l
  drop_weights<Variant>(p, lanes, j0, cols, ws.st.data());                                     // dropout
  if (hidden && !rows_finite(ws.vrows, cols, p.Dv))
    pv_attended<Variant>(p, lanes, j0, cols, ws.st.data(), ws.vrows, ws.alpha.data(), ws.o.data(), BR, 1);
  else
    accumulate_pv<QV>(ws.st.data(), ws.vrows, p.Dv, cols, ws.alpha.data(), ws.o.data(),         // Oᵀ = α·Oᵀ + Vᵀ Pᵀ
                      next.any ? next.v : nullptr, next.value_bytes);
}

// One block of lanes over keys [kv_lo, kv_hi) only (all keys, or one split of them): leaves the
// unnormalised state of every lane in ws (m, l, and O: Oᵀ [Dv][BR] when NL = 0, else rows [BR][Dv]).
// NL = 0: lanes across vectors (QV vectors of lanes). NL > 0: row-major for at most NL lanes, K and V rows read as
// stored and widened in registers (unit-stride rows, 4-bit ones with their block scales adjacent), or widened into
// the workspace first (strided rows).
template <int QV, int NL, class QT, class KVT, class Variant>
void flash_block(const core::Problem& p, const Lanes& lanes, std::int64_t kv_lo, std::int64_t kv_hi, Workspace& ws) {
  const BlockKeys keys(p, lanes, kv_lo, kv_hi, Variant::from_far_side(p));
  start_block<NL, QT>(p, lanes, ws);
  const Units u = units<Variant>(p);
  const RowSource<KVT> krows = key_rows<KVT>(p, lanes.b, lanes.hk), vrows = value_rows<KVT>(p, lanes.b, lanes.hk);
  if constexpr (NL == 0) {
    // The next tile's rows are prefetched where they likely come from memory: in the first block of a KV head on this
    // thread, or when the block's rows are more than L2 holds beside its other data (kPrefetchTilesBytes).
    const std::int64_t head = lanes.b * p.Hkv + lanes.hk;
    const std::int64_t row_bytes_kv = row_bytes<const KVT*>(p.Dk) + row_bytes<const KVT*>(p.Dv);
    const bool from_memory = ws.read_head != head || (keys.visible_hi - keys.visible_lo) * row_bytes_kv > kPrefetchTilesBytes;
    ws.read_head = head;
    for (std::int64_t t = 0; t < keys.tiles; ++t)
      lanes_step<QV, KVT, Variant>(p, lanes, keys.j0(t), keys.cols(t), keys.interior(t), u, ws,
                                   t + 1 < keys.tiles ? keys.j0(t + 1) : 0, t + 1 < keys.tiles ? keys.cols(t + 1) : 0,
                                   from_memory);
  } else if (krows.unit_stride() && vrows.unit_stride() && krows.scales_adjacent() && vrows.scales_adjacent()) {
    // bf16 Q, K and V on a level with pair products, where the dispatcher prefers them (cpu::bf16_dot_preferred)
    // (and bf16 Q over i8 K/V: the rows widened to bf16 exactly, their scales applied as the vector form does)
    constexpr bool kI4 = RowSource<KVT>::kI4;
    constexpr bool kPairs = kBf16Dot && std::is_same_v<QT, core::bf16> &&
                            (std::is_same_v<KVT, core::bf16> || std::is_same_v<KVT, std::int8_t> || kI4);
    const bool pairs = kPairs && rows_on_pairs(p);
    if constexpr (kI4 && kQ4Split<Q4Row>)
      if (!pairs) q4_split_rows(ws.q.data(), NL, p.Dk, ws.k.data());  // q's rows as kQ4Split's scores read them
#if ATTN_VEC_BF16_DOT
    if (pairs && kI4)
      start_pairs_q4<kQ4Lookups<NL>>(ws.q.data(), NL, p.Dk, reinterpret_cast<std::uint16_t*>(ws.k.data()));
    else if (pairs)
      start_pairs(ws.q.data(), NL * p.Dk, reinterpret_cast<std::uint16_t*>(ws.k.data()),
                  reinterpret_cast<core::bf16*>(ws.v.data()), p.Dv);
#endif
    StoredTile<KVT> tile[2];  // this tile's rows and the next one's
    tile[0].start(), tile[1].start();
    // far rows: forward walks only, up to the block's last key and on into the first keys of the block this thread
    // runs next (tiles walked backwards prefetch nothing). Without the next block's, a batch of short sequences
    // waited on each block's first rows: B 64 x 256 keys from 16-key bf16 pages read 4 KiB pages at 47 % of their
    // scattered speed, 4,096 keys at 85 % (Zen 4, 2 threads).
    const std::int64_t far = StoredTile<KVT>::far_keys(p.Dk), far_end = keys.backwards ? 0 : keys.visible_hi;
    const bool go_on = !keys.backwards && ws.next.b >= 0;
    const RowSource<KVT> next_k = go_on ? key_rows<KVT>(p, ws.next.b, ws.next.hk) : krows;
    const RowSource<KVT> next_v = go_on ? value_rows<KVT>(p, ws.next.b, ws.next.hk) : vrows;
    const std::int64_t shift = std::max<std::int64_t>(far - (keys.visible_hi - keys.visible_lo), 0);
    const typename StoredTile<KVT>::After after =
        go_on ? typename StoredTile<KVT>::After{&next_k, &next_v, ws.next.lo, ws.next.hi, shift}
              : typename StoredTile<KVT>::After{};
    const auto locate = [&](StoredTile<KVT>& tl, std::int64_t t) {
      tl.locate(krows, vrows, keys.j0(t), keys.cols(t), keys.j0(t) + far, far_end, after);
    };
    if (keys.tiles > 0) locate(tile[0], 0);
    for (std::int64_t t = 0; t < keys.tiles; ++t) {
      StoredTile<KVT>& cur = tile[t & 1];
      if (t + 1 < keys.tiles) locate(tile[(t + 1) & 1], t + 1);
      cur.prepare();
      if (pairs)
        rows_step<QV, NL, Variant, kPairs>(p, lanes, cur.k, cur.v, cur.kscale(), cur.vscale(), keys.j0(t),
                                           keys.cols(t), keys.interior(t), u, ws, cur.k_far, cur.v_far);
      else
        rows_step<QV, NL, Variant>(p, lanes, cur.k, cur.v, cur.kscale(), cur.vscale(), keys.j0(t), keys.cols(t),
                                   keys.interior(t), u, ws, cur.k_far, cur.v_far);
    }
  } else {
    for (std::int64_t t = 0; t < keys.tiles; ++t) {
      krows.as_float(keys.j0(t), keys.cols(t), p.Dk, ws.k.data(), ws.krows);
      vrows.as_float(keys.j0(t), keys.cols(t), p.Dv, ws.v.data(), ws.vrows);
      rows_step<QV, NL, Variant>(p, lanes, ws.krows, ws.vrows, nullptr, nullptr, keys.j0(t), keys.cols(t),
                                 keys.interior(t), u, ws);
    }
  }
}

// K and V whose rows lie far apart (FlashAttention's and transformers' [B, S, H, D] memory viewed as [B, H, S, D]:
// consecutive rows H·D elements apart, a new page every row or two at long sequences) cost every query block that
// reads them a TLB miss per row; measured 18-26 % slower than the same values stored [B, H, S, D] (P1-like and
// 512-token shapes, 2 threads). When several query blocks will read each key (prefill), the rows are first
// gathered into contiguous [B, Hkv, Skv, D] copies, one pass, and the call runs on those (then 7-13 % slower than
// contiguous inputs, the pass included). Values are moved, not changed: the result is the same bits. Not for paged
// K/V (pages are contiguous already), 8-bit rows (read in place) or decode (each key read once), nor when the copy
// would pass kGatherBudget bytes or cannot be allocated (the call then reads the rows where they are).
inline constexpr std::int64_t kGatherBudget = std::int64_t{1} << 30;

inline bool scattered_rows(const core::Strided& t, std::int64_t dim) {
  return t.stride[3] != 1 || (t.stride[2] != 0 && (t.stride[2] >= 2 * dim || t.stride[2] <= -2 * dim));
}

// The rows of each thread's head cache (Workspace::kh, kv_tile): Skv for lane-major (prefill) blocks over bf16, f16
// or i8 K/V when several blocks read each KV head and one head's rows fit kHeadCacheBytes as fp32; else 0 (tiles
// widened per block). fp32 rows are read in place.
inline constexpr std::int64_t kHeadCacheBytes = std::int64_t{16} << 20;

// How the work of one call is cut (blocks of lanes, one KV head each, and key splits per block) and what it
// allocates: Plan::bytes() is the one formula of a call's scratch (Scratch holds exactly that).
struct Plan {
  std::int64_t heads_per_block = 1;  // > 1 when Sq is short: several heads of a GQA group share a block
  std::int64_t rows_per_block = BR;
  std::int64_t row_blocks = 1, head_blocks = 1, items = 0;
  std::int64_t splits = 1, split_len = 0;  // split-KV: keys [s·split_len, (s+1)·split_len)
  Workspace::Shape shape;                  // each thread's workspace (with its head cache's rows)
  std::int64_t gather_bytes = 0;           // K and V gathered into contiguous rows first (gather_kv), else 0

  explicit Plan(const core::Problem& p) {
    if (p.Sq >= BR || p.group == 1 || p.Sq == 0) {
      rows_per_block = std::min<std::int64_t>(BR, std::max<std::int64_t>(p.Sq, 1));
    } else {
      rows_per_block = p.Sq;
      heads_per_block = std::min(p.group, BR / p.Sq);
    }
    row_blocks = (p.Sq + rows_per_block - 1) / rows_per_block;
    head_blocks = (p.group + heads_per_block - 1) / heads_per_block;
    items = p.B * p.Hkv * head_blocks * row_blocks;
    // Too few blocks to keep many cores busy (decode, short Sq, long keys): split the keys (cpu/schedule.h).
    constexpr std::int64_t kTargetItems = 32, kMinSplitKeys = 512;
    if (items > 0) {
      const Cut cut = cut_length(items, p.Skv, kTargetItems, kMinSplitKeys, BC);
      splits = cut.pieces, split_len = cut.piece_len;
    }
    if (splits <= 1) splits = 1, split_len = p.Skv;
    const bool several_blocks = row_blocks * head_blocks >= 2;  // per KV head
    const bool cache = p.k.dtype != DType::f32 && !row_major() && several_blocks &&
                       p.Skv * (p.Dk + p.Dv) * static_cast<std::int64_t>(sizeof(float)) <= kHeadCacheBytes;
    shape = {p.Dk, p.Dv, cache ? p.Skv : 0};
    if (!p.paged && !p.k_scale && several_blocks && (scattered_rows(p.k, p.Dk) || scattered_rows(p.v, p.Dv))) {
      const std::int64_t bytes = p.B * p.Hkv * p.Skv * (p.Dk + p.Dv) * static_cast<std::int64_t>(dtype_size(p.k.dtype));
      if (bytes > 0 && bytes <= kGatherBudget) gather_bytes = bytes;
    }
  }

  std::int64_t tasks() const { return items * splits; }
  // Whether the blocks run row-major (run_block's NL > 0 forms, decode): at most 8 lanes per block.
  bool row_major() const { return rows_per_block * heads_per_block <= 8; }
  // Split-KV's partial results: (m, l, o[Dv]) per (item, split, lane).
  std::int64_t partial_stride(const core::Problem& p) const { return p.Dv + 2; }
  std::int64_t partial_floats(const core::Problem& p) const {
    return splits > 1 ? items * splits * BR * partial_stride(p) : 0;
  }
  // The bytes a call allocates at `threads` threads: the team's workspaces, split-KV's partials, the gathered rows.
  std::int64_t bytes(const core::Problem& p, int threads) const {
    return team_size(threads, tasks()) * Workspace::bytes(shape) +
           static_cast<std::int64_t>(sizeof(float)) * partial_floats(p) + gather_bytes;
  }

  Lanes lanes(const core::Problem& p, std::int64_t item) const {
    Lanes ln;
    const std::int64_t rb = item % row_blocks, hb = (item / row_blocks) % head_blocks;
    ln.hk = (item / (row_blocks * head_blocks)) % p.Hkv;
    ln.b = item / (row_blocks * head_blocks * p.Hkv);
    const std::int64_t h0 = ln.hk * p.group + hb * heads_per_block;
    const std::int64_t h1 = std::min(h0 + heads_per_block, (ln.hk + 1) * p.group);
    const std::int64_t i0 = rb * rows_per_block, i1 = std::min(i0 + rows_per_block, p.Sq);
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t i = i0; i < i1; ++i) ln.h[ln.n] = h, ln.i[ln.n] = i, ++ln.n;
    return ln;
  }
};

// Runs a block with the micro-kernel shape that fits its lane count. Returns where lane r's value d of
// the accumulator sits: o[d·d_stride + r·r_stride].
template <class QT, class KVT, class Variant>
std::pair<std::int64_t, std::int64_t> run_block(const core::Problem& p, const Lanes& lanes, std::int64_t kv_lo,
                                                std::int64_t kv_hi, Workspace& ws) {
  constexpr int QV8 = (8 + W - 1) / W;  // vectors holding 8 lanes
  if (lanes.n == 1) return flash_block<1, 1, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{1L, p.Dv};
  if (lanes.n <= 2) return flash_block<1, 2, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{1L, p.Dv};
  if (lanes.n <= 4) return flash_block<1, 4, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{1L, p.Dv};
  if (lanes.n <= 8) return flash_block<QV8, 8, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{1L, p.Dv};
  if (lanes.n <= W) return flash_block<1, 0, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{BR, 1L};
  if (lanes.n <= 2 * W) return flash_block<2, 0, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{BR, 1L};
  return flash_block<4, 0, QT, KVT, Variant>(p, lanes, kv_lo, kv_hi, ws), std::pair{BR, 1L};
}

// o[d·o_stride] = x[d·x_stride] finished (core::finish_output with l and factor) for d < n, in T. l and factor are
// values, not reads of m and l: stores through o could alias those arrays for the compiler, which then reloaded l
// and tested it for every element (a scalar loop: a third of a one-key decode's time, 32 heads of 128).
template <class T>
inline void store_row(T* o, std::int64_t o_stride, const float* x, std::int64_t x_stride, std::int64_t n, float l,
                      float factor) {
  if (o_stride == 1 && x_stride == 1)  // both contiguous (row-major blocks, merged split-KV rows): vectorised
    for (std::int64_t d = 0; d < n; ++d) o[d] = core::from_float<T>(core::finish_output(x[d], l, factor));
  else
    for (std::int64_t d = 0; d < n; ++d)
      o[d * o_stride] = core::from_float<T>(core::finish_output(x[d * x_stride], l, factor));
}

// Writes O = o / l and the LSE of every lane of a finished block (core::finish_*); lane r's value d is
// o[d·d_stride + r·r_stride] (Oᵀ in the workspace, or rows of merged split-KV partials).
// The output is QT, q's dtype, except where a caller inside the library asks for f32 rows of a bf16/f16 problem
// (p.out.dtype = f32: the cascade's partial results, core/cascade.cc), which are merged before they are rounded.
// (Lane-major blocks, Oᵀ [Dv][BR], into unit-stride output rows: W lanes x W dims at a time through a register
// transpose, each row finished as store_row does (the same products), rounded to a bf16/f16 output by
// core::from_float: see start_lanes_transposed.)
template <class QT, class Variant>
void store_lanes(const core::Problem& p, const Lanes& lanes, const float* ot, std::int64_t d_stride,
                 std::int64_t r_stride, const float* m, const float* l) {
  QT* out = static_cast<QT*>(const_cast<void*>(p.out.data));
  float* out_f32 = p.out.dtype == DType::f32 ? static_cast<float*>(const_cast<void*>(p.out.data)) : nullptr;
  const Units u = units<Variant>(p);
  if (d_stride == BR && r_stride == 1 && p.out.stride[3] == 1) {
    const std::int64_t dv = p.Dv, dw = dv / W * W, n = lanes.n;
    for (std::int64_t r0 = 0; r0 < n; r0 += W) {
      const std::int64_t nw = std::min<std::int64_t>(W, n - r0);
      std::int64_t at[W];
      float factor[W], li[W];
      for (std::int64_t i = 0; i < nw; ++i) {
        const std::int64_t r = r0 + i;
        const core::Finish f = core::finish_with_sink(m[r], l[r], u.k, p.sink(lanes.h[r]));
        at[i] = p.out.offset(lanes.b, lanes.h[r], lanes.i[r], 0), factor[i] = f.factor, li[i] = l[r];
        if (p.lse)
          static_cast<float*>(const_cast<void*>(p.lse->data))[p.lse->offset(lanes.b, lanes.h[r], lanes.i[r], 0)] = f.lse;
      }
      for (std::int64_t d0 = 0; d0 < dw; d0 += W) {
        V x[W];
        for (int i = 0; i < W; ++i) x[i] = Vec::load(ot + (d0 + i) * BR + r0);
        Vec::transpose(x);  // x[i]: lane r0 + i's dims d0 .. d0 + W - 1
        for (std::int64_t i = 0; i < nw; ++i) {
          const V y = li[i] == 0.0f ? Vec::zero() : Vec::mul(x[i], Vec::set1(factor[i]));  // core::finish_output
          if (out_f32) {  // (always, for an fp32 problem)
            Vec::store(out_f32 + at[i] + d0, y);
          } else {
            alignas(64) float tmp[W];
            Vec::store(tmp, y);
            for (int e = 0; e < W; ++e) out[at[i] + d0 + e] = core::from_float<QT>(tmp[e]);
          }
        }
      }
      for (std::int64_t i = 0; i < nw; ++i) {
        if (out_f32) store_row(out_f32 + at[i] + dw, 1, ot + dw * BR + r0 + i, BR, dv - dw, li[i], factor[i]);
        else store_row(out + at[i] + dw, 1, ot + dw * BR + r0 + i, BR, dv - dw, li[i], factor[i]);
      }
    }
    return;
  }
  for (std::int64_t r = 0; r < lanes.n; ++r) {
    const core::Finish f = core::finish_with_sink(m[r], l[r], u.k, p.sink(lanes.h[r]));
    const std::int64_t at = p.out.offset(lanes.b, lanes.h[r], lanes.i[r], 0);
    if (out_f32) store_row(out_f32 + at, p.out.stride[3], ot + r * r_stride, d_stride, p.Dv, l[r], f.factor);
    else store_row(out + at, p.out.stride[3], ot + r * r_stride, d_stride, p.Dv, l[r], f.factor);
    if (p.lse)
      static_cast<float*>(const_cast<void*>(p.lse->data))[p.lse->offset(lanes.b, lanes.h[r], lanes.i[r], 0)] = f.lse;
  }
}

// A call's scratch, as Plan::bytes() counts it: the team's workspaces, the split-KV partial results and the
// gathered K/V rows, kept between calls in the caller's attn::Workspace (under kScratchKey, one per instruction
// set) when it gives one. bytes() measures what it holds.
struct Scratch {
  Workspace::Shape shape{-1, -1, -1};
  std::vector<Workspace> team;
  std::vector<float> partial;
  std::vector<unsigned char> kv_rows;  // gathered K and V rows (gather_kv)
  std::int64_t bytes() const {
    std::int64_t n = static_cast<std::int64_t>(partial.capacity() * sizeof(float) + kv_rows.capacity());
    for (const Workspace& w : team) n += held_bytes(w, shape);
    return n;
  }
};
inline constexpr char kScratchKey = 0;

// K and V gathered into contiguous [B, Hkv, Skv, D] rows (see kGatherBudget) in sc.kv_rows, *out the problem over
// them; false when the copy cannot be allocated (the call then reads the rows where they are).
template <class KVT>
bool gather_kv(const core::Problem& p, const Plan& plan, int threads, Scratch& sc, core::Problem* out) {
  try {
    sc.kv_rows.resize(static_cast<std::size_t>(plan.gather_bytes));
  } catch (const std::bad_alloc&) {
    return false;
  }
  KVT* kd = reinterpret_cast<KVT*>(sc.kv_rows.data());
  KVT* vd = kd + p.B * p.Hkv * p.Skv * p.Dk;
  const std::int64_t heads = p.B * p.Hkv;
  run_loops(threads, heads, loop(heads, [&](std::int64_t bh, NoWorkspace&) {
    key_rows<KVT>(p, bh / p.Hkv, bh % p.Hkv).copy_stored(0, p.Skv, kd + bh * p.Skv * p.Dk);
    value_rows<KVT>(p, bh / p.Hkv, bh % p.Hkv).copy_stored(0, p.Skv, vd + bh * p.Skv * p.Dv);
  }, Spread::even));
  *out = p;
  out->k.data = kd, out->v.data = vd;
  const std::int64_t ks[4] = {p.Hkv * p.Skv * p.Dk, p.Skv * p.Dk, p.Dk, 1}, vs[4] = {p.Hkv * p.Skv * p.Dv, p.Skv * p.Dv, p.Dv, 1};
  std::copy(ks, ks + 4, out->k.stride), std::copy(vs, vs + 4, out->v.stride);
  return true;
}

// Split-KV: a block's state over one split of the keys, as (m, l, o[Dv]) per lane, into `dst`; then the partials
// of every split merged with core::merge in split order and stored (merge_and_store).
inline void store_partial(const core::Problem& p, const Lanes& lanes, const Workspace& ws, std::int64_t d_stride,
                          std::int64_t r_stride, std::int64_t stride, float* dst) {
  for (std::int64_t r = 0; r < lanes.n; ++r) {
    dst[r * stride] = ws.m[r];
    dst[r * stride + 1] = ws.l[r];
    for (std::int64_t d = 0; d < p.Dv; ++d) dst[r * stride + 2 + d] = ws.o[d * d_stride + r * r_stride];
  }
}
template <class QT, class Variant>
void merge_and_store(const core::Problem& p, const Plan& plan, const Lanes& lanes, float* base) {
  const std::int64_t stride = plan.partial_stride(p);
  float m[BR], l[BR];
  const Units u = units<Variant>(p);
  for (std::int64_t r = 0; r < lanes.n; ++r) {
    core::RowState acc;
    acc.m = base[r * stride], acc.l = base[r * stride + 1];
    float* o = base + r * stride + 2;
    for (std::int64_t sp = 1; sp < plan.splits; ++sp) {
      const float* part = base + sp * BR * stride + r * stride;
      core::RowState other;
      other.m = part[0], other.l = part[1];
      core::merge(acc, o, other, part + 2, p.Dv, u.c);
    }
    m[r] = acc.m, l[r] = acc.l;
  }
  store_lanes<QT, Variant>(p, lanes, base + 2, 1, stride, m, l);  // merged rows sit in split 0's slots
}

// All blocks of all heads, spread over threads (cpu/schedule.h); with split-KV, the partial states of a block's
// key splits are merged in a fixed order. Nothing depends on the thread count or the schedule, so results are
// bitwise identical on any number of threads.
template <class QT, class KVT, class Variant>
void run_plan(const core::Problem& p, int threads, const Plan& plan, Scratch& sc, std::int64_t k_step = 64) {
  if (!(sc.shape == plan.shape)) sc.team.clear(), sc.shape = plan.shape;
  for (Workspace& w : sc.team) w.head = w.read_head = -1;  // a kept workspace's cached rows are another call's
  const auto make = [&](int) { return Workspace(plan.shape); };
  // Task t: block t / splits over its keys' split t % splits. Row-major (decode) blocks learn the block their thread
  // runs next (loop_ahead), whose first rows their far rows continue into (flash_block); lane-major blocks ignore it.
  const auto keys_of = [&](std::int64_t task) {
    const std::int64_t sp = task % plan.splits;
    return std::pair{sp * plan.split_len, std::min(p.Skv, (sp + 1) * plan.split_len)};
  };
  const auto next_block = [&](std::int64_t task) {
    Workspace::NextBlock nb;
    if (task < 0) return nb;
    const Lanes lanes = plan.lanes(p, task / plan.splits);
    const auto [lo, hi] = keys_of(task);
    const BlockKeys keys(p, lanes, lo, hi, false);
    nb.b = lanes.b, nb.hk = lanes.hk, nb.lo = keys.visible_lo, nb.hi = keys.visible_hi;
    return nb;
  };
  const std::int64_t stride = plan.partial_stride(p), per_item = plan.splits * BR * stride;
  if (plan.splits > 1) sc.partial.resize(static_cast<std::size_t>(plan.partial_floats(p)));  // (each slot read is written first)
  float* partial = sc.partial.data();
  const auto task = [&](std::int64_t t, std::int64_t next, Workspace& ws) {
    const std::int64_t it = t / plan.splits;
    const Lanes lanes = plan.lanes(p, it);
    const auto [lo, hi] = keys_of(t);
    ws.k_step = k_step;
    ws.next = next_block(next);
    const auto [d_stride, r_stride] = run_block<QT, KVT, Variant>(p, lanes, lo, hi, ws);
    if (plan.splits == 1)
      store_lanes<QT, Variant>(p, lanes, ws.o.data(), d_stride, r_stride, ws.m.data(), ws.l.data());
    else
      store_partial(p, lanes, ws, d_stride, r_stride, stride, partial + it * per_item + (t % plan.splits) * BR * stride);
  };
  const auto run = [&](const auto&... then) {
    if (plan.row_major())
      run_team(&sc.team, threads, plan.tasks(), make, loop_ahead(plan.tasks(), task), then...);
    else
      run_team(&sc.team, threads, plan.tasks(), make,
               loop(plan.tasks(), [&](std::int64_t t, Workspace& ws) { task(t, -1, ws); }), then...);
  };
  if (plan.splits == 1) return run();
  run(loop(plan.items, [&](std::int64_t it, Workspace&) {  // then each block's splits, merged
    merge_and_store<QT, Variant>(p, plan, plan.lanes(p, it), partial + it * per_item);
  }, Spread::even));
}

// Decode calls (row-major blocks: a few lanes per KV head) take their K-row prefetch step from the process's tuner
// and, when it asks, report their time to it (cpu/prefetch_tuner.h; the step changes no result bit).
template <class QT, class KVT, class Variant>
void flash_forward(const core::Problem& p, int threads) {
  const Plan plan(p);
  Scratch local;
  Scratch& sc = core::scratch(p.workspace, &kScratchKey, local, plan.bytes(p, threads));
  core::Problem gathered;
  if constexpr (!RowSource<KVT>::kScaled)  // (Plan: quantised rows are never gathered)
    if (plan.gather_bytes > 0 && gather_kv<KVT>(p, plan, threads, sc, &gathered))
      return run_plan<QT, KVT, Variant>(gathered, threads, plan, sc);
  if (!plan.row_major()) return run_plan<QT, KVT, Variant>(p, threads, plan, sc);
  PrefetchTuner& tuner = decode_prefetch_tuner();
  const int kind = decode_prefetch_kind(static_cast<int>(p.k.dtype), p.paged.has_value());
  const std::int64_t bits = RowSource<KVT>::kI4 ? 4 : 8 * static_cast<std::int64_t>(sizeof(KVT));
  const std::int64_t bytes = p.B * p.Hkv * p.Skv * (p.Dk + p.Dv) * bits / 8;
  const PrefetchTuner::Choice choice = tuner.pick(kind, bytes);
  const auto start = std::chrono::steady_clock::now();
  run_plan<QT, KVT, Variant>(p, threads, plan, sc, choice.step);
  if (choice.timed)
    tuner.record(kind, choice.step, bytes,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// The bytes a call allocates at `threads` threads (with no workspace to reuse).
inline std::int64_t flash_workspace_bytes(const core::Problem& p, int threads) { return Plan(p).bytes(p, threads); }

// Which of this level's forms the call runs, as attn::KernelInfo names it: "vector (bf16 pairs)" where its blocks are
// row-major (decode) and multiply bf16 pairs (rows_on_pairs), else "vector" (fp32 FMAs).
inline const char* flash_kernel_name(const core::Problem& p) {
  return Plan(p).row_major() && rows_on_pairs(p) ? "vector (bf16 pairs)" : "vector";
}

// The kernel of this instruction set for the given dtypes and dense-mask kind, or null (cpu/pick.h).
template <class QT, class KVT, class Variant>
struct ForwardKernel {
  static constexpr FlashFn fn = &flash_forward<QT, KVT, Variant>;
};
inline FlashFn pick_flash(DType q, DType kv, core::VariantKind variant) {
  return pick_kernel<FlashFn, ForwardKernel, /*Quantised=*/true>(q, kv, variant);
}

}  // namespace attn::cpu::ATTN_ISA_NS
