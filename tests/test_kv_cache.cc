// KV caches: decode equals recompute (contiguous and paged, MHA/GQA/MQA, page sizes 1, 3, 16),
// batched ragged decode, freed pages never leak into later sequences, errors, and merge_attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/info.h"
#include "attn/kv_cache.h"
#include "support.h"

namespace attn::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Tokens [start, start + len) of a [B, H, S, D] view (all batches), as a view.
TensorView tokens(const TensorView& t, std::int64_t start, std::int64_t len) {
  TensorView s = t;
  s.data = static_cast<float*>(t.data) + start * t.strides[2];
  s.shape[2] = len;
  return s;
}
// Batch row b of a [B, H, S, D] view, as [1, H, S, D].
TensorView batch_row(const TensorView& t, std::int64_t b) {
  TensorView s = t;
  s.data = static_cast<float*>(t.data) + b * t.strides[0];
  s.shape[0] = 1;
  return s;
}

// The fp64 reference and the naive fp32 result of causal attention over whole sequences
// (row i of a causal problem = what a decode step for token i must produce).
struct Refs {
  reference::Result ref, naive;
};
Refs causal_refs(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const Params& extra = {}) {
  Params p = extra;
  p.causal = Causal::bottom_right;
  core::Problem prob;
  const Status s = core::validate(q.view, k.view, v.view, out.view, p, std::nullopt, &prob);
  EXPECT_TRUE(s.ok()) << s.message();
  return {reference::attention<double>(prob), reference::attention<float>(prob)};
}

double atol_for(const std::vector<double>& ref) {
  double m = 1e-3;
  for (double x : ref) m = std::max(m, std::fabs(x));
  return 2 * std::ldexp(1.0, -24) * m;
}

struct Heads {
  std::int64_t hq, hkv;
};
struct DecodeCase {
  Heads heads;
  std::int64_t page_size;  // 0 = contiguous KVCache
  std::int64_t chunk;      // tokens per decode step
};
void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << c.heads.hq << "/" << c.heads.hkv << " heads, page " << c.page_size << ", chunk " << c.chunk;
}
std::string name_of(const ::testing::TestParamInfo<DecodeCase>& info) {
  const DecodeCase& c = info.param;
  const char* kind = c.heads.hkv == c.heads.hq ? "MHA" : c.heads.hkv == 1 ? "MQA" : "GQA";
  return std::string(kind) + "_" + (c.page_size ? "paged" + std::to_string(c.page_size) : std::string("contiguous")) +
         "_chunk" + std::to_string(c.chunk);
}

class DecodeEqualsRecompute : public ::testing::TestWithParam<DecodeCase> {};

// T tokens, `chunk` at a time: the cache's answer for the new tokens, and a full causal attention over
// the whole prefix recomputed at every step (attn::attention, last rows), both agree with the fp64
// reference under the tolerance rule.
TEST_P(DecodeEqualsRecompute, EveryStep) {
  const DecodeCase& c = GetParam();
  const std::int64_t T = 41, Dk = 16, Dv = 12, hq = c.heads.hq, hkv = c.heads.hkv;
  std::mt19937_64 rng(1234 + hq * 7 + hkv + c.page_size * 31 + c.chunk);
  Tensor q(DType::f32, 1, hq, T, Dk), k(DType::f32, 1, hkv, T, Dk), v(DType::f32, 1, hkv, T, Dv);
  q.randomize(rng, 2.0), k.randomize(rng, 2.0), v.randomize(rng);
  Tensor full_out(DType::f32, 1, hq, T, Dv);
  const Refs refs = causal_refs(q, k, v, full_out);

  KVCache contiguous;
  PagedKVCache paged;
  std::int64_t seq = -1, other = -1;
  if (c.page_size == 0) {
    ASSERT_TRUE(KVCache::create(hkv, Dk, Dv, T, &contiguous).ok());
  } else {
    ASSERT_TRUE(PagedKVCache::create(hkv, Dk, Dv, c.page_size, 2 * (T / c.page_size + 2) + 4, &paged).ok());
    // A first sequence fills pages and is removed; its pages are poisoned, then reused by `seq`.
    const std::int64_t gone = paged.add_sequence();
    ASSERT_TRUE(paged.append(gone, tokens(k.view, 0, 9), tokens(v.view, 0, 9)).ok());
    ASSERT_TRUE(paged.remove_sequence(gone).ok());
    seq = paged.add_sequence();
    other = paged.add_sequence();  // grows alongside, so the two sequences' pages interleave
  }
  auto poison_free_pages = [&] {
    const TensorView kp = paged.k_pages(), vp = paged.v_pages();
    for (std::int64_t p = 0; p < paged.num_pages(); ++p)
      if (paged.page_is_free(p)) {
        std::fill_n(static_cast<float*>(kp.data) + p * kp.strides[0], kp.strides[0], kNaN);
        std::fill_n(static_cast<float*>(vp.data) + p * vp.strides[0], vp.strides[0], kNaN);
      }
  };
  if (c.page_size) poison_free_pages();

  std::vector<double> decoded(refs.ref.out.size(), kNaN), recomputed(refs.ref.out.size(), kNaN);
  for (std::int64_t t0 = 0; t0 < T; t0 += c.chunk) {
    const std::int64_t n = std::min(c.chunk, T - t0), len = t0 + n;
    Tensor out(DType::f32, 1, hq, n, Dv);
    out.poison();
    if (c.page_size == 0) {
      ASSERT_TRUE(contiguous.append(tokens(k.view, t0, n), tokens(v.view, t0, n)).ok());
      ASSERT_EQ(contiguous.length(), len);
      const Status s = contiguous.attend(tokens(q.view, t0, n), out.view);
      ASSERT_TRUE(s.ok()) << s.message();
    } else {
      ASSERT_TRUE(paged.append(seq, tokens(k.view, t0, n), tokens(v.view, t0, n)).ok());
      ASSERT_TRUE(paged.append(other, tokens(k.view, 0, 1), tokens(v.view, 0, 1)).ok());
      poison_free_pages();
      const Status s = paged.attend({seq}, tokens(q.view, t0, n), out.view);
      ASSERT_TRUE(s.ok()) << s.message();
    }
    // Recompute: causal attention over the whole prefix, keep the last n rows.
    Tensor full(DType::f32, 1, hq, len, Dv);
    Params p;
    p.causal = Causal::top_left;
    ASSERT_TRUE(attention(tokens(q.view, 0, len), tokens(k.view, 0, len), tokens(v.view, 0, len), full.view, p).ok());
    for (std::int64_t h = 0; h < hq; ++h)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t d = 0; d < Dv; ++d) {
          const std::size_t at = static_cast<std::size_t>((h * T + t0 + i) * Dv + d);
          decoded[at] = out.get(0, h, i, d);
          recomputed[at] = full.get(0, h, t0 + i, d);
        }
  }
  const double atol = atol_for(refs.ref.out);
  auto naive = [&](std::size_t i) { return static_cast<double>(static_cast<float>(refs.naive.out[i])); };
  const Agreement a = agree(refs.ref.out, [&](std::size_t i) { return decoded[i]; }, naive, atol);
  EXPECT_TRUE(a.ok()) << "decode: " << a.describe();
  const Agreement b = agree(refs.ref.out, [&](std::size_t i) { return recomputed[i]; }, naive, atol);
  EXPECT_TRUE(b.ok()) << "recompute: " << b.describe();
  double gap = 0;
  for (std::size_t i = 0; i < decoded.size(); ++i) gap = std::max(gap, std::fabs(decoded[i] - recomputed[i]));
  EXPECT_LE(gap, 2 * a.naive_err + 2 * atol) << "decode vs recompute";
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  for (Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{4, 1}})
    for (std::int64_t page : {0, 1, 3, 16})
      for (std::int64_t chunk : {1, 3}) cases.push_back({h, page, chunk});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Caches, DecodeEqualsRecompute, ::testing::ValuesIn(decode_cases()), name_of);

