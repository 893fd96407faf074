// attn: KV caches for autoregressive decoding.
//
// A decode step appends the keys and values of the new tokens, then attends the new tokens' queries
// to everything cached with bottom-right causal alignment: with T new queries and L cached keys
// (the new ones included), query i sees keys j <= i + L - T. decode_params() gives those Params.
//
//   KVCache       one sequence, contiguous storage [Hkv, capacity, D] for K and for V.
//   PagedKVCache  a pool of fixed-size pages shared by many sequences of different lengths, a page
//                 table per sequence, pages returned to a free list when a sequence is removed and
//                 reused by later ones (vLLM's PagedAttention layout). attend() decodes a batch of
//                 sequences with ragged lengths in one call through attn::attention_paged.
//
// Storage is f32 by default; bf16, f16, i8 or i4 on request (create's `dtype`). An i8 cache stores each appended
// (token, KV head) row as round(x / s) with s = max|x| / 127 (symmetric, per row; an all-zero row gets s = 0) and
// keeps the f32 scales beside it (k_scales(), v_scales()); attend() hands them to the kernels, which read the
// 8-bit rows and apply the scales in registers: a quarter of f32's bytes per key, half of bf16's. An i4 cache does
// the same per block of 32 values of a row (attn::kI4Block) with s = max|x| / 7 (values -7 .. 7, two per byte,
// attn/tensor.h's packing): 4 bits and an f32 scale per 32 values, 5 bits per value in all (bf16's 16, i8's 8.25 at
// head dim 128). Appended values may be f32, bf16 or f16 and are rounded to the storage dtype once (to nearest);
// an i8 or i4 cache refuses non-finite values (no scale represents them). Errors (appending past the capacity, an
// exhausted pool, an unknown sequence id, a shape mismatch) return a Status naming the parameter and leave the cache
// unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "attn/rotary.h"
#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"

namespace attn {

// Params with causal = bottom_right: what a decode step needs.
Params decode_params();

class KVCache {
 public:
  KVCache() = default;
  // v_head_dim = 0 means head_dim. Reserves capacity tokens up front (never reallocates). dtype: the storage,
  // f32 (the first form), bf16, f16, i8 or i4.
  static Status create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                       std::int64_t capacity, KVCache* cache);
  static Status create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                       std::int64_t capacity, DType dtype, KVCache* cache);

  std::int64_t kv_heads() const { return hkv_; }
  std::int64_t head_dim() const { return dk_; }
  std::int64_t v_head_dim() const { return dv_; }
  std::int64_t capacity() const { return capacity_; }
  std::int64_t length() const { return length_; }
  DType dtype() const { return dtype_; }

  // Appends T tokens: k [1, Hkv, T, Dk], v [1, Hkv, T, Dv], f32, bf16 or f16, any strides.
  Status append(const TensorView& k, const TensorView& v);
  // The same with the keys turned by a rotary embedding as they are written (attn/rotary.h), token t at position
  // length() + t; the values as given.
  Status append(const TensorView& k, const TensorView& v, const Rotary& rotary);
  // The cached keys [1, Hkv, length, Dk] and values [1, Hkv, length, Dv] in the storage dtype, viewing the
  // cache's storage (valid until the cache is destroyed or moved); for an i8 cache their scales [1, Hkv, length],
  // for an i4 cache [1, Hkv, length, ceil(dim / 32)] (f32; an empty view otherwise): what Params::k_scale / v_scale
  // take.
  TensorView keys() const;
  TensorView values() const;
  TensorView k_scales() const;
  TensorView v_scales() const;
  // Attends q [1, Hq, T, Dk] (Hq a multiple of Hkv) to the cache: out [1, Hq, T, Dv], lse [1, Hq, T].
  // Runs attn::attention_paged with the whole cache as one page (its split-KV decode path); params.k_scale and
  // v_scale must be empty (the cache passes its own).
  Status attend(const TensorView& q, const TensorView& out, const Params& params = decode_params(),
                const std::optional<TensorView>& lse = std::nullopt) const;
  void clear() { length_ = 0; }
  // Drops the tokens after the first `length` (0 .. length()).
  Status truncate(std::int64_t length);

 private:
  Status append_impl(const TensorView& k, const TensorView& v, const Rotary* rotary);
  std::int64_t hkv_ = 0, dk_ = 0, dv_ = 0, capacity_ = 0, length_ = 0;
  DType dtype_ = DType::f32;
  std::vector<unsigned char> k_, v_;   // [Hkv, capacity, Dk] and [Hkv, capacity, Dv] in dtype_
  std::vector<float> k_scale_, v_scale_;  // [Hkv, capacity] (i8) or [Hkv, capacity, blocks] (i4) each
};

