// MultiHeadAttention: OpenBLAS projections around attn::attention.
#include "attn/mha.h"

#include <limits>
#include <new>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>

#include "attn/backward.h"
#include "attn/cost.h"
#include "mha/linear.h"

namespace attn {
namespace {

std::string str(std::int64_t x) { return std::to_string(x); }

struct Seq {
  std::int64_t batch = 0, len = 0;
};

// x: an f32 [B, S, width] view with a contiguous last dimension and a row pitch >= width.
Status check_rows(const char* name, const TensorView& x, std::int64_t width, Seq* seq) {
  if (x.rank != 3) return Status::Invalid(name, "rank " + str(x.rank) + "; expected rank 3 [B, S, d_model]");
  if (x.dtype != DType::f32) return Status::Invalid(name, std::string("dtype ") + dtype_name(x.dtype) + "; expected f32");
  if (x.shape[2] != width) return Status::Invalid(name, "width " + str(x.shape[2]) + "; expected d_model = " + str(width));
  if (x.shape[0] < 0 || x.shape[1] < 0) return Status::Invalid(name, "negative dimension; expected sizes >= 0");
  if (x.strides[2] != 1) return Status::Invalid(name, "last stride " + str(x.strides[2]) + "; expected 1 (contiguous rows)");
  if (x.shape[1] > 1 && x.strides[1] < width)
    return Status::Invalid(name, "row stride " + str(x.strides[1]) + "; expected >= d_model = " + str(width));
  if (x.numel() > 0 && !x.data) return Status::Invalid(name, "data is null; expected a buffer");
  seq->batch = x.shape[0];
  seq->len = x.shape[1];
  return Status::Ok();
}

// x_q, x_kv (same batch) and a third tensor shaped like x_q (`out` of a forward, `grad_out` of a backward).
Status check_inputs(const TensorView& x_q, const TensorView& x_kv, const char* name, const TensorView& like_q,
                    std::int64_t width, Seq* sq, Seq* skv) {
  Seq s3;
  if (Status s = check_rows("x_q", x_q, width, sq); !s) return s;
  if (Status s = check_rows("x_kv", x_kv, width, skv); !s) return s;
  if (Status s = check_rows(name, like_q, width, &s3); !s) return s;
  if (skv->batch != sq->batch)
    return Status::Invalid("x_kv", "batch " + str(skv->batch) + "; expected " + str(sq->batch) + " (as x_q)");
  if (s3.batch != sq->batch || s3.len != sq->len)
    return Status::Invalid(name, "shape [" + str(s3.batch) + ", " + str(s3.len) + ", d]; expected [" + str(sq->batch) +
                                     ", " + str(sq->len) + ", " + str(width) + "] (as x_q)");
  return Status::Ok();
}

const float* row_ptr(const TensorView& x, std::int64_t b) { return static_cast<const float*>(x.data) + b * x.strides[0]; }
// The row pitch handed to BLAS (a single row may have any stride; BLAS wants >= width).
std::int64_t pitch(const TensorView& x, std::int64_t width) { return x.strides[1] > width ? x.strides[1] : width; }
const float* or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// An error of the cache's append inside a forward step, in the caller's terms: the keys and values appended are
// the step's projections of x, not arguments the caller passed ("k: appending 3 tokens ..." is the cache's room;
// "k: value [0, h, t, d] is not finite" is x's projected keys, of batch row `row`).
Status as_append_error(const Status& s, std::int64_t row) {
  if (s.ok() || (s.param() != "k" && s.param() != "v")) return s;
  const std::string body = s.message().substr(std::min(s.message().size(), s.param().size() + 2));
  if (body.rfind("appending", 0) == 0) return Status::Invalid("cache", body);
  return Status::Invalid("x", "its projected " + std::string(s.param() == "k" ? "keys" : "values") + " of batch row " +
                                  str(row) + " [1, Hkv, T, D]: " + body);
}
}  // namespace

Status MultiHeadAttention::create(const MhaConfig& config, MultiHeadAttention* mha) {
  MhaConfig c = config;
  ParamShape shape{c.d_model, c.heads, c.kv_heads, c.head_dim, c.v_head_dim, c.bias};
  std::int64_t count = 0;
  if (Status s = attn::parameter_count(shape, &count); !s) return s;  // validates and explains the fields
  if (count > static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max() / sizeof(float) / 2))
    return Status::OutOfMemory("d_model", std::to_string(count) + " parameters do not fit in memory");
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.head_dim == 0) c.head_dim = c.d_model / c.heads;
  if (c.v_head_dim == 0) c.v_head_dim = c.head_dim;
  MultiHeadAttention m;
  m.config_ = c;
  try {
  const std::int64_t d = c.d_model, q = c.heads * c.head_dim, k = c.kv_heads * c.head_dim, v = c.kv_heads * c.v_head_dim,
                     o = c.heads * c.v_head_dim;
  m.weights_.w_q.assign(sz(q * d), 0.0f);
  m.weights_.w_k.assign(sz(k * d), 0.0f);
  m.weights_.w_v.assign(sz(v * d), 0.0f);
  m.weights_.w_o.assign(sz(d * o), 0.0f);
  if (c.bias) {
    m.weights_.b_q.assign(sz(q), 0.0f);
    m.weights_.b_k.assign(sz(k), 0.0f);
    m.weights_.b_v.assign(sz(v), 0.0f);
    m.weights_.b_o.assign(sz(d), 0.0f);
  }
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("d_model", "the " + std::to_string(count) + " weights (" +
                                              std::to_string(count * 4) + " bytes) could not be allocated");
  }
  *mha = std::move(m);
  return Status::Ok();
}

