// KV caches: contiguous per sequence, and paged (a pool of pages with a free list).
#include "attn/kv_cache.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "core/convert.h"
#include "core/views.h"
#include "kvcache/rotary_row.h"

namespace attn {
namespace {

std::string str(std::int64_t x) { return std::to_string(x); }

Status positive(const char* name, std::int64_t value) {
  if (value < 1) return Status::Invalid(name, str(value) + "; expected >= 1");
  return Status::Ok();
}

// Checks that `t` is an f32, bf16 or f16 [1, heads, T, dim] view (0 <= T <= kMaxExtent) and returns T (its values:
// check_values, once the append is known to fit).
Status check_tokens(const char* name, const TensorView& t, std::int64_t heads, std::int64_t dim,
                    std::int64_t* tokens) {
  if (t.rank != 4) return Status::Invalid(name, "rank " + str(t.rank) + "; expected rank 4 [1, Hkv, T, D]");
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
    return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected f32, bf16 or f16");
  if (t.shape[0] != 1) return Status::Invalid(name, "batch " + str(t.shape[0]) + "; expected 1 (one sequence)");
  if (t.shape[1] != heads) return Status::Invalid(name, "heads " + str(t.shape[1]) + "; expected Hkv = " + str(heads));
  if (t.shape[3] != dim) return Status::Invalid(name, "head dim " + str(t.shape[3]) + "; expected " + str(dim));
  if (t.shape[2] < 0) return Status::Invalid(name, "token count " + str(t.shape[2]) + "; expected >= 0");
  if (t.shape[2] > kMaxExtent)
    return Status::Invalid(name, "token count " + str(t.shape[2]) + "; expected at most " + str(kMaxExtent) +
                                     " (attn::kMaxExtent)");
  if (t.shape[2] > 0 && !t.data) return Status::Invalid(name, "data is null; expected a buffer");
  *tokens = t.shape[2];
  return Status::Ok();
}

// Row t of head h of src [1, H, T, dim] as fp32 into x, turned at `position` when `rotary` is given.
void load_row(const TensorView& src, std::int64_t h, std::int64_t t, float* x, const Rotary* rotary,
              std::int64_t position) {
  for (std::int64_t d = 0; d < src.shape[3]; ++d)
    x[d] = core::float_at(src, h * src.strides[1] + t * src.strides[2] + d * src.strides[3]);
  if (rotary) kvcache::rotate_row(x, *rotary, position);
}

// Whether the values an append would store are fine, checked before anything is written: an i8 or i4 cache
// refuses a value that is not finite (it has no scale for inf or NaN), and every cache a finite input that its
// storage would hold as inf or NaN (an f16 value past 65504, a rotary turn that overflows or a NaN in its tables).
// The rows checked are the ones stored: the keys after their turn.
Status check_values(const char* name, const TensorView& src, DType storage, const Rotary* rotary,
                    std::int64_t position0) {
  const bool quantised = storage == DType::i8 || storage == DType::i4;
  if (!quantised && !rotary && (storage == DType::f32 || src.dtype == storage)) return Status::Ok();  // (exact)
  const std::int64_t dim = src.shape[3];
  const auto input = [&](std::int64_t h, std::int64_t t, std::int64_t d) {
    return core::float_at(src, h * src.strides[1] + t * src.strides[2] + d * src.strides[3]);
  };
  const auto at = [&](std::int64_t h, std::int64_t t, std::int64_t d) {  // (built for a message only)
    return "value [0, " + str(h) + ", " + str(t) + ", " + str(d) + "]";
  };
  std::vector<float> x(static_cast<std::size_t>(dim));
  for (std::int64_t h = 0; h < src.shape[1]; ++h)
    for (std::int64_t t = 0; t < src.shape[2]; ++t) {
      // The input row first: a quantised cache refuses its non-finite values by name; with a rotary turn, a row
      // holding one may pass it to its partners, which then are not the caller's finite values turned.
      bool row_finite = true;
      for (std::int64_t d = 0; d < dim; ++d)
        if (!std::isfinite(input(h, t, d))) {
          if (quantised)
            return Status::Invalid(name, at(h, t, d) + " is not finite; expected finite values (an i8 or i4 cache "
                                                       "has no scale for inf or NaN)");
          row_finite = false;
        }
      if (quantised && !rotary) continue;  // (stored as given: checked)
      load_row(src, h, t, x.data(), rotary, position0 + t);
      for (std::int64_t d = 0; d < dim; ++d) {
        const float stored = storage == DType::bf16 ? core::to_float(core::from_float<core::bf16>(x[d]))
                             : storage == DType::f16 ? core::to_float(core::from_float<core::f16>(x[d]))
                                                     : x[d];
        if (std::isfinite(stored) || !(rotary ? row_finite : std::isfinite(input(h, t, d)))) continue;
        if (quantised)
          return Status::Invalid(name, at(h, t, d) + " = " + std::to_string(input(h, t, d)) + " becomes " +
                                           std::to_string(stored) + " after the rotary turn; expected finite "
                                           "values (an i8 or i4 cache has no scale for inf or NaN)");
        return Status::Invalid(name, at(h, t, d) + " = " + std::to_string(input(h, t, d)) + " would be stored as " +
                                         std::to_string(stored) + (rotary ? " (after the rotary turn)" : "") +
                                         "; expected values the cache's " + dtype_name(storage) + " holds as finite");
      }
    }
  return Status::Ok();
}

Status check_pair(const TensorView& k, const TensorView& v, std::int64_t hkv, std::int64_t dk, std::int64_t dv,
                  std::int64_t* tokens) {
  std::int64_t tk = 0, tv = 0;
  if (Status s = check_tokens("k", k, hkv, dk, &tk); !s) return s;
  if (Status s = check_tokens("v", v, hkv, dv, &tv); !s) return s;
  if (tk != tv) return Status::Invalid("v", "token count " + str(tv) + "; expected " + str(tk) + " (as k)");
  *tokens = tk;
  return Status::Ok();
}

// Sizes and storage a cache is created with: what attention_paged accepts for the views it is read through.
Status check_dims(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16 && dtype != DType::i8 && dtype != DType::i4)
    return Status::Invalid("dtype", std::string(dtype_name(dtype)) + "; expected f32, bf16, f16, i8 or i4");
  if (Status s = positive("kv_heads", kv_heads); !s) return s;
  if (Status s = positive("head_dim", head_dim); !s) return s;
  if (Status s = positive("v_head_dim", v_head_dim); !s) return s;
  if (kv_heads > kMaxExtent)
    return Status::Invalid("kv_heads", str(kv_heads) + "; expected at most " + str(kMaxExtent) + " (attn::kMaxExtent)");
  if (head_dim > kMaxHeadDim)
    return Status::Invalid("head_dim", str(head_dim) + "; expected at most " + str(kMaxHeadDim) + " (attn::kMaxHeadDim)");
  if (v_head_dim > kMaxHeadDim)
    return Status::Invalid("v_head_dim", str(v_head_dim) + "; expected at most " + str(kMaxHeadDim) +
                                             " (attn::kMaxHeadDim)");
  return Status::Ok();
}

// How a cache stores a row of `dim` values in `dtype`: rows `pitch()` elements apart (i4: dim rounded up to even, so
// that every row starts on a byte), and `scales()` f32 scales per row (i8: 1; i4: one per kI4Block values; else 0).
struct RowFormat {
  DType dtype;
  std::int64_t dim;
  std::int64_t pitch() const { return dtype == DType::i4 ? (dim + 1) / 2 * 2 : dim; }
  std::int64_t row_bytes() const { return dtype_bytes(dtype, pitch()); }
  std::int64_t scales() const {
    return dtype == DType::i8 ? 1 : dtype == DType::i4 ? (dim + kI4Block - 1) / kI4Block : 0;
  }
};

// Allocates the K and V storage (zeroed) of `heads_times_tokens` rows in `dtype`, and their scales for i8 and i4:
// an OutOfMemory Status naming `param` when the size overflows or the allocation fails (nothing else changes).
Status allocate(const char* param, std::int64_t heads_times_tokens, std::int64_t dk, std::int64_t dv, DType dtype,
                std::vector<unsigned char>* k, std::vector<unsigned char>* v, std::vector<float>* k_scale,
                std::vector<float>* v_scale) {
  const RowFormat fk{dtype, dk}, fv{dtype, dv};
  std::int64_t nk = 0, nv = 0, total = 0, nks = 0, nvs = 0;
  const bool overflow = __builtin_mul_overflow(heads_times_tokens, fk.row_bytes(), &nk) ||
                        __builtin_mul_overflow(heads_times_tokens, fv.row_bytes(), &nv) ||
                        __builtin_mul_overflow(heads_times_tokens, fk.scales() * 4, &nks) ||
                        __builtin_mul_overflow(heads_times_tokens, fv.scales() * 4, &nvs) ||
                        __builtin_add_overflow(nk, nv, &total) || __builtin_add_overflow(total, nks + nvs, &total) ||
                        total > static_cast<std::int64_t>(PTRDIFF_MAX / 2);
  const double bytes = static_cast<double>(heads_times_tokens) *
                       static_cast<double>(fk.row_bytes() + fv.row_bytes() + 4 * (fk.scales() + fv.scales()));
  char need[64];
  std::snprintf(need, sizeof need, "%.4g GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  if (overflow)
    return Status::OutOfMemory(param, std::string("the cache would need ") + need +
                                          " of keys and values, more than can be addressed; expected a smaller cache");
  try {
    k->assign(static_cast<std::size_t>(nk), 0);
    v->assign(static_cast<std::size_t>(nv), 0);
    k_scale->assign(static_cast<std::size_t>(nks / 4), 0.0f);
    v_scale->assign(static_cast<std::size_t>(nvs / 4), 0.0f);
  } catch (const std::bad_alloc&) {
    *k = {}, *v = {}, *k_scale = {}, *v_scale = {};
    return Status::OutOfMemory(param, std::string("could not allocate the cache's ") + need +
                                          " of keys and values; expected a cache that fits in memory");
  }
  return Status::Ok();
}

// A decode step's q [B, Hq, T, Dk], out [B, Hq, T, Dv] and lse [B, Hq, T] against a cache of Hkv heads of
// head dims Dk/Dv, checked before attention_paged sees them (whose messages would name its own parameters).
// `batch` is the number of sequences (`batch_what` says why).
Status check_decode(const TensorView& q, const TensorView& out, const std::optional<TensorView>& lse,
                    const Params& params, std::int64_t batch, const char* batch_what, std::int64_t hkv, std::int64_t dk,
                    std::int64_t dv) {
  if (q.rank != 4) return Status::Invalid("q", "rank " + str(q.rank) + "; expected rank 4 [B, Hq, T, Dk]");
  if (q.shape[0] != batch)
    return Status::Invalid("q", "batch " + str(q.shape[0]) + "; expected " + str(batch) + " (" + batch_what + ")");
  const std::int64_t hq = q.shape[1], t = q.shape[2];
  if (hq < 1 || hq % hkv != 0)
    return Status::Invalid("q", "heads " + str(hq) + "; expected a positive multiple of Hkv = " + str(hkv) +
                                    " (the cache's kv_heads)");
  if (t < 0) return Status::Invalid("q", "token count " + str(t) + "; expected >= 0");
  if (q.shape[3] != dk)
    return Status::Invalid("q", "head dim " + str(q.shape[3]) + "; expected Dk = " + str(dk) + " (the cache's head_dim)");
  const std::string want = "[" + str(batch) + ", " + str(hq) + ", " + str(t) + ", " + str(dv) + "]";
  if (out.rank != 4)
    return Status::Invalid("out", "rank " + str(out.rank) + "; expected rank 4 " + want + " ([B, Hq, T, Dv])");
  if (out.shape[0] != batch || out.shape[1] != hq || out.shape[2] != t || out.shape[3] != dv)
    return Status::Invalid("out", "shape [" + str(out.shape[0]) + ", " + str(out.shape[1]) + ", " + str(out.shape[2]) +
                                      ", " + str(out.shape[3]) + "]; expected " + want + " ([B, Hq, T, Dv], Dv = " +
                                      str(dv) + " the cache's v_head_dim)");
  if (lse) {
    const std::string lwant = "[" + str(batch) + ", " + str(hq) + ", " + str(t) + "]";
    if (lse->rank != 3)
      return Status::Invalid("lse", "rank " + str(lse->rank) + "; expected rank 3 " + lwant + " ([B, Hq, T])");
    if (lse->shape[0] != batch || lse->shape[1] != hq || lse->shape[2] != t)
      return Status::Invalid("lse", "shape [" + str(lse->shape[0]) + ", " + str(lse->shape[1]) + ", " +
                                        str(lse->shape[2]) + "]; expected " + lwant + " ([B, Hq, T])");
  }
  if (params.kv_lens)
    return Status::Invalid("kv_lens", "is set; expected it empty (the cache knows each sequence's length)");
  if (params.k_scale) return Status::Invalid("k_scale", "is set; expected it empty (the cache passes its own scales)");
  if (params.v_scale) return Status::Invalid("v_scale", "is set; expected it empty (the cache passes its own scales)");
  return Status::Ok();
}

// The params of attention_paged over a cache's pool: the caller's, with the pool's scales for i8 storage.
Params with_scales(const Params& params, const TensorView& k_scale, const TensorView& v_scale) {
  Params p = params;
  if (k_scale.rank) p.k_scale = k_scale, p.v_scale = v_scale;
  return p;
}

// The caller's mask sized to the keys it knows (`keys`: the cached length, or the longest sequence of the batch),
// as the `width` of keys the call reads (the capacity, or the page table's pages x page size): copied into `buf`
// with zeros past `keys` (keys no query sees: past every sequence's length). Other masks stay as they are.
Params widen_mask(const Params& params, std::int64_t keys, std::int64_t width, std::vector<unsigned char>* buf) {
  if (!params.mask) return params;
  const TensorView& m = *params.mask;
  if (m.rank < 1 || m.rank > 4 || m.shape[m.rank - 1] != keys || keys == width || keys == 1 || !m.data ||
      m.device.is_cuda())
    return params;  // (anything else is the attention's to accept or refuse)
  // (no huge copies: at most 2^24 elements, every product checked before it is formed)
  const std::int64_t most = (std::int64_t{1} << 24) / std::max<std::int64_t>(width, 1);
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < m.rank; ++d) {
    if (m.shape[d] < 0 || (m.shape[d] > 0 && rows > most / m.shape[d])) return params;
    rows *= m.shape[d];
  }
  const std::size_t size = dtype_size(m.dtype);
  buf->assign(static_cast<std::size_t>(rows * width) * size, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t at = 0, rest = r;  // the element offset of row r (its index over the leading dims)
    for (int d = m.rank - 2; d >= 0; --d) at += (rest % m.shape[d]) * m.strides[d], rest /= m.shape[d];
    for (std::int64_t j = 0; j < keys; ++j)
      std::memcpy(buf->data() + static_cast<std::size_t>(r * width + j) * size,
                  static_cast<const unsigned char*>(m.data) + static_cast<std::ptrdiff_t>(at + j * m.strides[m.rank - 1]) *
                                                                  static_cast<std::ptrdiff_t>(size),
                  size);
  }
  Params p = params;
  TensorView w = m;
  w.data = buf->data();
  w.shape[m.rank - 1] = width;
  std::int64_t stride = 1;
  for (int d = m.rank - 1; d >= 0; --d) w.strides[d] = stride, stride *= w.shape[d];
  p.mask = w;
  return p;
}

// A view of cache storage (`rank` dims of `shape` at `strides`).
TensorView storage_view(const void* data, DType dtype, std::array<std::int64_t, 4> shape,
                        std::array<std::int64_t, 4> strides, int rank) {
  TensorView t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.strides = strides;
  return t;
}

// The rows of a cache's storage `data` as [outer, heads, rows, dim]: `outer` blocks of `heads` runs of `slots` rows
// (KVCache: 1 x Hkv x capacity; PagedKVCache: pages x Hkv x page_size), the first `rows` of each run in view.
TensorView rows_view(const void* data, RowFormat f, std::int64_t outer, std::int64_t heads, std::int64_t rows,
                     std::int64_t slots) {
  const std::int64_t pitch = f.pitch();
  return storage_view(data, f.dtype, {outer, heads, rows, f.dim}, {heads * slots * pitch, slots * pitch, pitch, 1}, 4);
}

// Their scales (Params::k_scale / v_scale): i8 [outer, heads, rows], i4 [outer, heads, rows, blocks]; an empty
// view for other storage.
TensorView scales_view(const std::vector<float>& data, RowFormat f, std::int64_t outer, std::int64_t heads,
                       std::int64_t rows, std::int64_t slots) {
  const std::int64_t n = f.scales();
  if (n == 0) return {};
  if (f.dtype == DType::i8) return storage_view(data.data(), DType::f32, {outer, heads, rows, 0}, {heads * slots, slots, 1, 0}, 3);
  return storage_view(data.data(), DType::f32, {outer, heads, rows, n}, {heads * slots * n, slots * n, n, 1}, 4);
}

// An error of the attention_paged call that reads the cache, in the caller's terms: the pages, the page table
// and the lengths are the cache's, not arguments the caller passed, so each of those names becomes "cache".
Status as_cache_error(const Status& s) {
  if (s.ok()) return s;
  static const char* const internal[] = {"k_pages", "v_pages", "page_table", "seq_lens"};
  const auto rename = [](std::string text) {
    for (const char* name : internal) {
      const std::string from = name;
      for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 5))
        text.replace(at, from.size(), "cache");
    }
    return text;
  };
  const std::string param = rename(s.param());
  const std::string body = rename(s.message().substr(std::min(s.message().size(), s.param().size() + 2)));
  switch (s.code()) {
    case StatusCode::unsupported: return Status::Unsupported(param, body);
    case StatusCode::out_of_memory: return Status::OutOfMemory(param, body);
    default: return Status::Invalid(param, body);
  }
}

