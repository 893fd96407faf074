// attn: a multi-head attention layer (MHA, GQA, MQA): projections, attention, output projection.
//
//   Q = x_q W_Qᵀ + b_Q,  K = x_kv W_Kᵀ + b_K,  V = x_kv W_Vᵀ + b_V      (heads split from the columns)
//   Y_h = attention(Q_h, K_{h / (Hq/Hkv)}, V_{h / (Hq/Hkv)})             (attn::attention)
//   out = concat_h(Y_h) W_Oᵀ + b_O
//
// Weights use PyTorch's nn.Linear layout, [out_features, in_features] row-major, so the tensors of a
// torch.nn.Linear (q_proj.weight, ...) can be used as they are:
//   w_q [Hq·Dk, d_model]   w_k [Hkv·Dk, d_model]   w_v [Hkv·Dv, d_model]   w_o [d_model, Hq·Dv]
//   b_q [Hq·Dk]            b_k [Hkv·Dk]            b_v [Hkv·Dv]            b_o [d_model]   (only with bias)
// Column block h of Q (columns h·Dk .. h·Dk+Dk-1) is head h. The projections run through OpenBLAS sgemm.
// The `attn` tools read and write these as .npy files named w_q.npy ... b_o.npy in a directory.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"

namespace attn {

struct MhaConfig {
  std::int64_t d_model = 0;
  std::int64_t heads = 0;       // Hq
  std::int64_t kv_heads = 0;    // Hkv, a divisor of heads; 0 = heads (MHA); 1 = MQA
  std::int64_t head_dim = 0;    // Dk; 0 = d_model / heads
  std::int64_t v_head_dim = 0;  // Dv; 0 = head_dim
  bool bias = false;
};

struct MhaWeights {
  std::vector<float> w_q, w_k, w_v, w_o;
  std::vector<float> b_q, b_k, b_v, b_o;  // empty without bias
};

class MultiHeadAttention {
 public:
  MultiHeadAttention() = default;
  // Validates the config (filling its 0 defaults) and allocates zeroed weights.
  static Status create(const MhaConfig& config, MultiHeadAttention* mha);

  const MhaConfig& config() const { return config_; }
  // d·(Hq·Dk + Hkv·Dk + Hkv·Dv) + Hq·Dv·d (+ Hq·Dk + Hkv·Dk + Hkv·Dv + d with bias); the seeds'
  // d·h·(3·Dk + Dv) for MHA without bias.
  std::int64_t parameter_count() const;
  MhaWeights& weights() { return weights_; }
  const MhaWeights& weights() const { return weights_; }
  // Uniform in ±1/sqrt(fan_in) (PyTorch's nn.Linear default range), deterministic in `seed`.
  void init_random(std::uint64_t seed);
  // Checks that every weight has the size the config implies (after editing weights() by hand).
  Status check_weights() const;

  // Self-attention: x [B, S, d_model] -> out [B, S, d_model]; f32 rank-3 views whose last dimension
  // is contiguous. params (causal, kv_lens, mask, window, scale, threads, backend) go to attn::attention.
  Status forward(const TensorView& x, const TensorView& out, const Params& params = {}) const;
  // Cross-attention: queries from x_q [B, Sq, d_model], keys/values from x_kv [B, Skv, d_model].
  Status forward_cross(const TensorView& x_q, const TensorView& x_kv, const TensorView& out,
                       const Params& params = {}) const;
  // A decode step of one sequence: x [1, T, d_model] are the new tokens; their K/V are appended to
  // `cache` and their queries attend to the whole cache (params default to decode_params()).
  Status forward_cached(const TensorView& x, KVCache& cache, const TensorView& out,
                        const Params& params = decode_params()) const;
  // A batched decode step: x [B, T, d_model], row b the new tokens of sequence ids[b] of `cache`.
  Status forward_paged(const TensorView& x, PagedKVCache& cache, const std::vector<std::int64_t>& ids,
                       const TensorView& out, const Params& params = decode_params()) const;

  // The projections alone, for inspection (attn heatmap): q [B, S, Hq·Dk], k [B, S, Hkv·Dk],
  // v [B, S, Hkv·Dv] row-major, from x [B, S, d_model].
  Status project_qkv(const TensorView& x, std::vector<float>* q, std::vector<float>* k, std::vector<float>* v) const;

 private:
  MhaConfig config_;
  MhaWeights weights_;
};

}  // namespace attn