std::int64_t MultiHeadAttention::parameter_count() const {
  std::int64_t n = 0;
  const Status s = attn::parameter_count({config_.d_model, config_.heads, config_.kv_heads, config_.head_dim,
                                          config_.v_head_dim, config_.bias}, &n);
  return s ? n : 0;
}

void MultiHeadAttention::init_random(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const MhaConfig& c = config_;
  auto fill = [&](std::vector<float>& w, std::int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    std::uniform_real_distribution<double> u(-bound, bound);
    for (float& x : w) x = static_cast<float>(u(rng));
  };
  fill(weights_.w_q, c.d_model), fill(weights_.w_k, c.d_model), fill(weights_.w_v, c.d_model);
  fill(weights_.w_o, c.heads * c.v_head_dim);
  fill(weights_.b_q, c.d_model), fill(weights_.b_k, c.d_model), fill(weights_.b_v, c.d_model);
  fill(weights_.b_o, c.heads * c.v_head_dim);
}

Status MultiHeadAttention::check_weights() const {
  const MhaConfig& c = config_;
  if (c.d_model == 0) return Status::Invalid("mha", "not created; expected MultiHeadAttention::create first");
  const std::int64_t d = c.d_model, q = c.heads * c.head_dim, k = c.kv_heads * c.head_dim, v = c.kv_heads * c.v_head_dim,
                     o = c.heads * c.v_head_dim;
  const struct {
    const char* name;
    const std::vector<float>* w;
    std::int64_t rows, cols;
  } expected[] = {{"w_q", &weights_.w_q, q, d},           {"w_k", &weights_.w_k, k, d},
                  {"w_v", &weights_.w_v, v, d},           {"w_o", &weights_.w_o, d, o},
                  {"b_q", &weights_.b_q, c.bias ? q : 0, 1}, {"b_k", &weights_.b_k, c.bias ? k : 0, 1},
                  {"b_v", &weights_.b_v, c.bias ? v : 0, 1}, {"b_o", &weights_.b_o, c.bias ? d : 0, 1}};
  for (const auto& e : expected)
    if (static_cast<std::int64_t>(e.w->size()) != e.rows * e.cols)
      return Status::Invalid(e.name, str(static_cast<std::int64_t>(e.w->size())) + " values; expected " +
                                          str(e.rows * e.cols) +
                                          (e.cols == 1 ? std::string() : " [" + str(e.rows) + ", " + str(e.cols) + "]"));
  return Status::Ok();
}

