// Additive (Bahdanau) attention (attn/additive.h) against an fp64 reference written here from the formula, under
// the tolerance rule (the same formula in fp32 as the yardstick), its gradients against the reference's and the
// reference's against central finite differences, masks, empty rows, thread counts, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "attn/additive.h"
#include "support.h"

namespace attn::test {
namespace {

struct Shape {
  std::int64_t B = 2, Sq = 7, Skv = 13, Dq = 5, Dk = 6, Dv = 4, A = 8;
  Causal causal = Causal::none;
  bool lens = false;
  int mask = 0;  // 0 none, 1 additive [Sq, Skv], 2 boolean [B, Sq, Skv]
};

// Inputs as doubles (what the reference reads) and f32 tensors (what the library reads), the same values.
struct Inputs {
  Shape s;
  std::vector<double> q, k, v, wq, wk, w, mask, dout;
  std::vector<std::int64_t> len;
  Tensor tq, tk, tv, twq, twk, tw, tmask, tlens, tdout;
  AdditiveParams params;

  Inputs(const Shape& shape, std::uint64_t seed) : s(shape) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    auto fill = [&](std::vector<double>& x, std::size_t n, double amp) {
      x.resize(n);
      for (double& e : x) e = static_cast<float>(amp * u(rng));
    };
    const auto n = [](std::int64_t a) { return static_cast<std::size_t>(a); };
    fill(q, n(s.B * s.Sq * s.Dq), 1), fill(k, n(s.B * s.Skv * s.Dk), 1), fill(v, n(s.B * s.Skv * s.Dv), 1);
    fill(wq, n(s.A * s.Dq), 0.8), fill(wk, n(s.A * s.Dk), 0.8), fill(w, n(s.A), 1.5);
    fill(dout, n(s.B * s.Sq * s.Dv), 1);
    len.assign(n(s.B), s.Skv);
    if (s.lens)
      for (std::int64_t b = 0; b < s.B; ++b) len[n(b)] = b == 0 ? 0 : b == 1 ? s.Skv : static_cast<std::int64_t>(rng() % n(s.Skv + 1));
    if (s.mask) {
      mask.resize(n((s.mask == 2 ? s.B : 1) * s.Sq * s.Skv));
      for (double& m : mask) m = s.mask == 1 ? (rng() % 7 == 0 ? -INFINITY : static_cast<float>(u(rng))) : (rng() % 4 != 0);
    }
    tq = tensor3(q, s.B, s.Sq, s.Dq), tk = tensor3(k, s.B, s.Skv, s.Dk), tv = tensor3(v, s.B, s.Skv, s.Dv);
    tdout = tensor3(dout, s.B, s.Sq, s.Dv);
    twq = Tensor::plain(DType::f32, {s.A, s.Dq}), twk = Tensor::plain(DType::f32, {s.A, s.Dk}), tw = Tensor::plain(DType::f32, {s.A});
    for (std::int64_t a = 0; a < s.A; ++a) {
      tw.set(w[n(a)], a);
      for (std::int64_t c = 0; c < s.Dq; ++c) twq.set(wq[n(a * s.Dq + c)], a, c);
      for (std::int64_t c = 0; c < s.Dk; ++c) twk.set(wk[n(a * s.Dk + c)], a, c);
    }
    params.causal = s.causal;
    if (s.lens) {
      tlens = Tensor::plain(DType::i64, {s.B});
      for (std::int64_t b = 0; b < s.B; ++b) tlens.set(static_cast<double>(len[n(b)]), b);
      params.kv_lens = tlens.view;
    }
    if (s.mask == 1) {
      tmask = Tensor::plain(DType::f32, {s.Sq, s.Skv});
      for (std::int64_t i = 0; i < s.Sq; ++i)
        for (std::int64_t j = 0; j < s.Skv; ++j) tmask.set(mask[n(i * s.Skv + j)], i, j);
      params.mask = tmask.view;
    } else if (s.mask == 2) {
      tmask = Tensor::plain(DType::boolean, {s.B, s.Sq, s.Skv});
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t i = 0; i < s.Sq; ++i)
          for (std::int64_t j = 0; j < s.Skv; ++j) tmask.set(mask[n((b * s.Sq + i) * s.Skv + j)], b, i, j);
      params.mask = tmask.view;
    }
  }
  static Tensor tensor3(const std::vector<double>& x, std::int64_t a, std::int64_t b, std::int64_t c) {
    Tensor t = Tensor::plain(DType::f32, {a, b, c});
    std::size_t e = 0;
    for (std::int64_t i = 0; i < a; ++i)
      for (std::int64_t j = 0; j < b; ++j)
        for (std::int64_t l = 0; l < c; ++l) t.set(x[e++], i, j, l);
    return t;
  }
  AdditiveWeights weights() const { return {twq.view, twk.view, tw.view}; }

