// attn/rotary.h: apply_rotary against a rotation written out in double, the KV caches' rotating appends against
// appending keys turned beforehand, and MultiHeadAttention::forward_cached with a rotary embedding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/mha.h"
#include "attn/rotary.h"
#include "core/convert.h"

namespace attn {
namespace {

// Angles θ[p][i] = p · 10000^(-2i / rotary_dim) (the usual RoPE frequencies), cos and sin rounded to f32.
struct Tables {
  std::vector<float> cos, sin;
  std::int64_t positions, half;
  Rotary rotary(bool interleaved) const {
    Rotary r;
    r.cos = TensorView::contiguous(cos.data(), DType::f32, {positions, half});
    r.sin = TensorView::contiguous(sin.data(), DType::f32, {positions, half});
    r.interleaved = interleaved;
    return r;
  }
};
Tables tables(std::int64_t positions, std::int64_t half) {
  Tables t{std::vector<float>(positions * half), std::vector<float>(positions * half), positions, half};
  for (std::int64_t p = 0; p < positions; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / (2.0 * half));
      t.cos[p * half + i] = static_cast<float>(std::cos(theta));
      t.sin[p * half + i] = static_cast<float>(std::sin(theta));
    }
  return t;
}

// The rotation of one row in double, from the f32 tables: pairs (2i, 2i+1) or (i, i + half).
std::vector<double> turned(const std::vector<double>& x, const Tables& t, std::int64_t p, bool interleaved) {
  std::vector<double> y = x;
  for (std::int64_t i = 0; i < t.half; ++i) {
    const std::int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + t.half;
    const double c = t.cos[p * t.half + i], s = t.sin[p * t.half + i];
    y[a] = x[a] * c - x[b] * s;
    y[b] = x[a] * s + x[b] * c;
  }
  return y;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(Rotary, MatchesTheRotationInDouble) {
  const std::int64_t B = 2, H = 3, T = 5, D = 40, p0 = 7;
  for (const std::int64_t half : {std::int64_t{20}, std::int64_t{8}})  // whole head, and rotary_dim 16 < 40
    for (const bool interleaved : {false, true}) {
      SCOPED_TRACE("half " + std::to_string(half) + (interleaved ? " interleaved" : " half-split"));
      const Tables t = tables(16, half);
      const std::vector<float> x0 = random_floats(B * H * T * D, 3);
      std::vector<float> x = x0;
      // BSHD memory, seen as [B, H, T, D]: strides are the caller's business.
      const TensorView view = TensorView::bshd(x.data(), DType::f32, B, T, H, D);
      ASSERT_TRUE(apply_rotary(view, t.rotary(interleaved), p0).ok());
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t s = 0; s < T; ++s) {
            const std::int64_t at = ((b * T + s) * H + h) * D;
            const std::vector<double> row(x0.begin() + at, x0.begin() + at + D);
            const std::vector<double> want = turned(row, t, p0 + s, interleaved);
            for (std::int64_t d = 0; d < D; ++d)
              EXPECT_NEAR(x[at + d], want[d], 1e-6 * (1 + std::fabs(want[d]))) << b << " " << h << " " << s << " " << d;
          }
    }
}

TEST(Rotary, Bf16RoundsOnce) {
  const std::int64_t D = 32;
  const Tables t = tables(4, 16);
  const std::vector<float> x0 = random_floats(D, 5);
  std::vector<core::bf16> x(D);
  for (std::int64_t d = 0; d < D; ++d) x[d] = core::from_float<core::bf16>(x0[d]);
  ASSERT_TRUE(apply_rotary(TensorView::contiguous(x.data(), DType::bf16, {1, 1, 1, D}), t.rotary(true), 3).ok());
  std::vector<double> row(D);
  for (std::int64_t d = 0; d < D; ++d) row[d] = core::to_float(core::from_float<core::bf16>(x0[d]));
  const std::vector<double> want = turned(row, t, 3, true);
  for (std::int64_t d = 0; d < D; ++d)  // fp32 arithmetic, one rounding to bf16: within one bf16 ulp
    EXPECT_NEAR(core::to_float(x[d]), want[d], std::ldexp(std::fabs(want[d]), -7) + 1e-30) << d;
}

TEST(Rotary, BadInputNamesTheParameterAndWritesNothing) {
  const Tables t = tables(8, 4);
  std::vector<float> x = random_floats(2 * 3 * 16, 7);
  const std::vector<float> before = x;
  const TensorView view = TensorView::contiguous(x.data(), DType::f32, {1, 2, 3, 16});
  auto message = [&](const Rotary& r, std::int64_t p0) { return apply_rotary(view, r, p0).message(); };
  EXPECT_NE(message(t.rotary(false), 6).find("rotary.cos"), std::string::npos);  // positions 6..8 of 8
  EXPECT_NE(message(t.rotary(false), -1).find("position0"), std::string::npos);
  Rotary wide = t.rotary(false);
  const Tables big = tables(8, 9);  // rotary_dim 18 > 16
  wide = big.rotary(false);
  EXPECT_NE(message(wide, 0).find("rotary_dim 18"), std::string::npos);
  Rotary odd = t.rotary(false);
  odd.sin.shape[1] = 3;
  EXPECT_NE(message(odd, 0).find("rotary.sin"), std::string::npos);
  Rotary f16 = t.rotary(false);
  f16.cos.dtype = DType::f16;
  EXPECT_NE(message(f16, 0).find("expected f32"), std::string::npos);
  EXPECT_EQ(std::memcmp(x.data(), before.data(), x.size() * sizeof(float)), 0);
}

// Appending with a rotary embedding stores exactly what appending keys turned beforehand stores (positions
// continuing across appends), in every storage dtype (i8 scales taken after the turn); values untouched.
TEST(Rotary, CachesTurnKeysAsTheyAreWritten) {
  const std::int64_t Hkv = 2, D = 16, Dv = 8;
  const Tables t = tables(32, 6);  // rotary_dim 12 < 16
  for (const DType dtype : {DType::f32, DType::bf16, DType::i8})
    for (const bool interleaved : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (interleaved ? " interleaved" : " half-split"));
      KVCache turned_cache, plain_cache;
      ASSERT_TRUE(KVCache::create(Hkv, D, Dv, 20, dtype, &turned_cache).ok());
      ASSERT_TRUE(KVCache::create(Hkv, D, Dv, 20, dtype, &plain_cache).ok());
      PagedKVCache paged;
      ASSERT_TRUE(PagedKVCache::create(Hkv, D, Dv, 3, 8, dtype, &paged).ok());
      const std::int64_t id = paged.add_sequence();
      std::int64_t pos = 0;
      for (const std::int64_t n : {3, 1, 5}) {
        std::vector<float> k = random_floats(Hkv * n * D, 11 + n), v = random_floats(Hkv * n * Dv, 21 + n);
        const TensorView kv = TensorView::contiguous(k.data(), DType::f32, {1, Hkv, n, D});
        const TensorView vv = TensorView::contiguous(v.data(), DType::f32, {1, Hkv, n, Dv});
        ASSERT_TRUE(turned_cache.append(kv, vv, t.rotary(interleaved)).ok());
        ASSERT_TRUE(paged.append(id, kv, vv, t.rotary(interleaved)).ok());
        std::vector<float> k_turned = k;
        ASSERT_TRUE(apply_rotary(TensorView::contiguous(k_turned.data(), DType::f32, {1, Hkv, n, D}),
                                 t.rotary(interleaved), pos)
                        .ok());
        ASSERT_TRUE(plain_cache.append(TensorView::contiguous(k_turned.data(), DType::f32, {1, Hkv, n, D}), vv).ok());
        if (dtype == DType::f32) {  // the stored rows against the rotation written out in double, too
          const TensorView keys = turned_cache.keys();
          for (std::int64_t h = 0; h < Hkv; ++h)
            for (std::int64_t s = 0; s < n; ++s) {
              const std::vector<double> row(k.begin() + (h * n + s) * D, k.begin() + (h * n + s + 1) * D);
              const std::vector<double> want = turned(row, t, pos + s, interleaved);
              for (std::int64_t e = 0; e < D; ++e)
                EXPECT_NEAR(static_cast<const float*>(keys.data)[h * keys.strides[1] + (pos + s) * keys.strides[2] + e],
                            want[e], 1e-6 * (1 + std::fabs(want[e])));
            }
        }
        pos += n;
      }
      const std::size_t es = dtype_size(dtype);
      const TensorView a = turned_cache.keys(), b = plain_cache.keys();
      for (std::int64_t h = 0; h < Hkv; ++h)  // row by row: the storage's capacity lies between heads
        EXPECT_EQ(std::memcmp(static_cast<const char*>(a.data) + h * a.strides[1] * es,
                              static_cast<const char*>(b.data) + h * b.strides[1] * es, pos * D * es),
                  0)
            << "head " << h;
      if (dtype == DType::i8)
        for (std::int64_t h = 0; h < Hkv; ++h)
          for (std::int64_t s = 0; s < pos; ++s)
            EXPECT_EQ(static_cast<const float*>(turned_cache.k_scales().data)[h * turned_cache.k_scales().strides[1] + s],
                      static_cast<const float*>(plain_cache.k_scales().data)[h * plain_cache.k_scales().strides[1] + s]);
      // The paged sequence holds the same rows.
      std::vector<std::int32_t> pages;
      ASSERT_TRUE(paged.pages(id, &pages).ok());
      const TensorView kp = paged.k_pages();
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t s = 0; s < pos; ++s) {
          const char* got = static_cast<const char*>(kp.data) +
                            (pages[s / 3] * kp.strides[0] + h * kp.strides[1] + (s % 3) * kp.strides[2]) * es;
          const char* want = static_cast<const char*>(b.data) + (h * b.strides[1] + s * b.strides[2]) * es;
          EXPECT_EQ(std::memcmp(got, want, D * es), 0) << "head " << h << " token " << s;
        }
    }
}

