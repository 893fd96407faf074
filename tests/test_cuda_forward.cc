// attn's own CUDA forward kernel, run on the host: the block program of src/cuda/forward_block.h (the device
// kernel's code, unchanged) through the host model of a warp (src/cuda/warp.h: mma.sync and ldmatrix implemented
// from the PTX layouts of src/cuda/fragment.h), warp by warp between the block's barriers, on every registry case
// the kernel takes, against the fp64 reference by the tolerance rule, outputs poisoned with NaN first.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cases.h"
#include "core/problem.h"
#include "cuda/forward.h"
#include "cuda/warp.h"
#include "reference/reference.h"
#include "support.h"

namespace {

using namespace attn;
using namespace attn::test;  // NOLINT
using attn::cuda::HostWarp;

// The grid of the kernel launch (cuda/forward.cu), block after block, its four warps in turn; each barrier of the
// kernel is the end of a loop over the warps here. Shared memory starts as NaN (0xffff in bf16 and f16), so a
// fragment read before it is written shows.
Status run_host_model(const core::Problem& p) {
  if (Status s = cuda::fwd::supports(p); !s) return s;
  const cuda::DeviceProblem dp = cuda::device_problem(p, p.kv_len.data());
  cuda::fwd::with_config(p, [&](auto cfg, auto variant) {
    using C = decltype(cfg);
    using Block = cuda::fwd::ForwardBlock<C, decltype(variant), HostWarp>;
    std::vector<std::uint16_t> smem(C::kSmemElems, 0xffff);
    const HostWarp w(smem.data(), smem.size() * sizeof(std::uint16_t));
    std::vector<typename Block::Warp> warps(C::kWarps);
    const std::int64_t blocks = cuda::sched::grid_blocks(p.B, p.Hq, p.Sq, C::kBlockM);
    for (std::int64_t id = 0; id < blocks; ++id) {
      const Block block(dp, smem.data(), id);
      for (int wi = 0; wi < C::kWarps; ++wi) block.begin(w, wi, warps[wi]);
      const cuda::sched::TileRange tiles = block.tiles();
      for (std::int64_t t = tiles.first; t < tiles.end; ++t) {
        for (int wi = 0; wi < C::kWarps; ++wi) block.load_kv(w, wi, t);
        for (int wi = 0; wi < C::kWarps; ++wi) block.compute(w, wi, warps[wi], t, tiles.masked(t));
      }
      for (int wi = 0; wi < C::kWarps; ++wi) block.finish(w, wi, warps[wi]);
    }
  });
  return Status::Ok();
}

bool gpu_dtypes(const Case& c) {
  return (c.dtype == DType::bf16 || c.dtype == DType::f16) && c.kv_dtype == c.dtype && c.Dk <= 256 && c.Dv <= 256;
}

std::vector<Case> gpu_cases() {
  std::vector<Case> out;
  for (const Case& c : registry())
    if (gpu_dtypes(c)) out.push_back(c);
  return out;
}

class CudaForwardModel : public ::testing::TestWithParam<Case> {};

TEST_P(CudaForwardModel, MatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  const Case& c = GetParam();
  Instance in = instantiate(c);
  core::Problem p;
  ASSERT_TRUE(in.problem(Backend::flash, 1, true, &p).ok());
  const reference::Result ref = reference::attention<double>(p);
  const reference::Result naive = reference::attention<float>(p);
  in.out.poison();
  in.lse.poison();
  const std::vector<unsigned char> poisoned = in.out.storage;
  ASSERT_TRUE(cuda::fwd::supports(p).ok()) << cuda::fwd::supports(p).message();
  SCOPED_TRACE(cuda::fwd::kernel_name(p));
  const Status s = run_host_model(p);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::vector<bool> covered = covered_bytes(in.out);
  for (std::size_t i = 0; i < covered.size(); ++i)
    if (!covered[i]) {
      ASSERT_EQ(in.out.storage[i], poisoned[i]) << "byte " << i << " outside the output view was written";
    }
  std::vector<double> out, lse;
  in.out.for_each_index([&](auto b, auto h, auto i, auto d) { out.push_back(in.out.get(b, h, i, d)); });
  in.lse.for_each_index([&](auto b, auto h, auto i, auto) { lse.push_back(in.lse.get(b, h, i)); });
  const Agreement o = agree(ref.out, [&](std::size_t i) { return out[i]; },
                            [&](std::size_t i) { return round_to(c.dtype, naive.out[i]); },
                            forward_atol(c.dtype, ref, in.max_abs_v()));
  EXPECT_TRUE(o.ok()) << "out: " << o.describe();
  const Agreement l = agree(ref.lse, [&](std::size_t i) { return lse[i]; }, [&](std::size_t i) { return naive.lse[i]; },
                            lse_atol(ref), /*exact_inf=*/true);
  EXPECT_TRUE(l.ok()) << "lse: " << l.describe();
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaForwardModel, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// Every kind of registry case the CPU takes in bf16/f16 is among them: masks, windows, variants, paging, GQA.
TEST(CudaForwardModel, CoversTheRegistrysKinds) {
  const std::vector<Case> cases = gpu_cases();
  bool paged = false, additive = false, keep = false, window = false, softcap = false, alibi = false, sinks = false,
       dropout = false, gqa = false, lens = false, d256 = false, f16 = false;
  for (const Case& c : cases) {
    paged |= c.page_size > 0, window |= c.window.left >= 0 || c.window.right >= 0;
    additive |= c.mask == MaskCase::additive_full || c.mask == MaskCase::additive_2d;
    keep |= c.mask == MaskCase::keep_per_batch || c.mask == MaskCase::keep_keys;
    softcap |= c.softcap > 0, alibi |= c.alibi > 0, sinks |= c.sinks, dropout |= c.dropout > 0;
    gqa |= c.Hq != c.Hkv, lens |= c.kv_lens, d256 |= c.Dk > 128, f16 |= c.dtype == DType::f16;
  }
  EXPECT_GT(cases.size(), 100u);
  EXPECT_TRUE(paged && additive && keep && window && softcap && alibi && sinks && dropout && gqa && lens && d256 && f16);
}

// What the kernel refuses, by name.
TEST(CudaForwardModel, RefusesWhatItDoesNotTake) {
  Case c;
  c.B = 1, c.Hq = 2, c.Hkv = 1, c.Sq = 7, c.Skv = 9, c.Dk = 64, c.Dv = 64;
  Instance f32 = instantiate(c);
  core::Problem p;
  ASSERT_TRUE(f32.problem(Backend::flash, 1, true, &p).ok());
  const Status s = cuda::fwd::supports(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expected bf16 or f16"), std::string::npos) << s.message();
  c.dtype = c.kv_dtype = DType::bf16;
  c.Dk = c.Dv = 320;
  Instance wide = instantiate(c);
  ASSERT_TRUE(wide.problem(Backend::flash, 1, true, &p).ok());
  EXPECT_NE(cuda::fwd::supports(p).message().find("at most 256"), std::string::npos);
  c.Dk = 96, c.Dv = 40;
  Instance ok = instantiate(c);
  ASSERT_TRUE(ok.problem(Backend::flash, 1, true, &p).ok());
  EXPECT_TRUE(cuda::fwd::supports(p).ok());
  EXPECT_EQ(cuda::fwd::kernel_name(p), "flash forward (tensor cores, bf16, d128, plain)");
}

}  // namespace
