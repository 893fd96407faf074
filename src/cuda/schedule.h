// The index arithmetic of a FlashAttention-2 forward on the GPU, host and device alike (every function is
// ATTN_HD and has no state): the grid's block -> (batch, query head, query block) map, the GQA head map, the
// allowed key interval of a query row (causal top-left / bottom-right, sliding window, per-batch key length),
// the key tiles a query block visits and which of them need per-element masking, and paged K/V addresses.
//
// These are the CPU's definitions restated for the device: core/mask.h's key_range and core/problem.h's
// kv_row_offset. tests/test_cuda_schedule.cc checks that they agree on many random shapes, and the tile ranges
// against brute force.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace attn::cuda::sched {

using i64 = std::int64_t;

// attn::Causal and attn::Align by value (the device code does not include the public headers; the test checks
// that the values agree).
enum class CausalMode : std::uint8_t { none, top_left, bottom_right };

// The masks of one call, as plain values.
struct Masks {
  i64 Sq = 0;                                   // query rows
  CausalMode causal = CausalMode::none;
  i64 window_left = -1, window_right = -1;      // -1: unbounded on that side; both -1: no window
  bool window_bottom_right = true;              // Window::align == Align::bottom_right
};

ATTN_HD constexpr i64 min64(i64 a, i64 b) { return a < b ? a : b; }
ATTN_HD constexpr i64 max64(i64 a, i64 b) { return a > b ? a : b; }
ATTN_HD constexpr i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// ---- the grid ------------------------------------------------------------------------------------------

// A thread block's work: query rows [qblock·block_m, +block_m) of query head h of batch b.
struct BlockWork {
  i64 b = 0, h = 0, qblock = 0;
};
// Blocks of one (batch, head) are consecutive, query blocks fastest: the blocks that read the same K/V rows
// run together (and, for GQA, the `group` query heads of one KV head follow each other).
ATTN_HD constexpr i64 query_blocks(i64 Sq, i64 block_m) { return ceil_div(Sq, block_m); }
ATTN_HD constexpr i64 grid_blocks(i64 B, i64 Hq, i64 Sq, i64 block_m) { return B * Hq * query_blocks(Sq, block_m); }
ATTN_HD constexpr BlockWork block_work(i64 linear, i64 Hq, i64 Sq, i64 block_m) {
  const i64 nq = query_blocks(Sq, block_m);
  return {linear / (Hq * nq), (linear / nq) % Hq, linear % nq};
}
ATTN_HD constexpr i64 block_linear(BlockWork w, i64 Hq, i64 Sq, i64 block_m) {
  return (w.b * Hq + w.h) * query_blocks(Sq, block_m) + w.qblock;
}

// GQA / MQA: query head h reads KV head h / group (group = Hq / Hkv).
ATTN_HD constexpr i64 kv_head(i64 h, i64 group) { return h / group; }

// ---- GQA packing: the query heads of a KV head in one block ---------------------------------------------------
// The forward kernel's blocks take rows of a KV head's packed sequence: its `group` query heads one after the
// other, each head's Sq rows padded to Sr rows. Sr = Sq when Sq < block_m, so that the heads of a decode step
// (or of a few speculative tokens) share one block and each K/V tile is read once for the whole group; else Sr
// is Sq rounded up to block_m, so that a block never straddles two heads (a prefill's blocks are then the
// per-head blocks above, in the same order).
ATTN_HD constexpr i64 packed_rows_per_head(i64 Sq, i64 block_m) { return Sq < block_m ? Sq : ceil_div(Sq, block_m) * block_m; }
ATTN_HD constexpr i64 packed_row_blocks(i64 group, i64 Sq, i64 block_m) {
  return ceil_div(group * packed_rows_per_head(Sq, block_m), block_m);
}
ATTN_HD constexpr i64 packed_grid_blocks(i64 B, i64 Hkv, i64 group, i64 Sq, i64 block_m) {
  return B * Hkv * packed_row_blocks(group, Sq, block_m);
}
// A block's work: packed rows [rblock·block_m, +block_m) of KV head hk of batch b.
struct PackedWork {
  i64 b = 0, hk = 0, rblock = 0;
};
ATTN_HD constexpr PackedWork packed_work(i64 linear, i64 Hkv, i64 group, i64 Sq, i64 block_m) {
  const i64 nr = packed_row_blocks(group, Sq, block_m);
  return {linear / (Hkv * nr), (linear / nr) % Hkv, linear % nr};
}
// Packed row r of KV head hk: query head h, query row i, and whether it is a real row (not padding).
struct PackedRow {
  i64 h = 0, i = 0;
  bool valid = false;
};
ATTN_HD constexpr PackedRow packed_row(i64 r, i64 hk, i64 group, i64 Sq, i64 Sr) {
  const i64 local = r / Sr, i = r % Sr;
  return {hk * group + local, i, local < group && i < Sq};
}

// ---- the allowed keys of a row -------------------------------------------------------------------------

struct KeyInterval {
  i64 lo = 0, hi = 0;  // keys j with lo <= j < hi (empty when hi <= lo)
};

