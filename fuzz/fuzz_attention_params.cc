// Fuzz target: argument validation of attn::attention, attn::attention_paged, attn::attention_backward and
// attn::merge_attention, through the public API (include/attn/*.h) only.
//
// The bytes choose a problem of tiny dimensions (every size <= 8, so one run takes microseconds), then for
// every tensor a view (rank, shape, dtype, strides: contiguous, BSHD, padded, reversed, random, broadcast,
// absurd) that is usually right and sometimes subtly or wildly wrong, and every Params field (scale with
// NaN/inf/huge values, causal/window/align/backend with out-of-range enum values, key lengths, masks of any
// rank with broadcasting, threads, page tables and sequence lengths).
//
// Each view gets its own heap allocation, exactly as large as the elements it can address (its reach,
// computed from shape and strides), so a correct library never reads or writes outside it and
// AddressSanitizer reports a real bug when it does. Views that cannot address memory (a negative size, an
// overflowing stride) get a one-element allocation: the library must refuse them.
//
// Besides "no crash", the harness checks the contract of include/attn/sdpa.h and backward.h:
//   - on error the Status names its parameter ("<param>: ...") and no output byte was written;
//   - a forward call that succeeds on finite inputs with a moderate scale, into outputs whose elements do not
//     overlap, agrees with the reference backend.
// ATTN_FUZZ_VERBOSE=1 prints each attention() call's views and params.
#include <attn/attn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_input.h"

namespace {

using attn::DType;
using attn::Params;
using attn::Status;
using attn::TensorView;
using attn::fuzz::Input;

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr unsigned char kSentinel = 0xA5;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_attention_params: %s\n", what.c_str());
  std::abort();
}

std::size_t element_size(DType d) {
  const std::size_t s = attn::dtype_size(d);
  return s == 0 ? 4 : s;  // unknown enum values: allocate as if 4 bytes
}

// The element offsets a view can address: [lo, hi], or none (empty, or not addressable).
struct Reach {
  bool addressable = true, empty = false;
  std::int64_t lo = 0, hi = 0;
};

Reach reach_of(const TensorView& t) {
  Reach r;
  if (t.rank < 0 || t.rank > 4) {
    r.addressable = false;
    return r;
  }
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) r.addressable = false;
    if (t.shape[d] == 0) r.empty = true;
  }
  if (!r.addressable || r.empty) return r;
  for (int d = 0; d < t.rank; ++d) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &span) ||
        __builtin_add_overflow(span < 0 ? r.lo : r.hi, span, span < 0 ? &r.lo : &r.hi)) {
      r.addressable = false;
      return r;
    }
  }
  std::int64_t extent = 0;  // never large with the sizes chosen here, except with an absurd stride
  if (__builtin_sub_overflow(r.hi, r.lo, &extent) || extent > (1 << 20)) r.addressable = false;
  return r;
}

enum class Role { input, output };

// Values for inputs: a few exact ones, and with `special` also infinities, NaN and huge ones.
void fill_f32(unsigned char* p, std::size_t n, Input& in, bool special) {
  static const float normal[] = {0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 0.25f, 1.5f, -0.75f};
  static const float odd[] = {INFINITY, -INFINITY, NAN, 3e38f, -3e38f, 1e-45f};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t b = in.byte();
    const float v = special && b >= 240 ? odd[b % 6] : normal[b % 10];
    std::memcpy(p + 4 * i, &v, 4);
  }
}

// float32 -> bfloat16 / float16 bit patterns of the values above (exact in both formats).
std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);  // every value used is exact in bf16 (NaN stays NaN)
}
std::uint16_t to_f16(float f) {
  if (std::isnan(f)) return 0x7E00;
  if (std::isinf(f) || std::fabs(f) > 65504.0f) return f < 0 ? 0xFC00 : 0x7C00;
  if (f == 0.0f || std::fabs(f) < 6.2e-5f) return std::signbit(f) ? 0x8000 : 0x0000;
  int e = 0;
  const float m = std::frexp(std::fabs(f), &e);  // f = m * 2^e, m in [0.5, 1)
  const auto mant = static_cast<std::uint16_t>(std::lround((m * 2 - 1) * 1024)) & 0x3FF;  // exact for the values used
  return static_cast<std::uint16_t>((std::signbit(f) ? 0x8000 : 0) | ((e - 1 + 15) << 10) | mant);
}

