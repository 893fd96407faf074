// attn compare-scoring: scaled dot-product against additive (Bahdanau) scoring, side by side.
//
// 1. Cost. FLOPs per score from the formulas (a dot product: 2·d_k; additive: A tanh and 3A FLOPs, plus the
//    projections W_q q and W_k k, 2·A·d per query and per key, amortised over the keys and queries they serve),
//    and measured time per score of each entry point on the same shape (attn::attention on projected q, k;
//    attn::additive_attention on the raw q, k with its own weights), best of --reps, the same thread count.
// 2. Quality. The associative-recall task of `attn scaling-experiment` (a sequence of (key, value) pairs and a
//    query key; the answer is its value), one attention layer, trained the same way for both scorers: the same
//    embeddings, value and output projections W_V, W_O, readout, data, initial weights (where shared) and Adam;
//    only the score differs:
//      dot:       s_j = (W_Q x_q)·(W_K x_j) / sqrt(d)        (W_Q, W_K: d x d)
//      additive:  s_j = wᵀ tanh(W_q x_q + W_k x_j)            (W_q, W_k: A x d, w: A; A = d by default)
//    Reported: steps to a loss threshold, held-out accuracy and loss, per seed, and a PNG of the loss curves.
// Whichever way it comes out is what it prints.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attn/additive.h"
#include "attn/backward.h"
#include "attn/sdpa.h"
#include "commands.h"
#include "files.h"
#include "plot.h"
#include "recall_task.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

using namespace recall;  // the task, Param (Adam), smooth, sz, fixed (recall_task.h)

struct CompareArgs {
  int seeds = 3, steps = 600, d = 32, attn_dim = 0, seq = 16, vocab = 32, batch = 32, eval_batches = 16, window = 10;
  int time_n = 512, time_d = 64, reps = 5, threads = 0;
  double lr = 3e-3, threshold = 0.2;
  std::string png = "scoring.png";
};

// ---- cost ------------------------------------------------------------------------------------------------

struct Timing {
  double dot_ns = 0, additive_ns = 0;  // per score, best of reps
  double tanh_ns = 0;                   // one libm tanhf, one thread (what the additive scorer calls A times)
};

Status time_scorers(const CompareArgs& a, Timing* t) {
  const std::int64_t n = a.time_n, d = a.time_d, A = a.attn_dim > 0 ? a.attn_dim : a.time_d;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  auto rnd = [&](std::size_t count) {
    std::vector<float> x(count);
    for (float& e : x) e = u(rng);
    return x;
  };
  const std::vector<float> q = rnd(sz(n * d)), k = rnd(sz(n * d)), v = rnd(sz(n * d)), wq = rnd(sz(A * d)),
                           wk = rnd(sz(A * d)), w = rnd(sz(A));
  std::vector<float> out(sz(n * d));
  Params p;
  p.threads = a.threads;
  AdditiveParams ap;
  ap.threads = a.threads;
  const AdditiveWeights aw{TensorView::contiguous(wq.data(), DType::f32, {A, d}),
                           TensorView::contiguous(wk.data(), DType::f32, {A, d}),
                           TensorView::contiguous(w.data(), DType::f32, {A})};
  auto best = [&](auto&& call, double* ns) -> Status {
    double min_s = 1e300;
    for (int r = 0; r < a.reps + 1; ++r) {  // (the first is a warm-up)
      const auto t0 = std::chrono::steady_clock::now();
      if (Status s = call(); !s) return s;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) min_s = std::min(min_s, s);
    }
    *ns = min_s * 1e9 / static_cast<double>(n * n);
    return Status::Ok();
  };
  if (Status s = best([&] {
        return attention(TensorView::contiguous(q.data(), DType::f32, {1, 1, n, d}),
                         TensorView::contiguous(k.data(), DType::f32, {1, 1, n, d}),
                         TensorView::contiguous(v.data(), DType::f32, {1, 1, n, d}),
                         TensorView::contiguous(out.data(), DType::f32, {1, 1, n, d}), p);
      }, &t->dot_ns);
      !s)
    return s;
  {  // the libm tanhf the additive scorer calls, alone: a floor for its time per score
    std::vector<float> x = rnd(4096);
    double min_s = 1e300;
    float sink = 0;
    for (int r = 0; r < a.reps + 1; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (float e : x) sink += std::tanh(e);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) min_s = std::min(min_s, s);
    }
    t->tanh_ns = min_s * 1e9 / static_cast<double>(x.size()) + (sink == 12345.0f ? 1e-30 : 0.0);
  }
  return best([&] {
    return additive_attention(TensorView::contiguous(q.data(), DType::f32, {1, n, d}),
                              TensorView::contiguous(k.data(), DType::f32, {1, n, d}),
                              TensorView::contiguous(v.data(), DType::f32, {1, n, d}), aw,
                              TensorView::contiguous(out.data(), DType::f32, {1, n, d}), ap);
  }, &t->additive_ns);
}

