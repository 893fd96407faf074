// attn ring-plan: the ring-attention cost model (attn/ring_plan.h) for P hosts: time per layer, where the K/V
// transfer hides behind compute and where it stops hiding, memory per host.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/ring_plan.h"
#include "commands.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

struct RingPlanArgs {
  std::vector<std::int64_t> seq{100000, 1000000, 10000000, 100000000};
  std::vector<std::int64_t> hosts{2, 8, 64, 512, 4096};
  std::int64_t batch = 1, heads = 32, kv_heads = 8, head_dim = 128;
  std::string dtype = "bf16";
  bool no_causal = false;
  double bandwidth = 100, latency = 5;
  std::optional<double> rate;  // not given: 1000, or measured with --measure-rate
  bool measure_rate = false;
  bool hosts_given = false;  // the default host counts skip those above a sequence's tokens; given ones are refused
};

std::string human_seconds(double s) {
  char b[32];
  if (s >= 1e6) std::snprintf(b, sizeof b, "%.3g s", s);
  else if (s >= 100) std::snprintf(b, sizeof b, "%.0f s", s);
  else if (s >= 1) std::snprintf(b, sizeof b, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  else if (s >= 1e-6) std::snprintf(b, sizeof b, "%.1f us", s * 1e6);
  else std::snprintf(b, sizeof b, "%.0f ns", s * 1e9);
  return b;
}
std::string human_bytes(double x) {
  char b[32];
  if (x >= 1e9) std::snprintf(b, sizeof b, "%.1f GB", x / 1e9);
  else if (x >= 1e6) std::snprintf(b, sizeof b, "%.1f MB", x / 1e6);
  else std::snprintf(b, sizeof b, "%.0f kB", x / 1e3);
  return b;
}
std::string human_count(double x) {
  char b[32];
  if (x >= 1e12) std::snprintf(b, sizeof b, "%.3g", x);
  else if (x >= 1e9) std::snprintf(b, sizeof b, "%.3gG", x / 1e9);
  else if (x >= 1e6) std::snprintf(b, sizeof b, "%.3gM", x / 1e6);
  else if (x >= 1e3) std::snprintf(b, sizeof b, "%.3gk", x / 1e3);
  else std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

// This machine's attention rate: one bf16 call on 2048 tokens (non-causal), Hq = min(heads, 8), D = head_dim.
Status measure_rate(const RingPlanArgs& a, double* gflops) {
  const std::int64_t S = 2048, H = std::min<std::int64_t>(a.heads, 8), Hk = std::max<std::int64_t>(1, H * a.kv_heads / a.heads);
  const std::int64_t D = std::min<std::int64_t>(a.head_dim, 256);
  std::vector<std::uint16_t> q(static_cast<std::size_t>(H * S * D), 0x3f80), kv(static_cast<std::size_t>(Hk * S * D), 0x3f00),
      o(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<std::uint16_t>(0x3c00 + (i * 7919) % 0x300);
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<std::uint16_t>(0x3c00 + (i * 104729) % 0x300);
  const TensorView qv = TensorView::contiguous(q.data(), DType::bf16, {1, H, S, D});
  const TensorView kvv = TensorView::contiguous(kv.data(), DType::bf16, {1, Hk, S, D});
  const TensorView ov = TensorView::contiguous(o.data(), DType::bf16, {1, H, S, D});
  double best = INFINITY;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = attention(qv, kvv, kvv, ov); !s) return s;
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  *gflops = 4.0 * static_cast<double>(H * S * S * D) / best / 1e9;
  return Status::Ok();
}

// plan_ring's parameter names as this command's options.
Status as_options(const Status& status) {
  return with_option_names(status, {{"seq", "--seq"}, {"hosts", "--hosts"}, {"batch", "--batch"},
                                    {"heads", "--heads"}, {"kv_heads", "--kv-heads"}, {"head_dim", "--head-dim"},
                                    {"bandwidth_gbit", "--bandwidth"}, {"latency_us", "--latency"},
                                    {"rate_gflops", "--rate"}});
}

Status ring_plan(const RingPlanArgs& a, std::ostream& out) {
  RingPlanInput in;
  in.batch = a.batch, in.heads = a.heads, in.kv_heads = a.kv_heads, in.head_dim = a.head_dim;
  in.causal = !a.no_causal;
  if (a.dtype == "bf16" || a.dtype == "f16") in.bytes_per_element = 2;
  else if (a.dtype == "f32") in.bytes_per_element = 4;
  else if (a.dtype == "fp8") in.bytes_per_element = 1;
  else if (a.dtype == "int8" || a.dtype == "i8")  // (its rows' fp32 scales are no whole bytes per element)
    return Status::Invalid("--dtype", "'" + a.dtype + "'; expected bf16, f16, f32 or fp8 (the model counts whole "
                                      "bytes per value, and int8 rows carry an fp32 scale each; attn's ring "
                                      "attention refuses 8-bit K/V)");
  else return Status::Invalid("--dtype", "'" + a.dtype + "'; expected bf16, f16, f32 or fp8");
  in.bandwidth_gbit = a.bandwidth, in.latency_us = a.latency;
  if (a.rate && a.measure_rate)
    return Status::Invalid("--rate", "given with --measure-rate; expected one of them (or neither: 1000 GFLOP/s)");
  // Ranges the table prints sensibly (a link of 1e-300 Gbit/s or a rate of 1e300 GFLOP/s gave 300-digit times).
  const auto in_range = [](const char* option, double x, double lo, double hi, const char* what) {
    if (x >= lo && x <= hi) return Status::Ok();
    char text[160];
    std::snprintf(text, sizeof text, "%g; expected %s from %g to %g", x, what, lo, hi);
    return Status::Invalid(option, text);
  };
  if (a.rate)
    if (Status s = in_range("--rate", *a.rate, 1e-3, 1e9, "GFLOP/s"); !s) return s;
  if (Status s = in_range("--bandwidth", a.bandwidth, 1e-3, 1e9, "Gbit/s"); !s) return s;
  if (Status s = in_range("--latency", a.latency, 0, 1e9, "microseconds"); !s) return s;
  for (const auto& [name, list] : {std::pair{"--seq", &a.seq}, {"--hosts", &a.hosts}}) {
    if (list->empty()) return Status::Invalid(name, "empty; expected one or more counts");
    for (std::int64_t n : *list)  // (past 2^53 a count is no longer exact as the model's doubles)
      if (n > (std::int64_t{1} << 53))
        return Status::Invalid(name, std::to_string(n) + "; expected at most 2^53");
  }
  double rate = a.rate.value_or(1000);
  std::string rate_note = a.rate ? "given" : "default (pass --rate or --measure-rate)";
  if (a.measure_rate) {
    if (Status s = measure_rate(a, &rate); !s) return s;
    rate_note = "measured here: one bf16 attention() call, 2048 tokens";
  }
  in.rate_gflops = rate;
  // Every pair planned (and so checked) before anything is printed: plans[i] the rows of a.seq[i].
  std::vector<std::vector<std::pair<std::int64_t, RingPlan>>> plans;
  for (std::int64_t S : a.seq) {
    if (!a.hosts_given && S < a.hosts.front())
      return Status::Invalid("--seq", std::to_string(S) + " tokens; expected at least " +
                                          std::to_string(a.hosts.front()) + " for the default --hosts (or give --hosts)");
    plans.emplace_back();
    for (std::int64_t P : a.hosts) {
      if (!a.hosts_given && P > S) continue;
      in.seq = S, in.hosts = P;
      RingPlan p;
      if (Status s = plan_ring(in, &p); !s) return as_options(s);
      plans.back().emplace_back(P, p);
    }
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "ring attention plan: B=%lld Hq=%lld Hkv=%lld D=%lld, %s K/V, %s; links %.4g Gbit/s, %.4g us; "
                "%.4g GFLOP/s per host (%s)\n",
                static_cast<long long>(a.batch), static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads),
                static_cast<long long>(a.head_dim), a.dtype.c_str(), in.causal ? "causal (zigzag)" : "full", a.bandwidth,
                a.latency, rate, rate_note.c_str());
  out << line;
  out << "      seq  hosts  tokens/host  step compute  step transfer   forward/layer  backward/layer  hidden  speedup"
         "  memory/host   ulysses fwd/layer  bwd/layer  use\n";
  std::vector<std::string> why;
  for (std::size_t i = 0; i < a.seq.size(); ++i) {
    const std::int64_t S = a.seq[i];
    const RingPlan& first = plans[i].back().second;  // (the summary depends on S only)
    for (const auto& [P, p] : plans[i]) {
      std::snprintf(line, sizeof line, "%9s %6lld %12s %13s %14s %15s %15s %6.1f%% %7.1fx %12s %19s %10s  %s\n",
                    human_count(static_cast<double>(S)).c_str(), static_cast<long long>(P),
                    human_count(p.block_tokens).c_str(), human_seconds(p.step_compute_s).c_str(),
                    human_seconds(p.step_transfer_s).c_str(), human_seconds(p.forward_s).c_str(),
                    human_seconds(p.backward_s).c_str(), 100 * p.hidden_fraction, p.single_host_s / p.forward_s,
                    human_bytes(p.memory_bytes).c_str(),
                    p.ulysses_possible ? human_seconds(p.ulysses_forward_s).c_str() : "n/a (heads)",
                    p.ulysses_possible ? human_seconds(p.ulysses_backward_s).c_str() : "-", p.recommended);
      out << line;
      if (std::string(p.recommended) == "hybrid")
        why.push_back(std::string("          ") + human_count(static_cast<double>(S)) + " tokens on " +
                      std::to_string(P) + " hosts: hybrid, Ulysses inside groups of " +
                      std::to_string(p.hybrid_groups) + " hosts and a ring across the " +
                      std::to_string(P / p.hybrid_groups) + " groups: forward " + human_seconds(p.hybrid_forward_s) +
                      ", backward " + human_seconds(p.hybrid_backward_s) + " (ring " + human_seconds(p.forward_s) +
                      (p.ulysses_possible ? ", Ulysses " + human_seconds(p.ulysses_forward_s) : std::string()) + ")\n");
      else if (P > 1 && p.ulysses_possible)
        why.push_back(std::string("          ") + human_count(static_cast<double>(S)) + " tokens on " +
                      std::to_string(P) + " hosts: " + p.recommended +
                      (std::string(p.recommended) == "ring"
                           ? std::string(p.hidden_fraction >= 0.999 ? ": its K/V transfer hides behind compute"
                                                                    : ": its K/V transfer is partly exposed") +
                                 " (" + human_seconds(p.forward_s - P * p.step_compute_s) +
                                 " exposed), less than Ulysses' two all-to-alls, which nothing hides (" +
                                 human_seconds(p.ulysses_transfer_s) + ")"
                           : ": its two all-to-alls (" + human_seconds(p.ulysses_transfer_s) +
                                 ") cost less than the ring's exposed K/V transfer (" +
                                 human_seconds(p.forward_s - P * p.step_compute_s) +
                                 "; blocks below the hiding size)") +
                      "\n");
    }
    std::snprintf(line, sizeof line,
                  "          transfer hidden while tokens/host >= %s, i.e. up to %s hosts for %s tokens\n",
                  human_count(first.min_hidden_block).c_str(), human_count(first.max_hidden_hosts).c_str(),
                  human_count(static_cast<double>(S)).c_str());
    out << line;
  }
  if (!why.empty())
    out << "ring, Ulysses (head-parallel; attn.dist.ulysses_attention) or their hybrid, by the forward's time:\n";
  for (const std::string& w : why) out << w;
  return Status::Ok();
}

}  // namespace

