#include "cases.h"

#include "canonical_shapes.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

namespace attn::test {
namespace {

std::string num(std::int64_t x) {
  const std::string digits = std::to_string(x);
  return x < 0 ? "m" + digits.substr(1) : digits;
}

// A real number as a test-name fragment: %g digits with '-' -> 'm', '.' -> 'p', '+' dropped (1e+20 -> 1e20).
// Formatting instead of casting to an integer: a cast of 1e20 * 1000 overflows (undefined behaviour).
std::string real(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  std::string out;
  for (const char* c = buf; *c; ++c) {
    if (*c == '-') out += 'm';
    else if (*c == '.') out += 'p';
    else if (*c != '+') out += *c;
  }
  return out;
}

const char* causal_name(Causal c) { return c == Causal::none ? "" : c == Causal::top_left ? "_causalTL" : "_causalBR"; }

const char* mask_name(MaskCase m) {
  switch (m) {
    case MaskCase::none: return "";
    case MaskCase::additive_full: return "_maskAdd4d";
    case MaskCase::additive_2d: return "_maskAdd2d";
    case MaskCase::keep_per_batch: return "_maskKeepB1";
    case MaskCase::keep_keys: return "_maskKeepKeys";
  }
  return "";
}

}  // namespace

std::string Case::name() const {
  std::string n = "B" + num(B) + "_H" + num(Hq) + "x" + num(Hkv) + "_q" + num(Sq) + "_k" + num(Skv) + "_d" + num(Dk) +
                  "x" + num(Dv) + causal_name(causal) + mask_name(mask);
  if (window.enabled())
    n += "_win" + num(window.left) + "_" + num(window.right) + (window.align == Align::top_left ? "TL" : "BR");
  if (kv_lens) n += "_lens";
  if (layout != Layout::bhsd) n += std::string("_") + layout_name(layout);
  if (dtype != DType::f32 || kv_dtype != DType::f32) n += std::string("_") + dtype_name(dtype) + "_" + dtype_name(kv_dtype);
  if (amplitude != 1.0) n += "_amp" + real(amplitude);
  if (scale) n += "_scale" + real(*scale);
  if (page_size) n += "_paged" + num(page_size);
  if (softcap > 0) n += "_softcap" + real(softcap);
  if (alibi) n += alibi == 1 ? "_alibi" : "_alibiB";
  if (sinks) n += "_sinks";
  if (dropout > 0) n += "_drop" + real(dropout);
  return n;
}

std::vector<Case> registry() {
  std::vector<Case> out;
  std::set<std::string> seen;
  auto add = [&](const Case& c) {
    if (seen.insert(c.name()).second) out.push_back(c);
  };
  const Causal causals[] = {Causal::none, Causal::top_left, Causal::bottom_right};

  // The canonical benchmark shapes (tools/canonical_shapes.h, the table `attn bench` and bench/run_bench.py time),
  // as their tiny stand-ins, fp32 and bf16; D3's ragged lengths as random per-sequence key lengths; the MLA shapes'
  // V as a separate tensor of Dv columns (V as a view into K's rows: tests/test_mla.cc).
  for (const shapes::Canonical& s : shapes::kCanonical)
    for (DType dt : {DType::f32, DType::bf16}) {
      const shapes::Dims& d = s.tiny;
      add({.B = d.B, .Hq = d.Hq, .Hkv = d.Hkv, .Sq = d.Sq, .Skv = d.Skv, .Dk = d.D, .Dv = shapes::value_dim(d),
           .causal = d.causal ? Causal::bottom_right : Causal::none, .kv_lens = d.kv_len_min > 0, .dtype = dt,
           .kv_dtype = dt, .page_size = d.page_size});
    }
  // Every head dim, GQA, cross-attention lengths (not tile multiples), three layouts.
  for (std::int64_t d : {1, 16, 40, 64, 80, 128, 256}) {
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = d, .Dv = d});
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = d, .Dv = d, .causal = Causal::bottom_right,
         .layout = Layout::padded});
    add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 203, .Skv = 113, .Dk = d, .Dv = d, .causal = Causal::top_left,
         .layout = Layout::bshd});
  }
  // [B, S, H, D] memory with several KV heads and many query blocks: K/V rows H·D apart, which the forward gathers
  // into contiguous rows first (cpu/flash_kernel.h, gather_kv).
  for (Causal c : {Causal::none, Causal::bottom_right})
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 203, .Skv = 113, .Dk = 40, .Dv = 24, .causal = c, .layout = Layout::bshd});
  // Every pair of ragged lengths with every causal alignment (Sq < Skv, Sq = Skv, Sq > Skv).
  for (std::int64_t sq : {1, 7, 113, 203})
    for (std::int64_t skv : {1, 7, 113, 203})
      for (Causal c : causals) add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = sq, .Skv = skv, .Dk = 64, .Dv = 64, .causal = c});
  // Long sequences.
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 1023, .Skv = 1023, .Dk = 64, .Dv = 64, .causal = Causal::top_left});
  add({.B = 1, .Hq = 1, .Hkv = 1, .Sq = 1023, .Skv = 1023, .Dk = 40, .Dv = 40, .layout = Layout::bshd});
  add({.B = 2, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 1023, .Dk = 128, .Dv = 128});
  add({.B = 1, .Hq = 4, .Hkv = 2, .Sq = 7, .Skv = 1023, .Dk = 128, .Dv = 128, .causal = Causal::bottom_right});
  add({.B = 1, .Hq = 2, .Hkv = 2, .Sq = 1023, .Skv = 113, .Dk = 16, .Dv = 16, .causal = Causal::bottom_right});
  // GQA ratios: MHA, GQA, MQA.
  for (std::int64_t hkv : {8, 4, 2, 1}) {
    add({.B = 2, .Hq = 8, .Hkv = hkv, .Sq = 7, .Skv = 203, .Dk = 64, .Dv = 64, .layout = Layout::bshd});
    add({.B = 1, .Hq = 8, .Hkv = hkv, .Sq = 113, .Skv = 113, .Dk = 64, .Dv = 64, .causal = Causal::top_left});
  }
  // Dv != Dk.
  for (auto [dk, dv] : {std::pair{64, 32}, {40, 128}, {1, 7}, {256, 16}, {16, 80}}) {
    add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = dk, .Dv = dv});
    add({.B = 1, .Hq = 2, .Hkv = 2, .Sq = 203, .Skv = 7, .Dk = dk, .Dv = dv, .causal = Causal::bottom_right,
         .layout = Layout::padded});
  }
  // Dense masks, alone and with causal masks and key lengths.
  for (MaskCase m : {MaskCase::additive_full, MaskCase::additive_2d, MaskCase::keep_per_batch, MaskCase::keep_keys})
    for (Causal c : causals) {
      add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 32, .Dv = 32, .causal = c, .mask = m});
      add({.B = 3, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 16, .Dv = 24, .causal = c, .mask = m,
           .kv_lens = true, .layout = Layout::bshd});
    }
  // Key lengths (padding).
  for (Causal c : causals) {
    add({.B = 5, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = c, .kv_lens = true});
    add({.B = 4, .Hq = 4, .Hkv = 4, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 64, .causal = c, .kv_lens = true,
         .layout = Layout::padded});
  }
  // Local windows, both alignments, with and without causal masks, self and cross lengths.
  const Window windows[] = {{3, 0}, {16, -1}, {-1, 5}, {0, 0}, {64, 64}, {200, 3}};
  for (Window w : windows)
    for (Align a : {Align::top_left, Align::bottom_right}) {
      w.align = a;
      add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 203, .Skv = 113, .Dk = 32, .Dv = 32, .window = w});
      add({.B = 2, .Hq = 2, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 32, .Dv = 32, .causal = Causal::bottom_right,
           .window = w, .kv_lens = true});
    }
  // Large logits: inputs x30 (|logits| ~ 10^3), and with scale 1 (|logits| ~ 10^4).
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .amplitude = 30});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = Causal::top_left,
       .mask = MaskCase::additive_full, .amplitude = 30, .scale = 1.0});
  add({.B = 1, .Hq = 1, .Hkv = 1, .Sq = 203, .Skv = 203, .Dk = 128, .Dv = 128, .amplitude = 30, .scale = 1.0});
  add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 64, .amplitude = 30, .scale = 1.0});
  // Long dot products of large terms (the two near-misses of the tolerance rule, issue 28): scores of tens from
  // Dk = 256 terms of up to 64 each (scale 0.21, a float mask, key lengths, more queries than keys bottom-right),
  // and scale 19.2 on Dk = 64 with bf16 K/V and dropout 0.9 (each kept weight x10). A score's fp32 rounding grows
  // with the length of its sum: the kernels sum dot products in chunks (cpu/microkernel.h: kDotChunk).
  add({.B = 2, .Hq = 8, .Hkv = 2, .Sq = 127, .Skv = 64, .Dk = 256, .Dv = 64, .causal = Causal::bottom_right,
       .mask = MaskCase::additive_full, .kv_lens = true, .amplitude = 8, .scale = 0.21});
  add({.B = 1, .Hq = 3, .Hkv = 3, .Sq = 16, .Skv = 15, .Dk = 64, .Dv = 64, .causal = Causal::top_left,
       .kv_dtype = DType::bf16, .amplitude = 0.4, .scale = 19.2, .dropout = 0.9});
  // Explicit scales.
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 113, .Dk = 64, .Dv = 64, .scale = 0.01});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 113, .Dk = 64, .Dv = 64, .scale = 2.5});
  // Empty sizes: no keys at all, no queries, no batch.
  add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 0, .Dk = 16, .Dv = 16});
  add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 0, .Skv = 7, .Dk = 16, .Dv = 16});
  add({.B = 0, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 7, .Dk = 16, .Dv = 16});
  // Low precision storage (accumulation stays fp32).
  const std::pair<DType, DType> dtypes[] = {
      {DType::bf16, DType::bf16}, {DType::f16, DType::f16}, {DType::f32, DType::bf16}, {DType::f32, DType::f16}};
  for (auto [qd, kd] : dtypes) {
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
         .dtype = qd, .kv_dtype = kd});
    add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 1023, .Dk = 128, .Dv = 128, .layout = Layout::bshd, .dtype = qd,
         .kv_dtype = kd});
    add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 80, .Dv = 40, .mask = MaskCase::keep_per_batch,
         .kv_lens = true, .dtype = qd, .kv_dtype = kd});
  }
  // Split-KV: few blocks and long keys (the key range is cut into chunks merged with the state merge).
  for (Causal c : causals) {
    add({.B = 1, .Hq = 4, .Hkv = 1, .Sq = 1, .Skv = 2100, .Dk = 64, .Dv = 64, .causal = c});
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 7, .Skv = 2100, .Dk = 40, .Dv = 24, .causal = c, .kv_lens = true});
  }
  add({.B = 1, .Hq = 8, .Hkv = 8, .Sq = 3, .Skv = 3000, .Dk = 128, .Dv = 128, .window = {700, 0}});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 1, .Skv = 2100, .Dk = 32, .Dv = 32, .mask = MaskCase::additive_full,
       .layout = Layout::bshd});
  add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 4000, .Dk = 128, .Dv = 128, .dtype = DType::f32,
       .kv_dtype = DType::bf16});
  // Decode blocks of 1, 2, 4 and 8 lanes (Sq x group), odd key counts, head dims off every vector width.
  for (std::int64_t group : {1, 2, 4, 8})
    add({.B = 1, .Hq = 2 * group, .Hkv = 2, .Sq = 1, .Skv = group == 4 ? 203 : 113, .Dk = group == 2 ? 40 : 96,
         .Dv = group == 8 ? 48 : 80});
  add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 3, .Skv = 77, .Dk = 33, .Dv = 65, .causal = Causal::bottom_right});
  // The decode score kernel's key groups (3 or 6 keys for 8- and 16-bit rows on 16-register ISAs) and their
  // leftovers, head dims below one vector and with a tail, 8 lanes in two passes: in f32, bf16 and i8 K/V.
  add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 203, .Dk = 7, .Dv = 13});
  add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 20, .Dv = 20, .kv_dtype = DType::i8});
  add({.B = 1, .Hq = 16, .Hkv = 2, .Sq = 1, .Skv = 67, .Dk = 33, .Dv = 33, .kv_dtype = DType::bf16});
  // Paged KV caches: page sizes 1, 3 and 16, decode and short prefill, GQA/MQA, ragged lengths.
  for (std::int64_t ps : {1, 3, 16}) {
    add({.B = 3, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
         .kv_lens = true, .page_size = ps});
    add({.B = 2, .Hq = 8, .Hkv = 1, .Sq = 7, .Skv = 203, .Dk = 32, .Dv = 16, .causal = Causal::bottom_right,
         .page_size = ps});
    add({.B = 2, .Hq = 2, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 16, .Dv = 16, .causal = Causal::bottom_right,
         .window = {20, 0}, .kv_lens = true, .page_size = ps});
  }
  add({.B = 4, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 2100, .Dk = 64, .Dv = 64, .kv_lens = true, .kv_dtype = DType::bf16,
       .page_size = 16});
  add({.B = 1, .Hq = 4, .Hkv = 4, .Sq = 1, .Skv = 2100, .Dk = 64, .Dv = 64, .layout = Layout::bshd, .page_size = 16});
  // Score variants (softcap, ALiBi, sinks): alone and together, with every causal alignment, dense masks, key
  // lengths, windows, GQA, decode (split-KV: the sink joins once, after the merge), paged caches, empty rows
  // (a sink gives lse = sink), large logits under the cap.
  for (Causal c : causals) {
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = c, .softcap = 2.0});
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = c, .alibi = 1});
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = c, .sinks = true});
    add({.B = 3, .Hq = 4, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 32, .Dv = 48, .causal = c, .mask = MaskCase::additive_full,
         .kv_lens = true, .layout = Layout::bshd, .softcap = 5.0, .alibi = 2, .sinks = true});
  }
  for (MaskCase m : {MaskCase::additive_2d, MaskCase::keep_per_batch, MaskCase::keep_keys})
    add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 65, .Skv = 90, .Dk = 16, .Dv = 16, .mask = m, .softcap = 1.0, .alibi = 1,
         .sinks = true});
  add({.B = 2, .Hq = 2, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 32, .Dv = 32, .causal = Causal::bottom_right,
       .window = {20, 0}, .kv_lens = true, .alibi = 2, .sinks = true});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .amplitude = 30, .softcap = 30.0});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .amplitude = 30, .scale = 1.0,
       .softcap = 50.0, .sinks = true});
  add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 2100, .Dk = 64, .Dv = 64, .kv_lens = true, .softcap = 3.0,
       .alibi = 1, .sinks = true});
  add({.B = 1, .Hq = 4, .Hkv = 1, .Sq = 1, .Skv = 4000, .Dk = 128, .Dv = 128, .sinks = true});
  add({.B = 3, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
       .kv_lens = true, .page_size = 16, .softcap = 2.0, .alibi = 2, .sinks = true});
  add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 0, .Dk = 16, .Dv = 16, .sinks = true});
  add({.B = 2, .Hq = 3, .Hkv = 1, .Sq = 17, .Skv = 9, .Dk = 8, .Dv = 8, .causal = Causal::bottom_right, .sinks = true});
  // ALiBi with slopes up to 1/2 over 1100 keys: far tiles' scores reach -500 (the wide band), walked from the
  // diagonal back; top-left causal with Sq < Skv hides each row's ALiBi diagonal, so every score it sees is far.
  for (Causal c : {Causal::bottom_right, Causal::top_left})
    add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 33, .Skv = 1100, .Dk = 32, .Dv = 32, .causal = c, .alibi = 1});
  // Dropout: prefill (lanes of one head), decode (lanes of a GQA group, split-KV), paged, with masks, windows and the
  // other variants; rates FlashAttention tests (0.17) and extreme ones.
  for (Causal c : causals)
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = c, .dropout = 0.17});
  add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 65, .Skv = 90, .Dk = 16, .Dv = 16, .mask = MaskCase::keep_keys, .kv_lens = true,
       .dropout = 0.5});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 203, .Dk = 32, .Dv = 48, .mask = MaskCase::additive_full,
       .softcap = 5.0, .alibi = 2, .sinks = true, .dropout = 0.9});
  add({.B = 2, .Hq = 2, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 32, .Dv = 32, .causal = Causal::bottom_right,
       .window = {20, 0}, .kv_lens = true, .dropout = 0.01});
  add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 2100, .Dk = 64, .Dv = 64, .kv_lens = true, .dropout = 0.3});
  add({.B = 3, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
       .kv_lens = true, .page_size = 16, .dropout = 0.2});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .amplitude = 30, .softcap = 30.0,
       .dropout = 0.25});
  // 8-bit K/V (i8 values, a scale per row) under every query dtype: prefill and decode, GQA, masks, key lengths,
  // layouts with strided rows, split-KV, paged pools, the score variants, scores in the wide band.
  for (DType qd : {DType::f32, DType::bf16, DType::f16}) {
    const DType i8 = DType::i8;
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
         .dtype = qd, .kv_dtype = i8});
    add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 1023, .Dk = 128, .Dv = 128, .layout = Layout::bshd, .dtype = qd,
         .kv_dtype = i8});
    add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 80, .Dv = 40, .mask = MaskCase::keep_per_batch,
         .kv_lens = true, .dtype = qd, .kv_dtype = i8});
    add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 4000, .Dk = 128, .Dv = 128, .kv_lens = true, .dtype = qd,
         .kv_dtype = i8});
    add({.B = 3, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
         .kv_lens = true, .dtype = qd, .kv_dtype = i8, .page_size = 16});
  }
  for (Causal c : causals) {
    add({.B = 2, .Hq = 4, .Hkv = 1, .Sq = 33, .Skv = 203, .Dk = 33, .Dv = 65, .causal = c, .layout = Layout::padded,
         .kv_dtype = DType::i8});
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 2, .Skv = 203, .Dk = 96, .Dv = 48, .causal = c, .mask = MaskCase::additive_full,
         .layout = Layout::padded, .kv_dtype = DType::i8});
  }
  add({.B = 2, .Hq = 8, .Hkv = 1, .Sq = 7, .Skv = 203, .Dk = 32, .Dv = 16, .causal = Causal::bottom_right,
       .kv_dtype = DType::i8, .page_size = 3});
  add({.B = 3, .Hq = 4, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 32, .Dv = 48, .causal = Causal::bottom_right,
       .mask = MaskCase::additive_full, .kv_lens = true, .layout = Layout::bshd, .kv_dtype = DType::i8, .softcap = 5.0,
       .alibi = 2, .sinks = true, .dropout = 0.2});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .kv_dtype = DType::i8, .amplitude = 30,
       .scale = 1.0});
  add({.B = 1, .Hq = 4, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 64, .kv_dtype = DType::i8, .amplitude = 30,
       .scale = 1.0});
  // bf16 Q over 8-bit K/V rows in decode (on the bf16 pair products at avx512bf16 where they are preferred, both
  // ways there): 1 and 8 lanes, head dims with a last partial vector of 32 (40, 80, 33), Dk != Dv, MLA's 576/512 at
  // 8 lanes, one key, paged, the variants under an additive mask, the wide band.
  add({.B = 2, .Hq = 3, .Hkv = 3, .Sq = 1, .Skv = 203, .Dk = 40, .Dv = 24, .kv_lens = true, .dtype = DType::bf16,
       .kv_dtype = DType::i8});
  add({.B = 1, .Hq = 16, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 80, .Dv = 64, .causal = Causal::bottom_right,
       .dtype = DType::bf16, .kv_dtype = DType::i8, .page_size = 16});
  add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 300, .Dk = 576, .Dv = 512, .dtype = DType::bf16,
       .kv_dtype = DType::i8});
  add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 203, .Dk = 33, .Dv = 65, .mask = MaskCase::additive_full,
       .dtype = DType::bf16, .kv_dtype = DType::i8, .softcap = 5.0, .alibi = 2, .sinks = true, .dropout = 0.2});
  add({.B = 1, .Hq = 4, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 64, .dtype = DType::bf16, .kv_dtype = DType::i8,
       .amplitude = 30, .scale = 1.0});
  // a GQA group of 8 (its scores packed 2 keys to a vector on AVX-512) in the wide band, and over several tiles
  add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 64, .dtype = DType::bf16, .kv_dtype = DType::i8,
       .amplitude = 30, .scale = 1.0});
  add({.B = 2, .Hq = 16, .Hkv = 2, .Sq = 1, .Skv = 1000, .Dk = 128, .Dv = 128, .kv_lens = true, .dtype = DType::bf16,
       .kv_dtype = DType::i8});
  add({.B = 2, .Hq = 8, .Hkv = 1, .Sq = 2, .Skv = 1, .Dk = 128, .Dv = 96, .kv_lens = true, .dtype = DType::bf16,
       .kv_dtype = DType::i8});
  // 4-bit K/V (i4 values, a scale per block of 32 values of a row): prefill and decode, GQA, split-KV, paged pools,
  // head dims with a partial last block and odd ones (a row's last byte half used), strided and padded rows, the
  // score variants, scores in the wide band, MLA's latent head dims.
  for (DType qd : {DType::f32, DType::bf16}) {
    const DType i4 = DType::i4;
    add({.B = 2, .Hq = 4, .Hkv = 2, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
         .dtype = qd, .kv_dtype = i4});
    add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 1023, .Dk = 128, .Dv = 128, .layout = Layout::bshd, .dtype = qd,
         .kv_dtype = i4});
    add({.B = 3, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 80, .Dv = 80, .causal = Causal::bottom_right,
         .kv_lens = true, .dtype = qd, .kv_dtype = i4, .page_size = 16});
  }
  add({.B = 1, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 4000, .Dk = 128, .Dv = 128, .kv_lens = true, .kv_dtype = DType::i4});
  add({.B = 2, .Hq = 4, .Hkv = 1, .Sq = 33, .Skv = 203, .Dk = 33, .Dv = 65, .causal = Causal::top_left,
       .layout = Layout::padded, .kv_dtype = DType::i4});
  add({.B = 2, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 80, .Dv = 40, .mask = MaskCase::keep_per_batch,
       .kv_lens = true, .dtype = DType::f16, .kv_dtype = DType::i4});
  add({.B = 3, .Hq = 4, .Hkv = 1, .Sq = 7, .Skv = 113, .Dk = 32, .Dv = 48, .causal = Causal::bottom_right,
       .mask = MaskCase::additive_full, .kv_lens = true, .layout = Layout::bshd, .kv_dtype = DType::i4, .softcap = 5.0,
       .alibi = 2, .sinks = true, .dropout = 0.2});
  add({.B = 2, .Hq = 8, .Hkv = 1, .Sq = 7, .Skv = 203, .Dk = 31, .Dv = 17, .causal = Causal::bottom_right,
       .kv_dtype = DType::i4, .page_size = 3});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .kv_dtype = DType::i4, .amplitude = 30,
       .scale = 1.0});
  add({.B = 1, .Hq = 16, .Hkv = 1, .Sq = 2, .Skv = 203, .Dk = 576, .Dv = 512, .causal = Causal::bottom_right,
       .dtype = DType::bf16, .kv_dtype = DType::i4});
  // bf16 Q over 4-bit rows on the pair products (avx512bf16; head dims of whole blocks): 2, 4 and 8 lanes, a last
  // span shorter than the others (Dk 96, 160), Dk != Dv, one block (32), odd key counts, paged, the variants, the wide band.
  add({.B = 3, .Hq = 2, .Hkv = 1, .Sq = 1, .Skv = 113, .Dk = 96, .Dv = 32, .causal = Causal::bottom_right,
       .kv_lens = true, .dtype = DType::bf16, .kv_dtype = DType::i4, .page_size = 16});
  add({.B = 2, .Hq = 8, .Hkv = 2, .Sq = 1, .Skv = 203, .Dk = 160, .Dv = 64, .mask = MaskCase::additive_full,
       .dtype = DType::bf16, .kv_dtype = DType::i4, .softcap = 5.0, .alibi = 2, .sinks = true, .dropout = 0.2});
  add({.B = 2, .Hq = 4, .Hkv = 1, .Sq = 2, .Skv = 7, .Dk = 32, .Dv = 32, .causal = Causal::bottom_right,
       .dtype = DType::bf16, .kv_dtype = DType::i4});
  add({.B = 1, .Hq = 4, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 128, .dtype = DType::bf16,
       .kv_dtype = DType::i4, .amplitude = 30, .scale = 1.0});
  add({.B = 1, .Hq = 8, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 128, .dtype = DType::bf16,
       .kv_dtype = DType::i4, .amplitude = 30, .scale = 1.0});
  add({.B = 2, .Hq = 4, .Hkv = 1, .Sq = 1, .Skv = 1, .Dk = 128, .Dv = 96, .kv_lens = true, .dtype = DType::bf16,
       .kv_dtype = DType::i4});
  // One and two lanes read K rows in spans of 4 blocks: a whole span and a last one of 1 or 3 blocks (Dk 160, 224),
  // one block alone (32), two spans and one block (288).
  add({.B = 2, .Hq = 3, .Hkv = 3, .Sq = 1, .Skv = 203, .Dk = 160, .Dv = 64, .kv_lens = true, .dtype = DType::bf16,
       .kv_dtype = DType::i4});
  add({.B = 1, .Hq = 4, .Hkv = 2, .Sq = 1, .Skv = 113, .Dk = 224, .Dv = 96, .causal = Causal::bottom_right,
       .dtype = DType::bf16, .kv_dtype = DType::i4, .page_size = 16});
  add({.B = 2, .Hq = 2, .Hkv = 2, .Sq = 1, .Skv = 77, .Dk = 32, .Dv = 32, .dtype = DType::bf16,
       .kv_dtype = DType::i4});
  add({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 1, .Skv = 203, .Dk = 288, .Dv = 128, .dtype = DType::bf16,
       .kv_dtype = DType::i4, .amplitude = 30, .scale = 1.0});
  // Blocks of one lane (MHA decode: Sq 1, a group of 1), packed rows of one lane: bf16, 8- and 4-bit K/V under bf16
  // Q (the pair products at avx512bf16) and fp32 Q, several tiles, odd key counts, value dims past 256 (passes of
  // 256, 128, 64 and 32 dims) and of 4 blocks (4-bit weights 4 key pairs a vector), the wide band.
  for (DType kd : {DType::bf16, DType::i8, DType::i4})
    for (DType qd : {DType::bf16, DType::f32}) {
      add({.B = 2, .Hq = 3, .Hkv = 3, .Sq = 1, .Skv = 203, .Dk = 128, .Dv = 416, .kv_lens = true, .dtype = qd,
           .kv_dtype = kd});
      add({.B = 1, .Hq = 2, .Hkv = 2, .Sq = 1, .Skv = 1000, .Dk = 64, .Dv = 96, .causal = Causal::bottom_right,
           .dtype = qd, .kv_dtype = kd, .page_size = 16});
      add({.B = 1, .Hq = 2, .Hkv = 2, .Sq = 1, .Skv = 203, .Dk = 64, .Dv = 128, .dtype = qd, .kv_dtype = kd,
           .amplitude = 30, .scale = 1.0});
      add({.B = 2, .Hq = 2, .Hkv = 2, .Sq = 1, .Skv = 157, .Dk = 128, .Dv = 128, .kv_lens = true, .dtype = qd,
           .kv_dtype = kd});
    }
  // bf16 prefill runs on its own kernel where the CPU has AMX, and bf16 rows are widened in registers by
  // the decode micro-kernels: every fp32 case above again in bf16 (every head dim, mask, window,
  // alignment, layout, key length, page size, decode and prefill).
  const std::size_t fp32_cases = out.size();
  for (std::size_t i = 0; i < fp32_cases; ++i) {
    Case c = out[i];
    if (c.dtype != DType::f32 || c.kv_dtype != DType::f32) continue;
    c.dtype = c.kv_dtype = DType::bf16;
    add(c);
  }
  return out;
}

