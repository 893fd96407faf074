// The bf16 pair-product forward: bf16 Q, K and V, fp32 accumulation, for prefill-sized problems, with its two
// matrix products on one of two units that both multiply bf16 pairs into fp32 sums:
//   AMX tiles (namespace attn::cpu::amx, this file compiled alone), or
//   AVX512-BF16's vdpbf16ps on vector registers (namespace attn::cpu::bf16dot: src/cpu/flash_bf16dot.cc defines
//   ATTN_BF16_DOT and includes this file). Both read the same packed operands; only scores_tiles() and pv_tiles()
//   differ (see "the two products").
//
// Same algorithm as flash_kernel.h (tiles of keys, online softmax, nothing of size Sq x Skv). Rows sit the
// natural way round here (queries as rows), because that is the layout both units consume:
//   S  = Q Kᵀ   A = Q rows [16 x 32 dims], B = K in pair-interleaved ("VNNI") form [16 dim pairs x 16 keys]
//   O += P V    A = P rows [16 x 32 keys] in bf16, B = V pair-interleaved [16 key pairs x 16 dims]
// K and V are packed into those forms once per key tile, and each packed tile serves every query row of a
// work item: all queries of a chunk of every query head of one GQA group.
//
// The softmax between the products runs on AVX-512, row by row: each row's state is core::RowState (the one
// online-softmax state of core/online_softmax.h) in score units (the unscaled dot products without a dense
// mask, c = scale·log2 e; scale·q·k + mask with one, c = log2 e), and weights are p = 2^((s - m)·c). The
// reference max m is raised lazily (RowState::advance_lazy): only when a tile holds a score above m by more
// than 8 in log2 units, so p <= 2^8 always and the fp32 accumulator O (kept in memory between tiles) is rescaled
// only when m moves, not on every tile. P is rounded to bf16 for the second product, as every bf16 flash kernel
// does; l sums the unrounded fp32 weights.
//
// Chosen by select_flash() (cpu/dispatch.cc) for bf16 problems with enough query rows per KV head: the AMX
// build when the CPU has AMX-BF16 and Linux has granted tile data to the process (cpu::request_amx()), the
// dot-product build at the avx512bf16 level.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "core/workspace_impl.h"
#include "cpu/aligned.h"
#include "cpu/amx_tiles.h"
#include "cpu/kernels.h"
#include "cpu/pick.h"
#include "cpu/schedule.h"

#pragma GCC push_options
#if defined(ATTN_BF16_DOT)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
#endif

// ATTN_AMX_EMULATE (the test target test_amx_emulated only): the tile instructions in software, in a namespace of
// their own, so that the kernel's logic runs on machines without AMX.
#if defined(ATTN_BF16_DOT)
#define ATTN_AMX_NS bf16dot
#elif defined(ATTN_AMX_EMULATE)
#include "cpu/amx_emulate.h"
#define ATTN_AMX_NS amx_emulated
#else
#define ATTN_AMX_NS amx
#endif

