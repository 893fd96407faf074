#include "reference/reference.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <cmath>
#include <limits>

#include "core/convert.h"

namespace attn::reference {
namespace {

double load(const core::Strided& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  const std::int64_t off = t.offset(a, b, c, d);
  switch (t.dtype) {
    case DType::f32: return static_cast<const float*>(t.data)[off];
    case DType::bf16: return core::to_float(static_cast<const core::bf16*>(t.data)[off]);
    case DType::f16: return core::to_float(static_cast<const core::f16*>(t.data)[off]);
    case DType::boolean: return static_cast<const unsigned char*>(t.data)[off] != 0;
    case DType::i8: return static_cast<const std::int8_t*>(t.data)[off];
    case DType::i4: return core::q4_at(t.data, off);
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

// K or V element (b, hk, j, d), through the page table when the cache is paged; i8 values times their row's
// scale, i4 values times their block's (exact in double: a float times an integer of at most 8 bits).
double load_kv(const core::Problem& p, const core::Strided& t, std::int64_t b, std::int64_t hk, std::int64_t j,
               std::int64_t d) {
  std::int64_t a = b, row = j;
  if (p.paged) {
    const core::Paged& pg = *p.paged;
    a = pg.table[b * pg.table_stride[0] + (j / pg.page_size) * pg.table_stride[1]], row = j % pg.page_size;
  }
  const double x = load(t, a, hk, row, d);
  if (t.dtype != DType::i8 && t.dtype != DType::i4) return x;
  const core::Strided& scale = &t == &p.k ? *p.k_scale : *p.v_scale;
  const std::int64_t block = t.dtype == DType::i4 ? d / kI4Block : 0;
  return static_cast<const float*>(scale.data)[scale.offset(a, hk, row, block)] * x;
}

// The dense mask's contribution to score (b, h, i, j): the additive value, or 0 / -inf for keep/block.
double bias(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  switch (p.mask_kind) {
    case core::MaskKind::none: return 0.0;
    case core::MaskKind::additive: return load(p.mask, b, h, i, j);
    case core::MaskKind::keep:
      return load(p.mask, b, h, i, j) != 0.0 ? 0.0 : -std::numeric_limits<double>::infinity();
  }
  return 0.0;
}

// Philox4x32-10 as its paper defines it (Salmon et al., SC 2011): ten rounds of
//   (c0, c1, c2, c3) <- (hi(M1·c2) ^ c1 ^ k0, lo(M1·c2), hi(M0·c0) ^ c3 ^ k1, lo(M0·c0)),
// the key (k0, k1) raised by the Weyl constants between rounds.
void philox(std::uint32_t c[4], std::uint32_t k0, std::uint32_t k1) {
  for (int round = 1; round <= 10; ++round) {
    const std::uint64_t a = std::uint64_t{0xD2511F53} * c[0], e = std::uint64_t{0xCD9E8D57} * c[2];
    const std::uint32_t n0 = static_cast<std::uint32_t>(e >> 32) ^ c[1] ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(a >> 32) ^ c[3] ^ k1;
    c[1] = static_cast<std::uint32_t>(e), c[3] = static_cast<std::uint32_t>(a), c[0] = n0, c[2] = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
}

// Dropout's factor of pair (b, h, i, j) (attn::Params::dropout_p; core/dropout.h has the definition): the
// pair's draw is word j mod 4 of Philox at counter (j / 4, i, h, b) and key (seed low, seed high); it drops when
// the draw is below dropout_p·2^32 (rounded), else weighs 1 / (1 − dropout_p). 1 without dropout.
template <class Acc>
Acc dropout_factor(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (!(p.dropout.p > 0)) return 1;
  std::uint32_t c[4] = {static_cast<std::uint32_t>(j / 4), static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(h),
                        static_cast<std::uint32_t>(b)};
  philox(c, static_cast<std::uint32_t>(p.dropout.seed & 0xFFFFFFFFu), static_cast<std::uint32_t>(p.dropout.seed >> 32));
  const double threshold = std::max(1.0, std::round(p.dropout.p * 4294967296.0));
  if (static_cast<double>(c[j % 4]) < threshold) return 0;
  return Acc(1) / (Acc(1) - static_cast<Acc>(p.dropout.p));
}

}  // namespace

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::uint32_t k0, std::uint32_t k1) {
  philox(counter.data(), k0, k1);
  return counter;
}

std::int64_t bytes_needed(const core::Problem& p, bool backward) {
  const double B = static_cast<double>(p.B), Hq = static_cast<double>(p.Hq), Hkv = static_cast<double>(p.Hkv);
  const double Sq = static_cast<double>(p.Sq), Skv = static_cast<double>(p.Skv);
  const double Dk = static_cast<double>(p.Dk), Dv = static_cast<double>(p.Dv);
  // out and lse; one row's scores; with the backward also every head's probabilities, dQ, dK, dV and one
  // head's dS and live flags (fp64, 8 bytes each; flags 1).
  double bytes = 8 * (B * Hq * Sq * (Dv + 1) + Skv) + Skv;
  if (backward) bytes += 8 * (B * Hq * Sq * Skv + B * Hq * Sq * Dk + 2 * B * Hkv * Skv * (Dk + Dv) + Sq * Skv) + Sq * Skv;
  return bytes < 9e18 ? static_cast<std::int64_t>(bytes) : std::numeric_limits<std::int64_t>::max();
}

Status check_size(const core::Problem& p, bool backward) {
  const double bytes = static_cast<double>(bytes_needed(p, backward));
  if (bytes <= kMaxBytes) return Status::Ok();
  char need[64];
  std::snprintf(need, sizeof need, "%.3g GiB", bytes / (1 << 30));
  return Status::Invalid("backend", std::string("the reference backend would need ") + need +
                                        " of fp64 buffers for this problem; expected at most 4 GiB (use the flash "
                                        "backend)");
}

bool allowed(const core::Problem& p, std::int64_t b, std::int64_t i, std::int64_t j) {
  const std::int64_t len = p.kv_len[static_cast<std::size_t>(b)];
  if (j >= len) return false;
  if (p.causal == Causal::top_left && j > i) return false;
  if (p.causal == Causal::bottom_right && j > i + len - p.Sq) return false;
  if (p.window.enabled()) {
    const std::int64_t diag = p.window.align == Align::top_left ? i : i + len - p.Sq;
    if (p.window.left >= 0 && j < diag - p.window.left) return false;
    if (p.window.right >= 0 && j > diag + p.window.right) return false;
  }
  return true;
}

bool attends(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  return allowed(p, b, i, j) && bias(p, b, h, i, j) != -std::numeric_limits<double>::infinity();
}

// The ALiBi bias of pair (i, j): −slope_bh·|i + Skv_b − Sq − j| (FlashAttention's bottom-right alignment).
double alibi(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (!p.alibi) return 0.0;
  const double slope = p.alibi_slope(b, h);
  const std::int64_t diag = i + p.kv_len[static_cast<std::size_t>(b)] - p.Sq;
  return -slope * static_cast<double>(std::llabs(diag - j));
}

// The score of an attended pair, in Acc, from the definitions (attn::Params):
//   x = scale · q_i · k_j,   s = T(x) + alibi_ij + mask_ij,   T(x) = softcap · tanh(x / softcap) (x when off);
// *terms (if given) gets the size of the terms it sums, scale · Σ_d |q_d k_d| + |alibi| + |mask|, in double;
// *dx (if given) dT/dx = 1 − tanh²(x / softcap) (1 when off).
template <class Acc>
Acc score(const core::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
          double* terms = nullptr, Acc* dx = nullptr) {
  Acc dot = 0;
  double abs_sum = 0;
  for (std::int64_t d = 0; d < p.Dk; ++d) {
    const double qd = load(p.q, b, h, i, d), kd = load_kv(p, p.k, b, h / p.group, j, d);
    dot += static_cast<Acc>(qd) * static_cast<Acc>(kd);
    abs_sum += std::fabs(qd * kd);
  }
  const double m = bias(p, b, h, i, j), a = alibi(p, b, h, i, j);
  if (terms) *terms = abs_sum * p.scale + std::fabs(a) + std::fabs(m);
  Acc x = static_cast<Acc>(p.scale) * dot;
  if (dx) *dx = 1;
  if (p.softcap > 0) {
    const Acc cap = static_cast<Acc>(p.softcap), t = std::tanh(x / cap);
    x = cap * t;
    if (dx) *dx = 1 - t * t;
  }
  return x + static_cast<Acc>(a) + static_cast<Acc>(m);
}

// The formula as it reads, in Acc, over the keys each row attends (the others are never read), with IEEE
// arithmetic for non-finite values: S = score() (scale·Q Kᵀ, softcap, ALiBi, mask); m = the largest score that is
// not NaN; a row with a NaN score, or with m = +inf, is NaN throughout; a row whose scores are all -inf (or that
// attends no key) is empty (out 0, lse -inf, or lse = sink_h with a sink); else, with the head's sink (a logit in
// the denominator only; -inf = none) M = max(m, sink), P = e^(S - M) / (e^(sink - M) + Σ e^(S - M)) (a -inf score
// weighs 0) and out = Σ_j P_j V_j over every attended key, P_j = 0 included (0·NaN is NaN).
template <class Acc>
Result attention(const core::Problem& p, bool keep_probs) {
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
  Result r;
  if (p.dropout.p > 0) r.weight_factor = 1.0 / (1.0 - p.dropout.p);
  r.out.assign(static_cast<std::size_t>(p.B * p.Hq * p.Sq * p.Dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(p.B * p.Hq * p.Sq), 0.0);
  if (keep_probs) r.probs.assign(static_cast<std::size_t>(p.B * p.Hq * p.Sq * p.Skv), 0.0);
  std::vector<Acc> s(static_cast<std::size_t>(p.Skv));  // the scores of one row
  std::vector<char> seen(static_cast<std::size_t>(p.Skv));  // the keys the row attends
  std::vector<Acc> z(static_cast<std::size_t>(p.Skv));      // the row's dropout factors

  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      const std::int64_t hk = h / p.group;
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const std::size_t orow = static_cast<std::size_t>(((b * p.Hq + h) * p.Sq + i));
        // 1. scores S = scale · q kᵀ + mask of the attended keys
        bool any_nan = false;
        Acc mx = neg_inf;
        for (std::int64_t j = 0; j < p.Skv; ++j) {
          seen[j] = attends(p, b, h, i, j);
          if (!seen[j]) continue;
          double terms = 0;
          s[j] = score<Acc>(p, b, h, i, j, &terms);
          if (std::isnan(s[j])) any_nan = true;
          else mx = std::max(mx, s[j]);
          if (std::isfinite(terms)) r.score_terms = std::max(r.score_terms, terms);
        }
        // 2. the row-wise softmax, with the head's sink in the denominator
        const double sink = p.sink(h);  // -inf without sinks
        if (!any_nan && mx == neg_inf) {  // empty: out = 0, lse = -inf (or the sink)
          r.lse[orow] = sink;
          continue;
        }
        if (any_nan || std::isinf(mx)) {  // NaN throughout
          for (std::int64_t d = 0; d < p.Dv; ++d) r.out[orow * p.Dv + d] = nan;
          r.lse[orow] = nan;
          if (keep_probs)
            for (std::int64_t j = 0; j < p.Skv; ++j)
              if (seen[j] && s[j] != neg_inf) r.probs[orow * p.Skv + j] = nan;
          continue;
        }
        if (static_cast<Acc>(sink) > mx) mx = static_cast<Acc>(sink);
        Acc sum = sink == -std::numeric_limits<double>::infinity() ? Acc(0) : std::exp(static_cast<Acc>(sink) - mx);
        for (std::int64_t j = 0; j < p.Skv; ++j)
          if (seen[j]) sum += (s[j] = std::exp(s[j] - mx));
        for (std::int64_t j = 0; j < p.Skv; ++j)
          if (seen[j]) s[j] /= sum;
        // 3. O = (P ∘ Z) V, Z the dropout factors (1 without dropout)
        for (std::int64_t j = 0; j < p.Skv; ++j) z[j] = seen[j] ? dropout_factor<Acc>(p, b, h, i, j) : Acc(0);
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          Acc acc = 0;
          for (std::int64_t j = 0; j < p.Skv; ++j)
            if (seen[j]) acc += s[j] * z[j] * static_cast<Acc>(load_kv(p, p.v, b, hk, j, d));
          r.out[orow * p.Dv + d] = acc;
        }
        r.lse[orow] = static_cast<double>(mx + std::log(sum));
        if (keep_probs)
          for (std::int64_t j = 0; j < p.Skv; ++j) r.probs[orow * p.Skv + j] = seen[j] ? s[j] : 0.0;
      }
    }
  return r;
}

template Result attention<double>(const core::Problem&, bool);
template Result attention<float>(const core::Problem&, bool);

void store(const core::Problem& p, const Result& r) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const std::size_t row = static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i);
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          const float x = static_cast<float>(r.out[row * p.Dv + d]);
          void* base = const_cast<void*>(p.out.data);
          const std::int64_t off = p.out.offset(b, h, i, d);
          switch (p.out.dtype) {
            case DType::f32: static_cast<float*>(base)[off] = x; break;
            case DType::bf16: static_cast<core::bf16*>(base)[off] = core::from_float<core::bf16>(x); break;
            case DType::f16: static_cast<core::f16*>(base)[off] = core::from_float<core::f16>(x); break;
            default: break;
          }
        }
        if (p.lse) static_cast<float*>(const_cast<void*>(p.lse->data))[p.lse->offset(b, h, i, 0)] =
                       static_cast<float>(r.lse[row]);
      }
}

