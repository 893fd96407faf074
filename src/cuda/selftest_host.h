// The host side of the layout self-tests (host code only): the per-warp bodies of cuda/selftest_tiles.h run
// through the host model (HostWarp), the inputs of the value tests, and the checks. The checks read results in
// one layout whoever produced them, so the host tests (tests/test_cuda_host.cc) and the GPU program
// (attn_gpu_selftest) judge the host model and the hardware by the same code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/elem.h"
#include "cuda/fragment.h"
#include "cuda/selftest.h"
#include "cuda/selftest_tiles.h"
#include "cuda/warp.h"

namespace attn::cuda::selftest {

// ---- the host model runs ------------------------------------------------------------------------------

template <MmaType T>
std::vector<float> host_onehot_mma() {
  std::vector<float> out(static_cast<std::size_t>(kOnehotCases) * frag::kMmaM * frag::kMmaN, -1.0f);
  const HostWarp w;
  for (int c = 0; c < kOnehotCases; ++c)
    onehot_mma<T>(w, onehot_m(c), onehot_k(c), onehot_n(c), out.data() + c * frag::kMmaM * frag::kMmaN);
  return out;
}

template <int Num, bool Trans>
std::vector<std::uint32_t> host_ldmatrix_probe() {
  alignas(16) std::uint16_t smem[kProbeSmemElems] = {};
  std::vector<std::uint32_t> out(static_cast<std::size_t>(frag::kWarp) * Num, 0u);
  const HostWarp w(smem, sizeof smem);
  ldmatrix_probe<Num, Trans>(w, smem, out.data());
  return out;
}
inline std::vector<std::uint32_t> host_ldmatrix_probe(int num, bool trans) {
  switch (num * 2 + (trans ? 1 : 0)) {
    case 2: return host_ldmatrix_probe<1, false>();
    case 3: return host_ldmatrix_probe<1, true>();
    case 4: return host_ldmatrix_probe<2, false>();
    case 5: return host_ldmatrix_probe<2, true>();
    case 8: return host_ldmatrix_probe<4, false>();
    default: return host_ldmatrix_probe<4, true>();
  }
}

inline TileOut tile_out_of(TileResults& r, int c) {
  return {r.s.data() + c * kTileS, r.rowmax.data() + c * kTileStat, r.rowsum.data() + c * kTileStat,
          r.o.data() + c * kTileO};
}

template <MmaType T, bool Softmax>
TileResults host_attention_tile(int cases, const std::vector<std::uint16_t>& q, const std::vector<std::uint16_t>& k,
                                const std::vector<std::uint16_t>& v) {
  TileResults r;
  r.resize(cases);
  alignas(16) std::uint16_t smem[kTileSmemElems] = {};
  const HostWarp w(smem, sizeof smem);
  for (int c = 0; c < cases; ++c) {
    tile_fill(w, q.data() + c * kTileRows * kTileDk, k.data() + c * kTileKeys * kTileDk,
              v.data() + c * kTileKeys * kTileDv, smem);
    attention_tile<T, Softmax>(w, smem, tile_out_of(r, c));
  }
  return r;
}

template <MmaType T>
TileResults host_attention_tile_onehot() {
  TileResults r;
  r.resize(kTileOnehotCases);
  alignas(16) std::uint16_t smem[kTileSmemElems] = {};
  const HostWarp w(smem, sizeof smem);
  for (int c = 0; c < kTileOnehotCases; ++c) {
    tile_fill_onehot<T>(w, c / (kTileDk * kTileKeys), (c / kTileKeys) % kTileDk, c % kTileKeys, smem);
    attention_tile<T, false>(w, smem, tile_out_of(r, c));
  }
  return r;
}

// ---- inputs of the value tests ------------------------------------------------------------------------

// Random tiles: q, k, v uniform in [-2, 2), rounded to T (a fixed generator: the same numbers everywhere).
struct TileInputs {
  int cases = 0;
  std::vector<std::uint16_t> q, k, v;
};
template <MmaType T>
TileInputs make_tile_inputs(int cases, std::uint64_t seed) {
  TileInputs in;
  in.cases = cases;
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  const auto next = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<float>((x >> 40) * 0x1.0p-24) * 4.0f - 2.0f;
  };
  const auto fill = [&](std::vector<std::uint16_t>& t, std::size_t n) {
    t.resize(n);
    for (auto& e : t) e = to_bits<T>(next());
  };
  fill(in.q, static_cast<std::size_t>(cases) * kTileRows * kTileDk);
  fill(in.k, static_cast<std::size_t>(cases) * kTileKeys * kTileDk);
  fill(in.v, static_cast<std::size_t>(cases) * kTileKeys * kTileDv);
  return in;
}