namespace attn::cpu::ATTN_AMX_NS {
namespace {

// The row sources every kernel reads K and V through (cpu/row_source.h, over cpu/vec.h's AVX-512 flavour).
#define ATTN_VEC_AVX512
#include "cpu/vec.h"
#include "cpu/row_source.h"

#if defined(ATTN_AMX_EMULATE) || defined(ATTN_BF16_DOT)
inline void tile_config() {}
inline void tile_release() {}
#else
inline void tile_config() { load_tile_config_16x64(); }
inline void tile_release() { _tile_release(); }
#endif

constexpr std::int64_t RB = 32;   // query rows per row block: two 16-row tiles
constexpr std::int64_t BC = 256;  // keys per tile

// ---- the tile registers ------------------------------------------------------------------------------

// tmm0-3: accumulators (2 x 2 tiles of 16 x 16 fp32); tmm4, tmm5: A (16 rows x 32 bf16); tmm6, tmm7: B
// (16 pair-rows x 16 columns x 2 bf16). Every tile is 16 rows of 64 bytes (cpu/amx_tiles.h).

// The tile intrinsics are asm statements that do not tell the compiler which memory they read or write;
// this barrier keeps ordinary loads and stores of the same buffers on the right side of them.
inline void memory_fence() { __asm__ volatile("" ::: "memory"); }

// ---- packing (K and V into the B-operand forms, Q into rows) -----------------------------------------

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// 16 x 16 transpose of 32-bit words: out[c] (row c of the result) = column c of rows r[0..15].
inline void transpose16(const __m512i* r, __m512i* out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // a 4 x 4 transpose of 128-bit lanes
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                  v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    out[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    out[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// Pointers to rows j0 .. j0+BC-1 of K or V (bf16 bits), each with dim_pad readable values (the row source's
// as_stored: the caller's rows when they have unit stride and dim = dim_pad, else copies in `stage` [BC][dim_pad]
// zero-padded); rows past `cols` point at `zero` (dim_pad zeros).
void tile_rows(const RowSource<std::uint16_t>& src, std::int64_t j0, std::int64_t cols, std::int64_t dim_pad,
               std::uint16_t* stage, const std::uint16_t* zero, const std::uint16_t** rows) {
  src.as_stored(j0, cols, dim_pad, stage, rows);
  std::fill(rows + cols, rows + BC, zero);
}

// K rows (dkp values each) -> kp[dkp/2][BC] 32-bit words: word (pair q, key j) holds K[j][2q], K[j][2q+1].
void pack_k(const std::uint16_t* const* rows, std::int64_t dkp, std::uint16_t* kp) {
  auto* dst = reinterpret_cast<std::uint32_t*>(kp);
  __m512i r[16], out[16];
  for (std::int64_t j = 0; j < BC; j += 16)
    for (std::int64_t q = 0; q < dkp / 2; q += 16) {
      for (int t = 0; t < 16; ++t) r[t] = _mm512_loadu_si512(rows[j + t] + 2 * q);
      transpose16(r, out);
      for (int t = 0; t < 16; ++t) _mm512_storeu_si512(dst + (q + t) * BC + j, out[t]);
    }
}

// V rows (dvp values each) -> vp[BC/2][dvp][2]: row q interleaves V[2q][d] and V[2q+1][d] for every d.
void pack_v(const std::uint16_t* const* rows, std::int64_t dvp, std::uint16_t* vp) {
  const __m512i lo_idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i hi_idx = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (std::int64_t q = 0; q < BC / 2; ++q)
    for (std::int64_t d = 0; d < dvp; d += 32) {
      const __m512i a = _mm512_loadu_si512(rows[2 * q] + d), b = _mm512_loadu_si512(rows[2 * q + 1] + d);
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      _mm512_storeu_si512(vp + q * 2 * dvp + 2 * d, _mm512_permutex2var_epi64(lo, lo_idx, hi));
      _mm512_storeu_si512(vp + q * 2 * dvp + 2 * d + 32, _mm512_permutex2var_epi64(lo, hi_idx, hi));
    }
}

// ---- the softmax between the products ----------------------------------------------------------------

// 2^x for x <= 8 (and -inf): x = n + f with |f| <= 1/2, 2^f from a polynomial fitted for relative error,
// and 2^n applied by vscalefps. Below 2^-126 the result flushes to 0 (the kernel runs with FTZ/DAZ).
// Degree 5: 2.3e-7 (fp32-level), used when the call asks for the LSE, whose sum l must be fp32-exact.
// Degree 3: 7.5e-5, 16x below the bf16 rounding P gets for the product, so the output cannot tell; two
// FMAs fewer per 16 weights.
// A NaN lane stays NaN (max(lo, x) returns x when x is NaN).
template <int Degree>
inline __m512 exp2_fast(__m512 x) {
  static_assert(Degree == 3 || Degree == 5);
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-160.0f), x);
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(xc, n);
  __m512 p;
  if constexpr (Degree == 5) {
    p = _mm512_set1_ps(1.3276472454890609e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.675541892647743e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550713092088699e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022120237350464e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931469440460205e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192092896f));
  } else {
    p = _mm512_set1_ps(5.51716685295105e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.426111400127411e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.932609677314758e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999280571937561e-1f));
  }
  return _mm512_scalef_ps(p, n);
}

constexpr float kLazy = 8.0f;  // the reference max moves only for a score above m + 8 (log2 units)

// Per-thread scratch. Rows of a work item: Q (bf16, padded to whole row blocks and 32 dims), the fp32
// output accumulator and the online-softmax state of each row.
struct Workspace {
  struct Shape {
    std::int64_t dk = 0, dv = 0, max_rows = 0;
    bool operator==(const Shape&) const = default;
    std::int64_t dkp() const { return round_up(dk, 32); }
    std::int64_t dvp() const { return round_up(dv, 32); }
  };
  std::int64_t dkp, dvp;
  AlignedVector<std::uint16_t> q, kr, kp, vr, vp, pb, zero;  // kr, vr: staging for strided or padded K/V rows
  const std::uint16_t* rows[BC];
  FarRow next_k[BC], next_v[BC];  // the next tile's K and V rows (prefetched while a tile computes)
  AlignedVector<float> o, s;
  std::vector<core::RowState> state;
  std::vector<std::int64_t> head, row;
  std::vector<core::KeyRange> range;
  struct Block {
    std::int64_t lo, hi, all_lo, all_hi;
  };
  std::vector<Block> blk;  // per row block of an item: the union and intersection of its rows' key ranges

