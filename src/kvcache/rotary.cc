// attn/rotary.h: rotary position embedding, for the KV caches' appends and the decode step's queries.
#include "attn/rotary.h"

#include <string>
#include <utility>
#include <vector>

#include "core/views.h"
#include "kvcache/rotary_row.h"

namespace attn {
namespace {
std::string str(std::int64_t v) { return std::to_string(v); }
}  // namespace

namespace kvcache {

Status check_rotary(const Rotary& r, std::int64_t head_dim, std::int64_t position0, std::int64_t tokens) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"rotary.cos", &r.cos}, {"rotary.sin", &r.sin}}) {
    if (Status s = core::check_view(name, *t, 2); !s) return s;
    if (t->dtype != DType::f32) return Status::Invalid(name, std::string("of dtype ") + dtype_name(t->dtype) + "; expected f32");
    if (t->device.is_cuda()) return Status::Invalid(name, "on " + device_name(t->device) + "; expected host memory");
  }
  if (r.sin.shape[0] != r.cos.shape[0] || r.sin.shape[1] != r.cos.shape[1])
    return Status::Invalid("rotary.sin", "shape [" + str(r.sin.shape[0]) + ", " + str(r.sin.shape[1]) + "]; expected rotary.cos's [" +
                                             str(r.cos.shape[0]) + ", " + str(r.cos.shape[1]) + "]");
  if (r.cos.shape[1] < 1 || 2 * r.cos.shape[1] > head_dim)
    return Status::Invalid("rotary.cos", "rotary_dim " + str(2 * r.cos.shape[1]) + " (2 x its columns); expected 2 .. the head dim " +
                                             str(head_dim));
  if (position0 < 0) return Status::Invalid("position0", str(position0) + "; expected >= 0");
  if (position0 + tokens > r.cos.shape[0])
    return Status::Invalid("rotary.cos", str(r.cos.shape[0]) + " positions; expected at least " + str(position0 + tokens) +
                                             " (the last token turned is at position " + str(position0 + tokens - 1) + ")");
  return Status::Ok();
}

void rotate_row(float* x, const Rotary& r, std::int64_t position) {
  const std::int64_t half = r.cos.shape[1];
  const auto* c = static_cast<const float*>(r.cos.data) + position * r.cos.strides[0];
  const auto* s = static_cast<const float*>(r.sin.data) + position * r.sin.strides[0];
  for (std::int64_t i = 0; i < half; ++i) {
    const std::int64_t a = r.interleaved ? 2 * i : i, b = r.interleaved ? 2 * i + 1 : i + half;
    const float ci = c[i * r.cos.strides[1]], si = s[i * r.sin.strides[1]];
    const float xa = x[a], xb = x[b];
    x[a] = xa * ci - xb * si;
    x[b] = xa * si + xb * ci;
  }
}

}  // namespace kvcache

Status apply_rotary(const TensorView& x, const Rotary& rotary, std::int64_t position0) {
  if (Status s = core::check_view("x", x, 4); !s) return s;
  if (x.dtype != DType::f32 && x.dtype != DType::bf16 && x.dtype != DType::f16)
    return Status::Invalid("x", std::string("of dtype ") + dtype_name(x.dtype) + "; expected f32, bf16 or f16");
  if (x.device.is_cuda()) return Status::Invalid("x", "on " + device_name(x.device) + "; expected host memory");
  if (Status s = core::check_output_strides("x", x); !s) return s;
  if (Status s = kvcache::check_rotary(rotary, x.shape[3], position0, x.shape[2]); !s) return s;
  std::vector<float> row(static_cast<std::size_t>(x.shape[3]));
  for (std::int64_t b = 0; b < x.shape[0]; ++b)
    for (std::int64_t h = 0; h < x.shape[1]; ++h)
      for (std::int64_t t = 0; t < x.shape[2]; ++t) {
        const std::int64_t at = b * x.strides[0] + h * x.strides[1] + t * x.strides[2];
        for (std::int64_t d = 0; d < x.shape[3]; ++d) row[d] = core::float_at(x, at + d * x.strides[3]);
        kvcache::rotate_row(row.data(), rotary, position0 + t);
        for (std::int64_t d = 0; d < x.shape[3]; ++d) core::store_float(x, at + d * x.strides[3], row[d]);
      }
  return Status::Ok();
}

}  // namespace attn