// Caches stored in bf16, f16, i8 and i4. Every appended value is stored rounded once (bf16/f16: to nearest; i8 and
// i4: within half a step of its scale, max|x| / 127 per row or max|x| / 7 per block of 32); every decode step of a contiguous and of a paged cache (page 3,
// sequences interleaved) agrees with the fp64 reference over the values the cache holds, under the tolerance rule;
// against the exact (unrounded) values the error is what the storage costs, bounded loosely here and reported.
class StorageDtype : public ::testing::TestWithParam<DType> {};

TEST_P(StorageDtype, StoresRoundedValuesAndDecodesThem) {
  const DType dt = GetParam();
  const std::int64_t T = 37, Dk = 64, Dv = 48, hq = 8, hkv = 2, chunk = 3;
  std::mt19937_64 rng(77 + static_cast<int>(dt));
  Tensor q(DType::f32, 1, hq, T, Dk), k(DType::f32, 1, hkv, T, Dk), v(DType::f32, 1, hkv, T, Dv);
  q.randomize(rng, 2.0), k.randomize(rng, 2.0), v.randomize(rng);
  for (std::int64_t d = 0; d < Dk; ++d) k.set(0.0, 0, 1, 5, d);  // an all-zero row: scale 0
  Tensor full_out(DType::f32, 1, hq, T, Dv);
  const Refs exact = causal_refs(q, k, v, full_out);

  KVCache cache;
  PagedKVCache paged;
  ASSERT_TRUE(KVCache::create(hkv, Dk, Dv, T, dt, &cache).ok());
  ASSERT_TRUE(PagedKVCache::create(hkv, Dk, Dv, 3, 2 * (T / 3 + 2), dt, &paged).ok());
  EXPECT_EQ(cache.dtype(), dt);
  EXPECT_EQ(paged.dtype(), dt);
  const std::int64_t seq = paged.add_sequence(), other = paged.add_sequence();
  double storage_err = 0, out_max = 0;
  for (std::int64_t t0 = 0; t0 < T; t0 += chunk) {
    const std::int64_t n = std::min(chunk, T - t0), len = t0 + n;
    ASSERT_TRUE(cache.append(tokens(k.view, t0, n), tokens(v.view, t0, n)).ok());
    ASSERT_TRUE(paged.append(seq, tokens(k.view, t0, n), tokens(v.view, t0, n)).ok());
    ASSERT_TRUE(paged.append(other, tokens(k.view, 0, 1), tokens(v.view, 0, 1)).ok());  // pages interleave
    // The reference over what the cache holds.
    Params p;
    p.causal = Causal::bottom_right;
    if (dt == DType::i8 || dt == DType::i4) p.k_scale = cache.k_scales(), p.v_scale = cache.v_scales();
    Tensor out(DType::f32, 1, hq, n, Dv), pout(DType::f32, 1, hq, n, Dv);
    core::Problem prob;
    ASSERT_TRUE(core::validate(tokens(q.view, t0, n), cache.keys(), cache.values(), out.view, p, std::nullopt, &prob).ok());
    const reference::Result ref = reference::attention<double>(prob), naive = reference::attention<float>(prob);
    out.poison(), pout.poison();
    ASSERT_TRUE(cache.attend(tokens(q.view, t0, n), out.view).ok());
    ASSERT_TRUE(paged.attend({seq}, tokens(q.view, t0, n), pout.view).ok());
    std::vector<double> got, pgot;
    out.for_each_index([&](auto b, auto h, auto i, auto d) { got.push_back(out.get(b, h, i, d)); });
    pout.for_each_index([&](auto b, auto h, auto i, auto d) { pgot.push_back(pout.get(b, h, i, d)); });
    const double atol = atol_for(ref.out);
    auto nv = [&](std::size_t i) { return static_cast<double>(static_cast<float>(naive.out[i])); };
    const Agreement a = agree(ref.out, [&](std::size_t i) { return got[i]; }, nv, atol);
    EXPECT_TRUE(a.ok()) << "contiguous, step at " << t0 << ": " << a.describe();
    const Agreement b = agree(ref.out, [&](std::size_t i) { return pgot[i]; }, nv, atol);
    EXPECT_TRUE(b.ok()) << "paged, step at " << t0 << ": " << b.describe();
    for (std::int64_t h = 0; h < hq; ++h)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t d = 0; d < Dv; ++d) {
          const double e = exact.ref.out[static_cast<std::size_t>((h * T + t0 + i) * Dv + d)];
          storage_err = std::max(storage_err, std::fabs(out.get(0, h, i, d) - e));
          out_max = std::max(out_max, std::fabs(e));
        }
    ASSERT_EQ(cache.length(), len);
  }
  // Stored values: rounded once (i8: scale max|x| / 127 per row; i4: max|x| / 7 per block of kI4Block values).
  const TensorView ks = cache.keys();
  const bool i4 = dt == DType::i4;
  const std::int64_t block = i4 ? kI4Block : Dk, blocks = (Dk + block - 1) / block;
  for (std::int64_t h = 0; h < hkv; ++h)
    for (std::int64_t j = 0; j < T; ++j)
      for (std::int64_t d0 = 0; d0 < Dk; d0 += block) {
        float amax = 0;
        for (std::int64_t d = d0; d < std::min(Dk, d0 + block); ++d)
          amax = std::max(amax, std::fabs(static_cast<float>(k.get(0, h, j, d))));
        const bool quantised = dt == DType::i8 || i4;
        const float scale =
            quantised ? static_cast<const float*>(cache.k_scales().data)[(h * T + j) * blocks + d0 / block] : 1.0f;
        if (quantised) EXPECT_EQ(scale, amax / (i4 ? 7.0f : 127.0f)) << "row " << h << ", " << j << ", block " << d0;
        for (std::int64_t d = d0; d < std::min(Dk, d0 + block); ++d) {
          const float x = static_cast<float>(k.get(0, h, j, d));
          const std::int64_t off = h * ks.strides[1] + j * ks.strides[2] + d;
          switch (dt) {
            case DType::bf16:
              EXPECT_EQ(static_cast<const core::bf16*>(ks.data)[off].bits, core::from_float<core::bf16>(x).bits);
              break;
            case DType::f16:
              EXPECT_EQ(static_cast<const core::f16*>(ks.data)[off].bits, core::from_float<core::f16>(x).bits);
              break;
            default: {
              const double q = i4 ? core::q4_at(ks.data, off)
                                  : static_cast<const std::int8_t*>(ks.data)[off];
              ASSERT_LE(std::fabs(scale * q - x), 0.5 * scale * (1 + 1e-6) + 1e-30)
                  << "row " << h << ", " << j << ", " << d;
            }
          }
        }
      }
  // What the storage costs against the exact values (recorded; the bound is loose: |v| <= 1, |q·k| up to ~100).
  const double bound = dt == DType::i4 ? 0.3 : dt == DType::i8 ? 0.02 : dt == DType::bf16 ? 0.01 : 0.002;
  EXPECT_LE(storage_err, bound * out_max) << "max |out - exact| = " << storage_err;
  RecordProperty("max_abs_error_vs_exact", std::to_string(storage_err));
  std::printf("[ storage %s ] max |out - exact fp64| = %.3g (max |out| %.3g)\n", dtype_name(dt), storage_err, out_max);
}

