// attention_paged_cascade (src/core/cascade.cc): a shared prefix attended once for the whole batch, each sequence's
// own keys separately, the two merged. Checked against the fp64 reference over the concatenated keys (each
// sequence's prefix + own keys gathered into contiguous K/V), by the tolerance rule with the naive fp32
// implementation as the yardstick, outputs NaN-poisoned; ragged sizes (prefix lengths that end inside a page, own
// lengths of 0, pages of 1, 7 and 16), GQA, Sq > 1 with bottom-right causal, softcap, sinks, f32/bf16/f16, every
// instruction-set level; and every refusal names its parameter and writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "core/problem.h"
#include "core/views.h"
#include "reference/reference.h"
#include "support.h"

namespace {

using namespace attn;
using i64 = std::int64_t;

struct CascadeCase {
  i64 B, Hq, Hkv, Sq, D, page, prefix;
  std::vector<i64> own;  // each sequence's own keys
  DType dtype;
  Causal causal = Causal::none;
  double softcap = 0;
  bool sinks = false;
  std::string name() const {
    std::string n = "B" + std::to_string(B) + "_H" + std::to_string(Hq) + "x" + std::to_string(Hkv) + "_q" +
                    std::to_string(Sq) + "_d" + std::to_string(D) + "_page" + std::to_string(page) + "_prefix" +
                    std::to_string(prefix) + "_" + dtype_name(dtype);
    if (causal == Causal::bottom_right) n += "_causal";
    if (softcap > 0) n += "_softcap";
    if (sinks) n += "_sinks";
    return n;
  }
};

// Storage of n elements of `dtype` (4 bytes each reserved: room for f32), values set through store_float.
struct Buffer {
  std::vector<unsigned char> bytes;
  DType dtype;
  Buffer(i64 n, DType t) : bytes(static_cast<std::size_t>(n) * 4 + 64), dtype(t) {}
  void* data() { return bytes.data(); }
  TensorView view(std::initializer_list<i64> shape) { return TensorView::contiguous(bytes.data(), dtype, shape); }
};

struct Built {
  Buffer q, kp, vp, out, kc, vc, out_ref;
  std::vector<float> lse, sinks;
  std::vector<std::int32_t> prefix_table, table, own_lens;
  std::vector<std::int32_t> total_lens;
  i64 pages = 0, max_pages = 0, longest = 0;
};

// The case's tensors: a pool holding the prefix's pages once and each sequence's own pages, shuffled; and the same
// keys gathered per sequence (prefix, then own) into contiguous K/V for the reference.
Built build(const CascadeCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const i64 prefix_pages = (c.prefix + c.page - 1) / c.page;
  i64 own_pages = 0, max_own = 0;
  for (i64 n : c.own) own_pages += (n + c.page - 1) / c.page, max_own = std::max(max_own, (n + c.page - 1) / c.page);
  const i64 pages = prefix_pages + own_pages + 3;  // 3 pages nobody uses
  i64 longest = 0;
  for (i64 n : c.own) longest = std::max(longest, c.prefix + n);
  longest = std::max<i64>(longest, 1);
  Built b{Buffer(c.B * c.Hq * c.Sq * c.D, c.dtype), Buffer(pages * c.Hkv * c.page * c.D, c.dtype),
          Buffer(pages * c.Hkv * c.page * c.D, c.dtype), Buffer(c.B * c.Hq * c.Sq * c.D, c.dtype),
          Buffer(c.B * c.Hkv * longest * c.D, c.dtype), Buffer(c.B * c.Hkv * longest * c.D, c.dtype),
          Buffer(c.B * c.Hq * c.Sq * c.D, c.dtype), {}, {}, {}, {}, {}, {}, pages, std::max<i64>(max_own, 1), longest};
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  for (i64 i = 0; i < pages; ++i) perm[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::size_t next = 0;
  for (i64 n = 0; n < prefix_pages; ++n) b.prefix_table.push_back(perm[next++]);
  b.prefix_table.push_back(perm.back());  // one spare entry past the prefix: never read
  b.table.assign(static_cast<std::size_t>(c.B * b.max_pages), perm.back());
  for (i64 s = 0; s < c.B; ++s)
    for (i64 n = 0; n < (c.own[static_cast<std::size_t>(s)] + c.page - 1) / c.page; ++n)
      b.table[static_cast<std::size_t>(s * b.max_pages + n)] = perm[next++];
  const TensorView q = b.q.view({c.B, c.Hq, c.Sq, c.D});
  for (i64 e = 0; e < q.numel(); ++e) core::store_float(q, e, u(rng));
  const TensorView kp = b.kp.view({pages, c.Hkv, c.page, c.D}), vp = b.vp.view({pages, c.Hkv, c.page, c.D});
  for (i64 e = 0; e < kp.numel(); ++e) core::store_float(kp, e, u(rng)), core::store_float(vp, e, u(rng));
  const TensorView kc = b.kc.view({c.B, c.Hkv, longest, c.D}), vc = b.vc.view({c.B, c.Hkv, longest, c.D});
  for (i64 e = 0; e < kc.numel(); ++e) core::store_float(kc, e, 0.0f), core::store_float(vc, e, 0.0f);
  for (i64 s = 0; s < c.B; ++s) {
    const i64 own = c.own[static_cast<std::size_t>(s)];
    for (i64 h = 0; h < c.Hkv; ++h)
      for (i64 j = 0; j < c.prefix + own; ++j) {
        const bool pre = j < c.prefix;
        const i64 jj = pre ? j : j - c.prefix;
        const i64 page = pre ? b.prefix_table[static_cast<std::size_t>(j / c.page)]
                             : b.table[static_cast<std::size_t>(s * b.max_pages + jj / c.page)];
        for (i64 d = 0; d < c.D; ++d) {
          const i64 from = ((page * c.Hkv + h) * c.page + jj % c.page) * c.D + d;
          const i64 to = ((s * c.Hkv + h) * longest + j) * c.D + d;
          core::store_float(kc, to, core::float_at(kp, from));
          core::store_float(vc, to, core::float_at(vp, from));
        }
      }
    b.own_lens.push_back(static_cast<std::int32_t>(own));
    b.total_lens.push_back(static_cast<std::int32_t>(c.prefix + own));
  }
  b.lse.assign(static_cast<std::size_t>(c.B * c.Hq * c.Sq), std::numeric_limits<float>::quiet_NaN());
  for (i64 h = 0; h < c.Hq; ++h) b.sinks.push_back(h % 3 == 1 ? -std::numeric_limits<float>::infinity() : u(rng));
  return b;
}

Params params_of(const CascadeCase& c, Built& b) {
  Params p;
  p.causal = c.causal;
  p.softcap = c.softcap;
  if (c.sinks) p.sinks = TensorView::contiguous(b.sinks.data(), DType::f32, {c.Hq});
  return p;
}

Status run_cascade(const CascadeCase& c, Built& b, const Params& p, bool with_lse = true) {
  const TensorView out = b.out.view({c.B, c.Hq, c.Sq, c.D});
  for (i64 e = 0; e < out.numel(); ++e) core::store_float(out, e, std::numeric_limits<float>::quiet_NaN());
  std::fill(b.lse.begin(), b.lse.end(), std::numeric_limits<float>::quiet_NaN());
  return attention_paged_cascade(b.q.view({c.B, c.Hq, c.Sq, c.D}), b.kp.view({b.pages, c.Hkv, c.page, c.D}),
                                 b.vp.view({b.pages, c.Hkv, c.page, c.D}),
                                 TensorView::contiguous(b.prefix_table.data(), DType::i32, {static_cast<i64>(b.prefix_table.size())}),
                                 c.prefix, TensorView::contiguous(b.table.data(), DType::i32, {c.B, b.max_pages}),
                                 TensorView::contiguous(b.own_lens.data(), DType::i32, {c.B}), out, p,
                                 with_lse ? std::optional<TensorView>(TensorView::contiguous(b.lse.data(), DType::f32, {c.B, c.Hq, c.Sq}))
                                          : std::nullopt);
}

// The fp64 reference and the naive fp32 implementation over the gathered keys (attention() with key lengths).
struct Oracle {
  reference::Result ref, naive;
};
Oracle oracle(const CascadeCase& c, Built& b) {
  Params p = params_of(c, b);
  p.kv_lens = TensorView::contiguous(b.total_lens.data(), DType::i32, {c.B});
  core::Problem rp;
  const Status s = core::validate(b.q.view({c.B, c.Hq, c.Sq, c.D}), b.kc.view({c.B, c.Hkv, b.longest, c.D}),
                                  b.vc.view({c.B, c.Hkv, b.longest, c.D}), b.out_ref.view({c.B, c.Hq, c.Sq, c.D}), p,
                                  TensorView::contiguous(b.lse.data(), DType::f32, {c.B, c.Hq, c.Sq}), &rp);
  EXPECT_TRUE(s.ok()) << s.message();
  return {reference::attention<double>(rp), reference::attention<float>(rp)};
}

// The tolerance rule against the fp64 reference, with the naive fp32 one as the yardstick.
void check(const CascadeCase& c, Built& b, const Oracle& o) {
  const reference::Result& ref = o.ref;
  const reference::Result& naive = o.naive;
  const TensorView out = b.out.view({c.B, c.Hq, c.Sq, c.D});
  double err = 0, err_naive = 0, scale = 0, lerr = 0, lerr_naive = 0;
  for (std::size_t e = 0; e < ref.out.size(); ++e) {
    const double got = core::float_at(out, static_cast<i64>(e));
    ASSERT_FALSE(std::isnan(got)) << "element " << e << " not written (or NaN)";
    err = std::max(err, std::fabs(got - ref.out[e]));
    err_naive = std::max(err_naive, std::fabs(naive.out[e] - ref.out[e]));
    scale = std::max(scale, std::fabs(ref.out[e]));
  }
  for (std::size_t r = 0; r < ref.lse.size(); ++r) {
    const double got = b.lse[r], want = ref.lse[r];
    if (std::isinf(want)) {
      EXPECT_EQ(got, want) << "row " << r;
      continue;
    }
    lerr = std::max(lerr, std::fabs(got - want) / (1 + std::fabs(want)));
    lerr_naive = std::max(lerr_naive, std::fabs(naive.lse[r] - want) / (1 + std::fabs(want)));
  }
  // atol: the output's own rounding (half an ulp of its dtype at the output's size) and fp32 noise.
  const double ulp = c.dtype == DType::bf16 ? 0x1p-8 : c.dtype == DType::f16 ? 0x1p-11 : 0x1p-24;
  EXPECT_LE(err, 2 * err_naive + ulp * std::max(scale, 1e-3) + 1e-6) << "naive " << err_naive;
  EXPECT_LE(lerr, 2 * lerr_naive + 1e-6) << "naive " << lerr_naive;
}

std::vector<CascadeCase> cases() {
  std::vector<CascadeCase> out;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    out.push_back({3, 8, 2, 1, 64, 16, 113, {7, 0, 31}, t});
    out.push_back({5, 4, 4, 1, 40, 7, 203, {1, 13, 0, 7, 20}, t});
    out.push_back({2, 6, 1, 3, 32, 1, 7, {5, 2}, t, Causal::bottom_right});
    out.push_back({4, 8, 2, 2, 64, 16, 64, {1, 16, 17, 40}, t, Causal::bottom_right, 0, true});
    out.push_back({1, 2, 2, 1, 128, 16, 1, {0}, t, Causal::none, 20.0});
  }
  out.push_back({16, 32, 8, 1, 128, 16, 300, std::vector<i64>(16, 9), DType::bf16});  // the benchmark's heads, small
  out.push_back({3, 4, 2, 1, 16, 8, 0, {5, 0, 9}, DType::bf16});  // no prefix: attention_paged
  return out;
}

class Cascade : public ::testing::TestWithParam<CascadeCase> {};

TEST_P(Cascade, MatchesFp64ReferenceOverTheConcatenatedKeys) {
  const CascadeCase& c = GetParam();
  Built b = build(c, 17);
  const Oracle o = oracle(c, b);
  for (cpu::Isa isa : test::supported_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    test::ForceIsa force(isa);
    const Status s = run_cascade(c, b, params_of(c, b));
    ASSERT_TRUE(s.ok()) << s.message();
    check(c, b, o);
  }
  Params r = params_of(c, b);
  r.backend = Backend::reference;
  ASSERT_TRUE(run_cascade(c, b, r).ok());
  check(c, b, o);
}

INSTANTIATE_TEST_SUITE_P(Cases, Cascade, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<CascadeCase>& i) { return i.param.name(); });