namespace {
// The scales of quantised K or V rows of `dim` values over `outer` batches (or pages) of `rows` rows each: i8
// [outer, Hkv, rows] (Tensor::get's fourth index then reads past nothing: rank 3 ignores it), i4 [outer, Hkv,
// rows, ceil(dim / kI4Block)].
Tensor scales_tensor(const Case& c, std::int64_t outer, std::int64_t rows, std::int64_t dim) {
  if (c.kv_dtype == DType::i4) return Tensor::plain(DType::f32, {outer, c.Hkv, rows, (dim + kI4Block - 1) / kI4Block});
  return Tensor::plain(DType::f32, {outer, c.Hkv, rows});
}
}  // namespace

Instance instantiate(const Case& c) { return instantiate(c, std::hash<std::string>{}(c.name()), nullptr); }

Instance instantiate(const Case& c, std::uint64_t seed, const std::function<void(Instance&, std::mt19937_64&)>& adjust) {
  std::mt19937_64 rng(seed);
  Instance in;
  in.q = Tensor(c.dtype, c.B, c.Hq, c.Sq, c.Dk, c.layout);
  in.k = Tensor(c.kv_dtype, c.B, c.Hkv, c.Skv, c.Dk, c.layout);
  in.v = Tensor(c.kv_dtype, c.B, c.Hkv, c.Skv, c.Dv, c.layout);
  in.out = Tensor(c.dtype, c.B, c.Hq, c.Sq, c.Dv, c.layout);
  in.lse = Tensor::plain(DType::f32, {c.B, c.Hq, c.Sq});
  in.q.randomize(rng, c.amplitude);
  in.k.randomize(rng, c.amplitude);
  in.v.randomize(rng, 1.0);
  if (c.kv_dtype == DType::i8 || c.kv_dtype == DType::i4) {
    // i8: integers in [-127, 127] (never 0), a scale per row; i4: integers in [-8, 7], a scale per block of kI4Block
    // values; scales putting the values near +-amplitude.
    const bool i4 = c.kv_dtype == DType::i4;
    const double qmax = i4 ? 7.0 : 127.0;
    std::uniform_real_distribution<double> scale(0.5 / qmax, 1.5 / qmax);
    in.k.randomize(rng, qmax + (i4 ? 0.5 : 0.0));
    in.v.randomize(rng, qmax + (i4 ? 0.5 : 0.0));
    in.k_scale = scales_tensor(c, c.B, c.Skv, c.Dk);
    in.v_scale = scales_tensor(c, c.B, c.Skv, c.Dv);
    in.k_scale.for_each_index([&](auto b, auto h, auto j, auto d) { in.k_scale.set(scale(rng) * c.amplitude, b, h, j, d); });
    in.v_scale.for_each_index([&](auto b, auto h, auto j, auto d) { in.v_scale.set(scale(rng), b, h, j, d); });
    in.params.k_scale = in.k_scale.view;
    in.params.v_scale = in.v_scale.view;
  }
  in.out.poison();
  in.lse.poison();

  Params& p = in.params;
  p.scale = c.scale;
  p.causal = c.causal;
  p.window = c.window;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  switch (c.mask) {
    case MaskCase::none: break;
    case MaskCase::additive_full:
    case MaskCase::additive_2d: {
      in.mask = c.mask == MaskCase::additive_full ? Tensor::plain(DType::f32, {c.B, c.Hq, c.Sq, c.Skv})
                                                  : Tensor::plain(DType::f32, {c.Sq, c.Skv});
      const double inf = std::numeric_limits<double>::infinity();
      in.mask.for_each_index([&](auto a, auto b, auto i, auto j) {
        const double r = u(rng);
        in.mask.set(r < 0.15 ? -inf : 4.0 * (u(rng) - 0.5), a, b, i, j);
      });
      if (c.Sq > 2 && c.B > 0 && c.Hq > 0)  // one fully blocked row
        for (std::int64_t j = 0; j < c.Skv; ++j)
          c.mask == MaskCase::additive_full ? in.mask.set(-inf, 0, 0, 1, j) : in.mask.set(-inf, 1, j);
      p.mask = in.mask.view;
      break;
    }
    case MaskCase::keep_per_batch:
      in.mask = Tensor::plain(DType::boolean, {c.B, 1, c.Sq, c.Skv});
      in.mask.for_each_index([&](auto a, auto b, auto i, auto j) {
        const bool row_blocked = c.Sq > 2 && i == c.Sq / 2 && a == 0;
        in.mask.set(!row_blocked && u(rng) < 0.7, a, b, i, j);
      });
      p.mask = in.mask.view;
      break;
    case MaskCase::keep_keys:
      in.mask = Tensor::plain(DType::boolean, {c.Skv});
      in.mask.for_each_index([&](auto a, auto, auto, auto) { in.mask.set(u(rng) < 0.8, a); });
      p.mask = in.mask.view;
      break;
  }
  if (c.kv_lens) {
    in.kv_lens = Tensor::plain(c.B % 2 ? DType::i32 : DType::i64, {c.B});
    for (std::int64_t b = 0; b < c.B; ++b) {
      const std::int64_t len = b == 0 ? 0 : b == 1 ? c.Skv : static_cast<std::int64_t>(u(rng) * (c.Skv + 1));
      in.kv_lens.set(static_cast<double>(std::min(len, c.Skv)), b);
    }
    p.kv_lens = in.kv_lens.view;
  }
  if (c.softcap > 0) p.softcap = c.softcap;
  if (c.alibi) {  // ALiBi's geometric slopes 2^(-8(h+1)/Hq), varied per batch for [B, Hq]
    in.alibi = c.alibi == 1 ? Tensor::plain(DType::f32, {c.Hq}) : Tensor::plain(DType::f32, {c.B, c.Hq});
    in.alibi.for_each_index([&](auto a, auto b, auto, auto) {
      const std::int64_t h = c.alibi == 1 ? a : b;
      const double slope = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c.Hq));
      c.alibi == 1 ? in.alibi.set(slope, a) : in.alibi.set(slope * (0.5 + u(rng)), a, b);
    });
    p.alibi_slopes = in.alibi.view;
  }
  if (c.sinks) {
    in.sinks = Tensor::plain(DType::f32, {c.Hq});
    for (std::int64_t h = 0; h < c.Hq; ++h)
      in.sinks.set(h == 0 && c.Hq > 1 ? -std::numeric_limits<double>::infinity() : 6.0 * u(rng) - 2.0, h);
    p.sinks = in.sinks.view;
  }
  if (c.dropout > 0) p.dropout_p = c.dropout, p.dropout_seed = rng();
  if (adjust) adjust(in, rng);
  if (c.page_size > 0) {
    // Scatter K/V over a shuffled pool with spare pages full of NaN: a page outside a sequence's table
    // (or a row past its length) that were read would poison the result.
    const std::int64_t ps = c.page_size, max_pages = (c.Skv + ps - 1) / ps, pool = c.B * max_pages + 5;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pool));
    for (std::int64_t i = 0; i < pool; ++i) ids[i] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    in.k_pages = Tensor(c.kv_dtype, pool, c.Hkv, ps, c.Dk, c.layout);
    in.v_pages = Tensor(c.kv_dtype, pool, c.Hkv, ps, c.Dv, c.layout);
    in.k_pages.poison();
    in.v_pages.poison();
    const bool scaled = c.kv_dtype == DType::i8 || c.kv_dtype == DType::i4;
    if (scaled) {  // the scales' pool, NaN outside the sequences' rows
      in.k_scale_pages = scales_tensor(c, pool, ps, c.Dk);
      in.v_scale_pages = scales_tensor(c, pool, ps, c.Dv);
      in.k_scale_pages.poison();
      in.v_scale_pages.poison();
    }
    const std::int64_t kblocks = in.k_scale.view.rank == 4 ? in.k_scale.view.shape[3] : 1;  // scales per row
    const std::int64_t vblocks = in.v_scale.view.rank == 4 ? in.v_scale.view.shape[3] : 1;
    in.page_table = Tensor::plain(DType::i32, {c.B, max_pages});
    in.seq_lens = Tensor::plain(DType::i64, {c.B});
    for (std::int64_t b = 0; b < c.B; ++b) {
      const std::int64_t len = c.kv_lens ? static_cast<std::int64_t>(in.kv_lens.get(b)) : c.Skv;
      in.seq_lens.set(static_cast<double>(len), b);
      for (std::int64_t n = 0; n < max_pages; ++n) {
        const std::int32_t page = ids[static_cast<std::size_t>(b * max_pages + n)];
        in.page_table.set(n * ps < len ? page : -1, b, n);  // unused entries are invalid on purpose
        for (std::int64_t h = 0; h < c.Hkv; ++h)
          for (std::int64_t r = 0; r < ps && n * ps + r < len; ++r) {
            for (std::int64_t d = 0; d < c.Dk; ++d) in.k_pages.set(in.k.get(b, h, n * ps + r, d), page, h, r, d);
            for (std::int64_t d = 0; d < c.Dv; ++d) in.v_pages.set(in.v.get(b, h, n * ps + r, d), page, h, r, d);
            for (std::int64_t e = 0; scaled && e < kblocks; ++e)
              in.k_scale_pages.set(in.k_scale.get(b, h, n * ps + r, e), page, h, r, e);
            for (std::int64_t e = 0; scaled && e < vblocks; ++e)
              in.v_scale_pages.set(in.v_scale.get(b, h, n * ps + r, e), page, h, r, e);
          }
      }
    }
  }
  return in;
}

