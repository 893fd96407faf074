// MultiHeadAttention against an fp64 module written here from the formula (random weights, MHA/GQA/MQA,
// biases, masks, cross-attention), parameter counts, decode through both caches, and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn/cost.h"
#include "attn/mha.h"
#include "support.h"

namespace attn::test {
namespace {

// The module as the formula reads, in precision T: projections, per-head softmax(scale·QKᵀ + mask) V with
// the scores materialised, concatenation, output projection. x_q [B, Sq, d], x_kv [B, Skv, d].
// `lens` (may be empty) are key lengths per batch; causal is bottom-right (equal to top-left when Sq = Skv).
template <class T>
std::vector<double> module(const MultiHeadAttention& m, const std::vector<double>& x_q, const std::vector<double>& x_kv,
                           std::int64_t B, std::int64_t Sq, std::int64_t Skv, bool causal,
                           const std::vector<std::int64_t>& lens) {
  const MhaConfig& c = m.config();
  const MhaWeights& w = m.weights();
  const std::int64_t d = c.d_model, hq = c.heads, hkv = c.kv_heads, dk = c.head_dim, dv = c.v_head_dim;
  auto lin = [&](const std::vector<double>& x, std::int64_t rows, std::int64_t in, const std::vector<float>& W,
                 const std::vector<float>& bias, std::int64_t out) {
    std::vector<T> y(static_cast<std::size_t>(rows * out));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        T acc = bias.empty() ? T(0) : T(bias[o]);
        for (std::int64_t i = 0; i < in; ++i) acc += T(x[r * in + i]) * T(W[o * in + i]);
        y[r * out + o] = acc;
      }
    return y;
  };
  const std::vector<T> q = lin(x_q, B * Sq, d, w.w_q, w.b_q, hq * dk);
  const std::vector<T> k = lin(x_kv, B * Skv, d, w.w_k, w.b_k, hkv * dk);
  const std::vector<T> v = lin(x_kv, B * Skv, d, w.w_v, w.b_v, hkv * dv);
  std::vector<double> y(static_cast<std::size_t>(B * Sq * hq * dv), 0.0);
  const T scale = T(1) / std::sqrt(T(dk));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = lens.empty() ? Skv : lens[b];
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t g = h / (hq / hkv);
      for (std::int64_t i = 0; i < Sq; ++i) {
        std::vector<T> s(static_cast<std::size_t>(Skv), -std::numeric_limits<T>::infinity());
        T mx = -std::numeric_limits<T>::infinity();
        for (std::int64_t j = 0; j < len; ++j) {
          if (causal && j > i + len - Sq) continue;
          T dot = 0;
          for (std::int64_t e = 0; e < dk; ++e) dot += q[((b * Sq + i) * hq + h) * dk + e] * k[((b * Skv + j) * hkv + g) * dk + e];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        T sum = 0;
        for (auto& e : s) sum += (e = std::isinf(e) ? T(0) : std::exp(e - mx));
        for (std::int64_t e = 0; e < dv && sum > 0; ++e) {
          T acc = 0;
          for (std::int64_t j = 0; j < Skv; ++j) acc += s[j] * v[((b * Skv + j) * hkv + g) * dv + e];
          y[((b * Sq + i) * hq + h) * dv + e] = acc / sum;
        }
      }
    }
  }
  const std::vector<T> out = lin(y, B * Sq, hq * dv, w.w_o, w.b_o, d);
  return std::vector<double>(out.begin(), out.end());
}

std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(n);
  for (double& e : x) e = u(rng);
  return x;
}

// Rows of d values with a pitch of d + 3 (a strided view), as the module's input.
struct Rows {
  std::vector<float> data;
  TensorView view;
  Rows(const std::vector<double>& x, std::int64_t B, std::int64_t S, std::int64_t d, std::int64_t pad = 3) {
    data.assign(static_cast<std::size_t>(B * S * (d + pad) + 1), std::numeric_limits<float>::quiet_NaN());
    for (std::int64_t r = 0; r < B * S; ++r)
      for (std::int64_t i = 0; i < d; ++i) data[r * (d + pad) + i] = static_cast<float>(x[r * d + i]);
    view.data = data.data();
    view.rank = 3;
    view.shape = {B, S, d, 0};
    view.strides = {S * (d + pad), d + pad, 1, 0};
  }
  double at(std::int64_t r, std::int64_t i) const { return data[r * (view.strides[1]) + i]; }
};

double atol_for(const std::vector<double>& ref) {
  double m = 1e-3;
  for (double x : ref) m = std::max(m, std::fabs(x));
  return 4 * std::ldexp(1.0, -24) * m;
}

