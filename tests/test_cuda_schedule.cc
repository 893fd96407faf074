// The CUDA backend's index arithmetic (src/cuda/schedule.h) against the CPU's definitions (core/mask.h's
// key_range, core/problem.h's kv_row_offset) on many random shapes, and the key-tile ranges against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/sdpa.h"
#include "core/mask.h"
#include "core/problem.h"
#include "cuda/schedule.h"

namespace {

using namespace attn::cuda::sched;

static_assert(static_cast<int>(CausalMode::none) == static_cast<int>(attn::Causal::none));
static_assert(static_cast<int>(CausalMode::top_left) == static_cast<int>(attn::Causal::top_left));
static_assert(static_cast<int>(CausalMode::bottom_right) == static_cast<int>(attn::Causal::bottom_right));

Masks masks_of(const attn::core::Problem& p) {
  Masks m;
  m.Sq = p.Sq;
  m.causal = static_cast<CausalMode>(p.causal);
  m.window_left = p.window.left;
  m.window_right = p.window.right;
  m.window_bottom_right = p.window.align == attn::Align::bottom_right;
  return m;
}

attn::core::Problem random_problem(std::mt19937& rng) {
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  attn::core::Problem p;
  p.B = pick(1, 3);
  p.Sq = pick(0, 4) == 0 ? pick(1, 4) : pick(1, 300);
  p.Skv = pick(0, 4) == 0 ? pick(1, 4) : pick(1, 300);
  for (std::int64_t b = 0; b < p.B; ++b) p.kv_len.push_back(pick(0, 3) == 0 ? pick(0, p.Skv) : p.Skv);
  p.causal = static_cast<attn::Causal>(pick(0, 2));
  if (pick(0, 1)) {
    p.window.left = pick(-1, 3) == -1 ? -1 : pick(0, 80);
    p.window.right = pick(-1, 3) == -1 ? -1 : pick(0, 80);
    p.window.align = pick(0, 1) ? attn::Align::bottom_right : attn::Align::top_left;
  }
  return p;
}

TEST(CudaSchedule, KeyIntervalAgreesWithTheCpu) {
  std::mt19937 rng(2901);
  for (int iter = 0; iter < 3000; ++iter) {
    const attn::core::Problem p = random_problem(rng);
    const Masks m = masks_of(p);
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const attn::core::KeyRange want = attn::core::key_range(p, b, i);
        const KeyInterval got = key_interval(m, p.kv_len[static_cast<std::size_t>(b)], i);
        ASSERT_EQ(got.lo, want.lo) << "iteration " << iter << " b " << b << " row " << i;
        ASSERT_EQ(got.hi, want.hi) << "iteration " << iter << " b " << b << " row " << i;
      }
  }
}

// Every key tile a row of the block needs lies in [first, end); inside the range, the tiles of
// [full_first, full_end) are exactly those every row allows whole. For blocks whose rows are all non-empty,
// the first and last tiles are needed (the range is tight).
TEST(CudaSchedule, KeyTilesAgainstBruteForce) {
  std::mt19937 rng(2902);
  for (int iter = 0; iter < 500; ++iter) {
    const attn::core::Problem p = random_problem(rng);
    const Masks m = masks_of(p);
    for (std::int64_t block_m : {16, 64, 128})
      for (std::int64_t block_n : {16, 64, 128})
        for (std::int64_t b = 0; b < p.B; ++b) {
          const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)];
          for (std::int64_t q0 = 0; q0 < p.Sq; q0 += block_m) {
            const TileRange t = key_tiles(m, len, q0, q0 + block_m, block_n);
            const std::int64_t q1 = std::min(q0 + block_m, p.Sq);
            ASSERT_TRUE(t.first <= t.full_first && t.full_first <= t.full_end && t.full_end <= t.end);
            const std::int64_t tiles = ceil_div(std::max<std::int64_t>(len, 1), block_n) + 1;
            bool all_rows_nonempty = true;
            for (std::int64_t i = q0; i < q1; ++i) {
              const KeyInterval r = key_interval(m, len, i);
              if (r.hi <= r.lo) all_rows_nonempty = false;
            }
            std::int64_t first_needed = -1, last_needed = -1;
            for (std::int64_t tile = 0; tile < tiles; ++tile) {
              bool any = false, whole = true;
              for (std::int64_t i = q0; i < q1; ++i)
                for (std::int64_t j = tile * block_n; j < (tile + 1) * block_n; ++j) {
                  const bool ok = j < len && key_allowed(m, len, i, j);
                  any = any || ok;
                  whole = whole && ok;
                }
              if (any) {
                if (first_needed < 0) first_needed = tile;
                last_needed = tile;
                ASSERT_TRUE(tile >= t.first && tile < t.end)
                    << "iteration " << iter << ": needed tile " << tile << " outside [" << t.first << ", " << t.end
                    << ")";
              }
              // Inside the range, a tile skips the per-element mask exactly when every row allows all of it.
              if (tile >= t.first && tile < t.end) {
                ASSERT_EQ(whole, !t.masked(tile)) << "iteration " << iter << ": tile " << tile;
              }
            }
            if (all_rows_nonempty && first_needed >= 0) {
              EXPECT_EQ(t.first, first_needed) << "iteration " << iter;
              EXPECT_EQ(t.end, last_needed + 1) << "iteration " << iter;
            }
          }
        }
  }
}