class PagedKVCache {
 public:
  PagedKVCache() = default;
  // A pool of num_pages pages of page_size tokens each (both >= 1); v_head_dim = 0 means head_dim. dtype: the
  // storage, f32 (the first form), bf16, f16, i8 or i4.
  static Status create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                       std::int64_t page_size, std::int64_t num_pages, PagedKVCache* cache);
  static Status create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                       std::int64_t page_size, std::int64_t num_pages, DType dtype, PagedKVCache* cache);

  std::int64_t kv_heads() const { return hkv_; }
  std::int64_t head_dim() const { return dk_; }
  std::int64_t v_head_dim() const { return dv_; }
  std::int64_t page_size() const { return page_size_; }
  std::int64_t num_pages() const { return num_pages_; }
  DType dtype() const { return dtype_; }
  std::int64_t free_pages() const { return static_cast<std::int64_t>(free_.size()); }
  bool page_is_free(std::int64_t page) const;

  // A new empty sequence; ids are never reused, so a removed sequence's id stays invalid.
  std::int64_t add_sequence();
  // Returns the sequence's pages to the free list; the id becomes unknown.
  Status remove_sequence(std::int64_t id);
  bool has_sequence(std::int64_t id) const { return seqs_.count(id) != 0; }
  Status length(std::int64_t id, std::int64_t* length) const;
  // Drops the sequence's tokens after the first `length`; pages no longer needed return to the pool.
  Status truncate(std::int64_t id, std::int64_t length);
  // The pool pages holding the sequence, in order (page n holds tokens n·page_size ...).
  Status pages(std::int64_t id, std::vector<std::int32_t>* pages) const;

  // Appends T tokens to sequence `id`: k [1, Hkv, T, Dk], v [1, Hkv, T, Dv], f32, bf16 or f16, any strides.
  // Takes pages from the free list as needed; an exhausted pool is an error and nothing changes.
  Status append(std::int64_t id, const TensorView& k, const TensorView& v);
  // The same with the keys turned by a rotary embedding as they are written (attn/rotary.h), token t at the
  // sequence's position length + t.
  Status append(std::int64_t id, const TensorView& k, const TensorView& v, const Rotary& rotary);
  // The pool: k_pages [P, Hkv, page_size, Dk], v_pages [P, Hkv, page_size, Dv] in the storage dtype; for an i8
  // pool the scales [P, Hkv, page_size], for an i4 pool [P, Hkv, page_size, ceil(dim / 32)] (f32; an empty view
  // otherwise).
  TensorView k_pages() const;
  TensorView v_pages() const;
  TensorView k_scale_pages() const;
  TensorView v_scale_pages() const;

  // The inputs of attn::attention_paged for sequences `ids` (B of them, distinct): page_table
  // [B, max_pages] i32 row-major (unused entries -1) and seq_lens [B] i32.
  Status tables(const std::vector<std::int64_t>& ids, std::vector<std::int32_t>* page_table,
                std::int64_t* max_pages, std::vector<std::int32_t>* seq_lens) const;
  // Batched decode: q [B, Hq, T, Dk], row b belonging to sequence ids[b] (each sequence of any
  // length >= T), out [B, Hq, T, Dv], lse [B, Hq, T]; one call over ragged lengths.
  Status attend(const std::vector<std::int64_t>& ids, const TensorView& q, const TensorView& out,
                const Params& params = decode_params(), const std::optional<TensorView>& lse = std::nullopt) const;

 private:
  Status append_impl(std::int64_t id, const TensorView& k, const TensorView& v, const Rotary* rotary);
  struct Sequence {
    std::int64_t length = 0;
    std::vector<std::int32_t> pages;
  };
  Status find(std::int64_t id, const Sequence** seq) const;

  std::int64_t hkv_ = 0, dk_ = 0, dv_ = 0, page_size_ = 0, num_pages_ = 0, next_id_ = 0;
  DType dtype_ = DType::f32;
  std::vector<unsigned char> k_, v_;      // [P, Hkv, page_size, Dk] and [P, Hkv, page_size, Dv] in dtype_
  std::vector<float> k_scale_, v_scale_;  // [P, Hkv, page_size] (i8) or [.., blocks] (i4) each
  std::vector<std::int32_t> free_;  // a stack: the most recently freed page is reused first
  std::vector<unsigned char> is_free_;
  std::unordered_map<std::int64_t, Sequence> seqs_;
};

}  // namespace attn
