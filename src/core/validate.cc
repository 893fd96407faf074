// Argument validation for attention(): every check happens here, before any output is touched.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <string>

#include "core/backward_problem.h"
#include "core/problem.h"
#include "core/views.h"
#include "core/workspace_impl.h"
#include "cuda/runtime.h"

namespace attn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::boolean: return "bool";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i8: return "i8";
    case DType::i4: return "i4";
  }
  return "unknown";
}

std::string device_name(Device device) {
  return device.is_cuda() ? "cuda:" + std::to_string(device.index) : "cpu";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::boolean: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::i8: return 1;
    case DType::i4: return 1;
  }
  return 0;
}

int dtype_bits(DType dtype) { return dtype == DType::i4 ? 4 : static_cast<int>(8 * dtype_size(dtype)); }

std::int64_t dtype_bytes(DType dtype, std::int64_t elements) {
  return dtype == DType::i4 ? (elements + 1) / 2 : elements * static_cast<std::int64_t>(dtype_size(dtype));
}

TensorView TensorView::contiguous(const void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  return contiguous(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorView TensorView::contiguous(const void* data, DType dtype, const std::int64_t* shape, int rank) {
  TensorView t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = rank;
  for (int i = 0; i < rank && i < 4; ++i) t.shape[i] = shape[i];
  std::int64_t stride = 1;  // saturates instead of overflowing: such a shape fails validation anyway
  for (int d = std::min(t.rank, 4) - 1; d >= 0; --d) {
    t.strides[d] = stride;
    if (__builtin_mul_overflow(stride, t.shape[d], &stride)) stride = std::numeric_limits<std::int64_t>::max();
  }
  return t;
}

TensorView TensorView::bshd(const void* data, DType dtype, std::int64_t batch, std::int64_t seq,
                            std::int64_t heads, std::int64_t dim) {
  TensorView t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = 4;
  t.shape = {batch, heads, seq, dim};
  t.strides = {seq * heads * dim, dim, heads * dim, 1};
  return t;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank && d < 4; ++d) {
    if (shape[d] < 0) return -1;
    if (__builtin_mul_overflow(n, shape[d], &n)) return -1;
  }
  return n;
}

namespace core {
namespace {

std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < t.rank && d < 4; ++d) s << (d ? ", " : "") << t.shape[d];
  s << "]";
  return s.str();
}

std::string strides_str(const TensorView& t) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < t.rank && d < 4; ++d) s << (d ? ", " : "") << t.strides[d];
  s << "]";
  return s.str();
}

std::string dims_str(std::initializer_list<std::int64_t> dims) {
  std::ostringstream s;
  s << "[";
  bool first = true;
  for (std::int64_t n : dims) {
    s << (first ? "" : ", ") << n;
    first = false;
  }
  s << "]";
  return s.str();
}

bool known_dtype(DType d) { return static_cast<unsigned>(d) <= static_cast<unsigned>(DType::i4); }
bool float_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

}  // namespace

// Byte range [lo, hi) a view can touch; empty (lo == hi) when it has no elements. For views that passed
// check_view.
Extent extent_of(const TensorView& t) {
  Extent e;
  if (t.numel() <= 0) return e;
  std::int64_t min_off = 0, max_off = 0;
  for (int d = 0; d < t.rank; ++d) {
    const std::int64_t span = (t.shape[d] - 1) * t.strides[d];
    (span < 0 ? min_off : max_off) += span;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  if (t.dtype == DType::i4) {  // nibbles: element n lies in byte n / 2 (rounded down, also below the origin)
    e.lo = base + static_cast<std::uintptr_t>(min_off >> 1);
    e.hi = base + static_cast<std::uintptr_t>((max_off >> 1) + 1);
    return e;
  }
  const auto es = static_cast<std::int64_t>(dtype_size(t.dtype));
  e.lo = base + static_cast<std::uintptr_t>(min_off * es);
  e.hi = base + static_cast<std::uintptr_t>((max_off + 1) * es);
  return e;
}

bool overlaps(const Extent& a, const Extent& b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

Status check_view(const std::string& name, const TensorView& t, int expected_rank) {
  if (t.rank != expected_rank)
    return Status::Invalid(name, "rank " + std::to_string(t.rank) + "; expected rank " + std::to_string(expected_rank));
  if (!known_dtype(t.dtype)) return Status::Invalid(name, "unknown dtype value " + std::to_string(int(t.dtype)) + "; expected an attn::DType");
  std::int64_t numel = 1;
  __int128 reach = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0)
      return Status::Invalid(name, "dimension " + std::to_string(d) + " is " + std::to_string(t.shape[d]) +
                                       "; expected a size >= 0");
    if (__builtin_mul_overflow(numel, t.shape[d], &numel))
      return Status::Invalid(name, "shape " + shape_str(t) + " has more than 2^63 elements");
    const __int128 stride = t.strides[d];  // widened first: -INT64_MIN does not fit in 64 bits
    reach += static_cast<__int128>(t.shape[d]) * (stride < 0 ? -stride : stride);
  }
  if (reach > (static_cast<__int128>(1) << 60))
    return Status::Invalid(name, "strides reach beyond 2^60 elements; expected a view of addressable memory");
  if (numel > 0 && t.data == nullptr) return Status::Invalid(name, "data is null; expected a pointer to " +
                                                                       std::to_string(numel) + " elements");
  return Status::Ok();
}