INSTANTIATE_TEST_SUITE_P(Caches, StorageDtype, ::testing::Values(DType::bf16, DType::f16, DType::i8, DType::i4),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

TEST(KVCacheI8, RefusesNonFiniteValuesAndUnknownDtypes) {
  KVCache cache;
  ASSERT_TRUE(KVCache::create(2, 8, 8, 4, DType::i8, &cache).ok());
  Tensor k(DType::f32, 1, 2, 2, 8), v(DType::f32, 1, 2, 2, 8);
  std::mt19937_64 rng(5);
  k.randomize(rng), v.randomize(rng);
  v.set(std::numeric_limits<double>::infinity(), 0, 1, 1, 3);
  const Status s = cache.append(k.view, v.view);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.param(), "v") << s.message();
  EXPECT_NE(s.message().find("expected finite"), std::string::npos) << s.message();
  EXPECT_EQ(cache.length(), 0);
  KVCache bad;
  const Status d = KVCache::create(2, 8, 8, 4, DType::i32, &bad);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.param(), "dtype") << d.message();
  PagedKVCache pbad;
  EXPECT_EQ(PagedKVCache::create(2, 8, 8, 4, 4, DType::boolean, &pbad).param(), "dtype");
  // attend() passes the cache's own scales: the caller's are refused.
  v.set(0.5, 0, 1, 1, 3);
  ASSERT_TRUE(cache.append(k.view, v.view).ok());
  Tensor q(DType::f32, 1, 2, 1, 8), out(DType::f32, 1, 2, 1, 8);
  q.randomize(rng);
  Params p = decode_params();
  p.k_scale = cache.k_scales();
  EXPECT_EQ(cache.attend(q.view, out.view, p).param(), "k_scale");
}

// D3 in miniature: many sequences of ragged lengths decoded in one call, one or two new tokens each.
TEST(PagedKVCache, BatchedRaggedDecode) {
  for (std::int64_t page : {1, 3, 16}) {
    for (std::int64_t n_new : {1, 2}) {
      SCOPED_TRACE("page " + std::to_string(page) + ", tokens " + std::to_string(n_new));
      const std::vector<std::int64_t> lens = {2, 7, 16, 17, 113, 203};
      const std::int64_t B = static_cast<std::int64_t>(lens.size()), hq = 8, hkv = 2, Dk = 32, Dv = 32, S = 203;
      std::mt19937_64 rng(99 + page * 3 + n_new);
      Tensor k(DType::f32, B, hkv, S, Dk), v(DType::f32, B, hkv, S, Dv), q(DType::f32, B, hq, n_new, Dk);
      k.randomize(rng, 2.0), v.randomize(rng), q.randomize(rng, 2.0);
      PagedKVCache cache;
      std::int64_t pages = 0;
      for (std::int64_t n : lens) pages += (n + page - 1) / page;
      ASSERT_TRUE(PagedKVCache::create(hkv, Dk, Dv, page, pages + 3, &cache).ok());
      std::vector<std::int64_t> ids;
      for (std::int64_t b = 0; b < B; ++b) ids.push_back(cache.add_sequence());
      // Interleaved appends in uneven chunks, so every sequence's pages are scattered over the pool.
      std::vector<std::int64_t> done(lens.size(), 0);
      for (bool more = true; more;) {
        more = false;
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t n = std::min<std::int64_t>(1 + (done[b] % 5), lens[b] - done[b]);
          if (n <= 0) continue;
          ASSERT_TRUE(cache.append(ids[b], tokens(batch_row(k.view, b), done[b], n), tokens(batch_row(v.view, b), done[b], n)).ok());
          done[b] += n;
          more = true;
        }
      }
      Tensor out(DType::f32, B, hq, n_new, Dv), lse = Tensor::plain(DType::f32, {B, hq, n_new});
      out.poison(), lse.poison();
      // ids in a shuffled order: row b of q belongs to ids[order[b]].
      std::vector<std::int64_t> order = {3, 0, 5, 1, 4, 2}, shuffled;
      for (std::int64_t b : order) shuffled.push_back(ids[b]);
      const Status s = cache.attend(shuffled, q.view, out.view, decode_params(), lse.view);
      ASSERT_TRUE(s.ok()) << s.message();
      // Reference: each sequence on its own, keys 0..len-1, bottom-right causal.
      Tensor kv_lens = Tensor::plain(DType::i64, {B});
      for (std::int64_t b = 0; b < B; ++b) kv_lens.set(static_cast<double>(lens[order[b]]), b);
      Tensor ks(DType::f32, B, hkv, S, Dk), vs(DType::f32, B, hkv, S, Dv);
      ks.for_each_index([&](auto b, auto h, auto j, auto d) { ks.set(k.get(order[b], h, j, d), b, h, j, d); });
      vs.for_each_index([&](auto b, auto h, auto j, auto d) { vs.set(v.get(order[b], h, j, d), b, h, j, d); });
      Params p;
      p.kv_lens = kv_lens.view;
      Tensor ref_out(DType::f32, B, hq, n_new, Dv);
      const Refs refs = causal_refs(q, ks, vs, ref_out, p);
      std::vector<double> got;
      out.for_each_index([&](auto a, auto b, auto c, auto d) { got.push_back(out.get(a, b, c, d)); });
      const Agreement a = agree(refs.ref.out, [&](std::size_t i) { return got[i]; },
                                [&](std::size_t i) { return static_cast<double>(static_cast<float>(refs.naive.out[i])); },
                                atol_for(refs.ref.out));
      EXPECT_TRUE(a.ok()) << a.describe();
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < hq; ++h)
          for (std::int64_t i = 0; i < n_new; ++i) {
            const double r = refs.ref.lse[static_cast<std::size_t>((b * hq + h) * n_new + i)];
            EXPECT_NEAR(lse.get(b, h, i), r, 1e-5 * std::max(1.0, std::fabs(r)));
          }
    }
  }
}