// ---- the checks ---------------------------------------------------------------------------------------

struct Check {
  std::string name;
  long cases = 0;     // the elements or cases compared
  long failures = 0;  // how many of them differ
  std::string first = {};  // the first difference, in words
  bool ok() const { return failures == 0 && cases > 0; }
  void fail(const std::string& what) {
    if (failures++ == 0) first = what;
  }
};

// printf into a string (ints with %d, floats with %g / %.9g).
template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// Case (m, k, n) must hold exactly one 1, at D(m, n).
inline Check check_onehot_mma(MmaType t, const std::vector<float>& out) {
  Check ch{std::string("mma.m16n8k16 one-hot ") + mma_type_name(t)};
  if (out.size() != static_cast<std::size_t>(kOnehotCases) * frag::kMmaM * frag::kMmaN) {
    ch.fail("wrong result size");
    return ch;
  }
  for (int c = 0; c < kOnehotCases; ++c) {
    const int m = onehot_m(c), k = onehot_k(c), n = onehot_n(c);
    ++ch.cases;
    for (int i = 0; i < frag::kMmaM; ++i)
      for (int j = 0; j < frag::kMmaN; ++j) {
        const float want = (i == m && j == n) ? 1.0f : 0.0f, got = out[(c * frag::kMmaM + i) * frag::kMmaN + j];
        if (got != want) {
          ch.fail(fmt("A(%d,%d)=1, B(%d,%d)=1: D(%d,%d) = %g, expected %g", m, k, k, n, i, j, got, want));
          i = frag::kMmaM;
          break;
        }
      }
  }
  return ch;
}

// Lane l, register m, half h must hold element ldmatrix_elem(l, h) of matrix m.
inline Check check_ldmatrix_probe(int num, bool trans, const std::vector<std::uint32_t>& out) {
  Check ch{"ldmatrix.m8n8.x" + std::to_string(num) + (trans ? ".trans" : "")};
  if (out.size() != static_cast<std::size_t>(frag::kWarp) * num) {
    ch.fail("wrong result size");
    return ch;
  }
  for (int l = 0; l < frag::kWarp; ++l)
    for (int m = 0; m < num; ++m)
      for (int h = 0; h < 2; ++h) {
        ++ch.cases;
        const frag::Coord e = frag::ldmatrix_elem(l, h, trans);
        const std::uint16_t want = probe_value(m, e.row, e.col), got = half_of(out[l * num + m], h);
        if (got != want)
          ch.fail(fmt("lane %d register %d half %d: got element 0x%x, expected 0x%x", l, m, h, unsigned{got}, unsigned{want}));
      }
  return ch;
}

// One-hot tiles: S has its single 1 at (m, n), O at (m, n % 8), the row max is 1 in row m and 0 elsewhere.
inline Check check_tile_onehot(MmaType t, const TileResults& r) {
  Check ch{std::string("attention tile one-hot ") + mma_type_name(t)};
  if (r.s.size() != static_cast<std::size_t>(kTileOnehotCases) * kTileS) {
    ch.fail("wrong result size");
    return ch;
  }
  for (int c = 0; c < kTileOnehotCases; ++c) {
    const int m = c / (kTileDk * kTileKeys), k = (c / kTileKeys) % kTileDk, n = c % kTileKeys;
    ++ch.cases;
    const auto at = [&](const char* what, int i, int j, float got, float want) {
      if (got != want)
        ch.fail(fmt("Q(%d,%d)=1, K(%d,%d)=1: ", m, k, n, k) + what + fmt("(%d,%d) = %g, expected %g", i, j, got, want));
      return got == want;
    };
    bool good = true;
    for (int i = 0; i < kTileRows && good; ++i) {
      for (int j = 0; j < kTileKeys && good; ++j)
        good = at("S", i, j, r.s[c * kTileS + i * kTileKeys + j], (i == m && j == n) ? 1.0f : 0.0f);
      for (int j = 0; j < kTileDv && good; ++j)
        good = at("O", i, j, r.o[c * kTileO + i * kTileDv + j], (i == m && j == n % 8) ? 1.0f : 0.0f);
      if (good) good = at("rowmax", i, 0, r.rowmax[c * kTileStat + i], i == m ? 1.0f : 0.0f);
      if (good) good = at("rowsum", i, 0, r.rowsum[c * kTileStat + i], i == m ? 1.0f : 0.0f);
    }
  }
  return ch;
}