Status check_output_strides(const std::string& name, const TensorView& t) {
  if (t.numel() == 0) return Status::Ok();
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.strides[d] == 0)
      return Status::Invalid(name, "stride of dimension " + std::to_string(d) +
                                       " is 0; expected a non-zero stride for an output");
  // Every element its own address: ordered by |stride|, each dimension's stride passes the span of the ones
  // below it (sufficient, and what every layout made by slicing, transposing or padding a tensor satisfies).
  std::pair<std::int64_t, std::int64_t> dims[4];  // (|stride|, size) of the dimensions of size > 1
  int n = 0;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) dims[n++] = {t.strides[d] < 0 ? -t.strides[d] : t.strides[d], t.shape[d]};
  for (int i = 1; i < n; ++i)  // insertion sort of at most four
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  __int128 span = 0;  // the largest offset the dimensions below reach
  for (int i = 0; i < n; ++i) {
    if (dims[i].first <= span)
      return Status::Invalid(name, "strides " + strides_str(t) + " give elements of shape " + shape_str(t) +
                                       " overlapping addresses; expected strides under which every element has "
                                       "its own address (an output)");
    span += static_cast<__int128>(dims[i].first) * (dims[i].second - 1);
  }
  return Status::Ok();
}

namespace {

Strided strided4(const TensorView& t) {
  Strided s;
  s.data = t.data;
  s.dtype = t.dtype;
  for (int d = 0; d < 4; ++d) s.stride[d] = d < t.rank ? t.strides[d] : 0;
  return s;
}

// A mask value the softmax can take: finite or -inf. `x <= FLT_MAX` fails exactly for NaN and +inf.
bool mask_value_ok(float x) { return x <= std::numeric_limits<float>::max(); }

// A tensor of a call and its parameter's name (null: not given).
struct NamedView {
  const char* name;
  const TensorView* t;
};

// Every tensor of a call on q's device: the first that is not is named.
template <class Views>
Status check_placement(const Device& device, const Views& views) {
  for (const auto& [name, t] : views)
    if (t && t->device != device)
      return Status::Invalid(name, "on " + device_name(t->device) + "; expected q's device, " + device_name(device) +
                                       " (every tensor of a call on one device)");
  if (device.is_cuda() && !cuda::built_with_cuda())
    return Status::Unsupported("q", "on " + device_name(device) + "; no CUDA device: this build of attn has no CUDA backend "
                                    "(configure with -DATTN_CUDA=ON where the CUDA toolkit is installed)");
  if (device.kind != Device::Kind::cpu && device.kind != Device::Kind::cuda)
    return Status::Invalid("q", "device kind " + std::to_string(static_cast<int>(device.kind)) + "; expected cpu or cuda");
  if (device.is_cuda() && device.index < 0)
    return Status::Invalid("q", "device cuda:" + std::to_string(device.index) + "; expected an index >= 0");
  return Status::Ok();
}

// A view whose values validation can read: t itself in host memory, else a host copy of the bytes it spans (in
// `copy`), ordered after the caller's stream, with t's shape and strides. A device view that is not a valid view
// (check_view) is returned as it is: the caller's own checks refuse it before reading a value.
Status readable(const TensorView& t, void* stream, std::vector<unsigned char>& copy, TensorView* out) {
  *out = t;
  if (!t.device.is_cuda() || t.rank < 1 || t.rank > 4 || !check_view("t", t, t.rank) || t.numel() == 0)
    return Status::Ok();
  const Extent e = extent_of(t);
  copy.resize(static_cast<std::size_t>(e.hi - e.lo));
  if (Status s = cuda::copy_to_host(copy.data(), reinterpret_cast<const void*>(e.lo), copy.size(), t.device.index, stream); !s)
    return s;
  out->data = copy.data() + (reinterpret_cast<std::uintptr_t>(t.data) - e.lo);
  out->device = Device::cpu();
  return Status::Ok();
}

// Whether n mask values at stride st are all acceptable. The unit-stride loop is a plain count the compiler
// vectorises (one pass at memory speed).
bool values_ok(const float* x, std::int64_t n, std::int64_t st) {
  std::int64_t bad = 0;
  if (st == 1)
    for (std::int64_t e = 0; e < n; ++e) bad += !mask_value_ok(x[e]);
  else
    for (std::int64_t e = 0; e < n; ++e) bad += !mask_value_ok(x[e * st]);
  return bad == 0;
}

// NumPy broadcasting of a rank-1..4 mask to [B, Hq, Sq, Skv]; fills mask strides (0 where broadcast)
// and (with check_values) scans an additive mask for values that would poison the softmax (NaN, +inf).
Status check_mask(const TensorView& m, const Problem& p, bool check_values, Strided* out, MaskKind* kind) {
  if (m.rank < 1 || m.rank > 4)
    return Status::Invalid("mask", "rank " + std::to_string(m.rank) +
                                       "; expected rank 1 to 4 (broadcastable to [B, Hq, Sq, Skv])");
  if (Status s = check_view("mask", m, m.rank); !s) return s;
  if (m.dtype != DType::f32 && m.dtype != DType::boolean)
    return Status::Invalid("mask", std::string("dtype ") + dtype_name(m.dtype) +
                                       "; expected f32 (additive) or bool (true = keep)");
  const std::int64_t full[4] = {p.B, p.Hq, p.Sq, p.Skv};
  const char* names[4] = {"B", "Hq", "Sq", "Skv"};
  Strided s;
  s.data = m.data;
  s.dtype = m.dtype;
  const int lead = 4 - m.rank;
  for (int d = 0; d < 4; ++d) {
    if (d < lead) continue;  // missing leading dims broadcast
    const std::int64_t n = m.shape[d - lead];
    if (n != 1 && n != full[d])
      return Status::Invalid("mask", "shape " + shape_str(m) + " does not broadcast to " +
                                         dims_str({p.B, p.Hq, p.Sq, p.Skv}) + ": dimension " +
                                         std::to_string(d - lead) + " is " + std::to_string(n) + "; expected 1 or " +
                                         std::to_string(full[d]) + " (" + names[d] + ")");
    s.stride[d] = (n == 1) ? 0 : m.strides[d - lead];
  }
  if (m.dtype == DType::f32 && check_values && m.numel() > 0) {  // an empty mask may have a null data pointer
    // Walk the mask's own elements once, a row at a time; only a bad row is searched for the element to name.
    const auto* base = static_cast<const float*>(m.data);
    std::int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
    for (int d = 0; d < m.rank; ++d) sh[d + lead] = m.shape[d], st[d + lead] = m.strides[d];
    for (std::int64_t a = 0; a < sh[0]; ++a)
      for (std::int64_t b = 0; b < sh[1]; ++b)
        for (std::int64_t c = 0; c < sh[2]; ++c) {
          if (values_ok(base + a * st[0] + b * st[1] + c * st[2], sh[3], st[3])) continue;
          for (std::int64_t e = 0; e < sh[3]; ++e) {
            const float x = base[a * st[0] + b * st[1] + c * st[2] + e * st[3]];
            if (!mask_value_ok(x))
              return Status::Invalid("mask", "element " + dims_str({a, b, c, e}) + " is " +
                                                 (std::isnan(x) ? std::string("NaN") : std::string("+inf")) +
                                                 "; expected finite values or -inf");
          }
        }
  }
  *out = s;
  *kind = m.dtype == DType::f32 ? MaskKind::additive : MaskKind::keep;
  return Status::Ok();
}

Status check_kv_lens(const char* name, const TensorView& t, Problem* p) {
  if (Status s = check_view(name, t, 1); !s) return s;
  if (t.dtype != DType::i32 && t.dtype != DType::i64)
    return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected i32 or i64");
  if (t.shape[0] != p->B)
    return Status::Invalid(name, "shape " + shape_str(t) + "; expected [" + std::to_string(p->B) + "] (B)");
  for (std::int64_t b = 0; b < p->B; ++b) {
    const std::int64_t off = b * t.strides[0];
    const std::int64_t len = t.dtype == DType::i32 ? static_cast<const std::int32_t*>(t.data)[off]
                                                   : static_cast<const std::int64_t*>(t.data)[off];
    if (len < 0 || len > p->Skv)
      return Status::Invalid(name, std::string(name) + "[" + std::to_string(b) + "] = " + std::to_string(len) +
                                       "; expected 0 <= length <= Skv = " + std::to_string(p->Skv));
    p->kv_len[b] = len;
  }
  return Status::Ok();
}

// A page table [B, max_pages] of i32 page indices, each in [0, P) where a sequence uses it.
Status check_page_table(const TensorView& t, std::int64_t pages, std::int64_t page_size, Problem* p) {
  if (Status s = check_view("page_table", t, 2); !s) return s;
  if (t.dtype != DType::i32)
    return Status::Invalid("page_table", std::string("dtype ") + dtype_name(t.dtype) + "; expected i32");
  if (t.shape[0] != p->B)
    return Status::Invalid("page_table", "shape " + shape_str(t) + "; expected [" + std::to_string(p->B) + ", max_pages]");
  Paged pg;
  pg.table = static_cast<const std::int32_t*>(t.data);
  pg.table_stride[0] = t.strides[0];
  pg.table_stride[1] = t.strides[1];
  pg.page_size = page_size;
  pg.pages = pages;
  for (std::int64_t b = 0; b < p->B; ++b) {
    const std::int64_t used = (p->kv_len[static_cast<std::size_t>(b)] + page_size - 1) / page_size;
    for (std::int64_t n = 0; n < used; ++n) {
      const std::int64_t id = pg.table[b * pg.table_stride[0] + n * pg.table_stride[1]];
      if (id < 0 || id >= pages)
        return Status::Invalid("page_table", "page_table[" + std::to_string(b) + "][" + std::to_string(n) + "] = " +
                                                 std::to_string(id) + "; expected a page index in [0, " +
                                                 std::to_string(pages) + ")");
    }
  }
  p->paged = pg;
  return Status::Ok();
}

// A per-head vector of f32 values ([Hq], or [B, Hq] where `batched`), every value passing `ok`; fills *out
// (stride[0] over the batch, 0 for [Hq]; stride[1] over heads).
template <class Ok>
Status check_per_head(const char* name, const TensorView& t, const Problem& p, bool batched, Ok ok,
                      const char* expected_values, Strided* out) {
  if (t.rank != 1 && !(batched && t.rank == 2))
    return Status::Invalid(name, "rank " + std::to_string(t.rank) + "; expected rank 1 ([Hq])" +
                                     std::string(batched ? " or 2 ([B, Hq])" : ""));
  if (Status s = check_view(name, t, t.rank); !s) return s;
  if (t.dtype != DType::f32)
    return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected f32");
  const bool two = t.rank == 2;
  if ((two && (t.shape[0] != p.B || t.shape[1] != p.Hq)) || (!two && t.shape[0] != p.Hq))
    return Status::Invalid(name, "shape " + shape_str(t) + "; expected [" + std::to_string(p.Hq) + "] (Hq)" +
                                     (batched ? " or " + dims_str({p.B, p.Hq}) + " ([B, Hq])" : std::string()));
  Strided s;
  s.data = t.data;
  s.dtype = t.dtype;
  s.stride[0] = two ? t.strides[0] : 0;
  s.stride[1] = two ? t.strides[1] : t.strides[0];
  const std::int64_t rows = two ? p.B : 1;
  for (std::int64_t b = 0; b < rows; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      const float x = static_cast<const float*>(t.data)[b * s.stride[0] + h * s.stride[1]];
      if (!ok(x)) {
        std::ostringstream v;
        v << x;
        return Status::Invalid(name, std::string(name) + (two ? "[" + std::to_string(b) + "]" : std::string()) + "[" +
                                         std::to_string(h) + "] = " + v.str() + "; expected " + expected_values);
      }
    }
  *out = s;
  return Status::Ok();
}

// softcap, alibi_slopes and sinks (attn::Params).
Status check_variants(const Params& params, Problem* p) {
  const double cap = params.softcap;
  if (!(cap == 0 || (cap >= std::numeric_limits<float>::min() && cap <= std::numeric_limits<float>::max()))) {
    std::ostringstream v;
    v << cap;
    return Status::Invalid("softcap", "is " + v.str() +
                                          "; expected 0 (off) or a value in [1.18e-38, 3.4e38] (a normal fp32 number)");
  }
  p->softcap = static_cast<float>(cap);
  p->alibi.reset();
  p->sinks.reset();
  std::vector<unsigned char> copy;  // (device tensors' values read from host copies; their device pointers kept)
  TensorView host;
  if (params.alibi_slopes) {
    Strided s;
    if (Status st = readable(*params.alibi_slopes, params.stream, copy, &host); !st) return st;
    if (Status st = check_per_head("alibi_slopes", host, *p, true, [](float x) { return std::isfinite(x); },
                                   "finite slopes", &s);
        !st)
      return st;
    s.data = params.alibi_slopes->data;
    p->alibi = s;
  }
  if (params.sinks) {
    Strided s;
    if (Status st = readable(*params.sinks, params.stream, copy, &host); !st) return st;
    if (Status st = check_per_head("sinks", host, *p, false, [](float x) { return mask_value_ok(x); },
                                   "finite logits or -inf (no sink)", &s);
        !st)
      return st;
    s.data = params.sinks->data;
    p->sinks = s;
  }
  p->dropout = Dropout{};
  const double drop = params.dropout_p;
  if (!(drop >= 0 && drop < 1)) {
    std::ostringstream v;
    v << drop;
    return Status::Invalid("dropout_p", "is " + v.str() + "; expected a probability in [0, 1) (0 = off)");
  }
  if (drop > 0) {
    // The generator's counter words are 32 bits (core/dropout.h).
    constexpr std::int64_t k32 = std::int64_t{1} << 32;
    if (p->Sq >= k32 || p->Hq >= k32 || p->B >= k32 || p->Skv >= 4 * k32)
      return Status::Invalid("dropout_p", "is set with Sq = " + std::to_string(p->Sq) + ", Skv = " +
                                              std::to_string(p->Skv) +
                                              "; expected Sq, Hq, B < 2^32 and Skv < 2^34 with dropout");
    p->dropout.p = drop;
    p->dropout.seed = params.dropout_seed;
    // Rounded to the nearest multiple of 2^-32, at least 1 (a tiny p still drops now and then, never never).
    p->dropout.threshold = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(drop * 4294967296.0)));
    p->dropout.keep_scale = static_cast<float>(1.0 / (1.0 - drop));
  }
  return Status::Ok();
}

