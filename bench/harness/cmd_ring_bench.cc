// attn ring-bench (run under `mpirun -np P attn ring-bench`): ring attention (attn/dist.h) timed on every rank:
// compute time, time waiting on communication, the fraction of communication hidden behind compute, throughput,
// scaling against one rank on the same whole sequence, the planner's prediction (attn/ring_plan.h) against the
// measurement, and a PNG of one rank's timeline (compute vs waiting per ring step).
//
// How the fractions are measured. "Communication alone" is a ring pass of the same K/V blocks with no compute
// (each step: send this rank's current block on, receive the next), timed per step; "waiting" is the time the
// ring spent blocked on its messages after each step's compute. hidden = 1 − waiting / communication alone
// (clamped to [0, 1]); waiting also holds any load imbalance between neighbours, so this is a lower bound.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstring>
#include <thread>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/dist.h"
#include "attn/ring_plan.h"
#include "commands.h"
#include "core/convert.h"
#include "files.h"
#include "plot.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

struct RingBenchArgs {
  std::int64_t seq = 16384, batch = 1, heads = 2, kv_heads = 1, head_dim = 128;
  std::string dtype = "bf16", layout = "zigzag";
  bool no_causal = false, backward = false;
  int threads = 1, reps = 3;
  std::string png = "ring_timeline.png";
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A ring pass of the given block sizes with no compute: seconds per step (step s sends block (r − s) mod P).
std::vector<double> comm_alone(MPI_Comm comm, const std::vector<std::int64_t>& bytes_of, std::vector<unsigned char>* a,
                               std::vector<unsigned char>* b) {
  int P = 1, r = 0;
  MPI_Comm_size(comm, &P);
  MPI_Comm_rank(comm, &r);
  std::vector<double> t(static_cast<std::size_t>(P), 0.0);
  MPI_Barrier(comm);
  for (int s = 0; s + 1 < P; ++s) {
    const int blk = (r - s + P) % P, nxt = (blk + P - 1) % P;
    std::vector<unsigned char>& cur = s % 2 ? *b : *a;
    std::vector<unsigned char>& in = s % 2 ? *a : *b;
    const auto t0 = Clock::now();
    MPI_Request req[2];
    MPI_Irecv(in.data(), static_cast<int>(bytes_of[static_cast<std::size_t>(nxt)]), MPI_BYTE, (r + P - 1) % P, 7, comm, &req[0]);
    MPI_Isend(cur.data(), static_cast<int>(bytes_of[static_cast<std::size_t>(blk)]), MPI_BYTE, (r + 1) % P, 7, comm, &req[1]);
    MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    t[static_cast<std::size_t>(s)] = since(t0);
  }
  return t;
}

Status ring_bench(const RingBenchArgs& a, std::ostream& out) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  struct Finalize {
    ~Finalize() {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    }
  } finalize;
  MPI_Comm comm = MPI_COMM_WORLD;
  int P = 1, rank = 0;
  MPI_Comm_size(comm, &P);
  MPI_Comm_rank(comm, &rank);

  DType dt;
  if (a.dtype == "bf16") dt = DType::bf16;
  else if (a.dtype == "f16") dt = DType::f16;
  else if (a.dtype == "f32") dt = DType::f32;
  else return Status::Invalid("--dtype", "'" + a.dtype + "'; expected bf16, f16 or f32");
  dist::Layout layout;
  if (a.layout == "zigzag") layout = dist::Layout::zigzag;
  else if (a.layout == "contiguous") layout = dist::Layout::contiguous;
  else return Status::Invalid("--layout", "'" + a.layout + "'; expected zigzag or contiguous");
  for (const auto& [name, v] : {std::pair{"--seq", a.seq}, {"--batch", a.batch}, {"--heads", a.heads},
                                {"--kv-heads", a.kv_heads}, {"--head-dim", a.head_dim}})
    if (v < 1) return Status::Invalid(name, std::to_string(v) + "; expected >= 1");
  if (a.reps < 1) return Status::Invalid("--reps", std::to_string(a.reps) + "; expected >= 1");
  if (a.seq < 2 * P) return Status::Invalid("--seq", std::to_string(a.seq) + "; expected at least 2 tokens per rank");
  {  // the output, checked on rank 0 before any work; every rank learns the outcome (none waits for a failed one)
    Status s = rank == 0 && !a.png.empty() ? check_outputs({{"--png", a.png}}, {}) : Status::Ok();
    if (s && rank == 0) s = plot::check_can_draw("--png", a.png);
    int bad = !s.ok();
    MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
    if (bad) return rank == 0 ? s : Status::Invalid("--png", "refused on rank 0");
  }