class Problem {
 public:
  explicit Problem(Input& in) : in_(in) {}

  // A view over a fresh allocation. `dims` is the right shape for the call; the bytes may change the rank,
  // the dtype, any size, the layout, or make the data pointer null.
  TensorView view(DType dtype, std::initializer_list<std::int64_t> dims, Role role, bool special = false) {
    TensorView t;
    t.rank = static_cast<int>(dims.size());
    t.dtype = dtype;
    int d = 0;
    for (std::int64_t n : dims) t.shape[d++] = n;
    if (in_.one_in(24)) t.rank = static_cast<int>(in_.range(-1, 5));
    if (in_.one_in(24)) t.dtype = static_cast<DType>(in_.range(0, 7));
    if (in_.one_in(6)) {
      static const std::int64_t odd[] = {0, 1, 2, 3, 9, -1, -7, kI64Min};
      t.shape[in_.byte() % 4] = in_.pick(odd);
    }
    set_strides(&t);
    place(&t, role, special);
    return t;
  }

  // Refills an output view's memory with the sentinel (before a call).
  static void poison(const TensorView& t, const Reach& r) {
    if (t.data == nullptr || !r.addressable || r.empty) return;
    const std::size_t e = element_size(t.dtype);
    std::memset(static_cast<unsigned char*>(t.data) + r.lo * static_cast<std::int64_t>(e), kSentinel,
                static_cast<std::size_t>(r.hi - r.lo + 1) * e);
  }
  // True if no byte of an output view's allocation changed.
  bool untouched(const TensorView& t) const {
    for (const Owned& o : owned_)
      if (o.view_data == t.data && o.output)
        for (std::size_t i = 0; i < o.bytes; ++i)
          if (o.mem[i] != kSentinel) return false;
    return true;
  }

  // A second allocation laid out like `t` (for the reference backend's result).
  TensorView clone_output(const TensorView& t) {
    TensorView c = t;
    place(&c, Role::output, false, /*may_be_null=*/false);
    return c;
  }

  Input& in() { return in_; }

 private:
  struct Owned {
    std::unique_ptr<unsigned char[]> mem;
    std::size_t bytes = 0;
    const void* view_data = nullptr;
    bool output = false;
  };

  void set_strides(TensorView* t) {
    const int rank = t->rank < 0 ? 0 : (t->rank > 4 ? 4 : t->rank);
    std::int64_t contiguous[4] = {0, 0, 0, 0}, s = 1;
    for (int d = rank - 1; d >= 0; --d) {
      contiguous[d] = s;
      s *= t->shape[d] > 0 ? t->shape[d] : 1;
    }
    switch (in_.byte() % 8) {
      case 0:
      case 1:
      case 2:  // row-major
        for (int d = 0; d < 4; ++d) t->strides[d] = contiguous[d];
        break;
      case 3:  // dims 1 and 2 swapped in memory (BSHD for a rank-4 BHSD view)
        for (int d = 0; d < 4; ++d) t->strides[d] = contiguous[d];
        if (rank == 4) {
          const std::int64_t h = t->shape[1] > 0 ? t->shape[1] : 1, dd = t->shape[3] > 0 ? t->shape[3] : 1;
          t->strides[1] = dd;
          t->strides[2] = h * dd;
        }
        break;
      case 4: {  // padded: each dimension's stride a bit larger than needed
        std::int64_t st = 1 + in_.range(0, 2);
        for (int d = rank - 1; d >= 0; --d) {
          t->strides[d] = st;
          st = st * (t->shape[d] > 0 ? t->shape[d] : 1) + in_.range(0, 3);
        }
        break;
      }
      case 5:  // reversed: negative strides
        for (int d = 0; d < 4; ++d) t->strides[d] = in_.flag() ? -contiguous[d] : contiguous[d];
        break;
      case 6:  // random small strides, zero and negative included
        for (int d = 0; d < 4; ++d) t->strides[d] = in_.range(-10, 10);
        break;
      case 7:  // broadcast: some dimensions with stride 0
        for (int d = 0; d < 4; ++d) t->strides[d] = in_.flag() ? 0 : contiguous[d];
        break;
    }
    if (in_.one_in(32)) {
      static const std::int64_t absurd[] = {kI64Max, kI64Min, std::int64_t{1} << 62, -(std::int64_t{1} << 62),
                                            std::int64_t{1} << 61};
      std::int64_t& stride = t->strides[in_.byte() % 4];
      stride = in_.pick(absurd);
    }
  }

