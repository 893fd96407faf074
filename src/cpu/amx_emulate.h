// The AMX tile instructions the AMX kernel uses, in software: included by src/cpu/flash_amx.cc (after
// <immintrin.h>) only when it is compiled with ATTN_AMX_EMULATE, which the test target test_amx_emulated does, so
// that the kernel's logic (packing, masks, the online softmax between the products, work items) is tested on any
// machine with AVX-512 BF16, AMX or not. The library itself never uses it.
//
// Eight tiles of 16 rows x 64 bytes per thread, palette 1 as cpu/amx_tiles.h configures it. tdpbf16ps as the
// architecture defines it: C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1], bf16 inputs (denormals as 0)
// multiplied exactly and summed in fp32 (in this order; the hardware's order of the fp32 additions differs, which
// only moves the last bits).
#pragma once

#include <cstdint>
#include <cstring>

namespace attn::cpu::amx_emulation {

struct Tiles {
  alignas(64) unsigned char t[8][16][64];
};
inline thread_local Tiles tiles;

inline void load(int t, const void* base, long stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(tiles.t[t][r], static_cast<const unsigned char*>(base) + r * stride, 64);
}
inline void store(int t, void* base, long stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(static_cast<unsigned char*>(base) + r * stride, tiles.t[t][r], 64);
}
inline void zero(int t) { std::memset(tiles.t[t], 0, sizeof tiles.t[t]); }

inline float bf16_daz(std::uint16_t x) {
  if ((x & 0x7F80) == 0) x &= 0x8000;  // denormals (and zeros) as zero
  const std::uint32_t u = static_cast<std::uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void dpbf16ps(int c, int a, int b) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc;
      std::memcpy(&acc, &tiles.t[c][m][4 * n], 4);
      for (int k = 0; k < 16; ++k) {
        std::uint16_t a0, a1, b0, b1;
        std::memcpy(&a0, &tiles.t[a][m][4 * k], 2);
        std::memcpy(&a1, &tiles.t[a][m][4 * k + 2], 2);
        std::memcpy(&b0, &tiles.t[b][k][4 * n], 2);
        std::memcpy(&b1, &tiles.t[b][k][4 * n + 2], 2);
        acc += bf16_daz(a0) * bf16_daz(b0) + bf16_daz(a1) * bf16_daz(b1);
      }
      std::memcpy(&tiles.t[c][m][4 * n], &acc, 4);
    }
}

}  // namespace attn::cpu::amx_emulation

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadd(t, base, stride) ::attn::cpu::amx_emulation::load(t, base, stride)
#define _tile_stored(t, base, stride) ::attn::cpu::amx_emulation::store(t, base, stride)
#define _tile_zero(t) ::attn::cpu::amx_emulation::zero(t)
#define _tile_dpbf16ps(c, a, b) ::attn::cpu::amx_emulation::dpbf16ps(c, a, b)