// The keys query row i may attend with `len` keys in its batch: the intersection of the key length, the causal
// mask and the window. Both ends are non-decreasing in i (core/mask.h's key_range, the same definition).
ATTN_HD constexpr KeyInterval key_interval(const Masks& m, i64 len, i64 i) {
  KeyInterval r{0, len};
  if (m.causal != CausalMode::none) {
    const i64 diag = i + (m.causal == CausalMode::bottom_right ? len - m.Sq : 0);
    r.hi = min64(r.hi, diag + 1);
  }
  if (m.window_left >= 0 || m.window_right >= 0) {
    const i64 diag = i + (m.window_bottom_right ? len - m.Sq : 0);
    if (m.window_left >= 0) r.lo = max64(r.lo, diag - m.window_left);
    if (m.window_right >= 0) r.hi = min64(r.hi, diag + m.window_right + 1);
  }
  r.lo = min64(max64(r.lo, i64{0}), len);
  r.hi = max64(r.hi, r.lo);
  return r;
}

// ---- the key tiles of a query block ----------------------------------------------------------------------

// The key tiles (keys [t·block_n, (t+1)·block_n)) a block of query rows visits: tiles [first, end), of which
// [full_first, full_end) are allowed whole for every row of the block and need no per-element mask; the others
// (at most the ends of the range) are masked element by element. first <= full_first <= full_end <= end; an
// empty block has first == end.
struct TileRange {
  i64 first = 0, end = 0, full_first = 0, full_end = 0;
  ATTN_HD constexpr i64 count() const { return end - first; }
  ATTN_HD constexpr bool masked(i64 t) const { return t < full_first || t >= full_end; }
};

// Rows [q0, q1) (clipped to Sq: the last block of a ragged Sq is short) with `len` keys. Because both ends of
// key_interval are non-decreasing in the row, the first row bounds the union from below and the allowed-whole
// tiles from above, the last row the other way round.
ATTN_HD constexpr TileRange key_tiles(const Masks& m, i64 len, i64 q0, i64 q1, i64 block_n) {
  q1 = min64(q1, m.Sq);
  TileRange t;
  if (q1 <= q0) return t;
  const KeyInterval first = key_interval(m, len, q0), last = key_interval(m, len, q1 - 1);
  const i64 lo = first.lo, hi = last.hi;
  if (hi <= lo) {
    t.first = t.end = t.full_first = t.full_end = lo / block_n;
    return t;
  }
  t.first = lo / block_n;
  t.end = ceil_div(hi, block_n);
  // Allowed whole for every row: from the last row's lo (the largest) to the first row's hi (the smallest).
  t.full_first = min64(max64(ceil_div(last.lo, block_n), t.first), t.end);
  t.full_end = max64(min64(first.hi / block_n, t.end), t.full_first);
  return t;
}

// ---- split-KV ---------------------------------------------------------------------------------------------

// Part s of `splits` contiguous parts of a block's key tiles (split-KV: each part is its own block, and the
// parts' results are merged afterwards): per = ceil(count / splits) tiles each, the last ones possibly short or
// empty. full_first/full_end stay the whole range's, so masked() answers as before.
ATTN_HD constexpr TileRange split_tiles(TileRange t, i64 s, i64 splits) {
  if (splits <= 1) return t;
  const i64 per = ceil_div(t.count(), splits);
  TileRange r = t;
  r.first = min64(t.end, t.first + s * per);
  r.end = min64(t.end, r.first + per);
  return r;
}

// How many parts to split the keys into when the grid alone leaves the GPU idle: `blocks` blocks, `slots` the
// blocks the whole GPU holds at once, `key_tiles` the most key tiles a block visits. Enough parts for about two
// full waves, each part at least `min_tiles` tiles, at most `max_splits`; 1 (no split) when the grid fills the
// GPU already.
ATTN_HD constexpr i64 kv_splits(i64 blocks, i64 key_tiles, i64 slots, i64 min_tiles = 4, i64 max_splits = 128) {
  if (blocks <= 0 || blocks >= slots) return 1;
  const i64 want = ceil_div(2 * slots, blocks);
  const i64 can = max64(key_tiles / min_tiles, 1);
  return max64(min64(min64(want, can), max_splits), 1);
}

// Whether key j is allowed for row i (the per-element mask of a masked tile).
ATTN_HD constexpr bool key_allowed(const Masks& m, i64 len, i64 i, i64 j) {
  const KeyInterval r = key_interval(m, len, i);
  return j >= r.lo && j < r.hi;
}

// ---- paged K/V ---------------------------------------------------------------------------------------------

// Row j of sequence b in a paged cache: row `slot` of pool page `page`, the page read from the page table
// (table[b·table_stride0 + (j / page_size)·table_stride1]).
struct PagedRow {
  i64 page = 0, slot = 0;
};
ATTN_HD constexpr PagedRow paged_row(const std::int32_t* table, i64 table_stride0, i64 table_stride1,
                                     i64 page_size, i64 b, i64 j) {
  return {table[b * table_stride0 + (j / page_size) * table_stride1], j % page_size};
}

// The element offset of row j of K or V (strides [batch or page, head, row, dim]) for batch b and KV head hk:
// strided, or through the page table when `table` is set (core/problem.h's kv_row_offset).
struct KvLayout {
  i64 stride[4] = {0, 0, 0, 0};
  const std::int32_t* table = nullptr;  // null: not paged
  i64 table_stride0 = 0, table_stride1 = 0, page_size = 0;
};
ATTN_HD constexpr i64 kv_row_offset(const KvLayout& t, i64 b, i64 hk, i64 j) {
  if (t.table == nullptr) return b * t.stride[0] + hk * t.stride[1] + j * t.stride[2];
  const PagedRow p = paged_row(t.table, t.table_stride0, t.table_stride1, t.page_size, b, j);
  return p.page * t.stride[0] + hk * t.stride[1] + p.slot * t.stride[2];
}

}  // namespace attn::cuda::sched
