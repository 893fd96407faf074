// The oracle: attention computed the way the formula reads, materialising the scores of each head.
// Written independently of the tiled kernels (its masks are evaluated element by element from their
// definitions) and never optimised. Acc = double is the fp64 reference every test compares against;
// Acc = float is the "naive same-precision" computation the tolerance rule measures against.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/problem.h"

namespace attn::reference {

struct Result {
  std::vector<double> out;    // [B, Hq, Sq, Dv], contiguous
  std::vector<double> lse;    // [B, Hq, Sq], natural log, -inf for a row with no allowed key
  std::vector<double> probs;  // [B, Hq, Sq, Skv] softmax weights, filled only when asked for
  // The size of the terms the scores sum, max over attended pairs of scale·Σ_d |q_d k_d| + |mask| (finite
  // values only): what rounding noise in a score is proportional to (the tests' atol).
  double score_terms = 0;
  // The largest factor a weight carries after the softmax: dropout's 1 / (1 − p) for a kept pair, else 1. The
  // output is a weighted sum of V rows whose weights sum to at most this, so its size, and every rounding in it,
  // is up to this times max|v| (the tests' atol).
  double weight_factor = 1;
};

// The reference materialises scores in fp64: refuses (before allocating) a problem whose buffers would pass
// kMaxBytes, saying how much it would need.
inline constexpr double kMaxBytes = 4.0 * (1 << 30);
Status check_size(const core::Problem& p, bool backward);
// The bytes its buffers take for this problem (what check_size compares with kMaxBytes).
std::int64_t bytes_needed(const core::Problem& p, bool backward);

// Philox4x32-10 (the reference's own, for the dropout mask; tests check it against the published vectors).
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::uint32_t k0, std::uint32_t k1);

// True when key j may be seen by query i of batch b (causal, window, key length; not the dense mask).
bool allowed(const core::Problem& p, std::int64_t b, std::int64_t i, std::int64_t j);

template <class Acc>
Result attention(const core::Problem& p, bool keep_probs = false);

extern template Result attention<double>(const core::Problem&, bool);
extern template Result attention<float>(const core::Problem&, bool);

// Writes a result into the problem's out (and lse) views, converting to their dtypes.
void store(const core::Problem& p, const Result& r);

// ---- the backward pass ------------------------------------------------------------------------------

struct Grads {
  std::vector<double> dq;  // [B, Hq,  Sq,  Dk], contiguous
  std::vector<double> dk;  // [B, Hkv, Skv, Dk]
  std::vector<double> dv;  // [B, Hkv, Skv, Dv]
  std::vector<double> dsinks;        // [Hq]: ∂L/∂sink_h (0 without sinks)
  // [Hq]: Σ_i P_sink,i · Σ_j |P_ij dP_ij|, the size of the terms ∂L/∂sink_h sums, D_i's own terms included (the
  // size its rounding is relative to: D_i = Σ_j P_ij dP_ij cancels in a peaked row, its rounding does not).
  std::vector<double> dsinks_terms;
  double score_terms = 0;  // the forward's (Result::score_terms)
};

// dQ, dK, dV (and dsinks) for upstream gradient dout [B, Hq, Sq, Dv], the way the formulas read: P is
// materialised from attention<Acc>(p, true), then dV = (Z ∘ P)ᵀ dO, dP = Z ∘ (dO Vᵀ), D_i = Σ_j P_ij dP_ij
// (Z: the dropout factors, 1 without dropout),
// dS = P ∘ (dP − D) ∘ T'(x) (the softcap's derivative), dsink_h = −Σ_{b,i} P_sink,bhi · D_bhi,
// dQ = scale · dS K, dK = scale · dSᵀ Q (dK and dV summed over the query heads of each KV head), all in Acc.
// Uses neither the saved O nor the saved LSE.
template <class Acc>
Grads attention_backward(const core::Problem& p, const core::Strided& dout);

extern template Grads attention_backward<double>(const core::Problem&, const core::Strided&);
extern template Grads attention_backward<float>(const core::Problem&, const core::Strided&);

// Writes gradients into views shaped like q, k and v, converting to their dtypes.
void store_grads(const core::Problem& p, const Grads& g, const core::Strided& dq, const core::Strided& dk,
                 const core::Strided& dv, const std::optional<core::Strided>& dsinks = std::nullopt);

}  // namespace attn::reference