// The scales of quantised K/V (Params::k_scale / v_scale): both present exactly when k is i8 or i4, f32, shaped like
// k's first three dimensions ([B, Hkv, Skv], or [P, Hkv, page_size] for a page pool): i8 one scale per row, rank 3;
// i4 one per block of kI4Block values, rank 4 with ceil(dim / kI4Block) blocks last (dim: Dk for k_scale, Dv for
// v_scale). i4 rows must start on a byte: unit stride along a row, even strides across rows.
Status check_kv_scales(const Params& params, const TensorView& k, const TensorView& v, const char* kname,
                       const char* vname, Problem* p) {
  const bool i4 = k.dtype == DType::i4, quantised = k.dtype == DType::i8 || i4;
  if (i4)
    for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{kname, k}, {vname, v}}) {
      if (t.shape[3] > 1 && t.strides[3] != 1)
        return Status::Invalid(name, "stride " + std::to_string(t.strides[3]) +
                                         " along a row of i4 values; expected 1 (two values packed per byte)");
      for (int d = 0; d < 3; ++d)
        if (t.strides[d] % 2 != 0)
          return Status::Invalid(name, "strides " + strides_str(t) + " of i4 values; expected even strides in "
                                       "dimensions 0-2, so that every row starts on a byte");
    }
  const struct {
    const char* name;
    const std::optional<TensorView>& t;
    std::optional<Strided>* out;
    std::int64_t dim;
    const char* of;
  } scales[] = {{"k_scale", params.k_scale, &p->k_scale, k.shape[3], kname},
                {"v_scale", params.v_scale, &p->v_scale, v.shape[3], vname}};
  for (const auto& [name, t, out, dim, of] : scales) {
    if (!quantised) {
      if (t) return Status::Invalid(name, std::string("is set for ") + dtype_name(k.dtype) + " " + kname +
                                              "; expected it only with i8 or i4 k and v");
      continue;
    }
    const std::int64_t blocks = (dim + kI4Block - 1) / kI4Block;
    const auto want = [&] {  // built for an error only (a call that passes allocates nothing here)
      return i4 ? dims_str({k.shape[0], k.shape[1], k.shape[2], blocks}) + " (a scale per block of " +
                      std::to_string(kI4Block) + " values of each row of " + of + ")"
                : dims_str({k.shape[0], k.shape[1], k.shape[2]}) + " (a scale per row of " + of + ")";
    };
    const char* kind = i4 ? "i4" : "i8";
    if (!t) return Status::Invalid(name, std::string("is missing; expected f32 ") + want() + " for " + kind + " k and v");
    if (Status s = check_view(name, *t, i4 ? 4 : 3); !s) return s;
    if (t->dtype != DType::f32)
      return Status::Invalid(name, std::string("dtype ") + dtype_name(t->dtype) + "; expected f32");
    if (t->shape[0] != k.shape[0] || t->shape[1] != k.shape[1] || t->shape[2] != k.shape[2] ||
        (i4 && t->shape[3] != blocks))
      return Status::Invalid(name, "shape " + shape_str(*t) + "; expected " + want());
    *out = strided4(*t);
  }
  return Status::Ok();
}

