// The CUDA backend's warp-level logic on the host (plain C++, built with or without CUDA): the fragment layouts
// of cuda/fragment.h, the operand conversions of cuda/elem.h, the host model of a warp (cuda/warp.h) and the
// per-warp code of the self-tests (cuda/selftest_tiles.h) run through it. The GPU self-test
// (attn_gpu_selftest, `make test-gpu`) runs the same per-warp code on the hardware under the same checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "core/convert.h"
#include "cuda/elem.h"
#include "cuda/fragment.h"
#include "cuda/selftest_host.h"
#include "cuda/warp.h"

namespace {

using namespace attn::cuda;
using frag::Coord;
using frag::Slot;

// ---- fragment layouts ---------------------------------------------------------------------------------

// Each map covers its matrix exactly once, and the inverse inverts it.
TEST(CudaFragment, MmaLayoutsAreBijectionsWithTheirInverses) {
  std::set<std::pair<int, int>> a, b, c;
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < frag::kARegs; ++r)
      for (int h = 0; h < 2; ++h) {
        const Coord p = frag::mma_a(l, r, h);
        ASSERT_TRUE(p.row >= 0 && p.row < 16 && p.col >= 0 && p.col < 16);
        EXPECT_TRUE(a.insert({p.row, p.col}).second) << "A element covered twice";
        EXPECT_EQ(frag::mma_a_slot(p.row, p.col), (Slot{l, r, h}));
      }
    for (int r = 0; r < frag::kBRegs; ++r)
      for (int h = 0; h < 2; ++h) {
        const Coord p = frag::mma_b(l, r, h);
        ASSERT_TRUE(p.row >= 0 && p.row < 16 && p.col >= 0 && p.col < 8);
        EXPECT_TRUE(b.insert({p.row, p.col}).second) << "B element covered twice";
        EXPECT_EQ(frag::mma_b_slot(p.row, p.col), (Slot{l, r, h}));
      }
    for (int r = 0; r < frag::kCRegs; ++r) {
      const Coord p = frag::mma_c(l, r);
      ASSERT_TRUE(p.row >= 0 && p.row < 16 && p.col >= 0 && p.col < 8);
      EXPECT_TRUE(c.insert({p.row, p.col}).second) << "C element covered twice";
      EXPECT_EQ(frag::mma_c_slot(p.row, p.col), (Slot{l, r, 0}));
    }
  }
  EXPECT_EQ(a.size(), 256u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_EQ(c.size(), 128u);
}

// A few entries written out from the PTX ISA's figures, so that a layout that is a bijection but the wrong
// one cannot pass.
TEST(CudaFragment, MmaLayoutsMatchThePtxFigures) {
  EXPECT_EQ(frag::mma_a(0, 0, 0), (Coord{0, 0}));    // T0: a0 = (0,0), a1 = (0,1)
  EXPECT_EQ(frag::mma_a(0, 0, 1), (Coord{0, 1}));
  EXPECT_EQ(frag::mma_a(0, 1, 0), (Coord{8, 0}));    // a2 = (8,0)
  EXPECT_EQ(frag::mma_a(0, 2, 0), (Coord{0, 8}));    // a4 = (0,8)
  EXPECT_EQ(frag::mma_a(0, 3, 1), (Coord{8, 9}));    // a7 = (8,9)
  EXPECT_EQ(frag::mma_a(31, 3, 1), (Coord{15, 15}));
  EXPECT_EQ(frag::mma_a(5, 0, 0), (Coord{1, 2}));
  EXPECT_EQ(frag::mma_b(0, 0, 1), (Coord{1, 0}));    // b1 = (1,0)
  EXPECT_EQ(frag::mma_b(0, 1, 0), (Coord{8, 0}));    // b2 = (8,0)
  EXPECT_EQ(frag::mma_b(6, 0, 0), (Coord{4, 1}));
  EXPECT_EQ(frag::mma_b(31, 1, 1), (Coord{15, 7}));
  EXPECT_EQ(frag::mma_c(0, 1), (Coord{0, 1}));
  EXPECT_EQ(frag::mma_c(0, 2), (Coord{8, 0}));
  EXPECT_EQ(frag::mma_c(31, 3), (Coord{15, 7}));
  EXPECT_EQ(frag::ldmatrix_elem(5, 1, false), (Coord{1, 3}));
  EXPECT_EQ(frag::ldmatrix_elem(5, 1, true), (Coord{3, 1}));
  EXPECT_EQ(frag::ldmatrix_address_lane(2, 3), 19);
}

