#include "random_cases.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace attn::test {
namespace {

struct Draw {
  std::mt19937_64 rng;
  explicit Draw(std::uint64_t seed) : rng(seed) {}
  int pick(int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  std::int64_t range(std::int64_t lo, std::int64_t hi) { return lo + static_cast<std::int64_t>(rng() % (hi - lo + 1)); }
  double log_uniform(double lo, double hi) {
    return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(rng));
  }
  template <class T, std::size_t N>
  T one_of(const T (&xs)[N]) {
    return xs[pick(static_cast<int>(N))];
  }
};

const char* special_name(Special s) {
  switch (s) {
    case Special::none: return "none";
    case Special::subnormal: return "subnormal";
    case Special::nan: return "nan";
    case Special::pos_inf: return "+inf";
    case Special::neg_inf: return "-inf";
  }
  return "?";
}

}  // namespace

std::string RandomConfig::describe() const {
  std::ostringstream s;
  s << "seed " << seed << ": " << shape.name() << " qk_amplitude " << qk_amplitude << " v_amplitude " << v_amplitude
    << " scale " << (shape.scale ? std::to_string(*shape.scale) : std::string("default")) << " mask_values "
    << static_cast<int>(mask_values) << " special " << special_name(special) << " in "
    << "qkvd"[static_cast<int>(special_where)] << " isa " << cpu::isa_name(supported_isas()[isa]) << " threads "
    << threads << (with_lse ? "" : " no-lse");
  return s.str();
}