  void place(TensorView* t, Role role, bool special, bool may_be_null = true) {
    const Reach r = reach_of(*t);
    const std::size_t e = element_size(t->dtype);
    const std::int64_t elems = r.addressable && !r.empty ? r.hi - r.lo + 1 : 1;
    Owned o;
    o.bytes = static_cast<std::size_t>(elems) * e;
    o.mem.reset(new unsigned char[o.bytes]);  // exactly that size: one byte past it is a heap overflow
    o.output = role == Role::output;
    if (role == Role::output) {
      std::memset(o.mem.get(), kSentinel, o.bytes);
    } else {
      fill(o.mem.get(), static_cast<std::size_t>(elems), t->dtype, special);
    }
    const std::int64_t origin = r.addressable && !r.empty ? -r.lo : 0;
    t->data = may_be_null && in_.one_in(40) ? nullptr : o.mem.get() + origin * static_cast<std::int64_t>(e);
    o.view_data = t->data;
    owned_.push_back(std::move(o));
  }

  void fill(unsigned char* p, std::size_t n, DType dtype, bool special) {
    switch (dtype) {
      case DType::f32: fill_f32(p, n, in_, special); break;
      case DType::bf16:
      case DType::f16: {
        std::vector<unsigned char> f(n * 4);
        fill_f32(f.data(), n, in_, special);
        for (std::size_t i = 0; i < n; ++i) {
          float v;
          std::memcpy(&v, &f[4 * i], 4);
          const std::uint16_t h = dtype == DType::bf16 ? to_bf16(v) : to_f16(v);
          std::memcpy(p + 2 * i, &h, 2);
        }
        break;
      }
      case DType::boolean:
        for (std::size_t i = 0; i < n; ++i) p[i] = in_.byte() % 4 != 0;  // mostly keep
        break;
      default:  // i32, i64 and unknown values get bytes as they come (callers fill index arrays themselves)
        for (std::size_t i = 0; i < n * element_size(dtype); ++i) p[i] = in_.byte();
        break;
    }
  }

  Input& in_;
  std::vector<Owned> owned_;
};

// Writes `values` (key lengths, page ids) into an i32 or i64 view that can address them.
void set_indices(const TensorView& t, const std::vector<std::int64_t>& values) {
  const Reach r = reach_of(t);
  if (t.data == nullptr || !r.addressable || r.empty || t.rank < 1) return;
  const std::int64_t cols = t.rank >= 2 ? t.shape[1] : 1;
  for (std::int64_t i = 0; i < t.shape[0]; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::size_t idx = static_cast<std::size_t>(i * cols + j);
      const std::int64_t v = idx < values.size() ? values[idx] : 0;
      const std::int64_t off = i * t.strides[0] + (t.rank >= 2 ? j * t.strides[1] : 0);  // higher dims at 0
      unsigned char* p = static_cast<unsigned char*>(t.data);
      if (t.dtype == DType::i64) {
        std::memcpy(p + off * 8, &v, 8);
      } else if (t.dtype == DType::i32) {
        const auto v32 = static_cast<std::int32_t>(v);
        std::memcpy(p + off * 4, &v32, 4);
      }
    }
}

struct Dims {
  std::int64_t B, Hq, Hkv, Sq, Skv, Dk, Dv;
};

