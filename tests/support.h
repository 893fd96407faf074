// Test support: owned tensors in any layout, random fill, NaN poisoning, and the tolerance rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attn/attn.h"
#include "core/convert.h"
#include "core/problem.h"
#include "cpu/kernels.h"
#include "reference/reference.h"

namespace attn::test {

enum class Layout { bhsd, bshd, padded };  // padded: BHSD with gaps between rows and a reversed head order

inline const char* layout_name(Layout l) { return l == Layout::bhsd ? "bhsd" : l == Layout::bshd ? "bshd" : "padded"; }

// A [B, H, S, D] tensor that owns its storage (with extra room in the padded layout) and exposes a view.
struct Tensor {
  std::vector<unsigned char> storage;
  TensorView view;

  Tensor() = default;
  Tensor(DType dtype, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, Layout layout = Layout::bhsd) {
    const bool i4 = dtype == DType::i4;  // two values per byte: rows start on a byte (even strides, attn/tensor.h)
    const auto even = [&](std::int64_t x) { return i4 ? (x + 1) / 2 * 2 : x; };
    const std::int64_t dp = even(d);  // elements per row as stored
    view.dtype = dtype;
    view.rank = 4;
    view.shape = {b, h, s, d};
    std::int64_t elems = 0;
    std::int64_t base = 0;
    switch (layout) {
      case Layout::bhsd:
        view.strides = {h * s * dp, s * dp, dp, 1};
        elems = b * h * s * dp;
        break;
      case Layout::bshd:
        view.strides = {s * h * dp, dp, h * dp, 1};
        elems = b * h * s * dp;
        break;
      case Layout::padded: {  // row pitch d + 3, heads stored in reverse order (negative head stride)
        const std::int64_t pitch = even(d + 3), head = even(s * pitch + 5), batch = even(h * head + 7);
        view.strides = {batch, -head, pitch, 1};
        base = (h - 1) * head;
        elems = b * batch + 8;
        break;
      }
    }
    const std::int64_t bytes = dtype_bytes(dtype, std::max<std::int64_t>(elems, 1));
    storage.assign(static_cast<std::size_t>(bytes), 0);
    view.data = storage.data() + dtype_bytes(dtype, base);
  }
  // A rank-1..4 contiguous tensor (masks, key lengths, lse).
  static Tensor plain(DType dtype, std::vector<std::int64_t> shape) {
    Tensor t;
    t.view.dtype = dtype;
    t.view.rank = static_cast<int>(shape.size());
    std::int64_t n = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) t.view.shape[i] = shape[i], n *= shape[i];
    std::int64_t stride = 1;
    for (int i = t.view.rank - 1; i >= 0; --i) t.view.strides[i] = stride, stride *= t.view.shape[i];
    t.storage.assign(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dtype), 0);
    t.view.data = t.storage.data();
    return t;
  }

  std::int64_t offset(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    const std::int64_t idx[4] = {a, b, c, d};
    std::int64_t off = 0;
    for (int i = 0; i < view.rank; ++i) off += idx[i] * view.strides[i];
    return off;
  }
  double get(std::int64_t a, std::int64_t b = 0, std::int64_t c = 0, std::int64_t d = 0) const {
    const std::int64_t off = offset(a, b, c, d);
    switch (view.dtype) {
      case DType::f32: return static_cast<const float*>(view.data)[off];
      case DType::bf16: return core::to_float(static_cast<const core::bf16*>(view.data)[off]);
      case DType::f16: return core::to_float(static_cast<const core::f16*>(view.data)[off]);
      case DType::boolean: return static_cast<const unsigned char*>(view.data)[off];
      case DType::i32: return static_cast<const std::int32_t*>(view.data)[off];
      case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(view.data)[off]);
      case DType::i8: return static_cast<const std::int8_t*>(view.data)[off];
      case DType::i4: return core::q4_at(view.data, off);
    }
    return 0;
  }
  void set(double x, std::int64_t a, std::int64_t b = 0, std::int64_t c = 0, std::int64_t d = 0) {
    const std::int64_t off = offset(a, b, c, d);
    switch (view.dtype) {
      case DType::f32: static_cast<float*>(view.data)[off] = static_cast<float>(x); break;
      case DType::bf16: static_cast<core::bf16*>(view.data)[off] = core::from_float<core::bf16>(static_cast<float>(x)); break;
      case DType::f16: static_cast<core::f16*>(view.data)[off] = core::from_float<core::f16>(static_cast<float>(x)); break;
      case DType::boolean: static_cast<unsigned char*>(view.data)[off] = x != 0; break;
      case DType::i32: static_cast<std::int32_t*>(view.data)[off] = static_cast<std::int32_t>(x); break;
      case DType::i64: static_cast<std::int64_t*>(view.data)[off] = static_cast<std::int64_t>(x); break;
      case DType::i8:
        static_cast<std::int8_t*>(view.data)[off] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x), -127.0, 127.0));
        break;
      case DType::i4: {  // the nibble q + 8 of element off (attn/tensor.h)
        const int q = static_cast<int>(std::clamp(std::nearbyint(x), -8.0, 7.0)) + 8;
        std::uint8_t& byte = static_cast<std::uint8_t*>(view.data)[off >> 1];
        byte = static_cast<std::uint8_t>(off & 1 ? (byte & 0x0F) | (q << 4) : (byte & 0xF0) | q);
        break;
      }
    }
  }
  template <class F>
  void for_each_index(F&& f) const {
    std::int64_t s[4] = {1, 1, 1, 1};
    for (int i = 0; i < view.rank; ++i) s[i] = view.shape[i];
    for (std::int64_t a = 0; a < s[0]; ++a)
      for (std::int64_t b = 0; b < s[1]; ++b)
        for (std::int64_t c = 0; c < s[2]; ++c)
          for (std::int64_t d = 0; d < s[3]; ++d) f(a, b, c, d);
  }
  // Uniform in [-amp, amp], never exactly zero.
  void randomize(std::mt19937_64& rng, double amp = 1.0) {
    std::uniform_real_distribution<double> u(-amp, amp);
    for_each_index([&](auto a, auto b, auto c, auto d) {
      double x = u(rng);
      if (x == 0.0) x = amp / 3;
      set(x, a, b, c, d);
    });
  }
  // Fills every byte of storage (in and outside the view) with NaN patterns, so an unwritten
  // element is visible and a write outside the view is detectable.
  void poison() {
    if (view.dtype == DType::f32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = 0; i + 4 <= storage.size(); i += 4) std::memcpy(&storage[i], &nan, 4);
    } else {
      std::fill(storage.begin(), storage.end(), 0xFF);  // 0xFFFF is a NaN in bf16 and f16
    }
  }
};

