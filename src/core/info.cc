// attn/info.h over the private dispatch (cpu/kernels.h) and CPU detection (cpu/cpu_features.h).
#include "attn/info.h"

#include <cstdio>
#include <new>

#include "attn/backward.h"
#include "core/backward_problem.h"
#include "core/problem.h"
#include "core/workspace_impl.h"
#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "cuda/backend.h"
#include "reference/reference.h"

namespace attn {

std::vector<std::string> isa_levels() {
  std::vector<std::string> out;
  for (int i = 0; i < cpu::kIsaCount; ++i) out.emplace_back(cpu::isa_name(static_cast<cpu::Isa>(i)));
  return out;
}

namespace {
std::optional<cpu::Isa> level_of(const std::string& name) {
  for (int i = 0; i < cpu::kIsaCount; ++i)
    if (name == cpu::isa_name(static_cast<cpu::Isa>(i))) return static_cast<cpu::Isa>(i);
  return std::nullopt;
}
}  // namespace

bool isa_supported(const std::string& level) {
  const std::optional<cpu::Isa> isa = level_of(level);
  return isa && cpu::isa_supported(*isa);
}
std::string best_isa() { return cpu::isa_name(cpu::best_isa()); }
std::string active_isa() { return cpu::isa_name(cpu::active_isa()); }

Status set_isa(const std::string& level) {
  if (level.empty()) {
    cpu::set_isa_override(std::nullopt);
    return Status::Ok();
  }
  const std::optional<cpu::Isa> isa = level_of(level);
  if (!isa) {
    std::string known;
    for (const std::string& l : isa_levels()) known += (known.empty() ? "" : ", ") + l;
    return Status::Invalid("level", "'" + level + "' is not a level; expected one of " + known + " (or \"\")");
  }
  if (!cpu::isa_supported(*isa))
    return Status::Unsupported("level", "'" + level + "' is not supported by this CPU and OS; expected at most " +
                                            best_isa());
  cpu::set_isa_override(isa);
  return Status::Ok();
}

int resolve_threads(int requested) { return cpu::resolve_threads(requested); }

namespace {

// What the CUDA backend's decision says of a call (cuda/backend.h), or why it cannot run.
Status describe_cuda(const cuda::Choice& c, KernelInfo* r) {
  if (!c.status) return c.status;
  r->backend = c.path == cuda::Path::cudnn ? "cudnn" : "flash";
  r->isa = c.arch;
  r->kernel = c.kernel;
  r->threads = 0;
  r->workspace_bytes = c.workspace_bytes;
  return Status::Ok();
}

// What a validated forward problem would run (attention() and attention_paged() alike).
Status describe_forward(const core::Problem& p, KernelInfo* info) {
  KernelInfo r;
  r.threads = cpu::resolve_threads(p.threads);
  if (p.backend == Backend::reference) {
    r.backend = r.kernel = "reference";
    r.threads = 1;
    r.workspace_bytes = reference::bytes_needed(p, /*backward=*/false);
  } else if (p.device.is_cuda()) {
    if (Status s = describe_cuda(cuda::select_forward(p), &r); !s) return s;
  } else {
    const cpu::Choice c = cpu::select_flash(p, r.threads);
    if (!c.fn) return Status::Unsupported("q", "no flash kernel for these dtypes");
    r.backend = "flash";
    r.isa = cpu::isa_name(c.isa);
    r.kernel = c.kernel;
    r.workspace_bytes = c.workspace_bytes;
  }
  *info = r;
  return Status::Ok();
}
}  // namespace

Status describe_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const Params& params, const std::optional<TensorView>& lse, KernelInfo* info) {
  core::Problem p;
  const core::KvLenLoan loan{p};
  if (Status s = core::validate(q, k, v, out, params, lse, &p); !s) return s;
  return describe_forward(p, info);
}

Status describe_attention_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                                const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                                const Params& params, const std::optional<TensorView>& lse, KernelInfo* info) {
  core::Problem p;
  const core::KvLenLoan loan{p};
  if (Status s = core::validate_paged(q, k_pages, v_pages, page_table, seq_lens, out, params, lse, &p); !s) return s;
  return describe_forward(p, info);
}

Status describe_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& lse, const TensorView& grad_out,
                                   const TensorView& grad_q, const TensorView& grad_k, const TensorView& grad_v,
                                   const Params& params, KernelInfo* info) {
  core::BackwardProblem bp;
  const core::KvLenLoan loan{bp.fwd};
  if (Status s = core::validate_backward(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, params, std::nullopt, &bp); !s)
    return s;
  KernelInfo r;
  r.threads = cpu::resolve_threads(bp.fwd.threads);
  if (bp.fwd.backend == Backend::reference) {
    r.backend = r.kernel = "reference";
    r.threads = 1;
    r.workspace_bytes = reference::bytes_needed(bp.fwd, /*backward=*/true);
  } else if (bp.fwd.device.is_cuda()) {
    if (Status s = describe_cuda(cuda::select_backward(bp), &r); !s) return s;
  } else {
    const cpu::BackwardChoice c = cpu::select_backward(bp, r.threads);
    if (!c.fn) return Status::Unsupported("q", "no backward kernel for these dtypes");
    r.backend = "flash";
    r.isa = cpu::isa_name(c.isa);
    r.kernel = "vector";
    r.workspace_bytes = c.workspace_bytes;
  }
  *info = r;
  return Status::Ok();
}

CpuInfo cpu_info() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  CpuInfo c;
  c.vendor = f.vendor, c.brand = f.brand;
  c.family = f.family, c.model = f.model, c.stepping = f.stepping;
  c.microarchitecture = cpu::microarchitecture(f.vendor, f.family, f.model, f.stepping);
  c.cpuid = {{"sse2", f.sse2},         {"avx", f.avx},           {"avx2", f.avx2},         {"fma", f.fma},
             {"f16c", f.f16c},         {"avx512f", f.avx512f},   {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl},
             {"avx512dq", f.avx512dq}, {"avx512_bf16", f.avx512_bf16}, {"avx512_fp16", f.avx512_fp16},
             {"amx_tile", f.amx_tile}, {"amx_bf16", f.amx_bf16}, {"amx_int8", f.amx_int8}};
  c.osxsave = f.osxsave, c.xcr0 = f.xcr0;
  c.os_avx = f.os_avx, c.os_avx512 = f.os_avx512, c.os_amx = f.os_amx;
  const cpu::AmxPermission before = cpu::amx_permission();  // (what the process had before any request below)
  c.amx_offered = before.kernel_supports, c.amx_permitted_before = before.permitted;
  if (f.amx_tile && f.os_amx) {
    const cpu::AmxRequest request = cpu::request_amx();
    c.amx_granted = request.ok;
    c.amx_error = request.error;
  }
  c.l1d_bytes = f.l1d_bytes, c.l2_bytes = f.l2_bytes, c.l3_bytes = f.l3_bytes;
  return c;
}

std::string describe_cpu(const CpuInfo& c) {
  const auto hex = [](int x) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%X", static_cast<unsigned>(x));
    return std::string(b);
  };
  std::string s = c.brand.empty() ? (c.vendor.empty() ? std::string("unknown CPU") : c.vendor) : c.brand;
  std::string detail = c.microarchitecture;
  if (c.family > 0) {
    detail += (detail.empty() ? "" : "; ") + c.vendor + " family " + hex(c.family) + " model " + hex(c.model) +
              " stepping " + std::to_string(c.stepping);
  }
  return detail.empty() ? s : s + " (" + detail + ")";
}

}  // namespace attn
