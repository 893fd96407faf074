// Numerics: the seeds' worked example, fully masked rows, huge logits, -inf arithmetic, the state merge.
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "cases.h"
#include "core/online_softmax.h"

namespace attn::test {
namespace {

const Backend kBackends[] = {Backend::flash, Backend::reference};
const char* backend_name(Backend b) { return b == Backend::flash ? "flash" : "reference"; }

// Seed 000: Q 2x2, K and V 3x2, d_k = 2. Its stated result is [[1.604, 0.797], [1.401, 1.203]].
TEST(Numerics, SeedWorkedExample) {
  const float q[] = {1, 0, 0, 1};
  const float k[] = {1, 0, 0, 1, 1, 1};
  const float v[] = {1, 0, 0, 2, 3, 1};
  const double expected[] = {1.604, 0.797, 1.401, 1.203};
  for (Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    float out[4], lse[2];
    std::fill(out, out + 4, std::numeric_limits<float>::quiet_NaN());
    Params p;
    p.backend = backend;
    const Status s = attention(TensorView::contiguous(q, DType::f32, {1, 1, 2, 2}),
                               TensorView::contiguous(k, DType::f32, {1, 1, 3, 2}),
                               TensorView::contiguous(v, DType::f32, {1, 1, 3, 2}),
                               TensorView::contiguous(out, DType::f32, {1, 1, 2, 2}), p,
                               TensorView::contiguous(lse, DType::f32, {1, 1, 2}));
    ASSERT_TRUE(s.ok()) << s.message();
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], expected[i], 5e-4) << "element " << i;
    // Each row's LSE is log(e^0.7071 + 1 + e^0.7071) = log(5.0562...).
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(lse[i], std::log(2 * std::exp(1 / std::sqrt(2.0)) + 1), 1e-6);
  }
}

// Rows with no allowed key: out = 0 and lse = -inf, never NaN, for every way a row can be emptied.
TEST(Numerics, FullyMaskedRowsGiveZeroAndMinusInf) {
  const std::int64_t B = 2, H = 2, Sq = 90, Skv = 70, D = 16;
  std::mt19937_64 rng(7);
  for (Backend backend : kBackends)
    for (int how = 0; how < 5; ++how) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " way " + std::to_string(how));
      Tensor q(DType::f32, B, H, Sq, D), k(DType::f32, B, H, Skv, D), v(DType::f32, B, H, Skv, D);
      Tensor out(DType::f32, B, H, Sq, D);
      Tensor lse = Tensor::plain(DType::f32, {B, H, Sq});
      q.randomize(rng);
      k.randomize(rng);
      v.randomize(rng);
      out.poison();
      lse.poison();
      Params p;
      p.backend = backend;
      Tensor mask, lens;
      std::vector<std::pair<std::int64_t, std::int64_t>> empty;  // (batch, row) that must be empty
      switch (how) {
        case 0:  // additive -inf over a whole row, in both batches
          mask = Tensor::plain(DType::f32, {B, 1, Sq, Skv});
          mask.randomize(rng);
          for (std::int64_t j = 0; j < Skv; ++j) mask.set(-INFINITY, 0, 0, 3, j), mask.set(-INFINITY, 1, 0, 89, j);
          p.mask = mask.view;
          empty = {{0, 3}, {1, 89}};
          break;
        case 1:  // boolean mask blocking a row
          mask = Tensor::plain(DType::boolean, {Sq, Skv});
          mask.for_each_index([&](auto i, auto j, auto, auto) { mask.set(i != 5, i, j); });
          p.mask = mask.view;
          empty = {{0, 5}, {1, 5}};
          break;
        case 2:  // zero key length
          lens = Tensor::plain(DType::i64, {B});
          lens.set(0, 0), lens.set(Skv, 1);
          p.kv_lens = lens.view;
          for (std::int64_t i = 0; i < Sq; ++i) empty.push_back({0, i});
          break;
        case 3:  // bottom-right causal with Sq > Skv_b: the first rows see nothing
          lens = Tensor::plain(DType::i32, {B});
          lens.set(40, 0), lens.set(Skv, 1);
          p.kv_lens = lens.view;
          p.causal = Causal::bottom_right;
          for (std::int64_t i = 0; i < Sq - 40; ++i) empty.push_back({0, i});
          break;
        case 4:  // a top-left window that lies beyond the keys for late rows
          p.window = {2, 1, Align::top_left};
          for (std::int64_t i = Skv + 2; i < Sq; ++i) empty.push_back({0, i}), empty.push_back({1, i});
          break;
      }
      ASSERT_TRUE(attention(q.view, k.view, v.view, out.view, p, lse.view).ok());
      out.for_each_index([&](auto b, auto h, auto i, auto d) { ASSERT_FALSE(std::isnan(out.get(b, h, i, d))); });
      for (auto [b, i] : empty)
        for (std::int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(lse.get(b, h, i), -INFINITY) << "b " << b << " row " << i;
          for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(out.get(b, h, i, d), 0.0) << "b " << b << " row " << i;
        }
    }
}

