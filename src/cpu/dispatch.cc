// Kernel selection: one table of levels {name, usable here, kernels}, built once from cpu/isa_list.h, and the
// one decision per call (select_flash, select_backward).
#include <omp.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "attn/info.h"
#include "core/backward_problem.h"
#include "cpu/cpu_features.h"
#include "cpu/kernels.h"

namespace attn::cpu {
namespace {

struct Level {
  const char* name;
  bool usable;          // the CPU has it, the OS enables it and the build compiled it
  KernelSet kernels;    // amx: its vector kernels are the last vector level's
};

// The table, built once: the vector levels of cpu/isa_list.h, then amx.
const std::array<Level, kIsaCount>& levels() {
  static const std::array<Level, kIsaCount> table = [] {
    const CpuFeatures& f = cpu_features();
    std::array<Level, kIsaCount> t{};
    int i = 0;
    // (a level this build did not compile, ATTN_ISA_LEVELS=host, has no kernels: unusable like one the CPU lacks)
#define ATTN_ISA_ROW(name, target, vec, usable_expr) \
  t[i] = {#name, static_cast<bool>(usable_expr), name::kernels()}; \
  t[i].usable = t[i].usable && t[i].kernels.flash != nullptr; \
  ++i;
    ATTN_VECTOR_ISAS(ATTN_ISA_ROW)
#undef ATTN_ISA_ROW
    // AMX also needs Linux's per-process grant of tile data (asked here, once).
    const Level& below = t[static_cast<int>(Isa::amx) - 1];
    t[i] = {"amx", below.usable && f.amx_bf16_usable() && request_amx().ok, below.kernels};
    return t;
  }();
  return table;
}

// The environment's ATTN_ISA, read once: the level it names (nullopt when unset or unusable, reported once).
std::optional<Isa> env_isa() {
  static const std::optional<Isa> level = []() -> std::optional<Isa> {
    const char* env = std::getenv("ATTN_ISA");
    if (!env || !*env) return std::nullopt;
    if (!std::strcmp(env, "scalar") || !std::strcmp(env, "baseline")) return Isa::sse2;
    for (int i = 0; i < kIsaCount; ++i)
      if (!std::strcmp(env, levels()[i].name)) {
        if (levels()[i].usable) return static_cast<Isa>(i);
        std::fprintf(stderr, "attn: ATTN_ISA=%s is not supported by this CPU and OS; using %s\n", env,
                     isa_name(best_isa()));
        return std::nullopt;
      }
    std::string known;
    for (int i = 0; i < kIsaCount; ++i) known += std::string(i ? ", " : "") + levels()[i].name;
    std::fprintf(stderr, "attn: ATTN_ISA=%s is not a level (%s, or scalar = sse2); using %s\n", env, known.c_str(),
                 isa_name(best_isa()));
    return std::nullopt;
  }();
  return level;
}

std::atomic<int> override_level{-1};
std::atomic<int> override_bf16_dot{-1};  // -1: the CPU's answer; 0, 1: set_bf16_dot_override

}  // namespace

const char* isa_name(Isa isa) {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < kIsaCount ? levels()[i].name : "unknown";
}

bool isa_supported(Isa isa) {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < kIsaCount && levels()[i].usable;
}

Isa best_isa() {
  static const Isa best = [] {
    int b = 0;
    for (int i = 0; i < kIsaCount; ++i)
      if (levels()[i].usable) b = i;
    return static_cast<Isa>(b);
  }();
  return best;
}

void set_isa_override(std::optional<Isa> isa) { override_level.store(isa && isa_supported(*isa) ? static_cast<int>(*isa) : -1); }

bool bf16_dot_preferred() {
  static const bool fast = cpu_features().bf16_dot_fast();
  const int forced = override_bf16_dot.load(std::memory_order_relaxed);
  return forced >= 0 ? forced == 1 : fast;
}

void set_bf16_dot_override(std::optional<bool> prefer) { override_bf16_dot.store(prefer ? (*prefer ? 1 : 0) : -1); }

Isa active_isa() {
  const int forced = override_level.load();
  if (forced >= 0) return static_cast<Isa>(forced);
  if (const std::optional<Isa> env = env_isa()) return *env;
  return best_isa();
}

Choice select_flash(const core::Problem& p, int threads) {
  Choice c;
  c.isa = active_isa();
  // bf16 prefill runs on the pair-product kernel (cpu/flash_amx.cc) where the level multiplies bf16 pairs faster
  // than fp32 FMAs: AMX tiles at amx, vdpbf16ps at avx512bf16 where bf16_dot_preferred() (AMD; see
  // CpuFeatures::bf16_dot_fast). It pays for packing K and V only with enough query rows per KV head (at least two
  // of its 32-row blocks); decode-sized problems are bound by memory and stay on the vector kernels.
  const bool prefill = p.Sq * p.group >= 64;
  if (c.isa == Isa::amx) {
    if (prefill)
      if ((c.fn = amx::flash_kernel(p))) {
        c.workspace_bytes = amx::flash_workspace(p, threads);
        c.kernel = "amx";
        return c;
      }
    c.isa = Isa::avx512bf16;
  }
  if (c.isa == Isa::avx512bf16 && prefill && bf16_dot_preferred())
    if ((c.fn = bf16dot::flash_kernel(p))) {
      c.workspace_bytes = bf16dot::flash_workspace(p, threads);
      c.kernel = "bf16 dot";
      return c;
    }
  const KernelSet& k = levels()[static_cast<int>(c.isa)].kernels;
  c.fn = k.flash(p.q.dtype, p.k.dtype, core::variant_kind(p));
  c.workspace_bytes = c.fn ? k.flash_workspace(p, threads) : 0;
  if (c.fn) c.kernel = k.flash_name(p);
  return c;
}

BackwardChoice select_backward(const core::BackwardProblem& bp, int threads) {
  const core::Problem& p = bp.fwd;
  BackwardChoice c;
  c.isa = active_isa();
  if (c.isa == Isa::amx) c.isa = static_cast<Isa>(static_cast<int>(Isa::amx) - 1);  // no AMX backward
  const KernelSet& k = levels()[static_cast<int>(c.isa)].kernels;
  c.fn = k.backward(p.q.dtype, p.k.dtype, core::variant_kind(p));
  c.workspace_bytes = c.fn ? k.backward_workspace(bp, threads) : 0;
  return c;
}

namespace {
// set_num_threads()'s count; 0 = none set. Read on every call, so a change applies to the next call.
std::atomic<int> threads_override{0};
}  // namespace

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (const int forced = threads_override.load(std::memory_order_relaxed); forced > 0) return forced;
  static const int env = [] {
    const char* s = std::getenv("ATTN_NUM_THREADS");
    if (!s || !*s) return 0;
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    if (end != s && *end == '\0' && n > 0 && n <= 4096) return static_cast<int>(n);
    std::fprintf(stderr, "attn: ATTN_NUM_THREADS=%s is not a thread count in 1..4096; using OpenMP's default\n", s);
    return 0;
  }();
  return env > 0 ? env : omp_get_max_threads();
}

}  // namespace attn::cpu

namespace attn {

// attn/info.h's setter lives here, beside the override it sets (the getter, resolve_threads, is in core/info.cc).
Status set_num_threads(int n) {
  if (n < 0 || n > 4096)
    return Status::Invalid("n", std::to_string(n) + " is not a thread count; expected 1..4096, or 0 for the "
                                                     "default (ATTN_NUM_THREADS, else OpenMP's)");
  cpu::threads_override.store(n, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace attn