// A page freed by one sequence and reused by another: the old contents (here NaN) never matter,
// including the unused slots of the new sequence's last page.
TEST(PagedKVCache, FreedPagesNeverLeak) {
  const std::int64_t hkv = 2, hq = 4, D = 8, page = 4;
  std::mt19937_64 rng(5);
  Tensor k(DType::f32, 1, hkv, 30, D), v(DType::f32, 1, hkv, 30, D), q(DType::f32, 1, hq, 1, D);
  k.randomize(rng), v.randomize(rng), q.randomize(rng);
  PagedKVCache cache;
  ASSERT_TRUE(PagedKVCache::create(hkv, D, D, page, 8, &cache).ok());
  const std::int64_t a = cache.add_sequence();
  ASSERT_TRUE(cache.append(a, tokens(k.view, 0, 30), tokens(v.view, 0, 30)).ok());
  EXPECT_EQ(cache.free_pages(), 0);
  std::vector<std::int32_t> a_pages;
  ASSERT_TRUE(cache.pages(a, &a_pages).ok());
  ASSERT_TRUE(cache.remove_sequence(a).ok());
  EXPECT_EQ(cache.free_pages(), 8);
  std::fill_n(static_cast<float*>(cache.k_pages().data), 8 * hkv * page * D, kNaN);
  std::fill_n(static_cast<float*>(cache.v_pages().data), 8 * hkv * page * D, kNaN);

  const std::int64_t b = cache.add_sequence();
  EXPECT_NE(b, a);
  ASSERT_TRUE(cache.append(b, tokens(k.view, 3, 5), tokens(v.view, 3, 5)).ok());  // 5 tokens: 2 pages, 3 NaN slots
  std::vector<std::int32_t> b_pages;
  ASSERT_TRUE(cache.pages(b, &b_pages).ok());
  ASSERT_EQ(b_pages.size(), 2u);
  EXPECT_NE(std::find(a_pages.begin(), a_pages.end(), b_pages[0]), a_pages.end()) << "expected a reused page";
  Tensor out(DType::f32, 1, hq, 1, D);
  out.poison();
  ASSERT_TRUE(cache.attend({b}, q.view, out.view).ok());
  Tensor ref(DType::f32, 1, hq, 1, D);
  ASSERT_TRUE(attention(q.view, tokens(k.view, 3, 5), tokens(v.view, 3, 5), ref.view).ok());
  out.for_each_index([&](auto x, auto y, auto z, auto w) {
    ASSERT_TRUE(std::isfinite(out.get(x, y, z, w)));
    EXPECT_NEAR(out.get(x, y, z, w), ref.get(x, y, z, w), 1e-5);
  });
}

TEST(KVCache, ErrorsLeaveTheCacheUnchanged) {
  std::mt19937_64 rng(7);
  Tensor k(DType::f32, 1, 2, 5, 8), v(DType::f32, 1, 2, 5, 8), q(DType::f32, 1, 4, 1, 8), out(DType::f32, 1, 4, 1, 8);
  k.randomize(rng), v.randomize(rng), q.randomize(rng);
  KVCache cache;
  EXPECT_FALSE(KVCache::create(0, 8, 8, 4, &cache).ok());
  EXPECT_FALSE(KVCache::create(2, 8, 8, 0, &cache).ok());
  ASSERT_TRUE(KVCache::create(2, 8, 8, 4, &cache).ok());
  ASSERT_TRUE(cache.append(tokens(k.view, 0, 3), tokens(v.view, 0, 3)).ok());
  Status s = cache.append(tokens(k.view, 0, 2), tokens(v.view, 0, 2));  // 3 + 2 > 4
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("at most 1"), std::string::npos) << s.message();
  EXPECT_EQ(cache.length(), 3);
  Tensor k3(DType::f32, 1, 3, 1, 8);  // wrong head count
  s = cache.append(k3.view, tokens(v.view, 0, 1));
  EXPECT_NE(s.message().find("expected Hkv = 2"), std::string::npos) << s.message();
  s = cache.append(tokens(k.view, 0, 1), tokens(v.view, 0, 2));
  EXPECT_NE(s.message().find("token count 2; expected 1"), std::string::npos) << s.message();
  EXPECT_EQ(cache.length(), 3);
  EXPECT_FALSE(cache.truncate(4).ok());
  ASSERT_TRUE(cache.truncate(1).ok());
  EXPECT_EQ(cache.length(), 1);
  KVCache empty;
  EXPECT_FALSE(empty.attend(q.view, out.view).ok());
}

TEST(PagedKVCache, ErrorsLeaveTheCacheUnchanged) {
  std::mt19937_64 rng(8);
  Tensor k(DType::f32, 1, 2, 9, 8), v(DType::f32, 1, 2, 9, 8), q(DType::f32, 2, 4, 1, 8), out(DType::f32, 2, 4, 1, 8);
  k.randomize(rng), v.randomize(rng), q.randomize(rng);
  PagedKVCache cache;
  EXPECT_FALSE(PagedKVCache::create(2, 8, 8, 0, 4, &cache).ok());
  ASSERT_TRUE(PagedKVCache::create(2, 8, 8, 2, 4, &cache).ok());
  const std::int64_t a = cache.add_sequence(), b = cache.add_sequence();
  ASSERT_TRUE(cache.append(a, tokens(k.view, 0, 5), tokens(v.view, 0, 5)).ok());  // 3 pages
  Status s = cache.append(b, tokens(k.view, 0, 3), tokens(v.view, 0, 3));         // needs 2, 1 free
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("needs 2 more pages"), std::string::npos) << s.message();
  std::int64_t len = -1;
  ASSERT_TRUE(cache.length(b, &len).ok());
  EXPECT_EQ(len, 0);
  EXPECT_EQ(cache.free_pages(), 1);
  s = cache.append(42, tokens(k.view, 0, 1), tokens(v.view, 0, 1));
  EXPECT_NE(s.message().find("id 42 does not exist"), std::string::npos) << s.message();
  ASSERT_TRUE(cache.remove_sequence(a).ok());
  EXPECT_FALSE(cache.remove_sequence(a).ok());
  EXPECT_FALSE(cache.length(a, &len).ok());
  EXPECT_EQ(cache.free_pages(), 4);
  ASSERT_TRUE(cache.append(b, tokens(k.view, 0, 3), tokens(v.view, 0, 3)).ok());
  s = cache.attend({a, b}, q.view, out.view);  // a was removed
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.message();
  s = cache.attend({b, b}, q.view, out.view);
  EXPECT_NE(s.message().find("appears twice"), std::string::npos) << s.message();
  s = cache.attend({b}, q.view, out.view);  // q has 2 rows for 1 id
  EXPECT_NE(s.message().find("expected 1"), std::string::npos) << s.message();
}