// Logits of magnitude ~1e4 stay finite and agree with the fp64 reference.
TEST(Numerics, HugeLogitsStayFinite) {
  const std::int64_t Sq = 65, Skv = 130, D = 64;
  std::mt19937_64 rng(11);
  Tensor q(DType::f32, 1, 2, Sq, D), k(DType::f32, 1, 2, Skv, D), v(DType::f32, 1, 2, Skv, D);
  Tensor out(DType::f32, 1, 2, Sq, D);
  Tensor lse = Tensor::plain(DType::f32, {1, 2, Sq});
  q.randomize(rng, 30.0);
  k.randomize(rng, 30.0);
  v.randomize(rng);
  Params p;
  p.scale = 1.0;
  core::Problem prob;
  ASSERT_TRUE(core::validate(q.view, k.view, v.view, out.view, p, lse.view, &prob).ok());
  const reference::Result ref = reference::attention<double>(prob);
  double max_logit = 0;
  for (double x : ref.lse) max_logit = std::max(max_logit, std::fabs(x));
  EXPECT_GT(max_logit, 5e3);
  for (Backend backend : kBackends) {
    p.backend = backend;
    ASSERT_TRUE(attention(q.view, k.view, v.view, out.view, p, lse.view).ok());
    std::size_t n = 0;
    out.for_each_index([&](auto b, auto h, auto i, auto d) {
      const double x = out.get(b, h, i, d);
      ASSERT_TRUE(std::isfinite(x));
      EXPECT_NEAR(x, ref.out[n++], 2e-2);  // fp32 logits of 1e4 carry ~1e-3 absolute error
    });
    lse.for_each_index([&](auto b, auto h, auto i, auto) {
      EXPECT_NEAR(lse.get(b, h, i), ref.lse[(b * 2 + h) * Sq + i], 1e-5 * max_logit);
    });
  }
}

