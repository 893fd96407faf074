// The forward's two products alone, as the library's lane-major (prefill) kernel runs them: Sᵀ = K Qᵀ over one key
// tile (cpu/flash_kernel.h's scores) and Oᵀ = α·Oᵀ + Vᵀ Pᵀ (accumulate_pv), fp32, one thread, at every vector level
// this CPU runs. attn bench times whole calls, whose softmax, masks, stores and threads hide a change to the
// micro-kernel (cpu/microkernel.h) on a noisy host; this times the products by themselves: the best of many short
// repetitions, each walking `tiles` key tiles (1: everything in L1 and L2; 32 at Dk = 128: 2 MiB of K and V, read
// from L3 or memory as a long prefill reads them).
//
//   cmake --build build --target micro_products && build/micro_products [DK [TILES [REPS]]]
//
// It prints GFLOP/s per product and level; compare with the FMA ceiling of `attn bench --ceilings-only --threads 1`.
// Not built by default (EXCLUDE_FROM_ALL): a tool for whoever changes the micro-kernel.
#include "cpu/isa_prelude.h"

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "cpu/cpu_features.h"
#include "cpu/isa_list.h"

// The two levels below spell their targets out (a #pragma takes no macro); they must be src/cpu/isa_list.h's.
#define ATTN_MICRO_TARGET_OF(name, target, vec, usable) \
  if (level == #name) return target;
constexpr std::string_view isa_target(std::string_view level) {
  ATTN_VECTOR_ISAS(ATTN_MICRO_TARGET_OF)
  return "";
}
#undef ATTN_MICRO_TARGET_OF
static_assert(isa_target("avx2") == "avx2,fma,f16c", "the avx2 target below is not isa_list.h's");
static_assert(isa_target("avx512") == "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c",
              "the avx512 target below is not isa_list.h's");

namespace {
struct Rates {
  double scores = 0, pv = 0;  // GFLOP/s, best repetition
};
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

// The kernel body once per level, each in a namespace of its own (as src/cpu/isa_unit.cc.in compiles it).
#define ATTN_MICRO_PRODUCTS(NS)                                                                                       \
  namespace attn::cpu::NS {                                                                                           \
  Rates run_products(std::int64_t dk, std::int64_t tiles, int reps) {                                                 \
    const std::int64_t cols = BC;                                                                                     \
    AlignedVector<float> qt(dk * BR), st(BC * BR), ot(dk * BR), kv(2 * tiles * BC * dk), alpha(BR, 1.0f);             \
    for (std::size_t i = 0; i < qt.size(); ++i) qt[i] = 0.25f + 0.01f * static_cast<float>(i % 17), ot[i] = 0.0f;    \
    for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = 0.5f - 0.001f * static_cast<float>(i % 13);                   \
    for (std::size_t i = 0; i < st.size(); ++i) st[i] = 0.01f;                                                        \
    std::vector<const float*> krows(tiles * BC), vrows(tiles * BC);                                                   \
    for (std::int64_t r = 0; r < tiles * BC; ++r)                                                                     \
      krows[r] = kv.data() + r * dk, vrows[r] = kv.data() + (tiles * BC + r) * dk;                                    \
    const double flops = 2.0 * static_cast<double>(dk * BR * cols * tiles);                                           \
    double best_s = 1e30, best_pv = 1e30;                                                                             \
    for (int rep = 0; rep < reps; ++rep) {                                                                            \
      const double t0 = now();                                                                                        \
      for (std::int64_t t = 0; t < tiles; ++t)                                                                        \
        scores<QV_MAX>(qt.data(), krows.data() + t * BC, dk, cols, 0.125f, st.data());                                \
      const double t1 = now();                                                                                        \
      for (std::int64_t t = 0; t < tiles; ++t)                                                                        \
        accumulate_pv<QV_MAX>(st.data(), vrows.data() + t * BC, dk, cols, alpha.data(), ot.data());                   \
      const double t2 = now();                                                                                        \
      best_s = std::min(best_s, t1 - t0), best_pv = std::min(best_pv, t2 - t1);                                       \
    }                                                                                                                 \
    return {flops / best_s * 1e-9, flops / best_pv * 1e-9};                                                           \
  }                                                                                                                   \
  }

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define ATTN_ISA_NS micro_avx2
#define ATTN_VEC_AVX2
#define ATTN_VEC_BF16_DOT 0
#include "cpu/flash_kernel.h"
ATTN_MICRO_PRODUCTS(micro_avx2)
#undef ATTN_ISA_NS
#undef ATTN_VEC_AVX2
#undef ATTN_VEC_BF16_DOT
#pragma GCC diagnostic pop
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define ATTN_ISA_NS micro_avx512
#define ATTN_VEC_AVX512
#define ATTN_VEC_BF16_DOT 0
#include "cpu/flash_kernel.h"
ATTN_MICRO_PRODUCTS(micro_avx512)
#undef ATTN_ISA_NS
#undef ATTN_VEC_AVX512
#undef ATTN_VEC_BF16_DOT
#pragma GCC diagnostic pop
#pragma GCC pop_options

int main(int argc, char** argv) {
  std::int64_t dk = 128, tiles = 1, reps = 2000;
  try {
    if (argc > 1) dk = std::stoll(argv[1]);
    if (argc > 2) tiles = std::stoll(argv[2]);
    if (argc > 3) reps = std::stoll(argv[3]);
  } catch (const std::exception&) {
    dk = 0;  // (reported below)
  }
  if (argc > 4 || dk < 1 || dk > 4096 || tiles < 1 || tiles > 4096 || dk * tiles > (1 << 18) || reps < 1 ||
      reps > 1000000) {
    std::fprintf(stderr, "usage: micro_products [DK in 1..4096 [TILES in 1..4096, DK x TILES <= 262144 (K and V: "
                         "128 MiB) [REPS in 1..1000000]]]\n");
    return 2;
  }
  const attn::cpu::CpuFeatures& f = attn::cpu::cpu_features();
  std::printf("Dk = Dv = %lld, %lld key tile(s) of %lld, fp32, 1 thread, best of %lld\n", static_cast<long long>(dk),
              static_cast<long long>(tiles), static_cast<long long>(attn::cpu::micro_avx2::BC),
              static_cast<long long>(reps));
  const auto report = [](const char* level, Rates r) {
    std::printf("  %-7s scores (S^T = K Q^T) %7.1f GFLOP/s   P.V (O^T = a O^T + V^T P^T) %7.1f GFLOP/s\n", level,
                r.scores, r.pv);
  };
  if (f.avx2_usable()) report("avx2", attn::cpu::micro_avx2::run_products(dk, tiles, static_cast<int>(reps)));
  if (f.avx512_usable()) report("avx512", attn::cpu::micro_avx512::run_products(dk, tiles, static_cast<int>(reps)));
  return 0;
}