// The cascade keeps its gathered rows and partial results between calls (the caller's Workspace, else the thread's):
// a call after calls of other shapes gives the bits of a call with a fresh Workspace.
TEST(Cascade, ScratchKeptBetweenCallsGivesTheSameBits) {
  const CascadeCase big{4, 8, 2, 2, 64, 16, 64, {1, 16, 17, 40}, DType::bf16, Causal::bottom_right, 0, true};
  const CascadeCase small{3, 8, 2, 1, 64, 16, 113, {7, 0, 31}, DType::f32};
  Built bb = build(big, 5), bs = build(small, 6);
  const auto bytes_of = [](const CascadeCase& c, Built& b) {
    std::vector<unsigned char> o(static_cast<const unsigned char*>(b.out.data()),
                                 static_cast<const unsigned char*>(b.out.data()) + c.B * c.Hq * c.Sq * c.D * dtype_size(c.dtype));
    o.insert(o.end(), reinterpret_cast<const unsigned char*>(b.lse.data()),
             reinterpret_cast<const unsigned char*>(b.lse.data() + b.lse.size()));
    return o;
  };
  Workspace fresh;
  Params p = params_of(big, bb);
  p.workspace = &fresh;
  ASSERT_TRUE(run_cascade(big, bb, p).ok());
  const std::vector<unsigned char> want = bytes_of(big, bb);
  Workspace kept;
  for (Workspace* ws : {&kept, static_cast<Workspace*>(nullptr)}) {
    Params ps = params_of(small, bs), pb = params_of(big, bb);
    ps.workspace = pb.workspace = ws;
    ASSERT_TRUE(run_cascade(big, bb, pb).ok());
    ASSERT_TRUE(run_cascade(small, bs, ps).ok());
    ASSERT_TRUE(run_cascade(big, bb, pb).ok());
    EXPECT_EQ(bytes_of(big, bb), want) << (ws ? "a caller's Workspace" : "the thread's kept scratch");
  }
}