// The hardening issues' repros, at every instruction-set level, against closed forms: finite scores of any
// magnitude give finite, correct rows. A finite mask value is a finite bias, however large: -1e10 on every key
// (a common padding value) and -FLT_MAX on every key (finfo(float32).min, Hugging Face's padding) both give
// the softmax over those keys, here the mean of V, as PyTorch does; only -inf hides a key. +1e10 on one key
// gives that key's value row (not an empty row), and scale = 1e20 the row of the largest dot product.
TEST(Numerics, HugeFiniteBiasesAndScalesGiveTheExactRow) {
  const float fmax = std::numeric_limits<float>::max();
  // Rows of 64 queries (so bf16 calls reach the AMX kernel where it exists), 2 keys, D = 16.
  const std::int64_t Sq = 64, Skv = 2, D = 16;
  struct Repro {
    const char* what;
    std::optional<std::pair<float, float>> bias;  // the mask's values for keys 0 and 1 (none: no mask)
    double scale;
  };
  const Repro repros[] = {{"-1e10 on every key", std::pair{-1e10f, -1e10f}, 0.25},
                          {"-FLT_MAX on every key", std::pair{-fmax, -fmax}, 0.25},
                          {"+1e10 on key 1", std::pair{0.0f, 1e10f}, 0.25},
                          {"-1e10 on key 0", std::pair{-1e10f, 0.0f}, 0.25},
                          {"scale 1e20, no mask", std::nullopt, 1e20}};
  for (const DType dt : {DType::f32, DType::bf16})
    for (const cpu::Isa isa : supported_isas())
      for (const Repro& r : repros) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + dtype_name(dt) + ": " + r.what);
        ForceIsa force(isa);
        Tensor q(dt, 1, 1, Sq, D), k(dt, 1, 1, Skv, D), v(dt, 1, 1, Skv, D), out(dt, 1, 1, Sq, D);
        Tensor lse = Tensor::plain(DType::f32, {1, 1, Sq});
        Tensor mask = Tensor::plain(DType::f32, {Skv});
        const auto [bias0, bias1] = r.bias.value_or(std::pair{0.0f, 0.0f});
        mask.set(bias0, 0), mask.set(bias1, 1);
        // q = 1, k0 = 1/2, k1 = 1 (k1 has the larger dot product: 16 against 8); v rows 1.5 and 2.25 (exact in bf16).
        q.for_each_index([&](auto a, auto b, auto c, auto d) { q.set(1.0, a, b, c, d); });
        k.for_each_index([&](auto a, auto b, auto c, auto d) { k.set(c == 0 ? 0.5 : 1.0, a, b, c, d); });
        v.for_each_index([&](auto a, auto b, auto c, auto d) { v.set(c == 0 ? 1.5 : 2.25, a, b, c, d); });
        out.poison();
        lse.poison();
        Params p;
        p.scale = r.scale;
        if (r.bias) p.mask = mask.view;
        ASSERT_TRUE(attention(q.view, k.view, v.view, out.view, p, lse.view).ok());
        // Closed form from the two fp32 logits (scale·q·k + bias rounded once to fp32, as the kernels form them:
        // at -1e10 the fp32 spacing is 1024, so both keys' logits round to -1e10 and the row is the mean of V,
        // where the fp64 oracle still separates them), the rest in fp64.
        const double s0 = static_cast<float>(r.scale * 8.0 + double(bias0));
        const double s1 = static_cast<float>(r.scale * 16.0 + double(bias1));
        const double m = std::max(s0, s1), w0 = std::exp(s0 - m), w1 = std::exp(s1 - m);
        const double o = (w0 * 1.5 + w1 * 2.25) / (w0 + w1), l = m + std::log(w0 + w1);
        const double otol = dt == DType::bf16 ? 1e-2 : 1e-5;
        out.for_each_index([&](auto a, auto b, auto c, auto d) {
          const double x = out.get(a, b, c, d);
          ASSERT_TRUE(std::isfinite(x)) << "row " << c;
          EXPECT_NEAR(x, o, otol) << "row " << c;
        });
        lse.for_each_index([&](auto a, auto b, auto c, auto) {
          const double x = lse.get(a, b, c);
          ASSERT_TRUE(std::isfinite(x)) << "row " << c;
          EXPECT_NEAR(x, l, 1e-6 * std::fabs(l) + 1e-4) << "row " << c;
        });
      }
}

