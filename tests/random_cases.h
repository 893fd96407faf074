// Random attention configurations for the differential tests (tests/test_random.cc) and the soak run: shapes,
// layouts, dtypes, every mask kind, paged caches, scales and value ranges from ordinary to adversarial (scores to
// ±1e30, masks at the float limits, subnormals, NaN and inf in single elements), instruction-set levels and
// thread counts. Each configuration is drawn from its own 64-bit seed, printed with every failure, so any one
// can be replayed alone (ATTN_RANDOM_SEED=<seed> ATTN_RANDOM_COUNT=1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cases.h"

namespace attn::test {

enum class Special : std::uint8_t { none, subnormal, nan, pos_inf, neg_inf };
enum class SpecialWhere : std::uint8_t { q, k, v, dout };
enum class MaskValues : std::uint8_t { normal, huge_finite, float_limits };

struct RandomConfig {
  std::uint64_t seed = 0;
  Case shape;                  // sizes, causal, window, mask kind, key lengths, layout, dtypes, paging
  double qk_amplitude = 1.0;   // q and k uniform in ±amplitude
  double v_amplitude = 1.0;
  MaskValues mask_values = MaskValues::normal;
  Special special = Special::none;
  SpecialWhere special_where = SpecialWhere::q;
  int isa = 0;                 // index into supported_isas()
  int threads = 1;
  bool with_lse = true;
  std::string describe() const;
};

// The configuration of seed `seed` (forward: any size the fp64 reference handles quickly; backward: smaller,
// no paging, f32/bf16/f16 as the backward takes them).
RandomConfig random_config(std::uint64_t seed, bool backward);

// Inputs for a configuration: the registry's instantiate() (same tensors and poisoning), then the value ranges,
// mask values and special values of the configuration.
Instance instantiate_random(const RandomConfig& c);

}  // namespace attn::test