  // This rank's slices of Q, K, V, dO: random, drawn per rank.
  const auto segs = dist::slice_segments(layout, a.seq, P, rank);
  std::int64_t S = 0;
  for (const auto& s : segs) S += s.length;
  const std::size_t esize = dtype_size(dt);
  const std::int64_t B = a.batch, Hq = a.heads, Hkv = a.kv_heads, D = a.head_dim;
  std::vector<unsigned char> q(static_cast<std::size_t>(B * Hq * S * D) * esize), k(static_cast<std::size_t>(B * Hkv * S * D) * esize),
      v(k.size()), o(q.size()), dq(q.size()), dk(k.size()), dv(k.size()), dout(q.size());
  std::vector<float> lse(static_cast<std::size_t>(B * Hq * S));
  std::mt19937 rng(static_cast<unsigned>(1234 + rank));
  std::uniform_real_distribution<float> u(-1, 1);
  auto fill = [&](std::vector<unsigned char>& buf) {
    const TensorView view = TensorView::contiguous(buf.data(), dt, {static_cast<std::int64_t>(buf.size() / esize)});
    for (std::int64_t i = 0; i < view.shape[0]; ++i) {
      const float x = u(rng);
      if (dt == DType::f32) static_cast<float*>(view.data)[i] = x;
      else if (dt == DType::bf16) static_cast<core::bf16*>(view.data)[i] = core::from_float<core::bf16>(x);
      else static_cast<core::f16*>(view.data)[i] = core::from_float<core::f16>(x);
    }
  };
  fill(q), fill(k), fill(v), fill(dout);
  const TensorView qv = TensorView::contiguous(q.data(), dt, {B, Hq, S, D});
  const TensorView kv = TensorView::contiguous(k.data(), dt, {B, Hkv, S, D});
  const TensorView vv = TensorView::contiguous(v.data(), dt, {B, Hkv, S, D});
  const TensorView ov = TensorView::contiguous(o.data(), dt, {B, Hq, S, D});
  const TensorView lv = TensorView::contiguous(lse.data(), DType::f32, {B, Hq, S});
  dist::RingParams rp;
  rp.causal = !a.no_causal;
  rp.layout = layout;
  rp.threads = a.threads;