struct MhaCase {
  const char* name;
  MhaConfig config;
  std::int64_t B, Sq, Skv;  // Skv != Sq: cross-attention
  bool causal, lens;
};

void PrintTo(const MhaCase& c, std::ostream* os) { *os << c.name; }

class MhaVsReference : public ::testing::TestWithParam<MhaCase> {};

TEST_P(MhaVsReference, Forward) {
  const MhaCase& c = GetParam();
  MultiHeadAttention m;
  ASSERT_TRUE(MultiHeadAttention::create(c.config, &m).ok());
  m.init_random(17);
  const std::int64_t d = c.config.d_model;
  std::mt19937_64 rng(3);
  const std::vector<double> xq = random_vector(static_cast<std::size_t>(c.B * c.Sq * d), rng);
  const std::vector<double> xkv = c.Skv == c.Sq ? xq : random_vector(static_cast<std::size_t>(c.B * c.Skv * d), rng);
  std::vector<std::int64_t> lens;
  if (c.lens)
    for (std::int64_t b = 0; b < c.B; ++b) lens.push_back(b % 2 ? c.Skv : std::max<std::int64_t>(c.Skv / 2 + b, 1));
  const std::vector<double> ref = module<double>(m, xq, xkv, c.B, c.Sq, c.Skv, c.causal, lens);
  const std::vector<double> naive = module<float>(m, xq, xkv, c.B, c.Sq, c.Skv, c.causal, lens);

  Rows in_q(xq, c.B, c.Sq, d), in_kv(xkv, c.B, c.Skv, d), out(std::vector<double>(ref.size(), 0.0), c.B, c.Sq, d, 5);
  std::fill(out.data.begin(), out.data.end(), std::numeric_limits<float>::quiet_NaN());
  Params p;
  if (c.causal) p.causal = Causal::bottom_right;
  std::vector<std::int64_t> lens_buf = lens;
  if (c.lens) p.kv_lens = TensorView::contiguous(lens_buf.data(), DType::i64, {c.B});
  const Status s = c.Skv == c.Sq ? m.forward(in_q.view, out.view, p) : m.forward_cross(in_q.view, in_kv.view, out.view, p);
  ASSERT_TRUE(s.ok()) << s.message();
  const Agreement a = agree(ref, [&](std::size_t i) { return out.at(static_cast<std::int64_t>(i) / d, i % d); },
                            [&](std::size_t i) { return naive[i]; }, atol_for(ref));
  EXPECT_TRUE(a.ok()) << a.describe();
  // The row padding of out is untouched.
  for (std::int64_t r = 0; r < c.B * c.Sq; ++r)
    for (std::int64_t i = d; i < d + 5; ++i) EXPECT_TRUE(std::isnan(out.data[r * (d + 5) + i]));
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MhaVsReference,
    ::testing::Values(MhaCase{"mha", {32, 4, 0, 0, 0, false}, 2, 7, 7, false, false},
                      MhaCase{"mha_causal_bias", {32, 4, 0, 0, 0, true}, 2, 13, 13, true, false},
                      MhaCase{"gqa_headdim_ne_d_over_h", {48, 6, 2, 12, 0, true}, 3, 9, 9, true, false},
                      MhaCase{"gqa_dv_ne_dk_padding", {40, 4, 2, 8, 12, false}, 3, 11, 11, false, true},
                      MhaCase{"mqa_causal", {40, 8, 1, 0, 0, false}, 1, 113, 113, true, false},
                      MhaCase{"cross_mha", {32, 4, 0, 0, 0, true}, 2, 5, 17, false, false},
                      MhaCase{"cross_gqa_padding", {24, 6, 3, 0, 0, false}, 3, 1, 29, false, true},
                      MhaCase{"one_token", {16, 2, 1, 0, 0, true}, 1, 1, 1, true, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Mha, ParameterCountMatchesTheSeeds) {
  MultiHeadAttention m;
  ASSERT_TRUE(MultiHeadAttention::create({512, 8, 0, 64, 0, false}, &m).ok());
  EXPECT_EQ(m.parameter_count(), 1048576);  // 512 · 8 · (3·64 + 64)
  ASSERT_TRUE(MultiHeadAttention::create({512, 8, 0, 0, 0, true}, &m).ok());
  EXPECT_EQ(m.parameter_count(), 1048576 + 3 * 512 + 512);
  // GQA (LLaMA-2-70B's attention: d 8192, 64 query heads, 8 KV heads of 128):
  // 8192·(8192 + 1024 + 1024) + 8192·8192.
  ASSERT_TRUE(MultiHeadAttention::create({8192, 64, 8, 0, 0, false}, &m).ok());
  EXPECT_EQ(m.parameter_count(), 8192LL * 10240 + 8192LL * 8192);
  // Every weight really has the counted size.
  ASSERT_TRUE(MultiHeadAttention::create({40, 4, 2, 8, 12, true}, &m).ok());
  const MhaWeights& w = m.weights();
  const std::size_t total = w.w_q.size() + w.w_k.size() + w.w_v.size() + w.w_o.size() + w.b_q.size() + w.b_k.size() +
                            w.b_v.size() + w.b_o.size();
  EXPECT_EQ(static_cast<std::int64_t>(total), m.parameter_count());
}

// Decoding token by token through a KVCache / a PagedKVCache gives what one causal forward over the whole
// sequence gives.
TEST(Mha, DecodeThroughCachesEqualsCausalForward) {
  for (MhaConfig config : {MhaConfig{32, 4, 4, 0, 0, true}, MhaConfig{48, 6, 2, 0, 0, false}, MhaConfig{32, 4, 1, 8, 6, true}}) {
    SCOPED_TRACE("heads " + std::to_string(config.heads) + "/" + std::to_string(config.kv_heads));
    MultiHeadAttention m;
    ASSERT_TRUE(MultiHeadAttention::create(config, &m).ok());
    m.init_random(23);
    const MhaConfig& c = m.config();
    const std::int64_t d = c.d_model, S = 19, B = 3;
    std::mt19937_64 rng(9);
    const std::vector<double> x = random_vector(static_cast<std::size_t>(B * S * d), rng);
    const std::vector<double> ref = module<double>(m, x, x, B, S, S, true, {});
    const std::vector<double> naive = module<float>(m, x, x, B, S, S, true, {});
    const double atol = atol_for(ref);
    auto naive_at = [&](std::size_t i) { return naive[i]; };

    // Contiguous cache, one sequence (batch row 0), tokens 1, 2, 3, ... at a time.
    KVCache cache;
    ASSERT_TRUE(KVCache::create(c.kv_heads, c.head_dim, c.v_head_dim, S, &cache).ok());
    std::vector<double> got(static_cast<std::size_t>(S * d));
    for (std::int64_t t = 0, n = 1; t < S; t += n, ++n) {
      n = std::min(n, S - t);
      std::vector<double> xs(x.begin() + t * d, x.begin() + (t + n) * d);
      Rows in(xs, 1, n, d), out(std::vector<double>(static_cast<std::size_t>(n * d)), 1, n, d);
      const Status s = m.forward_cached(in.view, cache, out.view);
      ASSERT_TRUE(s.ok()) << s.message();
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t i = 0; i < d; ++i) got[(t + r) * d + i] = out.at(r, i);
    }
    std::vector<double> ref0(ref.begin(), ref.begin() + S * d);
    Agreement a = agree(ref0, [&](std::size_t i) { return got[i]; }, naive_at, atol);
    EXPECT_TRUE(a.ok()) << "contiguous: " << a.describe();

    // Paged cache, all B sequences one token per step in one batched call.
    PagedKVCache paged;
    ASSERT_TRUE(PagedKVCache::create(c.kv_heads, c.head_dim, c.v_head_dim, 3, B * 7, &paged).ok());
    std::vector<std::int64_t> ids;
    for (std::int64_t b = 0; b < B; ++b) ids.push_back(paged.add_sequence());
    std::vector<double> all(static_cast<std::size_t>(B * S * d));
    for (std::int64_t t = 0; t < S; ++t) {
      std::vector<double> xs;
      for (std::int64_t b = 0; b < B; ++b) xs.insert(xs.end(), x.begin() + (b * S + t) * d, x.begin() + (b * S + t + 1) * d);
      Rows in(xs, B, 1, d), out(std::vector<double>(static_cast<std::size_t>(B * d)), B, 1, d);
      const Status s = m.forward_paged(in.view, paged, ids, out.view);
      ASSERT_TRUE(s.ok()) << s.message();
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < d; ++i) all[(b * S + t) * d + i] = out.at(b, i);
    }
    a = agree(ref, [&](std::size_t i) { return all[i]; }, naive_at, atol);
    EXPECT_TRUE(a.ok()) << "paged: " << a.describe();
  }
}

