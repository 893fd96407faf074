// Kernel selection, decided once per call at the entry point.
#include <cstdlib>
#include <string>

#include <omp.h>

#include "cpu/kernels.h"

namespace attn::cpu {

Choice select_flash(const core::Problem& p) {
  Choice c;
  c.fn = portable::flash_kernel(p.q.dtype, p.k.dtype, p.mask_kind);
  c.isa = "portable";
  return c;
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

}  // namespace attn::cpu