TEST(CudaFragment, LdmatrixLayoutsAreBijections) {
  for (bool trans : {false, true}) {
    std::set<std::pair<int, int>> seen;
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h) {
        const Coord e = frag::ldmatrix_elem(l, h, trans);
        EXPECT_TRUE(seen.insert({e.row, e.col}).second);
        EXPECT_EQ(frag::ldmatrix_slot(e.row, e.col, trans), (Slot{l, 0, h}));
      }
    EXPECT_EQ(seen.size(), 64u);
  }
  for (int num : {1, 2, 4})
    for (int l = 0; l < 32; ++l) {
      const frag::MatrixRow mr = frag::ldmatrix_addressed_row(l, num);
      EXPECT_LT(mr.matrix, num);
      if (l < 8 * num) {
        EXPECT_EQ(frag::ldmatrix_address_lane(mr.matrix, mr.row), l);
      }
    }
}

// Everything is constexpr: the kernels may use the layouts in constant expressions.
static_assert(frag::mma_a(7, 2, 1) == Coord{1, 15});
static_assert(frag::mma_c_slot(9, 5) == Slot{6, 3, 0});

// ---- operand conversions ------------------------------------------------------------------------------

TEST(CudaElem, ConversionsRoundLikeTheCpuAndTheCompiler) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, 6.1e-5f, 6.0e-8f,
                           2.98e-8f, 2.9802322e-8f, 1e-30f, INFINITY, -INFINITY, NAN, 3.0e38f, 1.0009766f};
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
    xs.push_back(std::ldexp(static_cast<float>(rng() % 4096) / 4096.0f + 1.0f, static_cast<int>(rng() % 48) - 30));
  }
  for (float x : xs) {
    const std::uint16_t b = float_to_bf16(x), want_b = attn::core::from_float<attn::core::bf16>(x).bits;
    const std::uint16_t h = float_to_f16(x), want_h = attn::core::from_float<attn::core::f16>(x).bits;
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(b)));
      EXPECT_TRUE(std::isnan(f16_to_float(h)));
      continue;
    }
    ASSERT_EQ(b, want_b) << x;
    ASSERT_EQ(h, want_h) << x;
    ASSERT_EQ(bf16_to_float(b), attn::core::to_float(attn::core::bf16{b})) << x;
    ASSERT_EQ(f16_to_float(h), attn::core::to_float(attn::core::f16{h})) << x;
  }
  EXPECT_EQ(pack2<MmaType::bf16>(1.0f, 2.0f), 0x40003f80u);  // lower-numbered element in the low half
  EXPECT_EQ(unpack<MmaType::f16>(pack2<MmaType::f16>(0.5f, -3.0f), 1), -3.0f);
}

// ---- the host model of the MMA ------------------------------------------------------------------------

TEST(CudaWarpModel, MmaOneHot) {
  const auto bf = selftest::check_onehot_mma(MmaType::bf16, selftest::host_onehot_mma<MmaType::bf16>());
  EXPECT_TRUE(bf.ok()) << bf.first;
  EXPECT_EQ(bf.cases, 16 * 16 * 8);
  const auto h = selftest::check_onehot_mma(MmaType::f16, selftest::host_onehot_mma<MmaType::f16>());
  EXPECT_TRUE(h.ok()) << h.first;
}

