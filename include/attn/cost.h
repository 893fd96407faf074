// attn: a cost model of one attention layer (FLOPs, bytes, KV-cache size, parameter count).
//
// Conventions. FLOPs count 2 per multiply-add (one multiply, one add), as GEMM benchmarks and
// FlashAttention's papers do. The seeds count 1 per multiply-add ("3·N·d²" for the QKV projections);
// every stage carries that count too, as `seed_ops`. Softmax has no multiply-adds: the seeds count one
// operation per score (`seed_ops`); `flops` counts 5 per score (max, subtract, exp, sum, divide).
// Bytes are the minimum traffic of each stage run as a separate step with the score matrix written out
// (the textbook pipeline the seeds describe): every input read once, every output written once, at
// `bytes_per_element` per value. A fused (flash) kernel never writes the scores; `fused_attention_bytes`
// gives its traffic for comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/status.h"

namespace attn {

struct AttentionShape {
  std::int64_t batch = 1;
  std::int64_t seq = 0;        // N: the sequence length (self-attention: queries = keys = N)
  std::int64_t d_model = 0;
  std::int64_t heads = 0;      // Hq
  std::int64_t kv_heads = 0;   // Hkv; 0 = heads (MHA)
  std::int64_t head_dim = 0;   // Dk; 0 = d_model / heads
  std::int64_t v_head_dim = 0; // Dv; 0 = head_dim
  bool causal = false;         // only the N(N+1)/2 allowed query-key pairs are computed
  std::int64_t bytes_per_element = 4;
};

struct StageCost {
  std::string name;     // "QKV projections", "Q K^T", "softmax", "A V", "output projection"
  double flops = 0;     // 2 per multiply-add
  double seed_ops = 0;  // 1 per multiply-add (the seeds' table), 1 per score for softmax
  double bytes = 0;     // read + written, scores materialised
};

struct AttentionCost {
  AttentionShape shape;  // with the defaults filled in
  std::vector<StageCost> stages;
  double total_flops = 0, total_seed_ops = 0, total_bytes = 0;
  std::string dominant;          // the stage with the most FLOPs
  double fused_attention_bytes = 0;  // Q, K, V read and O written once (no score matrix)
  // The sequence length at which the attention matmuls (Q Kᵀ + A V) reach the projection FLOPs
  // (QKV + output), for this shape's heads and causality; real-valued. MHA without a mask: 2·d_model.
  double crossover_seq = 0;
};

// Fills *cost for `shape`; an error names the bad field (d_model, heads, kv_heads, ...).
Status attention_cost(const AttentionShape& shape, AttentionCost* cost);

// Parameters of one attention layer with W_Q [Hq·Dk, d], W_K [Hkv·Dk, d], W_V [Hkv·Dv, d], W_O [d, Hq·Dv]:
//   d·(Hq·Dk + Hkv·Dk + Hkv·Dv) + Hq·Dv·d, plus Hq·Dk + Hkv·Dk + Hkv·Dv + d with biases.
// For MHA (Hkv = Hq = h) without biases this is the seeds' d·h·(3·Dk + Dv).
struct ParamShape {
  std::int64_t d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0;  // 0s as in AttentionShape
  bool bias = false;
};
Status parameter_count(const ParamShape& shape, std::int64_t* count);

// int8: attn's 8-bit cache (KVCache / PagedKVCache with DType::i8): one byte per element plus an fp32 scale per
// (token, KV head) for K and for V. int4: the 4-bit cache (DType::i4): half a byte per element plus an fp32 scale per
// block of 32 values (attn::kI4Block) of each row.
enum class KvDType { f32, f16, bf16, fp8, int8, int4 };
double kv_dtype_bytes(KvDType dtype);  // bytes per element: 4, 2, 2, 1, 1, 0.5

// KV-cache bytes: 2 (K and V) · layers · kv_heads · seq · batch · (row bytes + scale bytes), a row's bytes
// head_dim · bytes per element (int4: rounded up to whole bytes), its scale bytes 4 for int8, 4 · ceil(head_dim / 32)
// for int4, 0 otherwise.
struct KvCacheShape {
  std::int64_t layers = 0, kv_heads = 0, head_dim = 0, seq = 0, batch = 1;
  KvDType dtype = KvDType::f16;
};
Status kv_cache_bytes(const KvCacheShape& shape, double* bytes);

}  // namespace attn