// The rule from DEVELOPERS.md (as FlashAttention tests it):
//   max|fast - ref64| <= factor * max|naive - ref64| + atol, and no NaN where ref64 is finite.
struct Agreement {
  double fast_err = 0, naive_err = 0, atol = 0;
  std::int64_t nonfinite_mismatch = 0;
  std::size_t first_mismatch = 0;  // the index of the first non-finite mismatch, its reference and fast values
  double mismatch_ref = 0, mismatch_fast = 0;
  std::size_t worst = 0;  // the index of the largest finite error
  bool ok(double factor = 2.0) const { return nonfinite_mismatch == 0 && fast_err <= factor * naive_err + atol; }
  std::string describe() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "max|fast-ref| = %.3g, max|naive-ref| = %.3g, atol = %.3g, non-finite mismatches = %lld",
                  fast_err, naive_err, atol, static_cast<long long>(nonfinite_mismatch));
    std::string s = buf;
    if (fast_err > 0) s += " (largest at index " + std::to_string(worst) + ")";
    if (nonfinite_mismatch)
      s += " (first at index " + std::to_string(first_mismatch) + ": reference " + std::to_string(mismatch_ref) +
           ", fast " + std::to_string(mismatch_fast) + ")";
    return s;
  }
};

inline double unit_roundoff(DType d) {
  return d == DType::bf16 ? std::ldexp(1.0, -8) : d == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}