Status MultiHeadAttention::project_qkv(const TensorView& x, std::vector<float>* q, std::vector<float>* k,
                                       std::vector<float>* v) const {
  if (Status s = check_weights(); !s) return s;
  Seq in;
  if (Status s = check_rows("x", x, config_.d_model, &in); !s) return s;
  const MhaConfig& c = config_;
  const std::int64_t wq = c.heads * c.head_dim, wk = c.kv_heads * c.head_dim, wv = c.kv_heads * c.v_head_dim;
  q->assign(sz(in.batch * in.len * wq), 0.0f);
  k->assign(sz(in.batch * in.len * wk), 0.0f);
  v->assign(sz(in.batch * in.len * wv), 0.0f);
  for (std::int64_t b = 0; b < in.batch; ++b) {
    const float* xb = row_ptr(x, b);
    mha::linear(xb, in.len, c.d_model, pitch(x, c.d_model), weights_.w_q.data(), wq, or_null(weights_.b_q),
                q->data() + b * in.len * wq, wq);
    mha::linear(xb, in.len, c.d_model, pitch(x, c.d_model), weights_.w_k.data(), wk, or_null(weights_.b_k),
                k->data() + b * in.len * wk, wk);
    mha::linear(xb, in.len, c.d_model, pitch(x, c.d_model), weights_.w_v.data(), wv, or_null(weights_.b_v),
                v->data() + b * in.len * wv, wv);
  }
  return Status::Ok();
}

Status MultiHeadAttention::forward(const TensorView& x, const TensorView& out, const Params& params) const {
  return forward_impl(x, x, out, params, nullptr);
}

Status MultiHeadAttention::forward_cross(const TensorView& x_q, const TensorView& x_kv, const TensorView& out,
                                         const Params& params) const {
  return forward_impl(x_q, x_kv, out, params, nullptr);
}

Status MultiHeadAttention::forward(const TensorView& x, const TensorView& out, const Params& params,
                                   MhaSaved* saved) const {
  if (!saved) return Status::Invalid("saved", "null; expected a MhaSaved to fill");
  if (Status s = forward_impl(x, x, out, params, saved); !s) return s;
  saved->self = true;
  return Status::Ok();
}

Status MultiHeadAttention::forward_cross(const TensorView& x_q, const TensorView& x_kv, const TensorView& out,
                                         const Params& params, MhaSaved* saved) const {
  if (!saved) return Status::Invalid("saved", "null; expected a MhaSaved to fill");
  return forward_impl(x_q, x_kv, out, params, saved);
}

