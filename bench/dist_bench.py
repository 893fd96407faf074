"""Ring against head-parallel (Ulysses) attention from Python across hosts (attn.dist over torch.distributed, gloo),
with attn ring-plan's prediction for each beside the measurement.

Run one process per host with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (torchrun does; so does
bench/netns_bench.sh, which starts one per namespaced host). Rank 0 prints the report.

    torchrun --standalone --nproc-per-node 4 bench/dist_bench.py [--seq 8192 --heads 8 --kv-heads 4 --head-dim 64]

What is measured, on every rank at once (each step's time is the slowest rank's, median of --reps):
  ring      attn.dist.ring_attention forward (causal, zigzag, bf16 slices; fp32 blocks)
  ulysses   attn.dist.ulysses_attention forward (the same inputs; attention in bf16 on whole sequences)
  rate      GFLOP/s per host of each strategy's local kernel while all hosts compute (ring: an fp32 block against
            its own K/V; Ulysses: bf16 whole-sequence attention of Hq / P heads)
  link      one 4 MiB message to the next host and from the previous one (bandwidth), and an 8-byte one (latency)
Then `attn ring-plan` with those measures (--attn ATTN: the program) predicts both, and says which to use.
"""
import argparse
import os
import re
import subprocess
import time

import torch
import torch.distributed as dist

import attn
import attn.dist as ad


def slowest(fn, reps):
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--attn", default="build/attn", help="the attn program (for ring-plan)")
    ap.add_argument("--label", default="", help="what the links are (printed)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    P, r = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(1)
    attn.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    S, Hq, Hkv, D = a.seq, a.heads, a.kv_heads, a.head_dim
    full = [torch.rand(1, h, S, D, generator=g).to(torch.bfloat16) for h in (Hq, Hkv, Hkv)]
    q, k, v = (ad.scatter_sequence(x, "zigzag", P, r) for x in full)
    c = q.shape[2]
    group = dist.group.WORLD

    t_ring = slowest(lambda: ad.ring_attention(q, k, v, group, causal=True, layout="zigzag"), a.reps)
    t_uly = slowest(lambda: ad.ulysses_attention(q, k, v, group, causal=True, layout="zigzag"), a.reps)

    # rates: each strategy's local kernel, all hosts at once
    q32, k32, v32 = q.float(), k.float(), v.float()
    t_block = slowest(lambda: attn.scaled_dot_product_attention(q32, k32, v32, enable_gqa=True), a.reps)
    rate_ring = 4 * Hq * c * c * D / t_block / 1e9
    qh = torch.rand(1, Hq // P, S, D).to(torch.bfloat16)
    kh = torch.rand(1, max(Hkv // P, 1), S, D).to(torch.bfloat16)
    t_whole = slowest(lambda: attn.scaled_dot_product_attention(qh, kh, kh, is_causal=True, enable_gqa=True), a.reps)
    rate_uly = 4 * (Hq // P) * S * S * D / 2 / t_whole / 1e9

    # link: a shift of 4 MiB and of 8 bytes
    comm = ad._comm(group)

    def shift(nbytes):
        send, recv = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
        return lambda: comm.wait(comm.exchange(send, recv, 99))

    lat = slowest(shift(8), 10)
    t_big = slowest(shift(4 << 20), a.reps)
    bw = (4 << 20) / max(t_big - lat, 1e-9)

    if r == 0:
        def plan(rate):
            out = subprocess.run([a.attn, "ring-plan", "--seq", str(S), "--hosts", str(P), "--heads", str(Hq),
                                  "--kv-heads", str(Hkv), "--head-dim", str(D), "--rate", f"{rate:.3f}",
                                  "--bandwidth", f"{bw * 8 / 1e9:.4f}", "--latency", f"{lat * 1e6:.1f}"],
                                 capture_output=True, text=True, check=True).stdout
            row = next(line.split() for line in out.splitlines()
                       if re.match(r"\s*\S+\s+%d\s" % P, line) and "tokens on" not in line)
            unit = {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
            return float(row[7]) * unit[row[8]], float(row[15]) * unit[row[16]]

        ring_pred, _ = plan(rate_ring)
        _, uly_pred = plan(rate_uly)
        print(f"dist-bench: {P} hosts{' (' + a.label + ')' if a.label else ''}, S={S} causal zigzag, Hq={Hq} "
              f"Hkv={Hkv} D={D}, bf16, 1 thread per host")
        print(f"measured: rate ring {rate_ring:.1f} / Ulysses {rate_uly:.1f} GFLOP/s per host, link "
              f"{bw / 1e9:.2f} GB/s, latency {lat * 1e6:.0f} us")
        print("strategy  measured  planner  error")
        for name, t, p in (("ring", t_ring, ring_pred), ("ulysses", t_uly, uly_pred)):
            print(f"{name:8s} {t:8.3f} s {p:7.3f} s {100 * (p - t) / t:+5.0f}%")
        faster, predicted = ("ring" if t_ring <= t_uly else "ulysses"), ("ring" if ring_pred <= uly_pred else "ulysses")
        print(f"faster: {faster}; the planner chooses {predicted}"
              f"{' (agrees)' if faster == predicted else ' (DISAGREES)'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
