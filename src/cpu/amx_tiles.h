// The AMX tile configuration shared by the AMX kernel and the benchmark's AMX ceiling loop: palette 1,
// tiles tmm0-tmm7 of 16 rows x 64 bytes each. It is loaded with an explicit ldtilecfg from a memory operand
// (the assembler knows the instruction whatever the compiler target): g++ 12's _tile_loadconfig intrinsic
// may drop the stores that fill the configuration, and the next tile instruction then raises SIGILL.
// The calling process must hold the AMX permission (cpu::request_amx()); the configuration is per thread.
#pragma once

#include <cstdint>

namespace attn::cpu {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

inline void load_tile_config_16x64() {
#if defined(__x86_64__)
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
#endif
}

}  // namespace attn::cpu