double Instance::max_abs_v() const {
  if (v.view.dtype != DType::i8 && v.view.dtype != DType::i4) return max_abs_finite(v);
  const std::int64_t block = v.view.dtype == DType::i4 ? kI4Block : std::int64_t{1} << 40;
  double m = 0;
  v.for_each_index([&](auto b, auto h, auto j, auto d) {
    m = std::max(m, std::fabs(v.get(b, h, j, d) * v_scale.get(b, h, j, d / block)));
  });
  return m;
}

Outputs run_poisoned(Instance& in, const std::function<Status(Instance&)>& run, bool with_lse) {
  in.out.poison();
  in.lse.poison();
  const std::vector<unsigned char> poisoned = in.out.storage;
  const Status s = run(in);
  EXPECT_TRUE(s.ok()) << s.message();
  // Nothing outside the output view may change.
  const std::vector<bool> covered = covered_bytes(in.out);
  for (std::size_t i = 0; i < covered.size(); ++i)
    if (!covered[i]) EXPECT_EQ(in.out.storage[i], poisoned[i]) << "byte " << i << " outside the view was written";
  Outputs r;
  in.out.for_each_index([&](auto b, auto h, auto i, auto d) { r.out.push_back(in.out.get(b, h, i, d)); });
  if (with_lse) in.lse.for_each_index([&](auto b, auto h, auto i, auto) { r.lse.push_back(in.lse.get(b, h, i)); });
  return r;
}