// The quantisation of a block of n values x (finite) to `bits` bits: q = round(x / s), s = max|x| / qmax with qmax
// 127 (i8) or 7 (i4), symmetric (-qmax .. qmax); an all-zero block gets s = 0 and q = 0. Returns s; q[d] written.
float quantise(const float* x, std::int64_t n, float qmax, int* q) {
  float amax = 0;
  for (std::int64_t d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float s = amax / qmax;
  for (std::int64_t d = 0; d < n; ++d)
    q[d] = s > 0 ? static_cast<int>(std::clamp(std::nearbyint(x[d] / s), -qmax, qmax)) : 0;
  return s;
}

// Rows t0 .. t0+count-1 of head h of src [1, H, T, dim] into storage rows `row0`.. of `dst` (rows of `dtype`, as
// RowFormat lays them out); i8 rows quantised with a scale per row, i4 rows with a scale per block of kI4Block values
// (quantise), the scales into `scale` (RowFormat::scales() per row).
// With `rotary`, each key row is turned at position position0 + t first (attn/rotary.h), then stored: the new keys
// are rotated as they are written, never in a second pass over the cache.
void store_rows(const TensorView& src, std::int64_t h, std::int64_t t0, std::int64_t count, DType dtype,
                std::vector<unsigned char>& dst, std::vector<float>& scale, std::int64_t row0,
                const Rotary* rotary = nullptr, std::int64_t position0 = 0) {
  const std::int64_t dim = src.shape[3];
  const RowFormat f{dtype, dim};
  std::vector<float> x(static_cast<std::size_t>(dim));
  std::vector<int> q(static_cast<std::size_t>(dim));
  for (std::int64_t t = 0; t < count; ++t) {
    load_row(src, h, t0 + t, x.data(), rotary, position0 + t);
    const std::int64_t row = row0 + t;
    unsigned char* out = dst.data() + row * f.row_bytes();
    float* scales = scale.data() + row * f.scales();
    switch (dtype) {
      case DType::bf16:
        for (std::int64_t d = 0; d < dim; ++d) reinterpret_cast<core::bf16*>(out)[d] = core::from_float<core::bf16>(x[d]);
        break;
      case DType::f16:
        for (std::int64_t d = 0; d < dim; ++d) reinterpret_cast<core::f16*>(out)[d] = core::from_float<core::f16>(x[d]);
        break;
      case DType::i8:
        scales[0] = quantise(x.data(), dim, 127.0f, q.data());
        for (std::int64_t d = 0; d < dim; ++d) reinterpret_cast<std::int8_t*>(out)[d] = static_cast<std::int8_t>(q[d]);
        break;
      case DType::i4:  // nibble q + 8, element d in byte d / 2 (attn/tensor.h)
        for (std::int64_t d0 = 0; d0 < dim; d0 += kI4Block)
          scales[d0 / kI4Block] = quantise(x.data() + d0, std::min(kI4Block, dim - d0), 7.0f, q.data() + d0);
        std::fill(out, out + f.row_bytes(), 0);
        for (std::int64_t d = 0; d < dim; ++d) out[d / 2] |= static_cast<unsigned char>((q[d] + 8) << (4 * (d & 1)));
        break;
      default:
        for (std::int64_t d = 0; d < dim; ++d) reinterpret_cast<float*>(out)[d] = x[d];
    }
  }
}

}  // namespace