// Arguments only attention_paged has.
struct PagedArgs {
  const TensorView& page_table;
  const TensorView& seq_lens;
};

Status validate_impl(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const Params& params, const std::optional<TensorView>& lse, const PagedArgs* paged,
                     Problem* problem) {
  // Filled in place: the key-length vector it borrows from a Workspace stays where the entry point's
  // core::KvLenLoan gives it back, whether validation passes or not (callers discard a failed problem).
  Problem& p = *problem;
  p = Problem{};
  const char* kname = paged ? "k_pages" : "k";
  const char* vname = paged ? "v_pages" : "v";
  const struct {
    const char* name;
    const TensorView& t;
  } qkvo[] = {{"q", q}, {kname, k}, {vname, v}, {"out", out}};
  for (const auto& [name, t] : qkvo) {
    if (Status s = check_view(name, t, 4); !s) return s;
    const bool kv = &t == &k || &t == &v;
    if (!float_dtype(t.dtype) && !(kv && (t.dtype == DType::i8 || t.dtype == DType::i4)))
      return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected f32, bf16 or f16" +
                                       (kv ? " (or i8 / i4 with k_scale and v_scale)" : ""));
  }
  // Every input of the call (the outputs out and lse aside).
  const NamedView inputs[] = {{"q", &q}, {kname, &k}, {vname, &v},
                              {"mask", params.mask ? &*params.mask : nullptr},
                              {"kv_lens", params.kv_lens ? &*params.kv_lens : nullptr},
                              {"page_table", paged ? &paged->page_table : nullptr},
                              {"seq_lens", paged ? &paged->seq_lens : nullptr},
                              {"alibi_slopes", params.alibi_slopes ? &*params.alibi_slopes : nullptr},
                              {"sinks", params.sinks ? &*params.sinks : nullptr},
                              {"k_scale", params.k_scale ? &*params.k_scale : nullptr},
                              {"v_scale", params.v_scale ? &*params.v_scale : nullptr}};
  if (Status s = check_placement(q.device, inputs); !s) return s;
  if (Status s = check_placement(q.device, std::array<NamedView, 2>{{{"out", &out}, {"lse", lse ? &*lse : nullptr}}}); !s)
    return s;
  p.device = q.device;
  p.stream = params.stream;
  p.B = q.shape[0], p.Hq = q.shape[1], p.Sq = q.shape[2], p.Dk = q.shape[3];
  p.Hkv = k.shape[1], p.Skv = k.shape[2], p.Dv = v.shape[3];
  const auto qdesc = [&] { return " (q is " + shape_str(q) + ")"; };  // (built for a message only: a call allocates nothing)
  if (p.Hq < 1) return Status::Invalid("q", "shape " + shape_str(q) + " has Hq = 0; expected at least one head");
  if (p.Dk < 1) return Status::Invalid("q", "shape " + shape_str(q) + " has Dk = 0; expected Dk >= 1");
  if (!paged && k.shape[0] != p.B)
    return Status::Invalid(kname, "batch " + std::to_string(k.shape[0]) + "; expected B = " + std::to_string(p.B) + qdesc());
  if (p.Hkv < 1) return Status::Invalid(kname, "shape " + shape_str(k) + " has Hkv = 0; expected at least one head");
  if (k.shape[3] != p.Dk)
    return Status::Invalid(kname, "head dim " + std::to_string(k.shape[3]) + "; expected Dk = " + std::to_string(p.Dk) + qdesc());
  if (p.Hq % p.Hkv != 0)
    return Status::Invalid(kname, "Hkv = " + std::to_string(p.Hkv) + " does not divide Hq = " + std::to_string(p.Hq) +
                                      "; expected Hq % Hkv == 0 (MHA, GQA or MQA)");
  if (v.shape[0] != k.shape[0] || v.shape[1] != p.Hkv || v.shape[2] != k.shape[2])
    return Status::Invalid(vname, "shape " + shape_str(v) + "; expected [" + std::to_string(k.shape[0]) + ", " +
                                      std::to_string(p.Hkv) + ", " + std::to_string(k.shape[2]) + ", Dv] to match " +
                                      kname + " " + shape_str(k));
  if (p.Dv < 1) return Status::Invalid(vname, "shape " + shape_str(v) + " has Dv = 0; expected Dv >= 1");
  // Sizes the kernels are built for (their scratch grows with the head dims, their indices with the rest).
  if (p.Dk > kMaxHeadDim)
    return Status::Invalid("q", "head dim Dk = " + std::to_string(p.Dk) + "; expected at most " +
                                    std::to_string(kMaxHeadDim) + " (attn::kMaxHeadDim)");
  if (p.Dv > kMaxHeadDim)
    return Status::Invalid(vname, "head dim Dv = " + std::to_string(p.Dv) + "; expected at most " +
                                      std::to_string(kMaxHeadDim) + " (attn::kMaxHeadDim)");
  for (const auto& [name, t] : qkvo)
    for (int d = 0; d < 3; ++d)
      if (t.shape[d] > kMaxExtent)
        return Status::Invalid(name, "dimension " + std::to_string(d) + " is " + std::to_string(t.shape[d]) +
                                         "; expected at most " + std::to_string(kMaxExtent) + " (attn::kMaxExtent)");
  if (paged) {
    if (k.shape[2] < 1) return Status::Invalid("k_pages", "page size 0; expected page_size >= 1");
    if (paged->page_table.shape[1] > kMaxExtent ||
        paged->page_table.shape[1] * k.shape[2] > kMaxExtent)  // (both factors below 2^31: no overflow)
      return Status::Invalid("page_table", "max_pages = " + std::to_string(paged->page_table.shape[1]) +
                                               " pages of " + std::to_string(k.shape[2]) + " keys; expected at most " +
                                               std::to_string(kMaxExtent) + " keys per sequence (attn::kMaxExtent)");
    p.Skv = paged->page_table.shape[1] * k.shape[2];  // max_pages · page_size
  }
  if (out.shape != std::array<std::int64_t, 4>{p.B, p.Hq, p.Sq, p.Dv})
    return Status::Invalid("out", "shape " + shape_str(out) + "; expected " + dims_str({p.B, p.Hq, p.Sq, p.Dv}) +
                                      " ([B, Hq, Sq, Dv])");
  if (v.dtype != k.dtype)
    return Status::Invalid(vname, std::string("dtype ") + dtype_name(v.dtype) + "; expected the dtype of " + kname +
                                      " (" + dtype_name(k.dtype) + ")");
  if (out.dtype != q.dtype)
    return Status::Invalid("out", std::string("dtype ") + dtype_name(out.dtype) + "; expected the dtype of q (" +
                                      dtype_name(q.dtype) + ")");
  if (Status s = check_output_strides("out", out); !s) return s;
  if (Status s = check_kv_scales(params, k, v, kname, vname, &p); !s) return s;
  p.group = p.Hq / p.Hkv;

  if (lse) {
    if (Status s = check_view("lse", *lse, 3); !s) return s;
    if (lse->dtype != DType::f32)
      return Status::Invalid("lse", std::string("dtype ") + dtype_name(lse->dtype) + "; expected f32");
    if (lse->shape[0] != p.B || lse->shape[1] != p.Hq || lse->shape[2] != p.Sq)
      return Status::Invalid("lse", "shape " + shape_str(*lse) + "; expected " + dims_str({p.B, p.Hq, p.Sq}) +
                                        " ([B, Hq, Sq])");
    if (Status s = check_output_strides("lse", *lse); !s) return s;
  }

  // Scale.
  p.scale = params.scale ? *params.scale : 1.0 / std::sqrt(static_cast<double>(p.Dk));
  if (!std::isfinite(p.scale) || p.scale <= 0) {
    std::ostringstream v;
    v << p.scale;
    return Status::Invalid("scale", "is " + v.str() + "; expected a finite value > 0");
  }
  // The kernels compute in fp32 and fold the scale into their exponents (scale·log2 e): it must be a normal
  // fp32 number with room for that factor.
  if (p.scale < kMinScale || p.scale > kMaxScale) {
    std::ostringstream v;
    v << "is " << p.scale << "; expected a value in [" << kMinScale << ", " << kMaxScale
      << "] (a normal fp32 number: the kernels compute in fp32)";
    return Status::Invalid("scale", v.str());
  }

  // Causal mask and window.
  if (static_cast<unsigned>(params.causal) > static_cast<unsigned>(Causal::bottom_right))
    return Status::Invalid("causal", "unknown value; expected none, top_left or bottom_right");
  p.causal = params.causal;
  const Window& w = params.window;
  if (w.left < -1 || w.right < -1)
    return Status::Invalid("window", "(" + std::to_string(w.left) + ", " + std::to_string(w.right) +
                                         "); expected left and right >= 0, or -1 for unbounded");
  if (static_cast<unsigned>(w.align) > static_cast<unsigned>(Align::bottom_right))
    return Status::Invalid("window.align", "unknown value; expected top_left or bottom_right");
  p.window = w;
  // A side beyond Sq + Skv reaches every key: clamped, so that diag ± side never overflows.
  const std::int64_t reach_all = p.Sq + p.Skv;
  if (p.window.left > reach_all) p.window.left = reach_all;
  if (p.window.right > reach_all) p.window.right = reach_all;

  // Key lengths.
  p.workspace = params.workspace;
  if (p.workspace) p.kv_len = std::move(p.workspace->impl().kv_len);  // lent for the call (core::KvLenLoan)
  p.kv_len.assign(static_cast<std::size_t>(p.B), p.Skv);
  // (Values of device tensors are read from host copies; the problem keeps their device pointers.)
  std::vector<unsigned char> copy;
  TensorView host;
  if (paged) {
    if (params.kv_lens)
      return Status::Invalid("kv_lens", "is set; expected it empty for attention_paged (seq_lens gives the lengths)");
    if (Status s = readable(paged->seq_lens, params.stream, copy, &host); !s) return s;
    if (Status s = check_kv_lens("seq_lens", host, &p); !s) return s;
    if (Status s = readable(paged->page_table, params.stream, copy, &host); !s) return s;
    if (Status s = check_page_table(host, k.shape[0], k.shape[2], &p); !s) return s;
    p.paged->table = static_cast<const std::int32_t*>(paged->page_table.data);
  } else if (params.kv_lens) {
    if (Status s = readable(*params.kv_lens, params.stream, copy, &host); !s) return s;
    if (Status s = check_kv_lens("kv_lens", host, &p); !s) return s;
  }

  // Dense mask.
  if (params.mask) {
    const bool values = params.check_mask_values && params.mask->dtype == DType::f32;
    if (Status s = readable(values ? *params.mask : TensorView{}, params.stream, copy, &host); !s) return s;
    if (Status s = check_mask(values ? host : *params.mask, p, params.check_mask_values, &p.mask, &p.mask_kind); !s)
      return s;
    p.mask.data = params.mask->data;
  }

  // Score variants.
  if (Status s = check_variants(params, &p); !s) return s;

  if (params.threads < 0 || params.threads > 4096)
    return Status::Invalid("threads", std::to_string(params.threads) + "; expected 0 (default) or 1 to 4096");
  p.threads = params.threads;
  if (static_cast<unsigned>(params.backend) > static_cast<unsigned>(Backend::cudnn))
    return Status::Invalid("backend", "unknown value; expected automatic, reference, flash or cudnn");
  p.backend = params.backend;
  if (p.device.is_cuda() && p.backend == Backend::reference)
    return Status::Unsupported("backend", "reference with tensors on " + device_name(p.device) +
                                              "; expected automatic, flash or cudnn (the fp64 reference runs on the CPU)");
  if (!p.device.is_cuda() && p.backend == Backend::cudnn)
    return Status::Unsupported("backend", "cudnn with tensors on the CPU; expected automatic, reference or flash "
                                          "(cuDNN runs on CUDA tensors)");

  // Outputs must not alias inputs (or each other): results would depend on the order of writes.
  const Extent eo = extent_of(out);
  for (const auto& [name, t] : inputs) {
    if (!t) continue;
    const Extent ei = extent_of(*t);
    if (overlaps(eo, ei))
      return Status::Invalid("out", std::string("memory overlaps input ") + name + "; expected a separate buffer");
    if (lse && overlaps(extent_of(*lse), ei))
      return Status::Invalid("lse", std::string("memory overlaps input ") + name + "; expected a separate buffer");
  }
  if (lse && overlaps(extent_of(*lse), eo))
    return Status::Invalid("lse", "memory overlaps out; expected a separate buffer");

  p.q = strided4(q);
  p.k = strided4(k);
  p.v = strided4(v);
  p.out = strided4(out);
  if (lse) p.lse = strided4(*lse);
  return Status::Ok();
}