void expect_matches_reference(const Case& c, const Instance& in, const reference::Result& ref,
                              const reference::Result& naive, const Outputs& r, bool with_lse, const std::string& what) {
  const Agreement o = agree(ref.out, [&](std::size_t i) { return r.out[i]; },
                            [&](std::size_t i) { return round_to(c.dtype, naive.out[i]); },
                            forward_atol(c.dtype, ref, in.max_abs_v()));
  EXPECT_TRUE(o.ok()) << what << ": out: " << o.describe();
  if (!with_lse) return;
  const Agreement l = agree(ref.lse, [&](std::size_t i) { return r.lse[i]; }, [&](std::size_t i) { return naive.lse[i]; },
                            lse_atol(ref), /*exact_inf=*/true);
  EXPECT_TRUE(l.ok()) << what << ": lse: " << l.describe();
}

Status Instance::run(Backend backend, int threads, bool with_lse) {
  Params p = params;
  p.backend = backend;
  p.threads = threads;
  const std::optional<TensorView> l = with_lse ? std::optional<TensorView>(lse.view) : std::nullopt;
  if (k_pages.storage.empty()) return attention(q.view, k.view, v.view, out.view, p, l);
  p.kv_lens.reset();
  if (!k_scale_pages.storage.empty()) p.k_scale = k_scale_pages.view, p.v_scale = v_scale_pages.view;
  return attention_paged(q.view, k_pages.view, v_pages.view, page_table.view, seq_lens.view, out.view, p, l);
}

