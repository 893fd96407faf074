// attn: the backward pass of scaled dot-product attention.
#pragma once

#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"

namespace attn {

// Gradients of a loss L with respect to Q, K and V, given dO = ∂L/∂O and the forward's O:
//   P = softmax(scale · Q Kᵀ + mask)   (recomputed from q and k, with each row's max and sum; never stored whole)
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D),   dQ = scale · dS K,   dK = scale · dSᵀ Q
//
//   q        [B, Hq,  Sq,  Dk]    k      [B, Hkv, Skv, Dk]    v      [B, Hkv, Skv, Dv]
//   out      [B, Hq,  Sq,  Dv]    lse    [B, Hq, Sq] f32      (both as attention() returned them)
//   grad_out [B, Hq,  Sq,  Dv]    dtype of q
//   grad_q   [B, Hq,  Sq,  Dk]    dtype of q
//   grad_k   [B, Hkv, Skv, Dk]    dtype of k      (with GQA/MQA: summed over the query heads sharing the KV head)
//   grad_v   [B, Hkv, Skv, Dv]    dtype of k
// Statistics: each row's max and sum are recomputed from the scores (one more product, Q Kᵀ) with the forward's
// own online-softmax state, over the same scores the gradients use, so the probabilities are the softmax of those
// scores to fp32 rounding (a row with one allowed key has P = 1 exactly); the given lse is not used for them (an
// fp32 LSE carries half an ulp of |LSE| into every probability). D = rowsum(dO ∘ O) is taken from the forward's
// O where scores are small (|scale·q·k| <= 8 by the norms of Q and K, |LSE| <= 64, finite inputs), and
// recomputed as rowsum(P ∘ dP) everywhere else (another product), since a rounding of O that a peaked row's
// cancellation magnifies would otherwise reach the gradients. An lse value that is not plausible there (NaN, +inf,
// beyond ±64) makes a row recompute D too; never an error. With Params::backward_statistics = from_forward, the
// given lse and out are the statistics (FlashAttention-2's way; ring attention).
// params must be the ones the forward ran with (scale, causal, window, kv_lens, mask); params.backend picks
// the flash kernel (automatic, flash) or the fp64 reference. On CUDA tensors (automatic or cudnn) the backward is
// cuDNN's, with its deterministic algorithm, for bf16/f16 calls without dense masks, windows or score variants and
// with contiguous K/V; there the given lse is the statistics (as with from_forward); other calls on CUDA tensors
// get Unsupported (docs/cuda.md). A row with no allowed key (or whose scores are
// all −∞) contributes nothing and gets dQ = 0; keys no query sees get zero gradients; keys at or past a batch's
// key length are never read. Non-finite values follow IEEE arithmetic over the pairs that carry weight
// (attended keys with a score above −∞): a NaN in Q, K, V, O or dO reaches the gradients of the rows and keys
// it touches, and no others. The result is bitwise identical on every run and at every thread count. Every
// argument is validated before anything is written: on error the Status names the parameter and the
// expectation, and grad_q, grad_k and grad_v are untouched. Gradients may not alias inputs or each other.
//
// Score variants (Params::softcap, alibi_slopes, sinks) are differentiated as they are defined: dS passes through
// the softcap's 1 − tanh²(x / softcap); ALiBi slopes are constants (no gradient); with sinks, grad_sinks (f32
// [Hq], optional) gets ∂L/∂sink_h = −Σ_{b,i} e^(sink_h − lse_bhi) · D_bhi (D_i = dO_i · O_i), summed in a fixed
// order.
Status attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                          const TensorView& grad_k, const TensorView& grad_v, const Params& params = {},
                          const std::optional<TensorView>& grad_sinks = std::nullopt);

}  // namespace attn