  // The buffers and their lengths (cpu/aligned.h: the one formula, allocated by the constructor, counted by
  // bytes() before a call and by held() after it).
  template <class F>
  static void layout(const Shape& s, F f) {
    f(&Workspace::q, s.max_rows * s.dkp());
    f(&Workspace::kr, BC * s.dkp());
    f(&Workspace::kp, BC * s.dkp());
    f(&Workspace::vr, BC * s.dvp());
    f(&Workspace::vp, BC * s.dvp());
    f(&Workspace::pb, RB * BC);
    f(&Workspace::zero, std::max(s.dkp(), s.dvp()));
    f(&Workspace::o, s.max_rows * s.dvp());
    f(&Workspace::s, RB * BC);
    f(&Workspace::state, s.max_rows);
    f(&Workspace::head, s.max_rows);
    f(&Workspace::row, s.max_rows);
    f(&Workspace::range, s.max_rows);
    f(&Workspace::blk, s.max_rows / RB + 1);
  }
  explicit Workspace(const Shape& s) : dkp(s.dkp()), dvp(s.dvp()) { allocate_layout(*this, s); }
  static std::int64_t bytes(const Shape& s) { return layout_bytes<Workspace>(s); }
};

// A row of a variant with per-element scores (core/variant.h): s = logit(j, scale·s) (with a dense mask,
// scale·s + mask), and -inf for keys the row may not see; the weights then use c = log2 e. Returns whether some
// key of [k0, k1) is hidden from the row.
template <class Variant>
bool finish_row(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, core::KeyRange range,
                std::int64_t j0, std::int64_t k0, std::int64_t k1, float* s) {
  const auto vrow = Variant::row(p, b, h, i);
  const float scale = static_cast<float>(p.scale);
  bool hidden = false;
  for (std::int64_t c = k0; c < k1; ++c) {
    const std::int64_t j = j0 + c;
    const bool out = j < range.lo || j >= range.hi || vrow.hidden(j);
    hidden |= out;
    s[c] = out ? core::kNegInf : vrow.logit(j, s[c] * scale);
  }
  return hidden;
}

// Without a dense mask the dot products stay unscaled (the scale is folded into c); keys outside the row's
// range [lo, hi) (tile-relative, so the tile's padding past its last key is outside too) become -inf.
inline void mask_row(std::int64_t lo, std::int64_t hi, std::int64_t k0, std::int64_t k1, float* s) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 neg_inf = _mm512_set1_ps(core::kNegInf);
  for (std::int64_t c = k0; c < k1; c += 16) {
    if (c >= lo && c + 16 <= hi) continue;
    const __m512i j = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(c)));
    const __mmask16 keep =
        _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(std::max<std::int64_t>(lo, -1)))) &
        _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(std::min<std::int64_t>(hi, k1))));
    _mm512_storeu_ps(s + c, _mm512_mask_blend_ps(keep, neg_inf, _mm512_loadu_ps(s + c)));
  }
}

// P = 2^((S - m)·c) for keys [k0, k1) (multiples of 32) of one row, into bf16, after the row's state has taken
// the tile (RowState::advance_lazy; the row's O is rescaled when m moves). With dropout, z (indexed like s) holds
// the factors the weights take after l has summed them (core/dropout.h).
template <int Degree>
inline void softmax_row(const float* s, std::int64_t k0, std::int64_t k1, float c, std::int64_t dvp,
                        core::RowState& state, float* o, std::uint16_t* p, const float* z = nullptr) {
  __m512 mx = _mm512_set1_ps(core::kNegInf);
  for (std::int64_t k = k0; k < k1; k += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + k));
  const float alpha = state.advance_lazy(_mm512_reduce_max_ps(mx), c, kLazy);
  if (alpha != 1.0f) {  // m moved (or the row met a NaN): rescale O
    const __m512 av = _mm512_set1_ps(alpha);
    for (std::int64_t d = 0; d < dvp; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), av));
  }
  const __m512 origin = _mm512_set1_ps(state.origin()), cv = _mm512_set1_ps(c);
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t k = k0; k < k1; k += 32) {
    const __m512 p0 = exp2_fast<Degree>(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + k), origin), cv));
    const __m512 p1 = exp2_fast<Degree>(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + k + 16), origin), cv));
    sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
    if (z)
      _mm512_storeu_si512(p + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(p1, _mm512_loadu_ps(z + k + 16)),
                                                              _mm512_mul_ps(p0, _mm512_loadu_ps(z + k))));
    else
      _mm512_storeu_si512(p + k, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
  }
  state.add(_mm512_reduce_add_ps(sum));
}