Dims choose_dims(Input& in) {
  Dims d;
  d.B = in.range(0, 3);
  d.Hkv = in.range(0, 3);
  d.Hq = d.Hkv * in.range(1, 3);
  if (in.one_in(16)) d.Hq = in.range(0, 5);  // not a multiple of Hkv
  d.Sq = in.range(0, 6);
  d.Skv = in.range(0, 8);
  d.Dk = in.range(0, 8);
  d.Dv = in.range(0, 8);
  return d;
}

DType float_dtype(Input& in) {
  static const DType f[] = {DType::f32, DType::f32, DType::bf16, DType::f16};
  return in.pick(f);
}

// The Params fields, each usually valid and sometimes not.
Params choose_params(Input& in, bool* moderate_scale) {
  Params p;
  *moderate_scale = true;
  switch (in.byte() % 4) {
    case 0: break;  // default 1/sqrt(Dk)
    case 1: p.scale = in.pick({0.125, 0.5, 1.0, 2.0}); break;
    case 2: {
      static const double odd[] = {0.0, -1.0, NAN, INFINITY, -INFINITY, 1e300, 1e-300, 5e-324, 1e30, 1e-30};
      p.scale = in.pick(odd);
      *moderate_scale = false;
      break;
    }
    case 3:
      p.scale = in.raw<double>();
      *moderate_scale = false;
      break;
  }
  p.causal = static_cast<attn::Causal>(in.one_in(16) ? in.range(3, 255) : in.range(0, 2));
  if (in.one_in(3)) {
    static const std::int64_t sides[] = {-1, 0, 1, 2, 3, 5, 8, -2, -100, kI64Max, kI64Min};
    p.window.left = in.pick(sides);
    p.window.right = in.pick(sides);
  }
  p.window.align = static_cast<attn::Align>(in.one_in(16) ? in.range(2, 255) : in.range(0, 1));
  static const int threads[] = {0, 1, 2, 1, 1, -1, 4097, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()};
  p.threads = in.pick(threads);
  p.backend = static_cast<attn::Backend>(in.one_in(16) ? in.range(3, 255) : in.range(0, 2));
  return p;
}

// Score variants (drawn last, so that inputs written before they existed keep their meaning): softcap (sometimes
// invalid), ALiBi slopes [Hq] or [B, Hq], sinks [Hq] (sometimes of odd shape or values) and dropout. Returns whether any
// value is odd (then no differential check).
bool choose_variants(Input& in, Problem& pr, const Dims& d, Params* p) {
  bool odd = false;
  if (in.byte() % 4 == 3) {  // (an exhausted input, all zeros, draws none)
    static const double caps[] = {0.5, 2.0, 30.0, 50.0, 0.0, -1.0, NAN, INFINITY, 1e-40, 1e39};
    p->softcap = in.pick(caps);
  }
  if (in.byte() % 4 == 3) {  // (an exhausted input, all zeros, draws none)
    const bool o = in.one_in(8);
    odd |= o;
    p->alibi_slopes = in.flag() ? pr.view(DType::f32, {d.Hq}, Role::input, o)
                                : pr.view(DType::f32, {in.one_in(8) ? d.Hq : d.B, in.one_in(8) ? d.B : d.Hq}, Role::input, o);
  }
  if (in.byte() % 4 == 3) {  // (an exhausted input, all zeros, draws none)
    const bool o = in.one_in(8);
    odd |= o;
    p->sinks = pr.view(in.one_in(16) ? DType::bf16 : DType::f32, {in.one_in(16) ? d.Hq + 1 : d.Hq}, Role::input, o);
  }
  if (in.byte() % 4 == 3) {  // dropout (sometimes an invalid probability), any seed
    static const double rates[] = {0.1, 0.5, 0.9, 1e-9, 0.999999, 0.0, 1.0, -0.1, NAN, INFINITY};
    p->dropout_p = in.pick(rates);
    for (int i = 0; i < 8; ++i) p->dropout_seed = p->dropout_seed << 8 | in.byte();
  }
  return odd;
}

