// Per-warp code of the layout self-tests: written once over the warp policy of cuda/warp.h, run on the GPU by
// the kernels of cuda/selftest.cu (attn_gpu_selftest, `make test-gpu`) and on the host through HostWarp by
// tests/test_cuda_host.cc. Each function is the body of one warp; the callers give it its case number, its
// shared memory and where its results go.
//
//   onehot_mma       A(m,k) = 1 and B(k,n) = 1 placed into registers by fragment.h's layouts; one mma; D
//                    written out by the C layout. Right layouts put the single 1 at D(m,n).
//   ldmatrix_probe   distinct 16-bit values in 8x8 matrices whose rows lie scattered in shared memory; one
//                    ldmatrix (x1/x2/x4, plain or .trans); every register written out, to compare with
//                    fragment.h's address and element layouts.
//   attention_tile   one FlashAttention-2 step on a 16x16 query tile and 16 keys: S = Q·Kᵀ (ldmatrix x4 for
//                    both operands, two mma), the row max and row sum across the quad by shfl_xor,
//                    P = 2^(S - max) reused in registers as the A operand of P·V (V through ldmatrix .trans).
//                    With Softmax = false, P = S (the one-hot form: Q = e(m,k), K row n = e(k), V row n =
//                    e(n % 8) put the 1s at S(m,n) and O(m, n % 8)).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/elem.h"
#include "cuda/fragment.h"
#include "core/hd.h"
#include "cuda/warp.h"

