// The validated description of one attention call, shared by every backend.
// Built only by validate(); once it exists, every index a kernel forms is in bounds.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "attn/sdpa.h"
#include "core/dropout.h"
#include "core/hd.h"

namespace attn::core {

enum class MaskKind : std::uint8_t { none, additive, keep };

// The kernel variant a call needs (core/variant.h, cpu/pick.h): its dense-mask kind, or `mods` when it
// transforms scores or drops weights (softcap, ALiBi or dropout; its dense mask, of any kind, then read at run
// time).
enum class VariantKind : std::uint8_t { none, additive, keep, mods };

// A tensor's data pointer with strides expanded to the logical [B, H, S, D] (or [B, Hq, Sq, Skv]
// for a broadcast mask), in elements.
struct Strided {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t stride[4] = {0, 0, 0, 0};
  ATTN_HD std::int64_t offset(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    return a * stride[0] + b * stride[1] + c * stride[2] + d * stride[3];
  }
};

// A paged KV cache: key/value row j of sequence b is row j % page_size of pool page
// table[b * table_stride[0] + (j / page_size) * table_stride[1]]; k/v strides are then
// [page, head, row, dim].
struct Paged {
  const std::int32_t* table = nullptr;
  std::int64_t table_stride[2] = {0, 0};
  std::int64_t page_size = 0;
  std::int64_t pages = 0;  // pool size P
};

struct Problem {
  std::int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, Dk = 0, Dv = 0;
  std::int64_t group = 1;  // Hq / Hkv: query head h reads KV head h / group
  double scale = 1.0;
  Causal causal = Causal::none;
  Window window;
  std::vector<std::int64_t> kv_len;  // [B], always filled (Skv when no key lengths are given)
  MaskKind mask_kind = MaskKind::none;
  Strided q, k, v, mask;
  Strided out;
  std::optional<Paged> paged;  // set by validate_paged(): K/V come from a page pool
  std::optional<Strided> lse;  // [B, Hq, Sq] in stride[0..2]
  // i8 K/V: the f32 scale of each row (attn::Params::k_scale / v_scale), strides [batch or page, head, row, 0]
  // like k and v's own first three (kv_scale() reads them, through the page table when paged).
  std::optional<Strided> k_scale, v_scale;
  // Score variants (attn::Params): softcap (0 = off), ALiBi slopes (stride[0] over the batch, 0 for [Hq];
  // stride[1] over heads) and sinks (stride[1] over heads; natural-log units).
  float softcap = 0;
  std::optional<Strided> alibi;
  std::optional<Strided> sinks;
  Dropout dropout;  // attn::Params::dropout_p (core/dropout.h); applied by the `mods` variant
  bool stats_from_forward = false;  // the backward's row statistics (Params::backward_statistics == from_forward)
  // The batch's key length (kv_len[b]). Problem's accessors here (key_len, alibi_slope, sink) are what the shared
  // hooks (core/mask.h key_range, core/variant.h) read, so that a device kernel's plain-pointer copy of a problem
  // offering the same names runs the same hooks.
  std::int64_t key_len(std::int64_t b) const { return kv_len[static_cast<std::size_t>(b)]; }
  float alibi_slope(std::int64_t b, std::int64_t h) const {
    return alibi ? static_cast<const float*>(alibi->data)[b * alibi->stride[0] + h * alibi->stride[1]] : 0.0f;
  }
  // The head's sink logit, -inf without sinks.
  float sink(std::int64_t h) const {
    return sinks ? static_cast<const float*>(sinks->data)[h * sinks->stride[1]]
                 : -std::numeric_limits<float>::infinity();
  }
  int threads = 0;
  Backend backend = Backend::automatic;
  Workspace* workspace = nullptr;  // the caller's, to keep scratch in between calls (or null)
  // Where every tensor lives (validate checks they agree) and, on CUDA, the caller's stream (Params::stream).
  // On CUDA the data pointers (q, k, v, mask, out, lse, scales, variants, paged.table) are device pointers;
  // kv_len is always a host copy.
  Device device;
  void* stream = nullptr;
};

inline VariantKind variant_kind(const Problem& p) {
  if (p.softcap > 0 || p.alibi || p.dropout.on()) return VariantKind::mods;
  switch (p.mask_kind) {
    case MaskKind::additive: return VariantKind::additive;
    case MaskKind::keep: return VariantKind::keep;
    default: return VariantKind::none;
  }
}

// Element offset of row j of K or V (tensor t) for batch b and KV head hk: strided, or through the page table.
inline std::int64_t kv_row_offset(const Problem& p, const Strided& t, std::int64_t b, std::int64_t hk, std::int64_t j) {
  if (!p.paged) return t.offset(b, hk, j, 0);
  const Paged& pg = *p.paged;
  const std::int64_t page = pg.table[b * pg.table_stride[0] + (j / pg.page_size) * pg.table_stride[1]];
  return t.offset(page, hk, j % pg.page_size, 0);
}

// The scale of row j of K or V for batch b and KV head hk (scale: Problem::k_scale or v_scale).
inline float kv_scale(const Problem& p, const Strided& scale, std::int64_t b, std::int64_t hk, std::int64_t j) {
  return static_cast<const float*>(scale.data)[kv_row_offset(p, scale, b, hk, j)];
}

// Checks every argument; on success fills *problem. Writes nothing anywhere else. Throws nothing: an allocation
// that fails is an OutOfMemory status (as for validate_paged and validate_backward).
Status validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                const Params& params, const std::optional<TensorView>& lse, Problem* problem);

// The same for attention over a paged KV cache (see attn::attention_paged).
// Runs a validated problem: the reference, the CUDA backend or the CPU's flash kernels, as attention() does after
// its validation (src/core/sdpa.cc). Callers inside the library may set p.out.dtype = f32 for a bf16/f16 problem
// (f32 rows, merged before they are rounded: core/cascade.cc) on the CPU.
Status run_forward(const Problem& p);

Status validate_paged(const TensorView& q, const TensorView& k_pages, const TensorView& v_pages,
                      const TensorView& page_table, const TensorView& seq_lens, const TensorView& out,
                      const Params& params, const std::optional<TensorView>& lse, Problem* problem);

}  // namespace attn::core
