// Additive (Bahdanau) attention (attn/additive.h): forward and backward.
//
// The projections Q W_qᵀ [B·Sq, A] and K W_kᵀ [B·Skv, A] are two sgemm calls; then per query row the
// scores e_j = Σ_a w_a tanh(qp_a + kp_ja) of its allowed keys, the softmax (max-subtracted, summed in double),
// and out = Σ_j P_j v_j. The backward recomputes each row's tanh values [Skv, A] once and forms
//   dP_j = dO·v_j,  D = Σ_j P_j dP_j,  dS_j = P_j (dP_j − D),
//   dqp_a = Σ_j dS_j w_a (1 − t_ja²),  dkp_ja += dS_j w_a (1 − t_ja²),  dw_a += Σ_j dS_j t_ja,  dv_j += P_j dO,
// then dQ = dqp W_q, dW_q = dqpᵀ Q (and the same for K) by sgemm over all batches. The backward's work is split
// by batch (rows of a batch share dK and dV), and dw is summed per batch, then in batch order, so no result
// depends on the thread count. Written plainly (std::tanh, scalar loops the compiler may
// vectorise): this module exists to compare scoring functions, not to be the fast path.
#include "attn/additive.h"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "core/views.h"
#include "cpu/kernels.h"
#include "cpu/schedule.h"
#include "mha/linear.h"

namespace attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string shape_str(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.shape[static_cast<std::size_t>(d)]);
  return s + "]";
}

std::string dims_str(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (std::int64_t d : dims) s += (first ? "" : ", ") + std::to_string(d), first = false;
  return s + "]";
}

// A view (core::check_view: rank, sizes, strides, data) of `dtype` and exactly `shape`.
Status check_tensor(const char* name, const TensorView& t, std::initializer_list<std::int64_t> shape,
                    DType dtype = DType::f32) {
  if (Status s = core::check_view(name, t, static_cast<int>(shape.size())); !s) return s;
  if (t.dtype != dtype)
    return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected " + dtype_name(dtype));
  std::size_t d = 0;
  for (std::int64_t s : shape)
    if (t.shape[d++] != s) return Status::Invalid(name, "shape " + shape_str(t) + "; expected " + dims_str(shape));
  return Status::Ok();
}

// q, k, v: f32 [B, S, D] of any sizes.
Status check_input_rank3(const char* name, const TensorView& t) {
  if (Status s = core::check_view(name, t, 3); !s) return s;
  if (t.dtype != DType::f32) return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected f32");
  return Status::Ok();
}

float get(const TensorView& t, std::int64_t a, std::int64_t b = 0, std::int64_t c = 0) {
  return static_cast<const float*>(t.data)[a * t.strides[0] + b * t.strides[1] + c * t.strides[2]];
}
float& at(const TensorView& t, std::int64_t a, std::int64_t b = 0, std::int64_t c = 0) {
  return static_cast<float*>(t.data)[a * t.strides[0] + b * t.strides[1] + c * t.strides[2]];
}

// A validated call.
struct Problem {
  std::int64_t B = 0, Sq = 0, Skv = 0, Dq = 0, Dk = 0, Dv = 0, A = 0;
  Causal causal = Causal::none;
  std::vector<std::int64_t> len;  // [B]
  std::optional<TensorView> mask;
  bool mask_bool = false, mask_batched = false;
  int threads = 1;
  // Key j allowed for row i of batch b, and the mask's bias (0 without one; -inf hides the key).
  bool allowed(std::int64_t b, std::int64_t i, std::int64_t j) const {
    if (j >= len[static_cast<std::size_t>(b)]) return false;
    if (causal == Causal::top_left && j > i) return false;
    if (causal == Causal::bottom_right && j > i + len[static_cast<std::size_t>(b)] - Sq) return false;
    return true;
  }
  float bias(std::int64_t b, std::int64_t i, std::int64_t j) const {
    if (!mask) return 0.0f;
    const TensorView& m = *mask;
    const std::int64_t off = (mask_batched ? b * m.strides[0] : 0) + i * m.strides[m.rank - 2] + j * m.strides[m.rank - 1];
    if (mask_bool) return static_cast<const unsigned char*>(m.data)[off] ? 0.0f : kNegInf;
    return static_cast<const float*>(m.data)[off];
  }
};