  // The ring, `reps` times after a warm-up; the stats of the median run are kept.
  std::vector<double> totals;
  std::vector<dist::RingStats> runs;
  for (int rep = 0; rep <= a.reps; ++rep) {
    dist::RingStats st;
    MPI_Barrier(comm);
    const auto t0 = Clock::now();
    Status s = a.backward ? Status::Ok() : dist::ring_attention(qv, kv, vv, ov, comm, rp, lv, &st);
    if (a.backward) {
      if (rep == 0) s = dist::ring_attention(qv, kv, vv, ov, comm, rp, lv);
      if (s)
        s = dist::ring_attention_backward(qv, kv, vv, ov, lv, TensorView::contiguous(dout.data(), dt, {B, Hq, S, D}),
                                          TensorView::contiguous(dq.data(), dt, {B, Hq, S, D}),
                                          TensorView::contiguous(dk.data(), dt, {B, Hkv, S, D}),
                                          TensorView::contiguous(dv.data(), dt, {B, Hkv, S, D}), comm, rp, &st);
    }
    if (!s) return s;
    double t = since(t0), slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);  // the ring is done when its slowest rank is
    if (rep > 0) totals.push_back(slowest), runs.push_back(st);
  }
  const double t_ring = median(totals);
  std::size_t med = 0;
  for (std::size_t i = 0; i < totals.size(); ++i)
    if (totals[i] == t_ring) med = i;
  const dist::RingStats& st = runs[med];
  double compute = 0, wait = 0;
  for (const auto& step : st.steps) compute += step.compute_seconds, wait += step.wait_seconds;

  // Communication alone: the same blocks around the ring with nothing computed.
  std::vector<std::int64_t> bytes_of(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    std::int64_t n = 0;
    for (const auto& s : dist::slice_segments(layout, a.seq, P, r)) n += s.length;
    // K and V in their dtype; the backward also passes the block's fp32 dK, dV accumulators on
    bytes_of[static_cast<std::size_t>(r)] = B * Hkv * n * 2 * D * (static_cast<std::int64_t>(esize) + (a.backward ? 4 : 0));
  }
  const std::int64_t max_bytes = *std::max_element(bytes_of.begin(), bytes_of.end());
  std::vector<unsigned char> ba(static_cast<std::size_t>(max_bytes)), bb(static_cast<std::size_t>(max_bytes));
  std::vector<double> comm_runs;
  std::vector<double> comm_step;
  for (int rep = 0; rep < std::max(3, a.reps); ++rep) {
    comm_step = comm_alone(comm, bytes_of, &ba, &bb);
    double sum = 0;
    for (double x : comm_step) sum += x;
    comm_runs.push_back(sum);
  }
  const double comm_s = median(comm_runs);
  // Latency: an 8-byte message around the ring, per step.
  std::vector<std::int64_t> tiny(static_cast<std::size_t>(P), 8);
  std::vector<double> lat_runs;
  for (int rep = 0; rep < 20 && P > 1; ++rep) {
    const auto steps = comm_alone(comm, tiny, &ba, &bb);
    double sum = 0;
    for (double x : steps) sum += x;
    lat_runs.push_back(sum / (P - 1));
  }
  const double latency = P > 1 ? median(lat_runs) : 0;
  const double hidden = comm_s > 0 ? std::clamp(1 - wait / comm_s, 0.0, 1.0) : 1.0;

  // The per-rank attention rate while every rank computes at once (the planner's rate): each rank's queries
  // against its own K/V block, non-causal, all ranks together, as the ring computes its blocks: on fp32 copies
  // (attn::dist widens bf16/f16 slices to fp32 for the local kernels and merges; timing the bf16 kernel instead
  // overstated the rate 2x on a CPU with bf16 dot products).
  double rate_rank = 0;
  {
    Params p;
    p.threads = a.threads;
    auto widen = [&](const std::vector<unsigned char>& buf) {
      std::vector<float> w(buf.size() / esize);
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (dt == DType::f32) std::memcpy(&w[i], buf.data() + 4 * i, 4);
        else if (dt == DType::bf16) w[i] = core::to_float(reinterpret_cast<const core::bf16*>(buf.data())[i]);
        else w[i] = core::to_float(reinterpret_cast<const core::f16*>(buf.data())[i]);
      }
      return w;
    };
    std::vector<float> q32 = widen(q), k32 = widen(k), v32 = widen(v), o32(q32.size());
    const TensorView q32v = TensorView::contiguous(q32.data(), DType::f32, {B, Hq, S, D});
    const TensorView k32v = TensorView::contiguous(k32.data(), DType::f32, {B, Hkv, S, D});
    const TensorView v32v = TensorView::contiguous(v32.data(), DType::f32, {B, Hkv, S, D});
    const TensorView o32v = TensorView::contiguous(o32.data(), DType::f32, {B, Hq, S, D});
    std::vector<double> ts;
    for (int rep = 0; rep < 2; ++rep) {
      MPI_Barrier(comm);
      const auto t0 = Clock::now();
      if (Status s = attention(q32v, k32v, v32v, o32v, p, lv); !s) return s;
      ts.push_back(since(t0));
    }
    const double mine = (a.backward ? 2.5 : 1.0) * 4.0 * static_cast<double>(B * Hq) * static_cast<double>(S) *
                        static_cast<double>(S) * static_cast<double>(D) / median(ts);
    MPI_Allreduce(&mine, &rate_rank, 1, MPI_DOUBLE, MPI_SUM, comm);
    rate_rank /= P;
  }

  // One rank on the whole sequence (rank 0 alone, the others wait), same threads: the scaling baseline.
  const double flops = (a.backward ? 2.5 : 1.0) * 4.0 * static_cast<double>(B * Hq) * static_cast<double>(a.seq) *
                       static_cast<double>(a.seq) * static_cast<double>(D) * (a.no_causal ? 1.0 : 0.5);
  double t_one = 0;
  if (rank == 0) {
    const std::int64_t N = a.seq;
    std::vector<unsigned char> fq(static_cast<std::size_t>(B * Hq * N * D) * esize),
        fk(static_cast<std::size_t>(B * Hkv * N * D) * esize), fv(fk.size()), fo(fq.size()), g(fq.size()), gq(fq.size()),
        gk(fk.size()), gv(fk.size());
    fill(fq), fill(fk), fill(fv), fill(g);
    Params p;
    p.causal = a.no_causal ? Causal::none : Causal::top_left;
    p.threads = a.threads;
    const TensorView fqv = TensorView::contiguous(fq.data(), dt, {B, Hq, N, D});
    const TensorView fkv = TensorView::contiguous(fk.data(), dt, {B, Hkv, N, D});
    const TensorView fvv = TensorView::contiguous(fv.data(), dt, {B, Hkv, N, D});
    const TensorView fov = TensorView::contiguous(fo.data(), dt, {B, Hq, N, D});
    std::vector<float> flse(static_cast<std::size_t>(B * Hq * N));
    const TensorView flv = TensorView::contiguous(flse.data(), DType::f32, {B, Hq, N});
    if (Status s = attention(fqv, fkv, fvv, fov, p, flv); !s) return s;
    const auto t0 = Clock::now();
    if (a.backward) {
      if (Status s = attention_backward(fqv, fkv, fvv, fov, flv, TensorView::contiguous(g.data(), dt, {B, Hq, N, D}),
                                        TensorView::contiguous(gq.data(), dt, {B, Hq, N, D}),
                                        TensorView::contiguous(gk.data(), dt, {B, Hkv, N, D}),
                                        TensorView::contiguous(gv.data(), dt, {B, Hkv, N, D}), p);
          !s)
        return s;
    } else if (Status s = attention(fqv, fkv, fvv, fov, p, flv); !s) {
      return s;
    }
    t_one = since(t0);
  }
  MPI_Bcast(&t_one, 1, MPI_DOUBLE, 0, comm);

  // Per-rank numbers to rank 0.
  const double mine[4] = {compute, wait, comm_s, hidden};
  std::vector<double> all(static_cast<std::size_t>(4 * P));
  MPI_Gather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, comm);
  // The planner with what was measured here.
  RingPlanInput in;
  in.seq = a.seq, in.hosts = P, in.batch = B, in.heads = Hq, in.kv_heads = Hkv, in.head_dim = D;
  in.causal = !a.no_causal;
  in.bytes_per_element = static_cast<std::int64_t>(esize);
  const double step_comm = P > 1 ? comm_s / (P - 1) : 0;
  const double block_bytes = static_cast<double>(bytes_of[0]);
  const double bw = step_comm > latency ? block_bytes / (step_comm - latency) : block_bytes / std::max(step_comm, 1e-9);
  in.bandwidth_gbit = bw * 8 / 1e9;
  in.latency_us = latency * 1e6;
  in.rate_gflops = rate_rank / (a.backward ? 2.5 : 1.0) / 1e9;
  RingPlan plan;
  if (Status s = plan_ring(in, &plan); !s) return s;
  const double predicted = a.backward ? plan.backward_s : plan.forward_s;

  if (rank == 0) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "ring-bench: %d ranks, S=%lld (%s, %s), B=%lld Hq=%lld Hkv=%lld D=%lld, %s, %d thread(s) per rank, %s\n",
                  P, static_cast<long long>(a.seq), a.layout.c_str(), a.no_causal ? "full" : "causal",
                  static_cast<long long>(B), static_cast<long long>(Hq), static_cast<long long>(Hkv),
                  static_cast<long long>(D), a.dtype.c_str(), a.threads, a.backward ? "backward" : "forward");
    out << line << "rank  tokens  compute (s)  waiting (s)  comm alone (s)  hidden\n";
    double hidden_sum = 0, hidden_min = 1;
    for (int r = 0; r < P; ++r) {
      const double* x = &all[static_cast<std::size_t>(4 * r)];
      std::int64_t n = 0;
      for (const auto& sg : dist::slice_segments(layout, a.seq, P, r)) n += sg.length;
      std::snprintf(line, sizeof line, "%4d %7lld %12.3f %12.3f %15.4f %6.1f%%\n", r, static_cast<long long>(n), x[0],
                    x[1], x[2], 100 * x[3]);
      out << line;
      hidden_sum += x[3], hidden_min = std::min(hidden_min, x[3]);
    }
    std::snprintf(line, sizeof line, "ring: %.3f s (median of %d), %.3g FLOP, %.1f GFLOP/s over all ranks\n", t_ring,
                  a.reps, flops, flops / t_ring / 1e9);
    out << line;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int used = std::min(P * a.threads, cores);
    std::snprintf(line, sizeof line,
                  "one rank on the whole sequence: %.3f s; speedup %.2fx on %d ranks; scaling efficiency %.0f%% per "
                  "rank, %.0f%% per core in use (%d of %d cores)\n",
                  t_one, t_one / t_ring, P, 100 * t_one / (P * t_ring), 100 * t_one / (used / std::max(1, a.threads) * t_ring), used,
                  cores);
    out << line;
    std::snprintf(line, sizeof line,
                  "planner (attn ring-plan) with this run's measures (%.1f GFLOP/s per rank while all compute, link "
                  "%.2f GB/s, latency %.1f us): predicted %.3f s, measured %.3f s (%+.0f%%)\n",
                  in.rate_gflops, bw / 1e9, latency * 1e6, predicted, t_ring, 100 * (predicted - t_ring) / t_ring);
    out << line;
    std::snprintf(line, sizeof line,
                  "overlap: %.1f%% of communication hidden behind compute (mean over ranks; lowest %.1f%%)\n",
                  100 * hidden_sum / P, 100 * hidden_min);
    out << line;
    if (!a.png.empty()) {
      plot::Timeline tl;
      tl.title = "ring attention, rank 0 of " + std::to_string(P) + ": compute and waiting per ring step";
      tl.x_label = "seconds since the call began";
      tl.kinds = {"compute", "waiting on communication"};
      double t = 0;
      for (std::size_t s = 0; s < st.steps.size(); ++s) {
        tl.rows.push_back("step " + std::to_string(s));
        tl.spans.push_back({{t, t + st.steps[s].compute_seconds, 0},
                            {t + st.steps[s].compute_seconds, t + st.steps[s].compute_seconds + st.steps[s].wait_seconds, 1}});
        t += st.steps[s].compute_seconds + st.steps[s].wait_seconds;
      }
      if (Status s = plot::write_timeline(a.png, tl); !s) return Status::Invalid("--png", s.message());
    }
  }
  return Status::Ok();
}

}  // namespace