// The validators' one answer to an allocation that fails (the per-batch key lengths, host copies of device
// tensors' values, messages): an error, never an exception, so that no entry point needs its own handler.
template <class F>
Status without_throwing(F&& validate) {
  try {
    return validate();
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(
        "q", "validation could not allocate memory (the per-batch key lengths, or host copies of device tensors' values)");
  }
}

}  // namespace

Status validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                const Params& params, const std::optional<TensorView>& lse, Problem* problem) {
  return without_throwing([&] { return validate_impl(q, k, v, out, params, lse, nullptr, problem); });
}

Status validate_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                      const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                      const Params& params, const std::optional<TensorView>& lse, Problem* problem) {
  const PagedArgs paged{page_table, seq_lens};
  return without_throwing([&] { return validate_impl(q, k_pages, v_pages, out, params, lse, &paged, problem); });
}

// ---- the backward pass ------------------------------------------------------------------------------

namespace {
Status validate_backward_impl(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                              const TensorView& grad_k, const TensorView& grad_v, const Params& params,
                              const std::optional<TensorView>& grad_sinks, BackwardProblem* problem) {
  BackwardProblem& bp = *problem;  // in place, as validate_impl (core::KvLenLoan)
  if (Status s = validate(q, k, v, out, params, lse, &bp.fwd); !s) return s;
  const NamedView grad_views[] = {{"grad_out", &grad_out}, {"grad_q", &grad_q}, {"grad_k", &grad_k},
                                  {"grad_v", &grad_v}, {"grad_sinks", grad_sinks ? &*grad_sinks : nullptr}};
  if (Status s = check_placement(q.device, grad_views); !s) return s;
  if (k.dtype == DType::i8 || k.dtype == DType::i4)
    return Status::Invalid("k", std::string("dtype ") + dtype_name(k.dtype) +
                                    "; expected f32, bf16 or f16 (quantised K/V are for inference: no backward)");
  // The LSE's values are not read: the backward recomputes each row's statistics from the scores (see
  // cpu/backward_kernel.h, row_statistics); only its shape and dtype are checked (above).
  const struct {
    const char* name;
    const TensorView& t;
    DType dtype;
    const char* dtype_of;
    std::array<std::int64_t, 4> shape;
    const char* shape_of;
    bool output;
  } grads[] = {
      {"grad_out", grad_out, q.dtype, "q", out.shape, "out ([B, Hq, Sq, Dv])", false},
      {"grad_q", grad_q, q.dtype, "q", q.shape, "q ([B, Hq, Sq, Dk])", true},
      {"grad_k", grad_k, k.dtype, "k", k.shape, "k ([B, Hkv, Skv, Dk])", true},
      {"grad_v", grad_v, k.dtype, "k and v", v.shape, "v ([B, Hkv, Skv, Dv])", true},
  };
  for (const auto& g : grads) {
    if (Status s = check_view(g.name, g.t, 4); !s) return s;
    if (g.t.dtype != g.dtype)
      return Status::Invalid(g.name, std::string("dtype ") + dtype_name(g.t.dtype) + "; expected the dtype of " +
                                         g.dtype_of + " (" + dtype_name(g.dtype) + ")");
    if (g.t.shape != g.shape)
      return Status::Invalid(g.name, "shape " + shape_str(g.t) + "; expected " +
                                         dims_str({g.shape[0], g.shape[1], g.shape[2], g.shape[3]}) +
                                         ", the shape of " + g.shape_of);
    if (g.output)
      if (Status s = check_output_strides(g.name, g.t); !s) return s;
  }

  // Gradients must not alias any input or each other.
  const struct {
    const char* name;
    const TensorView* t;
  } reads[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}, {"grad_out", &grad_out},
               {"mask", params.mask ? &*params.mask : nullptr},
               {"kv_lens", params.kv_lens ? &*params.kv_lens : nullptr},
               {"alibi_slopes", params.alibi_slopes ? &*params.alibi_slopes : nullptr},
               {"sinks", params.sinks ? &*params.sinks : nullptr}};
  const struct {
    const char* name;
    const TensorView* t;
  } writes[] = {{"grad_q", &grad_q}, {"grad_k", &grad_k}, {"grad_v", &grad_v}};
  for (std::size_t w = 0; w < 3; ++w) {
    const Extent ew = extent_of(*writes[w].t);
    for (const auto& [name, t] : reads)
      if (t && overlaps(ew, extent_of(*t)))
        return Status::Invalid(writes[w].name, std::string("memory overlaps input ") + name +
                                                   "; expected a separate buffer");
    for (std::size_t o = 0; o < w; ++o)
      if (overlaps(ew, extent_of(*writes[o].t)))
        return Status::Invalid(writes[w].name, std::string("memory overlaps ") + writes[o].name +
                                                   "; expected a separate buffer");
  }
  bp.fwd.stats_from_forward = params.backward_statistics == BackwardStatistics::from_forward;
  if (params.backward_statistics != BackwardStatistics::automatic &&
      params.backward_statistics != BackwardStatistics::from_forward)
    return Status::Invalid("backward_statistics", "value " +
                                                     std::to_string(static_cast<int>(params.backward_statistics)) +
                                                     "; expected automatic or from_forward");
  if (bp.fwd.stats_from_forward && bp.fwd.backend == Backend::reference)
    return Status::Unsupported("backward_statistics", "from_forward with the reference backend (it recomputes every "
                                                      "statistic); expected the flash or automatic backend");
  if (bp.fwd.stats_from_forward && bp.fwd.sinks)
    return Status::Unsupported("backward_statistics", "from_forward with sinks; expected no sinks (a sink belongs "
                                                      "to the whole key set)");
  bp.dsinks.reset();
  if (grad_sinks) {
    if (!params.sinks) return Status::Invalid("grad_sinks", "is set; expected it only with params.sinks");
    const TensorView& g = *grad_sinks;
    if (Status s = check_view("grad_sinks", g, 1); !s) return s;
    if (g.dtype != DType::f32)
      return Status::Invalid("grad_sinks", std::string("dtype ") + dtype_name(g.dtype) + "; expected f32");
    if (g.shape[0] != bp.fwd.Hq)
      return Status::Invalid("grad_sinks", "shape " + shape_str(g) + "; expected [" + std::to_string(bp.fwd.Hq) + "] (Hq)");
    if (Status s = check_output_strides("grad_sinks", g); !s) return s;
    const Extent eg = extent_of(g);
    for (const auto& [name, t] : reads)
      if (t && overlaps(eg, extent_of(*t)))
        return Status::Invalid("grad_sinks", std::string("memory overlaps input ") + name + "; expected a separate buffer");
    for (const auto& w : writes)
      if (overlaps(eg, extent_of(*w.t)))
        return Status::Invalid("grad_sinks", std::string("memory overlaps ") + w.name + "; expected a separate buffer");
    if (overlaps(eg, extent_of(*params.sinks)))
      return Status::Invalid("grad_sinks", "memory overlaps input sinks; expected a separate buffer");
    bp.dsinks = strided4(g);
    bp.dsinks->stride[1] = g.strides[0];
  }
  bp.dout = strided4(grad_out);
  bp.dq = strided4(grad_q);
  bp.dk = strided4(grad_k);
  bp.dv = strided4(grad_v);
  return Status::Ok();
}

}  // namespace

Status validate_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         const TensorView& lse, const TensorView& grad_out, const TensorView& grad_q,
                         const TensorView& grad_k, const TensorView& grad_v, const Params& params,
                         const std::optional<TensorView>& grad_sinks, BackwardProblem* problem) {
  return without_throwing([&] {
    return validate_backward_impl(q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, params, grad_sinks, problem);
  });
}

}  // namespace core
}  // namespace attn