Params decode_params() {
  Params p;
  p.causal = Causal::bottom_right;
  return p;
}

// ---- KVCache ----------------------------------------------------------------------------------------

Status KVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim, std::int64_t capacity,
                       KVCache* cache) {
  return create(kv_heads, head_dim, v_head_dim, capacity, DType::f32, cache);
}

Status KVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim, std::int64_t capacity,
                       DType dtype, KVCache* cache) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  if (Status s = check_dims(kv_heads, head_dim, v_head_dim, dtype); !s) return s;
  if (Status s = positive("capacity", capacity); !s) return s;
  // attend() reads the whole cache as one page of `capacity` tokens.
  if (capacity > kMaxExtent)
    return Status::Invalid("capacity", str(capacity) + "; expected at most " + str(kMaxExtent) + " (attn::kMaxExtent)");
  KVCache c;
  c.hkv_ = kv_heads, c.dk_ = head_dim, c.dv_ = v_head_dim, c.capacity_ = capacity, c.dtype_ = dtype;
  // kv_heads · capacity < 2^62: no overflow.
  if (Status s = allocate("capacity", kv_heads * capacity, head_dim, v_head_dim, dtype, &c.k_, &c.v_, &c.k_scale_,
                          &c.v_scale_);
      !s)
    return s;
  *cache = std::move(c);
  return Status::Ok();
}