TEST(Mha, BadInputIsAClearError) {
  MultiHeadAttention m;
  Status s = MultiHeadAttention::create({32, 6, 0, 0, 0, false}, &m);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s.message();
  s = MultiHeadAttention::create({32, 4, 3, 0, 0, false}, &m);
  EXPECT_NE(s.message().find("kv_heads: 3; expected a divisor of heads = 4"), std::string::npos) << s.message();
  ASSERT_TRUE(MultiHeadAttention::create({32, 4, 2, 0, 0, false}, &m).ok());
  std::vector<float> x(2 * 5 * 32, 0.5f), out(2 * 5 * 32, std::numeric_limits<float>::quiet_NaN());
  s = m.forward(TensorView::contiguous(x.data(), DType::f32, {2, 5, 32}), TensorView::contiguous(out.data(), DType::f32, {2, 4, 32}));
  EXPECT_NE(s.message().find("out"), std::string::npos) << s.message();
  s = m.forward(TensorView::contiguous(x.data(), DType::f32, {2, 10, 16}), TensorView::contiguous(out.data(), DType::f32, {2, 10, 16}));
  EXPECT_NE(s.message().find("x_q: width 16; expected d_model = 32"), std::string::npos) << s.message();
  s = m.forward(TensorView::contiguous(x.data(), DType::f32, {10, 32}), TensorView::contiguous(out.data(), DType::f32, {10, 32}));
  EXPECT_NE(s.message().find("rank 2; expected rank 3"), std::string::npos) << s.message();
  m.weights().w_k.pop_back();
  s = m.forward(TensorView::contiguous(x.data(), DType::f32, {2, 5, 32}), TensorView::contiguous(out.data(), DType::f32, {2, 5, 32}));
  EXPECT_NE(s.message().find("w_k: 511 values; expected 512 [16, 32]"), std::string::npos) << s.message();
  for (float e : out) EXPECT_TRUE(std::isnan(e));
  m.weights().w_k.push_back(0.0f);
  // A cache whose head layout does not match the module.
  KVCache cache;
  ASSERT_TRUE(KVCache::create(4, 8, 8, 10, &cache).ok());
  s = m.forward_cached(TensorView::contiguous(x.data(), DType::f32, {1, 1, 32}), cache, TensorView::contiguous(out.data(), DType::f32, {1, 1, 32}));
  EXPECT_NE(s.message().find("cache: holds 4 heads"), std::string::npos) << s.message();
  // Past the cache's capacity: an error, and the cache is unchanged.
  ASSERT_TRUE(KVCache::create(2, 8, 8, 3, &cache).ok());
  s = m.forward_cached(TensorView::contiguous(x.data(), DType::f32, {1, 4, 32}), cache, TensorView::contiguous(out.data(), DType::f32, {1, 4, 32}));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.param(), "cache") << s.message();  // (the cache's room, not the step's internal k)
  EXPECT_EQ(cache.length(), 0);
  // A NaN in x reaches an i8 cache as its projected keys: named x, with the batch row.
  KVCache i8;
  ASSERT_TRUE(KVCache::create(2, 8, 8, 10, DType::i8, &i8).ok());
  std::vector<float> x_nan(x.begin(), x.begin() + 32);
  x_nan[3] = std::numeric_limits<float>::quiet_NaN();
  s = m.forward_cached(TensorView::contiguous(x_nan.data(), DType::f32, {1, 1, 32}), i8,
                       TensorView::contiguous(out.data(), DType::f32, {1, 1, 32}));
  EXPECT_EQ(s.param(), "x") << s.message();
  EXPECT_NE(s.message().find("projected keys of batch row 0"), std::string::npos) << s.message();
  EXPECT_EQ(i8.length(), 0);
  // A paged step that does not fit: nothing appended to any sequence.
  PagedKVCache paged;
  ASSERT_TRUE(PagedKVCache::create(2, 8, 8, 2, 2, &paged).ok());
  const std::int64_t a = paged.add_sequence(), b = paged.add_sequence();
  s = m.forward_paged(TensorView::contiguous(x.data(), DType::f32, {2, 3, 32}), paged, {a, b},
                      TensorView::contiguous(out.data(), DType::f32, {2, 3, 32}));
  EXPECT_NE(s.message().find("needs 4 more pages"), std::string::npos) << s.message();
  std::int64_t len = -1;
  ASSERT_TRUE(paged.length(a, &len).ok());
  EXPECT_EQ(len, 0);
  EXPECT_EQ(paged.free_pages(), 2);
}