Status MultiHeadAttention::forward_impl(const TensorView& x_q, const TensorView& x_kv, const TensorView& out,
                                        const Params& params, MhaSaved* saved) const {
  if (Status s = check_weights(); !s) return s;
  const MhaConfig& c = config_;
  Seq sq, skv;
  if (Status s = check_inputs(x_q, x_kv, "out", out, c.d_model, &sq, &skv); !s) return s;
  const std::int64_t B = sq.batch, wq = c.heads * c.head_dim, wo = c.heads * c.v_head_dim;
  std::vector<float> q, k, v;
  // Queries from x_q, keys and values from x_kv.
  auto project = [&](const TensorView& x, std::int64_t len, const std::vector<float>& w, const std::vector<float>& bias,
                     std::int64_t width, std::vector<float>* y) {
    y->assign(sz(B * len * width), 0.0f);
    for (std::int64_t b = 0; b < B; ++b)
      mha::linear(row_ptr(x, b), len, c.d_model, pitch(x, c.d_model), w.data(), width, or_null(bias),
                  y->data() + b * len * width, width);
  };
  project(x_q, sq.len, weights_.w_q, weights_.b_q, wq, &q);
  project(x_kv, skv.len, weights_.w_k, weights_.b_k, c.kv_heads * c.head_dim, &k);
  project(x_kv, skv.len, weights_.w_v, weights_.b_v, c.kv_heads * c.v_head_dim, &v);
  std::vector<float> y(sz(B * sq.len * wo), 0.0f), lse;
  if (saved) lse.assign(sz(B * c.heads * sq.len), 0.0f);
  const Status s = attention(TensorView::bshd(q.data(), DType::f32, B, sq.len, c.heads, c.head_dim),
                             TensorView::bshd(k.data(), DType::f32, B, skv.len, c.kv_heads, c.head_dim),
                             TensorView::bshd(v.data(), DType::f32, B, skv.len, c.kv_heads, c.v_head_dim),
                             TensorView::bshd(y.data(), DType::f32, B, sq.len, c.heads, c.v_head_dim), params,
                             saved ? std::optional<TensorView>(TensorView::contiguous(lse.data(), DType::f32, {B, c.heads, sq.len}))
                                   : std::nullopt);
  if (!s) return s;
  for (std::int64_t b = 0; b < B; ++b)
    mha::linear(y.data() + b * sq.len * wo, sq.len, wo, wo, weights_.w_o.data(), c.d_model, or_null(weights_.b_o),
                static_cast<float*>(out.data) + b * out.strides[0], pitch(out, c.d_model));
  if (saved) {
    saved->batch = B, saved->q_len = sq.len, saved->kv_len = skv.len, saved->self = false;
    saved->q = std::move(q), saved->k = std::move(k), saved->v = std::move(v), saved->y = std::move(y);
    saved->lse = std::move(lse);
  }
  return Status::Ok();
}

namespace {

// The rows of a checked [B, S, width] view, packed into a contiguous [B·S, width] buffer.
std::vector<float> packed(const TensorView& x, const Seq& seq, std::int64_t width) {
  std::vector<float> out(sz(seq.batch * seq.len * width));
  for (std::int64_t b = 0; b < seq.batch; ++b)
    for (std::int64_t s = 0; s < seq.len; ++s) {
      const float* row = row_ptr(x, b) + s * x.strides[1];
      std::copy(row, row + width, out.begin() + (b * seq.len + s) * width);
    }
  return out;
}

// Column sums of a [rows, cols] row-major matrix (a bias gradient), or nothing when `want` is false.
std::vector<float> column_sums(const std::vector<float>& m, std::int64_t rows, std::int64_t cols, bool want) {
  if (!want) return {};
  std::vector<double> acc(sz(cols), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) acc[sz(j)] += m[sz(r * cols + j)];
  return std::vector<float>(acc.begin(), acc.end());
}

}  // namespace

