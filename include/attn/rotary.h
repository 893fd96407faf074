// attn: rotary position embedding (RoPE), applied where a decode step needs it: to the keys as a KV cache
// stores them (KVCache::append, PagedKVCache::append) and to the queries of the step
// (MultiHeadAttention::forward_cached), so that a model's decode step is one call and rotating the new keys costs
// no extra pass over the cache.
#pragma once

#include <cstdint>

#include "attn/status.h"
#include "attn/tensor.h"

namespace attn {

// The rotation of a token at position p: the first rotary_dim = 2·R dims of each head turned in pairs by the
// angle whose cosine and sine are cos[p, i] and sin[p, i] (i < R):
//   (x_a, x_b) -> (x_a·cos[p,i] − x_b·sin[p,i],  x_a·sin[p,i] + x_b·cos[p,i]),
// the pairs (a, b) = (2i, 2i + 1) when interleaved (GPT-J; FlashAttention's default) or (i, i + R) otherwise
// (GPT-NeoX, Llama as Hugging Face stores it). The other dims are left as they are. Computed in fp32 and rounded
// once to the tensor's dtype, as FlashAttention's kernel does.
//   cos, sin: f32 [positions, R] (any strides, host memory); rotary_dim = 2·R must be at most the head dim.
struct Rotary {
  TensorView cos, sin;
  bool interleaved = false;
};

// Turns x [B, H, T, D] (f32, bf16 or f16, host memory) in place, token t of every batch and head at position
// position0 + t. Checks everything first (names the parameter; nothing is written on error): the rotary tables'
// shape and dtype, rotary_dim <= D, position0 >= 0 and position0 + T <= positions.
Status apply_rotary(const TensorView& x, const Rotary& rotary, std::int64_t position0);

}  // namespace attn