// Fragments filled element by element from matrices (the inverse layouts), one mma, D read back: a plain fp32
// matmul of the rounded inputs agrees within its own rounding.
template <MmaType T>
void random_mma(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  float A[16][16], B[16][8], C[16][8];
  for (auto& row : A)
    for (float& x : row) x = round_to<T>(u(rng));
  for (auto& row : B)
    for (float& x : row) x = round_to<T>(u(rng));
  for (auto& row : C)
    for (float& x : row) x = u(rng);
  Lanes<std::uint32_t> a[4], b[2];
  Lanes<float> c[4], d[4];
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) {
      const Slot s = frag::mma_a_slot(i, k);
      a[s.reg][s.lane] |= static_cast<std::uint32_t>(to_bits<T>(A[i][k])) << (16 * s.half);
    }
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < 8; ++j) {
      const Slot s = frag::mma_b_slot(k, j);
      b[s.reg][s.lane] |= static_cast<std::uint32_t>(to_bits<T>(B[k][j])) << (16 * s.half);
    }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      const Slot s = frag::mma_c_slot(i, j);
      c[s.reg][s.lane] = C[i][j];
    }
  HostWarp::mma(MmaTag<T>{}, d, a, b, c);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float ref = C[i][j], mag = std::fabs(C[i][j]);
      for (int k = 0; k < 16; ++k) {
        ref += A[i][k] * B[k][j];
        mag += std::fabs(A[i][k] * B[k][j]);
      }
      const Slot s = frag::mma_c_slot(i, j);
      EXPECT_NEAR(d[s.reg][s.lane], ref, 17 * 0x1.0p-24 * mag) << "D(" << i << "," << j << ")";
    }
  // d may alias c.
  HostWarp::mma(MmaTag<T>{}, c, a, b, c);
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < 32; ++l) EXPECT_EQ(c[r][l], d[r][l]);
}

TEST(CudaWarpModel, MmaRandomAgainstPlainMatmul) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    random_mma<MmaType::bf16>(seed);
    random_mma<MmaType::f16>(seed);
  }
}

TEST(CudaWarpModel, ShflXorIsTheLanePermutation) {
  const auto lane = HostWarp::lane();
  const Lanes<float> x = HostWarp::map([](int l) { return 10.0f * static_cast<float>(l); }, lane);
  for (int mask : {1, 2, 4, 8, 16, 31}) {
    const auto y = HostWarp::shfl_xor(x, mask);
    for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], 10.0f * static_cast<float>(l ^ mask));
  }
}

// ---- the host model of ldmatrix -----------------------------------------------------------------------

TEST(CudaWarpModel, LdmatrixProbeMatchesTheLayouts) {
  for (int num : {1, 2, 4})
    for (bool trans : {false, true}) {
      const auto ch = selftest::check_ldmatrix_probe(num, trans, selftest::host_ldmatrix_probe(num, trans));
      EXPECT_TRUE(ch.ok()) << ch.name << ": " << ch.first;
      EXPECT_EQ(ch.cases, 64 * num);
    }
}

TEST(CudaWarpModel, LdmatrixRefusesAddressesOutsideSharedMemory) {
  alignas(16) std::uint16_t smem[256] = {};
  const HostWarp w(smem, sizeof smem);
  Lanes<std::uint32_t> r[4];
  EXPECT_THROW(w.ldmatrix(r, Lanes<std::uint32_t>(8u)), std::out_of_range);     // not 16-byte aligned
  EXPECT_THROW(w.ldmatrix(r, Lanes<std::uint32_t>(512u)), std::out_of_range);   // past the end
  EXPECT_NO_THROW(w.ldmatrix(r, Lanes<std::uint32_t>(496u)));
  EXPECT_THROW((void)w.smem_address(smem + 300), std::out_of_range);
}