// With ATTN_FUZZ_VERBOSE set, every call's views and params go to stderr (for triage).
bool verbose() {
  static const bool v = std::getenv("ATTN_FUZZ_VERBOSE") != nullptr;
  return v;
}

void describe(const char* name, const TensorView& t) {
  if (!verbose()) return;
  std::fprintf(stderr, "  %-8s rank %d dtype %d data %s shape [%lld, %lld, %lld, %lld] strides [%lld, %lld, %lld, %lld]\n",
               name, t.rank, static_cast<int>(t.dtype), t.data ? "set" : "null", static_cast<long long>(t.shape[0]),
               static_cast<long long>(t.shape[1]), static_cast<long long>(t.shape[2]), static_cast<long long>(t.shape[3]),
               static_cast<long long>(t.strides[0]), static_cast<long long>(t.strides[1]),
               static_cast<long long>(t.strides[2]), static_cast<long long>(t.strides[3]));
}

void describe(const Params& p) {
  if (!verbose()) return;
  std::fprintf(stderr, "  params scale %s causal %d window (%lld, %lld, align %d) threads %d backend %d kv_lens %s mask %s\n",
               p.scale ? std::to_string(*p.scale).c_str() : "default", static_cast<int>(p.causal),
               static_cast<long long>(p.window.left), static_cast<long long>(p.window.right),
               static_cast<int>(p.window.align), p.threads, static_cast<int>(p.backend), p.kv_lens ? "yes" : "no",
               p.mask ? "yes" : "no");
  if (p.kv_lens) describe("kv_lens", *p.kv_lens);
  if (p.mask) describe("mask", *p.mask);
}

void check_error(const Status& s, const char* call) {
  if (s.ok()) return;
  const std::string& m = s.message();
  if (s.param().empty() || m.rfind(s.param() + ": ", 0) != 0 || m.size() <= s.param().size() + 2)
    fail(std::string(call) + ": error message does not name its parameter: '" + m + "'");
}

void check_untouched(const Problem& pr, const Status& s, std::initializer_list<const TensorView*> outputs,
                     const char* call) {
  if (s.ok()) return;
  for (const TensorView* t : outputs)
    if (t && !pr.untouched(*t)) fail(std::string(call) + " returned '" + s.message() + "' but wrote an output");
}

// Reads element i of a float view as double (rank 3 or 4, row-major index over its shape).
double element(const TensorView& t, std::int64_t index) {
  std::int64_t off = 0;
  for (int d = t.rank - 1; d >= 0; --d) {
    off += (index % t.shape[d]) * t.strides[d];
    index /= t.shape[d];
  }
  const unsigned char* p = static_cast<const unsigned char*>(t.data);
  switch (t.dtype) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p + off * 4, 4);
      return v;
    }
    case DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p + off * 2, 2);
      const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    }
    case DType::f16: {
      std::uint16_t h;
      std::memcpy(&h, p + off * 2, 2);
      const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
      double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
      return (h & 0x8000) ? -v : v;
    }
    default: return 0;
  }
}

void compare(const TensorView& got, const TensorView& want, double tol, const char* what) {
  std::int64_t n = 1;
  for (int d = 0; d < got.rank; ++d) n *= got.shape[d];
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = element(got, i), b = element(want, i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (a == b) continue;  // infinities
    if (!(std::fabs(a - b) <= tol * (1 + std::fabs(b))))
      fail(std::string(what) + "[" + std::to_string(i) + "]: flash " + std::to_string(a) + ", reference " +
           std::to_string(b));
  }
}

// True if no two indices of the view address the same element. The library refuses outputs whose elements
// could share an address (check_output_strides); the differential check asserts that only injective outputs
// are ever accepted.
bool injective(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
  std::vector<std::int64_t> offsets;
  offsets.reserve(static_cast<std::size_t>(n));
  for (std::int64_t index = 0; index < n; ++index) {
    std::int64_t off = 0, rest = index;
    for (int d = t.rank - 1; d >= 0; --d) {
      off += (rest % t.shape[d]) * t.strides[d];
      rest /= t.shape[d];
    }
    offsets.push_back(off);
  }
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end();
}

