// attn: a cost model of ring (context-parallel) attention over P hosts (attn/dist.h), for planning deployments:
// time per layer, the block size at which the K/V transfer hides behind compute, where it stops hiding, and
// memory per host. No MPI here: `attn ring-plan` and `attn ring-bench` (which checks it) both use it.
//
// The model, per layer and host, with c = S / P tokens per host (the zigzag layout's balanced share):
//   compute per ring step  t_c = flops_step / rate,  flops_step = 4·B·Hq·c²·D (QKᵀ and PV, 2 FLOPs per
//                          multiply-add; D = (Dk + Dv) / 2), halved with a causal mask (zigzag balances it)
//   transfer per step      t_x = latency + bytes_step / bandwidth,  bytes_step = B·Hkv·c·(Dk + Dv)·elem
//   forward                T = t_c + (P − 1)·max(t_c, t_x)   (double-buffered: a step waits only for the part of
//                          the transfer its compute does not cover; the first step needs no transfer)
//   backward               2.5× the forward's FLOPs; each step also passes the block's fp32 dK, dV accumulators
//                          (B·Hkv·c·(Dk + Dv)·4 bytes) on, after its compute: T = t_c + (P − 1)·max(t_c, t_x) + t_g
// The transfer is hidden when t_c >= t_x: c >= c*, the root of a·c² = latency + b·c.
//
// Head-parallel (Ulysses) attention, the other strategy (attn.dist.ulysses_attention): an all-to-all gives each host
// the whole sequence of Hq / P query heads (and the KV heads they read: Hkv / P each when P divides Hkv, one
// replicated head when Hkv divides P), attention runs on whole sequences, a second all-to-all returns O. Each host
// sends P − 1 pieces over its link, one after the other, nothing overlapped with compute:
//   in   t_in  = (P − 1)·(latency + B·c·(Hq/P·Dk + kvh·(Dk + Dv))·elem / bandwidth)
//   out  t_out = (P − 1)·(latency + B·c·Hq/P·Dv·elem / bandwidth)
//   forward  T_u = t_in + P·t_c + t_out;  backward  t_out + 2.5·P·t_c + t_in (the same pieces reversed)
// It moves Q, K, V and O once; the ring moves K and V P − 1 times but hides them behind compute while c >= c*.
//
// The hybrid (Ulysses inside groups of u hosts, a ring across the P / u groups; u a divisor of P, 1 < u < P): the
// all-to-alls above over u hosts (u − 1 pieces of Hq/u heads each), then the ring over r = P / u groups with blocks
// of u·c tokens of Hq/u heads: per step t_c' = u·t_c and t_x' = latency + B·kvh·u·c·(Dk + Dv)·elem / bandwidth
// (kvh = Hkv / u, or 1 replicated), forward t_in + t_c' + (r − 1)·max(t_c', t_x') + t_out. u = 1 is the ring, u = P
// Ulysses. The plan keeps the best u and recommends the fastest forward of the three.
#pragma once

#include <cstdint>

#include "attn/status.h"

namespace attn {

struct RingPlanInput {
  std::int64_t seq = 0;         // S: the whole sequence (tokens)
  std::int64_t hosts = 0;       // P
  std::int64_t batch = 1, heads = 32, kv_heads = 8, head_dim = 128, v_head_dim = 0;  // 0: head_dim
  bool causal = true;
  std::int64_t bytes_per_element = 2;  // K/V as they travel (bf16: 2)
  double bandwidth_gbit = 100;         // per link, each direction (Gbit/s)
  double latency_us = 5;               // per message
  double rate_gflops = 1000;           // attention FLOP/s one host sustains (attn bench, or ring-bench's measure)
};

struct RingPlan {
  double block_tokens = 0;                 // c = S / P
  double step_compute_s = 0, step_transfer_s = 0;
  double forward_s = 0, backward_s = 0;    // per layer
  double hidden_fraction = 0;              // of the forward's transfer time, hidden behind compute (0..1)
  double min_hidden_block = 0;             // c*: the smallest block (tokens per host) whose transfer is hidden
  double max_hidden_hosts = 0;             // S / c*: beyond this many hosts the transfer shows
  double memory_bytes = 0;                 // per host: Q, K, V, O slices, two K/V receive buffers, fp32 accumulators
  double single_host_s = 0;                // the same layer on one host at the same rate (for the speedup)
  // Ulysses: possible when P divides Hq and P divides Hkv or Hkv divides P; times 0 otherwise
  bool ulysses_possible = false;
  double ulysses_forward_s = 0, ulysses_backward_s = 0, ulysses_transfer_s = 0;  // transfer: t_in + t_out
  std::int64_t hybrid_groups = 0;          // u of the best hybrid (0: none possible)
  double hybrid_forward_s = 0, hybrid_backward_s = 0;
  const char* recommended = "ring";        // "ring", "ulysses" or "hybrid": the fastest forward
};

// Fills *plan; an error names the bad field.
Status plan_ring(const RingPlanInput& in, RingPlan* plan);

}  // namespace attn