void add_ring_plan_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<RingPlanArgs>();
  CLI::App* c = app.add_subcommand("ring-plan", "Cost model of ring (context-parallel) attention over P hosts: time per "
                                                "layer, when the K/V transfer hides behind compute, memory per host; "
                                                "and head-parallel (Ulysses) attention beside it, with the faster one");
  c->add_option("--seq", a->seq, "Whole-sequence lengths (tokens), comma-separated")->delimiter(',')->type_name("S,...");
  CLI::Option* hosts =
      c->add_option("--hosts", a->hosts, "Host counts P, comma-separated (default 2,8,64,512,4096, those up to the "
                                         "sequence's tokens)")->delimiter(',')->type_name("P,...");
  c->add_option("--batch", a->batch, "Sequences (default 1)");
  c->add_option("--heads", a->heads, "Query heads (default 32)");
  c->add_option("--kv-heads", a->kv_heads, "Key/value heads (default 8)");
  c->add_option("--head-dim", a->head_dim, "Head dim (default 128)");
  c->add_option("--dtype", a->dtype, "K/V dtype as it travels: bf16 (default), f16, f32, fp8");
  c->add_flag("--no-causal", a->no_causal, "Full attention (default: causal, zigzag-balanced)");
  c->add_option("--bandwidth", a->bandwidth, "Link bandwidth per direction, Gbit/s (default 100)")->type_name("GBIT");
  c->add_option("--latency", a->latency, "Per-message latency, microseconds (default 5)")->type_name("US");
  c->add_option("--rate", a->rate, "Attention GFLOP/s one host sustains (attn bench reports it; default 1000)")
      ->type_name("GFLOPS");
  c->add_flag("--measure-rate", a->measure_rate, "Measure the rate on this machine (one bf16 attention call)");
  on_run(c, [a, hosts, &out] {
    a->hosts_given = hosts->count() > 0;
    return ring_plan(*a, out);
  });
}

}  // namespace attn::tools