double tolerance(DType d) { return d == DType::f32 ? 1e-3 : d == DType::f16 ? 1e-2 : 5e-2; }

// ---- the four calls ----------------------------------------------------------------------------------

void fuzz_attention(Input& in) {
  Problem pr(in);
  const Dims d = choose_dims(in);
  const DType qt = float_dtype(in), kt = in.one_in(3) ? float_dtype(in) : qt;
  const bool special = in.one_in(8);
  const TensorView q = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dk}, Role::input, special);
  const TensorView k = pr.view(kt, {d.B, d.Hkv, d.Skv, d.Dk}, Role::input, special);
  const TensorView v = pr.view(kt, {d.B, d.Hkv, d.Skv, d.Dv}, Role::input, special);
  TensorView out = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dv}, Role::output);
  if (in.one_in(32)) out = in.flag() ? q : v;  // aliasing an input: must be refused
  bool moderate = true;
  Params p = choose_params(in, &moderate);
  bool exotic = !moderate || special;
  if (in.one_in(3)) {  // key lengths [B]
    const TensorView lens = pr.view(in.flag() ? DType::i32 : DType::i64, {d.B}, Role::input);
    std::vector<std::int64_t> values;
    for (std::int64_t b = 0; b < d.B; ++b) values.push_back(in.one_in(8) ? in.range(-3, d.Skv + 3) : in.range(0, d.Skv));
    set_indices(lens, values);
    p.kv_lens = lens;
  }
  if (in.one_in(3)) {  // a mask of rank 1..4 broadcasting to [B, Hq, Sq, Skv]
    const int rank = static_cast<int>(in.range(1, 4));
    const std::int64_t full[4] = {d.B, d.Hq, d.Sq, d.Skv};
    std::int64_t shape[4];
    for (int i = 0; i < rank; ++i) shape[i] = in.one_in(3) ? 1 : full[4 - rank + i];
    const DType mt = in.one_in(2) ? DType::boolean : DType::f32;
    const bool odd_mask = in.one_in(8);
    exotic = exotic || odd_mask;
    switch (rank) {
      case 1: p.mask = pr.view(mt, {shape[0]}, Role::input, odd_mask); break;
      case 2: p.mask = pr.view(mt, {shape[0], shape[1]}, Role::input, odd_mask); break;
      case 3: p.mask = pr.view(mt, {shape[0], shape[1], shape[2]}, Role::input, odd_mask); break;
      default: p.mask = pr.view(mt, {shape[0], shape[1], shape[2], shape[3]}, Role::input, odd_mask); break;
    }
  }
  std::optional<TensorView> lse;
  if (in.flag()) lse = pr.view(DType::f32, {d.B, d.Hq, d.Sq}, Role::output);
  if (lse && in.one_in(32)) lse = in.flag() ? q : out;  // aliasing: must be refused
  exotic = choose_variants(in, pr, d, &p) || exotic;
  // Quantised K/V (drawn after the variants, for the same reason): k and v read as 8- or 4-bit values (the same
  // memory: its random bytes are valid 8-bit integers and nibbles), with scales of the call's shape or of an odd
  // one. Their random scales may be huge or non-finite, outside the scales' contract (docs/api.md), so these calls
  // check validation, untouched outputs and the absence of crashes, not values against the reference.
  TensorView kq = k, vq = v;
  if (in.byte() % 8 == 7) {  // (an exhausted input, all zeros, draws none)
    const bool i4 = in.flag();
    kq.dtype = vq.dtype = i4 ? DType::i4 : DType::i8;
    const auto scales = [&](std::int64_t dim) {
      const bool o = in.one_in(8);
      return i4 ? pr.view(DType::f32, {d.B, d.Hkv, o ? d.Skv + 1 : d.Skv, (dim + 31) / 32}, Role::input)
                : pr.view(DType::f32, {d.B, d.Hkv, o ? d.Skv + 1 : d.Skv}, Role::input);
    };
    if (!in.one_in(8)) p.k_scale = scales(d.Dk);
    if (!in.one_in(8)) p.v_scale = scales(d.Dv);
    exotic = true;
  }

  if (verbose()) {
    std::fprintf(stderr, "attention:\n");
    describe("q", q), describe("k", kq), describe("v", vq), describe("out", out), describe(p);
    if (lse) describe("lse", *lse);
  }
  const Status s = attn::attention(q, kq, vq, out, p, lse);
  if (verbose()) std::fprintf(stderr, "  -> %s\n", s.ok() ? "ok" : s.message().c_str());
  check_error(s, "attention");
  check_untouched(pr, s, {&out, lse ? &*lse : nullptr}, "attention");
  if (s.ok() && (!injective(out) || (lse && !injective(*lse))))
    fail("attention accepted an output with two elements at one address");

  // Differential: a successful flash call on ordinary values agrees with the fp64 reference.
  if (s.ok() && !exotic && p.backend != attn::Backend::reference) {
    Params ref = p;
    ref.backend = attn::Backend::reference;
    const TensorView out2 = pr.clone_output(out);
    std::optional<TensorView> lse2;
    if (lse) lse2 = pr.clone_output(*lse);
    const Status r = attn::attention(q, kq, vq, out2, ref, lse2);
    if (!r.ok()) fail("reference backend refused what flash accepted: " + r.message());
    compare(out, out2, tolerance(out.dtype), "attention out");
    if (lse) compare(*lse, *lse2, 1e-3, "attention lse");
  }
}