Status KVCache::append(const TensorView& k, const TensorView& v) { return append_impl(k, v, nullptr); }

Status KVCache::append(const TensorView& k, const TensorView& v, const Rotary& rotary) {
  return append_impl(k, v, &rotary);
}

Status KVCache::append_impl(const TensorView& k, const TensorView& v, const Rotary* rotary) {
  if (capacity_ == 0) return Status::Invalid("cache", "not created; expected KVCache::create first");
  std::int64_t t = 0;
  if (Status s = check_pair(k, v, hkv_, dk_, dv_, &t); !s) return s;
  if (t > capacity_ - length_)
    return Status::Invalid("k", "appending " + str(t) + " tokens to a cache holding " + str(length_) + " of " +
                                    str(capacity_) + "; expected at most " + str(capacity_ - length_));
  if (rotary)
    if (Status s = kvcache::check_rotary(*rotary, dk_, length_, t); !s) return s;
  if (Status s = check_values("k", k, dtype_, rotary, length_); !s) return s;
  if (Status s = check_values("v", v, dtype_, nullptr, 0); !s) return s;
  for (std::int64_t h = 0; h < hkv_; ++h) {
    store_rows(k, h, 0, t, dtype_, k_, k_scale_, h * capacity_ + length_, rotary, length_);
    store_rows(v, h, 0, t, dtype_, v_, v_scale_, h * capacity_ + length_);
  }
  length_ += t;
  return Status::Ok();
}