Status validate(const TensorView& q, const TensorView& k, const TensorView& v, const AdditiveWeights& w,
                const AdditiveParams& params, Problem* p) {
  if (Status s = check_input_rank3("q", q); !s) return s;
  if (Status s = check_input_rank3("k", k); !s) return s;
  if (Status s = check_input_rank3("v", v); !s) return s;
  p->B = q.shape[0], p->Sq = q.shape[1], p->Dq = q.shape[2];
  p->Skv = k.shape[1], p->Dk = k.shape[2], p->Dv = v.shape[2];
  if (k.shape[0] != p->B) return Status::Invalid("k", "batch " + std::to_string(k.shape[0]) + "; expected B = " + std::to_string(p->B) + " (q's)");
  if (v.shape[0] != p->B || v.shape[1] != p->Skv)
    return Status::Invalid("v", "shape " + shape_str(v) + "; expected [" + std::to_string(p->B) + ", " + std::to_string(p->Skv) + ", Dv] (k's B and Skv)");
  if (w.w.rank != 1) return Status::Invalid("w", "rank " + std::to_string(w.w.rank) + "; expected rank 1 [A]");
  p->A = w.w.shape[0];
  if (p->A < 1) return Status::Invalid("w", "shape " + shape_str(w.w) + "; expected [A] with A >= 1");
  if (Status s = check_tensor("w", w.w, {p->A}); !s) return s;
  if (Status s = check_tensor("w_q", w.w_q, {p->A, p->Dq}); !s) return s;
  if (Status s = check_tensor("w_k", w.w_k, {p->A, p->Dk}); !s) return s;
  p->causal = params.causal;
  if (static_cast<unsigned>(params.causal) > static_cast<unsigned>(Causal::bottom_right))
    return Status::Invalid("causal", "unknown value; expected none, top_left or bottom_right");
  p->len.assign(static_cast<std::size_t>(p->B), p->Skv);
  if (params.kv_lens) {
    const TensorView& l = *params.kv_lens;
    if (Status s = core::check_view("kv_lens", l, 1); !s) return s;
    if (l.rank != 1 || l.shape[0] != p->B)
      return Status::Invalid("kv_lens", "shape " + shape_str(l) + "; expected [" + std::to_string(p->B) + "] (B)");
    if (l.dtype != DType::i32 && l.dtype != DType::i64)
      return Status::Invalid("kv_lens", std::string("dtype ") + dtype_name(l.dtype) + "; expected i32 or i64");
    if (p->B > 0 && !l.data) return Status::Invalid("kv_lens", "data is null");
    for (std::int64_t b = 0; b < p->B; ++b) {
      const std::int64_t x = l.dtype == DType::i32 ? static_cast<const std::int32_t*>(l.data)[b * l.strides[0]]
                                                   : static_cast<const std::int64_t*>(l.data)[b * l.strides[0]];
      if (x < 0 || x > p->Skv)
        return Status::Invalid("kv_lens", "kv_lens[" + std::to_string(b) + "] = " + std::to_string(x) + "; expected 0 to Skv = " + std::to_string(p->Skv));
      p->len[static_cast<std::size_t>(b)] = x;
    }
  }
  if (params.mask) {
    const TensorView& m = *params.mask;
    if (Status s = core::check_view("mask", m, m.rank == 3 ? 3 : 2); !s) return s;
    if (m.dtype != DType::f32 && m.dtype != DType::boolean)
      return Status::Invalid("mask", std::string("dtype ") + dtype_name(m.dtype) + "; expected f32 (additive) or boolean (keep)");
    const bool shape_ok = (m.rank == 2 && m.shape[0] == p->Sq && m.shape[1] == p->Skv) ||
                          (m.rank == 3 && m.shape[0] == p->B && m.shape[1] == p->Sq && m.shape[2] == p->Skv);
    if (!shape_ok)
      return Status::Invalid("mask", "shape " + shape_str(m) + "; expected [" + std::to_string(p->Sq) + ", " + std::to_string(p->Skv) +
                                         "] or [" + std::to_string(p->B) + ", " + std::to_string(p->Sq) + ", " + std::to_string(p->Skv) + "]");
    if (m.numel() > 0 && !m.data) return Status::Invalid("mask", "data is null");
    p->mask = m, p->mask_bool = m.dtype == DType::boolean, p->mask_batched = m.rank == 3;
    if (!p->mask_bool)
      for (std::int64_t b = 0; b < (p->mask_batched ? p->B : 1); ++b)
        for (std::int64_t i = 0; i < p->Sq; ++i)
          for (std::int64_t j = 0; j < p->Skv; ++j) {
            const float x = p->bias(b, i, j);
            if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
              return Status::Invalid("mask", "holds " + std::string(std::isnan(x) ? "NaN" : "+inf") + " at [" + std::to_string(i) + ", " +
                                                 std::to_string(j) + "]; expected finite values or -inf");
          }
  }
  if (params.threads < 0 || params.threads > 4096)
    return Status::Invalid("threads", std::to_string(params.threads) + "; expected 0 (default) or 1 to 4096");
  p->threads = cpu::resolve_threads(params.threads);
  return Status::Ok();
}

