// Kernel selection, decided once per call at the entry point.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"

namespace attn::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::sse2: return "sse2";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amx: return "amx";
  }
  return "unknown";
}

Isa best_isa() {
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma")) {
      // AMX also needs the tile state enabled in XCR0 and Linux's per-process grant of tile data.
      const CpuFeatures& f = cpu_features();
      if (!f.avx512_bf16) return Isa::avx512;
      if (f.amx_bf16_usable() && request_amx().ok) return Isa::amx;
      return Isa::avx512bf16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Isa::avx2;
    return Isa::sse2;
  }();
  return best;
}

Isa active_isa() {
  Isa isa = best_isa();
  if (const char* env = std::getenv("ATTN_ISA")) {
    for (Isa level : {Isa::sse2, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
      if (std::strcmp(env, isa_name(level)) == 0 && static_cast<int>(level) < static_cast<int>(isa)) isa = level;
    if (std::strcmp(env, "scalar") == 0 || std::strcmp(env, "baseline") == 0) isa = Isa::sse2;
  }
  return isa;
}

Choice select_flash(const core::Problem& p) {
  Choice c;
  c.isa = active_isa();
  // AMX pays for its packing only with enough query rows per KV head (prefill); decode-sized problems are
  // bound by memory and stay on the vector kernels.
  if (c.isa == Isa::amx) {
    if (p.Sq * p.group >= 64)
      if ((c.fn = amx::flash_kernel(p))) return c;
    c.isa = Isa::avx512bf16;
  }
  switch (c.isa) {
    case Isa::amx:
    case Isa::avx512bf16: c.fn = avx512bf16::flash_kernel(p.q.dtype, p.k.dtype, p.mask_kind); break;
    case Isa::avx512: c.fn = avx512::flash_kernel(p.q.dtype, p.k.dtype, p.mask_kind); break;
    case Isa::avx2: c.fn = avx2::flash_kernel(p.q.dtype, p.k.dtype, p.mask_kind); break;
    case Isa::sse2: c.fn = sse2::flash_kernel(p.q.dtype, p.k.dtype, p.mask_kind); break;
  }
  return c;
}

BackwardFn select_backward(const core::Problem& p) {
  switch (active_isa()) {
    case Isa::amx:
    case Isa::avx512bf16:
    case Isa::avx512: return avx512::backward_kernel(p.q.dtype, p.k.dtype, p.mask_kind);
    case Isa::avx2: return avx2::backward_kernel(p.q.dtype, p.k.dtype, p.mask_kind);
    case Isa::sse2: return sse2::backward_kernel(p.q.dtype, p.k.dtype, p.mask_kind);
  }
  return nullptr;
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("ATTN_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n <= 4096) return static_cast<int>(n);
  }
  return omp_get_max_threads();
}

std::int64_t flash_workspace_bytes(std::int64_t dk, std::int64_t dv) {
  const std::int64_t w = active_isa() >= Isa::avx512 ? 16 : active_isa() == Isa::avx2 ? 8 : 4;
  const std::int64_t br = 4 * w, bc = 64;
  // Q (Qᵀ or rows), K and V tiles, Sᵀ, O (Oᵀ or rows), m, l, α per lane, and the tile's row pointers.
  return 4 * (dk * br + bc * dk + bc * dv + bc * br + dv * br + 3 * br) + 2 * bc * 8;
}

}  // namespace attn::cpu
