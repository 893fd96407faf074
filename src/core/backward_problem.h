// The validated description of one backward call: the forward's problem plus the gradient views.
#pragma once

#include "attn/backward.h"
#include "core/problem.h"

namespace attn::core {

struct BackwardProblem {
  Problem fwd;                // q, k, v, out (read here), lse (read here, always present), masks, scale
  Strided dout, dq, dk, dv;   // dO [B, Hq, Sq, Dv] (input); dQ, dK, dV (outputs) in the shapes of q, k, v
  std::optional<Strided> dsinks;  // ∂L/∂sinks [Hq] f32 (stride[1] over heads), when asked for
};

// Checks every argument (core::validate for the forward's part, then the gradients); on success fills
// *problem. Writes nothing anywhere else.
Status validate_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                         const TensorView& grad_k, const TensorView& grad_v, const Params& params,
                         const std::optional<TensorView>& grad_sinks, BackwardProblem* problem);

}  // namespace attn::core
