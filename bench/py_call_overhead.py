#!/usr/bin/env python3
"""The time of one decode call from Python: attn.scaled_dot_product_attention on its short path (a plain call) and on
its general path (the same call with window=(-1, -1), which means the same but is not plain), with kv_lens,
attn.attention_paged on both paths (the same keys in pages of 16), and PyTorch's SDPA, on CPU tensors of one query
row against 1, 128 and 1,024 keys (32 query / 8 KV heads of 128 by default). The calls are interleaved: each round runs every one of them `--calls` times, and the median over rounds
is reported (a slow spell of a shared machine falls on all of them alike).

    python3 bench/py_call_overhead.py [--threads 2] [--rounds 200] [--calls 10]   # needs torch (make test-torch)
"""

import argparse
import statistics
import sys
import time


def main():
    def positive(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}; expected a positive int") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n}; expected a positive int")
        return n

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--threads", type=positive, default=2, help="threads for torch and attn (default 2)")
    parser.add_argument("--rounds", type=positive, default=200, help="interleaved rounds (default 200; a quarter "
                                                                      "of them at 1,024 keys)")
    parser.add_argument("--calls", type=positive, default=10, help="calls of each function per round (default 10)")
    parser.add_argument("--heads", type=positive, default=32, help="query heads (default 32)")
    parser.add_argument("--kv-heads", type=positive, default=8, help="key/value heads, dividing --heads (default 8)")
    parser.add_argument("--head-dim", type=positive, default=128, help="head dimension (default 128)")
    args = parser.parse_args()
    if args.heads % args.kv_heads:
        parser.error(f"--kv-heads: {args.kv_heads} does not divide --heads {args.heads}")

    import torch
    import attn

    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, attn {attn.__version__}, {args.threads} threads, {args.heads}/{args.kv_heads} "
          f"heads of {args.head_dim}, one query; µs per call, medians of interleaved rounds")
    print("| dtype | keys | attn, short path | attn, general path | attn with kv_lens | paged, short path | "
          "paged, general path | PyTorch SDPA |")
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for keys in (1, 128, 1024):
            q = torch.randn(1, args.heads, 1, args.head_dim, generator=gen).to(dtype)
            k, v = (torch.randn(1, args.kv_heads, keys, args.head_dim, generator=gen).to(dtype) for _ in range(2))
            lens = torch.tensor([keys], dtype=torch.int32)
            pages = (keys + 15) // 16  # the same rows in pages of 16: [pages, Hkv, 16, D]
            kp, vp = (torch.nn.functional.pad(x, (0, 0, 0, pages * 16 - keys)).reshape(
                args.kv_heads, pages, 16, args.head_dim).transpose(0, 1).contiguous() for x in (k[0], v[0]))
            table = torch.arange(pages, dtype=torch.int32)[None]
            sdpa = attn.scaled_dot_product_attention
            calls = {
                "short": lambda: sdpa(q, k, v, enable_gqa=True),
                "general": lambda: sdpa(q, k, v, enable_gqa=True, window=(-1, -1)),
                "kv_lens": lambda: sdpa(q, k, v, enable_gqa=True, kv_lens=lens),
                "paged": lambda: attn.attention_paged(q, kp, vp, table, lens),
                "paged general": lambda: attn.attention_paged(q, kp, vp, table, lens, window=(-1, -1)),
                "torch": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            }
            times = {name: [] for name in calls}
            for fn in calls.values():  # warm-up
                fn()
            for _ in range(args.rounds if keys < 1024 else max(args.rounds // 4, 1)):
                for name, fn in calls.items():
                    start = time.perf_counter_ns()
                    for _ in range(args.calls):
                        fn()
                    times[name].append((time.perf_counter_ns() - start) / args.calls / 1e3)
            m = {name: statistics.median(t) for name, t in times.items()}
            print(f"| {str(dtype).replace('torch.', '')} | {keys} | {m['short']:.1f} | {m['general']:.1f} | "
                  f"{m['kv_lens']:.1f} | {m['paged']:.1f} | {m['paged general']:.1f} | {m['torch']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