// ---- the learning task ---------------------------------------------------------------------------------

// y [rows, out] = x [rows, in] Wᵀ (W [out, in]); and the two products its backward needs.
void matmul_t(const float* x, const float* w, int rows, int in, int out, float* y) {
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      float s = 0;
      for (int i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
}
// dx [rows, in] += dy [rows, out] W;  dW [out, in] += dyᵀ x
void matmul_t_backward(const float* x, const float* w, const float* dy, int rows, int in, int out, float* dx, float* dw) {
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      const float g = dy[r * out + o];
      for (int i = 0; i < in; ++i) dx[r * in + i] += g * w[o * in + i], dw[o * in + i] += g * x[r * in + i];
    }
}

enum class Scorer { dot, additive };

struct Model {
  int d = 0, A = 0, V = 0;
  Param e_key, e_val, w_v, w_o, w_r, b_r;  // shared by both scorers
  Param w_q, w_k, w;                        // dot: W_Q, W_K [d, d]; additive: W_q, W_k [A, d] and w [A]
  std::vector<Param*> all() { return {&e_key, &e_val, &w_v, &w_o, &w_r, &b_r, &w_q, &w_k, &w}; }
};

// Both scorers of a seed draw the shared weights first, from the same generator, so they start from the same
// embeddings, W_V, W_O and readout; the scoring weights come after. Projections N(0, 1/d) (LeCun normal), as in
// scaling-experiment; the additive w N(0, 1/A).
Model make_model(const CompareArgs& a, Scorer scorer, std::uint64_t seed) {
  Model m;
  m.d = a.d, m.A = a.attn_dim > 0 ? a.attn_dim : a.d, m.V = a.vocab;
  std::mt19937_64 rng(seed);
  const double w_std = 1 / std::sqrt(double(a.d));
  m.e_key.init_normal(sz(a.vocab * a.d), 1.0, rng);
  m.e_val.init_normal(sz(a.vocab * a.d), 1.0, rng);
  m.w_v.init_normal(sz(a.d * a.d), w_std, rng);
  m.w_o.init_normal(sz(a.d * a.d), w_std, rng);
  m.w_r.init_normal(sz(a.vocab * a.d), w_std, rng);
  m.b_r.init_normal(sz(a.vocab), 0.0, rng);
  const int rows = scorer == Scorer::dot ? a.d : m.A;
  m.w_q.init_normal(sz(rows * a.d), w_std, rng);
  m.w_k.init_normal(sz(rows * a.d), w_std, rng);
  m.w.init_normal(scorer == Scorer::dot ? 0 : sz(m.A), 1 / std::sqrt(double(m.A)), rng);
  return m;
}

struct StepResult {
  double loss = 0, accuracy = 0;
};