// Outputs: shapes, strides, and no overlap with any input or with each other.
Status check_outputs(const std::vector<std::pair<const char*, const TensorView*>>& inputs,
                     const std::vector<std::pair<const char*, const TensorView*>>& outputs) {
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const auto& [name, view] = outputs[o];
    if (Status s = core::check_output_strides(name, *view); !s) return s;
    for (const auto& [in_name, in] : inputs)
      if (in && core::overlaps(core::extent_of(*view), core::extent_of(*in)))
        return Status::Invalid(name, std::string("memory overlaps input ") + in_name + "; expected a separate buffer");
    for (std::size_t p = 0; p < o; ++p)
      if (core::overlaps(core::extent_of(*view), core::extent_of(*outputs[p].second)))
        return Status::Invalid(name, std::string("memory overlaps output ") + outputs[p].first + "; expected a separate buffer");
  }
  return Status::Ok();
}

// A [rows, cols] f32 matrix (rank 2, or rank 3 at batch b) copied into contiguous memory.
void gather(const TensorView& t, std::int64_t b, std::int64_t rows, std::int64_t cols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      dst[r * cols + c] = t.rank == 3 ? get(t, b, r, c) : get(t, r, c);
}

// Contiguous copies of the weights.
struct Weights {
  std::vector<float> wq, wk, w;
  Weights(const Problem& p, const AdditiveWeights& aw)
      : wq(static_cast<std::size_t>(p.A * p.Dq)), wk(static_cast<std::size_t>(p.A * p.Dk)), w(static_cast<std::size_t>(p.A)) {
    gather(aw.w_q, 0, p.A, p.Dq, wq.data());
    gather(aw.w_k, 0, p.A, p.Dk, wk.data());
    for (std::int64_t a = 0; a < p.A; ++a) w[static_cast<std::size_t>(a)] = get(aw.w, a);
  }
};

// The inputs of every batch, contiguous, and their projections: qp = Q W_qᵀ [B·Sq, A], kp = K W_kᵀ [B·Skv, A]
// (one sgemm each, outside any parallel region: the BLAS threads itself).
struct Data {
  std::vector<float> q, k, v, qp, kp;
  Data(const Problem& p, const Weights& w, const TensorView& qv, const TensorView& kv, const TensorView& vv) {
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    q.resize(n(p.B * p.Sq * p.Dq)), k.resize(n(p.B * p.Skv * p.Dk)), v.resize(n(p.B * p.Skv * p.Dv));
    qp.resize(n(p.B * p.Sq * p.A)), kp.resize(n(p.B * p.Skv * p.A));
    for (std::int64_t b = 0; b < p.B; ++b) {
      gather(qv, b, p.Sq, p.Dq, q.data() + b * p.Sq * p.Dq);
      gather(kv, b, p.Skv, p.Dk, k.data() + b * p.Skv * p.Dk);
      gather(vv, b, p.Skv, p.Dv, v.data() + b * p.Skv * p.Dv);
    }
    mha::gemm(false, true, p.B * p.Sq, p.A, p.Dq, q.data(), p.Dq, w.wq.data(), p.Dq, 0.0f, qp.data(), p.A);
    mha::gemm(false, true, p.B * p.Skv, p.A, p.Dk, k.data(), p.Dk, w.wk.data(), p.Dk, 0.0f, kp.data(), p.A);
  }
};

