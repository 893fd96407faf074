// The cost model: closed-form counts, no measurement.
#include "attn/cost.h"
#include "attn/tensor.h"

#include <limits>

#include <cmath>
#include <string>

namespace attn {
namespace {

Status positive(const char* name, std::int64_t value, const char* meaning) {
  if (value <= 0)
    return Status::Invalid(name, std::to_string(value) + "; expected " + meaning + " >= 1");
  return Status::Ok();
}

// Fills the 0 defaults and checks divisibility; shared by attention_cost and parameter_count.
Status resolve_heads(std::int64_t d_model, std::int64_t heads, std::int64_t* kv_heads, std::int64_t* head_dim,
                     std::int64_t* v_head_dim) {
  if (Status s = positive("d_model", d_model, "a model width"); !s) return s;
  if (Status s = positive("heads", heads, "a query head count"); !s) return s;
  if (*kv_heads == 0) *kv_heads = heads;
  if (*kv_heads < 0 || heads % *kv_heads != 0)
    return Status::Invalid("kv_heads", std::to_string(*kv_heads) + "; expected a divisor of heads = " +
                                           std::to_string(heads) + " (MHA: heads, GQA: between, MQA: 1)");
  if (*head_dim == 0) {
    if (d_model % heads != 0)
      return Status::Invalid("head_dim", "not given and d_model = " + std::to_string(d_model) +
                                             " is not a multiple of heads = " + std::to_string(heads) +
                                             "; expected an explicit head dim");
    *head_dim = d_model / heads;
  }
  if (Status s = positive("head_dim", *head_dim, "a head dim"); !s) return s;
  if (*v_head_dim == 0) *v_head_dim = *head_dim;
  return positive("v_head_dim", *v_head_dim, "a value head dim");
}

}  // namespace

Status attention_cost(const AttentionShape& in, AttentionCost* cost) {
  AttentionShape s = in;
  if (Status st = positive("batch", s.batch, "a batch size"); !st) return st;
  if (Status st = positive("seq", s.seq, "a sequence length"); !st) return st;
  if (Status st = resolve_heads(s.d_model, s.heads, &s.kv_heads, &s.head_dim, &s.v_head_dim); !st) return st;
  if (Status st = positive("bytes_per_element", s.bytes_per_element, "a byte count"); !st) return st;

  const double B = s.batch, N = s.seq, d = s.d_model, hq = s.heads, hkv = s.kv_heads, dk = s.head_dim,
               dv = s.v_head_dim, e = s.bytes_per_element;
  const double pairs = s.causal ? N * (N + 1) / 2 : N * N;  // query-key pairs per head
  const double qkv_width = hq * dk + hkv * dk + hkv * dv;     // output columns of the three projections

  AttentionCost c;
  c.shape = s;
  const double qkv_macs = B * N * d * qkv_width;
  c.stages.push_back({"QKV projections", 2 * qkv_macs, qkv_macs, e * (B * N * d + d * qkv_width + B * N * qkv_width)});
  const double qk_macs = B * hq * pairs * dk;
  c.stages.push_back({"Q K^T", 2 * qk_macs, qk_macs, e * (B * N * hq * dk + B * N * hkv * dk + B * hq * pairs)});
  const double scores = B * hq * pairs;
  c.stages.push_back({"softmax", 5 * scores, scores, e * 2 * scores});
  const double av_macs = B * hq * pairs * dv;
  c.stages.push_back({"A V", 2 * av_macs, av_macs, e * (B * hq * pairs + B * N * hkv * dv + B * N * hq * dv)});
  const double o_macs = B * N * hq * dv * d;
  c.stages.push_back({"output projection", 2 * o_macs, o_macs, e * (B * N * hq * dv + hq * dv * d + B * N * d)});

  double best = -1;
  for (const StageCost& st : c.stages) {
    c.total_flops += st.flops;
    c.total_seed_ops += st.seed_ops;
    c.total_bytes += st.bytes;
    if (st.flops > best) best = st.flops, c.dominant = st.name;
  }
  c.fused_attention_bytes = e * B * N * (hq * dk + hkv * dk + hkv * dv + hq * dv);

  // Attention matmuls: hq·(dk+dv)·pairs(N) per batch; projections: N·d·(qkv_width + hq·dv).
  // Without a mask pairs = N², so N* = d·(qkv_width + hq·dv) / (hq·(dk+dv));
  // causal: pairs = N(N+1)/2, so (N*+1)/2 = that ratio.
  const double ratio = d * (qkv_width + hq * dv) / (hq * (dk + dv));
  c.crossover_seq = s.causal ? 2 * ratio - 1 : ratio;
  *cost = c;
  return Status::Ok();
}

Status parameter_count(const ParamShape& in, std::int64_t* count) {
  ParamShape s = in;
  if (Status st = resolve_heads(s.d_model, s.heads, &s.kv_heads, &s.head_dim, &s.v_head_dim); !st) return st;
  // Every product and sum checked: the count must fit the int64 it is returned in (in 128 bits, d_model times a
  // width that itself passed int64 overflowed them too: d_model = 2^63 - 1 with one head gave 4).
  bool overflow = false;
  const auto mul = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  const auto add = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    overflow |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const std::int64_t d = s.d_model, hq = s.heads, hkv = s.kv_heads, dk = s.head_dim, dv = s.v_head_dim;
  const std::int64_t qkv_width = add(add(mul(hq, dk), mul(hkv, dk)), mul(hkv, dv));
  std::int64_t n = add(mul(d, qkv_width), mul(mul(hq, dv), d));
  if (s.bias) n = add(n, add(qkv_width, d));
  if (overflow)
    return Status::Invalid("d_model", "with these heads and head dims the layer has more than 2^63 - 1 parameters; "
                                      "expected a count that fits in 64 bits");
  *count = static_cast<std::int64_t>(n);
  return Status::Ok();
}

double kv_dtype_bytes(KvDType dtype) {
  switch (dtype) {
    case KvDType::f32: return 4;
    case KvDType::f16:
    case KvDType::bf16: return 2;
    case KvDType::fp8:
    case KvDType::int8: return 1;
    case KvDType::int4: return 0.5;
  }
  return 0;
}

Status kv_cache_bytes(const KvCacheShape& s, double* bytes) {
  if (Status st = positive("layers", s.layers, "a layer count"); !st) return st;
  if (Status st = positive("kv_heads", s.kv_heads, "a KV head count"); !st) return st;
  if (Status st = positive("head_dim", s.head_dim, "a head dim"); !st) return st;
  if (Status st = positive("seq", s.seq, "a sequence length"); !st) return st;
  if (Status st = positive("batch", s.batch, "a batch size"); !st) return st;
  const double d = static_cast<double>(s.head_dim);
  const double row_bytes = s.dtype == KvDType::int4 ? std::ceil(d / 2) + 4 * std::ceil(d / kI4Block)  // + block scales
                                                    : d * kv_dtype_bytes(s.dtype) +
                                                          (s.dtype == KvDType::int8 ? 4.0 : 0.0);  // + the row's scale
  // (in long double, rounded to double once: a chain of double products was an ulp off past 2^53, e.g. 5.6e37 bytes
  // printed as 5.600000000000001e+37)
  *bytes = static_cast<double>(2.0L * static_cast<long double>(s.layers) * static_cast<long double>(s.kv_heads) *
                               static_cast<long double>(s.seq) * static_cast<long double>(s.batch) *
                               static_cast<long double>(row_bytes));
  return Status::Ok();
}

}  // namespace attn