Status Instance::problem(Backend backend, int threads, bool with_lse, core::Problem* result) const {
  Params p = params;
  p.backend = backend;
  p.threads = threads;
  const std::optional<TensorView> l = with_lse ? std::optional<TensorView>(lse.view) : std::nullopt;
  if (k_pages.storage.empty()) return core::validate(q.view, k.view, v.view, out.view, p, l, result);
  p.kv_lens.reset();
  if (!k_scale_pages.storage.empty()) p.k_scale = k_scale_pages.view, p.v_scale = v_scale_pages.view;
  return core::validate_paged(q.view, k_pages.view, v_pages.view, page_table.view, seq_lens.view, out.view, p, l, result);
}

std::vector<Case> backward_registry() {
  std::vector<Case> out;
  for (const Case& c : registry())
    if (c.page_size == 0 && c.kv_dtype != DType::i8 && c.kv_dtype != DType::i4 && c.B * c.Hq * c.Sq * c.Skv * (c.Dk + c.Dv) <= 30'000'000) out.push_back(c);
  // Key blocks shared by many query blocks in both sweeps, GQA groups over several query tiles.
  out.push_back({.B = 1, .Hq = 4, .Hkv = 1, .Sq = 130, .Skv = 130, .Dk = 64, .Dv = 48, .causal = Causal::top_left});
  out.push_back({.B = 2, .Hq = 6, .Hkv = 2, .Sq = 65, .Skv = 257, .Dk = 24, .Dv = 24, .causal = Causal::bottom_right,
                 .window = {40, 8, Align::bottom_right}, .mask = MaskCase::additive_full});
  // Peaked softmax rows (scale·|q·k| of 10 to 30 and more): the statistics recomputed from the scores.
  for (double scale : {10.0, 20.0, 30.0}) {
    out.push_back({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 113, .Skv = 203, .Dk = 64, .Dv = 64, .causal = Causal::top_left,
                   .scale = scale});
    out.push_back({.B = 2, .Hq = 4, .Hkv = 1, .Sq = 65, .Skv = 130, .Dk = 32, .Dv = 48, .window = {20, 4},
                   .mask = MaskCase::additive_2d, .kv_lens = true, .scale = scale});
    out.push_back({.B = 1, .Hq = 2, .Hkv = 2, .Sq = 33, .Skv = 1, .Dk = 16, .Dv = 16, .scale = scale});  // dQ = dK = 0
    out.push_back({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 65, .Skv = 130, .Dk = 32, .Dv = 32, .causal = Causal::bottom_right,
                   .scale = scale, .dropout = 0.3});
    out.push_back({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 70, .Skv = 90, .Dk = 64, .Dv = 64, .causal = Causal::bottom_right,
                   .dtype = DType::bf16, .kv_dtype = DType::bf16, .scale = scale});
  }
  out.push_back({.B = 1, .Hq = 2, .Hkv = 1, .Sq = 50, .Skv = 60, .Dk = 16, .Dv = 16, .amplitude = 3, .scale = 1e4});
  return out;
}