void fuzz_paged(Input& in) {
  Problem pr(in);
  const Dims d = choose_dims(in);
  const std::int64_t P = in.range(0, 4), page = in.range(0, 4), max_pages = in.range(0, 3);
  const DType qt = float_dtype(in), kt = in.one_in(3) ? float_dtype(in) : qt;
  const bool special = in.one_in(8);
  const TensorView q = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dk}, Role::input, special);
  const TensorView kp = pr.view(kt, {P, d.Hkv, page, d.Dk}, Role::input, special);
  const TensorView vp = pr.view(kt, {P, d.Hkv, page, d.Dv}, Role::input, special);
  const TensorView table = pr.view(in.one_in(16) ? DType::i64 : DType::i32, {d.B, max_pages}, Role::input);
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < d.B * max_pages; ++i) ids.push_back(in.one_in(8) ? in.range(-2, P + 2) : in.range(0, P > 0 ? P - 1 : 0));
  set_indices(table, ids);
  const TensorView lens = pr.view(in.flag() ? DType::i32 : DType::i64, {d.B}, Role::input);
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < d.B; ++b)
    lengths.push_back(in.one_in(8) ? in.range(-3, max_pages * page + 3) : in.range(0, max_pages * page));
  set_indices(lens, lengths);
  const TensorView out = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dv}, Role::output);
  bool moderate = true;
  Params p = choose_params(in, &moderate);
  if (in.one_in(8)) p.kv_lens = lens;  // must be refused: seq_lens gives the lengths
  std::optional<TensorView> lse;
  if (in.flag()) lse = pr.view(DType::f32, {d.B, d.Hq, d.Sq}, Role::output);

  const Status s = attn::attention_paged(q, kp, vp, table, lens, out, p, lse);
  check_error(s, "attention_paged");
  check_untouched(pr, s, {&out, lse ? &*lse : nullptr}, "attention_paged");
  if (s.ok() && (!injective(out) || (lse && !injective(*lse))))
    fail("attention_paged accepted an output with two elements at one address");
  if (s.ok() && moderate && !special && p.backend != attn::Backend::reference) {
    Params ref = p;
    ref.backend = attn::Backend::reference;
    const TensorView out2 = pr.clone_output(out);
    std::optional<TensorView> lse2;
    if (lse) lse2 = pr.clone_output(*lse);
    const Status r = attn::attention_paged(q, kp, vp, table, lens, out2, ref, lse2);
    if (!r.ok()) fail("reference backend refused what flash accepted (paged): " + r.message());
    compare(out, out2, tolerance(out.dtype), "attention_paged out");
    if (lse) compare(*lse, *lse2, 1e-3, "attention_paged lse");
  }
}