Status MultiHeadAttention::backward(const TensorView& x_q, const TensorView& x_kv, const MhaSaved& saved,
                                    const TensorView& grad_out, MhaGrads* grads, const Params& params) const {
  if (Status s = check_weights(); !s) return s;
  if (!grads) return Status::Invalid("grads", "null; expected a MhaGrads to write");
  const MhaConfig& c = config_;
  Seq sq, skv;
  if (Status s = check_inputs(x_q, x_kv, "grad_out", grad_out, c.d_model, &sq, &skv); !s) return s;
  if (saved.self && (x_q.data != x_kv.data || sq.len != skv.len || x_q.strides != x_kv.strides))
    return Status::Invalid("x_kv", "differs from x_q; expected the same x twice after a self-attention forward");
  const std::int64_t B = sq.batch, Nq = B * sq.len, Nkv = B * skv.len, d = c.d_model;
  const std::int64_t wq = c.heads * c.head_dim, wk = c.kv_heads * c.head_dim, wv = c.kv_heads * c.v_head_dim,
                     wo = c.heads * c.v_head_dim;
  if (saved.batch != B || saved.q_len != sq.len || saved.kv_len != skv.len)
    return Status::Invalid("saved", "from a forward of batch " + str(saved.batch) + ", lengths " + str(saved.q_len) + "/" +
                                        str(saved.kv_len) + "; expected batch " + str(B) + ", lengths " + str(sq.len) +
                                        "/" + str(skv.len) + " (as x_q and x_kv)");
  const struct {
    const char* name;
    const std::vector<float>* t;
    std::int64_t n;
  } expected[] = {{"saved.q", &saved.q, Nq * wq}, {"saved.k", &saved.k, Nkv * wk}, {"saved.v", &saved.v, Nkv * wv},
                  {"saved.y", &saved.y, Nq * wo}, {"saved.lse", &saved.lse, Nq * c.heads}};
  for (const auto& e : expected)
    if (static_cast<std::int64_t>(e.t->size()) != e.n)
      return Status::Invalid(e.name, str(static_cast<std::int64_t>(e.t->size())) + " values; expected " + str(e.n) +
                                         " (from a training forward on these inputs)");

  const std::vector<float> xq = packed(x_q, sq, d), xkv = saved.self ? std::vector<float>() : packed(x_kv, skv, d);
  const std::vector<float>& xk = saved.self ? xq : xkv;
  const std::vector<float> g = packed(grad_out, sq, d);
  MhaGrads r;
  MhaWeights& w = r.weights;
  // out = y W_Oᵀ + b_O:  ∂y = ∂out W_O,  ∂W_O = ∂outᵀ y,  ∂b_O = Σ_rows ∂out.
  std::vector<float> dy(sz(Nq * wo));
  mha::gemm(false, false, Nq, wo, d, g.data(), d, weights_.w_o.data(), wo, 0.0f, dy.data(), wo);
  w.w_o.assign(sz(d * wo), 0.0f);
  mha::gemm(true, false, d, wo, Nq, g.data(), d, saved.y.data(), wo, 0.0f, w.w_o.data(), wo);
  w.b_o = column_sums(g, Nq, d, c.bias);
  // The attention itself.
  std::vector<float> dq(sz(Nq * wq)), dk(sz(Nkv * wk)), dv(sz(Nkv * wv));
  const Status s = attention_backward(
      TensorView::bshd(saved.q.data(), DType::f32, B, sq.len, c.heads, c.head_dim),
      TensorView::bshd(saved.k.data(), DType::f32, B, skv.len, c.kv_heads, c.head_dim),
      TensorView::bshd(saved.v.data(), DType::f32, B, skv.len, c.kv_heads, c.v_head_dim),
      TensorView::bshd(saved.y.data(), DType::f32, B, sq.len, c.heads, c.v_head_dim),
      TensorView::contiguous(saved.lse.data(), DType::f32, {B, c.heads, sq.len}),
      TensorView::bshd(dy.data(), DType::f32, B, sq.len, c.heads, c.v_head_dim),
      TensorView::bshd(dq.data(), DType::f32, B, sq.len, c.heads, c.head_dim),
      TensorView::bshd(dk.data(), DType::f32, B, skv.len, c.kv_heads, c.head_dim),
      TensorView::bshd(dv.data(), DType::f32, B, skv.len, c.kv_heads, c.v_head_dim), params);
  if (!s) return s;
  // Q = x_q W_Qᵀ + b_Q (and K, V from x_kv):  ∂W_Q = ∂Qᵀ x_q,  ∂b_Q = Σ_rows ∂Q,  ∂x_q = ∂Q W_Q.
  w.w_q.assign(sz(wq * d), 0.0f), w.w_k.assign(sz(wk * d), 0.0f), w.w_v.assign(sz(wv * d), 0.0f);
  mha::gemm(true, false, wq, d, Nq, dq.data(), wq, xq.data(), d, 0.0f, w.w_q.data(), d);
  mha::gemm(true, false, wk, d, Nkv, dk.data(), wk, xk.data(), d, 0.0f, w.w_k.data(), d);
  mha::gemm(true, false, wv, d, Nkv, dv.data(), wv, xk.data(), d, 0.0f, w.w_v.data(), d);
  w.b_q = column_sums(dq, Nq, wq, c.bias);
  w.b_k = column_sums(dk, Nkv, wk, c.bias);
  w.b_v = column_sums(dv, Nkv, wv, c.bias);
  r.x_q.assign(sz(Nq * d), 0.0f);
  mha::gemm(false, false, Nq, d, wq, dq.data(), wq, weights_.w_q.data(), d, 0.0f, r.x_q.data(), d);
  r.x_kv.assign(sz(Nkv * d), 0.0f);
  mha::gemm(false, false, Nkv, d, wk, dk.data(), wk, weights_.w_k.data(), d, 0.0f, r.x_kv.data(), d);
  mha::gemm(false, false, Nkv, d, wv, dv.data(), wv, weights_.w_v.data(), d, 1.0f, r.x_kv.data(), d);
  if (saved.self) {  // x fed both paths: its gradient is the sum
    for (std::size_t i = 0; i < r.x_q.size(); ++i) r.x_q[i] += r.x_kv[i];
    r.x_kv.clear();
  }
  *grads = std::move(r);
  return Status::Ok();
}