// Compares values (fast, naive) against the fp64 reference; both are read through a getter (index ->
// value). Where the reference is not finite the fast value must be too: NaN for NaN, and for ±inf the same
// infinity or NaN (an IEEE product that is inf in fp64 may be 0·inf = NaN in fp32) — except with exact_inf
// (an LSE: -inf marks an empty row and must be -inf exactly). A fast NaN or inf where the reference is finite
// always fails.
template <class GetFast, class GetNaive>
Agreement agree(const std::vector<double>& ref, GetFast fast, GetNaive naive, double atol, bool exact_inf = false,
               double range = std::numeric_limits<double>::infinity()) {
  Agreement a;
  a.atol = atol;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], f = fast(i), n = naive(i);
    if (!std::isfinite(r)) {
      const bool ok = std::isnan(r) ? !std::isfinite(f) : (f == r || (!exact_inf && std::isnan(f)));
      if (!ok && a.nonfinite_mismatch++ == 0) a.first_mismatch = i, a.mismatch_ref = r, a.mismatch_fast = f;
      continue;
    }
    if (!std::isfinite(f)) {
      // ±inf is within the rule only where the rounding noise the atol allows passes the output dtype's range
      // (`range`: its largest finite value): a result that rounding may move that far may overflow.
      if (std::isinf(f) && atol > range) continue;
      if (a.nonfinite_mismatch++ == 0) a.first_mismatch = i, a.mismatch_ref = r, a.mismatch_fast = f;
      continue;
    }
    if (std::fabs(f - r) > a.fast_err) a.fast_err = std::fabs(f - r), a.worst = i;
    if (std::isfinite(n)) a.naive_err = std::max(a.naive_err, std::fabs(n - r));
  }
  return a;
}

// The naive same-precision result as the caller would see it: computed in fp32, stored in the output dtype.
inline double round_to(DType d, double x) {
  const float f = static_cast<float>(x);
  switch (d) {
    case DType::bf16: return core::to_float(core::from_float<core::bf16>(f));
    case DType::f16: return core::to_float(core::from_float<core::f16>(f));
    default: return f;
  }
}

// The rounding-noise atol of a forward output, at the size of the terms each stage sums: two units of the output
// dtype at the size of the values the output averages (max|v|), plus what rounding in the scores alone can move
// it: a score sums terms of size scale·Σ|q_d k_d| + |mask| (the reference's score_terms), so any fp32 computation
// of it carries an error of about ε times that (ε = 2^-24), an error of that size in its weight's exponent,
// which moves the output by up to about ε·score_terms·max|v|. (Without it a softmax that large scores make peaked
// would compare two equally rounded fp32 computations, this library's and the naive one, on luck.) With dropout
// the kept weights are scaled by 1 / (1 − p) after the softmax (ref.weight_factor), and so are the output and
// both terms: without it a dropout of 0.9 held the score noise to a tenth of its size (random seed
// 7308029028923082701: i8 K/V, scores near 200, max|v| 520, the vector levels' error 0.027 and the naive one's
// 0.0075 both below that noise, ε·score_terms·max|v|/(1 − p) = 0.055, but the atol 0.0056).
inline double forward_atol(DType out_dtype, const reference::Result& ref, double max_abs_v) {
  const double v = max_abs_v * ref.weight_factor;
  return 2 * unit_roundoff(out_dtype) * std::max(v, 1e-3) + std::ldexp(1.0, -24) * ref.score_terms * v;
}

// The rounding-noise atol of an LSE (fp32): eight units at the size of the largest |LSE|, plus the rounding noise of
// a score, ε·score_terms (see forward_atol), which moves an LSE by up to as much (a row with one key has LSE = its
// score: with a large scale and cancelling q·k terms, the score's own fp32 rounding dominates, whoever computes it).
inline double lse_atol(const reference::Result& ref) {
  double max_lse = 1;
  for (double x : ref.lse)
    if (std::isfinite(x)) max_lse = std::max(max_lse, std::fabs(x));
  return 8 * std::ldexp(1.0, -24) * max_lse + std::ldexp(1.0, -24) * ref.score_terms;
}

