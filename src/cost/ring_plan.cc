// The ring-attention planner (attn/ring_plan.h).
#include "attn/ring_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace attn {

Status plan_ring(const RingPlanInput& in, RingPlan* plan) {
  auto positive = [](const char* name, double v) {
    return v > 0 && std::isfinite(v) ? Status::Ok()
                                     : Status::Invalid(name, std::to_string(v) + "; expected a finite value > 0");
  };
  if (in.seq < 1) return Status::Invalid("seq", std::to_string(in.seq) + "; expected >= 1");
  if (in.hosts < 1) return Status::Invalid("hosts", std::to_string(in.hosts) + "; expected >= 1");
  if (in.hosts > in.seq)
    return Status::Invalid("hosts", std::to_string(in.hosts) + " for " + std::to_string(in.seq) +
                                        " tokens; expected at most one host per token");
  if (in.batch < 1) return Status::Invalid("batch", std::to_string(in.batch) + "; expected >= 1");
  if (in.heads < 1) return Status::Invalid("heads", std::to_string(in.heads) + "; expected >= 1");
  if (in.kv_heads < 1 || in.heads % in.kv_heads)
    return Status::Invalid("kv_heads", std::to_string(in.kv_heads) + "; expected a divisor of heads (" +
                                           std::to_string(in.heads) + ")");
  if (in.head_dim < 1) return Status::Invalid("head_dim", std::to_string(in.head_dim) + "; expected >= 1");
  if (in.v_head_dim < 0) return Status::Invalid("v_head_dim", std::to_string(in.v_head_dim) + "; expected >= 0");
  if (in.bytes_per_element < 1) return Status::Invalid("bytes_per_element", "expected >= 1");
  for (const auto& [name, v] : {std::pair{"bandwidth_gbit", in.bandwidth_gbit}, {"rate_gflops", in.rate_gflops}})
    if (Status s = positive(name, v); !s) return s;
  if (!(in.latency_us >= 0) || !std::isfinite(in.latency_us))
    return Status::Invalid("latency_us", std::to_string(in.latency_us) + "; expected a finite value >= 0");

  const double B = static_cast<double>(in.batch), Hq = static_cast<double>(in.heads);
  const double Hkv = static_cast<double>(in.kv_heads), Dk = static_cast<double>(in.head_dim);
  const double Dv = static_cast<double>(in.v_head_dim > 0 ? in.v_head_dim : in.head_dim);
  const double P = static_cast<double>(in.hosts), S = static_cast<double>(in.seq);
  const double rate = in.rate_gflops * 1e9, bw = in.bandwidth_gbit * 1e9 / 8, lat = in.latency_us * 1e-6;
  const double causal = in.causal ? 0.5 : 1.0, elem = static_cast<double>(in.bytes_per_element);
  RingPlan p;
  const double c = S / P;
  p.block_tokens = c;
  // flops per step = a_f·c², bytes per step = b_f·c
  const double a_f = 2 * B * Hq * (Dk + Dv) * causal;
  const double b_f = B * Hkv * (Dk + Dv) * elem;
  p.step_compute_s = a_f * c * c / rate;
  p.step_transfer_s = in.hosts > 1 ? lat + b_f * c / bw : 0;
  const double tc = p.step_compute_s, tx = p.step_transfer_s;
  p.forward_s = tc + (P - 1) * std::max(tc, tx);
  const double tc_b = 2.5 * tc, tg = in.hosts > 1 ? lat + B * Hkv * (Dk + Dv) * 4 * c / bw : 0;
  p.backward_s = tc_b + (P - 1) * std::max(tc_b, tx + tg) + tg;
  const double transfer_total = (P - 1) * tx;
  const double exposed = (P - 1) * std::max(0.0, tx - tc);
  p.hidden_fraction = transfer_total > 0 ? 1 - exposed / transfer_total : 1;
  // c*: a·c² − b·c − lat = 0 with a = a_f / rate, b = b_f / bw.
  const double a = a_f / rate, b = b_f / bw;
  p.min_hidden_block = (b + std::sqrt(b * b + 4 * a * lat)) / (2 * a);
  p.max_hidden_hosts = S / p.min_hidden_block;
  p.memory_bytes = B * c * (Hq * Dk + Hq * Dv) * elem   // Q and O slices
                   + 3 * B * Hkv * c * (Dk + Dv) * elem  // own K/V, and the two receive buffers
                   + B * Hq * c * (Dv + 1) * 4;          // fp32 output accumulator and LSE
  p.single_host_s = a_f * S * S / rate;
  // Ulysses over u hosts inside each of P / u ring groups (attn/ring_plan.h): u = P is Ulysses, 1 < u < P the hybrid
  const std::int64_t hosts = in.hosts;
  struct Times {
    double forward, backward, all_to_all;
  };
  const auto ulysses_in_groups = [&](std::int64_t u) -> std::optional<Times> {
    if (in.heads % u || (in.kv_heads % u && u % in.kv_heads)) return std::nullopt;
    const double U = static_cast<double>(u), r = P / U, kvh = in.kv_heads % u == 0 ? Hkv / U : 1.0;
    const double t_in = (U - 1) * (lat + B * c * (Hq / U * Dk + kvh * (Dk + Dv)) * elem / bw);
    const double t_out = (U - 1) * (lat + B * c * Hq / U * Dv * elem / bw);
    const double tc_u = U * tc, tx_u = r > 1 ? lat + B * kvh * U * c * (Dk + Dv) * elem / bw : 0;
    const double tg_u = r > 1 ? lat + B * kvh * U * c * (Dk + Dv) * 4 / bw : 0;
    const double tcb_u = 2.5 * tc_u;
    return Times{t_in + tc_u + (r - 1) * std::max(tc_u, tx_u) + t_out,
                 t_out + tcb_u + (r - 1) * std::max(tcb_u, tx_u + tg_u) + tg_u + t_in, t_in + t_out};
  };
  double best = p.forward_s;
  if (const auto t = ulysses_in_groups(hosts); t && hosts > 1) {
    p.ulysses_possible = true;
    p.ulysses_transfer_s = t->all_to_all, p.ulysses_forward_s = t->forward, p.ulysses_backward_s = t->backward;
    if (t->forward < best) best = t->forward, p.recommended = "ulysses";
  }
  // The group sizes u divide both the hosts and the heads: the divisors of their gcd, found up to its square root (a
  // walk over every u < hosts did not end for 10^9 hosts), taken smallest first (the smallest of equal times wins).
  std::vector<std::int64_t> sizes;
  const std::int64_t g = std::gcd(hosts, in.heads);
  for (std::int64_t d = 1; d <= g / d; ++d)
    if (g % d == 0) sizes.push_back(d), sizes.push_back(g / d);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (const std::int64_t u : sizes) {
    if (u < 2 || u >= hosts) continue;
    const auto t = ulysses_in_groups(u);
    if (!t || (p.hybrid_groups && t->forward >= p.hybrid_forward_s)) continue;
    p.hybrid_groups = u, p.hybrid_forward_s = t->forward, p.hybrid_backward_s = t->backward;
  }
  if (p.hybrid_groups && p.hybrid_forward_s < best) p.recommended = "hybrid";
  *plan = p;
  return Status::Ok();
}

}  // namespace attn