RandomConfig random_config(std::uint64_t seed, bool backward) {
  Draw d(seed);
  RandomConfig r;
  r.seed = seed;
  Case& c = r.shape;
  c.B = 1 + d.pick(3);
  c.Hkv = 1 + d.pick(3);
  const std::int64_t groups[] = {1, 1, 2, 3, 4, 8};
  c.Hq = c.Hkv * d.one_of(groups);
  const int size_class = d.pick(10);
  if (size_class < 6) {
    c.Sq = d.range(1, 24), c.Skv = d.range(1, 40);
  } else if (size_class < 9) {
    c.Sq = d.range(1, 150), c.Skv = d.range(1, 300);
  } else if (!backward) {  // long keys, few queries: split-KV
    c.B = 1, c.Hq = c.Hkv * (1 + d.pick(2)), c.Sq = d.range(1, 8), c.Skv = d.range(1000, 2200);
  } else {
    c.Sq = d.range(60, 200), c.Skv = d.range(60, 260);
  }
  if (d.chance(0.01)) c.Skv = 0;
  if (d.chance(0.01)) c.Sq = 0;
  if (d.chance(0.005)) c.B = 0;
  const std::int64_t dims[] = {1, 2, 3, 7, 8, 16, 16, 24, 32, 32, 33, 40, 64, 64, 65, 80, 96, 128, 128, 160, 256};
  c.Dk = d.one_of(dims);
  c.Dv = d.chance(0.3) ? d.one_of(dims) : c.Dk;
  // Keep the fp64 reference quick.
  const std::int64_t budget = backward ? 400'000 : 3'000'000;
  while (c.B * c.Hq * std::max<std::int64_t>(c.Sq, 1) * std::max<std::int64_t>(c.Skv, 1) * (c.Dk + c.Dv) > budget) {
    if (c.Dk + c.Dv > 64 && d.chance(0.5)) c.Dk = std::max<std::int64_t>(1, c.Dk / 2), c.Dv = std::max<std::int64_t>(1, c.Dv / 2);
    else if (c.Sq > 1 && d.chance(0.5)) c.Sq = (c.Sq + 1) / 2;
    else if (c.Hq > c.Hkv) c.Hq -= c.Hkv;
    else if (c.B > 1) --c.B;
    else c.Skv = (c.Skv + 1) / 2;
  }
  c.layout = d.one_of({Layout::bhsd, Layout::bhsd, Layout::bshd, Layout::padded});
  const std::pair<DType, DType> dtypes[] = {{DType::f32, DType::f32}, {DType::f32, DType::f32}, {DType::f32, DType::f32},
                                            {DType::bf16, DType::bf16}, {DType::bf16, DType::bf16},
                                            {DType::f16, DType::f16}, {DType::f32, DType::bf16},
                                            {DType::f32, DType::f16}};
  std::tie(c.dtype, c.kv_dtype) = d.one_of(dtypes);
  c.causal = d.one_of({Causal::none, Causal::none, Causal::top_left, Causal::bottom_right});
  if (d.chance(0.2)) {
    const std::int64_t n = std::max<std::int64_t>(c.Skv, 1);
    c.window.left = d.chance(0.3) ? -1 : d.range(0, n);
    c.window.right = d.chance(0.3) ? -1 : d.range(0, n);
    c.window.align = d.chance(0.5) ? Align::top_left : Align::bottom_right;
  }
  c.mask = d.one_of({MaskCase::none, MaskCase::none, MaskCase::none, MaskCase::additive_full, MaskCase::additive_2d,
                     MaskCase::keep_per_batch, MaskCase::keep_keys});
  c.kv_lens = d.chance(0.25);
  if (!backward && c.mask == MaskCase::none && d.chance(0.2)) {  // (a dense mask would have to span the pages)
    const std::int64_t pages[] = {1, 2, 3, 8, 16, 64};
    c.page_size = d.one_of(pages);
  }
  // Score variants: softcap (small caps that bite, and Gemma's 30/50), ALiBi slopes, sinks.
  if (d.chance(0.15)) c.softcap = d.chance(0.5) ? d.log_uniform(0.1, 10) : d.one_of({30.0, 50.0});
  if (d.chance(0.15)) c.alibi = 1 + d.pick(2);
  if (d.chance(0.15)) c.sinks = true;
  // Scale: the default, moderate, or extreme (scores up to ~1e30 in magnitude at most; see below).
  const int scale_kind = d.pick(10);
  if (scale_kind < 6) c.scale.reset();
  else if (scale_kind < 8) c.scale = d.log_uniform(1e-2, 1e2);
  else if (scale_kind < 9) c.scale = d.log_uniform(10, 40);  // peaked rows
  else {
    const double extreme[] = {1e-30, std::ldexp(1.0, -120), 1e20, 1e30, 1e37};
    c.scale = d.one_of(extreme);
  }
  // Value ranges: ordinary, large, tiny, huge (with the scale, |score| stays below ~1e30).
  const int amp_kind = d.pick(20);
  if (amp_kind < 14) r.qk_amplitude = d.log_uniform(0.1, 3);
  else if (amp_kind < 17) r.qk_amplitude = d.log_uniform(3, 40);
  else if (amp_kind < 19) r.qk_amplitude = d.log_uniform(1e-20, 1e-3);
  else r.qk_amplitude = d.log_uniform(1e6, 1e15);
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(c.Dk));
  const double limit = c.dtype == DType::f16 || c.kv_dtype == DType::f16 ? 100.0 : 1e15;
  const double dot_max = 1e30 / std::max(scale, 1.0);  // |q·k| and |scale·q·k| below 1e30
  r.qk_amplitude = std::min({r.qk_amplitude, limit, std::sqrt(dot_max / static_cast<double>(c.Dk))});
  if (scale * r.qk_amplitude * r.qk_amplitude * static_cast<double>(c.Dk) > 1e30)
    r.qk_amplitude = std::sqrt(1e30 / (scale * static_cast<double>(c.Dk)));
  r.v_amplitude = d.chance(0.8) ? 1.0 : d.log_uniform(1e-3, c.dtype == DType::f16 ? 100.0 : 1e3);
  r.mask_values = d.one_of({MaskValues::normal, MaskValues::normal, MaskValues::normal, MaskValues::normal,
                            MaskValues::huge_finite, MaskValues::float_limits});
  const int special = d.pick(100);
  r.special = special < 85 ? Special::none
              : special < 90 ? Special::subnormal
              : special < 94 ? Special::nan
              : special < 97 ? Special::pos_inf
                             : Special::neg_inf;
  r.special_where = backward ? d.one_of({SpecialWhere::q, SpecialWhere::k, SpecialWhere::v, SpecialWhere::dout})
                             : d.one_of({SpecialWhere::q, SpecialWhere::k, SpecialWhere::v});
  r.isa = d.pick(static_cast<int>(supported_isas().size()));
  r.threads = 1 + d.pick(3);
  r.with_lse = backward || d.chance(0.8);
  // Dropout, drawn last so that the draws above stay what they were for a seed.
  if (d.chance(0.1)) c.dropout = d.chance(0.5) ? d.log_uniform(1e-3, 0.5) : d.one_of({0.17, 0.9});
  // Quantised K/V (forward only: the backward refuses them), after everything else for the same reason: an 8-bit
  // cache (a scale per row) or a 4-bit one (a scale per 32 values); the amplitudes and subnormals then go into the
  // scales, a NaN or inf into q (instantiate_random).
  if (!backward && d.chance(0.12)) c.kv_dtype = d.chance(0.5) ? DType::i8 : DType::i4;
  return r;
}