// Whether every value of the tile's V rows (bf16, dvp values each) is finite: no exponent field of all ones.
inline bool v_rows_finite(const std::uint16_t* const* rows, std::int64_t cols, std::int64_t dvp) {
  const __m512i exp_mask = _mm512_set1_epi16(0x7F80);
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t d = 0; d < dvp; d += 32) {
      const __m512i e = _mm512_and_si512(_mm512_loadu_si512(rows[c] + d), exp_mask);
      if (_mm512_cmpeq_epi16_mask(e, exp_mask)) return false;
    }
  return true;
}

// O[rows] += P V over the pairs each row attends only (scalar fp32 from the bf16 P and V): the exact path for
// a block where a hidden (row, key) pair meets a V row holding NaN or inf, which the tile product would turn
// into 0·NaN = NaN for rows that never attend that key.
template <class Variant>
void pv_attended(const core::Problem& p, std::int64_t b, const std::int64_t* head, const std::int64_t* row,
                 const core::KeyRange* range, std::int64_t nr, std::int64_t j0, std::int64_t k0, std::int64_t k1,
                 std::int64_t cols, const std::uint16_t* pb, const std::uint16_t* const* vrows, std::int64_t dvp,
                 float* o) {
  for (std::int64_t r = 0; r < nr; ++r) {
    const auto vrow = Variant::row(p, b, head[r], row[r]);
    for (std::int64_t c = k0; c < std::min(k1, cols); ++c) {
      const std::int64_t j = j0 + c;
      if (j < range[r].lo || j >= range[r].hi || vrow.hidden(j)) continue;
      const float w = core::to_float(core::bf16{pb[r * BC + c]});
      for (std::int64_t d = 0; d < p.Dv; ++d) o[r * dvp + d] += w * core::to_float(core::bf16{vrows[c][d]});
    }
  }
}

// ---- the two products ------------------------------------------------------------------------------------

#if !defined(ATTN_BF16_DOT)
// On AMX tiles.

// The 2 x 2 accumulator block C = tmm0-3: rows 0-15 | 16-31 of an fp32 matrix, columns c .. c+15 | c+16 .. c+31.
// c_lo points at (row 0, column c), c_hi at (row 16, column c); `stride` is the matrix's row stride in bytes.
inline void load_c(const float* c_lo, const float* c_hi, std::int64_t stride) {
  _tile_loadd(0, c_lo, stride);
  _tile_loadd(1, c_lo + 16, stride);
  _tile_loadd(2, c_hi, stride);
  _tile_loadd(3, c_hi + 16, stride);
}
inline void store_c(float* c_lo, float* c_hi, std::int64_t stride) {
  _tile_stored(0, c_lo, stride);
  _tile_stored(1, c_lo + 16, stride);
  _tile_stored(2, c_hi, stride);
  _tile_stored(3, c_hi + 16, stride);
}

