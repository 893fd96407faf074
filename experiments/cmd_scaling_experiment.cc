// attn scaling-experiment: does leaving out the 1/sqrt(d_k) factor saturate the softmax and slow training?
//
// The task is associative recall. A sequence holds `seq` (key, value) pairs, keys distinct, drawn from a
// vocabulary of `vocab` keys and `vocab` values, and a query key that is one of them; the answer is the
// value paired with it. Each pair is one position whose input is (E_key[key] + E_val[value]) / sqrt(2);
// the query position's input is E_key[query]. One attention layer (attn::MultiHeadAttention, d_model = d_k,
// one head, no bias) lets the query attend over the pairs, a readout W_r, b_r maps its output to value
// logits, and the loss is the cross-entropy. The task needs attention: the answer sits at a random
// position, found only by matching the query against the keys. No positional information is needed.
//
// Gradients: attention through MultiHeadAttention::backward (attn::attention_backward + sgemm), the
// readout and the embedding lookups by hand; Adam (β = 0.9, 0.999, ε = 1e-8, no weight decay).
//
// Init: embeddings N(0, 1); W_Q, W_K, W_V, W_O and W_r N(0, 1/d_model) (LeCun normal), b_r = 0. Inputs then
// have unit-variance components and so do q and k: q·k has variance ≈ d_k, the premise of the seeds'
// argument (std 8 at d_k = 64). Both arms (scale 1/sqrt(d_k) and scale 1) of a seed start from the same
// weights and see the same batches; only the scale differs.
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

#include "attn/mha.h"
#include "commands.h"
#include "files.h"
#include "json_writer.h"
#include "plot.h"
#include "recall_task.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

using namespace recall;  // the task, Param (Adam), smooth, sz, fixed (recall_task.h)

struct ExperimentArgs {
  int seeds = 5, steps = 600, dk = 64, seq = 16, vocab = 32, batch = 32, eval_batches = 16, window = 10;
  double lr = 3e-3, threshold = 0.2, init_gain = 1.0;
  std::string png = "scaling.png";
  bool json = false;
};

struct Model {
  int d = 0, V = 0;
  Param e_key, e_val, w_r, b_r;
  Param mq, mk, mv, mo;  // the attention layer's weights, trained here, copied into `mha` each step
  MultiHeadAttention mha;
};

Status make_model(const ExperimentArgs& a, std::uint64_t seed, Model* m) {
  m->d = a.dk, m->V = a.vocab;
  if (Status s = MultiHeadAttention::create({a.dk, 1, 1, a.dk, a.dk, false}, &m->mha); !s) return s;
  std::mt19937_64 rng(seed);
  const double w_std = a.init_gain / std::sqrt(double(a.dk));
  m->e_key.init_normal(sz(a.vocab * a.dk), 1.0, rng);
  m->e_val.init_normal(sz(a.vocab * a.dk), 1.0, rng);
  for (Param* p : {&m->mq, &m->mk, &m->mv, &m->mo}) p->init_normal(sz(a.dk * a.dk), w_std, rng);
  m->w_r.init_normal(sz(a.vocab * a.dk), w_std, rng);
  m->b_r.init_normal(sz(a.vocab), 0.0, rng);
  return Status::Ok();
}

struct StepResult {
  double loss = 0, accuracy = 0, entropy = 0, grad_qk = 0;  // entropy: mean over the batch of the query row's
};

