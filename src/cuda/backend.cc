// The CUDA backend's one decision (cuda/backend.h): cuDNN where it takes the problem (Params::backend automatic
// or cudnn; cuda/cudnn_sdpa.h), else attn's own kernels (automatic or flash). Compiled in every build: without CUDA, or without a
// device, every call answers "no CUDA device" (cuda/runtime.h).
#include "cuda/backend.h"

#include "core/backward_problem.h"
#include "core/problem.h"
#include "cuda/cudnn_sdpa.h"
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

// cuDNN's path for a call whose graph it built (`what` names the graph for describe_attention).
Choice cudnn_choice(const std::string& what, const std::string& arch, std::int64_t workspace) {
  Choice c;
  c.path = Path::cudnn;
  c.kernel = what + " (cuDNN " + cudnn::version() + ")";
  c.arch = arch;
  c.workspace_bytes = workspace;
  return c;
}

}  // namespace

// The forward: cuDNN where it takes the problem (its host rule, then its graph for the shape), unless the caller
// asked for attn's own kernels; attn's own for everything else (or cuDNN's reason, when the caller asked for
// cuDNN): the tensor-core kernel where it takes the problem (fwd::supports), else the exact path (fp32, 8-bit K/V,
// head dims above 256).
Choice select_forward(const core::Problem& p) {
  std::string arch;
  if (Status s = usable_device(p.device, &arch); !s) return unavailable(s);
  if (p.backend != Backend::flash) {
    Status why = cudnn::takes(p);
    std::int64_t workspace = 0;
    if (why) why = cudnn::prepare(p, &workspace);
    if (why) return cudnn_choice("cudnn sdpa", arch, workspace);
    if (p.backend == Backend::cudnn) return unavailable(why);
  }
  if (Status s = fwd::exact_supports(p); !s) return unavailable(s);  // (the tensor-core kernel's grid is smaller)
  Choice c;
  c.path = Path::flash;
  c.kernel = fwd::kernel_name(p);
  c.arch = arch;
  c.workspace_bytes = static_cast<std::int64_t>(p.kv_len.size() * sizeof(std::int64_t));  // the key lengths
  return c;
}

Status run_forward(const core::Problem& p, const Choice& c) {
  if (!c.status.ok()) return c.status;
  if (c.path == Path::cudnn) return cudnn::run(p);
#if ATTN_HAVE_CUDA
  return fwd::launch(p);
#else
  (void)p;
  return require_device();
#endif
}

// The backward: cuDNN's (deterministic) for what it takes; attn's own backward kernel on the GPU is not written
// yet, so everything else is refused with cuDNN's reason.
Choice select_backward(const core::BackwardProblem& bp) {
  std::string arch;
  if (Status s = usable_device(bp.fwd.device, &arch); !s) return unavailable(s);
  Status why = bp.fwd.backend == Backend::flash
                   ? Status::Unsupported("backend", "flash: attn's own backward kernel on CUDA is not written yet; "
                                                    "expected automatic or cudnn (cuDNN's backward)")
                   : cudnn::takes_backward(bp);
  std::int64_t workspace = 0;
  if (why) why = cudnn::prepare_backward(bp, &workspace);
  if (!why) return unavailable(why);
  return cudnn_choice("cudnn sdpa backward, deterministic", arch, workspace);
}

Status run_backward(const core::BackwardProblem& bp, const Choice& c) {
  if (!c.status.ok()) return c.status;
  return cudnn::run_backward(bp);
}

#if !ATTN_HAVE_CUDA
Status merge(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
             const TensorView&, void*) {
  return require_device();
}
#endif

}  // namespace attn::cuda