// -inf in the additive mask combined with every other mask never yields NaN.
TEST(Numerics, MinusInfinityMaskArithmetic) {
  const std::int64_t Sq = 9, Skv = 9, D = 8;
  std::mt19937_64 rng(3);
  Tensor q(DType::f32, 1, 1, Sq, D), k(DType::f32, 1, 1, Skv, D), v(DType::f32, 1, 1, Skv, D);
  q.randomize(rng), k.randomize(rng), v.randomize(rng);
  Tensor mask = Tensor::plain(DType::f32, {Sq, Skv});
  mask.for_each_index([&](auto i, auto j, auto, auto) { mask.set((i + j) % 3 == 0 ? -INFINITY : 0.5, i, j); });
  for (Backend backend : kBackends)
    for (Causal c : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Tensor out(DType::f32, 1, 1, Sq, D);
      Tensor lse = Tensor::plain(DType::f32, {1, 1, Sq});
      out.poison(), lse.poison();
      Params p;
      p.backend = backend;
      p.causal = c;
      p.mask = mask.view;
      ASSERT_TRUE(attention(q.view, k.view, v.view, out.view, p, lse.view).ok());
      out.for_each_index([&](auto b, auto h, auto i, auto d) { ASSERT_FALSE(std::isnan(out.get(b, h, i, d))); });
      lse.for_each_index([&](auto b, auto h, auto i, auto) { ASSERT_FALSE(std::isnan(lse.get(b, h, i))); });
      // Row 0 with a top-left causal mask sees only key 0, which the mask blocks: empty.
      if (c == Causal::top_left) EXPECT_EQ(lse.get(0, 0, 0), -INFINITY);
    }
}

// Params::check_mask_values = false skips the scan: a NaN or +inf in a row of the mask then gives NaN in that
// row's output and LSE (IEEE arithmetic), and every other row is exactly what the checked call gives. With the
// scan (the default) the same mask is refused, naming it.
TEST(Numerics, UncheckedMaskValuesPropagateNaN) {
  const std::int64_t Sq = 37, Skv = 45, D = 16;
  std::mt19937_64 rng(11);
  Tensor q(DType::f32, 1, 2, Sq, D), k(DType::f32, 1, 2, Skv, D), v(DType::f32, 1, 2, Skv, D);
  q.randomize(rng), k.randomize(rng), v.randomize(rng);
  Tensor mask = Tensor::plain(DType::f32, {Sq, Skv});
  mask.randomize(rng);
  for (Backend backend : kBackends)
    for (const float bad : {NAN, INFINITY}) {
      SCOPED_TRACE(std::string(backend_name(backend)) + (std::isnan(bad) ? " NaN" : " +inf"));
      auto run = [&](const Tensor& m, bool check, Tensor* out, Tensor* lse) {
        out->poison(), lse->poison();
        Params p;
        p.backend = backend;
        p.mask = m.view;
        p.check_mask_values = check;
        return attention(q.view, k.view, v.view, out->view, p, lse->view);
      };
      Tensor clean_out(DType::f32, 1, 2, Sq, D), clean_lse = Tensor::plain(DType::f32, {1, 2, Sq});
      ASSERT_TRUE(run(mask, true, &clean_out, &clean_lse).ok());
      Tensor poisoned = mask;
      poisoned.view.data = poisoned.storage.data();
      const std::int64_t bad_row = 20;
      poisoned.set(bad, bad_row, 30);
      Tensor out(DType::f32, 1, 2, Sq, D), lse = Tensor::plain(DType::f32, {1, 2, Sq});
      const Status refused = run(poisoned, true, &out, &lse);
      EXPECT_EQ(refused.code(), StatusCode::invalid_argument);
      EXPECT_NE(refused.message().find("mask"), std::string::npos) << refused.message();
      ASSERT_TRUE(run(poisoned, false, &out, &lse).ok());
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < Sq; ++i) {
          if (i == bad_row) {
            EXPECT_TRUE(std::isnan(lse.get(0, h, i)));
            for (std::int64_t d = 0; d < D; ++d) EXPECT_TRUE(std::isnan(out.get(0, h, i, d)));
            continue;
          }
          EXPECT_EQ(lse.get(0, h, i), clean_lse.get(0, h, i));
          for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(out.get(0, h, i, d), clean_out.get(0, h, i, d));
        }
    }
}