// Forward (and with `train`, backward into the Params' g) on one batch.
Status step(Model& m, const Batch& b, int B, int S, double scale, bool train, StepResult* r) {
  const int d = m.d, V = m.V;
  m.mha.weights().w_q = m.mq.w, m.mha.weights().w_k = m.mk.w, m.mha.weights().w_v = m.mv.w, m.mha.weights().w_o = m.mo.w;
  const float inv_sqrt2 = static_cast<float>(1 / std::sqrt(2.0));
  std::vector<float> xq(sz(B * d)), xkv(sz(B * S * d)), out(sz(B * d));
  for (int i = 0; i < B; ++i) {
    std::copy_n(&m.e_key.w[sz(b.keys[sz(i * S + b.query[sz(i)])] * d)], d, &xq[sz(i * d)]);
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < d; ++e)
        xkv[sz((i * S + s) * d + e)] =
            (m.e_key.w[sz(b.keys[sz(i * S + s)] * d + e)] + m.e_val.w[sz(b.vals[sz(i * S + s)] * d + e)]) * inv_sqrt2;
  }
  Params params;
  params.scale = scale;
  params.threads = 1;
  const TensorView xq_v = TensorView::contiguous(xq.data(), DType::f32, {B, 1, d});
  const TensorView xkv_v = TensorView::contiguous(xkv.data(), DType::f32, {B, S, d});
  MhaSaved saved;
  if (Status s = m.mha.forward_cross(xq_v, xkv_v, TensorView::contiguous(out.data(), DType::f32, {B, 1, d}), params, &saved); !s)
    return s;
  // Entropy of the query's attention row: p_j = exp(scale·q·k_j − lse).
  r->entropy = 0;
  for (int i = 0; i < B; ++i) {
    double h = 0;
    for (int s = 0; s < S; ++s) {
      double dot = 0;
      for (int e = 0; e < d; ++e) dot += double(saved.q[sz(i * d + e)]) * saved.k[sz((i * S + s) * d + e)];
      const double p = std::exp(scale * dot - saved.lse[sz(i)]);
      if (p > 0) h -= p * std::log(p);
    }
    r->entropy += std::max(h, 0.0) / B;  // (p may round a hair above 1)
  }
  // Readout and cross-entropy.
  std::vector<float> dlogits;
  readout_loss(m.w_r, m.b_r, out.data(), B, d, V, b.target, &r->loss, &r->accuracy, &dlogits);
  if (!train) return Status::Ok();
  for (Param* p : {&m.e_key, &m.e_val, &m.w_r, &m.b_r}) std::fill(p->g.begin(), p->g.end(), 0.0f);
  std::vector<float> dout(sz(B * d), 0.0f);
  readout_backward(m.w_r, m.b_r, out.data(), dlogits, B, d, V, dout.data());
  MhaGrads grads;
  if (Status s = m.mha.backward(xq_v, xkv_v, saved, TensorView::contiguous(dout.data(), DType::f32, {B, 1, d}), &grads, params); !s)
    return s;
  m.mq.g = grads.weights.w_q, m.mk.g = grads.weights.w_k, m.mv.g = grads.weights.w_v, m.mo.g = grads.weights.w_o;
  double qk = 0;
  for (const Param* p : {&m.mq, &m.mk})
    for (float g : p->g) qk += double(g) * g;
  r->grad_qk = std::sqrt(qk);
  // The embedding lookups: the query row's gradient to its key, each pair's (halved by 1/sqrt 2) to both.
  for (int i = 0; i < B; ++i) {
    const int qk_id = b.keys[sz(i * S + b.query[sz(i)])];
    for (int e = 0; e < d; ++e) m.e_key.g[sz(qk_id * d + e)] += grads.x_q[sz(i * d + e)];
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < d; ++e) {
        const float g = grads.x_kv[sz((i * S + s) * d + e)] * inv_sqrt2;
        m.e_key.g[sz(b.keys[sz(i * S + s)] * d + e)] += g;
        m.e_val.g[sz(b.vals[sz(i * S + s)] * d + e)] += g;
      }
  }
  return Status::Ok();
}

struct Run {
  std::vector<double> loss, entropy;  // per step (training batch, before the update)
  double grad_qk0 = 0, eval_loss = 0, eval_accuracy = 0;
  int reached = -1;                   // first step whose trailing-window mean loss is <= threshold
};