Status MultiHeadAttention::forward_cached(const TensorView& x, KVCache& cache, const TensorView& out,
                                          const Params& params) const {
  return forward_cached_impl(x, cache, out, nullptr, params);
}

Status MultiHeadAttention::forward_cached(const TensorView& x, KVCache& cache, const TensorView& out,
                                          const Rotary& rotary, const Params& params) const {
  return forward_cached_impl(x, cache, out, &rotary, params);
}

Status MultiHeadAttention::forward_cached_impl(const TensorView& x, KVCache& cache, const TensorView& out,
                                               const Rotary* rotary, const Params& params) const {
  if (Status s = check_weights(); !s) return s;
  const MhaConfig& c = config_;
  Seq sx, so;
  if (Status s = check_rows("x", x, c.d_model, &sx); !s) return s;
  if (Status s = check_rows("out", out, c.d_model, &so); !s) return s;
  if (sx.batch != 1) return Status::Invalid("x", "batch " + str(sx.batch) + "; expected 1 (one sequence per KVCache)");
  if (so.batch != 1 || so.len != sx.len) return Status::Invalid("out", "shape differs from x; expected [1, " + str(sx.len) + ", d_model]");
  if (cache.kv_heads() != c.kv_heads || cache.head_dim() != c.head_dim || cache.v_head_dim() != c.v_head_dim)
    return Status::Invalid("cache", "holds " + str(cache.kv_heads()) + " heads of " + str(cache.head_dim()) + "/" +
                                        str(cache.v_head_dim()) + "; expected " + str(c.kv_heads) + " heads of " +
                                        str(c.head_dim) + "/" + str(c.v_head_dim));
  const std::int64_t T = sx.len, wo = c.heads * c.v_head_dim;
  std::vector<float> q, k, v;
  if (Status s = project_qkv(x, &q, &k, &v); !s) return s;
  const std::int64_t before = cache.length();
  const TensorView kv_k = TensorView::bshd(k.data(), DType::f32, 1, T, c.kv_heads, c.head_dim);
  const TensorView kv_v = TensorView::bshd(v.data(), DType::f32, 1, T, c.kv_heads, c.v_head_dim);
  // The queries turned first (the same checks the append makes of the tables; q is this call's own copy), then
  // the keys as the cache stores them, at the same positions.
  if (rotary)
    if (Status s = apply_rotary(TensorView::bshd(q.data(), DType::f32, 1, T, c.heads, c.head_dim), *rotary, before); !s)
      return s;
  if (Status s = rotary ? cache.append(kv_k, kv_v, *rotary) : cache.append(kv_k, kv_v); !s) return as_append_error(s, 0);
  std::vector<float> y(sz(T * wo), 0.0f);
  if (Status s = cache.attend(TensorView::bshd(q.data(), DType::f32, 1, T, c.heads, c.head_dim),
                              TensorView::bshd(y.data(), DType::f32, 1, T, c.heads, c.v_head_dim), params);
      !s) {
    (void)cache.truncate(before);  // leave the cache as it was
    return s;
  }
  mha::linear(y.data(), T, wo, wo, weights_.w_o.data(), c.d_model, or_null(weights_.b_o), static_cast<float*>(out.data),
              pitch(out, c.d_model));
  return Status::Ok();
}

