// The entry point: validate everything, choose the implementation once, run it.
#include "attn/sdpa.h"

#include <new>
#include <string>

#include "core/problem.h"
#include "core/workspace_impl.h"
#include "cpu/kernels.h"
#include "cuda/backend.h"
#include "reference/reference.h"

namespace attn {

namespace core {

Status run_forward(const Problem& p) {
  if (p.backend == Backend::reference) {
    if (Status s = reference::check_size(p, /*backward=*/false); !s) return s;
    try {
      reference::store(p, reference::attention<double>(p));
    } catch (const std::bad_alloc&) {
      return Status::OutOfMemory("backend", "the reference backend could not allocate its fp64 buffers; expected "
                                            "a smaller problem (or the flash backend)");
    }
    return Status::Ok();
  }
  if (p.device.is_cuda()) {  // the CUDA backend: cuDNN or attn's own kernels (cuda/backend.h)
    const cuda::Choice choice = cuda::select_forward(p);
    if (!choice.status) return choice.status;
    return cuda::run_forward(p, choice);
  }
  const int threads = cpu::resolve_threads(p.threads);
  const cpu::Choice kernel = cpu::select_flash(p, threads);
  if (!kernel.fn)
    return Status::Unsupported("q", std::string("no flash kernel for q/out dtype ") + dtype_name(p.q.dtype) +
                                        " with k/v dtype " + dtype_name(p.k.dtype));
  // Kernels allocate their scratch before their work starts and write nothing until it is there, so a failed
  // allocation leaves the outputs untouched.
  try {
    kernel.fn(p, threads);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("q", "the kernel's scratch (" + std::to_string(kernel.workspace_bytes) +
                                        " bytes at " + std::to_string(threads) + " threads) could not be allocated");
  }
  return Status::Ok();
}

}  // namespace core

Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const Params& params, const std::optional<TensorView>& lse) {
  core::Problem p;
  const core::KvLenLoan loan{p};
  if (Status s = core::validate(q, k, v, out, params, lse, &p); !s) return s;
  return core::run_forward(p);
}

Status attention_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                       const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                       const Params& params, const std::optional<TensorView>& lse) {
  core::Problem p;
  const core::KvLenLoan loan{p};
  if (Status s = core::validate_paged(q, k_pages, v_pages, page_table, seq_lens, out, params, lse, &p); !s)
    return s;
  return core::run_forward(p);
}

}  // namespace attn