namespace {

// Multiplies every element of t by `factor` (uniform ±1 values become uniform ±factor).
void scale_values(Tensor& t, double factor) {
  if (factor == 1.0) return;
  t.for_each_index([&](auto a, auto b, auto c, auto e) { t.set(t.get(a, b, c, e) * factor, a, b, c, e); });
}

double special_value(Special s, DType dtype, std::mt19937_64& rng) {
  switch (s) {
    case Special::subnormal: {
      const double tiny = dtype == DType::f16 ? 3e-6 : 1e-40;
      return (rng() & 1 ? tiny : -tiny) * (1 + static_cast<double>(rng() % 7));
    }
    case Special::nan: return std::numeric_limits<double>::quiet_NaN();
    case Special::pos_inf: return std::numeric_limits<double>::infinity();
    case Special::neg_inf: return -std::numeric_limits<double>::infinity();
    case Special::none: break;
  }
  return 0;
}

// Puts the configuration's special value into t: into one element, or (subnormals) into a tenth of them.
void place_special(Tensor& t, Special s, std::mt19937_64& rng) {
  if (s == Special::none || t.view.numel() == 0) return;
  if (s == Special::subnormal) {
    t.for_each_index([&](auto a, auto b, auto c, auto e) {
      if (rng() % 10 == 0) t.set(special_value(s, t.view.dtype, rng), a, b, c, e);
    });
    return;
  }
  std::int64_t idx[4] = {0, 0, 0, 0};
  for (int i = 0; i < t.view.rank; ++i) idx[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(t.view.shape[i]));
  t.set(special_value(s, t.view.dtype, rng), idx[0], idx[1], idx[2], idx[3]);
}

}  // namespace

Instance instantiate_random(const RandomConfig& rc) {
  return instantiate(rc.shape, rc.seed * 0x9E3779B97F4A7C15ull + 1, [&](Instance& in, std::mt19937_64& rng) {
    // Quantised K/V hold integers: their amplitudes and subnormal specials go into their scales; a NaN or inf
    // goes into q instead (the scales' contract is finite values: the kernels apply a row's scale to its dot
    // product, the reference to each value, and the two differ for an inf scale: docs/api.md).
    const bool quantised = rc.shape.kv_dtype == DType::i8 || rc.shape.kv_dtype == DType::i4;
    const bool into_q = quantised && rc.special != Special::none && rc.special != Special::subnormal;
    Tensor& k = into_q ? in.q : quantised ? in.k_scale : in.k;
    Tensor& v = into_q ? in.q : quantised ? in.v_scale : in.v;
    scale_values(in.q, rc.qk_amplitude);
    scale_values(quantised ? in.k_scale : in.k, rc.qk_amplitude);
    scale_values(quantised ? in.v_scale : in.v, rc.v_amplitude);
    if (rc.shape.mask == MaskCase::additive_full || rc.shape.mask == MaskCase::additive_2d) {
      const double fmax = std::numeric_limits<float>::max();
      in.mask.for_each_index([&](auto a, auto b, auto c, auto e) {
        const double x = in.mask.get(a, b, c, e);
        if (std::isinf(x) || rc.mask_values == MaskValues::normal) return;
        const int roll = static_cast<int>(rng() % 100);
        if (rc.mask_values == MaskValues::huge_finite)
          in.mask.set(roll < 30 ? -1e10 : roll < 33 ? 1e10 : x, a, b, c, e);
        else
          in.mask.set(roll < 30 ? -fmax : roll < 32 ? fmax : x, a, b, c, e);
      });
    }
    switch (rc.special_where) {
      case SpecialWhere::q: place_special(in.q, rc.special, rng); break;
      case SpecialWhere::k: place_special(k, rc.special, rng); break;
      case SpecialWhere::v: place_special(v, rc.special, rng); break;
      case SpecialWhere::dout: break;  // placed by the backward test in its dO
    }
  });
}

}  // namespace attn::test