// Forward (and with `train`, backward into the Params' g) on one batch.
Status step(Model& m, Scorer scorer, const Batch& b, int B, int S, bool train, int threads, StepResult* r) {
  const int d = m.d, V = m.V;
  const float inv_sqrt2 = static_cast<float>(1 / std::sqrt(2.0));
  std::vector<float> xq(sz(B * d)), xkv(sz(B * S * d)), vals(sz(B * S * d)), o(sz(B * d)), y(sz(B * d));
  for (int i = 0; i < B; ++i) {
    std::copy_n(&m.e_key.w[sz(b.keys[sz(i * S + b.query[sz(i)])] * d)], d, &xq[sz(i * d)]);
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < d; ++e)
        xkv[sz((i * S + s) * d + e)] =
            (m.e_key.w[sz(b.keys[sz(i * S + s)] * d + e)] + m.e_val.w[sz(b.vals[sz(i * S + s)] * d + e)]) * inv_sqrt2;
  }
  matmul_t(xkv.data(), m.w_v.w.data(), B * S, d, d, vals.data());  // values W_V x_j
  // The attention layer: o [B, d] from the query and the pairs.
  std::vector<float> q, k, lse(sz(B));
  const auto f32 = DType::f32;
  const TensorView v_view = TensorView::contiguous(vals.data(), f32, {B, S, d});
  const TensorView o_view = TensorView::contiguous(o.data(), f32, {B, 1, d});
  Params p;
  p.threads = threads;
  AdditiveParams ap;
  ap.threads = threads;
  const AdditiveWeights aw{TensorView::contiguous(m.w_q.w.data(), f32, {m.A, d}),
                           TensorView::contiguous(m.w_k.w.data(), f32, {m.A, d}),
                           TensorView::contiguous(m.w.w.data(), f32, {m.A})};
  if (scorer == Scorer::dot) {
    q.resize(sz(B * d)), k.resize(sz(B * S * d));
    matmul_t(xq.data(), m.w_q.w.data(), B, d, d, q.data());
    matmul_t(xkv.data(), m.w_k.w.data(), B * S, d, d, k.data());
    if (Status s = attention(TensorView::contiguous(q.data(), f32, {B, 1, 1, d}),
                             TensorView::contiguous(k.data(), f32, {B, 1, S, d}),
                             TensorView::contiguous(vals.data(), f32, {B, 1, S, d}),
                             TensorView::contiguous(o.data(), f32, {B, 1, 1, d}), p,
                             TensorView::contiguous(lse.data(), f32, {B, 1, 1}));
        !s)
      return s;
  } else if (Status s = additive_attention(TensorView::contiguous(xq.data(), f32, {B, 1, d}),
                                           TensorView::contiguous(xkv.data(), f32, {B, S, d}), v_view, aw, o_view, ap);
             !s) {
    return s;
  }
  matmul_t(o.data(), m.w_o.w.data(), B, d, d, y.data());  // output projection
  // Readout and cross-entropy.
  std::vector<float> dlogits;
  readout_loss(m.w_r, m.b_r, y.data(), B, d, V, b.target, &r->loss, &r->accuracy, &dlogits);
  if (!train) return Status::Ok();
  for (Param* prm : m.all()) std::fill(prm->g.begin(), prm->g.end(), 0.0f);
  std::vector<float> dy(sz(B * d), 0.0f), dout(sz(B * d), 0.0f), dxq(sz(B * d), 0.0f), dxkv(sz(B * S * d), 0.0f),
      dvals(sz(B * S * d));
  readout_backward(m.w_r, m.b_r, y.data(), dlogits, B, d, V, dy.data());
  matmul_t_backward(o.data(), m.w_o.w.data(), dy.data(), B, d, d, dout.data(), m.w_o.g.data());
  if (scorer == Scorer::dot) {
    std::vector<float> dq(sz(B * d)), dk(sz(B * S * d));
    if (Status s = attention_backward(TensorView::contiguous(q.data(), f32, {B, 1, 1, d}),
                                      TensorView::contiguous(k.data(), f32, {B, 1, S, d}),
                                      TensorView::contiguous(vals.data(), f32, {B, 1, S, d}),
                                      TensorView::contiguous(o.data(), f32, {B, 1, 1, d}),
                                      TensorView::contiguous(lse.data(), f32, {B, 1, 1}),
                                      TensorView::contiguous(dout.data(), f32, {B, 1, 1, d}),
                                      TensorView::contiguous(dq.data(), f32, {B, 1, 1, d}),
                                      TensorView::contiguous(dk.data(), f32, {B, 1, S, d}),
                                      TensorView::contiguous(dvals.data(), f32, {B, 1, S, d}), p);
        !s)
      return s;
    matmul_t_backward(xq.data(), m.w_q.w.data(), dq.data(), B, d, d, dxq.data(), m.w_q.g.data());
    matmul_t_backward(xkv.data(), m.w_k.w.data(), dk.data(), B * S, d, d, dxkv.data(), m.w_k.g.data());
  } else {
    std::vector<float> dxkv_score(sz(B * S * d));
    if (Status s = additive_attention_backward(
            TensorView::contiguous(xq.data(), f32, {B, 1, d}), TensorView::contiguous(xkv.data(), f32, {B, S, d}), v_view,
            aw, TensorView::contiguous(dout.data(), f32, {B, 1, d}),
            {TensorView::contiguous(dxq.data(), f32, {B, 1, d}), TensorView::contiguous(dxkv_score.data(), f32, {B, S, d}),
             TensorView::contiguous(dvals.data(), f32, {B, S, d}), TensorView::contiguous(m.w_q.g.data(), f32, {m.A, d}),
             TensorView::contiguous(m.w_k.g.data(), f32, {m.A, d}), TensorView::contiguous(m.w.g.data(), f32, {m.A})},
            ap);
        !s)
      return s;
    for (std::size_t e = 0; e < dxkv.size(); ++e) dxkv[e] += dxkv_score[e];
  }
  matmul_t_backward(xkv.data(), m.w_v.w.data(), dvals.data(), B * S, d, d, dxkv.data(), m.w_v.g.data());
  // The embedding lookups: the query's gradient to its key, each pair's (halved by 1/sqrt 2) to both.
  for (int i = 0; i < B; ++i) {
    const int qk_id = b.keys[sz(i * S + b.query[sz(i)])];
    for (int e = 0; e < d; ++e) m.e_key.g[sz(qk_id * d + e)] += dxq[sz(i * d + e)];
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < d; ++e) {
        const float g = dxkv[sz((i * S + s) * d + e)] * inv_sqrt2;
        m.e_key.g[sz(b.keys[sz(i * S + s)] * d + e)] += g;
        m.e_val.g[sz(b.vals[sz(i * S + s)] * d + e)] += g;
      }
  }
  return Status::Ok();
}

