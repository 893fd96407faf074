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
#include "attn/rotary.h"
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

// What backward() needs from a training forward: the projections, the per-head attention output before
// W_O and its log-sum-exp (all row-major f32, filled by forward / forward_cross when given a MhaSaved*).
//   q [B, Sq, Hq·Dk]   k [B, Skv, Hkv·Dk]   v [B, Skv, Hkv·Dv]   y [B, Sq, Hq·Dv]   lse [B, Hq, Sq]
struct MhaSaved {
  std::int64_t batch = 0, q_len = 0, kv_len = 0;
  bool self = false;  // from forward (x_q = x_kv = x)
  std::vector<float> q, k, v, y, lse;
};

// Gradients of a loss L, as backward() writes them (row-major f32, sized by backward; nothing is added to
// what the vectors held before). weights has the layout of MhaWeights (b_* empty without bias).
//   x_q [B, Sq, d_model]: ∂L/∂x_q     x_kv [B, Skv, d_model]: ∂L/∂x_kv
// For self-attention (saved.self) x is both inputs, so its gradient is the sum of both paths: backward writes
// that sum into x_q and leaves x_kv empty.
struct MhaGrads {
  std::vector<float> x_q, x_kv;
  MhaWeights weights;
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
  // Training forwards: as above, and also keep in *saved what backward() needs (its vectors are replaced).
  Status forward(const TensorView& x, const TensorView& out, const Params& params, MhaSaved* saved) const;
  Status forward_cross(const TensorView& x_q, const TensorView& x_kv, const TensorView& out, const Params& params,
                       MhaSaved* saved) const;
  // The backward pass of a training forward: from grad_out = ∂L/∂out [B, Sq, d_model] (f32, contiguous last
  // dimension) the gradients of the inputs and of every weight and bias, into *grads. x_q and x_kv must be
  // the inputs the forward saw (for self-attention pass x twice) and params the forward's params; the weights
  // must not have changed since. The attention part is attn::attention_backward; the projections are OpenBLAS
  // sgemm calls. Everything is checked first: on error *grads is untouched.
  Status backward(const TensorView& x_q, const TensorView& x_kv, const MhaSaved& saved, const TensorView& grad_out,
                  MhaGrads* grads, const Params& params = {}) const;

  // A decode step of one sequence: x [1, T, d_model] are the new tokens; their K/V are appended to
  // `cache` and their queries attend to the whole cache (params default to decode_params()).
  Status forward_cached(const TensorView& x, KVCache& cache, const TensorView& out,
                        const Params& params = decode_params()) const;
  // The same with a rotary embedding (attn/rotary.h, rotary_dim <= head_dim): the new tokens' queries and keys
  // turned at their positions cache.length() + t (the keys as the cache stores them), so a model's whole decode
  // step is this one call.
  Status forward_cached(const TensorView& x, KVCache& cache, const TensorView& out, const Rotary& rotary,
                        const Params& params = decode_params()) const;
  // A batched decode step: x [B, T, d_model], row b the new tokens of sequence ids[b] of `cache`.
  Status forward_paged(const TensorView& x, PagedKVCache& cache, const std::vector<std::int64_t>& ids,
                       const TensorView& out, const Params& params = decode_params()) const;

  // The projections alone, for inspection (attn heatmap): q [B, S, Hq·Dk], k [B, S, Hkv·Dk],
  // v [B, S, Hkv·Dv] row-major, from x [B, S, d_model].
  Status project_qkv(const TensorView& x, std::vector<float>* q, std::vector<float>* k, std::vector<float>* v) const;

 private:
  Status forward_impl(const TensorView& x_q, const TensorView& x_kv, const TensorView& out, const Params& params,
                      MhaSaved* saved) const;
  Status forward_cached_impl(const TensorView& x, KVCache& cache, const TensorView& out, const Rotary* rotary,
                             const Params& params) const;

  MhaConfig config_;
  MhaWeights weights_;
};

}  // namespace attn