// C += A · B for one 32-deep step: A = two 16-row tiles of bf16 rows (a_lo: rows 0-15, a_hi: rows 16-31,
// 32 values each), B = two pair-interleaved tiles (b_lo: columns 0-15, b_hi: columns 16-31).
inline void tdp_2x2(const std::uint16_t* a_lo, const std::uint16_t* a_hi, std::int64_t a_stride,
                    const std::uint16_t* b_lo, const std::uint16_t* b_hi, std::int64_t b_stride) {
  _tile_loadd(4, a_lo, a_stride);
  _tile_loadd(5, a_hi, a_stride);
  _tile_loadd(6, b_lo, b_stride);
  _tile_loadd(7, b_hi, b_stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// S[32][k0..k1) = Q[32 rows][dkp] · Kᵀ, from packed K (kp[dkp/2][BC] words); k0, k1 multiples of 32.
inline void scores_tiles(const std::uint16_t* q, std::int64_t dkp, const std::uint16_t* kp, std::int64_t k0,
                         std::int64_t k1, float* s) {
  memory_fence();
  for (std::int64_t k = k0; k < k1; k += 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (std::int64_t d = 0; d < dkp; d += 32) {
      const std::uint16_t* kd = kp + (d / 2) * 2 * BC;  // dim pairs d/2 .. d/2+15
      tdp_2x2(q + d, q + 16 * dkp + d, dkp * 2, kd + 2 * k, kd + 2 * (k + 16), BC * 4);
    }
    store_c(s + k, s + 16 * BC + k, BC * 4);
  }
  memory_fence();
}

// O[32][dvp] += P[32][k0..k1) · V, from packed V (vp[BC/2][dvp][2]).
inline void pv_tiles(const std::uint16_t* p, const std::uint16_t* vp, std::int64_t dvp, std::int64_t k0,
                     std::int64_t k1, float* o) {
  memory_fence();
  for (std::int64_t d = 0; d < dvp; d += 32) {
    load_c(o + d, o + 16 * dvp + d, dvp * 4);
    for (std::int64_t k = k0; k < k1; k += 32) {
      const std::uint16_t* vk = vp + (k / 2) * 2 * dvp;  // key pairs k/2 .. k/2+15
      tdp_2x2(p + k, p + 16 * BC + k, BC * 2, vk + 2 * d, vk + 2 * (d + 16), dvp * 4);
    }
    store_c(o + d, o + 16 * dvp + d, dvp * 4);
  }
  memory_fence();
}

#else
// On AVX512-BF16 dot products: vdpbf16ps adds, in each fp32 lane, the two products of a bf16 pair of A (one 32-bit
// word, broadcast) and the lane's bf16 pair of B (one word of the pair-interleaved operand), exactly as one
// tdpbf16ps step does for one row of A. A block of kRows rows x 32 columns of C stays in 2·kRows registers over the
// whole depth (16 independent accumulators hide the instruction's latency; fewer measured much slower), each
// pair step two B loads and kRows broadcasts.
constexpr int kRows = 8;

// C[kRows rows][32] (+)= Σ_q A[r][pair q] · B[pair q][32 columns], q < pairs. a: row 0's first pair (rows a_row
// words apart); b: pair 0's first column (pairs b_row words apart); c: row 0's first column (rows c_row apart).
template <bool Load>
inline void dot_block(const std::uint32_t* a, std::int64_t a_row, const std::uint32_t* b, std::int64_t b_row,
                      std::int64_t pairs, float* c, std::int64_t c_row) {
  __m512 acc[kRows][2];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < 2; ++v) acc[r][v] = Load ? _mm512_loadu_ps(c + r * c_row + 16 * v) : _mm512_setzero_ps();
  for (std::int64_t q = 0; q < pairs; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + q * b_row), b1 = (__m512bh)_mm512_loadu_si512(b + q * b_row + 16);
    for (int r = 0; r < kRows; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * a_row + q]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < 2; ++v) _mm512_storeu_ps(c + r * c_row + 16 * v, acc[r][v]);
}

// S[32][k0..k1) = Q[32 rows][dkp] · Kᵀ, from packed K (kp[dkp/2][BC] words); k0, k1 multiples of 32.
inline void scores_tiles(const std::uint16_t* q, std::int64_t dkp, const std::uint16_t* kp, std::int64_t k0,
                         std::int64_t k1, float* s) {
  const auto* qw = reinterpret_cast<const std::uint32_t*>(q);
  const auto* kw = reinterpret_cast<const std::uint32_t*>(kp);
  for (std::int64_t k = k0; k < k1; k += 32)
    for (std::int64_t r = 0; r < RB; r += kRows)
      dot_block<false>(qw + r * (dkp / 2), dkp / 2, kw + k, BC, dkp / 2, s + r * BC + k, BC);
}

// O[32][dvp] += P[32][k0..k1) · V, from packed V (vp[BC/2][dvp][2]).
inline void pv_tiles(const std::uint16_t* p, const std::uint16_t* vp, std::int64_t dvp, std::int64_t k0,
                     std::int64_t k1, float* o) {
  const auto* pw = reinterpret_cast<const std::uint32_t*>(p);
  const auto* vw = reinterpret_cast<const std::uint32_t*>(vp);
  for (std::int64_t d = 0; d < dvp; d += 32)
    for (std::int64_t r = 0; r < RB; r += kRows)
      dot_block<true>(pw + r * (BC / 2) + k0 / 2, BC / 2, vw + (k0 / 2) * dvp + d, dvp, (k1 - k0) / 2,
                      o + r * dvp + d, dvp);
}
#endif

// ---- work items ----------------------------------------------------------------------------------------

// Work item = (batch, KV head, chunk of `chunk` queries, slice of `heads` query heads of the group): row r is
// query i0 + r % n of head h0 + r / n.
struct Plan {
  std::int64_t chunk = 0, chunks = 0, heads = 0, slices = 0, items = 0, max_rows = 0;
  explicit Plan(const core::Problem& p) {
    // Chunks of about 1024 query rows per KV head (K/V packed once per tile serve them all), cut smaller, down to
    // one row block, when B·Hkv chunks are too few for many cores (cpu/schedule.h: the shape only).
    constexpr std::int64_t kTargetItems = 32;
    const Cut cut = cut_length(p.B * p.Hkv, p.Sq, kTargetItems, RB, RB, std::max<std::int64_t>(RB, 1024 / p.group));
    chunk = std::min(cut.piece_len, p.Sq);
    chunks = (p.Sq + chunk - 1) / chunk;
    // Still too few (a few queries of many heads on one KV head: MLA's decode, 16-128 heads on one latent head):
    // the group's heads in slices of at least two row blocks each, each slice packing K/V for itself.
    const Cut slice = cut_length(p.B * p.Hkv * chunks, p.group, kTargetItems, (2 * RB + chunk - 1) / chunk, 1);
    heads = slice.piece_len, slices = slice.pieces;
    items = p.B * p.Hkv * chunks * slices;
    max_rows = round_up(chunk * heads, RB);
  }
};