struct Run {
  std::vector<double> loss;  // per step (training batch, before the update)
  double eval_loss = 0, eval_accuracy = 0, seconds = 0;
  int reached = -1;  // first step whose trailing-window mean loss is <= threshold
};

Status train(const CompareArgs& a, Scorer scorer, std::uint64_t seed, Run* run) {
  Model m = make_model(a, scorer, seed);
  std::mt19937_64 data(seed * 7919 + 1), held_out(seed * 7919 + 2);
  double window_sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < a.steps; ++t) {
    const Batch b = make_batch(a.batch, a.seq, a.vocab, data);
    StepResult r;
    if (Status s = step(m, scorer, b, a.batch, a.seq, true, a.threads, &r); !s) return s;
    run->loss.push_back(r.loss);
    window_sum += r.loss;
    if (t >= a.window) window_sum -= run->loss[sz(t - a.window)];
    if (run->reached < 0 && t + 1 >= a.window && window_sum / a.window <= a.threshold) run->reached = t;
    for (Param* p : m.all()) p->adam(a.lr, t + 1);
  }
  run->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int e = 0; e < a.eval_batches; ++e) {
    const Batch b = make_batch(a.batch, a.seq, a.vocab, held_out);
    StepResult r;
    if (Status s = step(m, scorer, b, a.batch, a.seq, false, a.threads, &r); !s) return s;
    run->eval_loss += r.loss / a.eval_batches, run->eval_accuracy += r.accuracy / a.eval_batches;
  }
  return Status::Ok();
}

Status check(const CompareArgs& a) {
  auto at_least = [](const char* option, int value, int low) {
    return value >= low ? Status::Ok()
                        : Status::Invalid(option, std::to_string(value) + "; expected at least " + std::to_string(low));
  };
  if (Status s = at_least("--seeds", a.seeds, 0); !s) return s;
  if (Status s = at_least("--steps", a.steps, 1); !s) return s;
  if (Status s = at_least("--d", a.d, 1); !s) return s;
  if (Status s = at_least("--attn-dim", a.attn_dim, 0); !s) return s;
  if (Status s = at_least("--seq", a.seq, 2); !s) return s;
  if (Status s = at_least("--batch", a.batch, 1); !s) return s;
  if (Status s = at_least("--time-n", a.time_n, 0); !s) return s;
  if (Status s = at_least("--time-d", a.time_d, 1); !s) return s;
  if (Status s = at_least("--reps", a.reps, 1); !s) return s;
  if (a.threads < 0 || a.threads > 4096)
    return Status::Invalid("--threads", std::to_string(a.threads) + "; expected 0 (default) or 1 to 4096");
  if (a.vocab < a.seq)
    return Status::Invalid("--vocab", std::to_string(a.vocab) + "; expected at least --seq = " + std::to_string(a.seq) +
                                          " (the keys of a sequence are distinct)");
  if (!(a.lr > 0) || !std::isfinite(a.lr)) return Status::Invalid("--lr", fixed(a.lr, 6) + "; expected a number > 0");
  if (!(a.threshold > 0) || !std::isfinite(a.threshold))
    return Status::Invalid("--threshold", fixed(a.threshold, 6) + "; expected a loss > 0 (nats)");
  return Status::Ok();
}