// Row i of batch b: its scores of every key (e[j], -inf for keys it does not attend) and, when t is given, its
// tanh values t[j·A + a]; returns the row's max score (NaN when a score is NaN).
float row_scores(const Problem& p, const Weights& w, const Data& d, std::int64_t b, std::int64_t i, float* e, float* t) {
  float mx = kNegInf;
  bool nan = false;
  const float* qp = d.qp.data() + (b * p.Sq + i) * p.A;
  for (std::int64_t j = 0; j < p.Skv; ++j) {
    const float bias = p.allowed(b, i, j) ? p.bias(b, i, j) : kNegInf;
    if (bias == kNegInf) {
      e[j] = kNegInf;
      continue;
    }
    const float* kp = d.kp.data() + (b * p.Skv + j) * p.A;
    float s = 0;
    for (std::int64_t a = 0; a < p.A; ++a) {
      const float th = std::tanh(qp[a] + kp[a]);
      if (t) t[j * p.A + a] = th;
      s += w.w[static_cast<std::size_t>(a)] * th;
    }
    e[j] = s + bias;
    if (std::isnan(e[j])) nan = true;
    else mx = std::max(mx, e[j]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : mx;
}

// P in place over e (0 for hidden keys); returns the LSE (-inf for an empty row, NaN for a NaN row).
float softmax(std::int64_t n, float mx, float* e) {
  if (std::isnan(mx) || mx == std::numeric_limits<float>::infinity()) {
    for (std::int64_t j = 0; j < n; ++j) e[j] = e[j] == kNegInf ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (mx == kNegInf) {
    std::fill(e, e + n, 0.0f);
    return kNegInf;
  }
  double sum = 0;
  for (std::int64_t j = 0; j < n; ++j) sum += (e[j] = std::exp(e[j] - mx));
  const float inv = static_cast<float>(1.0 / sum);
  for (std::int64_t j = 0; j < n; ++j) e[j] *= inv;
  return mx + static_cast<float>(std::log(sum));
}

}  // namespace

Status additive_attention(const TensorView& q, const TensorView& k, const TensorView& v, const AdditiveWeights& weights,
                          const TensorView& out, const AdditiveParams& params, const std::optional<TensorView>& lse) {
  Problem p;
  if (Status s = validate(q, k, v, weights, params, &p); !s) return s;
  if (Status s = check_tensor("out", out, {p.B, p.Sq, p.Dv}); !s) return s;
  if (lse)
    if (Status s = check_tensor("lse", *lse, {p.B, p.Sq}); !s) return s;
  std::vector<std::pair<const char*, const TensorView*>> outputs = {{"out", &out}};
  if (lse) outputs.push_back({"lse", &*lse});
  if (Status s = check_outputs({{"q", &q}, {"k", &k}, {"v", &v}, {"w_q", &weights.w_q}, {"w_k", &weights.w_k},
                                {"w", &weights.w}, {"mask", params.mask ? &*params.mask : nullptr},
                                {"kv_lens", params.kv_lens ? &*params.kv_lens : nullptr}},
                               outputs);
      !s)
    return s;
  try {
    const Weights w(p, weights);
    const Data d(p, w, q, k, v);
    const std::int64_t rows = p.B * p.Sq;
    std::vector<float> results(static_cast<std::size_t>(rows * (p.Dv + 1)));  // out and lse, stored at the end
    std::vector<std::vector<float>> team;  // each thread's row of weights e [Skv]
    cpu::run_team(&team, p.threads, rows, [&](int) { return std::vector<float>(static_cast<std::size_t>(p.Skv)); },
                  cpu::loop(rows, [&](std::int64_t row, std::vector<float>& e) {
                    const std::int64_t b = row / p.Sq, i = row % p.Sq;
                    float* o = results.data() + row * (p.Dv + 1);
                    o[p.Dv] = softmax(p.Skv, row_scores(p, w, d, b, i, e.data(), nullptr), e.data());  // P, LSE
                    std::fill(o, o + p.Dv, 0.0f);
                    if (o[p.Dv] == kNegInf) return;
                    for (std::int64_t j = 0; j < p.Skv; ++j) {  // out = Σ_j P_j v_j over the keys the row attends
                      if (!p.allowed(b, i, j) || p.bias(b, i, j) == kNegInf) continue;
                      const float pj = e[static_cast<std::size_t>(j)];
                      const float* vj = d.v.data() + (b * p.Skv + j) * p.Dv;
                      for (std::int64_t c = 0; c < p.Dv; ++c) o[c] += pj * vj[c];
                    }
                  }, cpu::Spread::even));
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* o = results.data() + row * (p.Dv + 1);
      for (std::int64_t c = 0; c < p.Dv; ++c) at(out, row / p.Sq, row % p.Sq, c) = o[c];
      if (lse) at(*lse, row / p.Sq, row % p.Sq) = o[p.Dv];
    }
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("q", "could not allocate the scratch of additive attention for " + shape_str(q));
  }
  return Status::Ok();
}

Status additive_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AdditiveWeights& weights, const TensorView& grad_out,
                                   const AdditiveGrads& grads, const AdditiveParams& params) {
  Problem p;
  if (Status s = validate(q, k, v, weights, params, &p); !s) return s;
  if (Status s = check_tensor("grad_out", grad_out, {p.B, p.Sq, p.Dv}); !s) return s;
  if (Status s = check_tensor("grad_q", grads.q, {p.B, p.Sq, p.Dq}); !s) return s;
  if (Status s = check_tensor("grad_k", grads.k, {p.B, p.Skv, p.Dk}); !s) return s;
  if (Status s = check_tensor("grad_v", grads.v, {p.B, p.Skv, p.Dv}); !s) return s;
  if (Status s = check_tensor("grad_w_q", grads.w_q, {p.A, p.Dq}); !s) return s;
  if (Status s = check_tensor("grad_w_k", grads.w_k, {p.A, p.Dk}); !s) return s;
  if (Status s = check_tensor("grad_w", grads.w, {p.A}); !s) return s;
  if (Status s = check_outputs({{"q", &q}, {"k", &k}, {"v", &v}, {"w_q", &weights.w_q}, {"w_k", &weights.w_k},
                                {"w", &weights.w}, {"grad_out", &grad_out},
                                {"mask", params.mask ? &*params.mask : nullptr},
                                {"kv_lens", params.kv_lens ? &*params.kv_lens : nullptr}},
                               {{"grad_q", &grads.q}, {"grad_k", &grads.k}, {"grad_v", &grads.v},
                                {"grad_w_q", &grads.w_q}, {"grad_w_k", &grads.w_k}, {"grad_w", &grads.w}});
      !s)
    return s;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  try {
    const Weights w(p, weights);
    const Data d(p, w, q, k, v);
    // dqp [B·Sq, A], dkp [B·Skv, A], dV, and dw per batch (summed in batch order below).
    std::vector<float> dqp(n(p.B * p.Sq * p.A), 0.0f), dkp(n(p.B * p.Skv * p.A), 0.0f), dv(n(p.B * p.Skv * p.Dv), 0.0f);
    std::vector<double> dw(n(p.B * p.A), 0.0);  // (in double: each sums Sq·Skv terms)
    struct Scratch {  // each thread's rows: weights e and dP [Skv], tanh values t [Skv, A], dO [Dv]
      std::vector<float> e, dpj, t, go;
    };
    std::vector<Scratch> team;
    cpu::run_team(&team, p.threads, p.B,
                  [&](int) { return Scratch{std::vector<float>(n(p.Skv)), std::vector<float>(n(p.Skv)),
                                            std::vector<float>(n(p.Skv * p.A)), std::vector<float>(n(p.Dv))}; },
                  // rows of a batch share dK, dV: one batch per item
                  cpu::loop(p.B, [&](std::int64_t b, Scratch& scratch) {
                    std::vector<float>& e = scratch.e;
                    std::vector<float>& dpj = scratch.dpj;
                    std::vector<float>& t = scratch.t;
                    std::vector<float>& go = scratch.go;
                    float* dv_b = dv.data() + b * p.Skv * p.Dv;
                    double* dw_b = dw.data() + b * p.A;
                    for (std::int64_t i = 0; i < p.Sq; ++i) {
                      float* dqp_i = dqp.data() + (b * p.Sq + i) * p.A;
                      if (softmax(p.Skv, row_scores(p, w, d, b, i, e.data(), t.data()), e.data()) == kNegInf) continue;  // P
                      for (std::int64_t c = 0; c < p.Dv; ++c) go[n(c)] = get(grad_out, b, i, c);
                      // dP_j = dO·v_j, D = Σ_j P_j dP_j, dV_j += P_j dO over the keys the row attends
                      double dsum = 0;
                      for (std::int64_t j = 0; j < p.Skv; ++j) {
                        if (!p.allowed(b, i, j) || p.bias(b, i, j) == kNegInf) continue;
                        const float* vj = d.v.data() + (b * p.Skv + j) * p.Dv;
                        float s = 0;
                        for (std::int64_t c = 0; c < p.Dv; ++c) s += go[n(c)] * vj[c];
                        dpj[n(j)] = s;
                        dsum += static_cast<double>(e[n(j)]) * s;
                        for (std::int64_t c = 0; c < p.Dv; ++c) dv_b[j * p.Dv + c] += e[n(j)] * go[n(c)];
                      }
                      const float D = static_cast<float>(dsum);
                      // dS_j = P_j (dP_j − D), through tanh to qp, kp and w
                      for (std::int64_t j = 0; j < p.Skv; ++j) {
                        if (!p.allowed(b, i, j) || p.bias(b, i, j) == kNegInf) continue;
                        const float ds = e[n(j)] * (dpj[n(j)] - D);
                        const float* tj = t.data() + j * p.A;
                        float* dkp_j = dkp.data() + (b * p.Skv + j) * p.A;
                        for (std::int64_t a = 0; a < p.A; ++a) {
                          const float th = tj[a], gw = ds * w.w[n(a)] * (1.0f - th * th);
                          dqp_i[a] += gw;
                          dkp_j[a] += gw;
                          dw_b[a] += static_cast<double>(ds * th);
                        }
                      }
                    }
                  }, cpu::Spread::even));
    // dQ = dqp W_q, dW_q = dqpᵀ Q, dK = dkp W_k, dW_k = dkpᵀ K (all batches at once)
    std::vector<float> dq(n(p.B * p.Sq * p.Dq)), dk(n(p.B * p.Skv * p.Dk)), dwq(n(p.A * p.Dq)), dwk(n(p.A * p.Dk));
    mha::gemm(false, false, p.B * p.Sq, p.Dq, p.A, dqp.data(), p.A, w.wq.data(), p.Dq, 0.0f, dq.data(), p.Dq);
    mha::gemm(true, false, p.A, p.Dq, p.B * p.Sq, dqp.data(), p.A, d.q.data(), p.Dq, 0.0f, dwq.data(), p.Dq);
    mha::gemm(false, false, p.B * p.Skv, p.Dk, p.A, dkp.data(), p.A, w.wk.data(), p.Dk, 0.0f, dk.data(), p.Dk);
    mha::gemm(true, false, p.A, p.Dk, p.B * p.Skv, dkp.data(), p.A, d.k.data(), p.Dk, 0.0f, dwk.data(), p.Dk);
    for (std::int64_t b = 0; b < p.B; ++b) {
      for (std::int64_t i = 0; i < p.Sq; ++i)
        for (std::int64_t c = 0; c < p.Dq; ++c) at(grads.q, b, i, c) = dq[n((b * p.Sq + i) * p.Dq + c)];
      for (std::int64_t j = 0; j < p.Skv; ++j) {
        for (std::int64_t c = 0; c < p.Dk; ++c) at(grads.k, b, j, c) = dk[n((b * p.Skv + j) * p.Dk + c)];
        for (std::int64_t c = 0; c < p.Dv; ++c) at(grads.v, b, j, c) = dv[n((b * p.Skv + j) * p.Dv + c)];
      }
    }
    for (std::int64_t a = 0; a < p.A; ++a) {
      for (std::int64_t c = 0; c < p.Dq; ++c) at(grads.w_q, a, c) = dwq[n(a * p.Dq + c)];
      for (std::int64_t c = 0; c < p.Dk; ++c) at(grads.w_k, a, c) = dwk[n(a * p.Dk + c)];
      double s = 0;
      for (std::int64_t b = 0; b < p.B; ++b) s += dw[n(b * p.A + a)];  // batches in order
      at(grads.w, a) = static_cast<float>(s);
    }
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("q", "could not allocate the scratch of the additive backward for " + shape_str(q));
  }
  return Status::Ok();
}

}  // namespace attn