constexpr std::int64_t kNextTileBytes = std::int64_t{128} << 10;  // run_item's prefetch of the next tile's rows

// ExpDegree: the exp2 polynomial of the softmax (5 when the call asks for the LSE, else 3; see exp2_fast).
template <class Variant, int ExpDegree>
void run_item(const core::Problem& p, const Plan& plan, std::int64_t item, Workspace& ws) {
  const std::int64_t sl = item % plan.slices, ch = (item / plan.slices) % plan.chunks;
  const std::int64_t hk = (item / (plan.slices * plan.chunks)) % p.Hkv, b = item / (plan.slices * plan.chunks * p.Hkv);
  const std::int64_t i0 = ch * plan.chunk, n = std::min(plan.chunk, p.Sq - i0);
  const std::int64_t h0 = hk * p.group + sl * plan.heads, rows = n * std::min(plan.heads, p.group - sl * plan.heads);
  const std::int64_t blocks = (rows + RB - 1) / RB, dkp = ws.dkp, dvp = ws.dvp;

  // Rows: their query, their key range, Q as bf16 rows; accumulators empty.
  std::int64_t vis_lo = p.Skv, vis_hi = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    ws.head[r] = h0 + r / n, ws.row[r] = i0 + r % n;
    ws.range[r] = core::key_range(p, b, ws.row[r]);
    if (ws.range[r].lo < ws.range[r].hi)
      vis_lo = std::min(vis_lo, ws.range[r].lo), vis_hi = std::max(vis_hi, ws.range[r].hi);
    const auto* src = static_cast<const std::uint16_t*>(p.q.data) + p.q.offset(b, ws.head[r], ws.row[r], 0);
    std::uint16_t* dst = ws.q.data() + r * dkp;
    if (p.q.stride[3] == 1)
      std::memcpy(dst, src, static_cast<std::size_t>(p.Dk) * 2);
    else
      for (std::int64_t d = 0; d < p.Dk; ++d) dst[d] = src[d * p.q.stride[3]];
    std::fill(dst + p.Dk, dst + dkp, std::uint16_t{0});
  }
  std::fill(ws.q.begin() + rows * dkp, ws.q.begin() + blocks * RB * dkp, std::uint16_t{0});
  std::fill(ws.o.begin(), ws.o.begin() + blocks * RB * dvp, 0.0f);
  std::fill(ws.state.begin(), ws.state.begin() + rows, core::RowState{});

  // Each row block's union and intersection of key ranges: tiles outside the union are skipped, and keys
  // inside the intersection need no per-element masking.
  std::vector<Workspace::Block>& blk = ws.blk;
  for (std::int64_t k = 0; k < blocks; ++k) {
    Workspace::Block& bl = blk[static_cast<std::size_t>(k)];
    bl = {p.Skv, 0, 0, p.Skv};
    for (std::int64_t r = k * RB; r < std::min(rows, (k + 1) * RB); ++r) {
      const core::KeyRange rg = ws.range[r];
      if (rg.lo < rg.hi) bl.lo = std::min(bl.lo, rg.lo), bl.hi = std::max(bl.hi, rg.hi);
      bl.all_lo = std::max(bl.all_lo, rg.lo), bl.all_hi = std::min(bl.all_hi, rg.hi);
    }
  }

  const float c = core::score_log2_factor<Variant>(p);
  const RowSource<std::uint16_t> keys = key_rows<std::uint16_t>(p, b, hk), values = value_rows<std::uint16_t>(p, b, hk);
  for (std::int64_t j0 = vis_lo; j0 < vis_hi; j0 += BC) {
    const std::int64_t cols = std::min(BC, vis_hi - j0);
    tile_rows(keys, j0, cols, dkp, ws.kr.data(), ws.zero.data(), ws.rows);
    pack_k(ws.rows, dkp, ws.kp.data());  // K tile, VNNI
    tile_rows(values, j0, cols, dvp, ws.vr.data(), ws.zero.data(), ws.rows);
    pack_v(ws.rows, dvp, ws.vp.data());  // V tile, VNNI (ws.rows keeps pointing at its rows)
    int v_finite = -1;                   // whether the V tile is all finite, once some block needs to know
    // The next tile's K and V rows, prefetched into L2 a slice per row of the softmax while this tile computes,
    // where they are at most kNextTileBytes (wider rows, MLA's 576 + 512 values, would crowd the packed tiles out of
    // L2: its decodes ran 2-6 % slower with them). Packing a tile waited on its rows: the cascade's prefix
    // product (64 query rows per item over 4,096 keys from 16-key pages, d128) took 0.93 of the time with them.
    const std::int64_t k_bytes = p.Dk * 2, v_bytes = p.Dv * 2;
    const std::int64_t n_next =
        BC * (k_bytes + v_bytes) <= kNextTileBytes ? std::clamp<std::int64_t>(vis_hi - j0 - BC, 0, BC) : 0;
    if (n_next > 0) keys.locate_far(j0 + BC, n_next, ws.next_k), values.locate_far(j0 + BC, n_next, ws.next_v);
    std::int64_t pf_row = 0;  // next tile's rows prefetched so far
    const std::int64_t pf_per = (n_next + blocks * RB - 1) / (blocks * RB);
    for (std::int64_t k = 0; k < blocks; ++k) {
      const Workspace::Block& bl = blk[static_cast<std::size_t>(k)];
      if (bl.hi <= j0 || bl.lo >= j0 + cols) continue;  // hidden tile
      // The block's keys in this tile, in whole 32-key steps: [k0, k1).
      const std::int64_t k0 = std::max<std::int64_t>(0, bl.lo - j0) / 32 * 32;
      const std::int64_t k1 = round_up(std::min(cols, bl.hi - j0), 32);
      const bool all_visible = j0 + k0 >= bl.all_lo && j0 + k1 <= bl.all_hi;
      const std::int64_t r0 = k * RB, nr = std::min(RB, rows - r0);
      scores_tiles(ws.q.data() + r0 * dkp, dkp, ws.kp.data(), k0, k1, ws.s.data());  // S = Q Kᵀ
      bool hidden = !all_visible;                                                    // a (row, key) pair hidden
      for (std::int64_t r = 0; r < nr; ++r) {                                        // P = 2^((S - m)·c)
        float* s = ws.s.data() + r * BC;
        const core::KeyRange rg = ws.range[r0 + r];
        if constexpr (Variant::kPerElement)
          hidden |= finish_row<Variant>(p, b, ws.head[r0 + r], ws.row[r0 + r], rg, j0, k0, k1, s);
        else if (!all_visible)
          mask_row(rg.lo - j0, std::min(rg.hi, vis_hi) - j0, k0, k1, s);
        const float* z = nullptr;  // dropout factors
        alignas(64) float zbuf[BC];
        if (Variant::dropout(p))
          p.dropout.factors(b, ws.head[r0 + r], ws.row[r0 + r], j0 + k0, k1 - k0, zbuf + k0, 1), z = zbuf;
        softmax_row<ExpDegree>(s, k0, k1, c, dvp, ws.state[r0 + r], ws.o.data() + (r0 + r) * dvp,
                               ws.pb.data() + r * BC, z);
        const std::int64_t pf = std::min(pf_per, n_next - pf_row);
        if (pf > 0)
          prefetch_rows(ws.next_k, pf_row, pf, 0, k_bytes), prefetch_rows(ws.next_v, pf_row, pf, 0, v_bytes);
        pf_row += std::max<std::int64_t>(pf, 0);
      }
      if (hidden && v_finite < 0) v_finite = v_rows_finite(ws.rows, cols, dvp);
      if (hidden && !v_finite) {  // O += P V over attended pairs only
        pv_attended<Variant>(p, b, &ws.head[r0], &ws.row[r0], &ws.range[r0], nr, j0, k0, k1, cols, ws.pb.data(),
                               ws.rows, dvp, ws.o.data() + r0 * dvp);
        continue;
      }
      for (std::int64_t r = nr; r < RB; ++r)
        std::memset(ws.pb.data() + r * BC + k0, 0, static_cast<std::size_t>(k1 - k0) * 2);
      pv_tiles(ws.pb.data(), ws.vp.data(), dvp, k0, k1, ws.o.data() + r0 * dvp);  // O += P V
    }
  }

  // O = o / l and the LSE per row, the head's sink absorbed (core::finish_with_sink).
  auto* out = static_cast<core::bf16*>(const_cast<void*>(p.out.data));
  const double k_nat = core::score_nat_factor<Variant>(p);
  for (std::int64_t r = 0; r < rows; ++r) {
    const core::RowState& st = ws.state[r];
    const core::Finish f = core::finish_with_sink(st.m, st.l, k_nat, p.sink(ws.head[r]));
    const float factor = f.factor;
    const std::int64_t at = p.out.offset(b, ws.head[r], ws.row[r], 0);
    if (p.out.dtype == DType::f32) {  // f32 rows of a bf16 problem (the cascade's partial results)
      float* of = reinterpret_cast<float*>(out) + at;
      for (std::int64_t d = 0; d < p.Dv; ++d)
        of[d * p.out.stride[3]] = core::finish_output(ws.o[r * dvp + d], st.l, factor);
    } else {
      core::bf16* o = out + at;
      std::int64_t d = 0;
      if (p.out.stride[3] == 1 && st.l != 0.0f)  // vcvtneps2bf16 rounds to nearest even, as core::from_float does
        for (; d + 16 <= p.Dv; d += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d),
                              (__m256i)_mm512_cvtneps_pbh(
                                  _mm512_mul_ps(_mm512_loadu_ps(&ws.o[r * dvp + d]), _mm512_set1_ps(factor))));
      for (; d < p.Dv; ++d)
        o[d * p.out.stride[3]] = core::from_float<core::bf16>(core::finish_output(ws.o[r * dvp + d], st.l, factor));
    }
    if (p.lse)
      static_cast<float*>(const_cast<void*>(p.lse->data))[p.lse->offset(b, ws.head[r], ws.row[r], 0)] = f.lse;
  }
}