void add_ring_bench_command(CLI::App& app, std::ostream& out) {
  auto a = std::make_shared<RingBenchArgs>();
  CLI::App* c = app.add_subcommand("ring-bench", "Time ring attention over MPI (run under mpirun -np P): compute, "
                                                 "waiting, communication hidden, scaling, planner check, timeline PNG");
  c->add_option("--seq", a->seq, "Whole-sequence length (default 16384: 4096 tokens per rank on 4 ranks)");
  c->add_option("--batch", a->batch, "Sequences (default 1)");
  c->add_option("--heads", a->heads, "Query heads (default 2)");
  c->add_option("--kv-heads", a->kv_heads, "Key/value heads (default 1)");
  c->add_option("--head-dim", a->head_dim, "Head dim (default 128)");
  c->add_option("--dtype", a->dtype, "bf16 (default), f16 or f32");
  c->add_option("--layout", a->layout, "zigzag (default) or contiguous");
  c->add_flag("--no-causal", a->no_causal, "Full attention (default: causal)");
  c->add_flag("--backward", a->backward, "Time ring_attention_backward instead of the forward");
  c->add_option("--threads", a->threads, "Threads per rank (default 1)");
  c->add_option("--reps", a->reps, "Timed runs after a warm-up (default 3; the median is reported)");
  c->add_option("--png", a->png, "Timeline of rank 0 (PNG, or SVG by extension); empty = none")->type_name("FILE");
  on_run(c, [a, &out] { return ring_bench(*a, out); });
}

}  // namespace attn::tools
