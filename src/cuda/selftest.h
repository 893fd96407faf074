// The GPU side of the layout self-tests (cuda/selftest_tiles.h): each function runs one per-warp test on the
// current CUDA device and copies its results back in the layout cuda/selftest_host.h's checks read. Returns
// Unsupported ("device": "no CUDA device ...") without a device, and names the failing runtime call otherwise.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/status.h"
#include "cuda/elem.h"

namespace attn::cuda::selftest {

// The results of attention tiles, case after case: s [16][16], rowmax [17], rowsum [17] (slot 16 is scratch),
// o [16][8] per case.
inline constexpr int kTileS = 256, kTileStat = 17, kTileO = 128;
struct TileResults {
  std::vector<float> s, rowmax, rowsum, o;
  void resize(int cases) {
    s.assign(static_cast<std::size_t>(cases) * kTileS, 0.0f);
    rowmax.assign(static_cast<std::size_t>(cases) * kTileStat, 0.0f);
    rowsum.assign(static_cast<std::size_t>(cases) * kTileStat, 0.0f);
    o.assign(static_cast<std::size_t>(cases) * kTileO, 0.0f);
  }
};

// Every one-hot case (m, k, n): out[case][16 * 8].
Status gpu_onehot_mma(MmaType t, std::vector<float>* out);
// out[lane][num] for an ldmatrix of num = 1, 2 or 4 matrices, plain or transposing.
Status gpu_ldmatrix_probe(int num, bool trans, std::vector<std::uint32_t>* out);
// One tile per case from q [cases][16*16], k [cases][16*16], v [cases][16*8] (16-bit elements of type t).
Status gpu_attention_tile(MmaType t, bool softmax, int cases, const std::vector<std::uint16_t>& q,
                          const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
                          TileResults* out);
// Every one-hot tile case (m, k, n), P = S.
Status gpu_attention_tile_onehot(MmaType t, TileResults* out);

}  // namespace attn::cuda::selftest
