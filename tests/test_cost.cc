// The cost model against hand-computed numbers and the seeds' claims.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attn/cost.h"
#include "attn/ring_plan.h"

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
  // int8: fp8's bytes plus an fp32 scale per (token, KV head) for K and V: 2 · 80 · 8 · 64000 · 4 · 4 more.
  ASSERT_TRUE(kv_cache_bytes({80, 8, 128, 64000, 4, KvDType::int8}, &bytes).ok());
  EXPECT_DOUBLE_EQ(bytes, 167772160000.0 / 8 * 4 / 2 + 2.0 * 80 * 8 * 64000 * 4 * 4);
  // int4: half of fp8's bytes plus an fp32 scale per 32 values (4 per row of 128): 2 · 80 · 8 · 64000 · 4 · (64 + 16).
  ASSERT_TRUE(kv_cache_bytes({80, 8, 128, 64000, 4, KvDType::int4}, &bytes).ok());
  EXPECT_DOUBLE_EQ(bytes, 2.0 * 80 * 8 * 64000 * 4 * (64 + 16));
  // A head dim that is not a multiple of 32 (or of 2): a row rounded up to whole bytes, a partial last block.
  ASSERT_TRUE(kv_cache_bytes({1, 1, 33, 1, 1, KvDType::int4}, &bytes).ok());
  EXPECT_DOUBLE_EQ(bytes, 2.0 * (17 + 4 * 2));
  EXPECT_DOUBLE_EQ(kv_dtype_bytes(KvDType::int4), 0.5);
  const Status s = kv_cache_bytes({80, 8, 0, 64000, 1, KvDType::f32}, &bytes);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace attn

namespace attn {

// The ring planner (attn/ring_plan.h) on a case worked by hand: S = 1M tokens over 64 hosts, Hq = 32, Hkv = 8,
// D = 128, causal, bf16 K/V, 100 Gbit/s, 5 us, 1000 GFLOP/s per host.
TEST(RingPlan, WorkedExample) {
  RingPlanInput in;
  in.seq = 1000000, in.hosts = 64;
  RingPlan p;
  ASSERT_TRUE(plan_ring(in, &p).ok());
  const double c = 1e6 / 64;  // 15625 tokens per host
  EXPECT_DOUBLE_EQ(p.block_tokens, c);
  // 4·B·Hq·c²·D FLOPs per step (D = 128), halved by the causal mask: 8192·c² = 2.0e12 FLOP -> 2.0 s at 1 TFLOP/s
  EXPECT_NEAR(p.step_compute_s, 8192 * c * c / 1e12, 1e-12);
  // B·Hkv·c·(Dk + Dv)·2 bytes = 64 MB per step at 12.5 GB/s, plus 5 us
  EXPECT_NEAR(p.step_transfer_s, 8 * c * 256 * 2 / 12.5e9 + 5e-6, 1e-12);
  EXPECT_NEAR(p.forward_s, 64 * p.step_compute_s, 1e-9);  // hidden: every step costs its compute
  EXPECT_DOUBLE_EQ(p.hidden_fraction, 1.0);
  // c*: 8192·c²/1e12 = 5e-6 + 4096·c/12.5e9, c* ~ 40.6 tokens
  const double a = 8192 / 1e12, b = 4096 / 12.5e9;
  EXPECT_NEAR(p.min_hidden_block, (b + std::sqrt(b * b + 4 * a * 5e-6)) / (2 * a), 1e-9);
  EXPECT_NEAR(p.single_host_s / p.forward_s, 64.0, 1e-9);
  // Exposed when the blocks are small: 100k tokens over 4096 hosts (24 tokens each) at 10 Gbit/s
  in.seq = 100000, in.hosts = 4096, in.bandwidth_gbit = 10;
  ASSERT_TRUE(plan_ring(in, &p).ok());
  EXPECT_LT(p.hidden_fraction, 0.5);
  EXPECT_GT(p.step_transfer_s, p.step_compute_s);
}

TEST(RingPlan, BadInputNamesTheField) {
  RingPlanInput in;
  in.seq = 1000, in.hosts = 4;
  RingPlan p;
  in.kv_heads = 7;
  EXPECT_NE(plan_ring(in, &p).message().find("kv_heads"), std::string::npos);
  in.kv_heads = 8, in.bandwidth_gbit = 0;
  EXPECT_NE(plan_ring(in, &p).message().find("bandwidth_gbit"), std::string::npos);
  in.bandwidth_gbit = 100, in.hosts = 0;
  EXPECT_NE(plan_ring(in, &p).message().find("hosts"), std::string::npos);
  in.hosts = 1001;  // more hosts than tokens
  EXPECT_EQ(plan_ring(in, &p).message().rfind("hosts: 1001 for 1000 tokens", 0), 0u) << plan_ring(in, &p).message();
}

// Ulysses and the hybrid (attn/ring_plan.h) against the formulas written out: 4,096 tokens on 8 hosts over 1 Gbit/s
// links, where the ring's blocks are too small to hide their transfer: Ulysses inside groups of 4, a ring across 2.
TEST(RingPlan, HybridFollowsTheModel) {
  RingPlanInput in;
  in.seq = 4096, in.hosts = 8, in.heads = 32, in.kv_heads = 8, in.head_dim = 128, in.causal = true;
  in.bytes_per_element = 2, in.bandwidth_gbit = 1, in.latency_us = 50, in.rate_gflops = 1000;
  RingPlan p;
  ASSERT_TRUE(plan_ring(in, &p).ok());
  const double c = 512, bw = 1e9 / 8, lat = 50e-6, tc = 2 * 32 * 256 * 0.5 * c * c / 1e12;
  const auto groups = [&](double u) {  // forward with Ulysses over u hosts, a ring over 8 / u groups
    const double kvh = 8 / u, r = 8 / u;
    const double t_in = (u - 1) * (lat + c * (32 / u * 128 + kvh * 256) * 2 / bw);
    const double t_out = (u - 1) * (lat + c * 32 / u * 128 * 2 / bw);
    const double tx = r > 1 ? lat + kvh * u * c * 256 * 2 / bw : 0;
    return t_in + u * tc + (r - 1) * std::max(u * tc, tx) + t_out;
  };
  EXPECT_NEAR(p.forward_s, groups(1), 1e-9);
  EXPECT_TRUE(p.ulysses_possible);
  EXPECT_NEAR(p.ulysses_forward_s, groups(8), 1e-9);
  EXPECT_EQ(p.hybrid_groups, groups(2) < groups(4) ? 2 : 4);
  EXPECT_NEAR(p.hybrid_forward_s, std::min(groups(2), groups(4)), 1e-9);
  EXPECT_STREQ(p.recommended, "hybrid");
  EXPECT_LT(p.hybrid_forward_s, std::min(p.forward_s, p.ulysses_forward_s));
}

}  // namespace attn
