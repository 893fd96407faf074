// The cost model against hand-computed numbers and the seeds' claims.
#include <gtest/gtest.h>

#include <string>

#include "attn/cost.h"

namespace attn {
namespace {

const StageCost& stage(const AttentionCost& c, const std::string& name) {
  for (const StageCost& s : c.stages)
    if (s.name == name) return s;
  static StageCost none;
  ADD_FAILURE() << "no stage " << name;
  return none;
}

TEST(Cost, SeedsTableForMha) {
  // The seeds' 70B example: d = 8192, h = 64, N = 4096.
  AttentionCost c;
  ASSERT_TRUE(attention_cost({1, 4096, 8192, 64, 0, 0, 0, false, 2}, &c).ok());
  const double N = 4096, d = 8192;
  EXPECT_DOUBLE_EQ(stage(c, "QKV projections").seed_ops, 3 * N * d * d);
  EXPECT_DOUBLE_EQ(stage(c, "Q K^T").seed_ops, N * N * d);
  EXPECT_DOUBLE_EQ(stage(c, "softmax").seed_ops, N * N * 64);
  EXPECT_DOUBLE_EQ(stage(c, "A V").seed_ops, N * N * d);
  EXPECT_DOUBLE_EQ(stage(c, "output projection").seed_ops, N * d * d);
  EXPECT_DOUBLE_EQ(c.total_seed_ops, 4 * N * d * d + 2 * N * N * d + N * N * 64);
  for (const StageCost& s : c.stages)
    if (s.name != "softmax") EXPECT_DOUBLE_EQ(s.flops, 2 * s.seed_ops) << s.name;
  EXPECT_DOUBLE_EQ(stage(c, "softmax").flops, 5 * N * N * 64);
  // "~1.1 TFLOPs" of projections and "~274 GFLOPs" of attention matmuls (multiply-adds), projections dominate.
  EXPECT_NEAR((stage(c, "QKV projections").seed_ops + stage(c, "output projection").seed_ops) / 1e12, 1.1, 0.01);
  EXPECT_NEAR((stage(c, "Q K^T").seed_ops + stage(c, "A V").seed_ops) / 1e9, 274.9, 0.1);
  EXPECT_EQ(c.dominant, "QKV projections");
  // Crossover 2·N²·d = 4·N·d² at N = 2d.
  EXPECT_DOUBLE_EQ(c.crossover_seq, 2 * d);
  // Bytes: QKᵀ reads Q and K and writes the N² scores of every head.
  EXPECT_DOUBLE_EQ(stage(c, "Q K^T").bytes, 2 * (N * d + N * d + 64 * N * N));
  EXPECT_DOUBLE_EQ(c.fused_attention_bytes, 2 * 4 * N * d);
}

TEST(Cost, CausalGqaAndBatch) {
  AttentionCost c;
  // Causal halves (N(N+1)/2 pairs) the attention stages, not the projections; batch multiplies all.
  ASSERT_TRUE(attention_cost({3, 100, 64, 8, 2, 0, 0, true, 4}, &c).ok());
  EXPECT_DOUBLE_EQ(stage(c, "Q K^T").seed_ops, 3.0 * 8 * (100 * 101 / 2) * 8);
  EXPECT_DOUBLE_EQ(stage(c, "QKV projections").seed_ops, 3.0 * 100 * 64 * (64 + 16 + 16));
  EXPECT_DOUBLE_EQ(stage(c, "output projection").seed_ops, 3.0 * 100 * 64 * 64);
  // Crossover: 8·16·(N+1)/2 = 64·(96 + 64)  ->  N = 159.
  EXPECT_DOUBLE_EQ(c.crossover_seq, 159);
  ASSERT_TRUE(attention_cost({1, 100, 64, 8, 8, 0, 0, true, 4}, &c).ok());
  EXPECT_DOUBLE_EQ(c.crossover_seq, 4 * 64 - 1);  // MHA causal: N + 1 = 4d
  ASSERT_TRUE(attention_cost({1, 100000, 64, 8, 8, 0, 0, false, 4}, &c).ok());
  EXPECT_EQ(c.dominant, "Q K^T");
}

TEST(Cost, ParameterCounts) {
  std::int64_t n = 0;
  ASSERT_TRUE(parameter_count({512, 8, 0, 64, 0, false}, &n).ok());
  EXPECT_EQ(n, 1048576);
  ASSERT_TRUE(parameter_count({512, 8, 0, 0, 0, true}, &n).ok());
  EXPECT_EQ(n, 1048576 + 4 * 512);
  ASSERT_TRUE(parameter_count({4096, 32, 8, 0, 0, false}, &n).ok());
  EXPECT_EQ(n, 4096LL * (4096 + 1024 + 1024) + 4096LL * 4096);
  ASSERT_TRUE(parameter_count({64, 4, 1, 16, 8, true}, &n).ok());
  EXPECT_EQ(n, 64 * (64 + 16 + 8) + 32 * 64 + (64 + 16 + 8) + 64);
  const Status s = parameter_count({64, 4, 3, 0, 0, false}, &n);
  EXPECT_NE(s.message().find("kv_heads: 3"), std::string::npos) << s.message();
  EXPECT_FALSE(parameter_count({0, 4, 0, 0, 0, false}, &n).ok());
}

TEST(Cost, KvCacheSizeMatchesTheSeeds) {
  double bytes = 0;
  ASSERT_TRUE(kv_cache_bytes({80, 64, 128, 64000, 1, KvDType::f16}, &bytes).ok());
  EXPECT_DOUBLE_EQ(bytes, 167772160000.0);  // "~167 GB"
  EXPECT_NEAR(bytes / 1e9, 167.8, 0.05);
  EXPECT_DOUBLE_EQ(bytes / (1024.0 * 1024 * 1024), 156.25);
  ASSERT_TRUE(kv_cache_bytes({80, 8, 128, 64000, 1, KvDType::f16}, &bytes).ok());
  EXPECT_NEAR(bytes / 1e9, 21.0, 0.05);  // "GQA-8: 21 GB"
  ASSERT_TRUE(kv_cache_bytes({80, 8, 128, 64000, 4, KvDType::fp8}, &bytes).ok());
  EXPECT_DOUBLE_EQ(bytes, 167772160000.0 / 8 * 4 / 2);
  const Status s = kv_cache_bytes({80, 8, 0, 64000, 1, KvDType::f32}, &bytes);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace attn