Status compare(const CompareArgs& a, std::ostream& out) {
  if (Status s = check(a); !s) return s;
  if (Status s = check_outputs({{"--png", a.png}}, {}); !s) return s;  // before anything runs
  if (Status s = plot::check_can_draw("--png", a.png); !s) return s;
  const int A = a.attn_dim > 0 ? a.attn_dim : a.d;
  char line[256];

  // 1. cost
  if (a.time_n > 0) {
    const double n = a.time_n, d = a.time_d, At = a.attn_dim > 0 ? a.attn_dim : a.time_d;
    const double dot_flops = 2 * d, add_flops = 3 * At + 2 * At * d * (1 / n + 1 / n);  // + A tanh
    Timing t;
    if (Status s = time_scorers(a, &t); !s) return s;
    out << "cost per score, Sq = Skv = " << a.time_n << ", d = " << a.time_d << ", A = " << fixed(At, 0)
        << ", f32, best of " << a.reps << " (each time includes the softmax and P·V, 2·d FLOPs per score, the same for both):\n";
    std::snprintf(line, sizeof line, "  %-10s %26s %14s\n", "scorer", "FLOPs per score (scoring)", "ns per score");
    out << line;
    std::snprintf(line, sizeof line, "  %-10s %26s %14.3f\n", "dot", fixed(dot_flops, 0).c_str(), t.dot_ns);
    out << line;
    std::snprintf(line, sizeof line, "  %-10s %26s %14.3f\n", "additive", (fixed(add_flops, 0) + " + " + fixed(At, 0) + " tanh").c_str(),
                  t.additive_ns);
    out << line;
    out << "  additive / dot: " << fixed(add_flops / dot_flops, 2) << "x the FLOPs (plus the tanh), "
        << fixed(t.additive_ns / t.dot_ns, 1) << "x the time\n";
    out << "  (one libm tanhf: " << fixed(t.tanh_ns, 2) << " ns on one thread, so " << fixed(At, 0) << " of them are "
        << fixed(At * t.tanh_ns, 0) << " thread-ns per score: the additive scorer is bound by its tanh, not its FLOPs; "
        << "the dot scorer is attn's tiled SIMD kernel)\n\n";
  }

  // 2. quality
  if (a.seeds == 0) return Status::Ok();
  const Scorer scorers[2] = {Scorer::dot, Scorer::additive};
  const char* names[2] = {"dot", "additive"};
  std::vector<Run> runs[2];
  for (int seed = 1; seed <= a.seeds; ++seed)
    for (int arm = 0; arm < 2; ++arm) {
      Run r;
      if (Status s = train(a, scorers[arm], static_cast<std::uint64_t>(seed), &r); !s) return s;
      runs[arm].push_back(std::move(r));
    }
  out << "associative recall: " << a.seq << " (key, value) pairs, " << a.vocab << " keys and values, d = " << a.d
      << ", A = " << A << ", batch " << a.batch << ", Adam lr " << a.lr << ", " << a.steps << " steps, " << a.seeds
      << " seeds; both scorers share the embeddings, W_V, W_O, readout, data and optimiser (scoring parameters: dot "
      << 2 * a.d * a.d << ", additive " << 2 * A * a.d + A << ")\n";
  out << "threshold: training loss, mean of the last " << a.window << " steps, <= " << a.threshold
      << " nats (chance: ln " << a.vocab << " = " << fixed(std::log(double(a.vocab)), 2) << ")\n";
  std::snprintf(line, sizeof line, "%-5s %-9s %10s %10s %10s %12s\n", "seed", "scorer", "steps_to", "final_acc",
                "final_loss", "train_s");
  out << line;
  for (int s = 0; s < a.seeds; ++s)
    for (int arm = 0; arm < 2; ++arm) {
      const Run& r = runs[arm][sz(s)];
      const std::string reached = r.reached < 0 ? "not" : std::to_string(r.reached + 1);
      std::snprintf(line, sizeof line, "%-5d %-9s %10s %10.3f %10.3f %12.2f\n", s + 1, names[arm], reached.c_str(),
                    r.eval_accuracy, r.eval_loss, r.seconds);
      out << line;
    }
  for (int arm = 0; arm < 2; ++arm) {
    double acc = 0, loss = 0;
    int reached = 0;
    for (const Run& r : runs[arm]) acc += r.eval_accuracy / a.seeds, loss += r.eval_loss / a.seeds, reached += r.reached >= 0;
    out << names[arm] << ": mean held-out accuracy " << fixed(acc, 3) << ", loss " << fixed(loss, 3) << ", "
        << reached << "/" << a.seeds << " seeds reached the threshold\n";
  }
  if (!a.png.empty()) {
    plot::LinePlot p;
    p.title = "recall, d = " + std::to_string(a.d) + ": dot vs additive scoring";
    p.x_label = "step";
    p.y_label = "training loss (mean of " + std::to_string(a.window) + " steps)";
    std::vector<double> x(sz(a.steps));
    std::iota(x.begin(), x.end(), 1.0);
    for (int arm = 0; arm < 2; ++arm) {
      std::vector<double> mean(sz(a.steps), 0.0);
      for (const Run& r : runs[arm]) {
        const std::vector<double> y = smooth(r.loss, a.window);
        for (std::size_t i = 0; i < y.size(); ++i) mean[i] += y[i] / a.seeds;
        if (a.seeds > 1) p.series.push_back({"", x, y, arm, 1});
      }
      p.series.push_back({std::string(names[arm]) + (a.seeds > 1 ? " (mean of " + std::to_string(a.seeds) + " seeds)" : ""), x, mean, arm, 3});
    }
    p.series.push_back({"threshold", {1.0, double(a.steps)}, {a.threshold, a.threshold}, 2, 1});
    if (Status s = plot::write_line_plot(a.png, p); !s) return renamed(s, "--png");
    out << "wrote " << a.png << "\n";
  }
  return Status::Ok();
}

}  // namespace