// The addressing helpers of fragment.h (ldsm_*) load exactly the fragments the element-wise layouts build, for
// tiles at a padded stride in the model's shared memory.
template <MmaType T>
void ldmatrix_operands(std::uint32_t seed) {
  constexpr int ld = 40;  // elements per stored row: 80 bytes, 16-byte aligned rows
  alignas(16) std::uint16_t smem[3 * 16 * ld] = {};
  std::mt19937 rng(seed);
  for (auto& e : smem) e = static_cast<std::uint16_t>(rng());
  std::uint16_t* a_tile = smem;            // A [16][16] row-major
  std::uint16_t* nk_tile = smem + 16 * ld;  // B for two n-blocks stored [n 16][k 16]
  std::uint16_t* kn_tile = smem + 32 * ld;  // B for two n-blocks stored [k 16][n 16]
  const HostWarp w(smem, sizeof smem);
  const auto lane = HostWarp::lane();
  const auto addr_of = [&](const std::uint16_t* tile, auto coord) {
    return HostWarp::map(
        [&](int l) {
          const Coord p = coord(l);
          return w.smem_address(tile + p.row * ld + p.col);
        },
        lane);
  };
  Lanes<std::uint32_t> a[4], bnk[4], bkn[4], bnk2[2], bkn2[2];
  w.ldmatrix(a, addr_of(a_tile, [](int l) { return frag::ldsm_a_x4(l); }));
  w.ldmatrix(bnk, addr_of(nk_tile, [](int l) { return frag::ldsm_b_nk(l, 4); }));
  w.ldmatrix_trans(bkn, addr_of(kn_tile, [](int l) { return frag::ldsm_b_kn_trans(l, 4); }));
  w.ldmatrix(bnk2, addr_of(nk_tile, [](int l) { return frag::ldsm_b_nk(l, 2); }));
  w.ldmatrix_trans(bkn2, addr_of(kn_tile, [](int l) { return frag::ldsm_b_kn_trans(l, 2); }));
  for (int l = 0; l < 32; ++l)
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 4; ++r) {
        const Coord p = frag::mma_a(l, r, h);
        EXPECT_EQ(half_of(a[r][l], h), a_tile[p.row * ld + p.col]) << "A lane " << l << " reg " << r;
      }
      for (int j = 0; j < 2; ++j)
        for (int r = 0; r < 2; ++r) {
          const Coord p = frag::mma_b(l, r, h);  // (k, n within the block)
          const int n = 8 * j + p.col, k = p.row;
          EXPECT_EQ(half_of(bnk[2 * j + r][l], h), nk_tile[n * ld + k]) << "B[n][k] lane " << l;
          EXPECT_EQ(half_of(bkn[2 * j + r][l], h), kn_tile[k * ld + n]) << "B[k][n] lane " << l;
          if (j == 0) {
            EXPECT_EQ(bnk2[r][l], bnk[r][l]);
            EXPECT_EQ(bkn2[r][l], bkn[r][l]);
          }
        }
    }
}

TEST(CudaWarpModel, LdmatrixLoadsTheMmaFragments) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    ldmatrix_operands<MmaType::bf16>(seed);
    ldmatrix_operands<MmaType::f16>(seed);
  }
}

// ---- a per-warp FlashAttention-2 step through the model -----------------------------------------------

TEST(CudaWarpModel, AttentionTileOneHot) {
  const auto bf = selftest::check_tile_onehot(MmaType::bf16, selftest::host_attention_tile_onehot<MmaType::bf16>());
  EXPECT_TRUE(bf.ok()) << bf.first;
  EXPECT_EQ(bf.cases, 16 * 16 * 16);
  const auto h = selftest::check_tile_onehot(MmaType::f16, selftest::host_attention_tile_onehot<MmaType::f16>());
  EXPECT_TRUE(h.ok()) << h.first;
}

template <MmaType T>
void tile_values() {
  const auto in = selftest::make_tile_inputs<T>(64, 11);
  const auto soft = selftest::host_attention_tile<T, true>(in.cases, in.q, in.k, in.v);
  const auto ch = selftest::check_tile_values<T>(in, soft, true);
  EXPECT_TRUE(ch.ok()) << ch.name << ": " << ch.first;
  const auto plain = selftest::host_attention_tile<T, false>(in.cases, in.q, in.k, in.v);
  const auto ch2 = selftest::check_tile_values<T>(in, plain, false);
  EXPECT_TRUE(ch2.ok()) << ch2.name << ": " << ch2.first;
}

TEST(CudaWarpModel, AttentionTileValuesAgainstScalar) {
  tile_values<MmaType::bf16>();
  tile_values<MmaType::f16>();
}

// The checks do catch a wrong layout: the one-hot results of a model whose C layout is transposed within the
// quad fail.
TEST(CudaWarpModel, ChecksRejectAWrongLayout) {
  auto out = selftest::host_onehot_mma<MmaType::bf16>();
  for (std::size_t c = 0; c < out.size(); c += 128) std::swap(out[c + 1], out[c + 8]);  // D(0,1) <-> D(1,0)
  EXPECT_FALSE(selftest::check_onehot_mma(MmaType::bf16, out).ok());
  auto probe = selftest::host_ldmatrix_probe(2, true);
  std::swap(probe[0], probe[1]);
  EXPECT_FALSE(selftest::check_ldmatrix_probe(2, true, probe).ok());
}

}  // namespace