  // The bias of pair (b, i, j): -inf when hidden (causal, length, mask), else the additive mask's value or 0.
  double bias(std::int64_t b, std::int64_t i, std::int64_t j) const {
    const std::int64_t L = len[static_cast<std::size_t>(b)];
    if (j >= L) return -INFINITY;
    if (s.causal == Causal::top_left && j > i) return -INFINITY;
    if (s.causal == Causal::bottom_right && j > i + L - s.Sq) return -INFINITY;
    if (s.mask == 1) return mask[static_cast<std::size_t>(i * s.Skv + j)];
    if (s.mask == 2) return mask[static_cast<std::size_t>((b * s.Sq + i) * s.Skv + j)] != 0 ? 0.0 : -INFINITY;
    return 0;
  }
};

// The formula, in Acc: out [B, Sq, Dv], lse [B, Sq], and (with grads) every gradient, L = Σ out ∘ dout.
template <class Acc>
struct Reference {
  std::vector<double> out, lse, dq, dk, dv, dwq, dwk, dw;
  explicit Reference(const Inputs& in, bool grads = false) {
    const Shape& s = in.s;
    const auto n = [](std::int64_t a) { return static_cast<std::size_t>(a); };
    out.assign(n(s.B * s.Sq * s.Dv), 0), lse.assign(n(s.B * s.Sq), 0);
    dq.assign(n(s.B * s.Sq * s.Dq), 0), dk.assign(n(s.B * s.Skv * s.Dk), 0), dv.assign(n(s.B * s.Skv * s.Dv), 0);
    dwq.assign(n(s.A * s.Dq), 0), dwk.assign(n(s.A * s.Dk), 0), dw.assign(n(s.A), 0);
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t i = 0; i < s.Sq; ++i) {
        std::vector<Acc> qp(n(s.A)), e(n(s.Skv), -INFINITY), dp(n(s.Skv));
        std::vector<std::vector<Acc>> t(n(s.Skv), std::vector<Acc>(n(s.A)));
        for (std::int64_t a = 0; a < s.A; ++a)
          for (std::int64_t c = 0; c < s.Dq; ++c) qp[n(a)] += Acc(in.wq[n(a * s.Dq + c)]) * Acc(in.q[n((b * s.Sq + i) * s.Dq + c)]);
        Acc mx = -INFINITY;
        for (std::int64_t j = 0; j < s.Skv; ++j) {
          const double bias = in.bias(b, i, j);
          if (bias == -INFINITY) continue;
          Acc score = 0;
          for (std::int64_t a = 0; a < s.A; ++a) {
            Acc kp = 0;
            for (std::int64_t c = 0; c < s.Dk; ++c) kp += Acc(in.wk[n(a * s.Dk + c)]) * Acc(in.k[n((b * s.Skv + j) * s.Dk + c)]);
            t[n(j)][n(a)] = std::tanh(qp[n(a)] + kp);
            score += Acc(in.w[n(a)]) * t[n(j)][n(a)];
          }
          e[n(j)] = score + Acc(bias);
          mx = std::max(mx, e[n(j)]);
        }
        const std::size_t row = n(b * s.Sq + i);
        if (mx == -INFINITY) {
          lse[row] = -INFINITY;
          continue;
        }
        Acc sum = 0;
        for (Acc& x : e) sum += (x = std::exp(x - mx));
        for (Acc& x : e) x /= sum;
        lse[row] = static_cast<double>(mx + std::log(sum));
        for (std::int64_t j = 0; j < s.Skv; ++j)
          for (std::int64_t c = 0; c < s.Dv; ++c) out[row * n(s.Dv) + n(c)] += e[n(j)] * Acc(in.v[n((b * s.Skv + j) * s.Dv + c)]);
        if (!grads) continue;
        Acc D = 0;
        for (std::int64_t j = 0; j < s.Skv; ++j) {
          for (std::int64_t c = 0; c < s.Dv; ++c) {
            dp[n(j)] += Acc(in.dout[row * n(s.Dv) + n(c)]) * Acc(in.v[n((b * s.Skv + j) * s.Dv + c)]);
            dv[n((b * s.Skv + j) * s.Dv + c)] += e[n(j)] * Acc(in.dout[row * n(s.Dv) + n(c)]);
          }
          D += e[n(j)] * dp[n(j)];
        }
        for (std::int64_t j = 0; j < s.Skv; ++j) {
          if (in.bias(b, i, j) == -INFINITY) continue;
          const Acc ds = e[n(j)] * (dp[n(j)] - D);
          for (std::int64_t a = 0; a < s.A; ++a) {
            const Acc th = t[n(j)][n(a)], g = ds * Acc(in.w[n(a)]) * (1 - th * th);
            dw[n(a)] += ds * th;
            for (std::int64_t c = 0; c < s.Dq; ++c) {
              dq[n((b * s.Sq + i) * s.Dq + c)] += g * Acc(in.wq[n(a * s.Dq + c)]);
              dwq[n(a * s.Dq + c)] += g * Acc(in.q[n((b * s.Sq + i) * s.Dq + c)]);
            }
            for (std::int64_t c = 0; c < s.Dk; ++c) {
              dk[n((b * s.Skv + j) * s.Dk + c)] += g * Acc(in.wk[n(a * s.Dk + c)]);
              dwk[n(a * s.Dk + c)] += g * Acc(in.k[n((b * s.Skv + j) * s.Dk + c)]);
            }
          }
        }
      }
  }
};

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  t.for_each_index([&](auto a, auto b, auto c, auto d) { out.push_back(t.get(a, b, c, d)); });
  return out;
}

