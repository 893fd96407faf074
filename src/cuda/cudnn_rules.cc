// Which problems the cuDNN path takes (cuda/cudnn_sdpa.h): a host rule, in every build, so that the backend's
// choice and the host tests read it whether or not CUDA or cuDNN is compiled in.
#include <cstdint>

#include "core/backward_problem.h"
#include "core/problem.h"
#include "cuda/cudnn_sdpa.h"

namespace attn::cuda::cudnn {
namespace {

#if ATTN_HAVE_CUDNN
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif

bool half(DType t) { return t == DType::bf16 || t == DType::f16; }

// A tensor cuDNN reads or writes as [B, H, S, D] with these strides: unit-stride rows, every other stride and the
// base on 16-byte boundaries (cuDNN's engines load 16-byte pieces).
Status rows_ok(const char* name, const core::Strided& t, std::int64_t elem_bytes) {
  if (t.stride[3] != 1)
    return Status::Unsupported(name, "with element stride " + std::to_string(t.stride[3]) +
                                         " for cuDNN; expected 1 (unit-stride rows)");
  for (int a = 0; a < 3; ++a)
    if ((t.stride[a] * elem_bytes) % 16 != 0)
      return Status::Unsupported(name, "with stride " + std::to_string(t.stride[a]) + " on axis " +
                                           std::to_string(a) + " for cuDNN; expected a multiple of 16 bytes");
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
    return Status::Unsupported(name, "at an address not on a 16-byte boundary for cuDNN; expected one");
  return Status::Ok();
}

// The LSE as cuDNN's statistics tensor: f32 [B, H, Sq, 1] packed (cuDNN before 9.26 reads other layouts wrongly).
Status lse_ok(const core::Problem& p) {
  if (!p.lse) return Status::Ok();
  const core::Strided& l = *p.lse;
  if (l.stride[2] != 1 || l.stride[1] != p.Sq || l.stride[0] != p.Hq * p.Sq)
    return Status::Unsupported("lse", "with strides {" + std::to_string(l.stride[0]) + ", " +
                                          std::to_string(l.stride[1]) + ", " + std::to_string(l.stride[2]) +
                                          "} for cuDNN; expected packed [B, Hq, Sq]");
  return Status::Ok();
}

}  // namespace

bool built() { return kBuilt; }

Status takes(const core::Problem& p) {
  if (!kBuilt)
    return Status::Unsupported("backend", "cudnn: this build has no cuDNN path (the cuDNN frontend's headers were not "
                                          "found when it was configured: scripts/install-cuda-tools.sh installs them)");
  if (!half(p.q.dtype))
    return Status::Unsupported("q", std::string("of dtype ") + dtype_name(p.q.dtype) + " for cuDNN; expected bf16 or f16");
  if (p.k.dtype != p.q.dtype || p.v.dtype != p.q.dtype)
    return Status::Unsupported("k", std::string("of dtype ") + dtype_name(p.k.dtype) + " for cuDNN; expected " +
                                        dtype_name(p.q.dtype) + ", q's");
  if (p.out.dtype != p.q.dtype)
    return Status::Unsupported("out", std::string("of dtype ") + dtype_name(p.out.dtype) + " for cuDNN; expected " +
                                          dtype_name(p.q.dtype) + ", q's");
  if (p.Dk % 8 != 0 || p.Dv % 8 != 0 || p.Dk > 256 || p.Dv > 256)
    return Status::Unsupported("q", "with head dims " + std::to_string(p.Dk) + " and " + std::to_string(p.Dv) +
                                        " for cuDNN; expected multiples of 8 up to 256");
  if (p.mask_kind != core::MaskKind::none)
    return Status::Unsupported("mask", "for cuDNN; expected none (attn's own kernel applies dense masks)");
  if (p.window.left >= 0 || p.window.right >= 0)
    return Status::Unsupported("window", "for cuDNN; expected none (attn's own kernel applies windows)");
  if (p.softcap > 0) return Status::Unsupported("softcap", "for cuDNN; expected 0 (attn's own kernel applies it)");
  if (p.alibi)
    return Status::Unsupported("alibi_slopes", "for cuDNN; expected none (cuDNN's ALiBi has fixed slopes; attn's own "
                                               "kernel takes any)");
  if (p.sinks) return Status::Unsupported("sinks", "for cuDNN; expected none (attn's own kernel applies them)");
  if (p.dropout.on())
    return Status::Unsupported("dropout_p", "for cuDNN; expected 0 (attn's dropout is its own Philox scheme, the "
                                            "CPU's: attn's own kernel applies it)");
  if (p.Skv < 1 || p.Sq < 1)
    return Status::Unsupported("q", "with Sq = " + std::to_string(p.Sq) + ", Skv = " + std::to_string(p.Skv) +
                                        " for cuDNN; expected both at least 1");
  bool uniform = true;
  for (const std::int64_t n : p.kv_len) {
    // A row without keys (out = 0, lse = -inf in attn) is not one cuDNN defines.
    if (n < 1) return Status::Unsupported("kv_lens", "with a length of 0 for cuDNN; expected every length >= 1");
    uniform &= n == p.Skv;
  }
  // Bottom-right causal is the diagonal of each batch's own key length in attn; with one query per sequence it is
  // no mask at all (every length is >= 1), otherwise cuDNN takes it only where every length is Skv >= Sq.
  if (p.causal == Causal::bottom_right && p.Sq > 1 && (!uniform || p.Sq > p.Skv))
    return Status::Unsupported("causal", "bottom_right with key lengths or Sq > Skv for cuDNN; expected a uniform "
                                         "key length Skv >= Sq (attn's own kernel aligns each batch)");
  if (p.paged) {
    if (p.paged->table_stride[1] != 1)
      return Status::Unsupported("page_table", "with column stride " + std::to_string(p.paged->table_stride[1]) +
                                                   " for cuDNN; expected 1");
    if (p.paged->page_size % 16 != 0 && p.paged->page_size != 1)
      return Status::Unsupported("k_pages", "with page size " + std::to_string(p.paged->page_size) +
                                                " for cuDNN; expected a multiple of 16");
  }
  const std::int64_t e = 2;  // bytes per element of bf16 / f16
  if (Status s = rows_ok("q", p.q, e); !s) return s;
  if (Status s = rows_ok("k", p.k, e); !s) return s;
  if (Status s = rows_ok("v", p.v, e); !s) return s;
  if (Status s = rows_ok("out", p.out, e); !s) return s;
  return lse_ok(p);
}

Status takes_backward(const core::BackwardProblem& bp) {
  const core::Problem& p = bp.fwd;
  if (Status s = takes(p); !s) return s;
  if (p.paged) return Status::Unsupported("k", "paged for the backward; expected contiguous K and V");
  if (!p.lse) return Status::Unsupported("lse", "missing; expected the forward's LSE");
  if (bp.dsinks) return Status::Unsupported("grad_sinks", "for cuDNN; expected none");
  const std::int64_t e = 2;
  if (Status s = rows_ok("grad_out", bp.dout, e); !s) return s;
  if (Status s = rows_ok("grad_q", bp.dq, e); !s) return s;
  if (Status s = rows_ok("grad_k", bp.dk, e); !s) return s;
  return rows_ok("grad_v", bp.dv, e);
}

}  // namespace attn::cuda::cudnn

#if !ATTN_HAVE_CUDNN
// A build without the cuDNN path: every entry answers with takes()'s reason.
namespace attn::cuda::cudnn {
Status prepare(const core::Problem& p, std::int64_t*) { return takes(p); }
Status prepare_backward(const core::BackwardProblem& bp, std::int64_t*) { return takes(bp.fwd); }
Status run(const core::Problem& p) { return takes(p); }
Status run_backward(const core::BackwardProblem& bp) { return takes(bp.fwd); }
std::string version() { return "not part of this build"; }
}  // namespace attn::cuda::cudnn
#endif