// The state: advancing over all keys equals merging per-half states; empty states merge safely; huge finite
// scores keep the largest one at weight exactly 1; NaN reaches the state.
// A split whose scores were NaN, followed in its tile by a -inf score, ends with m = -inf (x86 max drops the NaN)
// and l = NaN: poisoned, not empty. Merged with an empty split, or merged into, it must keep the row NaN (the
// soak's configuration 4333753285616122833: a NaN in q, a dense mask, split-KV, returned an empty row).
TEST(Numerics, PoisonedStateWithMinusInfMaxIsNotEmpty) {
  using core::RowState;
  const float c = static_cast<float>(core::kLog2e), nan = std::numeric_limits<float>::quiet_NaN();
  RowState empty, poisoned, plain;
  poisoned.l = nan;  // m stays -inf
  plain.m = 1.0f, plain.l = 2.0f;
  float o_empty = 0, o_poisoned = nan, o_plain = 3.0f;
  RowState a = empty;
  float oa = o_empty;
  core::merge(a, &oa, poisoned, &o_poisoned, 1, c);
  EXPECT_TRUE(std::isnan(a.l)) << "an empty side merged with a poisoned one";
  EXPECT_TRUE(std::isnan(core::finish_lse(a.m, a.l, 1.0)));
  RowState b = poisoned;
  float ob = o_poisoned;
  core::merge(b, &ob, plain, &o_plain, 1, c);
  EXPECT_TRUE(std::isnan(b.l) && std::isnan(ob)) << "a poisoned side merged with an ordinary one";
  RowState d = plain;
  float od = o_plain;
  core::merge(d, &od, poisoned, &o_poisoned, 1, c);
  EXPECT_TRUE(std::isnan(d.l) && std::isnan(od)) << "an ordinary side merged with a poisoned one";
}

TEST(Numerics, SoftmaxStateMerge) {
  using core::RowState;
  const float c = static_cast<float>(core::kLog2e);
  const float s[6] = {0.5f, -1.0f, 2.0f, 0.25f, -3.0f, 1.5f};
  const float v[6] = {1, 2, 3, 4, 5, 6};
  auto over = [&](int lo, int hi, float* o) {
    RowState st;
    *o = 0;
    for (int j = lo; j < hi; ++j) {
      *o *= st.advance(s[j], c);
      const float w = RowState::weight(s[j], st.origin(), c);
      st.add(w);
      *o += w * v[j];
    }
    return st;
  };
  float o_all, o_a, o_b;
  const RowState all = over(0, 6, &o_all);
  RowState a = over(0, 2, &o_a);
  const RowState b = over(2, 6, &o_b);
  core::merge(a, &o_a, b, &o_b, 1, c);
  EXPECT_EQ(a.m, all.m);
  EXPECT_NEAR(a.l, all.l, 1e-6);
  EXPECT_NEAR(o_a / a.l, o_all / all.l, 1e-6);
  // Empty with empty stays empty; empty with full is the full one (the empty side's accumulator is not read).
  RowState e1, e2;
  float oe1 = NAN, oe2 = NAN;
  core::merge(e1, &oe1, e2, &oe2, 1, c);
  EXPECT_EQ(e1.m, -INFINITY);
  EXPECT_EQ(e1.l, 0.0f);
  EXPECT_EQ(core::finish_lse(e1.m, e1.l, 1.0), -INFINITY);
  EXPECT_EQ(core::finish_output(oe1, e1.l, core::finish_factor(e1.l)), 0.0f);
  core::merge(e1, &oe1, all, &o_all, 1, c);
  EXPECT_EQ(e1.l, all.l);
  EXPECT_EQ(oe1, o_all);
  // Scores of -1e10 (and 3e38): the largest weighs exactly 1, the sum stays finite.
  for (float big : {-1e10f, 1e10f, 3e38f, -3.4028235e38f}) {
    RowState st;
    st.advance(big, c);
    const float w0 = RowState::weight(big, st.origin(), c);
    EXPECT_EQ(w0, 1.0f) << big;
    st.add(w0);
    EXPECT_EQ(st.l, 1.0f);
    EXPECT_FLOAT_EQ(core::finish_lse(st.m, st.l, 1.0), big);
  }
  // NaN: the weight and the sum become NaN, so do the LSE and the output.
  RowState n;
  n.advance(NAN, c);
  n.add(RowState::weight(NAN, n.origin(), c));
  EXPECT_TRUE(std::isnan(n.l));
  EXPECT_TRUE(std::isnan(core::finish_lse(n.m, n.l, 1.0)));
  // The lazy form moves m only past the slack, and weights stay below 2^slack.
  RowState lazy;
  EXPECT_EQ(lazy.advance_lazy(1.0f, c, 8.0f), 0.0f);  // first keys: alpha 0, m = 1
  EXPECT_EQ(lazy.m, 1.0f);
  EXPECT_EQ(lazy.advance_lazy(3.0f, c, 8.0f), 1.0f);  // 2·log2 e < 8: m stays
  EXPECT_EQ(lazy.m, 1.0f);
  EXPECT_NE(lazy.advance_lazy(9.0f, c, 8.0f), 1.0f);  // 8·log2 e > 8: m moves
  EXPECT_EQ(lazy.m, 9.0f);
}

