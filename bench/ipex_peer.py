#!/usr/bin/env python3
"""Intel Extension for PyTorch as a peer of attn, run by bench/run_bench.py in its own venv (bench/.venv-ipex: IPEX
pins a torch version of its own). Reads a JSON list of rows on stdin, each {shape: {B, Hq, Hkv, Sq, Skv, D, causal,
page, kv_min}, dtype, kv_dtype, reps, rotate, llc, threads}, and prints a JSON list of {seconds, entry, sets} or
{error}: the median over `reps` calls of IPEX's fastest CPU attention entry point for the row, measured the way
run_bench.py measures PyTorch (warm-up while under 50 ms, K/V sets rotated through twice the LLC for decode):

  prefill: ipex.llm.functional.varlen_attention (IPEX's flash attention over packed [tokens, heads, D] rows) and
           torch SDPA with IPEX loaded; the faster is reported;
  decode:  ipex.llm.modules.PagedAttention.single_query_cached_kv_attention (vLLM's CPU decode kernel) over a paged
           cache [blocks, Hkv, 16, D], ragged lengths through context_lens.

IPEX has no 8-bit KV attention on the CPU: an int8 row runs in the Q dtype (what its user would run)."""

import json
import math
import statistics
import sys
import time

import torch
import intel_extension_for_pytorch as ipex

F = torch.nn.functional
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def kv_len(s, b):
    """Key length of sequence b: run_bench.py's (and attn bench's) formula."""
    if s.get("kv_min", 0) <= 0 or s["B"] == 1:
        return s["Skv"]
    lo, hi, B = s["kv_min"], s["Skv"], s["B"]
    return lo + ((hi - lo) * b + (B - 1) // 2) // (B - 1)


def timed(call, args_for, reps):
    n, warm = 0, 0.0
    while True:
        t0 = time.perf_counter()
        out = call(*args_for(n))
        warm += time.perf_counter() - t0
        n += 1
        if warm >= 0.05 or n >= 20:
            break
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError("non-finite output")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call(*args_for(n))
        times.append(time.perf_counter() - t0)
        n += 1
    return statistics.median(times)


def rand(gen, dt, *size):
    return (torch.rand(*size, generator=gen, dtype=torch.float32) * 2 - 1).to(dt)


def prefill(s, dt, reps):
    B, Hq, Hkv, Sq, Skv, D = (s[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
    gen = torch.Generator().manual_seed(1)
    q, k, v = rand(gen, dt, B, Sq, Hq, D), rand(gen, dt, B, Skv, Hkv, D), rand(gen, dt, B, Skv, Hkv, D)
    scale = 1 / math.sqrt(D)
    results = {}
    # varlen_attention: packed rows; causal is bottom-right aligned there only when Sq == Skv (the P shapes).
    if not s["causal"] or Sq == Skv:
        qq, kk, vv = (x.reshape(-1, x.shape[2], D) for x in (q, k, v))
        out = torch.empty_like(qq)
        cu_q = torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32)
        cu_k = torch.arange(0, (B + 1) * Skv, Skv, dtype=torch.int32)

        def varlen():
            ipex.llm.functional.varlen_attention(qq, kk, vv, out, cu_q, cu_k, None, Sq, Skv, 0.0, scale, False,
                                                 bool(s["causal"]), False, None, -1, -1, -1.0)
            return out
        results["varlen_attention"] = timed(varlen, lambda n: (), reps)
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    kwargs = dict(enable_gqa=Hq != Hkv)
    if s["causal"]:
        kwargs["is_causal"] = True

    def sdpa():
        return F.scaled_dot_product_attention(qt, kt, vt, **kwargs)
    results["scaled_dot_product_attention"] = timed(sdpa, lambda n: (), reps)
    entry = min(results, key=results.get)
    return dict(seconds=results[entry], entry=entry, sets=1, all=results)


def decode(s, dt, reps, llc):
    B, Hq, Hkv, Skv, D = (s[k] for k in ("B", "Hq", "Hkv", "Skv", "D"))
    bs = s.get("page") or 16
    lens = [kv_len(s, b) for b in range(B)]
    blocks_per = [(n + bs - 1) // bs for n in lens]
    nblocks = sum(blocks_per)
    esize = torch.finfo(dt).bits // 8
    set_bytes = 2 * nblocks * Hkv * bs * D * esize
    sets = max(1, math.ceil(2 * llc / set_bytes)) if llc else 1
    gen = torch.Generator().manual_seed(1)
    caches = [(rand(gen, dt, nblocks, Hkv, bs, D), rand(gen, dt, nblocks, Hkv, bs, D)) for _ in range(sets)]
    table = torch.zeros(B, max(blocks_per), dtype=torch.int32)
    order = torch.randperm(nblocks, generator=gen).to(torch.int32)  # pages scattered over the pool, like attn's
    at = 0
    for b in range(B):
        table[b, :blocks_per[b]] = order[at:at + blocks_per[b]]
        at += blocks_per[b]
    q = rand(gen, dt, B, Hq, D)
    out = torch.empty(B, Hq, D, dtype=dt)
    head_mapping = torch.arange(Hq, dtype=torch.int32) // (Hq // Hkv)
    context = torch.tensor(lens, dtype=torch.int32)
    scale = 1 / math.sqrt(D)

    def call(kc, vc):
        ipex.llm.modules.PagedAttention.single_query_cached_kv_attention(out, q, kc, vc, head_mapping, scale, table,
                                                                        context, bs, max(lens), None)
        return out
    seconds = timed(call, lambda n: caches[n % sets], reps)
    return dict(seconds=seconds, entry="PagedAttention.single_query_cached_kv_attention", sets=sets)


def main():
    rows = json.load(sys.stdin)
    results = []
    with torch.inference_mode():
        for row in rows:
            torch.set_num_threads(int(row["threads"]))
            s = row["shape"]
            dt = DTYPES[row["dtype"] if row["kv_dtype"] in (row["dtype"], "i8") else row["kv_dtype"]]
            try:
                if s["Sq"] == 1:
                    results.append(decode(s, dt, row["reps"], row["llc"] if row["rotate"] else 0))
                else:
                    results.append(prefill(s, dt, row["reps"]))
            except Exception as e:  # a dtype or shape this IPEX build has no CPU kernel for
                results.append(dict(error=f"{type(e).__name__}: {e}"))
    print(json.dumps(dict(torch=torch.__version__, ipex=ipex.__version__, rows=results)))


if __name__ == "__main__":
    main()
