// Attention dropout (attn::Params::dropout_p, dropout_seed): which (query, key) weights are dropped, as a pure
// function of (seed, batch, query head, query row, key), so the backward regenerates the forward's mask and no
// result depends on threads, tiling, split-KV or the instruction set.
//
// The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
// generator of cuRAND and of FlashAttention's dropout), counter-based: one call maps a 128-bit counter and a
// 64-bit key to four independent 32-bit words.
//   key     = (seed mod 2^32, seed >> 32)
//   counter = (j >> 2, i, h, b)       j: key index, i: query row, h: query head, b: batch
// and word (j & 3) of the result is key j's draw x. The weight is dropped when x < threshold, with
// threshold = round(dropout_p · 2^32) (an integer comparison: P(drop) = threshold / 2^32, dropout_p to 2^-33),
// and kept weights are scaled by 1 / (1 − dropout_p):
//   out_i = Σ_j z_ij · P_ij · v_j,   z_ij = (x_ij ≥ threshold) / (1 − dropout_p),
// with P the softmax weights of the scores (the LSE and the softmax denominator are those of P, before dropout).
// The counter words are 32 bits, so validation asks Sq, Hq, B < 2^32 and Skv < 2^34 when dropout is on.
//
// The reference (src/reference) implements the same definition with its own Philox, checked against the
// published known-answer vectors (tests/test_numerics.cc).
#pragma once

#include <array>
#include <cstdint>

#include "core/hd.h"

namespace attn::core {

ATTN_HD std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> ctr, std::array<std::uint32_t, 2> key) {
  constexpr std::uint64_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // the round multipliers
  constexpr std::uint32_t kBump0 = 0x9E3779B9u, kBump1 = 0xBB67AE85u;  // the key schedule's Weyl increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) key[0] += kBump0, key[1] += kBump1;
    const std::uint64_t p0 = kMul0 * ctr[0], p1 = kMul1 * ctr[2];
    ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
  }
  return ctr;
}

// The dropout of one call (core::Problem::dropout): off when threshold = 0.
struct Dropout {
  double p = 0;  // attn::Params::dropout_p
  std::uint64_t seed = 0;
  std::uint64_t threshold = 0;  // drop when the draw is below it (<= 2^32)
  float keep_scale = 1.0f;      // 1 / (1 - dropout_p), rounded to fp32
  ATTN_HD bool on() const { return threshold != 0; }

  // z of the one key j of row (b, h, i), as factors() gives it (device code: no array indexed at run time).
  ATTN_HD float factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    const std::array<std::uint32_t, 4> x = philox4x32_10(
        {static_cast<std::uint32_t>(j >> 2), static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(h),
         static_cast<std::uint32_t>(b)},
        {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
    const int w = static_cast<int>(j & 3);
    const std::uint32_t draw = w == 0 ? x[0] : w == 1 ? x[1] : w == 2 ? x[2] : x[3];
    return draw >= threshold ? keep_scale : 0.0f;
  }

  // z for keys [j0, j0 + n) of row (b, h, i): z[c·stride] = keep_scale for a kept weight, 0 for a dropped one.
  ATTN_HD void factors(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0, std::int64_t n, float* z,
                       std::int64_t stride) const {
    const std::array<std::uint32_t, 2> key = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
    std::int64_t c = 0;
    while (c < n) {
      const std::int64_t j = j0 + c;
      const std::array<std::uint32_t, 4> x = philox4x32_10(
          {static_cast<std::uint32_t>(j >> 2), static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(h),
           static_cast<std::uint32_t>(b)},
          key);
      for (std::int64_t w = j & 3; w < 4 && c < n; ++w, ++c) z[c * stride] = x[static_cast<std::size_t>(w)] >= threshold ? keep_scale : 0.0f;
    }
  }
};

}  // namespace attn::core
