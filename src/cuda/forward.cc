// Which problems attn's own forward kernel takes (cuda/forward.h), in every build: the backend's choice and the
// host tests read it whether or not CUDA is compiled in.
#include "cuda/forward.h"

#include <cstdlib>

#include "core/variant.h"
#include "cuda/exact_row.h"

namespace attn::cuda::fwd {

Status supports(const core::Problem& p) {
  const DType t = p.q.dtype;
  if (t != DType::bf16 && t != DType::f16)
    return Status::Unsupported("q", std::string("of dtype ") + dtype_name(t) +
                                        " on CUDA; expected bf16 or f16 (attn's GPU kernel runs on tensor cores; fp32 "
                                        "inputs run on the CPU)");
  if (p.k.dtype != t) return Status::Unsupported("k", std::string("of dtype ") + dtype_name(p.k.dtype) + " on CUDA; expected " + dtype_name(t) + ", q's");
  if (p.v.dtype != t) return Status::Unsupported("v", std::string("of dtype ") + dtype_name(p.v.dtype) + " on CUDA; expected " + dtype_name(t) + ", q's");
  if (p.out.dtype != DType::f32 && p.out.dtype != DType::bf16 && p.out.dtype != DType::f16)
    return Status::Unsupported("out", std::string("of dtype ") + dtype_name(p.out.dtype) + " on CUDA; expected f32, bf16 or f16");
  if (padded_head_dim(p.Dk, p.Dv) == 0)
    return Status::Unsupported("q", "with head dims " + std::to_string(p.Dk) + " and " + std::to_string(p.Dv) +
                                        " on CUDA; expected at most 256");
  // One thread block per 64 packed query rows of each (batch, KV head) (cuda/schedule.h), a one-dimensional grid
  // (split-KV's parts are its second dimension, at most 128).
  const std::int64_t blocks = sched::packed_grid_blocks(p.B, p.Hkv, p.group, p.Sq, Config<MmaType::bf16, 64>::kBlockM);
  if (blocks > std::int64_t{0x7fffffff})
    return Status::Unsupported("q", "with " + std::to_string(blocks) +
                                        " thread blocks on CUDA; expected at most 2^31 - 1");
  return Status::Ok();
}

Status exact_supports(const core::Problem& p) {
  const std::int64_t blocks = sched::ceil_div(p.B * p.Hq * p.Sq * exact::chunks(p.Dv), exact::kThreads);
  if (blocks > std::int64_t{0x7fffffff})
    return Status::Unsupported("q", "with " + std::to_string(blocks) + " thread blocks on CUDA; expected at most 2^31 - 1");
  return Status::Ok();
}

bool exact_forced() {
  const char* v = std::getenv("ATTN_CUDA_EXACT");
  return v != nullptr && v[0] == '1';
}

std::string kernel_name(const core::Problem& p) {
  if (!supports(p) || exact_forced()) {
    const char* quantised = p.k.dtype == DType::i8 ? " with 8-bit K/V" : p.k.dtype == DType::i4 ? " with 4-bit K/V" : "";
    return std::string("exact forward (f32 FMAs, ") + dtype_name(p.q.dtype) + quantised +
           ", d" + std::to_string(p.Dk) + (general_variant(p) ? ", general variant)" : ", plain)");
  }
  std::string name;
  with_config(p, [&](auto cfg, auto variant) {
    using C = decltype(cfg);
    using V = decltype(variant);
    name = std::string("flash forward (tensor cores, ") + mma_type_name(C::kType) + ", d" + std::to_string(C::kD) +
           (std::is_same_v<V, GeneralVariant> ? ", general variant)" : ", plain)");
  });
  return name;
}

}  // namespace attn::cuda::fwd
