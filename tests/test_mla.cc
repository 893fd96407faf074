// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) in its absorbed form, through attn's views: one latent
// cache row per token, [c_kv (512) ; k_rope (64)] (Dk = 576), V the first 512 columns of the same rows (Dv = 512, a
// view into K's memory, no copy), many query heads on the one latent head (Hkv = 1). Contiguous and paged caches,
// decode (Sq = 1) and speculative multi-token decode (Sq = 4, causal bottom-right), f32 and bf16, every
// instruction-set level, against the fp64 reference by the tolerance rule, outputs NaN-poisoned. The head dims here
// are scaled down (Dk = 72 = 64 + 8, Dv = 64) to keep the reference cheap; one case has the real 576 / 512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "core/problem.h"
#include "core/views.h"
#include "reference/reference.h"
#include "support.h"

namespace {

using namespace attn;
using i64 = std::int64_t;

struct MlaCase {
  i64 B, Hq, Sq, Skv, Dk, Dv, page;  // page 0: contiguous cache
  DType dtype;
  std::string name() const {
    return "B" + std::to_string(B) + "_H" + std::to_string(Hq) + "_q" + std::to_string(Sq) + "_k" + std::to_string(Skv) +
           "_d" + std::to_string(Dk) + "x" + std::to_string(Dv) + (page ? "_page" + std::to_string(page) : "") + "_" +
           dtype_name(dtype);
  }
};

class Mla : public ::testing::TestWithParam<MlaCase> {};

TEST_P(Mla, LatentCacheWithVAViewIntoKMatchesFp64Reference) {
  const MlaCase& c = GetParam();
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const std::size_t es = dtype_size(c.dtype);
  // The latent cache: contiguous [B, 1, Skv, Dk], or a pool of pages [P, 1, page, Dk] with shuffled tables.
  const i64 per_seq = c.page ? (c.Skv + c.page - 1) / c.page : 0, pages = c.B * per_seq;
  const i64 rows = c.page ? pages * c.page : c.B * c.Skv;
  std::vector<unsigned char> cache(static_cast<std::size_t>(rows * c.Dk) * es), q(static_cast<std::size_t>(c.B * c.Hq * c.Sq * c.Dk) * es),
      out(static_cast<std::size_t>(c.B * c.Hq * c.Sq * c.Dv) * es);
  const TensorView flat_cache = TensorView::contiguous(cache.data(), c.dtype, {rows * c.Dk});
  for (i64 e = 0; e < rows * c.Dk; ++e) core::store_float(flat_cache, e, u(rng));
  const TensorView tq = TensorView::contiguous(q.data(), c.dtype, {c.B, c.Hq, c.Sq, c.Dk});
  for (i64 e = 0; e < tq.numel(); ++e) core::store_float(tq, e, u(rng));
  std::vector<std::int32_t> table(static_cast<std::size_t>(std::max<i64>(pages, 1)));
  for (i64 n = 0; n < pages; ++n) table[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 7 + 3) % pages);
  std::vector<std::int32_t> lens(static_cast<std::size_t>(c.B));
  for (i64 b = 0; b < c.B; ++b) lens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(c.Skv - (b * 5) % std::max<i64>(c.Skv - c.Sq, 1));
  const i64 outer = c.page ? c.page : c.Skv;  // rows per leading index (page or sequence)
  TensorView k = TensorView::contiguous(cache.data(), c.dtype, {c.page ? pages : c.B, 1, outer, c.Dk});
  TensorView v = k;  // the first Dv columns of the same rows
  v.shape[3] = c.Dv;
  const TensorView tout = TensorView::contiguous(out.data(), c.dtype, {c.B, c.Hq, c.Sq, c.Dv});
  std::vector<float> lse(static_cast<std::size_t>(c.B * c.Hq * c.Sq));
  const TensorView tlse = TensorView::contiguous(lse.data(), DType::f32, {c.B, c.Hq, c.Sq});
  Params p;
  p.causal = c.Sq > 1 ? Causal::bottom_right : Causal::none;
  p.scale = 1.0 / std::sqrt(192.0);  // DeepSeek's softmax scale is that of the unabsorbed head dim (128 + 64)
  const TensorView ttable = TensorView::contiguous(table.data(), DType::i32, {c.B, std::max<i64>(per_seq, 1)});
  const TensorView tlens = TensorView::contiguous(lens.data(), DType::i32, {c.B});
  if (!c.page) p.kv_lens = tlens;
  const auto run = [&](const Params& params) {
    for (i64 e = 0; e < tout.numel(); ++e) core::store_float(tout, e, std::numeric_limits<float>::quiet_NaN());
    std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
    return c.page ? attention_paged(tq, k, v, ttable, tlens, tout, params, tlse) : attention(tq, k, v, tout, params, tlse);
  };
  core::Problem rp;
  const Status valid = c.page ? core::validate_paged(tq, k, v, ttable, tlens, tout, p, tlse, &rp)
                              : core::validate(tq, k, v, tout, p, tlse, &rp);
  ASSERT_TRUE(valid.ok()) << valid.message();
  const reference::Result ref = reference::attention<double>(rp), naive = reference::attention<float>(rp);
  double err_naive = 0, scale = 0;
  for (std::size_t e = 0; e < ref.out.size(); ++e)
    err_naive = std::max(err_naive, std::fabs(naive.out[e] - ref.out[e])), scale = std::max(scale, std::fabs(ref.out[e]));
  const double ulp = c.dtype == DType::bf16 ? 0x1p-8 : 0x1p-24;
  for (cpu::Isa isa : test::supported_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    test::ForceIsa force(isa);
    const Status s = run(p);
    ASSERT_TRUE(s.ok()) << s.message();
    double err = 0;
    for (std::size_t e = 0; e < ref.out.size(); ++e) {
      const double got = core::float_at(tout, static_cast<i64>(e));
      ASSERT_FALSE(std::isnan(got)) << "element " << e;
      err = std::max(err, std::fabs(got - ref.out[e]));
    }
    EXPECT_LE(err, 2 * err_naive + ulp * scale + 1e-6) << "naive " << err_naive;
    for (std::size_t r = 0; r < ref.lse.size(); ++r)
      EXPECT_NEAR(lse[r], ref.lse[r], 2 * std::fabs(naive.lse[r] - ref.lse[r]) + 1e-5 * (1 + std::fabs(ref.lse[r])));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Mla,
    ::testing::Values(MlaCase{2, 16, 1, 203, 72, 64, 0, DType::f32}, MlaCase{2, 16, 1, 203, 72, 64, 0, DType::bf16},
                      MlaCase{3, 32, 4, 113, 72, 64, 16, DType::bf16}, MlaCase{1, 128, 1, 65, 72, 64, 1, DType::f32},
                      MlaCase{2, 16, 4, 77, 72, 64, 0, DType::f32}, MlaCase{1, 16, 1, 129, 576, 512, 64, DType::bf16}),
    [](const ::testing::TestParamInfo<MlaCase>& i) { return i.param.name(); });

}  // namespace