// ---- attend's errors name the caller's arguments and the cache, never attention_paged's ----------------

// True when every float of `data` is still NaN (nothing was written).
bool untouched(const std::vector<float>& data) {
  return std::all_of(data.begin(), data.end(), [](float x) { return std::isnan(x); });
}

// The message names none of attention_paged's parameters, which are the cache's, not the caller's.
void expect_no_paged_names(const Status& s) {
  for (const char* name : {"k_pages", "v_pages", "page_table", "seq_lens"})
    EXPECT_EQ(s.message().find(name), std::string::npos) << s.message();
}

struct Expected {
  const char* what;
  Status status;
  const char* message;  // the whole message, or its start when it ends in "..."
};

void expect_errors(const std::vector<Expected>& cases, const std::vector<float>& out, const std::vector<float>& lse) {
  for (const Expected& e : cases) {
    SCOPED_TRACE(e.what);
    EXPECT_EQ(e.status.code(), StatusCode::invalid_argument) << e.status.message();
    const std::string want = e.message;
    if (want.size() > 3 && want.compare(want.size() - 3, 3, "...") == 0)
      EXPECT_EQ(e.status.message().rfind(want.substr(0, want.size() - 3), 0), 0u) << e.status.message();
    else
      EXPECT_EQ(e.status.message(), want);
    expect_no_paged_names(e.status);
    EXPECT_TRUE(untouched(out)) << "out written on error";
    EXPECT_TRUE(untouched(lse)) << "lse written on error";
  }
}

TEST(KVCache, AttendChecksQOutLseAgainstTheCache) {
  std::mt19937_64 rng(21);
  Tensor k(DType::f32, 1, 2, 5, 8), v(DType::f32, 1, 2, 5, 6);
  k.randomize(rng), v.randomize(rng);
  KVCache cache;
  ASSERT_TRUE(KVCache::create(2, 8, 6, 16, &cache).ok());
  ASSERT_TRUE(cache.append(k.view, v.view).ok());
  std::vector<float> q(2 * 4 * 3 * 8, 0.5f), out(2 * 4 * 3 * 8, kNaN), lse(2 * 4 * 3, kNaN);
  const auto view = [](std::vector<float>& d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(d.data(), DType::f32, shape);
  };
  const TensorView q1 = view(q, {1, 4, 3, 8}), o1 = view(out, {1, 4, 3, 6}), l1 = view(lse, {1, 4, 3});
  Params with_lens = decode_params();
  std::int64_t lens[1] = {5};
  with_lens.kv_lens = TensorView::contiguous(lens, DType::i64, {1});
  expect_errors(
      {{"rank", cache.attend(view(q, {4, 3, 8}), o1), "q: rank 3; expected rank 4 [B, Hq, T, Dk]"},
       {"batch", cache.attend(view(q, {2, 4, 3, 8}), o1), "q: batch 2; expected 1 (one sequence)"},
       {"head dim", cache.attend(view(q, {1, 4, 3, 7}), o1), "q: head dim 7; expected Dk = 8 (the cache's head_dim)"},
       {"heads", cache.attend(view(q, {1, 3, 3, 8}), o1),
        "q: heads 3; expected a positive multiple of Hkv = 2 (the cache's kv_heads)"},
       {"no heads", cache.attend(view(q, {1, 0, 3, 8}), o1), "q: heads 0; expected a positive multiple of Hkv = 2..."},
       {"out rank", cache.attend(q1, view(out, {4, 3, 6})), "out: rank 3; expected rank 4 [1, 4, 3, 6] ([B, Hq, T, Dv])"},
       {"out dv", cache.attend(q1, view(out, {1, 4, 3, 8})),
        "out: shape [1, 4, 3, 8]; expected [1, 4, 3, 6] ([B, Hq, T, Dv], Dv = 6 the cache's v_head_dim)"},
       {"out tokens", cache.attend(q1, view(out, {1, 4, 2, 6})), "out: shape [1, 4, 2, 6]; expected [1, 4, 3, 6]..."},
       {"lse rank", cache.attend(q1, o1, decode_params(), view(lse, {4, 3})),
        "lse: rank 2; expected rank 3 [1, 4, 3] ([B, Hq, T])"},
       {"lse shape", cache.attend(q1, o1, decode_params(), view(lse, {1, 2, 3})),
        "lse: shape [1, 2, 3]; expected [1, 4, 3] ([B, Hq, T])"},
       {"kv_lens", cache.attend(q1, o1, with_lens), "kv_lens: is set; expected it empty (the cache knows each..."}},
      out, lse);

  // Errors attention_paged finds in what the cache checks do not: named as the caller knows them.
  TensorView into_cache = o1;  // out over the cache's own keys
  into_cache.data = cache.keys().data;
  Status s = cache.attend(q1, into_cache);
  EXPECT_EQ(s.message(), "out: memory overlaps input cache; expected a separate buffer");
  Params bad_scale = decode_params();
  bad_scale.scale = -1.0;
  s = cache.attend(q1, o1, bad_scale);
  EXPECT_EQ(s.message().rfind("scale: is -1", 0), 0u) << s.message();
  TensorView qi = q1;
  qi.dtype = DType::i32;
  s = cache.attend(qi, o1);
  EXPECT_EQ(s.message().rfind("q: dtype i32; expected f32, bf16 or f16", 0), 0u) << s.message();
  EXPECT_TRUE(untouched(out) && untouched(lse));
  ASSERT_TRUE(cache.attend(q1, o1, decode_params(), l1).ok());
  EXPECT_FALSE(untouched(out));
}