// The backward over the pairs that carry weight: attended pairs whose score is not -inf (a -inf score, like a
// hidden key, carries neither weight nor gradient); a row that is empty in the forward contributes nothing.
// IEEE arithmetic otherwise: a NaN row (or a NaN in dO) spreads NaN to every gradient it touches.
template <class Acc>
Grads attention_backward(const core::Problem& p, const core::Strided& dout) {
  const Result fwd = attention<Acc>(p, /*keep_probs=*/true);
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  Grads g;
  g.score_terms = fwd.score_terms;
  g.dq.assign(static_cast<std::size_t>(p.B * p.Hq * p.Sq * p.Dk), 0.0);
  std::vector<Acc> dk(static_cast<std::size_t>(p.B * p.Hkv * p.Skv * p.Dk), 0);
  std::vector<Acc> dv(static_cast<std::size_t>(p.B * p.Hkv * p.Skv * p.Dv), 0);
  std::vector<Acc> ds(static_cast<std::size_t>(p.Sq * p.Skv));   // dS of one head
  std::vector<Acc> dxs(static_cast<std::size_t>(p.Sq * p.Skv));  // dT/dx of one head's pairs (softcap)
  g.dsinks.assign(static_cast<std::size_t>(p.Hq), 0.0);
  g.dsinks_terms.assign(static_cast<std::size_t>(p.Hq), 0.0);
  std::vector<char> live(static_cast<std::size_t>(p.Sq * p.Skv));  // the pairs that carry weight
  const Acc scale = static_cast<Acc>(p.scale);

  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      const std::int64_t hk = h / p.group;
      const double* P = fwd.probs.data() + (b * p.Hq + h) * p.Sq * p.Skv;  // (no element to reference when empty)
      const std::size_t kv_head = static_cast<std::size_t>((b * p.Hkv + hk) * p.Skv);
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const double lse = fwd.lse[static_cast<std::size_t>((b * p.Hq + h) * p.Sq + i)];
        const bool empty = lse == -INFINITY;
        for (std::int64_t j = 0; j < p.Skv; ++j)
          live[i * p.Skv + j] = !empty && attends(p, b, h, i, j) &&
                                score<Acc>(p, b, h, i, j, nullptr, &dxs[i * p.Skv + j]) != neg_inf;
        // dP_ij = z_ij · dO_i · V_j (the gradient reaching P_ij through its dropped weight z_ij·P_ij), and
        // D_i = Σ_j P_ij dP_ij (= dO_i · O_i)
        Acc D = 0;
        double D_terms = 0;  // Σ_j |P_ij dP_ij|: the size of what D sums (its terms can cancel)
        for (std::int64_t j = 0; j < p.Skv; ++j) {
          if (!live[i * p.Skv + j]) continue;
          Acc dp = 0;
          for (std::int64_t d = 0; d < p.Dv; ++d)
            dp += static_cast<Acc>(load(dout, b, h, i, d)) * static_cast<Acc>(load_kv(p, p.v, b, hk, j, d));
          dp *= dropout_factor<Acc>(p, b, h, i, j);
          ds[i * p.Skv + j] = dp;
          D += static_cast<Acc>(P[i * p.Skv + j]) * dp;
          D_terms += std::fabs(P[i * p.Skv + j] * static_cast<double>(dp));
        }
        // the sink's probability e^(sink − lse) (no value: dP = 0), so ∂L/∂sink = −P_sink · D
        if (p.sinks && !empty) {
          const double sink = p.sink(h);
          if (sink != -INFINITY) {
            const Acc p_sink = std::exp(static_cast<Acc>(sink - lse));
            g.dsinks[static_cast<std::size_t>(h)] -= static_cast<double>(p_sink * D);
            g.dsinks_terms[static_cast<std::size_t>(h)] += static_cast<double>(p_sink) * std::max(std::fabs(static_cast<double>(D)), D_terms);
          }
        }
        for (std::int64_t j = 0; j < p.Skv; ++j) {
          if (!live[i * p.Skv + j]) continue;
          const Acc pij = static_cast<Acc>(P[i * p.Skv + j]);
          ds[i * p.Skv + j] = pij * (ds[i * p.Skv + j] - D) * dxs[i * p.Skv + j];  // (through the softcap)
          const Acc zij = dropout_factor<Acc>(p, b, h, i, j);
          for (std::int64_t d = 0; d < p.Dv; ++d)  // dV_j += z_ij P_ij dO_i
            dv[(kv_head + j) * p.Dv + d] += zij * pij * static_cast<Acc>(load(dout, b, h, i, d));
        }
      }
      for (std::int64_t i = 0; i < p.Sq; ++i)  // dQ_i = scale Σ_j dS_ij K_j
        for (std::int64_t d = 0; d < p.Dk; ++d) {
          Acc acc = 0;
          for (std::int64_t j = 0; j < p.Skv; ++j)
            if (live[i * p.Skv + j]) acc += ds[i * p.Skv + j] * static_cast<Acc>(load(p.k, b, hk, j, d));
          g.dq[static_cast<std::size_t>(((b * p.Hq + h) * p.Sq + i) * p.Dk + d)] = scale * acc;
        }
      for (std::int64_t j = 0; j < p.Skv; ++j)  // dK_j += scale Σ_i dS_ij Q_i
        for (std::int64_t d = 0; d < p.Dk; ++d) {
          Acc acc = 0;
          for (std::int64_t i = 0; i < p.Sq; ++i)
            if (live[i * p.Skv + j]) acc += ds[i * p.Skv + j] * static_cast<Acc>(load(p.q, b, h, i, d));
          dk[(kv_head + j) * p.Dk + d] += scale * acc;
        }
    }
  g.dk.assign(dk.begin(), dk.end());
  g.dv.assign(dv.begin(), dv.end());
  return g;
}

