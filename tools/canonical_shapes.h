// The canonical benchmark shapes (docs/DESIGN.md): the one table of them. `attn bench --shape` times the full
// sizes; bench/run_bench.py reads this table from `attn bench --list-shapes` (its --self-test runs the tiny
// stand-ins); the correctness registry (tests/cases.cc) runs every tiny stand-in, in fp32 and bf16, at every
// instruction-set level against the fp64 reference. A stand-in keeps its shape's kind: GQA ratio, causal or not,
// decode (Sq = 1), Sq != Skv, paging and ragged lengths, at sizes that are not tile multiples.
#pragma once

#include <cstdint>

namespace attn::shapes {

struct Dims {
  std::int64_t B, Hq, Hkv, Sq, Skv, D;  // D: the head dim of Q and K (Dk)
  bool causal;              // bottom-right aligned (the same as top-left when Sq = Skv)
  std::int64_t page_size;   // 0: contiguous K/V; else attention_paged with pages of this many keys
  std::int64_t kv_len_min;  // 0: every sequence has Skv keys; else lengths spread evenly kv_len_min..Skv
  std::int64_t Dv = 0;      // V's head dim; 0: D
  bool latent = false;      // multi-head latent attention: V is the first Dv columns of K's rows (one cache)
};

inline std::int64_t value_dim(const Dims& d) { return d.Dv > 0 ? d.Dv : d.D; }

struct Canonical {
  const char* id;
  const char* what;
  Dims full;
  Dims tiny;
};

inline constexpr Canonical kCanonical[] = {
    {"P1", "LLM prefill", {1, 32, 8, 2048, 2048, 128, true, 0, 0}, {1, 4, 2, 67, 67, 32, true, 0, 0}},
    {"P2", "encoder layer (BERT-base)", {8, 12, 12, 512, 512, 64, false, 0, 0}, {2, 2, 2, 33, 33, 16, false, 0, 0}},
    {"P3", "long prefill", {1, 8, 8, 16384, 16384, 128, true, 0, 0}, {1, 2, 2, 97, 97, 32, true, 0, 0}},
    {"D1", "decode", {1, 32, 8, 1, 4096, 128, false, 0, 0}, {1, 4, 2, 1, 257, 32, false, 0, 0}},
    {"D2", "long decode", {1, 32, 8, 1, 32768, 128, false, 0, 0}, {1, 4, 2, 1, 515, 32, false, 0, 0}},
    {"D3", "batched paged decode, ragged lengths", {16, 32, 8, 1, 8000, 128, false, 16, 100},
     {4, 4, 2, 1, 101, 32, false, 4, 10}},
    {"X1", "cross-attention", {4, 8, 8, 128, 1024, 64, false, 0, 0}, {2, 2, 2, 17, 65, 16, false, 0, 0}},
    // Multi-head latent attention (DeepSeek-V3's absorbed decode): 128 query heads on one latent cache row of
    // [c_kv (512) ; k_rope (64)] per token, V its first 512 columns (a view: the cache is read once); FlashMLA's
    // pages of 64 for the batched ones. Their tiny stand-ins keep Dk > Dv, Hkv = 1 and paging.
    {"M1", "MLA decode, 4k latent cache", {1, 128, 1, 1, 4096, 576, false, 0, 0, 512, true},
     {1, 8, 1, 1, 67, 72, false, 0, 0, 64, true}},
    {"M2", "MLA decode, 32k latent cache", {1, 128, 1, 1, 32768, 576, false, 0, 0, 512, true},
     {1, 16, 1, 1, 203, 40, false, 0, 0, 32, true}},
    {"M3", "MLA batch decode B8, 4k, pages of 64", {8, 128, 1, 1, 4096, 576, false, 64, 0, 512, true},
     {2, 8, 1, 1, 101, 72, false, 16, 0, 64, true}},
    {"M4", "MLA batch decode B8, 32k, pages of 64", {8, 128, 1, 1, 32768, 576, false, 64, 0, 512, true},
     {2, 4, 1, 1, 131, 40, false, 4, 0, 32, true}},
};

// Key length of sequence b of a batch: Skv, or evenly spaced from kv_len_min (b = 0) to Skv (b = B - 1).
inline std::int64_t kv_len(const Dims& s, std::int64_t b) {
  if (s.kv_len_min <= 0 || s.B == 1) return s.Skv;
  return s.kv_len_min + ((s.Skv - s.kv_len_min) * b + (s.B - 1) / 2) / (s.B - 1);
}

}  // namespace attn::shapes
