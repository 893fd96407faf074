#!/usr/bin/env python3
"""PyTorch's SDPA backends on the shapes of bench/gpu/shapes.json, joined with attn_gpu_bench's rows, in one table.

Run by `make test-gpu` (scripts/test-gpu.sh) after attn_gpu_bench on the same machine, in the same run:
  1. the machine's two ceilings, measured here: a bf16 matrix product (8192^3, tensor cores) and a device-to-device
     copy (bytes read + written);
  2. for each shape, torch.nn.functional.scaled_dot_product_attention with each CUDA backend that takes it (flash,
     cuDNN, memory-efficient), timed with CUDA events (median of --iters after --warmup), on the very inputs
     attn_gpu_bench used (its --dump files);
  3. accuracy at full size: attn's output and each peer's against an fp64 reference computed here head by head,
     judged by the tolerance rule (max error <= 2 x the naive bf16 implementation's + 1e-3): the naive one
     rounds the scores and the weights to bf16 as an unfused bf16 attention does.
Writes --out (JSON) and prints the table last. Exit 1 when attn's output fails the rule or a row failed.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

DEVICE = "cuda"  # the tests of this script set "cpu"


def timed(fn, warmup, iters):
    """Median milliseconds of fn() over iters calls, each between two CUDA events, after warmup calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def ceilings(warmup, iters):
    n = 8192
    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, warmup, iters)
    matmul = 2 * n**3 / (ms * 1e-3) / 1e12
    src = torch.empty(1 << 30, device=DEVICE, dtype=torch.uint8).random_()  # 1 GiB, not zeros
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), warmup, iters)
    copy = 2 * src.numel() / (ms * 1e-3) / 1e9
    del a, b, src, dst
    torch.cuda.empty_cache()
    return {"bf16_matmul_tflops": matmul, "copy_gbps": copy}


def load(path, shape):
    """A raw bf16 file of attn_gpu_bench --dump as a CUDA tensor of the given shape."""
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    t = torch.frombuffer(raw, dtype=torch.bfloat16).reshape(shape)
    return t.to(DEVICE)


def inputs(s, dump):
    qs = (s["B"], s["Hq"], s["Sq"], s["D"])
    ks = (s["B"], s["Hkv"], s["Skv"], s["D"])
    base = os.path.join(dump, s["id"]) if dump else None
    if base and os.path.exists(base + ".q"):
        outs = {name: load(base + ext, qs) for name, ext in (("attn own", ".o"), ("attn auto", ".auto.o"))
                if os.path.exists(base + ext)}
        return load(base + ".q", qs), load(base + ".k", ks), load(base + ".v", ks), outs
    g = torch.Generator(device=DEVICE).manual_seed(0)
    rnd = lambda sh: (torch.rand(sh, device=DEVICE, generator=g) * 2 - 1).to(torch.bfloat16)
    return rnd(qs), rnd(ks), rnd(ks), {}