// Every refusal names its parameter, and the outputs keep their poison.
TEST(CascadeErrors, RefusalsNameTheParameterAndWriteNothing) {
  const CascadeCase c{2, 4, 2, 2, 16, 8, 20, {3, 5}, DType::f32, Causal::bottom_right};
  Built b = build(c, 3);
  const auto expect = [&](Params p, const std::string& param, i64 prefix = -99, std::int32_t bad_page = -1) {
    CascadeCase cc = c;
    if (prefix != -99) cc.prefix = prefix;
    const std::vector<std::int32_t> saved = b.prefix_table;
    if (bad_page >= 0) b.prefix_table[0] = bad_page;
    const Status s = run_cascade(cc, b, p);
    b.prefix_table = saved;
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.param(), param) << s.message();
    const TensorView out = b.out.view({c.B, c.Hq, c.Sq, c.D});
    for (i64 e = 0; e < out.numel(); ++e) ASSERT_TRUE(std::isnan(core::float_at(out, e))) << "wrote element " << e;
    for (float x : b.lse) ASSERT_TRUE(std::isnan(x));
  };
  Params p;
  p.causal = Causal::bottom_right;
  Params w = p;
  w.window.left = 4;
  expect(w, "window");
  Params m = p;
  std::vector<float> mask(static_cast<std::size_t>(c.Sq * 28), 0.0f);
  m.mask = TensorView::contiguous(mask.data(), DType::f32, {c.Sq, 28});
  expect(m, "mask");
  Params a = p;
  std::vector<float> slopes(static_cast<std::size_t>(c.Hq), 0.5f);
  a.alibi_slopes = TensorView::contiguous(slopes.data(), DType::f32, {c.Hq});
  expect(a, "alibi_slopes");
  Params d = p;
  d.dropout_p = 0.1;
  expect(d, "dropout_p");
  Params t = p;
  t.causal = Causal::top_left;
  expect(t, "causal");
  expect(p, "prefix_len", -1);
  expect(p, "prefix_table", 1000);  // more keys than its pages hold
  expect(p, "prefix_table", -99, static_cast<std::int32_t>(b.pages));  // a page outside the pool
  // causal bottom-right needs every query to see the whole prefix: seq_lens[b] >= Sq - 1
  b.own_lens[1] = 0;
  expect(p, "seq_lens");
  b.own_lens[1] = 5;
}

}  // namespace