// The largest finite |value| of a tensor.
inline double max_abs_finite(const Tensor& t) {
  double m = 0;
  t.for_each_index([&](auto a, auto b, auto c, auto d) {
    const double x = t.get(a, b, c, d);
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  });
  return m;
}

// Byte offsets (within storage) that a view covers.
inline std::vector<bool> covered_bytes(const Tensor& t) {
  std::vector<bool> mask(t.storage.size(), false);
  const auto es = static_cast<std::int64_t>(dtype_size(t.view.dtype));
  const auto base = static_cast<const unsigned char*>(t.view.data) - t.storage.data();
  t.for_each_index([&](auto a, auto b, auto c, auto d) {
    const std::int64_t off = base + t.offset(a, b, c, d) * es;
    for (std::int64_t i = 0; i < es; ++i) mask[static_cast<std::size_t>(off + i)] = true;
  });
  return mask;
}

// Every instruction-set level this machine supports, lowest first (each forced in turn by ForceIsa).
// With ATTN_TEST_LEVELS=rotate (make test-sanitize), or `rotate` set by the caller, a test takes one of them instead,
// chosen by a hash of the running test's full name, so the suite as a whole still runs every level while each case
// runs once: a memory error does not need every level to show, and an instrumented run is several times slower.
// The registry's checks of bookkeeping (workspace reuse, the backward's bitwise determinism) always rotate: they
// test the scheduling and scratch code every level shares, and at every level they were the largest part of
// `make test`'s time (docs/testing.md).
inline std::vector<cpu::Isa> supported_isas(bool rotate = false) {
  std::vector<cpu::Isa> out;
  for (int i = 0; i < cpu::kIsaCount; ++i)
    if (cpu::isa_supported(static_cast<cpu::Isa>(i))) out.push_back(static_cast<cpu::Isa>(i));
  const char* mode = std::getenv("ATTN_TEST_LEVELS");
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if ((rotate || (mode && std::string(mode) == "rotate")) && test && out.size() > 1) {
    const std::string name = std::string(test->test_suite_name()) + "." + test->name();
    const cpu::Isa one = out[std::hash<std::string>{}(name) % out.size()];
    out.assign(1, one);
  }
  return out;
}

// With ATTN_TEST_SAMPLE=n (make test-sanitize sets 6) a registry case of the fp64 comparisons runs only when a
// hash of its test's full name is divisible by n, and is reported as skipped otherwise: under the sanitizers
// every kernel, mask and variant still runs (the registry holds each configuration at several sizes and dtypes),
// in a fraction of the time. `make test` runs every case.
inline bool sampled_out() {
  const char* env = std::getenv("ATTN_TEST_SAMPLE");
  const long n = env ? std::strtol(env, nullptr, 10) : 1;
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (n <= 1 || !test) return false;
  const std::string name = std::string(test->test_suite_name()) + "." + test->name();
  return std::hash<std::string>{}(name) % static_cast<unsigned long>(n) != 0;
}
#define ATTN_SKIP_UNLESS_SAMPLED()        \
  if (!::attn::test::sampled_out()) { \
  } else                                \
    GTEST_SKIP() << "not in this run's sample (ATTN_TEST_SAMPLE)"

// Forces a level for the scope (the library's programmatic override; no environment variable).
struct ForceIsa {
  explicit ForceIsa(cpu::Isa isa) { cpu::set_isa_override(isa); }
  ~ForceIsa() { cpu::set_isa_override(std::nullopt); }
  ForceIsa(const ForceIsa&) = delete;
  ForceIsa& operator=(const ForceIsa&) = delete;
};
// The avx512bf16 level's choice of bf16 pair products (cpu::bf16_dot_preferred) forced one way while in scope.
struct ForceBf16Dot {
  explicit ForceBf16Dot(bool prefer) { cpu::set_bf16_dot_override(prefer); }
  ~ForceBf16Dot() { cpu::set_bf16_dot_override(std::nullopt); }
  ForceBf16Dot(const ForceBf16Dot&) = delete;
  ForceBf16Dot& operator=(const ForceBf16Dot&) = delete;
};

}  // namespace attn::test