void fuzz_backward(Input& in) {
  Problem pr(in);
  const Dims d = choose_dims(in);
  const DType qt = float_dtype(in), kt = in.one_in(4) ? float_dtype(in) : qt;
  const bool special = in.one_in(8);
  const TensorView q = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dk}, Role::input, special);
  const TensorView k = pr.view(kt, {d.B, d.Hkv, d.Skv, d.Dk}, Role::input, special);
  const TensorView v = pr.view(kt, {d.B, d.Hkv, d.Skv, d.Dv}, Role::input, special);
  const TensorView o = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dv}, Role::input, special);
  const TensorView lse = pr.view(DType::f32, {d.B, d.Hq, d.Sq}, Role::input, special);
  const TensorView g = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dv}, Role::input, special);
  TensorView dq = pr.view(qt, {d.B, d.Hq, d.Sq, d.Dk}, Role::output);
  const TensorView dk = pr.view(kt, {d.B, d.Hkv, d.Skv, d.Dk}, Role::output);
  TensorView dv = pr.view(kt, {d.B, d.Hkv, d.Skv, d.Dv}, Role::output);
  if (in.one_in(32)) dq = q;   // aliasing an input: must be refused
  if (in.one_in(32)) dv = dk;  // aliasing another gradient: must be refused
  bool moderate = true;
  Params p = choose_params(in, &moderate);
  if (in.one_in(4)) {
    const TensorView lens = pr.view(DType::i32, {d.B}, Role::input);
    std::vector<std::int64_t> values;
    for (std::int64_t b = 0; b < d.B; ++b) values.push_back(in.range(-1, d.Skv + 1));
    set_indices(lens, values);
    p.kv_lens = lens;
  }
  if (in.one_in(4)) p.mask = pr.view(in.flag() ? DType::boolean : DType::f32, {d.Sq, d.Skv}, Role::input, in.one_in(8));
  choose_variants(in, pr, d, &p);
  std::optional<TensorView> dsinks;
  if (in.flag()) dsinks = pr.view(DType::f32, {in.one_in(16) ? d.Hq + 1 : d.Hq}, Role::output);
  if (dsinks && in.one_in(32)) dsinks = lse;  // aliasing an input: must be refused
  const Status s = attn::attention_backward(q, k, v, o, lse, g, dq, dk, dv, p, dsinks);
  check_error(s, "attention_backward");
  check_untouched(pr, s, {&dq, &dk, &dv, dsinks ? &*dsinks : nullptr}, "attention_backward");
}

void fuzz_merge(Input& in) {
  Problem pr(in);
  const std::int64_t B = in.range(0, 3), H = in.range(0, 3), S = in.range(0, 5), D = in.range(0, 8);
  const bool special = in.one_in(4);
  const TensorView oa = pr.view(DType::f32, {B, H, S, D}, Role::input, special);
  const TensorView la = pr.view(DType::f32, {B, H, S}, Role::input, special);
  const TensorView ob = pr.view(DType::f32, {B, H, S, D}, Role::input, special);
  const TensorView lb = pr.view(DType::f32, {B, H, S}, Role::input, special);
  TensorView out = pr.view(DType::f32, {B, H, S, D}, Role::output);
  TensorView lse = pr.view(DType::f32, {B, H, S}, Role::output);
  const bool in_place = in.one_in(4);
  if (in_place) out = oa, lse = la;  // documented as allowed
  const Status s = attn::merge_attention(oa, la, ob, lb, out, lse);
  check_error(s, "merge_attention");
  if (!in_place) check_untouched(pr, s, {&out, &lse}, "merge_attention");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  switch (in.byte() % 4) {
    case 0: fuzz_attention(in); break;
    case 1: fuzz_paged(in); break;
    case 2: fuzz_backward(in); break;
    case 3: fuzz_merge(in); break;
  }
  return 0;
}
