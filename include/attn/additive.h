// attn: additive (Bahdanau) attention, the seeds' alternative to the scaled dot product.
//
//   e_ij = wᵀ tanh(W_q q_i + W_k k_j) + mask_ij,   P_i = softmax_j(e_ij),   out_i = Σ_j P_ij v_j
//
// for q [B, Sq, Dq], k [B, Skv, Dk], v [B, Skv, Dv] and learned W_q [A, Dq], W_k [A, Dk], w [A] (A: the
// attention dimension). The score is a small network per (query, key) pair: A tanh evaluations and 3A FLOPs per
// score after the projections, against 2·Dk FLOPs for a dot product (`attn compare-scoring` measures both).
// Nothing of size Sq x Skv is kept between rows; results are bitwise identical at any thread count.
//
// All tensors are f32 with any strides; masks as attention() takes them: causal (Params' meaning, with the
// bottom-right diagonal at i + Skv_b − Sq), key lengths [B] (i32 or i64), and a dense mask [Sq, Skv] or
// [B, Sq, Skv] (f32 added to e, or boolean: nonzero = keep). A row with no allowed key gets out = 0 and
// lse = -inf. Every argument is validated before anything is written; errors name the parameter.
#pragma once

#include <optional>

#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"

namespace attn {

struct AdditiveWeights {
  TensorView w_q;  // [A, Dq]
  TensorView w_k;  // [A, Dk]
  TensorView w;    // [A]
};

struct AdditiveParams {
  Causal causal = Causal::none;
  std::optional<TensorView> kv_lens;  // [B] i32 or i64, 0 <= len <= Skv
  std::optional<TensorView> mask;     // [Sq, Skv] or [B, Sq, Skv], f32 (finite or -inf) or boolean
  int threads = 0;                    // 0 = the default (set_num_threads(), ATTN_NUM_THREADS, else OpenMP's)
};

// out [B, Sq, Dv]; lse (optional) [B, Sq] f32: log Σ_j e^(e_ij), natural log.
Status additive_attention(const TensorView& q, const TensorView& k, const TensorView& v, const AdditiveWeights& weights,
                          const TensorView& out, const AdditiveParams& params = {},
                          const std::optional<TensorView>& lse = std::nullopt);

// Gradients of L (given dL/dout) with respect to every input and weight, all f32, shaped like what they are the
// gradient of: q [B, Sq, Dq], k, v, w_q, w_k, w. Recomputes the scores (no saved state needed).
struct AdditiveGrads {
  TensorView q, k, v, w_q, w_k, w;
};
Status additive_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AdditiveWeights& weights, const TensorView& grad_out,
                                   const AdditiveGrads& grads, const AdditiveParams& params = {});

}  // namespace attn
