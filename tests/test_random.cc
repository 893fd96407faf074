// Randomized differential tests: thousands of random configurations (tests/random_cases.h) against the fp64
// reference under the tolerance rule, forward and backward, at every instruction-set level and thread count
// the draws pick. Environment:
//   ATTN_RANDOM_SEED=<n>          base seed (default fixed, so `make test` is reproducible; `make soak` draws one)
//   ATTN_RANDOM_COUNT=<n>         forward configurations (default 3000), split over the Forward/* shards
//   ATTN_RANDOM_BACKWARD_COUNT=<n> backward configurations (default 300)
//   ATTN_RANDOM_CONFIG=<seed>     run only the configuration of this seed (as printed with a failure)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/backward_problem.h"
#include "random_cases.h"

namespace attn::test {
namespace {

constexpr int kShards = 8;

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::strtoull(s, nullptr, 10) : fallback;
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The seeds of shard `shard` of a run of `count` configurations (or the one seed of ATTN_RANDOM_CONFIG).
std::vector<std::uint64_t> shard_seeds(int shard, std::uint64_t count, std::uint64_t salt) {
  if (const std::uint64_t one = env_u64("ATTN_RANDOM_CONFIG", 0)) return shard == 0 ? std::vector{one} : std::vector<std::uint64_t>{};
  const std::uint64_t base = env_u64("ATTN_RANDOM_SEED", 20261123);
  std::vector<std::uint64_t> seeds;
  for (std::uint64_t n = static_cast<std::uint64_t>(shard); n < count; n += kShards) seeds.push_back(splitmix(base ^ salt ^ splitmix(n)));
  return seeds;
}

// "" when the configuration passes, else what failed.
std::string check_forward(const RandomConfig& rc) {
  Instance in = instantiate_random(rc);
  core::Problem prob;
  if (Status s = core::validate(in.q.view, in.k.view, in.v.view, in.out.view, in.params, in.lse.view, &prob); !s)
    return "validate: " + s.message();
  const reference::Result ref = reference::attention<double>(prob);
  const reference::Result naive = reference::attention<float>(prob);
  in.out.poison();
  in.lse.poison();
  const std::vector<unsigned char> poisoned = in.out.storage;
  {
    ForceIsa force(supported_isas()[static_cast<std::size_t>(rc.isa)]);
    if (Status s = in.run(Backend::flash, rc.threads, rc.with_lse); !s) return "run: " + s.message();
  }
  if (!untouched_outside(in.out, poisoned)) return "bytes outside the output view were written";
  const std::vector<double> out = values(in.out);
  const Agreement o = agree(ref.out, [&](std::size_t i) { return out[i]; },
                            [&](std::size_t i) { return round_to(rc.shape.dtype, naive.out[i]); },
                            forward_atol(rc.shape.dtype, ref, max_abs_finite(in.v)));
  std::string failure;
  if (!o.ok()) failure += "out: " + o.describe() + "; ";
  if (rc.with_lse) {
    std::vector<double> lse;
    in.lse.for_each_index([&](auto b, auto h, auto i, auto) { lse.push_back(in.lse.get(b, h, i)); });
    const Agreement l = agree(ref.lse, [&](std::size_t i) { return lse[i]; },
                              [&](std::size_t i) { return naive.lse[i]; },
                              lse_atol(ref), /*exact_inf=*/true);
    if (!l.ok()) failure += "lse: " + l.describe();
  }
  return failure;
}

std::string check_backward(const RandomConfig& rc) {
  Instance in = instantiate_random(rc);
  GradInstance g = instantiate_grads(rc.shape);
  if (rc.special_where == SpecialWhere::dout) {
    std::mt19937_64 rng(rc.seed + 7);
    Tensor& t = g.dout;
    if (rc.special != Special::none && t.view.numel() > 0) {
      std::int64_t idx[4];
      for (int i = 0; i < 4; ++i) idx[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(t.view.shape[i]));
      const double x = rc.special == Special::nan ? NAN : rc.special == Special::pos_inf ? INFINITY
                       : rc.special == Special::neg_inf ? -INFINITY : 1e-40;
      t.set(x, idx[0], idx[1], idx[2], idx[3]);
    }
  }
  const cpu::Isa isa = supported_isas()[static_cast<std::size_t>(rc.isa)];
  ForceIsa force(isa);
  Params p = in.params;
  p.backend = Backend::flash;
  p.threads = rc.threads;
  if (Status s = attention(in.q.view, in.k.view, in.v.view, in.out.view, p, in.lse.view); !s)
    return "forward: " + s.message();
  core::BackwardProblem bp;
  if (Status s = core::validate_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view,
                                         g.dq.view, g.dk.view, g.dv.view, in.params, std::nullopt, &bp);
      !s)
    return "validate_backward: " + s.message();
  const reference::Grads ref = reference::attention_backward<double>(bp.fwd, bp.dout);
  const reference::Grads naive = reference::attention_backward<float>(bp.fwd, bp.dout);
  g.dq.poison(), g.dk.poison(), g.dv.poison();
  const std::vector<unsigned char> pq = g.dq.storage, pk = g.dk.storage, pv = g.dv.storage;
  const bool sinks = !g.dsinks.storage.empty();
  if (Status s = attention_backward(in.q.view, in.k.view, in.v.view, in.out.view, in.lse.view, g.dout.view, g.dq.view,
                                    g.dk.view, g.dv.view, p,
                                    sinks ? std::optional<TensorView>(g.dsinks.view) : std::nullopt);
      !s)
    return "backward: " + s.message();
  if (!untouched_outside(g.dq, pq) || !untouched_outside(g.dk, pk) || !untouched_outside(g.dv, pv))
    return "bytes outside a gradient view were written";
  return gradient_failures(rc.shape, in, g, bp.fwd.scale, ref, naive);
}

class RandomForward : public ::testing::TestWithParam<int> {};

TEST_P(RandomForward, MatchesFp64Reference) {
  const std::vector<std::uint64_t> seeds = shard_seeds(GetParam(), env_u64("ATTN_RANDOM_COUNT", 3000), 0);
  int failures = 0;
  for (std::uint64_t seed : seeds) {
    const RandomConfig rc = random_config(seed, /*backward=*/false);
    if (std::getenv("ATTN_RANDOM_TRACE")) fprintf(stderr, "%s\n", rc.describe().c_str());
    const std::string f = check_forward(rc);
    if (!f.empty() && ++failures <= 20)
      ADD_FAILURE() << rc.describe() << "\n  " << f << "\n  replay: ATTN_RANDOM_CONFIG=" << seed
                    << " build/tests/test_random --gtest_filter='*Forward*'";
  }
  EXPECT_EQ(failures, 0) << "of " << seeds.size() << " configurations";
}

class RandomBackward : public ::testing::TestWithParam<int> {};

TEST_P(RandomBackward, MatchesFp64Reference) {
  const std::vector<std::uint64_t> seeds = shard_seeds(GetParam(), env_u64("ATTN_RANDOM_BACKWARD_COUNT", 300), 0xB4C4);
  int failures = 0;
  for (std::uint64_t seed : seeds) {
    const RandomConfig rc = random_config(seed, /*backward=*/true);
    const std::string f = check_backward(rc);
    if (!f.empty() && ++failures <= 20)
      ADD_FAILURE() << rc.describe() << "\n  " << f << "\n  replay: ATTN_RANDOM_CONFIG=" << seed
                    << " build/tests/test_random --gtest_filter='*Backward*'";
  }
  EXPECT_EQ(failures, 0) << "of " << seeds.size() << " configurations";
}

INSTANTIATE_TEST_SUITE_P(Shards, RandomForward, ::testing::Range(0, kShards));
INSTANTIATE_TEST_SUITE_P(Shards, RandomBackward, ::testing::Range(0, kShards));

}  // namespace
}  // namespace attn::test