// ---- backward -----------------------------------------------------------------------------------------

// Gradients of L = Σ out ∘ G for the module as the formula reads, in precision T, materialising every
// head's P (the same masking as module()): the chain rule through the output projection, the softmax
// (dS = P ∘ (dP − rowsum(P ∘ dP))) and the input projections.
struct RefGrads {
  std::vector<double> x_q, x_kv, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;
};

template <class T>
RefGrads module_grads(const MultiHeadAttention& m, const std::vector<double>& x_q, const std::vector<double>& x_kv,
                      std::int64_t B, std::int64_t Sq, std::int64_t Skv, bool causal,
                      const std::vector<std::int64_t>& lens, const std::vector<double>& G) {
  const MhaConfig& c = m.config();
  const MhaWeights& w = m.weights();
  const std::int64_t d = c.d_model, hq = c.heads, hkv = c.kv_heads, dk = c.head_dim, dv = c.v_head_dim;
  const std::int64_t wq = hq * dk, wk = hkv * dk, wv = hkv * dv, wo = hq * dv, Nq = B * Sq, Nkv = B * Skv;
  auto lin = [&](const std::vector<T>& x, std::int64_t rows, std::int64_t in, const std::vector<float>& W,
                 const std::vector<float>& bias, std::int64_t out) {
    std::vector<T> y(static_cast<std::size_t>(rows * out));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        T acc = bias.empty() ? T(0) : T(bias[o]);
        for (std::int64_t i = 0; i < in; ++i) acc += x[r * in + i] * T(W[o * in + i]);
        y[r * out + o] = acc;
      }
    return y;
  };
  // ∂W = ∂Yᵀ X, ∂b = Σ_rows ∂Y, ∂X = ∂Y W for Y = X Wᵀ + b.
  auto lin_back = [&](const std::vector<T>& x, const std::vector<T>& dy, std::int64_t rows, std::int64_t in,
                      const std::vector<float>& W, std::int64_t out, std::vector<double>* dw, std::vector<double>* db,
                      std::vector<T>* dx) {
    dw->assign(static_cast<std::size_t>(out * in), 0.0);
    if (c.bias) db->assign(static_cast<std::size_t>(out), 0.0);
    for (std::int64_t o = 0; o < out; ++o) {
      for (std::int64_t i = 0; i < in; ++i) {
        T acc = 0;
        for (std::int64_t r = 0; r < rows; ++r) acc += dy[r * out + o] * x[r * in + i];
        (*dw)[o * in + i] = acc;
      }
      if (c.bias) {
        T acc = 0;
        for (std::int64_t r = 0; r < rows; ++r) acc += dy[r * out + o];
        (*db)[o] = acc;
      }
    }
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < in; ++i) {
        T acc = 0;
        for (std::int64_t o = 0; o < out; ++o) acc += dy[r * out + o] * T(W[o * in + i]);
        (*dx)[r * in + i] += acc;
      }
  };
  const std::vector<T> xq(x_q.begin(), x_q.end()), xkv(x_kv.begin(), x_kv.end()), g(G.begin(), G.end());
  const std::vector<T> q = lin(xq, Nq, d, w.w_q, w.b_q, wq), k = lin(xkv, Nkv, d, w.w_k, w.b_k, wk),
                       v = lin(xkv, Nkv, d, w.w_v, w.b_v, wv);
  const T scale = T(1) / std::sqrt(T(dk));
  std::vector<T> P(static_cast<std::size_t>(B * hq * Sq * Skv), T(0)), y(static_cast<std::size_t>(Nq * wo), T(0));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = lens.empty() ? Skv : lens[b];
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t gr = h / (hq / hkv);
      for (std::int64_t i = 0; i < Sq; ++i) {
        T* p = &P[((b * hq + h) * Sq + i) * Skv];
        std::vector<bool> on(static_cast<std::size_t>(Skv), false);
        T mx = -std::numeric_limits<T>::infinity(), sum = 0;
        for (std::int64_t j = 0; j < len; ++j) {
          if (causal && j > i + len - Sq) continue;
          T dot = 0;
          for (std::int64_t e = 0; e < dk; ++e) dot += q[(b * Sq + i) * wq + h * dk + e] * k[(b * Skv + j) * wk + gr * dk + e];
          p[j] = dot * scale, on[j] = true, mx = std::max(mx, p[j]);
        }
        for (std::int64_t j = 0; j < Skv; ++j) sum += (p[j] = on[j] ? std::exp(p[j] - mx) : T(0));
        for (std::int64_t j = 0; j < Skv; ++j) p[j] = sum > 0 ? p[j] / sum : T(0);
        for (std::int64_t e = 0; e < dv; ++e) {
          T acc = 0;
          for (std::int64_t j = 0; j < Skv; ++j) acc += p[j] * v[(b * Skv + j) * wv + gr * dv + e];
          y[(b * Sq + i) * wo + h * dv + e] = acc;
        }
      }
    }
  }
  RefGrads r;
  std::vector<T> dy(static_cast<std::size_t>(Nq * wo), T(0)), dxq(static_cast<std::size_t>(Nq * d), T(0)),
      dxkv(static_cast<std::size_t>(Nkv * d), T(0));
  lin_back(y, g, Nq, wo, w.w_o, d, &r.w_o, &r.b_o, &dy);
  std::vector<T> dq(static_cast<std::size_t>(Nq * wq), T(0)), dkk(static_cast<std::size_t>(Nkv * wk), T(0)),
      dvv(static_cast<std::size_t>(Nkv * wv), T(0));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t gr = h / (hq / hkv);
      for (std::int64_t i = 0; i < Sq; ++i) {
        const T* p = &P[((b * hq + h) * Sq + i) * Skv];
        const T* dyi = &dy[(b * Sq + i) * wo + h * dv];
        std::vector<T> dp(static_cast<std::size_t>(Skv), T(0));
        T D = 0;
        for (std::int64_t j = 0; j < Skv; ++j) {
          for (std::int64_t e = 0; e < dv; ++e) dp[j] += dyi[e] * v[(b * Skv + j) * wv + gr * dv + e];
          D += p[j] * dp[j];
        }
        for (std::int64_t j = 0; j < Skv; ++j) {
          const T ds = p[j] * (dp[j] - D);
          for (std::int64_t e = 0; e < dk; ++e) {
            dq[(b * Sq + i) * wq + h * dk + e] += scale * ds * k[(b * Skv + j) * wk + gr * dk + e];
            dkk[(b * Skv + j) * wk + gr * dk + e] += scale * ds * q[(b * Sq + i) * wq + h * dk + e];
          }
          for (std::int64_t e = 0; e < dv; ++e) dvv[(b * Skv + j) * wv + gr * dv + e] += p[j] * dyi[e];
        }
      }
    }
  lin_back(xq, dq, Nq, d, w.w_q, wq, &r.w_q, &r.b_q, &dxq);
  lin_back(xkv, dkk, Nkv, d, w.w_k, wk, &r.w_k, &r.b_k, &dxkv);
  lin_back(xkv, dvv, Nkv, d, w.w_v, wv, &r.w_v, &r.b_v, &dxkv);
  r.x_q.assign(dxq.begin(), dxq.end());
  r.x_kv.assign(dxkv.begin(), dxkv.end());
  return r;
}

