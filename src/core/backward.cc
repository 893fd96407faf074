// The backward entry point: validate everything, choose the implementation once, run it.
#include "attn/backward.h"

#include <new>
#include <string>

#include "core/backward_problem.h"
#include "core/workspace_impl.h"
#include "cpu/kernels.h"
#include "cuda/backend.h"
#include "reference/reference.h"

namespace attn {

Status attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                          const TensorView& grad_k, const TensorView& grad_v, const Params& params,
                          const std::optional<TensorView>& grad_sinks) {
  core::BackwardProblem bp;
  const core::KvLenLoan loan{bp.fwd};
  if (Status s = core::validate_backward(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, params, grad_sinks, &bp); !s)
    return s;
  if (bp.fwd.backend == Backend::reference) {
    if (Status s = reference::check_size(bp.fwd, /*backward=*/true); !s) return s;
    try {
      reference::store_grads(bp.fwd, reference::attention_backward<double>(bp.fwd, bp.dout), bp.dq, bp.dk, bp.dv,
                             bp.dsinks);
    } catch (const std::bad_alloc&) {
      return Status::OutOfMemory("backend", "the reference backend could not allocate its fp64 buffers; expected "
                                            "a smaller problem (or the flash backend)");
    }
    return Status::Ok();
  }
  if (bp.fwd.device.is_cuda()) {  // the CUDA backend (cuda/backend.h)
    const cuda::Choice choice = cuda::select_backward(bp);
    if (!choice.status) return choice.status;
    return cuda::run_backward(bp, choice);
  }
  const int threads = cpu::resolve_threads(bp.fwd.threads);
  const cpu::BackwardChoice kernel = cpu::select_backward(bp, threads);
  if (!kernel.fn)
    return Status::Unsupported("q", std::string("no backward kernel for q dtype ") + dtype_name(bp.fwd.q.dtype) +
                                        " with k/v dtype " + dtype_name(bp.fwd.k.dtype));
  // The kernel allocates its statistics, partial sums and scratch before its work starts and writes nothing
  // until they are there.
  try {
    kernel.fn(bp, threads);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("q", "the backward's row statistics, dQ partial sums and per-thread scratch (" +
                                        std::to_string(kernel.workspace_bytes) + " bytes at " + std::to_string(threads) +
                                        " threads) could not be allocated");
  }
  return Status::Ok();
}

}  // namespace attn