Status KVCache::truncate(std::int64_t length) {
  if (length < 0 || length > length_)
    return Status::Invalid("length", str(length) + "; expected 0 .. " + str(length_) + " (the cached length)");
  length_ = length;
  return Status::Ok();
}

TensorView KVCache::keys() const { return rows_view(k_.data(), {dtype_, dk_}, 1, hkv_, length_, capacity_); }
TensorView KVCache::values() const { return rows_view(v_.data(), {dtype_, dv_}, 1, hkv_, length_, capacity_); }
TensorView KVCache::k_scales() const { return scales_view(k_scale_, {dtype_, dk_}, 1, hkv_, length_, capacity_); }
TensorView KVCache::v_scales() const { return scales_view(v_scale_, {dtype_, dv_}, 1, hkv_, length_, capacity_); }

Status KVCache::attend(const TensorView& q, const TensorView& out, const Params& params,
                       const std::optional<TensorView>& lse) const {
  if (capacity_ == 0) return Status::Invalid("cache", "not created; expected KVCache::create first");
  if (Status s = check_decode(q, out, lse, params, 1, "one sequence", hkv_, dk_, dv_); !s) return s;
  // The whole cache is one page of `capacity` tokens, so decode takes attention_paged's split-KV path.
  TensorView k = keys(), v = values(), ks = k_scales(), vs = v_scales();
  k.shape[2] = v.shape[2] = ks.shape[2] = vs.shape[2] = capacity_;
  std::int32_t table[1] = {0};
  std::int64_t lens[1] = {length_};
  std::vector<unsigned char> mask;  // (a mask as wide as the cached keys, widened to the capacity)
  return as_cache_error(attention_paged(q, k, v, TensorView::contiguous(table, DType::i32, {1, 1}),
                                        TensorView::contiguous(lens, DType::i64, {1}), out,
                                        with_scales(widen_mask(params, length_, capacity_, &mask), ks, vs), lse));
}