// The team's workspaces, kept between calls in the caller's attn::Workspace (under kScratchKey). bytes() measures
// what it holds (flash_workspace counts it before a call).
struct Scratch {
  Workspace::Shape shape{-1, -1, -1};
  std::vector<Workspace> team;
  std::int64_t bytes() const {
    std::int64_t n = 0;
    for (const Workspace& w : team) n += held_bytes(w, shape);
    return n;
  }
};
constexpr char kScratchKey = 0;

// A thread's setup for the run (cpu/schedule.h): the tile configuration, and flush-to-zero and
// denormals-are-zero while the kernel runs: masked scores give exp2 results that underflow, and each underflowing
// vector would otherwise take a microcode assist (measured 20x slower softmax rows on a causal diagonal tile).
// Values that small carry no weight next to l >= 1.
struct TileScope {
  unsigned int mxcsr;
  explicit TileScope(Workspace&) : mxcsr(_mm_getcsr()) {
    _mm_setcsr(mxcsr | 0x8040);
    tile_config();
  }
  ~TileScope() {
    tile_release();
    _mm_setcsr(mxcsr);
  }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// The shape of each thread's workspace, and the bytes of a call's scratch: the team's workspaces (flash_workspace,
// Scratch).
Workspace::Shape scratch_shape(const core::Problem& p, const Plan& plan) { return {p.Dk, p.Dv, plan.max_rows}; }
std::int64_t scratch_bytes(const core::Problem& p, const Plan& plan, int threads) {
  return team_size(threads, plan.items) * Workspace::bytes(scratch_shape(p, plan));
}

template <class Variant, int ExpDegree>
void amx_forward(const core::Problem& p, int threads) {
  if (p.B == 0 || p.Sq == 0) return;  // nothing to write
  const Plan plan(p);
  Scratch local;
  Scratch& sc = core::scratch(p.workspace, &kScratchKey, local, scratch_bytes(p, plan, threads));
  const Workspace::Shape shape = scratch_shape(p, plan);
  if (!(sc.shape == shape)) sc.team.clear(), sc.shape = shape;
  run_team<TileScope>(&sc.team, threads, plan.items, [&](int) { return Workspace(shape); },
                      loop(plan.items, [&](std::int64_t it, Workspace& ws) { run_item<Variant, ExpDegree>(p, plan, it, ws); }));
}

// The instantiations cpu/pick.h chooses from (bf16 only): the exp2 polynomial is degree 5 when the call asks for
// the LSE (its sum must be fp32-exact), degree 3 otherwise (see exp2_fast).
template <class QT, class KVT, class Variant>
struct Degree5 {
  static constexpr FlashFn fn = &amx_forward<Variant, 5>;
};
template <class QT, class KVT, class Variant>
struct Degree3 {
  static constexpr FlashFn fn = &amx_forward<Variant, 3>;
};

}  // namespace

FlashFn flash_kernel(const core::Problem& p) {
  if (p.q.dtype != DType::bf16 || p.k.dtype != DType::bf16) return nullptr;
  return p.lse ? pick_for_variant<FlashFn, Degree5, core::bf16, core::bf16>(core::variant_kind(p))
               : pick_for_variant<FlashFn, Degree3, core::bf16, core::bf16>(core::variant_kind(p));
}

std::int64_t flash_workspace(const core::Problem& p, int threads) {
  if (p.B == 0 || p.Sq == 0) return 0;
  return scratch_bytes(p, Plan(p), threads);
}

}  // namespace attn::cpu::ATTN_AMX_NS
#pragma GCC pop_options