Status train(const ExperimentArgs& a, std::uint64_t seed, double scale, Run* run) {
  Model m;
  if (Status s = make_model(a, seed, &m); !s) return s;
  std::mt19937_64 data(seed * 7919 + 1), held_out(seed * 7919 + 2);
  double window_sum = 0;
  for (int t = 0; t < a.steps; ++t) {
    const Batch b = make_batch(a.batch, a.seq, a.vocab, data);
    StepResult r;
    if (Status s = step(m, b, a.batch, a.seq, scale, true, &r); !s) return s;
    if (t == 0) run->grad_qk0 = r.grad_qk;
    run->loss.push_back(r.loss), run->entropy.push_back(r.entropy);
    window_sum += r.loss;
    if (t >= a.window) window_sum -= run->loss[sz(t - a.window)];
    if (run->reached < 0 && t + 1 >= a.window && window_sum / a.window <= a.threshold) run->reached = t;
    for (Param* p : {&m.e_key, &m.e_val, &m.w_r, &m.b_r, &m.mq, &m.mk, &m.mv, &m.mo}) p->adam(a.lr, t + 1);
  }
  for (int e = 0; e < a.eval_batches; ++e) {
    const Batch b = make_batch(a.batch, a.seq, a.vocab, held_out);
    StepResult r;
    if (Status s = step(m, b, a.batch, a.seq, scale, false, &r); !s) return s;
    run->eval_loss += r.loss / a.eval_batches, run->eval_accuracy += r.accuracy / a.eval_batches;
  }
  return Status::Ok();
}

Status check(const ExperimentArgs& a) {
  auto at_least = [](const char* option, double value, double low) {
    return value >= low ? Status::Ok()
                        : Status::Invalid(option, fixed(value, 0) + "; expected at least " + fixed(low, 0));
  };
  if (Status s = at_least("--seeds", a.seeds, 1); !s) return s;
  if (Status s = at_least("--steps", a.steps, 1); !s) return s;
  if (Status s = at_least("--dk", a.dk, 1); !s) return s;
  if (Status s = at_least("--seq", a.seq, 2); !s) return s;
  if (Status s = at_least("--batch", a.batch, 1); !s) return s;
  if (Status s = at_least("--eval-batches", a.eval_batches, 1); !s) return s;
  if (a.vocab < a.seq)
    return Status::Invalid("--vocab", std::to_string(a.vocab) + "; expected at least --seq = " + std::to_string(a.seq) +
                                          " (the keys of a sequence are distinct)");
  if (!(a.lr > 0) || !std::isfinite(a.lr)) return Status::Invalid("--lr", fixed(a.lr, 6) + "; expected a number > 0");
  if (!(a.init_gain > 0) || !std::isfinite(a.init_gain))
    return Status::Invalid("--init-gain", fixed(a.init_gain, 6) + "; expected a number > 0");
  if (!(a.threshold > 0) || !std::isfinite(a.threshold))
    return Status::Invalid("--threshold", fixed(a.threshold, 6) + "; expected a loss > 0 (nats)");
  return Status::Ok();
}