// ---- PagedKVCache -----------------------------------------------------------------------------------

Status PagedKVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                            std::int64_t page_size, std::int64_t num_pages, PagedKVCache* cache) {
  return create(kv_heads, head_dim, v_head_dim, page_size, num_pages, DType::f32, cache);
}

Status PagedKVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                            std::int64_t page_size, std::int64_t num_pages, DType dtype, PagedKVCache* cache) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  if (Status s = check_dims(kv_heads, head_dim, v_head_dim, dtype); !s) return s;
  if (Status s = positive("page_size", page_size); !s) return s;
  if (Status s = positive("num_pages", num_pages); !s) return s;
  if (page_size > kMaxExtent)
    return Status::Invalid("page_size", str(page_size) + "; expected at most " + str(kMaxExtent) + " (attn::kMaxExtent)");
  if (num_pages > INT32_MAX) return Status::Invalid("num_pages", str(num_pages) + "; expected at most 2^31 - 1");
  PagedKVCache c;
  c.hkv_ = kv_heads, c.dk_ = head_dim, c.dv_ = v_head_dim, c.page_size_ = page_size, c.num_pages_ = num_pages;
  c.dtype_ = dtype;
  std::int64_t slots = 0;  // num_pages · kv_heads · page_size
  if (__builtin_mul_overflow(num_pages * kv_heads, page_size, &slots))  // (the first product is below 2^62)
    return Status::OutOfMemory("num_pages", "the pool's " + str(num_pages) + " pages of " + str(kv_heads) + " x " +
                                                str(page_size) + " tokens are more than can be addressed; expected a "
                                                "smaller pool");
  if (Status s = allocate("num_pages", slots, head_dim, v_head_dim, dtype, &c.k_, &c.v_, &c.k_scale_, &c.v_scale_); !s)
    return s;
  try {
    c.free_.reserve(static_cast<std::size_t>(num_pages));
    for (std::int64_t p = num_pages - 1; p >= 0; --p) c.free_.push_back(static_cast<std::int32_t>(p));
    c.is_free_.assign(static_cast<std::size_t>(num_pages), 1);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("num_pages", "could not allocate the free list of " + str(num_pages) +
                                                " pages; expected a pool that fits in memory");
  }
  *cache = std::move(c);
  return Status::Ok();
}