TEST(PagedKVCache, AttendChecksQOutLseAgainstTheCache) {
  std::mt19937_64 rng(22);
  Tensor k(DType::f32, 1, 2, 5, 8), v(DType::f32, 1, 2, 5, 6);
  k.randomize(rng), v.randomize(rng);
  PagedKVCache cache;
  ASSERT_TRUE(PagedKVCache::create(2, 8, 6, 2, 8, &cache).ok());
  const std::int64_t a = cache.add_sequence(), b = cache.add_sequence();
  ASSERT_TRUE(cache.append(a, k.view, v.view).ok());
  ASSERT_TRUE(cache.append(b, tokens(k.view, 0, 3), tokens(v.view, 0, 3)).ok());
  std::vector<float> q(2 * 4 * 1 * 8, 0.5f), out(2 * 4 * 1 * 8, kNaN), lse(2 * 4, kNaN);
  const auto view = [](std::vector<float>& d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(d.data(), DType::f32, shape);
  };
  const TensorView q2 = view(q, {2, 4, 1, 8}), o2 = view(out, {2, 4, 1, 6});
  Params with_lens = decode_params();
  std::int64_t lens[2] = {5, 3};
  with_lens.kv_lens = TensorView::contiguous(lens, DType::i64, {2});
  expect_errors(
      {{"rank", cache.attend({a, b}, view(q, {8, 1, 8}), o2), "q: rank 3; expected rank 4 [B, Hq, T, Dk]"},
       {"batch", cache.attend({a}, q2, o2), "q: batch 2; expected 1 (one row per sequence id)"},
       {"head dim", cache.attend({a, b}, view(q, {2, 4, 1, 4}), o2),
        "q: head dim 4; expected Dk = 8 (the cache's head_dim)"},
       {"heads", cache.attend({a, b}, view(q, {2, 1, 1, 8}), o2),
        "q: heads 1; expected a positive multiple of Hkv = 2 (the cache's kv_heads)"},
       {"out", cache.attend({a, b}, q2, view(out, {2, 4, 1, 8})),
        "out: shape [2, 4, 1, 8]; expected [2, 4, 1, 6] ([B, Hq, T, Dv], Dv = 6 the cache's v_head_dim)"},
       {"lse", cache.attend({a, b}, q2, o2, decode_params(), view(lse, {2, 4, 2})),
        "lse: shape [2, 4, 2]; expected [2, 4, 1] ([B, Hq, T])"},
       {"kv_lens", cache.attend({a, b}, q2, o2, with_lens), "kv_lens: is set; expected it empty..."}},
      out, lse);
  TensorView into_pool = o2;  // out over the pool's values
  into_pool.data = cache.v_pages().data;
  Status s = cache.attend({a, b}, q2, into_pool);
  EXPECT_EQ(s.message(), "out: memory overlaps input cache; expected a separate buffer");
  TensorView lse_in_pool = view(lse, {2, 4, 1});
  lse_in_pool.data = cache.k_pages().data;
  s = cache.attend({a, b}, q2, o2, decode_params(), lse_in_pool);
  EXPECT_EQ(s.message(), "lse: memory overlaps input cache; expected a separate buffer");
  EXPECT_TRUE(untouched(out) && untouched(lse));
  ASSERT_TRUE(cache.attend({a, b}, q2, o2, decode_params(), view(lse, {2, 4, 1})).ok());
  EXPECT_FALSE(untouched(out));
}

TEST(KVCache, CreateRefusesWhatAttendCannotReadAndReportsSizesPastMemory) {
  KVCache cache;
  Status s = KVCache::create(2, 8, 8, kMaxExtent + 1, &cache);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), "capacity: 2147483648; expected at most 2147483647 (attn::kMaxExtent)");
  s = KVCache::create(2, kMaxHeadDim + 1, 8, 4, &cache);
  EXPECT_EQ(s.message(), "head_dim: 16385; expected at most 16384 (attn::kMaxHeadDim)");
  s = KVCache::create(2, 8, kMaxHeadDim + 1, 4, &cache);
  EXPECT_EQ(s.param(), "v_head_dim");
  s = KVCache::create(kMaxExtent + 1, 8, 8, 4, &cache);
  EXPECT_EQ(s.param(), "kv_heads");
  // 2^31 heads x 2^31 tokens x 2^14 dims: more bytes than 64 bits count, refused without allocating.
  s = KVCache::create(kMaxExtent, kMaxHeadDim, kMaxHeadDim, kMaxExtent, &cache);
  EXPECT_EQ(s.code(), StatusCode::out_of_memory) << s.message();
  EXPECT_EQ(s.message().rfind("capacity: the cache would need ", 0), 0u) << s.message();
  EXPECT_EQ(cache.capacity(), 0) << "a failed create leaves the cache as it was";

  PagedKVCache pool;
  s = PagedKVCache::create(2, 8, 8, kMaxExtent + 1, 4, &pool);
  EXPECT_EQ(s.message(), "page_size: 2147483648; expected at most 2147483647 (attn::kMaxExtent)");
  s = PagedKVCache::create(kMaxExtent, 8, 8, kMaxExtent, kMaxExtent, &pool);
  EXPECT_EQ(s.code(), StatusCode::out_of_memory) << s.message();
  EXPECT_EQ(s.param(), "num_pages");
  s = PagedKVCache::create(kMaxExtent, kMaxHeadDim, kMaxHeadDim, 1 << 20, 1, &pool);  // slots fit, bytes do not
  EXPECT_EQ(s.code(), StatusCode::out_of_memory) << s.message();
  EXPECT_EQ(s.message().rfind("num_pages: the cache would need ", 0), 0u) << s.message();
  EXPECT_EQ(pool.num_pages(), 0);
}

// attention_paged itself rejects a page table entry outside the pool.
TEST(PagedKVCache, BadPageTableEntryIsAnError) {
  PagedKVCache cache;
  ASSERT_TRUE(PagedKVCache::create(1, 4, 4, 2, 3, &cache).ok());
  std::vector<float> q(4, 0.5f), out(4, kNaN);
  std::int32_t table[2] = {0, 7};  // 7 is outside [0, 3)
  std::int32_t lens[1] = {4};
  const Status s = attention_paged(TensorView::contiguous(q.data(), DType::f32, {1, 1, 1, 4}), cache.k_pages(),
                                   cache.v_pages(), TensorView::contiguous(table, DType::i32, {1, 2}),
                                   TensorView::contiguous(lens, DType::i32, {1}),
                                   TensorView::contiguous(out.data(), DType::f32, {1, 1, 1, 4}));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.message();
  for (float x : out) EXPECT_TRUE(std::isnan(x)) << "nothing may be written on error";
  // describe_attention_paged validates as attention_paged does: the same error, and with a good table an answer
  KernelInfo info;
  const auto describe = [&](std::int32_t* t) {
    return describe_attention_paged(TensorView::contiguous(q.data(), DType::f32, {1, 1, 1, 4}), cache.k_pages(),
                                    cache.v_pages(), TensorView::contiguous(t, DType::i32, {1, 2}),
                                    TensorView::contiguous(lens, DType::i32, {1}),
                                    TensorView::contiguous(out.data(), DType::f32, {1, 1, 1, 4}), {}, std::nullopt, &info);
  };
  const Status d = describe(table);
  EXPECT_EQ(d.code(), s.code());
  EXPECT_EQ(d.message(), s.message());
  std::int32_t good[2] = {0, 2};
  ASSERT_TRUE(describe(good).ok());
  EXPECT_EQ(info.backend, "flash");
  EXPECT_EQ(info.kernel, "vector");  // fp32 Q
  for (float x : out) EXPECT_TRUE(std::isnan(x)) << "describing writes nothing";
}

// ---- merge_attention -------------------------------------------------------------------------------