// err(attn vs fp64) <= 2 err(fp32 formula vs fp64) + 4 ulp of the largest value.
void expect_rule(const char* name, const std::vector<double>& got, const std::vector<double>& ref,
                 const std::vector<double>& naive) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  double err = 0, naive_err = 0, scale = 0;
  for (std::size_t e = 0; e < ref.size(); ++e) {
    if (std::isinf(ref[e])) {
      EXPECT_EQ(got[e], ref[e]) << name << "[" << e << "]";
      continue;
    }
    ASSERT_FALSE(std::isnan(got[e])) << name << "[" << e << "] is NaN (unwritten?)";
    err = std::max(err, std::fabs(got[e] - ref[e]));
    naive_err = std::max(naive_err, std::fabs(naive[e] - ref[e]));
    scale = std::max(scale, std::fabs(ref[e]));
  }
  EXPECT_LE(err, 2 * naive_err + 4 * std::ldexp(1.0, -24) * std::max(scale, 1.0))
      << name << ": max error " << err << ", the fp32 formula's " << naive_err;
}

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  out.push_back({});
  out.push_back({.B = 3, .Sq = 113, .Skv = 203, .Dq = 32, .Dk = 24, .Dv = 16, .A = 33});
  out.push_back({.B = 1, .Sq = 1, .Skv = 1, .Dq = 1, .Dk = 1, .Dv = 1, .A = 1});
  out.push_back({.B = 2, .Sq = 7, .Skv = 13, .causal = Causal::top_left});
  out.push_back({.B = 3, .Sq = 13, .Skv = 7, .causal = Causal::bottom_right, .lens = true});
  out.push_back({.B = 2, .Sq = 9, .Skv = 11, .mask = 1});
  out.push_back({.B = 2, .Sq = 9, .Skv = 11, .lens = true, .mask = 2});
  out.push_back({.B = 2, .Sq = 5, .Skv = 0});
  return out;
}

class AdditiveCase : public ::testing::TestWithParam<Shape> {};