Status experiment(const ExperimentArgs& a, std::ostream& out) {
  if (Status s = check(a); !s) return s;
  if (Status s = check_outputs({{"--png", a.png}}, {}); !s) return s;  // before the training runs
  if (Status s = plot::check_can_draw("--png", a.png); !s) return s;
  const auto start = std::chrono::steady_clock::now();
  const double scales[2] = {1.0 / std::sqrt(double(a.dk)), 1.0};
  const char* names[2] = {"1/sqrt(dk)", "1"};
  std::vector<Run> runs[2];
  for (int seed = 1; seed <= a.seeds; ++seed)
    for (int arm = 0; arm < 2; ++arm) {
      Run r;
      if (Status s = train(a, static_cast<std::uint64_t>(seed), scales[arm], &r); !s) return s;
      runs[arm].push_back(std::move(r));
    }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto entropy_at = [&](const Run& r, int t) { return t < a.steps ? r.entropy[sz(t)] : NAN; };

  // Per-seed ratios of steps to the threshold; a lower bound when only the scaled arm got there.
  std::vector<std::string> ratio_text;
  std::vector<double> ratios;
  for (int s = 0; s < a.seeds; ++s) {
    const int sc = runs[0][sz(s)].reached, un = runs[1][sz(s)].reached;
    if (sc >= 0 && un >= 0) ratios.push_back(double(un + 1) / (sc + 1)), ratio_text.push_back(fixed(ratios.back(), 2));
    else if (sc >= 0) ratios.push_back(NAN), ratio_text.push_back("> " + fixed(double(a.steps) / (sc + 1), 2));
    else ratios.push_back(NAN), ratio_text.push_back(un >= 0 ? "< " + fixed(double(un + 1) / a.steps, 2) : "n/a");
  }

  if (a.json) {
    JsonObject o;
    o.add("task", "associative recall").add("seq", std::int64_t{a.seq}).add("vocab", std::int64_t{a.vocab});
    o.add("dk", std::int64_t{a.dk}).add("batch", std::int64_t{a.batch}).add("steps", std::int64_t{a.steps});
    o.add("lr", a.lr).add("threshold", a.threshold).add("window", std::int64_t{a.window}).add("seconds", seconds);
    o.add("init", "embeddings N(0,1); W_Q, W_K, W_V, W_O, W_r N(0,gain^2/d_model)").add("init_gain", a.init_gain);
    for (int arm = 0; arm < 2; ++arm) {
      std::vector<std::int64_t> reached;
      std::vector<double> acc, loss, e0, e10, e50, efinal, g0;
      for (const Run& r : runs[arm]) {
        reached.push_back(r.reached < 0 ? -1 : r.reached + 1);
        acc.push_back(r.eval_accuracy), loss.push_back(r.eval_loss), g0.push_back(r.grad_qk0);
        e0.push_back(entropy_at(r, 0)), e10.push_back(entropy_at(r, 10)), e50.push_back(entropy_at(r, 50));
        efinal.push_back(r.entropy.back());
      }
      JsonObject arm_o;
      arm_o.add("scale", scales[arm]).add("steps_to_threshold", reached).add("final_accuracy", acc);
      arm_o.add("final_loss", loss).add("entropy_step0", e0).add("entropy_step10", e10).add("entropy_step50", e50);
      arm_o.add("entropy_final", efinal).add("grad_norm_wq_wk_step0", g0);
      o.add(arm == 0 ? "scaled" : "unscaled", arm_o);
    }
    o.add("ratio_unscaled_over_scaled", ratios);
    out << o.str() << "\n";
  } else {
    out << "associative recall: " << a.seq << " (key, value) pairs per sequence, " << a.vocab << " keys and " << a.vocab
        << " values, one head, d_model = d_k = " << a.dk << ", batch " << a.batch << ", Adam lr " << a.lr << ", "
        << a.steps << " steps, " << a.seeds << " seeds\n";
    const double g2 = a.init_gain * a.init_gain;
    out << "init: embeddings N(0, 1), W_Q W_K W_V W_O W_r N(0, " << (a.init_gain == 1.0 ? "1" : fixed(g2, 3))
        << "/d_model): q and k components of variance ~" << fixed(g2, 3) << ", so q.k has variance ~"
        << (a.init_gain == 1.0 ? "" : fixed(g2 * g2, 3) + " x ") << "d_k = " << fixed(g2 * g2 * a.dk, 1) << " (std "
        << fixed(g2 * std::sqrt(double(a.dk)), 2) << ")\n";
    out << "threshold: training loss, mean of the last " << a.window << " steps, <= " << a.threshold
        << " nats (chance: ln " << a.vocab << " = " << fixed(std::log(double(a.vocab)), 2)
        << "); entropy: the query's attention row, nats (uniform: ln " << a.seq << " = "
        << fixed(std::log(double(a.seq)), 2) << ")\n\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-5s %-11s %10s %10s %10s %10s %10s %10s %10s %10s\n", "seed", "scale", "steps_to",
                  "final_acc", "final_loss", "entropy@0", "entropy@10", "entropy@50", "entropy@end", "|g_QK|@0");
    out << line;
    for (int s = 0; s < a.seeds; ++s)
      for (int arm = 0; arm < 2; ++arm) {
        const Run& r = runs[arm][sz(s)];
        const std::string reached = r.reached < 0 ? "not" : std::to_string(r.reached + 1);
        // A step the run did not reach prints "-", a value training drove to inf or NaN "diverged".
        const auto cell = [&](double x, int t, const char* format) {
          char text[32];
          if (t >= a.steps) return std::string("-");
          if (!std::isfinite(x)) return std::string("diverged");
          std::snprintf(text, sizeof text, format, x);
          return std::string(text);
        };
        std::snprintf(line, sizeof line, "%-5d %-11s %10s %10s %10s %10s %10s %10s %10s %10s\n", s + 1, names[arm],
                      reached.c_str(), cell(r.eval_accuracy, 0, "%.3f").c_str(), cell(r.eval_loss, 0, "%.3f").c_str(),
                      cell(entropy_at(r, 0), 0, "%.3f").c_str(), cell(entropy_at(r, 10), 10, "%.3f").c_str(),
                      cell(entropy_at(r, 50), 50, "%.3f").c_str(), cell(r.entropy.back(), 0, "%.3f").c_str(),
                      cell(r.grad_qk0, 0, "%.3g").c_str());
        out << line;
      }
    out << "\nsteps to threshold, unscaled / scaled, per seed:";
    for (int s = 0; s < a.seeds; ++s) out << (s ? ", " : " ") << ratio_text[sz(s)];
    double sum = 0;
    int n = 0;
    for (double r : ratios)
      if (std::isfinite(r)) sum += r, ++n;
    if (n == a.seeds) out << " (mean " << fixed(sum / n, 2) << ")";
    out << "\n(final_acc / final_loss: " << a.eval_batches << " held-out batches after training; " << fixed(seconds, 1)
        << " s)\n";
  }

  if (!a.png.empty()) {
    plot::LinePlot p;
    p.title = "associative recall (d_k = " + std::to_string(a.dk) + "): training loss (mean of " + std::to_string(a.window) +
              " steps)";
    p.x_label = "step";
    p.y_label = "cross-entropy (nats)";
    std::vector<double> x(sz(a.steps));
    std::iota(x.begin(), x.end(), 1.0);
    for (int arm = 0; arm < 2; ++arm) {
      std::vector<double> mean(sz(a.steps), 0.0);
      for (const Run& r : runs[arm]) {
        const std::vector<double> y = smooth(r.loss, a.window);
        for (std::size_t i = 0; i < y.size(); ++i) mean[i] += y[i] / a.seeds;
        if (a.seeds > 1) p.series.push_back({"", x, y, arm, 1});
      }
      p.series.push_back({std::string("scale ") + names[arm] + (a.seeds > 1 ? " (mean of " + std::to_string(a.seeds) + " seeds)" : ""), x, mean, arm, 3});
    }
    p.series.push_back({"threshold", {1.0, double(a.steps)}, {a.threshold, a.threshold}, 2, 1});
    if (Status s = plot::write_line_plot(a.png, p); !s) return renamed(s, "--png");
    if (!a.json) out << "wrote " << a.png << "\n";
  }
  return Status::Ok();
}

}  // namespace