TEST(MergeAttention, TwoHalvesMakeTheWhole) {
  const std::int64_t B = 2, H = 3, S = 5, Skv = 23, D = 8, split = 9;
  std::mt19937_64 rng(11);
  Tensor q(DType::f32, B, H, S, D), k(DType::f32, B, H, Skv, D), v(DType::f32, B, H, Skv, D);
  q.randomize(rng, 2.0), k.randomize(rng, 2.0), v.randomize(rng);
  Tensor oa(DType::f32, B, H, S, D), ob(DType::f32, B, H, S, D), o(DType::f32, B, H, S, D), full(DType::f32, B, H, S, D);
  Tensor la = Tensor::plain(DType::f32, {B, H, S}), lb = la, l = la, lfull = la;
  la.view.data = la.storage.data(), lb.view.data = lb.storage.data(), l.view.data = l.storage.data(),
  lfull.view.data = lfull.storage.data();
  ASSERT_TRUE(attention(q.view, tokens(k.view, 0, split), tokens(v.view, 0, split), oa.view, {}, la.view).ok());
  ASSERT_TRUE(attention(q.view, tokens(k.view, split, Skv - split), tokens(v.view, split, Skv - split), ob.view, {}, lb.view).ok());
  ASSERT_TRUE(attention(q.view, k.view, v.view, full.view, {}, lfull.view).ok());
  o.poison(), l.poison();
  ASSERT_TRUE(merge_attention(oa.view, la.view, ob.view, lb.view, o.view, l.view).ok());
  o.for_each_index([&](auto a, auto b, auto c, auto d) { EXPECT_NEAR(o.get(a, b, c, d), full.get(a, b, c, d), 2e-6); });
  l.for_each_index([&](auto a, auto b, auto c, auto) { EXPECT_NEAR(l.get(a, b, c), lfull.get(a, b, c), 2e-6); });
  // In place, into side a.
  ASSERT_TRUE(merge_attention(oa.view, la.view, ob.view, lb.view, oa.view, la.view).ok());
  oa.for_each_index([&](auto a, auto b, auto c, auto d) { EXPECT_NEAR(oa.get(a, b, c, d), full.get(a, b, c, d), 2e-6); });
}

TEST(MergeAttention, EmptySidesAreSafe) {
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0: both sides empty (lse -inf, outputs garbage, NaN included); row 1: only b; row 2: only a. The
  // accumulator of an empty side is never read, and an empty result is exactly 0 whatever the rows held.
  float oa[3][2] = {{kNaN, -8}, {kNaN, 1}, {3, 4}}, ob[3][2] = {{kNaN, 7}, {5, 6}, {kNaN, kNaN}};
  float la[3] = {-inf, -inf, 0.25f}, lb[3] = {-inf, 1.5f, -inf};
  float o[3][2], l[3];
  const auto view4 = [](float (*p)[2]) { return TensorView::contiguous(p, DType::f32, {1, 1, 3, 2}); };
  const auto view3 = [](float* p) { return TensorView::contiguous(p, DType::f32, {1, 1, 3}); };
  ASSERT_TRUE(merge_attention(view4(oa), view3(la), view4(ob), view3(lb), view4(o), view3(l)).ok());
  EXPECT_EQ(o[0][0], 0.0f);
  EXPECT_EQ(o[0][1], 0.0f);
  EXPECT_EQ(l[0], -inf);
  EXPECT_FLOAT_EQ(o[1][0], 5);
  EXPECT_FLOAT_EQ(o[1][1], 6);
  EXPECT_FLOAT_EQ(l[1], 1.5f);
  EXPECT_FLOAT_EQ(o[2][0], 3);
  EXPECT_FLOAT_EQ(o[2][1], 4);
  EXPECT_FLOAT_EQ(l[2], 0.25f);
  // A shape mismatch is an error naming the argument.
  const Status s = merge_attention(view4(oa), view3(la), TensorView::contiguous(ob, DType::f32, {1, 1, 2, 2}), view3(lb),
                                   view4(o), view3(l));
  EXPECT_NE(s.message().find("out_b"), std::string::npos) << s.message();
}

// A mask for attend() as wide as the keys the caller knows: the cached length (KVCache) or the longest sequence
// (PagedKVCache), equal to the same mask widened to the storage's width (which is taken too).
TEST(KVCaches, AttendTakesAMaskAsWideAsTheCachedKeys) {
  std::mt19937_64 rng(31);
  const std::int64_t hkv = 2, hq = 4, D = 8;
  Tensor q(DType::f32, 1, hq, 1, D), k(DType::f32, 1, hkv, 5, D), v(DType::f32, 1, hkv, 5, D);
  q.randomize(rng), k.randomize(rng), v.randomize(rng);
  KVCache cache;
  ASSERT_TRUE(KVCache::create(hkv, D, D, 100, &cache).ok());
  ASSERT_TRUE(cache.append(k.view, v.view).ok());
  std::vector<float> narrow = {0.5f, -1.0f, -INFINITY, 2.0f, 0.0f}, wide(100, kNaN);  // (NaN past the length:
  std::copy(narrow.begin(), narrow.end(), wide.begin());  // the wide mask is checked there, so 0 instead)
  std::fill(wide.begin() + 5, wide.end(), 0.0f);
  Tensor out_narrow(DType::f32, 1, hq, 1, D), out_wide(DType::f32, 1, hq, 1, D);
  Params p = decode_params();
  p.mask = TensorView::contiguous(narrow.data(), DType::f32, {1, 1, 1, 5});
  const Status a = cache.attend(q.view, out_narrow.view, p);
  ASSERT_TRUE(a.ok()) << a.message();
  p.mask = TensorView::contiguous(wide.data(), DType::f32, {1, 1, 1, 100});
  ASSERT_TRUE(cache.attend(q.view, out_wide.view, p).ok());
  for (std::int64_t h = 0; h < hq; ++h)
    for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(out_narrow.get(0, h, 0, d), out_wide.get(0, h, 0, d));
  // A per-head mask read at strides (rows 20 apart, keys 3 apart) equals its contiguous copy.
  std::vector<float> per_head(static_cast<std::size_t>(hq * 5)), strided(static_cast<std::size_t>(hq * 20), kNaN);
  for (std::int64_t h = 0; h < hq; ++h)
    for (std::int64_t j = 0; j < 5; ++j) {
      const float x = static_cast<float>(std::uniform_real_distribution<>(-2, 2)(rng));
      per_head[static_cast<std::size_t>(h * 5 + j)] = x, strided[static_cast<std::size_t>(h * 20 + j * 3)] = x;
    }
  Tensor out_a(DType::f32, 1, hq, 1, D), out_b(DType::f32, 1, hq, 1, D);
  p.mask = TensorView::contiguous(per_head.data(), DType::f32, {1, hq, 1, 5});
  ASSERT_TRUE(cache.attend(q.view, out_a.view, p).ok());
  TensorView sv = TensorView::contiguous(strided.data(), DType::f32, {1, hq, 1, 5});
  sv.strides = {0, 20, 0, 3};
  p.mask = sv;
  const Status st = cache.attend(q.view, out_b.view, p);
  ASSERT_TRUE(st.ok()) << st.message();
  for (std::int64_t h = 0; h < hq; ++h)
    for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(out_a.get(0, h, 0, d), out_b.get(0, h, 0, d));
  // A width that is neither is refused, naming the mask.
  p.mask = TensorView::contiguous(narrow.data(), DType::f32, {1, 1, 1, 4});
  EXPECT_EQ(cache.attend(q.view, out_wide.view, p).param(), "mask");

  // Paged: sequences of 5 and 20 keys in pages of 16 (the table is 2 pages wide); a mask of 20 columns, per batch row.
  PagedKVCache pool;
  ASSERT_TRUE(PagedKVCache::create(hkv, D, D, 16, 8, &pool).ok());
  const std::int64_t a_id = pool.add_sequence(), b_id = pool.add_sequence();
  Tensor k2(DType::f32, 1, hkv, 20, D), v2(DType::f32, 1, hkv, 20, D), q2(DType::f32, 2, hq, 1, D);
  k2.randomize(rng), v2.randomize(rng), q2.randomize(rng);
  ASSERT_TRUE(pool.append(a_id, k.view, v.view).ok());
  ASSERT_TRUE(pool.append(b_id, k2.view, v2.view).ok());
  std::vector<float> m20(2 * 20), m32(2 * 32, 0.0f);
  for (std::size_t i = 0; i < m20.size(); ++i) m20[i] = static_cast<float>(std::uniform_real_distribution<>(-2, 2)(rng));
  for (int b = 0; b < 2; ++b) std::copy(m20.begin() + b * 20, m20.begin() + b * 20 + 20, m32.begin() + b * 32);
  Tensor o20(DType::f32, 2, hq, 1, D), o32(DType::f32, 2, hq, 1, D);
  Params pp = decode_params();
  pp.mask = TensorView::contiguous(m20.data(), DType::f32, {2, 1, 1, 20});
  const Status c = pool.attend({a_id, b_id}, q2.view, o20.view, pp);
  ASSERT_TRUE(c.ok()) << c.message();
  pp.mask = TensorView::contiguous(m32.data(), DType::f32, {2, 1, 1, 32});
  ASSERT_TRUE(pool.attend({a_id, b_id}, q2.view, o32.view, pp).ok());
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < hq; ++h)
      for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(o20.get(b, h, 0, d), o32.get(b, h, 0, d));
}