TEST_P(AdditiveCase, ForwardAndBackwardMatchFp64) {
  const Inputs in(GetParam(), 17);
  const Shape& s = in.s;
  const Reference<double> ref(in, true);
  const Reference<float> naive(in, true);
  for (int threads : {1, 2}) {
    Tensor out = Tensor::plain(DType::f32, {s.B, s.Sq, s.Dv}), lse = Tensor::plain(DType::f32, {s.B, s.Sq});
    out.poison(), lse.poison();
    AdditiveParams params = in.params;
    params.threads = threads;
    const Status st = additive_attention(in.tq.view, in.tk.view, in.tv.view, in.weights(), out.view, params, lse.view);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_rule("out", values(out), ref.out, naive.out);
    expect_rule("lse", values(lse), ref.lse, naive.lse);

    Tensor dq = Tensor::plain(DType::f32, {s.B, s.Sq, s.Dq}), dk = Tensor::plain(DType::f32, {s.B, s.Skv, s.Dk}),
           dv = Tensor::plain(DType::f32, {s.B, s.Skv, s.Dv}), dwq = Tensor::plain(DType::f32, {s.A, s.Dq}),
           dwk = Tensor::plain(DType::f32, {s.A, s.Dk}), dw = Tensor::plain(DType::f32, {s.A});
    for (Tensor* t : {&dq, &dk, &dv, &dwq, &dwk, &dw}) t->poison();
    const Status sb = additive_attention_backward(in.tq.view, in.tk.view, in.tv.view, in.weights(), in.tdout.view,
                                                  {dq.view, dk.view, dv.view, dwq.view, dwk.view, dw.view}, params);
    ASSERT_TRUE(sb.ok()) << sb.message();
    expect_rule("dq", values(dq), ref.dq, naive.dq);
    expect_rule("dk", values(dk), ref.dk, naive.dk);
    expect_rule("dv", values(dv), ref.dv, naive.dv);
    expect_rule("dw_q", values(dwq), ref.dwq, naive.dwq);
    expect_rule("dw_k", values(dwk), ref.dwk, naive.dwk);
    expect_rule("dw", values(dw), ref.dw, naive.dw);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AdditiveCase, ::testing::ValuesIn(shapes()), [](const auto& info) {
  const Shape& s = info.param;
  return "B" + std::to_string(s.B) + "_q" + std::to_string(s.Sq) + "_k" + std::to_string(s.Skv) + "_A" +
         std::to_string(s.A) + (s.causal == Causal::top_left ? "_causalTL" : s.causal == Causal::bottom_right ? "_causalBR" : "") +
         (s.lens ? "_lens" : "") + (s.mask ? "_mask" + std::to_string(s.mask) : "");
});

// The reference's gradients against central differences of its own loss (fp64), every input and weight.
TEST(Additive, ReferenceGradientsMatchFiniteDifferences) {
  for (Shape shape : {Shape{.B = 2, .Sq = 3, .Skv = 4, .Dq = 3, .Dk = 2, .Dv = 2, .A = 3, .causal = Causal::bottom_right},
                      Shape{.B = 2, .Sq = 3, .Skv = 5, .Dq = 2, .Dk = 3, .Dv = 2, .A = 4, .lens = true, .mask = 1}}) {
    Inputs in(shape, 5);
    const Reference<double> analytic(in, true);
    auto loss = [&] {
      const Reference<double> r(in);
      double l = 0;
      for (std::size_t e = 0; e < r.out.size(); ++e) l += r.out[e] * in.dout[e];
      return l;
    };
    for (auto [name, x, g] : {std::tuple{"q", &in.q, &analytic.dq}, {"k", &in.k, &analytic.dk}, {"v", &in.v, &analytic.dv},
                              {"w_q", &in.wq, &analytic.dwq}, {"w_k", &in.wk, &analytic.dwk}, {"w", &in.w, &analytic.dw}}) {
      double worst = 0;
      for (std::size_t e = 0; e < x->size(); ++e) {
        const double x0 = (*x)[e], h = 1e-6;
        (*x)[e] = x0 + h;
        const double lp = loss();
        (*x)[e] = x0 - h;
        const double lm = loss();
        (*x)[e] = x0;
        worst = std::max(worst, std::fabs((lp - lm) / (2 * h) - (*g)[e]));
      }
      EXPECT_LT(worst, 1e-7) << name;
    }
  }
}

TEST(Additive, BadInputNamesTheParameterAndWritesNothing) {
  const Inputs in(Shape{}, 3);
  const Shape& s = in.s;
  Tensor out = Tensor::plain(DType::f32, {s.B, s.Sq, s.Dv});
  out.poison();
  const std::vector<unsigned char> before = out.storage;
  Tensor wrong = Tensor::plain(DType::f32, {s.A + 1, s.Dq});
  Tensor lens = Tensor::plain(DType::i32, {s.B});
  lens.set(s.Skv + 1, 0);
  Tensor nan_mask = Tensor::plain(DType::f32, {s.Sq, s.Skv});
  nan_mask.set(NAN, 2, 3);
  struct Bad {
    std::function<Status()> call;
    const char* name;
  };
  AdditiveParams with_lens, with_mask, with_threads;
  with_lens.kv_lens = lens.view, with_mask.mask = nan_mask.view, with_threads.threads = -1;
  const AdditiveWeights w = in.weights();
  const Bad cases[] = {
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, {wrong.view, w.w_k, w.w}, out.view); }, "w_q"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, {w.w_q, wrong.view, w.w}, out.view); }, "w_k"},
      {[&] { return additive_attention(in.tq.view, in.tv.view, in.tk.view, w, out.view); }, "w_k"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tq.view, w, out.view); }, "v"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, w, out.view, with_lens); }, "kv_lens"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, w, out.view, with_mask); }, "mask"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, w, out.view, with_threads); }, "threads"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, w, in.tq.view); }, "out"},
      {[&] { return additive_attention(in.tq.view, in.tk.view, in.tv.view, w, out.view, {}, out.view); }, "lse"},
  };
  for (const Bad& c : cases) {
    const Status st = c.call();
    EXPECT_FALSE(st.ok()) << c.name;
    EXPECT_EQ(st.param(), c.name) << st.message();
    EXPECT_NE(st.message().find("expected"), std::string::npos) << st.message();
    EXPECT_EQ(out.storage, before) << c.name << ": written despite the error";
  }
}

}  // namespace
}  // namespace attn::test