// Random tiles against a scalar computation from the same rounded inputs. S: within 2^-16 of Σ|q·k| of the
// exact sum (the tensor core's accumulation order and precision are unspecified); the row max: exactly the
// max of the returned S row; the row sum and O: from the returned S, P = 2^(S - max) (P rounded to T for O),
// within a tolerance covering one rounding of P to T per term and fp32 sums.
template <MmaType T>
Check check_tile_values(const TileInputs& in, const TileResults& r, bool softmax) {
  Check ch{std::string("attention tile values ") + mma_type_name(T) + (softmax ? " softmax" : " P=S")};
  const double eps_t = T == MmaType::bf16 ? 0x1.0p-8 : 0x1.0p-11;
  for (int c = 0; c < in.cases; ++c) {
    const std::uint16_t* q = in.q.data() + c * kTileRows * kTileDk;
    const std::uint16_t* k = in.k.data() + c * kTileKeys * kTileDk;
    const std::uint16_t* v = in.v.data() + c * kTileKeys * kTileDv;
    const float* s = r.s.data() + c * kTileS;
    for (int i = 0; i < kTileRows; ++i) {
      float mx = -INFINITY;
      for (int j = 0; j < kTileKeys; ++j) {
        double exact = 0, mag = 0;
        for (int d = 0; d < kTileDk; ++d) {
          const double p = static_cast<double>(from_bits<T>(q[i * kTileDk + d])) * from_bits<T>(k[j * kTileDk + d]);
          exact += p;
          mag += std::fabs(p);
        }
        ++ch.cases;
        const float got = s[i * kTileKeys + j];
        if (!(std::fabs(got - exact) <= 0x1.0p-16 * mag + 1e-30))
          ch.fail(fmt("case %d: S(%d,%d) = %.9g, expected %.9g", c, i, j, got, exact));
        mx = std::max(mx, got);
      }
      ++ch.cases;
      if (r.rowmax[c * kTileStat + i] != mx)
        ch.fail(fmt("case %d: rowmax(%d) = %.9g, expected %.9g", c, i, r.rowmax[c * kTileStat + i], mx));
      double sum = 0, p[kTileKeys];
      for (int j = 0; j < kTileKeys; ++j) {
        p[j] = softmax ? std::exp2(static_cast<double>(s[i * kTileKeys + j]) - mx) : s[i * kTileKeys + j];
        sum += p[j];
      }
      double mag = 0;
      for (int j = 0; j < kTileKeys; ++j) mag += std::fabs(p[j]);
      ++ch.cases;
      if (!(std::fabs(r.rowsum[c * kTileStat + i] - sum) <= 1e-5 * mag + 1e-30))
        ch.fail(fmt("case %d: rowsum(%d) = %.9g, expected %.9g", c, i, r.rowsum[c * kTileStat + i], sum));
      for (int d = 0; d < kTileDv; ++d) {
        double o = 0, omag = 0;
        for (int j = 0; j < kTileKeys; ++j) {
          const double pr = round_to<T>(static_cast<float>(p[j])), vj = from_bits<T>(v[j * kTileDv + d]);
          o += pr * vj;
          omag += std::fabs(p[j] * vj);
        }
        ++ch.cases;
        const float got = r.o[c * kTileO + i * kTileDv + d];
        if (!(std::fabs(got - o) <= 2 * eps_t * omag + 1e-30))
          ch.fail(fmt("case %d: O(%d,%d) = %.9g, expected %.9g", c, i, d, got, o));
      }
    }
  }
  return ch;
}

// Two runs of the same tiles (the host model and the device) agree within the sum tolerance of S.
inline Check check_tiles_agree(const std::string& name, const TileResults& a, const TileResults& b) {
  Check ch{name};
  if (a.s.size() != b.s.size() || a.o.size() != b.o.size()) {
    ch.fail("different result sizes");
    return ch;
  }
  const auto cmp = [&](const char* what, const std::vector<float>& x, const std::vector<float>& y, double tol) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      ++ch.cases;
      if (!(std::fabs(x[i] - y[i]) <= tol * (1 + std::fabs(y[i]))))
        ch.fail(std::string(what) + fmt("[%zu] = %.9g vs %.9g", i, x[i], y[i]));
    }
  };
  cmp("S", a.s, b.s, 1e-4);
  cmp("O", a.o, b.o, 2e-2);
  return ch;
}

}  // namespace attn::cuda::selftest