// Values a cache would not hold as the finite values they are are refused before anything is stored: an f16 cache
// and 70000 (f16's largest finite value is 65504), an i8 cache and a rotary table with NaN in it (the turned row
// is checked, not the row given), and a finite row whose turn overflows.
TEST(KVCaches, RefuseValuesTheStorageWouldNotHoldFinite) {
  KVCache f16;
  ASSERT_TRUE(KVCache::create(1, 4, 4, 8, DType::f16, &f16).ok());
  float k[4] = {70000, 1, 2, 3}, v[4] = {1, 2, 3, 4};
  const TensorView kv = TensorView::contiguous(k, DType::f32, {1, 1, 1, 4});
  const TensorView vv = TensorView::contiguous(v, DType::f32, {1, 1, 1, 4});
  Status s = f16.append(kv, vv);
  EXPECT_EQ(s.param(), "k") << s.message();
  EXPECT_NE(s.message().find("value [0, 0, 0, 0]"), std::string::npos) << s.message();
  EXPECT_EQ(f16.length(), 0);
  float k_inf[4] = {70000, INFINITY, 1, 2};  // (an inf beside it: still 70000's overflow, named)
  s = f16.append(TensorView::contiguous(k_inf, DType::f32, {1, 1, 1, 4}), vv);
  EXPECT_NE(s.message().find("value [0, 0, 0, 0]"), std::string::npos) << s.message();
  KVCache i8_turned;
  ASSERT_TRUE(KVCache::create(1, 4, 4, 8, DType::i8, &i8_turned).ok());
  float one[2] = {1, 1}, zero[2] = {0, 0}, k_bad[4] = {1, 2, INFINITY, 3};
  const Rotary identity{TensorView::contiguous(one, DType::f32, {1, 2}), TensorView::contiguous(zero, DType::f32, {1, 2}), false};
  s = i8_turned.append(TensorView::contiguous(k_bad, DType::f32, {1, 1, 1, 4}), vv, identity);
  EXPECT_NE(s.message().find("value [0, 0, 0, 2] is not finite"), std::string::npos) << s.message();  // (the input's)
  k[0] = 0.5f;
  for (DType storage : {DType::i8, DType::i4, DType::f32}) {
    SCOPED_TRACE(dtype_name(storage));
    KVCache c;
    ASSERT_TRUE(KVCache::create(1, 4, 4, 8, storage, &c).ok());
    float cs[2] = {kNaN, 1}, sn[2] = {0, 0};
    const Rotary nan_table{TensorView::contiguous(cs, DType::f32, {1, 2}), TensorView::contiguous(sn, DType::f32, {1, 2}), false};
    s = c.append(kv, vv, nan_table);
    EXPECT_EQ(s.param(), "k") << s.message();
    EXPECT_EQ(c.length(), 0);
    float big[4] = {3e38f, 3e38f, 1, 1}, c45[2] = {0.70710678f, 1}, s45[2] = {0.70710678f, 0};
    const Rotary turn{TensorView::contiguous(c45, DType::f32, {1, 2}), TensorView::contiguous(s45, DType::f32, {1, 2}),
                      /*interleaved=*/true};  // (dims 0 and 1 turned by 45 degrees: 3e38·√2 overflows)
    s = c.append(TensorView::contiguous(big, DType::f32, {1, 1, 1, 4}), vv, turn);
    EXPECT_EQ(s.param(), "k") << s.message();
    EXPECT_EQ(c.length(), 0);
    EXPECT_TRUE(c.append(kv, vv, turn).ok());  // (a finite turn of finite values)
  }
}

// A cache that was never created answers "cache: not created" (a PagedKVCache divided by its page size 0), and a
// token count past kMaxExtent is refused before any page arithmetic (it overflowed the page count).
TEST(KVCaches, UncreatedCachesAndHugeTokenCountsAreErrors) {
  PagedKVCache none;
  const std::int64_t id = none.add_sequence();
  EXPECT_EQ(none.remove_sequence(id).param(), "cache");
  EXPECT_EQ(none.truncate(id, 0).param(), "cache");
  float row[4] = {1, 2, 3, 4};
  TensorView k = TensorView::contiguous(row, DType::f32, {1, 1, 1, 4});
  EXPECT_EQ(none.append(id, k, k).param(), "cache");
  KVCache kv_none;
  EXPECT_EQ(kv_none.append(k, k).param(), "cache");

  PagedKVCache pool;
  ASSERT_TRUE(PagedKVCache::create(1, 4, 4, 16, 4, &pool).ok());
  const std::int64_t seq = pool.add_sequence();
  k.shape[2] = std::numeric_limits<std::int64_t>::max() - 3;  // a broadcast view of that many tokens
  k.strides = {0, 0, 0, 1};
  const Status s = pool.append(seq, k, k);
  EXPECT_EQ(s.param(), "k") << s.message();
  EXPECT_NE(s.message().find("kMaxExtent"), std::string::npos) << s.message();
  std::int64_t len = -1;
  ASSERT_TRUE(pool.length(seq, &len).ok());
  EXPECT_EQ(len, 0);
  EXPECT_EQ(pool.free_pages(), 4);
}

}  // namespace
}  // namespace attn::test
