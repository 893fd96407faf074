// One registry of attention cases, driving the correctness tests (and, later, the benchmarks).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "reference/reference.h"
#include "support.h"

namespace attn::test {

enum class MaskCase {
  none,
  additive_full,     // f32 [B, Hq, Sq, Skv] with some -inf entries
  additive_2d,       // f32 [Sq, Skv] broadcast over batch and heads
  keep_per_batch,    // bool [B, 1, Sq, Skv] broadcast over heads, some rows fully blocked
  keep_keys,         // bool [Skv] (rank 1: a key padding mask)
};

struct Case {
  std::int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, Dk = 16, Dv = 16;
  Causal causal = Causal::none;
  Window window;
  MaskCase mask = MaskCase::none;
  bool kv_lens = false;  // random per-batch key lengths in [0, Skv], including 0 and Skv
  Layout layout = Layout::bhsd;
  DType dtype = DType::f32;     // q and out
  DType kv_dtype = DType::f32;  // k and v (i8: random 8-bit values with random scales per row)
  double amplitude = 1.0;       // inputs uniform in [-amplitude, amplitude]
  std::optional<double> scale;
  std::int64_t page_size = 0;  // > 0: K/V go through attention_paged from a shuffled page pool
  // Score variants (attn::Params): softcap (0 = off); ALiBi slopes (0 none, 1 [Hq], 2 [B, Hq]); sinks [Hq]
  // (random logits, head 0's -inf = no sink when Hq > 1); dropout.
  double softcap = 0;
  int alibi = 0;
  bool sinks = false;
  double dropout = 0;  // dropout_p (the seed drawn from the case's name)

  std::string name() const;  // a gtest-safe unique name
};

std::vector<Case> registry();
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// Inputs and poisoned outputs for one case, built deterministically from the case's name.
struct Instance {
  Tensor q, k, v, out, lse, mask, kv_lens, alibi, sinks;
  Params params;
  // Paged cases: the same K/V scattered over a pool of pages (unused pages hold NaN).
  Tensor k_pages, v_pages, page_table, seq_lens;
  // i8 K/V: the scale of each row, [B, Hkv, Skv] (params holds these), and [P, Hkv, page_size] over the pool
  // (what run() passes to attention_paged).
  Tensor k_scale, v_scale, k_scale_pages, v_scale_pages;
  // The largest |value| of V as the kernels read it (i8 values times their scales).
  double max_abs_v() const;
  // Runs the case's entry point (attention or attention_paged) with the given overrides.
  // with_lse = false: no LSE output (kernels may then take cheaper paths, e.g. AMX's degree-3 exp2).
  Status run(Backend backend, int threads, bool with_lse = true);
  // The validated problem run() would run (its entry point's validation), without running it.
  Status problem(Backend backend, int threads, bool with_lse, core::Problem* p) const;
};
Instance instantiate(const Case& c);

// The outputs of one run, as doubles in index order (out over [B, Hq, Sq, Dv], the LSE over [B, Hq, Sq]).
struct Outputs {
  std::vector<double> out, lse;
};
// Poisons out and lse with NaN, runs `run` (which must succeed), checks that no byte of out's storage outside its
// view changed, and reads the results (the LSE only with with_lse).
Outputs run_poisoned(Instance& in, const std::function<Status(Instance&)>& run, bool with_lse = true);
// The tolerance rule on a run's out (and LSE, with with_lse) against the fp64 reference `ref`, the naive
// same-precision result `naive` as the yardstick; `what` names the run in a failure.
void expect_matches_reference(const Case& c, const Instance& in, const reference::Result& ref,
                              const reference::Result& naive, const Outputs& r, bool with_lse, const std::string& what);
// The same from an explicit seed; `adjust` (if set) may change values (q, k, v, mask) before a paged case
// scatters K and V over its pages.
Instance instantiate(const Case& c, std::uint64_t seed, const std::function<void(Instance&, std::mt19937_64&)>& adjust);

// Cases that leave other scratch in a reused attn::Workspace before c runs: a longer one (more keys, other
// split-KV partials and row statistics, more queries) and a wider one (other tile widths).
std::vector<Case> workspace_primers(const Case& c);

// ---- the backward pass ------------------------------------------------------------------------------

// The registry's cases whose fp64 backward reference stays cheap (B·Hq·Sq·Skv·(Dk + Dv) bounded), which
// keeps every mask, alignment, GQA ratio, Dv != Dk, layout and dtype; plus cases for the backward's tiles.
std::vector<Case> backward_registry();

// dO (random) and poisoned gradient outputs dQ, dK, dV for one case, in the case's layout and dtypes.
struct GradInstance {
  Tensor dout, dq, dk, dv;
  Tensor dsinks;  // [Hq] f32, for cases with sinks (poisoned)
};
GradInstance instantiate_grads(const Case& c);

// Values of a tensor in logical [B, H, S, D] order (the reference's order).
std::vector<double> values(const Tensor& t);
// The largest finite |x| of x, and at least `floor`.
double max_finite(const std::vector<double>& x, double floor);
// The largest L2 norm of a [.., .., S, D] tensor's finite rows (0 for an empty tensor).
double max_row_norm(const Tensor& t);
// True when no byte of t's storage outside its view differs from `before` (a copy taken before the call).
bool untouched_outside(const Tensor& t, const std::vector<unsigned char>& before);

// The gradient tolerance rule: dQ, dK, dV in g (the case's dtypes) against the fp64 reference `ref`, with the
// naive fp32 backward `naive` as the yardstick: error <= 3 x naive's + an atol of rounding noise at the size of
// the summed terms (for dV the gradient and dO; for dQ and dK also scale·|dO_i|·|V_j|·max|K| (resp. max|Q|), the
// size of the dS·K terms whose cancellation can leave a gradient far smaller than its terms: a row with one
// allowed key has dQ = 0 exactly). A reference value past the range of its dtype is compared as stored (±inf), and
// where the atol itself passes the dtype's range (f16 gradients at scales like 1e20: two tied keys' dQ terms cancel
// to an FMA's rounding residue, ~1e11, where the naive sum of rounded products gives 0) a ±inf result is within it.
// dsinks (when the case has sinks and g holds them) under the same rule. "" when all pass, else what failed.
std::string gradient_failures(const Case& c, const Instance& in, const GradInstance& g, double scale,
                              const reference::Grads& ref, const reference::Grads& naive);

}  // namespace attn::test