bool PagedKVCache::page_is_free(std::int64_t page) const {
  return page >= 0 && page < num_pages_ && is_free_[static_cast<std::size_t>(page)];
}

std::int64_t PagedKVCache::add_sequence() {
  const std::int64_t id = next_id_++;
  seqs_[id] = Sequence{};
  return id;
}

Status PagedKVCache::find(std::int64_t id, const Sequence** seq) const {
  if (num_pages_ == 0) return Status::Invalid("cache", "not created; expected PagedKVCache::create first");
  const auto it = seqs_.find(id);
  if (it == seqs_.end())
    return Status::Invalid("sequence", "id " + str(id) + " does not exist; expected an id from add_sequence() "
                                                          "that has not been removed");
  *seq = &it->second;
  return Status::Ok();
}

Status PagedKVCache::truncate(std::int64_t id, std::int64_t length) {
  const Sequence* found = nullptr;
  if (Status s = find(id, &found); !s) return s;
  Sequence& seq = seqs_[id];
  if (length < 0 || length > seq.length)
    return Status::Invalid("length", str(length) + "; expected 0 .. " + str(seq.length) + " (the sequence's length)");
  const std::size_t keep = static_cast<std::size_t>((length + page_size_ - 1) / page_size_);
  while (seq.pages.size() > keep) {
    const std::int32_t p = seq.pages.back();
    seq.pages.pop_back();
    free_.push_back(p);
    is_free_[static_cast<std::size_t>(p)] = 1;
  }
  seq.length = length;
  return Status::Ok();
}

Status PagedKVCache::remove_sequence(std::int64_t id) {
  if (Status s = truncate(id, 0); !s) return s;
  seqs_.erase(id);
  return Status::Ok();
}

Status PagedKVCache::length(std::int64_t id, std::int64_t* len) const {
  const Sequence* seq = nullptr;
  if (Status s = find(id, &seq); !s) return s;
  *len = seq->length;
  return Status::Ok();
}

Status PagedKVCache::pages(std::int64_t id, std::vector<std::int32_t>* out) const {
  const Sequence* seq = nullptr;
  if (Status s = find(id, &seq); !s) return s;
  *out = seq->pages;
  return Status::Ok();
}

Status PagedKVCache::append(std::int64_t id, const TensorView& k, const TensorView& v) {
  return append_impl(id, k, v, nullptr);
}

Status PagedKVCache::append(std::int64_t id, const TensorView& k, const TensorView& v, const Rotary& rotary) {
  return append_impl(id, k, v, &rotary);
}