TEST(CudaSchedule, GridMapIsABijection) {
  std::mt19937 rng(2903);
  for (int iter = 0; iter < 200; ++iter) {
    const std::int64_t B = 1 + rng() % 4, Hq = 1 + rng() % 6, Sq = 1 + rng() % 500, bm = (rng() % 2) ? 64 : 128;
    const std::int64_t n = grid_blocks(B, Hq, Sq, bm);
    ASSERT_EQ(n, B * Hq * ((Sq + bm - 1) / bm));
    std::vector<char> seen(static_cast<std::size_t>(n), 0);
    for (std::int64_t l = 0; l < n; ++l) {
      const BlockWork w = block_work(l, Hq, Sq, bm);
      ASSERT_TRUE(w.b < B && w.h < Hq && w.qblock * bm < Sq);
      ASSERT_EQ(block_linear(w, Hq, Sq, bm), l);
      if (l > 0) {  // query blocks fastest
        const BlockWork prev = block_work(l - 1, Hq, Sq, bm);
        ASSERT_TRUE(w.qblock == prev.qblock + 1 || (w.qblock == 0 && (w.h == prev.h + 1 || w.b == prev.b + 1)));
      }
    }
  }
}

TEST(CudaSchedule, GqaHeadMap) {
  for (std::int64_t Hkv : {1, 2, 3, 8})
    for (std::int64_t group : {1, 2, 4, 7}) {
      const std::int64_t Hq = Hkv * group;
      for (std::int64_t h = 0; h < Hq; ++h) {
        EXPECT_EQ(kv_head(h, group), h / (Hq / Hkv));
        EXPECT_LT(kv_head(h, group), Hkv);
      }
    }
}

// Strided and paged row offsets against the CPU's kv_row_offset.
TEST(CudaSchedule, KvRowOffsetAgreesWithTheCpu) {
  std::mt19937 rng(2904);
  for (int iter = 0; iter < 300; ++iter) {
    attn::core::Problem p;
    p.B = 1 + rng() % 4;
    p.Hkv = 1 + rng() % 4;
    p.Skv = 1 + rng() % 200;
    p.Dk = 8 * (1 + rng() % 16);
    attn::core::Strided t;
    KvLayout k;
    std::vector<std::int32_t> table;
    const bool paged = rng() % 2;
    if (paged) {
      attn::core::Paged pg;
      pg.page_size = 1 + rng() % 33;
      const std::int64_t per_seq = (p.Skv + pg.page_size - 1) / pg.page_size;
      pg.pages = p.B * per_seq + rng() % 5;
      table.resize(static_cast<std::size_t>(p.B * per_seq));
      for (auto& e : table) e = static_cast<std::int32_t>(rng() % pg.pages);
      const bool transposed = rng() % 2;  // the table's own strides, either way round
      pg.table = table.data();
      pg.table_stride[0] = transposed ? 1 : per_seq;
      pg.table_stride[1] = transposed ? p.B : 1;
      p.paged = pg;
      t.stride[3] = 1;
      t.stride[2] = p.Dk + rng() % 3;
      t.stride[1] = t.stride[2] * pg.page_size;
      t.stride[0] = t.stride[1] * p.Hkv;
      k.table = pg.table;
      k.table_stride0 = pg.table_stride[0];
      k.table_stride1 = pg.table_stride[1];
      k.page_size = pg.page_size;
    } else {
      t.stride[3] = 1;
      t.stride[1] = p.Dk;  // [B, S, H, D] layout: heads inner
      t.stride[2] = p.Dk * p.Hkv;
      t.stride[0] = t.stride[2] * p.Skv;
    }
    for (int d = 0; d < 4; ++d) k.stride[d] = t.stride[d];
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t hk = 0; hk < p.Hkv; ++hk)
        for (std::int64_t j = 0; j < p.Skv; ++j)
          ASSERT_EQ(kv_row_offset(k, b, hk, j), attn::core::kv_row_offset(p, t, b, hk, j))
              << "iteration " << iter << (paged ? " paged" : " strided");
  }
}