// The gradients of RefGrads / MhaGrads by name, for tables of checks.
struct Named {
  const char* name;
  std::vector<double> RefGrads::*ref;
  std::vector<float> MhaWeights::*weight;  // null for the inputs
};
constexpr Named kWeightGrads[] = {{"w_q", &RefGrads::w_q, &MhaWeights::w_q}, {"w_k", &RefGrads::w_k, &MhaWeights::w_k},
                                  {"w_v", &RefGrads::w_v, &MhaWeights::w_v}, {"w_o", &RefGrads::w_o, &MhaWeights::w_o},
                                  {"b_q", &RefGrads::b_q, &MhaWeights::b_q}, {"b_k", &RefGrads::b_k, &MhaWeights::b_k},
                                  {"b_v", &RefGrads::b_v, &MhaWeights::b_v}, {"b_o", &RefGrads::b_o, &MhaWeights::b_o}};

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

// The fp64 reference gradients against central differences of the fp64 forward (module<double>), for every
// input and weight element: MHA with bias, GQA + causal + key lengths, cross-attention with Dv != Dk.
TEST(MhaBackward, ReferenceMatchesFiniteDifferences) {
  struct Fd {
    MhaConfig config;
    std::int64_t B, Sq, Skv;
    bool causal, lens;
  };
  for (const Fd& f : {Fd{{8, 2, 0, 0, 0, true}, 2, 4, 4, false, false}, Fd{{12, 4, 2, 3, 0, true}, 3, 5, 5, true, true},
                      Fd{{8, 2, 1, 4, 3, false}, 2, 3, 6, false, true}}) {
    MultiHeadAttention m;
    ASSERT_TRUE(MultiHeadAttention::create(f.config, &m).ok());
    m.init_random(5);
    const std::int64_t d = f.config.d_model;
    SCOPED_TRACE("d " + std::to_string(d) + ", Sq " + std::to_string(f.Sq) + ", Skv " + std::to_string(f.Skv));
    std::mt19937_64 rng(11);
    std::vector<double> xq = random_vector(static_cast<std::size_t>(f.B * f.Sq * d), rng);
    std::vector<double> xkv = random_vector(static_cast<std::size_t>(f.B * f.Skv * d), rng);
    const std::vector<double> G = random_vector(static_cast<std::size_t>(f.B * f.Sq * d), rng);
    std::vector<std::int64_t> lens;
    if (f.lens)
      for (std::int64_t b = 0; b < f.B; ++b) lens.push_back(b == 0 ? f.Skv : 1 + b);
    const RefGrads an = module_grads<double>(m, xq, xkv, f.B, f.Sq, f.Skv, f.causal, lens, G);
    auto loss = [&] {
      const std::vector<double> out = module<double>(m, xq, xkv, f.B, f.Sq, f.Skv, f.causal, lens);
      double l = 0;
      for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * G[i];
      return l;
    };
    const double h = 1e-4;
    auto check = [&](const char* name, const std::vector<double>& grad, auto get, auto set, std::size_t n) {
      ASSERT_EQ(grad.size(), n) << name;
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double x0 = get(i);
        // Weights are fp32: step to fp32 neighbours and divide by the step taken.
        const double xp = static_cast<float>(x0 + h), xm = static_cast<float>(x0 - h);
        set(i, xp);
        const double lp = loss();
        set(i, xm);
        const double lm = loss();
        set(i, x0);
        worst = std::max(worst, std::fabs((lp - lm) / (xp - xm) - grad[i]));
      }
      EXPECT_LE(worst, 1e-6 * std::max(1.0, max_abs(grad))) << name;
    };
    check("x_q", an.x_q, [&](std::size_t i) { return xq[i]; }, [&](std::size_t i, double x) { xq[i] = x; }, xq.size());
    check("x_kv", an.x_kv, [&](std::size_t i) { return xkv[i]; }, [&](std::size_t i, double x) { xkv[i] = x; }, xkv.size());
    for (const Named& n : kWeightGrads) {
      std::vector<float>& wt = m.weights().*n.weight;
      check(n.name, an.*n.ref, [&](std::size_t i) { return double(wt[i]); },
            [&](std::size_t i, double x) { wt[i] = static_cast<float>(x); }, wt.size());
    }
  }
}