namespace attn::cuda::selftest {

// ---- one-hot MMA --------------------------------------------------------------------------------------
inline constexpr int kOnehotCases = frag::kMmaM * frag::kMmaK * frag::kMmaN;  // every (m, k, n)
ATTN_HD constexpr int onehot_case(int m, int k, int n) { return (m * frag::kMmaK + k) * frag::kMmaN + n; }
ATTN_HD constexpr int onehot_m(int c) { return c / (frag::kMmaK * frag::kMmaN); }
ATTN_HD constexpr int onehot_k(int c) { return (c / frag::kMmaN) % frag::kMmaK; }
ATTN_HD constexpr int onehot_n(int c) { return c % frag::kMmaN; }

// out: the 16x8 D of case (m, k, n), row-major.
template <MmaType T, class W>
ATTN_HD void onehot_mma(const W& w, int m, int k, int n, float* out) {
  using U32 = typename W::template Reg<std::uint32_t>;
  using F32 = typename W::template Reg<float>;
  const auto lane = W::lane();
  U32 a[frag::kARegs], b[frag::kBRegs];
  F32 c[frag::kCRegs], d[frag::kCRegs];
  for (int r = 0; r < frag::kARegs; ++r)
    a[r] = W::map(
        [=](int l) {
          const bool lo = frag::mma_a(l, r, 0) == frag::Coord{m, k}, hi = frag::mma_a(l, r, 1) == frag::Coord{m, k};
          return pack2<T>(lo ? 1.0f : 0.0f, hi ? 1.0f : 0.0f);
        },
        lane);
  for (int r = 0; r < frag::kBRegs; ++r)
    b[r] = W::map(
        [=](int l) {
          const bool lo = frag::mma_b(l, r, 0) == frag::Coord{k, n}, hi = frag::mma_b(l, r, 1) == frag::Coord{k, n};
          return pack2<T>(lo ? 1.0f : 0.0f, hi ? 1.0f : 0.0f);
        },
        lane);
  for (int r = 0; r < frag::kCRegs; ++r) c[r] = F32(0.0f);
  w.mma(MmaTag<T>{}, d, a, b, c);
  for (int r = 0; r < frag::kCRegs; ++r) {
    const auto idx = W::map(
        [=](int l) {
          const frag::Coord p = frag::mma_c(l, r);
          return p.row * frag::kMmaN + p.col;
        },
        lane);
    W::store(out, idx, d[r]);
  }
}

// ---- ldmatrix probe -----------------------------------------------------------------------------------
// Shared memory: 32 row slots of 16 bytes (4 matrices x 8 rows), row (matrix, row) in slot
// ldmatrix_slot_of(matrix, row), a permutation, so that a wrong address lane shows.
inline constexpr int kProbeSlots = 32;
inline constexpr int kProbeSmemElems = kProbeSlots * frag::kLdmCols;  // 16-bit elements
ATTN_HD constexpr int probe_slot(int matrix, int row) { return ((matrix * 8 + row) * 13 + 5) % kProbeSlots; }
// The value stored at element (matrix, row, col): distinct and non-zero.
ATTN_HD constexpr std::uint16_t probe_value(int matrix, int row, int col) {
  return static_cast<std::uint16_t>(0x100 + matrix * 64 + row * 8 + col);
}

// smem: kProbeSmemElems 16-bit elements, 16-byte aligned; out: [32 lanes][Num] registers as loaded.
template <int Num, bool Trans, class W>
ATTN_HD void ldmatrix_probe(const W& w, std::uint16_t* smem, std::uint32_t* out) {
  using U32 = typename W::template Reg<std::uint32_t>;
  const auto lane = W::lane();
  for (int j = 0; j < kProbeSmemElems / frag::kWarp; ++j) {
    const auto e = lane + j * frag::kWarp;  // element (matrix, row, col) = (e / 64, e / 8 % 8, e % 8)
    const auto idx = W::map([](int x) { return probe_slot(x >> 6, (x >> 3) & 7) * frag::kLdmCols + (x & 7); }, e);
    const auto val = W::map([](int x) { return probe_value(x >> 6, (x >> 3) & 7, x & 7); }, e);
    W::store(smem, idx, val);
  }
  W::sync();
  const std::uint32_t base = w.smem_address(smem);
  const U32 addr = W::map(
      [=](int l) {
        const frag::MatrixRow mr = frag::ldmatrix_addressed_row(l, Num);
        return base + static_cast<std::uint32_t>(probe_slot(mr.matrix, mr.row) * frag::kLdmRowBytes);
      },
      lane);
  U32 r[Num];
  if constexpr (Trans) {
    w.ldmatrix_trans(r, addr);
  } else {
    w.ldmatrix(r, addr);
  }
  for (int m = 0; m < Num; ++m) W::store(out, lane * Num + m, r[m]);
}

// ---- one attention tile -------------------------------------------------------------------------------
// Shared-memory tile of the attention step, 16-bit elements: Q [16][kLdq], K [16][kLdk] (key-major), V
// [16][kLdv] (key-major). The padded strides keep every row 16-byte aligned, as ldmatrix needs.
inline constexpr int kTileRows = 16, kTileKeys = 16, kTileDk = 16, kTileDv = 8;
inline constexpr int kLdq = 24, kLdk = 24, kLdv = 16;
inline constexpr int kQOffset = 0, kKOffset = kTileRows * kLdq, kVOffset = kKOffset + kTileKeys * kLdk;
inline constexpr int kTileSmemElems = kVOffset + kTileKeys * kLdv;

// Results of one tile: S [16][16], rowmax [16], rowsum [16], O [16][8], row-major.
struct TileOut {
  float* s;
  float* rowmax;
  float* rowsum;
  float* o;
};

// Copies Q [16][16], K [16 keys][16], V [16 keys][8] (dense row-major 16-bit elements) into the tile.
template <class W>
ATTN_HD void tile_fill(const W&, const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                       std::uint16_t* smem) {
  const auto lane = W::lane();
  for (int j = 0; j < kTileRows * kTileDk / frag::kWarp; ++j) {
    const auto e = lane + j * frag::kWarp;
    W::store(smem + kQOffset, (e >> 4) * kLdq + (e & 15), W::load(q, e));
    W::store(smem + kKOffset, (e >> 4) * kLdk + (e & 15), W::load(k, e));
  }
  for (int j = 0; j < kTileKeys * kTileDv / frag::kWarp; ++j) {
    const auto e = lane + j * frag::kWarp;
    W::store(smem + kVOffset, (e >> 3) * kLdv + (e & 7), W::load(v, e));
  }
  W::sync();
}

// The one-hot tile of case (m, k, n) (m, k, n < 16): Q = e(m,k), K row n = e(k), V row n = e(n % 8).
inline constexpr int kTileOnehotCases = kTileRows * kTileDk * kTileKeys;
template <MmaType T, class W>
ATTN_HD void tile_fill_onehot(const W&, int m, int k, int n, std::uint16_t* smem) {
  const auto lane = W::lane();
  const std::uint16_t one = to_bits<T>(1.0f);
  const int q1 = kQOffset + m * kLdq + k, k1 = kKOffset + n * kLdk + k, v1 = kVOffset + n * kLdv + n % 8;
  for (int j = 0; j < kTileSmemElems / frag::kWarp; ++j) {
    const auto e = lane + j * frag::kWarp;
    W::store(smem, e, W::map([=](int x) { return x == q1 || x == k1 || x == v1 ? one : std::uint16_t{0}; }, e));
  }
  W::sync();
}

template <MmaType T, bool Softmax, class W>
ATTN_HD void attention_tile(const W& w, const std::uint16_t* smem, TileOut out) {
  using U32 = typename W::template Reg<std::uint32_t>;
  using F32 = typename W::template Reg<float>;
  const auto lane = W::lane();
  const std::uint32_t base = w.smem_address(smem);

  // A = Q (row-major) by one x4; B of key block j is B(k = dim, n = key) = K[key][dim], K stored n-major:
  // one plain x4 loads both key blocks (fragment.h: ldsm_a_x4, ldsm_b_nk).
  U32 a[frag::kARegs];
  w.ldmatrix(a, base + W::map(
                           [](int l) {
                             const frag::Coord p = frag::ldsm_a_x4(l);
                             return static_cast<std::uint32_t>(2 * (kQOffset + p.row * kLdq + p.col));
                           },
                           lane));
  U32 kb[4];
  w.ldmatrix(kb, base + W::map(
                            [](int l) {
                              const frag::Coord p = frag::ldsm_b_nk(l, 4);
                              return static_cast<std::uint32_t>(2 * (kKOffset + p.row * kLdk + p.col));
                            },
                            lane));
  F32 s[2][frag::kCRegs];
  const F32 zero[frag::kCRegs] = {F32(0.0f), F32(0.0f), F32(0.0f), F32(0.0f)};
  for (int j = 0; j < 2; ++j) {
    const U32 b[frag::kBRegs] = {kb[2 * j], kb[2 * j + 1]};
    w.mma(MmaTag<T>{}, s[j], a, b, zero);
  }

  // Row max and sum: a lane holds rows g (registers 0, 1) and g + 8 (2, 3) of both blocks; the quad of
  // lanes 4g..4g+3 holds the whole row, so two xor shuffles (1, 2) finish the reduction.
  const auto fmax = [](float x, float y) { return x > y ? x : y; };
  F32 mx[2], sum[2];
  for (int h = 0; h < 2; ++h) {
    mx[h] = W::map(fmax, W::map(fmax, s[0][2 * h], s[0][2 * h + 1]), W::map(fmax, s[1][2 * h], s[1][2 * h + 1]));
    for (int x = 1; x <= 2; x <<= 1) mx[h] = W::map(fmax, mx[h], W::shfl_xor(mx[h], x));
  }
  F32 p[2][frag::kCRegs];
  for (int j = 0; j < 2; ++j)
    for (int r = 0; r < frag::kCRegs; ++r) {
      if constexpr (Softmax) {
        p[j][r] = W::map([](float sv, float m) { return exp2f(sv - m); }, s[j][r], mx[r >> 1]);
      } else {
        p[j][r] = s[j][r];
      }
    }
  for (int h = 0; h < 2; ++h) {
    sum[h] = (p[0][2 * h] + p[0][2 * h + 1]) + (p[1][2 * h] + p[1][2 * h + 1]);
    for (int x = 1; x <= 2; x <<= 1) sum[h] = sum[h] + W::shfl_xor(sum[h], x);
  }

  // P as the A operand of P·V without a trip through shared memory: the C registers (0,1 | 2,3) of key
  // blocks 0 and 1 are exactly A's registers 0 | 1 and 2 | 3 (same rows, columns 2t, 2t+1 and 8 + 2t, +1).
  U32 pa[frag::kARegs];
  const auto pack = [](float lo, float hi) { return pack2<T>(lo, hi); };
  pa[0] = W::map(pack, p[0][0], p[0][1]);
  pa[1] = W::map(pack, p[0][2], p[0][3]);
  pa[2] = W::map(pack, p[1][0], p[1][1]);
  pa[3] = W::map(pack, p[1][2], p[1][3]);
  // B = V (k = key, n = dim), V stored k-major: one transposing x2 (fragment.h: ldsm_b_kn_trans).
  U32 vb[frag::kBRegs];
  w.ldmatrix_trans(vb, base + W::map(
                                  [](int l) {
                                    const frag::Coord p = frag::ldsm_b_kn_trans(l, 2);
                                    return static_cast<std::uint32_t>(2 * (kVOffset + p.row * kLdv + p.col));
                                  },
                                  lane));
  F32 o[frag::kCRegs];
  w.mma(MmaTag<T>{}, o, pa, vb, zero);

  for (int r = 0; r < frag::kCRegs; ++r) {
    const auto row = W::map([=](int l) { return frag::mma_c(l, r).row; }, lane);
    const auto col = W::map([=](int l) { return frag::mma_c(l, r).col; }, lane);
    for (int j = 0; j < 2; ++j) W::store(out.s, row * kTileKeys + col + 8 * j, s[j][r]);
    W::store(out.o, row * kTileDv + col, o[r]);
  }
  // Every lane of a quad holds its rows' max and sum; lane 4g + 0 writes row g, lane 4g + 1 row g + 8, the
  // other two store to a spare slot 16 (the results arrays hold 17).
  const auto g = lane >> 2, t = lane & 3;
  const auto slot = W::select(t == 0, g, W::select(t == 1, g + 8, decltype(g)(16)));
  W::store(out.rowmax, slot, W::select(t == 1, mx[1], mx[0]));
  W::store(out.rowsum, slot, W::select(t == 1, sum[1], sum[0]));
}

}  // namespace attn::cuda::selftest