def expand_kv(k, Hq):
    return k.repeat_interleave(Hq // k.shape[1], dim=1)


def reference_errors(s, q, k, v, outs):
    """Max |out - ref| for each output, ref in fp64 head by head; also the naive bf16 implementation's."""
    scale = 1 / math.sqrt(s["D"])
    ke, ve = expand_kv(k, s["Hq"]), expand_kv(v, s["Hq"])
    err = {name: 0.0 for name in outs}
    err["naive bf16"] = 0.0
    Sq, Skv = s["Sq"], s["Skv"]
    mask = None
    if s["causal"]:
        i = torch.arange(Sq, device=DEVICE)[:, None]
        j = torch.arange(Skv, device=DEVICE)[None, :]
        mask = j > i + (Skv - Sq)  # bottom-right, as attn and FlashAttention align it
    for b in range(s["B"]):
        for h in range(s["Hq"]):
            qd, kd, vd = q[b, h].double(), ke[b, h].double(), ve[b, h].double()
            sc = (qd @ kd.T) * scale
            if mask is not None:
                sc = sc.masked_fill(mask, -math.inf)
            ref = torch.softmax(sc, dim=-1) @ vd
            # naive bf16: scores from a bf16 product rounded to bf16, softmax in fp32, weights rounded to bf16
            sn = (q[b, h] @ ke[b, h].T).float() * scale
            if mask is not None:
                sn = sn.masked_fill(mask, -math.inf)
            pn = torch.softmax(sn.to(torch.bfloat16).float(), dim=-1).to(torch.bfloat16)
            naive = (pn @ ve[b, h]).double()
            err["naive bf16"] = max(err["naive bf16"], (naive - ref).abs().max().item())
            for name, o in outs.items():
                e = (o[b, h].double() - ref).abs().max().item()
                err[name] = max(err[name], e if math.isfinite(e) else math.inf)
    return err


BACKENDS = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")]


def run_peers(s, q, k, v, warmup, iters):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = s["Hq"] != s["Hkv"]
    causal = s["causal"]
    rows, outs = {}, {}
    for name, attr in BACKENDS:
        backend = getattr(SDPBackend, attr, None)
        if backend is None:
            rows[name] = {"error": "not in this PyTorch"}
            continue

        def call():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        try:
            outs[name] = call()
            torch.cuda.synchronize()
            rows[name] = {"ms": timed(call, warmup, iters)}
        except Exception as e:  # a backend that refuses the shape says why
            rows[name] = {"error": str(e).splitlines()[0][:160]}
            torch.cuda.synchronize()
    return rows, outs


def run_peer_backwards(s, q, k, v, warmup, iters):
    """Each PyTorch backend's backward alone (dQ, dK, dV from a kept graph), for shapes marked "backward"."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = s["Hq"] != s["Hkv"]
    rows = {}
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    g = torch.Generator(device=DEVICE).manual_seed(4)
    dout = (torch.rand(q.shape, device=DEVICE, generator=g) * 2 - 1).to(torch.bfloat16)
    for name, attr in BACKENDS:
        backend = getattr(SDPBackend, attr, None)
        if backend is None:
            rows[name] = {"error": "not in this PyTorch"}
            continue
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=s["causal"], enable_gqa=gqa)
            call = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
            call()
            torch.cuda.synchronize()
            rows[name] = {"ms": timed(call, warmup, iters)}
            del out
        except Exception as e:
            rows[name] = {"error": str(e).splitlines()[0][:160]}
            torch.cuda.synchronize()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=os.path.join(os.path.dirname(__file__), "shapes.json"))
    ap.add_argument("--attn", required=True, help="attn_gpu_bench's --out JSON")
    ap.add_argument("--dump", default="", help="attn_gpu_bench's --dump folder")
    ap.add_argument("--out", default="")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-accuracy", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("peers.py: no CUDA device for PyTorch")
        return 77
    shapes = json.load(open(a.shapes))["shapes"]
    attn_rows = {}
    if os.path.exists(a.attn):
        for r in json.load(open(a.attn))["rows"]:
            attn_rows[(r["id"], r.get("path", "own"))] = r
    ceil = ceilings(a.warmup, a.iters)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "ceilings": ceil, "rows": []}
    failed = False
    for s in shapes:
        mine = {path: attn_rows[(s["id"], path)] for path in ("own", "auto", "backward") if (s["id"], path) in attn_rows}
        q, k, v, attn_outs = inputs(s, a.dump)
        peers, outs = run_peers(s, q, k, v, a.warmup, a.iters)
        row = {"id": s["id"], "what": s.get("what", ""), "attn": mine, "peers": peers}
        if s.get("backward"):
            row["peer_backwards"] = run_peer_backwards(s, q, k, v, a.warmup, a.iters)
        if not a.no_accuracy and attn_outs:
            outs = dict(outs)
            outs.update(attn_outs)
            err = reference_errors(s, q, k, v, outs)
            row["max_error"] = err
            row["attn_passes"] = all(err[n] <= 2 * err["naive bf16"] + 1e-3 for n in attn_outs)
            failed |= not row["attn_passes"]
        failed |= not all(m.get("ok", False) for m in mine.values()) or not mine
        result["rows"].append(row)
        del q, k, v, attn_outs, outs
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print_table(result)
    return 1 if failed else 0


def print_table(result):
    c = result["ceilings"]
    print(f"\nattn vs PyTorch {result['torch']} SDPA on {result['device']} (bf16; median ms, CUDA events)")
    print(f"ceilings measured here: bf16 matmul {c['bf16_matmul_tflops']:.0f} TFLOP/s, copy {c['copy_gbps']:.0f} GB/s")
    print("own: attn's own kernel (Backend::flash); auto: Backend::automatic (cuDNN where it takes the shape)")
    print(f"{'shape':<6}{'own ms':>8}{'auto ms':>9}{'TFLOP/s':>8}{'%mm':>5}{'GB/s':>7}{'%cp':>5}"
          f"{'flash':>8}{'cudnn':>8}{'effic':>8}{'best/own':>9}{'best/auto':>10}  {'err own':>8}{'auto':>9}{'naive':>9} ok")
    for r in result["rows"]:
        own, auto = r["attn"].get("own", {}), r["attn"].get("auto", {})
        own_ms = own.get("median_ms", 0) if own.get("ok") else 0
        auto_ms = auto.get("median_ms", 0) if auto.get("ok") else 0
        best = auto if auto_ms else own
        peer_ms = [p["ms"] for p in r["peers"].values() if "ms" in p]
        ratio = lambda ms: f"{min(peer_ms) / ms:9.2f}" if ms and peer_ms else f"{'-':>9}"
        cols = "".join(f"{r['peers'][n]['ms']:8.3f}" if "ms" in r["peers"].get(n, {}) else f"{'n/a':>8}"
                       for n, _ in BACKENDS)
        e = r.get("max_error", {})
        ok = {True: "yes", False: "NO"}.get(r.get("attn_passes"), "-")
        if best.get("ok"):
            print(f"{r['id']:<6}{own_ms:8.3f}{auto_ms:9.3f}{best['tflops']:8.1f}"
                  f"{100 * best['tflops'] / c['bf16_matmul_tflops']:5.0f}{best['gbps']:7.0f}"
                  f"{100 * best['gbps'] / c['copy_gbps']:5.0f}{cols}{ratio(own_ms)}{ratio(auto_ms):>10}  "
                  f"{e.get('attn own', float('nan')):8.1e}{e.get('attn auto', float('nan')):9.1e}"
                  f"{e.get('naive bf16', float('nan')):9.1e} {ok}")
        else:
            print(f"{r['id']:<6}{'FAILED':>8} {own.get('error', auto.get('error', 'not run'))[:60]}{cols}")
        bwd = r["attn"].get("backward")
        if bwd:
            state = (f"{bwd['median_ms']:.3f} ms, {bwd['tflops']:.1f} TFLOP/s, deterministic" if bwd.get("ok")
                     else "FAILED: " + bwd.get("error", "")[:80])
            print(f"{'':<6}backward ({bwd.get('kernel', '')}): {state}")
            pb = r.get("peer_backwards", {})
            pms = [p["ms"] for p in pb.values() if "ms" in p]
            if pms:
                cols = ", ".join(f"{n} {p['ms']:.3f} ms" if "ms" in p else f"{n} n/a" for n, p in pb.items())
                ratio = f"; best/attn {min(pms) / bwd['median_ms']:.2f}" if bwd.get("ok") else ""
                print(f"{'':<6}PyTorch backward: {cols}{ratio}")
    print("best/own, best/auto > 1: attn is faster than the fastest PyTorch backend by that factor. "
          "%mm, %cp: of the ceilings (the auto path's).")
    for r in result["rows"]:
        for n, p in r["peers"].items():
            if "error" in p:
                print(f"  {r['id']} {n}: {p['error']}")


if __name__ == "__main__":
    sys.exit(main())
