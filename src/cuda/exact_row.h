// attn's exact CUDA forward: every problem the tensor-core kernel does not take (fp32 Q/K/V, 8- and 4-bit K/V, head dims
// above 256), computed in fp32 as the CPU's scalar path computes it, one thread per query row and chunk of
// kChunk output dimensions. Host and device code: src/cuda/forward.cu launches exact_kernel over it, and
// tests/test_cuda_forward.cc runs the same function over every row on the host against the fp64 reference.
//
// A thread walks its row's keys in order (core::key_range: causal, window, key length), scores each with an fp32
// dot product (the key's 8-bit scale applied to the product), passes the score through the variant's hooks
// (core/variant.h: dense masks, softcap, ALiBi) into the one online-softmax state (core::OnlineSoftmax), weights
// V's row by the dropout factor (core::Dropout, the CPU's Philox counters) and the value's 8-bit scale, and
// finishes with the sink (core::finish_with_sink). Its chunk's accumulators stay in registers; the threads of a
// row's other chunks recompute the same scores (the same arithmetic, so the same weights). This is the path
// that makes every configuration correct on the GPU; speed is the tensor-core kernel's and cuDNN's business.
#pragma once

#include <cstdint>

#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/q4.h"
#include "core/variant.h"
#include "cuda/device_problem.h"
#include "cuda/elem.h"

namespace attn::cuda::exact {

using i64 = std::int64_t;

inline constexpr int kChunk = 16;   // output dimensions a thread accumulates (registers)
inline constexpr int kThreads = 128;  // threads per block of exact_kernel

// Element `off` of a view as float: f32, bf16, f16, or a quantised value before its scale (i8; i4: the nibble of
// element `off` less 8, attn/tensor.h's packing).
ATTN_HD float load(const core::Strided& t, i64 off) {
  switch (t.dtype) {
    case DType::f32: return static_cast<const float*>(t.data)[off];
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(t.data)[off]);
    case DType::f16: return f16_to_float(static_cast<const std::uint16_t*>(t.data)[off]);
    case DType::i4: return static_cast<float>(core::q4_at(t.data, off));
    default: return static_cast<float>(static_cast<const std::int8_t*>(t.data)[off]);
  }
}

// The factor of value d of a quantised row whose scales start at `scales`: i4's block scale (scale stride
// `stride`), 1 otherwise (i8's row scale multiplies the whole product instead).
ATTN_HD float block_scale(bool i4, const float* scales, i64 stride, i64 d) {
  return i4 ? scales[(d / kI4Block) * stride] : 1.0f;
}

ATTN_HD void store(const core::Strided& t, i64 off, float x) {
  void* out = const_cast<void*>(t.data);
  if (t.dtype == DType::f32) {
    static_cast<float*>(out)[off] = x;
  } else {
    static_cast<std::uint16_t*>(out)[off] = t.dtype == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
  }
}

// Output chunks per row (at least one: the thread of chunk 0 writes the LSE).
ATTN_HD i64 chunks(i64 Dv) { return Dv > kChunk ? (Dv + kChunk - 1) / kChunk : 1; }

// Query row i of (b, h), output dimensions [c·kChunk, min((c + 1)·kChunk, Dv)), and for c = 0 the row's LSE.
template <class V>
ATTN_HD void exact_row(const DeviceProblem& p, i64 b, i64 h, i64 i, i64 c) {
  const i64 hk = h / p.group;
  const i64 d0 = c * kChunk;
  const i64 nd = p.Dv - d0 < kChunk ? p.Dv - d0 : kChunk;
  const typename V::Row row = V::row(p, b, h, i);
  const core::KeyRange keys = core::key_range(p, b, i);
  const float scale = static_cast<float>(p.scale);
  const float c2 = static_cast<float>(core::kLog2e);  // scores in natural-log units
  const bool i4 = p.k.dtype == DType::i4, i8 = p.k_scale.data != nullptr && !i4;
  const i64 q0 = p.q.offset(b, h, i, 0);
  core::RowState st;
  float acc[kChunk];
ATTN_UNROLL
  for (int u = 0; u < kChunk; ++u) acc[u] = 0.0f;
  for (i64 j = keys.lo; j < keys.hi; ++j) {
    if (V::kPerElement && row.hidden(j)) continue;
    const i64 k0 = p.kv_row_offset(p.k, b, hk, j);
    const float* ks = i4 ? static_cast<const float*>(p.k_scale.data) + p.kv_row_offset(p.k_scale, b, hk, j) : nullptr;
    float dot = 0.0f;
    for (i64 d = 0; d < p.Dk; ++d)
      dot += load(p.q, q0 + d * p.q.stride[3]) * (load(p.k, k0 + d * p.k.stride[3]) * block_scale(i4, ks, p.k_scale.stride[3], d));
    if (i8) dot *= static_cast<const float*>(p.k_scale.data)[p.kv_row_offset(p.k_scale, b, hk, j)];
    const float x = scale * dot;
    const float s = V::kPerElement ? row.logit(j, x) : x;
    if (s == core::kNegInf) continue;  // a key with no weight (IEEE: a NaN score is kept and poisons the row)
    const float alpha = st.advance(s, c2);
ATTN_UNROLL
    for (int u = 0; u < kChunk; ++u) acc[u] *= alpha;
    const float e = core::RowState::weight(s, st.origin(), c2);
    st.add(e);
    float w = e;
    if (V::kDropout && p.dropout.on()) w *= p.dropout.factor(b, h, i, j);
    if (i8) w *= static_cast<const float*>(p.v_scale.data)[p.kv_row_offset(p.v_scale, b, hk, j)];
    const i64 v0 = p.kv_row_offset(p.v, b, hk, j) + d0 * p.v.stride[3];
    const float* vs = i4 ? static_cast<const float*>(p.v_scale.data) + p.kv_row_offset(p.v_scale, b, hk, j) : nullptr;
ATTN_UNROLL
    for (int u = 0; u < kChunk; ++u)
      if (u < nd) acc[u] += w * (load(p.v, v0 + u * p.v.stride[3]) * block_scale(i4, vs, p.v_scale.stride[3], d0 + u));
  }
  const core::Finish f = core::finish_with_sink(st.m, st.l, 1.0, p.sink(h));
ATTN_UNROLL
  for (int u = 0; u < kChunk; ++u)
    if (u < nd) store(p.out, p.out.offset(b, h, i, d0 + u), core::finish_output(acc[u], st.l, f.factor));
  if (c == 0 && p.lse.data != nullptr) static_cast<float*>(const_cast<void*>(p.lse.data))[p.lse.offset(b, h, i, 0)] = f.lse;
}

// Thread t of the launch: (b, h, i, c) with c fastest.
template <class V>
ATTN_HD void exact_thread(const DeviceProblem& p, i64 t) {
  const i64 nc = chunks(p.Dv);
  const i64 c = t % nc, row = t / nc;
  const i64 i = row % p.Sq, h = (row / p.Sq) % p.Hq, b = row / (p.Sq * p.Hq);
  exact_row<V>(p, b, h, i, c);
}

// Threads of the launch.
ATTN_HD i64 threads(const DeviceProblem& p) { return p.B * p.Hq * p.Sq * chunks(p.Dv); }

}  // namespace attn::cuda::exact
