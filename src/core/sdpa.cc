// The entry point: validate everything, choose the implementation once, run it.
#include "attn/sdpa.h"

#include "core/problem.h"
#include "cpu/kernels.h"
#include "reference/reference.h"

namespace attn {

Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const Params& params, const std::optional<TensorView>& lse) {
  core::Problem p;
  if (Status s = core::validate(q, k, v, out, params, lse, &p); !s) return s;
  if (p.backend == Backend::reference) {
    reference::store(p, reference::attention<double>(p));
    return Status::Ok();
  }
  const cpu::Choice kernel = cpu::select_flash(p);
  if (!kernel.fn)
    return Status::Unsupported("q", std::string("no flash kernel for q/out dtype ") + dtype_name(p.q.dtype) +
                                        " with k/v dtype " + dtype_name(p.k.dtype));
  kernel.fn(p, cpu::resolve_threads(p.threads));
  return Status::Ok();
}

}  // namespace attn

namespace attn {

Status attention_paged(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                       const TensorView&, const Params&, const std::optional<TensorView>&) {
  return Status::Unsupported("k_pages", "paged attention is not implemented yet; expected in the next commit");
}

}  // namespace attn