Status PagedKVCache::append_impl(std::int64_t id, const TensorView& k, const TensorView& v, const Rotary* rotary) {
  const Sequence* found = nullptr;
  if (Status s = find(id, &found); !s) return s;
  std::int64_t t = 0;
  if (Status s = check_pair(k, v, hkv_, dk_, dv_, &t); !s) return s;
  Sequence& seq = seqs_[id];
  // (t <= kMaxExtent and a sequence holds at most the pool's 2^31 x 2^31 slots: no overflow)
  const std::int64_t need = (seq.length + t + page_size_ - 1) / page_size_ - static_cast<std::int64_t>(seq.pages.size());
  if (need > free_pages())
    return Status::Invalid("k", "appending " + str(t) + " tokens to sequence " + str(id) + " needs " + str(need) +
                                    " more pages; expected at most the " + str(free_pages()) + " free pages of the pool");
  if (rotary)
    if (Status s = kvcache::check_rotary(*rotary, dk_, found->length, t); !s) return s;
  if (Status s = check_values("k", k, dtype_, rotary, seq.length); !s) return s;
  if (Status s = check_values("v", v, dtype_, nullptr, 0); !s) return s;
  for (std::int64_t n = 0; n < need; ++n) {
    const std::int32_t p = free_.back();
    free_.pop_back();
    is_free_[static_cast<std::size_t>(p)] = 0;
    seq.pages.push_back(p);
  }
  // Copy token by token into (page, slot); a run of tokens within one page is one copy per head.
  std::int64_t done = 0;
  while (done < t) {
    const std::int64_t pos = seq.length + done, slot = pos % page_size_;
    const std::int64_t run = std::min(t - done, page_size_ - slot);
    const std::int64_t page = seq.pages[static_cast<std::size_t>(pos / page_size_)];
    for (std::int64_t h = 0; h < hkv_; ++h) {
      store_rows(k, h, done, run, dtype_, k_, k_scale_, (page * hkv_ + h) * page_size_ + slot, rotary, pos);
      store_rows(v, h, done, run, dtype_, v_, v_scale_, (page * hkv_ + h) * page_size_ + slot);
    }
    done += run;
  }
  seq.length += t;
  return Status::Ok();
}

TensorView PagedKVCache::k_pages() const {
  return rows_view(k_.data(), {dtype_, dk_}, num_pages_, hkv_, page_size_, page_size_);
}
TensorView PagedKVCache::v_pages() const {
  return rows_view(v_.data(), {dtype_, dv_}, num_pages_, hkv_, page_size_, page_size_);
}
TensorView PagedKVCache::k_scale_pages() const {
  return scales_view(k_scale_, {dtype_, dk_}, num_pages_, hkv_, page_size_, page_size_);
}
TensorView PagedKVCache::v_scale_pages() const {
  return scales_view(v_scale_, {dtype_, dv_}, num_pages_, hkv_, page_size_, page_size_);
}

Status PagedKVCache::tables(const std::vector<std::int64_t>& ids, std::vector<std::int32_t>* page_table,
                            std::int64_t* max_pages, std::vector<std::int32_t>* seq_lens) const {
  if (ids.empty()) return Status::Invalid("ids", "empty; expected at least one sequence id");
  std::vector<const Sequence*> seqs;
  std::int64_t widest = 1;
  for (std::size_t b = 0; b < ids.size(); ++b) {
    for (std::size_t c = 0; c < b; ++c)
      if (ids[c] == ids[b])
        return Status::Invalid("ids", "sequence " + str(ids[b]) + " appears twice; expected distinct ids");
    const Sequence* seq = nullptr;
    if (Status s = find(ids[b], &seq); !s) return s;
    if (seq->length > INT32_MAX) return Status::Invalid("ids", "sequence " + str(ids[b]) + " is longer than 2^31 - 1");
    seqs.push_back(seq);
    widest = std::max<std::int64_t>(widest, static_cast<std::int64_t>(seq->pages.size()));
  }
  page_table->assign(ids.size() * static_cast<std::size_t>(widest), -1);
  seq_lens->resize(ids.size());
  for (std::size_t b = 0; b < ids.size(); ++b) {
    std::copy(seqs[b]->pages.begin(), seqs[b]->pages.end(), page_table->begin() + static_cast<std::ptrdiff_t>(b * widest));
    (*seq_lens)[b] = static_cast<std::int32_t>(seqs[b]->length);
  }
  *max_pages = widest;
  return Status::Ok();
}

Status PagedKVCache::attend(const std::vector<std::int64_t>& ids, const TensorView& q, const TensorView& out,
                            const Params& params, const std::optional<TensorView>& lse) const {
  if (num_pages_ == 0) return Status::Invalid("cache", "not created; expected PagedKVCache::create first");
  std::vector<std::int32_t> table, lens;
  std::int64_t width = 0;
  if (Status s = tables(ids, &table, &width, &lens); !s) return s;
  const std::int64_t batch = static_cast<std::int64_t>(ids.size());
  if (Status s = check_decode(q, out, lse, params, batch, "one row per sequence id", hkv_, dk_, dv_); !s) return s;
  const TensorView table_view = TensorView::contiguous(table.data(), DType::i32, {batch, width});
  const TensorView lens_view = TensorView::contiguous(lens.data(), DType::i32, {batch});
  std::vector<unsigned char> mask;  // (a mask as wide as the longest sequence, widened to the table's keys)
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  return as_cache_error(attention_paged(q, k_pages(), v_pages(), table_view, lens_view, out,
                                        with_scales(widen_mask(params, longest, width * page_size_, &mask),
                                                    k_scale_pages(), v_scale_pages()),
                                        lse));
}

}  // namespace attn
