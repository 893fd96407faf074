// Attention dropout (attn::Params::dropout_p): the generator against its published vectors, the mask each kernel
// draws against the reference's (exactly: V = I makes out the dropped weights themselves), and the mask's
// statistics (drop rate within a binomial bound, each row's expected weight sum 1 preserved). The registry's
// dropout cases check values and gradients under the tolerance rule (test_attention, test_backward).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "cases.h"
#include "core/dropout.h"

namespace attn::test {
namespace {

// Random123's known-answer vectors for Philox4x32-10 (its kat_vectors file): counter, key, result.
struct Kat {
  std::array<std::uint32_t, 4> ctr;
  std::array<std::uint32_t, 2> key;
  std::array<std::uint32_t, 4> out;
};
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Dropout, PhiloxMatchesThePublishedVectors) {
  for (const Kat& k : kKats) {
    EXPECT_EQ(core::philox4x32_10(k.ctr, k.key), k.out);
    EXPECT_EQ(reference::philox4x32_10(k.ctr, k.key[0], k.key[1]), k.out);
  }
}

// Queries and keys random, V = I (Dv = Skv, v_j = e_j): out[i][j] = z_ij · P_ij, so the output shows the mask.
struct MaskProbe {
  std::int64_t B = 2, Hq = 4, Hkv = 2, Sq = 37, Skv = 203;
  Tensor q, k, v, out;
  Params params;
  MaskProbe(std::int64_t sq, std::int64_t skv, double p, std::uint64_t seed) : Sq(sq), Skv(skv) {
    q = Tensor(DType::f32, B, Hq, Sq, 32);
    k = Tensor(DType::f32, B, Hkv, Skv, 32);
    v = Tensor(DType::f32, B, Hkv, Skv, Skv);
    out = Tensor(DType::f32, B, Hq, Sq, Skv);
    std::mt19937_64 rng(seed ^ 0x5eed);
    std::uniform_real_distribution<double> u(-1, 1);
    q.for_each_index([&](auto a, auto b, auto c, auto d) { q.set(u(rng), a, b, c, d); });
    k.for_each_index([&](auto a, auto b, auto c, auto d) { k.set(u(rng), a, b, c, d); });
    v.for_each_index([&](auto a, auto b, auto c, auto d) { v.set(c == d ? 1.0 : 0.0, a, b, c, d); });
    params.dropout_p = p;
    params.dropout_seed = seed;
  }
  // The output (z ∘ P) of the flash backend at the active ISA, or of the fp64 reference.
  std::vector<double> run(int threads) {
    out.poison();
    Params pr = params;
    pr.threads = threads;
    const Status s = attention(q.view, k.view, v.view, out.view, pr);
    EXPECT_TRUE(s.ok()) << s.message();
    std::vector<double> r;
    out.for_each_index([&](auto a, auto b, auto c, auto d) { r.push_back(out.get(a, b, c, d)); });
    return r;
  }
  std::vector<double> reference_out() {
    core::Problem prob;
    EXPECT_TRUE(core::validate(q.view, k.view, v.view, out.view, params, std::nullopt, &prob).ok());
    return reference::attention<double>(prob).out;
  }
};

// Prefill (lanes of one head), decode (lanes of a GQA group; long keys: split-KV), every ISA and two thread
// counts: the same pairs drop as in the reference, and kept weights are scaled by 1 / (1 - p).
TEST(Dropout, EveryKernelDropsTheReferencePairs) {
  for (auto [sq, skv] : {std::pair<std::int64_t, std::int64_t>{37, 203}, {1, 1500}, {5, 64}}) {
    const double p = 0.3;
    MaskProbe probe(sq, skv, p, 1234567 + static_cast<std::uint64_t>(sq));
    const std::vector<double> ref = probe.reference_out();
    for (cpu::Isa isa : supported_isas()) {
      ForceIsa force(isa);
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " threads " + std::to_string(threads) + " Sq " +
                     std::to_string(sq));
        const std::vector<double> got = probe.run(threads);
        ASSERT_EQ(got.size(), ref.size());
        std::size_t mismatches = 0, worst = 0;
        double worst_rel = 0;
        for (std::size_t e = 0; e < got.size(); ++e) {
          ASSERT_FALSE(std::isnan(got[e])) << "element " << e << " unwritten or NaN";
          if ((ref[e] == 0) != (got[e] == 0)) ++mismatches;
          else if (ref[e] != 0) {
            const double rel = std::fabs(got[e] - ref[e]) / ref[e];
            if (rel > worst_rel) worst_rel = rel, worst = e;
          }
        }
        EXPECT_EQ(mismatches, 0u) << "pairs dropped by one and not the other";
        EXPECT_LT(worst_rel, 1e-4) << "kept weight " << got[worst] << " vs reference " << ref[worst];
      }
    }
  }
}

// The drop rate is p within a binomial bound (5 sigma), and each row's weights still sum to 1 in expectation
// (Σ_j z_ij P_ij has mean 1 and variance p / (1 − p) · Σ_j P_ij²; the mean over rows within 5 sigma).
TEST(Dropout, RateAndExpectedSumArePreserved) {
  for (double p : {0.01, 0.17, 0.5, 0.9}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    MaskProbe probe(64, 256, p, 99);
    MaskProbe plain(64, 256, 0.0, 99);
    const std::vector<double> dropped = probe.run(0), weights = plain.run(0);
    double n = 0, drops = 0, sum = 0, var = 0;
    const auto rows = static_cast<std::size_t>(probe.B * probe.Hq * probe.Sq);
    const auto skv = static_cast<std::size_t>(probe.Skv);
    for (std::size_t r = 0; r < rows; ++r) {
      double row_sum = 0, p2 = 0;
      for (std::size_t j = 0; j < skv; ++j) {
        const double w = weights[r * skv + j], x = dropped[r * skv + j];
        n += 1, drops += x == 0 ? 1 : 0;
        row_sum += x, p2 += w * w;
      }
      sum += row_sum, var += p / (1 - p) * p2;
    }
    const double rate = drops / n, sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(rate, p, 5 * sigma);
    EXPECT_NEAR(sum / static_cast<double>(rows), 1.0, 5 * std::sqrt(var) / static_cast<double>(rows));
  }
}

// The mask is a function of the seed: another seed drops other pairs, the same seed the same ones.
TEST(Dropout, TheSeedChoosesTheMask) {
  MaskProbe a(16, 128, 0.5, 1), b(16, 128, 0.5, 1), c(16, 128, 0.5, 2);
  const std::vector<double> ra = a.run(0), rb = b.run(1), rc = c.run(0);
  EXPECT_EQ(ra, rb);
  std::size_t differ = 0;
  for (std::size_t e = 0; e < ra.size(); ++e) differ += (ra[e] == 0) != (rc[e] == 0);
  EXPECT_GT(differ, ra.size() / 4);
}

TEST(Dropout, BadProbabilitiesAreRefused) {
  MaskProbe probe(4, 8, 0.0, 1);
  probe.out.poison();
  const std::vector<unsigned char> before = probe.out.storage;
  for (double p : {-0.1, 1.0, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Params pr = probe.params;
    pr.dropout_p = p;
    const Status s = attention(probe.q.view, probe.k.view, probe.v.view, probe.out.view, pr);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("dropout_p"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("[0, 1)"), std::string::npos) << s.message();
    EXPECT_EQ(probe.out.storage, before) << "written despite the error";
  }
}

}  // namespace
}  // namespace attn::test