class MhaBackwardVsReference : public ::testing::TestWithParam<MhaCase> {};

// The module's backward (attention_backward + sgemm) against the fp64 reference gradients, under the
// gradient tolerance rule: error ≤ 3 × error(naive fp32 reference) + atol.
TEST_P(MhaBackwardVsReference, Gradients) {
  const MhaCase& c = GetParam();
  MultiHeadAttention m;
  ASSERT_TRUE(MultiHeadAttention::create(c.config, &m).ok());
  m.init_random(17);
  const std::int64_t d = c.config.d_model;
  const bool self = c.Skv == c.Sq;
  std::mt19937_64 rng(3);
  const std::vector<double> xq = random_vector(static_cast<std::size_t>(c.B * c.Sq * d), rng);
  const std::vector<double> xkv = self ? xq : random_vector(static_cast<std::size_t>(c.B * c.Skv * d), rng);
  const std::vector<double> G = random_vector(static_cast<std::size_t>(c.B * c.Sq * d), rng);
  std::vector<std::int64_t> lens;
  if (c.lens)
    for (std::int64_t b = 0; b < c.B; ++b) lens.push_back(b % 2 ? c.Skv : std::max<std::int64_t>(c.Skv / 2 + b, 1));
  const RefGrads ref = module_grads<double>(m, xq, xkv, c.B, c.Sq, c.Skv, c.causal, lens, G);
  const RefGrads naive = module_grads<float>(m, xq, xkv, c.B, c.Sq, c.Skv, c.causal, lens, G);

  Rows in_q(xq, c.B, c.Sq, d), in_kv(xkv, c.B, c.Skv, d), out(std::vector<double>(G.size(), 0.0), c.B, c.Sq, d, 5),
      grad(G, c.B, c.Sq, d, 2);
  Params p;
  if (c.causal) p.causal = Causal::bottom_right;
  std::vector<std::int64_t> lens_buf = lens;
  if (c.lens) p.kv_lens = TensorView::contiguous(lens_buf.data(), DType::i64, {c.B});
  MhaSaved saved;
  Status s = self ? m.forward(in_q.view, out.view, p, &saved) : m.forward_cross(in_q.view, in_kv.view, out.view, p, &saved);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(saved.self, self);
  MhaGrads got;
  got.x_q.assign(3, std::numeric_limits<float>::quiet_NaN());  // replaced, not added to
  s = m.backward(in_q.view, self ? in_q.view : in_kv.view, saved, grad.view, &got, p);
  ASSERT_TRUE(s.ok()) << s.message();

  auto compare = [&](const std::string& name, const std::vector<double>& r, const std::vector<double>& n,
                     const std::vector<float>& f) {
    ASSERT_EQ(f.size(), r.size()) << name;
    const double atol = 16 * std::ldexp(1.0, -24) * std::max(max_abs(r), 1e-3);
    const Agreement a = agree(r, [&](std::size_t i) { return double(f[i]); }, [&](std::size_t i) { return n[i]; }, atol);
    EXPECT_TRUE(a.ok(3.0)) << name << ": " << a.describe();
  };
  if (self) {  // x fed both paths: the module's x_q is the sum, x_kv is empty
    std::vector<double> r = ref.x_q, n = naive.x_q;
    for (std::size_t i = 0; i < r.size(); ++i) r[i] += ref.x_kv[i], n[i] += naive.x_kv[i];
    compare("x", r, n, got.x_q);
    EXPECT_TRUE(got.x_kv.empty());
  } else {
    compare("x_q", ref.x_q, naive.x_q, got.x_q);
    compare("x_kv", ref.x_kv, naive.x_kv, got.x_kv);
  }
  for (const Named& n : kWeightGrads) compare(n.name, ref.*n.ref, naive.*n.ref, got.weights.*n.weight);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MhaBackwardVsReference,
    ::testing::Values(MhaCase{"mha", {32, 4, 0, 0, 0, false}, 2, 7, 7, false, false},
                      MhaCase{"mha_causal_bias", {32, 4, 0, 0, 0, true}, 2, 13, 13, true, false},
                      MhaCase{"gqa_causal_bias", {48, 6, 2, 12, 0, true}, 3, 9, 9, true, false},
                      MhaCase{"gqa_dv_ne_dk_padding", {40, 4, 2, 8, 12, true}, 3, 11, 11, false, true},
                      MhaCase{"mqa_causal", {40, 8, 1, 0, 0, false}, 1, 113, 113, true, false},
                      MhaCase{"cross_mha_bias", {32, 4, 0, 0, 0, true}, 2, 5, 17, false, false},
                      MhaCase{"cross_gqa_padding_causal", {24, 6, 3, 0, 0, false}, 3, 7, 29, true, true},
                      MhaCase{"one_token", {16, 2, 1, 0, 0, true}, 1, 1, 1, true, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MhaBackward, BadInputIsAClearErrorAndWritesNothing) {
  MultiHeadAttention m;
  ASSERT_TRUE(MultiHeadAttention::create({16, 2, 1, 0, 0, true}, &m).ok());
  m.init_random(1);
  std::vector<float> x(2 * 5 * 16, 0.25f), x2(2 * 3 * 16, -0.5f), out(2 * 5 * 16), g(2 * 5 * 16, 1.0f);
  const TensorView xv = TensorView::contiguous(x.data(), DType::f32, {2, 5, 16});
  const TensorView x2v = TensorView::contiguous(x2.data(), DType::f32, {2, 3, 16});
  const TensorView gv = TensorView::contiguous(g.data(), DType::f32, {2, 5, 16});
  Status s = m.forward(xv, TensorView::contiguous(out.data(), DType::f32, {2, 5, 16}), {}, nullptr);
  EXPECT_NE(s.message().find("saved: null"), std::string::npos) << s.message();
  MhaSaved saved;
  ASSERT_TRUE(m.forward(xv, TensorView::contiguous(out.data(), DType::f32, {2, 5, 16}), {}, &saved).ok());
  MhaGrads grads;
  grads.x_q = {7.0f};
  auto untouched = [&] { return grads.x_q.size() == 1 && grads.x_q[0] == 7.0f && grads.weights.w_q.empty(); };
  s = m.backward(xv, xv, saved, TensorView::contiguous(g.data(), DType::f32, {2, 4, 16}), &grads);
  EXPECT_NE(s.message().find("grad_out: shape [2, 4, d]; expected [2, 5, 16]"), std::string::npos) << s.message();
  EXPECT_TRUE(untouched());
  s = m.backward(xv, TensorView::contiguous(x.data(), DType::f32, {2, 5, 8}), saved, gv, &grads);
  EXPECT_NE(s.message().find("x_kv: width 8; expected d_model = 16"), std::string::npos) << s.message();
  s = m.backward(xv, x2v, saved, gv, &grads);  // a self-attention forward, but a different x_kv
  EXPECT_NE(s.message().find("x_kv: differs from x_q"), std::string::npos) << s.message();
  s = m.backward(xv, xv, saved, gv, nullptr);
  EXPECT_NE(s.message().find("grads: null"), std::string::npos) << s.message();
  MhaSaved cross;
  ASSERT_TRUE(m.forward_cross(xv, x2v, TensorView::contiguous(out.data(), DType::f32, {2, 5, 16}), {}, &cross).ok());
  s = m.backward(xv, xv, cross, gv, &grads);  // saved from a forward with 3 keys
  EXPECT_NE(s.message().find("saved: from a forward of batch 2, lengths 5/3; expected batch 2, lengths 5/5"),
            std::string::npos) << s.message();
  cross.lse.pop_back();
  s = m.backward(xv, x2v, cross, gv, &grads);
  EXPECT_NE(s.message().find("saved.lse: 19 values; expected 20"), std::string::npos) << s.message();
  m.weights().b_o.clear();
  s = m.backward(xv, xv, saved, gv, &grads);
  EXPECT_NE(s.message().find("b_o: 0 values; expected 16"), std::string::npos) << s.message();
  EXPECT_TRUE(untouched());
}

}  // namespace
}  // namespace attn::test