void add_compare_scoring_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<CompareArgs>();
  CLI::App* sub = app.add_subcommand(
      "compare-scoring",
      "Scaled dot-product vs additive (Bahdanau) scoring: FLOPs and measured time per score on one shape, and "
      "held-out quality on associative recall with both trained the same way (same data, init, optimiser), with a "
      "PNG of the loss curves");
  sub->add_option("--seeds", a->seeds, "Seeds (training runs per scorer; 0 = cost only)")->capture_default_str();
  sub->add_option("--steps", a->steps, "Adam steps per run")->capture_default_str();
  sub->add_option("--d", a->d, "Model width d (= d_k)")->capture_default_str();
  sub->add_option("--attn-dim", a->attn_dim, "Additive attention dimension A; 0 = d")->capture_default_str();
  sub->add_option("--seq", a->seq, "(key, value) pairs per sequence")->capture_default_str();
  sub->add_option("--vocab", a->vocab, "Distinct keys (and values); at least --seq")->capture_default_str();
  sub->add_option("--batch", a->batch, "Sequences per step")->capture_default_str();
  sub->add_option("--lr", a->lr, "Adam learning rate")->capture_default_str();
  sub->add_option("--threshold", a->threshold, "Loss (nats) the trailing 10-step mean must reach")->capture_default_str();
  sub->add_option("--time-n", a->time_n, "Timing: Sq = Skv (0 = no timing)")->capture_default_str();
  sub->add_option("--time-d", a->time_d, "Timing: head dimension d (and A unless --attn-dim)")->capture_default_str();
  sub->add_option("--reps", a->reps, "Timing: repetitions (best is reported)")->capture_default_str();
  sub->add_option("--threads", a->threads, "Threads (0 = the default)")->capture_default_str();
  sub->add_option("--png", a->png, "Loss curves of both scorers; empty = none")->capture_default_str();
  sub->add_option("--eval-batches", a->eval_batches, "Held-out batches for the final accuracy")->group("");  // hidden
  on_run(sub, [a, &out] { return compare(*a, out); });
}

}  // namespace attn::tools