// The functions are constexpr: a kernel can size its loops from them at compile time.
static_assert(key_interval(Masks{100, CausalMode::bottom_right, -1, -1, true}, 80, 30).hi == 11);
static_assert(key_tiles(Masks{128, CausalMode::top_left, -1, -1, true}, 128, 64, 128, 64).full_end == 1);

// Split-KV: the parts of a block's key tiles cover its range exactly once, in order, each of at most
// ceil(count / splits) tiles (empty ones at the end), and keep the range's masked() answers; the heuristic splits
// only a grid that leaves the GPU idle, into parts of at least min_tiles, never more than max_splits.
TEST(CudaSchedule, SplitTilesCoverTheRangeOnce) {
  for (const TileRange whole : {TileRange{0, 0, 0, 0}, TileRange{0, 1, 0, 1}, TileRange{3, 17, 5, 16},
                                TileRange{0, 512, 0, 512}, TileRange{7, 8, 8, 8}})
    for (i64 splits = 1; splits <= 70; ++splits) {
      i64 next = whole.first;
      const i64 per = splits <= 1 ? whole.count() : ceil_div(whole.count(), splits);
      for (i64 s = 0; s < splits; ++s) {
        const TileRange part = split_tiles(whole, s, splits);
        EXPECT_EQ(part.first, std::min(next, whole.end)) << splits << " " << s;
        EXPECT_LE(part.count(), per);
        EXPECT_GE(part.count(), 0);
        for (i64 t = part.first; t < part.end; ++t) EXPECT_EQ(part.masked(t), whole.masked(t));
        next = std::max(next, part.end);
      }
      EXPECT_EQ(next, whole.end) << splits;
    }
}

TEST(CudaSchedule, KvSplitsOnlyWhereTheGridLeavesTheGpuIdle) {
  EXPECT_EQ(kv_splits(512, 64, 264), 1);   // a 64-sequence decode fills an H100 already
  EXPECT_EQ(kv_splits(8, 512, 264), 66);   // one sequence, 8 KV heads, 32k keys: about two waves
  EXPECT_EQ(kv_splits(8, 12, 264), 3);     // short keys: parts of at least 4 tiles
  EXPECT_EQ(kv_splits(8, 3, 264), 1);      // too short to split
  EXPECT_EQ(kv_splits(1, 100000, 264), 128);  // at most max_splits
  EXPECT_EQ(kv_splits(0, 100, 264), 1);
  for (i64 blocks = 1; blocks < 600; blocks += 7)
    for (i64 tiles = 1; tiles < 2000; tiles += 37) {
      const i64 s = kv_splits(blocks, tiles, 264);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, 128);
      if (s > 1) EXPECT_GE(tiles / s, 4 - 1) << blocks << " " << tiles;  // parts of about min_tiles or more
      if (blocks >= 264) EXPECT_EQ(s, 1);
    }
}

}  // namespace

// GQA packing: every (query head, row) of every KV head lies in exactly one block's rows; a block past Sq = 64
// holds one head only, and a decode step's group shares one block.
TEST(CudaSchedule, PackedRowsCoverEveryRowOnce) {
  constexpr i64 kM = 64;
  for (i64 group : {1, 2, 4, 7, 16})
    for (i64 Sq : {1, 3, 7, 63, 64, 65, 113, 200}) {
      const i64 Hkv = 3, B = 2, Sr = packed_rows_per_head(Sq, kM);
      std::vector<int> seen(static_cast<std::size_t>(B * Hkv * group * Sq), 0);
      const i64 blocks = packed_grid_blocks(B, Hkv, group, Sq, kM);
      for (i64 id = 0; id < blocks; ++id) {
        const PackedWork w = packed_work(id, Hkv, group, Sq, kM);
        i64 first_head = -1;
        bool straddles = false;
        for (i64 r = 0; r < kM; ++r) {
          const PackedRow pr = packed_row(w.rblock * kM + r, w.hk, group, Sq, Sr);
          if (!pr.valid) continue;
          ASSERT_EQ(kv_head(pr.h, group), w.hk);
          ASSERT_LT(pr.i, Sq);
          ++seen[static_cast<std::size_t>(((w.b * Hkv * group) + pr.h) * Sq + pr.i)];
          if (first_head < 0) first_head = pr.h;
          straddles |= pr.h != first_head;
        }
        if (Sq >= kM) EXPECT_FALSE(straddles) << "group " << group << ", Sq " << Sq << ", block " << id;
      }
      for (int n : seen) ASSERT_EQ(n, 1) << "group " << group << ", Sq " << Sq;
      if (Sq * group <= kM) EXPECT_EQ(blocks, B * Hkv);
    }
}