void add_scaling_experiment_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<ExperimentArgs>();
  CLI::App* sub = app.add_subcommand(
      "scaling-experiment",
      "Train one attention layer on associative recall with scale 1/sqrt(d_k) and with scale 1 (same init and data per "
      "seed) and compare: steps to a loss threshold, held-out accuracy, attention entropy, a PNG of the loss curves. "
      "Init: embeddings N(0,1), projections N(0,1/d_model), so q.k has variance ~d_k");
  sub->add_option("--seeds", a->seeds, "Seeds (runs per arm)")->capture_default_str();
  sub->add_option("--steps", a->steps, "Adam steps per run")->capture_default_str();
  sub->add_option("--dk", a->dk, "Head dimension d_k (= d_model, one head)")->capture_default_str();
  sub->add_option("--seq", a->seq, "(key, value) pairs per sequence")->capture_default_str();
  sub->add_option("--vocab", a->vocab, "Distinct keys (and values); at least --seq")->capture_default_str();
  sub->add_option("--batch", a->batch, "Sequences per step")->capture_default_str();
  sub->add_option("--lr", a->lr, "Adam learning rate")->capture_default_str();
  sub->add_option("--init-gain", a->init_gain,
                  "Projections start N(0, gain^2/d_model): q.k variance ~gain^4 d_k (0.577 ~ PyTorch's nn.Linear default)")
      ->capture_default_str();
  sub->add_option("--threshold", a->threshold, "Loss (nats) the trailing 10-step mean must reach")->capture_default_str();
  sub->add_option("--png", a->png, "Loss curves of both arms; empty = none")->capture_default_str();
  sub->add_flag("--json", a->json, "One JSON object instead of the table");
  sub->add_option("--eval-batches", a->eval_batches, "Held-out batches for the final accuracy")->group("");  // hidden
  on_run(sub, [a, &out] { return experiment(*a, out); });
}

}  // namespace attn::tools