Status MultiHeadAttention::forward_paged(const TensorView& x, PagedKVCache& cache, const std::vector<std::int64_t>& ids,
                                         const TensorView& out, const Params& params) const {
  if (Status s = check_weights(); !s) return s;
  const MhaConfig& c = config_;
  Seq sx, so;
  if (Status s = check_rows("x", x, c.d_model, &sx); !s) return s;
  if (Status s = check_rows("out", out, c.d_model, &so); !s) return s;
  if (static_cast<std::int64_t>(ids.size()) != sx.batch)
    return Status::Invalid("ids", str(static_cast<std::int64_t>(ids.size())) + " ids; expected one per batch row of x (" +
                                      str(sx.batch) + ")");
  if (so.batch != sx.batch || so.len != sx.len) return Status::Invalid("out", "shape differs from x; expected [B, T, d_model] as x");
  if (cache.kv_heads() != c.kv_heads || cache.head_dim() != c.head_dim || cache.v_head_dim() != c.v_head_dim)
    return Status::Invalid("cache", "holds " + str(cache.kv_heads()) + " heads of " + str(cache.head_dim()) + "/" +
                                        str(cache.v_head_dim()) + "; expected " + str(c.kv_heads) + " heads of " +
                                        str(c.head_dim) + "/" + str(c.v_head_dim));
  // Check every id and the pool's room before appending anything.
  std::vector<std::int32_t> table, lens;
  std::int64_t width = 0;
  if (Status s = cache.tables(ids, &table, &width, &lens); !s) return s;
  const std::int64_t B = sx.batch, T = sx.len, ps = cache.page_size(), wo = c.heads * c.v_head_dim;
  std::int64_t need = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = lens[sz(b)];
    need += (len + T + ps - 1) / ps - (len + ps - 1) / ps;
  }
  if (need > cache.free_pages())
    return Status::Invalid("cache", "this step needs " + str(need) + " more pages; expected at most the " +
                                        str(cache.free_pages()) + " free pages of the pool");
  std::vector<float> q, k, v;
  if (Status s = project_qkv(x, &q, &k, &v); !s) return s;
  const std::int64_t wk = c.kv_heads * c.head_dim, wv = c.kv_heads * c.v_head_dim;
  auto roll_back = [&](std::int64_t upto) {
    for (std::int64_t b = 0; b < upto; ++b) (void)cache.truncate(ids[sz(b)], lens[sz(b)]);
  };
  for (std::int64_t b = 0; b < B; ++b) {
    const Status s = cache.append(ids[sz(b)], TensorView::bshd(k.data() + b * T * wk, DType::f32, 1, T, c.kv_heads, c.head_dim),
                                  TensorView::bshd(v.data() + b * T * wv, DType::f32, 1, T, c.kv_heads, c.v_head_dim));
    if (!s) {
      roll_back(b);
      return as_append_error(s, b);
    }
  }
  std::vector<float> y(sz(B * T * wo), 0.0f);
  if (Status s = cache.attend(ids, TensorView::bshd(q.data(), DType::f32, B, T, c.heads, c.head_dim),
                              TensorView::bshd(y.data(), DType::f32, B, T, c.heads, c.v_head_dim), params);
      !s) {
    roll_back(B);
    return s;
  }
  for (std::int64_t b = 0; b < B; ++b)
    mha::linear(y.data() + b * T * wo, T, wo, wo, weights_.w_o.data(), c.d_model, or_null(weights_.b_o),
                static_cast<float*>(out.data) + b * out.strides[0], pitch(out, c.d_model));
  return Status::Ok();
}

}  // namespace attn
