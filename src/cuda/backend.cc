// The CUDA backend's one decision (cuda/backend.h): cuDNN where it takes the problem (Params::backend automatic
// or cudnn), else attn's own kernels (automatic or flash). Compiled in every build: without CUDA, or without a
// device, every call answers "no CUDA device" (cuda/runtime.h).
#include "cuda/backend.h"

#include "core/backward_problem.h"
#include "core/problem.h"
#include "cuda/forward.h"
#include "cuda/runtime.h"

namespace attn::cuda {
namespace {

// The device the problem's tensors are on, or why it cannot run there.
Status usable_device(const Device& d, std::string* arch) {
  if (Status s = require_device(); !s) return s;
  const std::optional<DeviceInfo> info = device_info(d.index);
  if (!info)
    return Status::Invalid("q", "on cuda:" + std::to_string(d.index) + "; expected a device index below " +
                                    std::to_string(device_count()));
  *arch = "sm_" + std::to_string(info->sm_major) + std::to_string(info->sm_minor);
  if (!kernels_support(*info))
    return Status::Unsupported("q", "on " + info->name + " (" + *arch + "); expected a GPU of compute capability 8.0 "
                                    "or later (sm_80: tensor-core mma.sync)");
  return Status::Ok();
}

Choice unavailable(Status s) {
  Choice c;
  c.status = std::move(s);
  return c;
}

}  // namespace

// The forward: attn's own kernel (cuda/forward.h) for every problem it takes. The cuDNN path is not written
// yet: automatic takes attn's kernel, cudnn says so.
Choice select_forward(const core::Problem& p) {
  std::string arch;
  if (Status s = usable_device(p.device, &arch); !s) return unavailable(s);
  if (p.backend == Backend::cudnn)
    return unavailable(Status::Unsupported("backend", "cudnn: the cuDNN path is not part of this build yet; expected "
                                                      "automatic or flash for CUDA tensors"));
  if (Status s = fwd::supports(p); !s) return unavailable(s);
  Choice c;
  c.path = Path::flash;
  c.kernel = fwd::kernel_name(p);
  c.arch = arch;
  c.workspace_bytes = static_cast<std::int64_t>(p.kv_len.size() * sizeof(std::int64_t));  // the key lengths
  return c;
}

Status run_forward(const core::Problem& p, const Choice& c) {
  if (!c.status.ok()) return c.status;
#if ATTN_HAVE_CUDA
  return fwd::launch(p);
#else
  (void)p;
  return require_device();
#endif
}

Choice select_backward(const core::BackwardProblem& bp) {
  std::string arch;
  if (Status s = usable_device(bp.fwd.device, &arch); !s) return unavailable(s);
  return unavailable(Status::Unsupported("q", "the CUDA kernels are not part of this build yet"));
}

Status run_backward(const core::BackwardProblem&, const Choice& c) {
  return c.status.ok() ? Status::Unsupported("q", "no CUDA kernel") : c.status;
}

#if !ATTN_HAVE_CUDA
Status merge(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
             const TensorView&, void*) {
  return require_device();
}
#endif

}  // namespace attn::cuda