GradInstance instantiate_grads(const Case& c) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.name() + "/grads"));
  GradInstance g;
  g.dout = Tensor(c.dtype, c.B, c.Hq, c.Sq, c.Dv, c.layout);
  g.dq = Tensor(c.dtype, c.B, c.Hq, c.Sq, c.Dk, c.layout);
  g.dk = Tensor(c.kv_dtype, c.B, c.Hkv, c.Skv, c.Dk, c.layout);
  g.dv = Tensor(c.kv_dtype, c.B, c.Hkv, c.Skv, c.Dv, c.layout);
  g.dout.randomize(rng, 1.0);
  if (c.sinks) {
    g.dsinks = Tensor::plain(DType::f32, {c.Hq});
    g.dsinks.poison();
  }
  g.dq.poison();
  g.dk.poison();
  g.dv.poison();
  return g;
}

std::vector<Case> workspace_primers(const Case& c) {
  Case longer = c, wider = c;
  longer.Skv = 3 * c.Skv + 1000, longer.Sq = c.Sq + 3;
  wider.Dk = c.Dk + 16;
  return {longer, wider};
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(t.view.numel()));
  t.for_each_index([&](auto a, auto b, auto c, auto d) { out.push_back(t.get(a, b, c, d)); });
  return out;
}

double max_finite(const std::vector<double>& x, double floor) {
  double m = floor;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

double max_row_norm(const Tensor& t) {
  double m = 0;
  const std::vector<double> x = values(t);
  const std::size_t dim = static_cast<std::size_t>(std::max<std::int64_t>(t.view.shape[3], 1));
  for (std::size_t r = 0; r * dim < x.size(); ++r) {
    double row = 0;
    for (std::size_t d = 0; d < dim; ++d) row += x[r * dim + d] * x[r * dim + d];
    if (std::isfinite(row)) m = std::max(m, std::sqrt(row));
  }
  return m;
}

bool untouched_outside(const Tensor& t, const std::vector<unsigned char>& before) {
  const std::vector<bool> covered = covered_bytes(t);
  for (std::size_t i = 0; i < covered.size(); ++i)
    if (!covered[i] && t.storage[i] != before[i]) return false;
  return true;
}

std::string gradient_failures(const Case& c, const Instance& in, const GradInstance& g, double scale,
                              const reference::Grads& ref, const reference::Grads& naive) {
  const double u_eff = unit_roundoff(c.dtype) + unit_roundoff(c.kv_dtype);
  const double dp_size = max_row_norm(g.dout) * max_row_norm(in.v);
  const struct {
    const char* name;
    const Tensor& t;
    const std::vector<double>& ref;
    const std::vector<double>& naive;
    DType dtype;
    double terms;
  } grads[] = {{"dq", g.dq, ref.dq, naive.dq, c.dtype, scale * dp_size * max_finite(values(in.k), 0)},
               {"dk", g.dk, ref.dk, naive.dk, c.kv_dtype, scale * dp_size * max_finite(values(in.q), 0)},
               {"dv", g.dv, ref.dv, naive.dv, c.kv_dtype, max_finite(values(g.dout), 0)}};
  std::string failure;
  for (const auto& x : grads) {
    const std::vector<double> fast = values(x.t);
    // A gradient beyond the range of its dtype is ±inf when stored (f16 tops out at 65504).
    std::vector<double> ref_stored = x.ref;
    for (double& r : ref_stored)
      if (std::isfinite(r) && std::isinf(round_to(x.dtype, r))) r = round_to(x.dtype, r);
    const double atol = 8 * u_eff * (max_finite(x.ref, 1e-3) + x.terms);
    const double range = x.dtype == DType::f16 ? 65504.0 : std::numeric_limits<float>::max();
    const Agreement a = agree(ref_stored, [&](std::size_t i) { return fast[i]; },
                              [&](std::size_t i) { return round_to(x.dtype, x.naive[i]); }, atol, false, range);
    if (!a.ok(3.0)) failure += std::string(x.name) + ": " + a.describe() + "; ";
  }
  // ∂L/∂sinks (when the call asked for it): a sum of P_sink·D over every row of the head, D = Σ_j P_ij dP_ij (or dO·O
  // from the stored O, rounded to q's dtype), so its atol scales with the size of those terms (ref.dsinks_terms,
  // D's own terms included), plus what rounding in the scores moves every weight by, as the forward's atol has it
  // (ε·score_terms, relative): random seed 3955672446439533586 (scale 96, scores to 200) erred 1.1e-6 at the vector
  // levels against the naive 8e-8, within that noise (6e-6) but over the atol without it (7.8e-7).
  if (c.sinks && !g.dsinks.storage.empty()) {
    const std::vector<double> fast = values(g.dsinks);
    const double terms = max_finite(ref.dsinks_terms, 0);
    const double atol = 8 * u_eff * (max_finite(ref.dsinks, 1e-3) + terms) + std::ldexp(1.0, -24) * ref.score_terms * terms;
    const Agreement a = agree(ref.dsinks, [&](std::size_t i) { return fast[i]; },
                              [&](std::size_t i) { return naive.dsinks[i]; }, atol);
    if (!a.ok(3.0)) failure += "dsinks: " + a.describe() + "; ";
  }
  return failure;
}

}  // namespace attn::test