template Grads attention_backward<double>(const core::Problem&, const core::Strided&);
template Grads attention_backward<float>(const core::Problem&, const core::Strided&);

namespace {

void store_one(const core::Strided& t, const std::vector<double>& x, std::int64_t B, std::int64_t H, std::int64_t S,
               std::int64_t D) {
  void* base = const_cast<void*>(t.data);
  std::size_t n = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) {
          const float f = static_cast<float>(x[n++]);
          const std::int64_t off = t.offset(b, h, s, d);
          switch (t.dtype) {
            case DType::f32: static_cast<float*>(base)[off] = f; break;
            case DType::bf16: static_cast<core::bf16*>(base)[off] = core::from_float<core::bf16>(f); break;
            case DType::f16: static_cast<core::f16*>(base)[off] = core::from_float<core::f16>(f); break;
            default: break;
          }
        }
}

}  // namespace

void store_grads(const core::Problem& p, const Grads& g, const core::Strided& dq, const core::Strided& dk,
                 const core::Strided& dv, const std::optional<core::Strided>& dsinks) {
  if (dsinks)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      static_cast<float*>(const_cast<void*>(dsinks->data))[h * dsinks->stride[1]] =
          static_cast<float>(g.dsinks[static_cast<std::size_t>(h)]);
  store_one(dq, g.dq, p.B, p.Hq, p.Sq, p.Dk);
  store_one(dk, g.dk, p.B, p.Hkv, p.Skv, p.Dk);
  store_one(dv, g.dv, p.B, p.Hkv, p.Skv, p.Dv);
}

}  // namespace attn::reference
