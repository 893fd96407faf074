// The AMX kernel's logic on any machine with AVX-512 BF16: src/cpu/flash_amx.cc compiled into this test with its
// tile instructions emulated in software (src/cpu/amx_emulate.h), run on every bf16 case of the registry and on
// random bf16 configurations, against the fp64 reference under the tolerance rule. (Where the CPU has AMX the
// real kernel runs in test_attention and test_random at the amx level as well.)
#include <gtest/gtest.h>

#include "cpu/cpu_features.h"
#include "random_cases.h"

namespace attn::cpu::amx_emulated {
FlashFn flash_kernel(const core::Problem& problem);
}

namespace attn::test {
namespace {

bool has_avx512bf16() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_bf16 && f.os_avx512;
}

// "" when the emulated AMX kernel agrees with the fp64 reference on this instance, else what failed.
std::string check(Instance& in, int threads, bool with_lse) {
  core::Problem prob;
  const std::optional<TensorView> lse = with_lse ? std::optional<TensorView>(in.lse.view) : std::nullopt;
  Params params = in.params;
  params.threads = threads;
  if (Status s = core::validate(in.q.view, in.k.view, in.v.view, in.out.view, params, lse, &prob); !s)
    return "validate: " + s.message();
  const cpu::FlashFn kernel = cpu::amx_emulated::flash_kernel(prob);
  if (!kernel) return "no kernel";
  const reference::Result ref = reference::attention<double>(prob);
  const reference::Result naive = reference::attention<float>(prob);
  in.out.poison();
  in.lse.poison();
  kernel(prob, threads);
  std::vector<double> out, l;
  in.out.for_each_index([&](auto b, auto h, auto i, auto d) { out.push_back(in.out.get(b, h, i, d)); });
  const Agreement o = agree(ref.out, [&](std::size_t i) { return out[i]; },
                            [&](std::size_t i) { return round_to(DType::bf16, naive.out[i]); },
                            forward_atol(DType::bf16, ref, max_abs_finite(in.v)));
  std::string failure = o.ok() ? "" : "out: " + o.describe() + "; ";
  if (with_lse) {
    in.lse.for_each_index([&](auto b, auto h, auto i, auto) { l.push_back(in.lse.get(b, h, i)); });
    double max_lse = 1;
    for (double x : ref.lse)
      if (std::isfinite(x)) max_lse = std::max(max_lse, std::fabs(x));
    const Agreement a = agree(ref.lse, [&](std::size_t i) { return l[i]; }, [&](std::size_t i) { return naive.lse[i]; },
                              8 * std::ldexp(1.0, -24) * max_lse, /*exact_inf=*/true);
    if (!a.ok()) failure += "lse: " + a.describe();
  }
  return failure;
}

std::vector<Case> bf16_cases() {
  std::vector<Case> out;
  for (const Case& c : registry())
    if (c.dtype == DType::bf16 && c.kv_dtype == DType::bf16) out.push_back(c);
  return out;
}

class AmxEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(AmxEmulated, MatchesFp64Reference) {
  ATTN_SKIP_UNLESS_SAMPLED();
  if (!has_avx512bf16()) GTEST_SKIP() << "the AMX kernel's vector parts need AVX-512 BF16";
  Instance in = instantiate(GetParam());
  for (bool with_lse : {true, false}) {
    const std::string f = check(in, 2, with_lse);
    EXPECT_TRUE(f.empty()) << (with_lse ? "" : "(no LSE) ") << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, AmxEmulated, ::testing::ValuesIn(bf16_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

// Random bf16 configurations (every mask, value range and special value of tests/random_cases.h).
TEST(AmxEmulatedRandom, MatchesFp64Reference) {
  if (!has_avx512bf16()) GTEST_SKIP() << "the AMX kernel's vector parts need AVX-512 BF16";
  int failures = 0, runs = 0;
  for (std::uint64_t n = 0; runs < 400; ++n) {
    RandomConfig rc = random_config(0xA3C5 + n * 7919, /*backward=*/false);
    if (rc.shape.page_size) continue;
    rc.shape.dtype = rc.shape.kv_dtype = DType::bf16;
    ++runs;
    Instance in = instantiate_random(rc);
    const std::string f = check(in, rc.threads, rc.with_lse);
    if (!f.empty() && ++failures <= 10) ADD_FAILURE() << rc.describe() << "\n  " << f;
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace attn::test
