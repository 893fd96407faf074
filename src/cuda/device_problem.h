// A validated problem as device code reads it: sizes, plain views and device pointers, copied by value into a
// kernel's parameters (core::Problem holds a std::vector and std::optionals, which device code cannot use).
// It offers the members the shared host-device code reads (core/mask.h key_range, core/variant.h's hooks,
// core/dropout.h), under the same names as core::Problem: key_len(b), alibi_slope(b, h), sink(h), mask,
// mask_kind, softcap, Sq, causal, window, dropout. So the CUDA kernels run the CPU kernels' definitions of the
// masks, the score variants, the dropout counters and the online softmax, not copies of them.
//
// Plain C++ (no CUDA type): the host tests build one over host memory and run the kernels' per-warp code through
// the host model of a warp (cuda/warp.h).
#pragma once

#include <cstdint>
#include <limits>

#include "core/dropout.h"
#include "core/hd.h"
#include "core/problem.h"

namespace attn::cuda {

struct DeviceProblem {
  std::int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, Dk = 0, Dv = 0, group = 1;
  double scale = 1.0;
  Causal causal = Causal::none;
  Window window;
  const std::int64_t* kv_len = nullptr;  // [B] key lengths (device memory on the device); null: every batch has Skv
  core::MaskKind mask_kind = core::MaskKind::none;
  core::Strided q, k, v, mask, out;
  core::Strided lse;               // data null: no LSE output
  core::Strided k_scale, v_scale;  // data null: K/V not 8-bit
  core::Strided alibi, sinks;      // data null: none (strides as core::Problem's)
  core::Paged paged;               // table null: not paged (else a device pointer)
  float softcap = 0;
  core::Dropout dropout;
  bool stats_from_forward = false;
  // Whether Q's rows, and K's and V's, may be copied to shared memory in 16-byte pieces (cp.async): 16-bit
  // elements, unit column stride, head dims and every other stride multiples of 8 elements, a 16-byte-aligned
  // base (rows_copy16). Else the kernels copy element by element.
  bool vec_q = false, vec_kv = false;
  // Split-KV (splits > 1): blockIdx.y is the part of the keys a block attends (sched::split_tiles); each part
  // writes its rows' normalised output and LSE, without the sink, to part_o [splits, B, Hq, Sq, Dv] and part_lse
  // [splits, B, Hq, Sq] (f32, contiguous, device memory), and the combine step (cuda/forward_block.h
  // combine_split) merges them into out and lse.
  std::int64_t splits = 1;
  float* part_o = nullptr;
  float* part_lse = nullptr;
  ATTN_HD std::int64_t part_row(std::int64_t s, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return ((s * B + b) * Hq + h) * Sq + i;
  }

  ATTN_HD std::int64_t key_len(std::int64_t b) const { return kv_len ? kv_len[b] : Skv; }
  ATTN_HD float alibi_slope(std::int64_t b, std::int64_t h) const {
    return alibi.data ? static_cast<const float*>(alibi.data)[b * alibi.stride[0] + h * alibi.stride[1]] : 0.0f;
  }
  ATTN_HD float sink(std::int64_t h) const {
    return sinks.data ? static_cast<const float*>(sinks.data)[h * sinks.stride[1]]
                      : -std::numeric_limits<float>::infinity();
  }
  ATTN_HD bool is_paged() const { return paged.table != nullptr; }
  // Element offset of row j of K or V (t: k, v, k_scale or v_scale) for batch b and KV head hk: strided, or
  // through the page table (core::kv_row_offset's definition).
  ATTN_HD std::int64_t kv_row_offset(const core::Strided& t, std::int64_t b, std::int64_t hk, std::int64_t j) const {
    if (!is_paged()) return t.offset(b, hk, j, 0);
    const std::int64_t page = paged.table[b * paged.table_stride[0] + (j / paged.page_size) * paged.table_stride[1]];
    return t.offset(page, hk, j % paged.page_size, 0);
  }
};

// Whether every row [0, d) of a 16-bit tensor view starts 16 bytes aligned and is contiguous, in whole 16-byte
// chunks: what a copy of the rows in 16-byte pieces needs.
inline bool rows_copy16(const core::Strided& t, std::int64_t d) {
  const bool strides = t.stride[0] % 8 == 0 && t.stride[1] % 8 == 0 && t.stride[2] % 8 == 0;
  return dtype_size(t.dtype) == 2 && t.stride[3] == 1 && d % 8 == 0 && strides &&
         reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0;
}

// The device view of p, with kv_len pointing at a copy of p.kv_len (in device memory for a kernel, in host memory
// for the host model; null where every length is Skv).
inline DeviceProblem device_problem(const core::Problem& p, const std::int64_t* kv_len) {
  DeviceProblem d;
  d.B = p.B, d.Hq = p.Hq, d.Hkv = p.Hkv, d.Sq = p.Sq, d.Skv = p.Skv, d.Dk = p.Dk, d.Dv = p.Dv, d.group = p.group;
  d.scale = p.scale, d.causal = p.causal, d.window = p.window, d.kv_len = kv_len, d.mask_kind = p.mask_kind;
  d.q = p.q, d.k = p.k, d.v = p.v, d.mask = p.mask, d.out = p.out;
  if (p.lse) d.lse = *p.lse;
  if (p.k_scale) d.k_scale = *p.k_scale, d.v_scale = *p.v_scale;
  if (p.alibi) d.alibi = *p.alibi;
  if (p.sinks) d.sinks = *p.sinks;
  if (p.paged) d.paged = *p.paged;
  d.softcap = p.softcap, d.dropout = p.dropout, d.stats_from_forward = p.stats_from_forward;
  d.vec_q = rows_copy16(p.q, p.Dk);
  d.vec_kv = rows_copy16(p.k, p.Dk) && rows_copy16(p.v, p.Dv);
  return d;
}

}  // namespace attn::cuda