TEST(Rotary, AppendPastTheTablesChangesNothing) {
  const Tables t = tables(4, 4);
  KVCache cache;
  ASSERT_TRUE(KVCache::create(1, 8, 8, 10, &cache).ok());
  std::vector<float> k = random_floats(5 * 8, 1), v = random_floats(5 * 8, 2);
  const Status s = cache.append(TensorView::contiguous(k.data(), DType::f32, {1, 1, 5, 8}),
                                TensorView::contiguous(v.data(), DType::f32, {1, 1, 5, 8}), t.rotary(false));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rotary.cos"), std::string::npos) << s.message();
  EXPECT_EQ(cache.length(), 0);
}

// forward_cached with a rotary embedding: the cached keys are the projected keys turned at their positions; a
// decode in chunks equals one call over all the tokens (the positions continue); the identity rotation (cos 1,
// sin 0) equals the call without one; a real rotation changes the output.
TEST(Rotary, ForwardCachedTurnsQueriesAndKeys) {
  MultiHeadAttention m;
  ASSERT_TRUE(MultiHeadAttention::create({32, 4, 2, 0, 0, true}, &m).ok());
  m.init_random(5);
  const MhaConfig& c = m.config();
  const std::int64_t d = c.d_model, S = 9;
  const Tables t = tables(16, 4);  // rotary_dim 8 of head_dim 8
  const std::vector<float> x = random_floats(S * d, 13);
  auto decode = [&](const std::vector<std::int64_t>& chunks, const Rotary* rotary, KVCache* cache) {
    EXPECT_TRUE(KVCache::create(c.kv_heads, c.head_dim, c.v_head_dim, S, cache).ok());
    std::vector<float> out(S * d, std::numeric_limits<float>::quiet_NaN());
    std::int64_t at = 0;
    for (std::int64_t n : chunks) {
      const TensorView in = TensorView::contiguous(x.data() + at * d, DType::f32, {1, n, d});
      const TensorView o = TensorView::contiguous(out.data() + at * d, DType::f32, {1, n, d});
      const Status s = rotary ? m.forward_cached(in, *cache, o, *rotary) : m.forward_cached(in, *cache, o);
      EXPECT_TRUE(s.ok()) << s.message();
      at += n;
    }
    return out;
  };
  const Rotary r = t.rotary(false);
  KVCache whole, chunked;
  const std::vector<float> a = decode({S}, &r, &whole), b = decode({2, 1, 4, 2}, &r, &chunked);
  for (std::int64_t i = 0; i < S * d; ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * (1 + std::fabs(a[i]))) << i;
  // Queries and keys both turned: scores depend on relative positions only, so shifting every position by 3
  // (the tables seen from their fourth row) changes nothing but rounding. (Turning only the keys would.)
  Rotary shifted = r;
  shifted.cos.data = const_cast<float*>(t.cos.data()) + 3 * t.half, shifted.cos.shape[0] -= 3;
  shifted.sin.data = const_cast<float*>(t.sin.data()) + 3 * t.half, shifted.sin.shape[0] -= 3;
  KVCache moved_cache;
  const std::vector<float> m3 = decode({4, 5}, &shifted, &moved_cache);
  for (std::int64_t i = 0; i < S * d; ++i) EXPECT_NEAR(m3[i], a[i], 1e-4 * (1 + std::fabs(a[i]))) << i;
  // The cached keys: the projection's keys turned at positions 0 .. S-1.
  std::vector<float> q, k, v;
  ASSERT_TRUE(m.project_qkv(TensorView::contiguous(x.data(), DType::f32, {1, S, d}), &q, &k, &v).ok());
  ASSERT_TRUE(apply_rotary(TensorView::bshd(k.data(), DType::f32, 1, S, c.kv_heads, c.head_dim), r, 0).ok());
  const TensorView keys = whole.keys();
  for (std::int64_t h = 0; h < c.kv_heads; ++h)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t e = 0; e < c.head_dim; ++e)
        EXPECT_FLOAT_EQ(static_cast<const float*>(keys.data)[h * keys.strides[1] + s * keys.strides[2] + e],
                        k[(s * c.kv_heads + h) * c.head_dim + e]);
  // Identity rotation = no rotation; a real one differs.
  std::vector<float> ones(16 * 4, 1.0f), zeros(16 * 4, 0.0f);
  Rotary identity;
  identity.cos = TensorView::contiguous(ones.data(), DType::f32, {16, 4});
  identity.sin = TensorView::contiguous(zeros.data(), DType::f32, {16, 4});
  KVCache c1, c2;
  const std::vector<float> same = decode({3, 6}, &identity, &c1), plain = decode({3, 6}, nullptr, &c2);
  double moved = 0;
  for (std::int64_t i = 0; i < S * d; ++i) {
    EXPECT_EQ(same[i], plain[i]) << i;
    moved = std::max(moved, static_cast<double>(std::fabs(a[i] - plain[i])));
  }
  EXPECT_GT(moved, 1e-3);
}

}  // namespace
}  // namespace attn
