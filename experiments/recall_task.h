// The associative-recall training task shared by `attn scaling-experiment` and `attn compare-scoring`: a sequence
// of `S` (key, value) pairs with distinct keys from a vocabulary of `V`, a query position, and the value paired
// with it as the target; a parameter tensor trained by Adam; the readout and its cross-entropy; the trailing-mean
// smoothing of a loss curve.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace attn::tools::recall {

inline std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

inline std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

// One parameter tensor with its gradient and Adam moments.
struct Param {
  std::vector<float> w, g, m, v;
  void init_normal(std::size_t n, double std, std::mt19937_64& rng) {
    std::normal_distribution<double> nd(0.0, std);
    w.resize(n);
    for (float& x : w) x = static_cast<float>(nd(rng));
    g.assign(n, 0.0f), m.assign(n, 0.0f), v.assign(n, 0.0f);
  }
  // Adam (β = 0.9, 0.999, ε = 1e-8, no weight decay), step t >= 1.
  void adam(double lr, int t) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8, c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = static_cast<float>(b1 * m[i] + (1 - b1) * g[i]);
      v[i] = static_cast<float>(b2 * v[i] + (1 - b2) * double(g[i]) * g[i]);
      w[i] -= static_cast<float>(lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps));
    }
  }
};

struct Batch {
  std::vector<int> keys, vals, query, target;  // keys/vals [B, S]; query (a position) and target [B]
};

inline Batch make_batch(int B, int S, int V, std::mt19937_64& rng) {
  Batch b;
  std::vector<int> perm(sz(V));
  std::iota(perm.begin(), perm.end(), 0);
  std::uniform_int_distribution<int> val(0, V - 1), pos(0, S - 1);
  for (int i = 0; i < B; ++i) {
    for (int s = 0; s < S; ++s) std::swap(perm[sz(s)], perm[sz(s + std::uniform_int_distribution<int>(0, V - 1 - s)(rng))]);
    for (int s = 0; s < S; ++s) b.keys.push_back(perm[sz(s)]), b.vals.push_back(val(rng));
    const int q = pos(rng);
    b.query.push_back(q);
    b.target.push_back(b.vals[sz(i * S + q)]);
  }
  return b;
}

// The trailing mean over `window` steps (shorter at the start).
inline std::vector<double> smooth(const std::vector<double>& x, int window) {
  std::vector<double> out(x.size());
  double sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sum += x[i];
    if (i >= sz(window)) sum -= x[i - sz(window)];
    out[i] = sum / static_cast<double>(std::min<std::size_t>(i + 1, sz(window)));
  }
  return out;
}

// The readout: logits z = W_r y + b_r (W_r [V, d]) for each of the B rows of y [B, d], and the mean
// cross-entropy against the targets; sets *loss and *accuracy (means over the batch) and dlogits [B, V] = dL/dz.
inline void readout_loss(const Param& w_r, const Param& b_r, const float* y, int B, int d, int V,
                         const std::vector<int>& target, double* loss, double* accuracy, std::vector<float>* dlogits) {
  dlogits->assign(sz(B * V), 0.0f);
  *loss = *accuracy = 0;
  std::vector<double> z(sz(V));
  for (int i = 0; i < B; ++i) {
    for (int c = 0; c < V; ++c) {
      double acc = b_r.w[sz(c)];
      for (int e = 0; e < d; ++e) acc += double(w_r.w[sz(c * d + e)]) * y[sz(i * d + e)];
      z[sz(c)] = acc;
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double x : z) sum += std::exp(x - mx);
    const double lse = mx + std::log(sum);
    const int t = target[sz(i)];
    *loss += (lse - z[sz(t)]) / B;
    *accuracy += (std::max_element(z.begin(), z.end()) - z.begin() == t ? 1.0 : 0.0) / B;
    for (int c = 0; c < V; ++c) (*dlogits)[sz(i * V + c)] = static_cast<float>((std::exp(z[sz(c)] - lse) - (c == t)) / B);
  }
}

// Its backward: adds dL/dW_r and dL/db_r into their g, and dL/dy into dy [B, d].
inline void readout_backward(Param& w_r, Param& b_r, const float* y, const std::vector<float>& dlogits, int B, int d,
                             int V, float* dy) {
  for (int i = 0; i < B; ++i)
    for (int c = 0; c < V; ++c) {
      const float g = dlogits[sz(i * V + c)];
      b_r.g[sz(c)] += g;
      for (int e = 0; e < d; ++e) w_r.g[sz(c * d + e)] += g * y[sz(i * d + e)], dy[sz(i * d + e)] += g * w_r.w[sz(c * d + e)];
    }
}

}  // namespace attn::tools::recall
