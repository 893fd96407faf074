// The entry point: validate everything, choose the implementation once, run it.
#include "attn/sdpa.h"

#include "core/problem.h"
#include "cpu/kernels.h"
#include "reference/reference.h"

namespace attn {

namespace {

Status run(const core::Problem& p) {
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

}  // namespace

Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const Params& params, const std::optional<TensorView>& lse) {
  core::Problem p;
  if (Status s = core::validate(q, k, v, out, params, lse, &p); !s) return s;
  return run(p);
}

Status attention_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                       const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                       const Params& params, const std::optional<TensorView>& lse) {
  core::Problem p;
  if (Status s = core::validate_paged(q, k_pages, v_pages, page_table, seq_lens, out, params, lse, &p); !s) return s;
  return run(p);
}

}  // namespace attn