// BHSD and BSHD views of the same logical tensors give the same bits.
TEST(Numerics, LayoutsAgreeBitwise) {
  const std::int64_t B = 2, H = 3, S = 37, D = 24;
  std::mt19937_64 rng(5);
  Tensor q1(DType::f32, B, H, S, D), k1(DType::f32, B, H, S, D), v1(DType::f32, B, H, S, D), o1(DType::f32, B, H, S, D);
  Tensor q2(DType::f32, B, H, S, D, Layout::bshd), k2(DType::f32, B, H, S, D, Layout::bshd),
      v2(DType::f32, B, H, S, D, Layout::bshd), o2(DType::f32, B, H, S, D, Layout::bshd);
  q1.randomize(rng), k1.randomize(rng), v1.randomize(rng);
  q1.for_each_index([&](auto a, auto b, auto c, auto d) {
    q2.set(q1.get(a, b, c, d), a, b, c, d), k2.set(k1.get(a, b, c, d), a, b, c, d), v2.set(v1.get(a, b, c, d), a, b, c, d);
  });
  Params p;
  p.causal = Causal::top_left;
  ASSERT_TRUE(attention(q1.view, k1.view, v1.view, o1.view, p).ok());
  ASSERT_TRUE(attention(q2.view, k2.view, v2.view, o2.view, p).ok());
  o1.for_each_index([&](auto a, auto b, auto c, auto d) { ASSERT_EQ(o1.get(a, b, c, d), o2.get(a, b, c, d)); });
}

}  // namespace
}  // namespace attn::test

namespace attn::test {
namespace {

// merge_attention: an empty side (lse = -inf) contributes nothing, even when its output holds NaN.
TEST(Numerics, MergeIgnoresEmptySidesWhateverTheyHold) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float oa[2] = {nan, nan}, ob[2] = {3, 4}, la[1] = {-INFINITY}, lb[1] = {0.5f}, o[2], l[1];
  auto v4 = [](float* p) { return TensorView::contiguous(p, DType::f32, {1, 1, 1, 2}); };
  auto v3 = [](float* p) { return TensorView::contiguous(p, DType::f32, {1, 1, 1}); };
  ASSERT_TRUE(merge_attention(v4(oa), v3(la), v4(ob), v3(lb), v4(o), v3(l)).ok());
  EXPECT_EQ(o[0], 3.0f);
  EXPECT_EQ(o[1], 4.0f);
  EXPECT_FLOAT_EQ(l[0], 0.5f);
  lb[0] = -INFINITY, ob[0] = nan;
  ASSERT_TRUE(merge_attention(v4(oa), v3(la), v4(ob), v3(lb), v4(o), v3(l)).ok());
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.0f);
  EXPECT_EQ(l[0], -INFINITY);
}

}  // namespace
}  // namespace attn::test
