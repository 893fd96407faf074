"""attn's Python surfaces on torch CUDA tensors (issue 29, part 7): scaled_dot_product_attention (eager, through the
torch.ops.attn operators with autograd, under torch.compile), attention_paged, merge_attention, describe_attention,
flash_attn_* and the Hugging Face adapter (the cascade: its clear refusal), each checked against the fp64 reference
by the tolerance rule (or, where the CPU engine is the yardstick, against attn's CPU result on the same inputs).

Skipped without torch or without a CUDA device (every machine that builds attn, CI included); `make test-gpu` runs
it on a GPU machine (scripts/test-gpu.sh: the wheel built for that machine's Python, tests/python/test_cuda.py)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import attn  # noqa: E402
import attn.torch_ops  # noqa: E402,F401
from reference import UNIT_ROUNDOFF, assert_agrees, attention, check_attention  # noqa: E402

DEV = torch.device("cuda")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def np64(x):
    return None if x is None else x.detach().to(torch.float64).cpu().numpy()


def rand(gen, *shape, dtype=torch.float32):
    """Uniform in [-1, 1) made on the CPU from a seeded generator (the same values on every machine), then moved."""
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype).to(DEV)


def qkv(seed, b=2, hq=4, hkv=2, sq=37, skv=61, dk=64, dv=64, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    return rand(gen, b, hq, sq, dk, dtype=dtype), rand(gen, b, hkv, skv, dk, dtype=dtype), rand(gen, b, hkv, skv, dv,
                                                                                                 dtype=dtype)


def variants(sq, skv, hq):
    """name -> (attn keyword arguments on CUDA, the fp64 reference's keyword arguments)."""
    gen = torch.Generator().manual_seed(99)
    bool_mask = torch.rand(sq, skv, generator=gen) < 0.7
    bool_mask[:, 0] = True
    float_mask = torch.randn(1, hq, sq, skv, generator=gen)
    float_mask[..., 3] = float("-inf")
    slopes = torch.linspace(0.05, 0.4, hq)
    sinks = torch.linspace(-1.0, 2.0, hq)
    return {
        "plain": ({}, {}),
        "causal_top_left": ({"is_causal": True}, {"causal": True}),
        "causal_bottom_right": ({"is_causal": True, "causal_alignment": "bottom_right"},
                                {"causal": True, "align": "bottom_right"}),
        "bool_mask": ({"attn_mask": bool_mask.to(DEV)}, {"mask": bool_mask.numpy()}),
        "float_mask": ({"attn_mask": float_mask.to(DEV)}, {"mask": float_mask.numpy()}),
        "kv_lens_list": ({"kv_lens": [skv, 17]}, {"kv_lens": [skv, 17]}),
        "kv_lens_tensor_causal": ({"kv_lens": torch.tensor([29, skv], device=DEV), "is_causal": True,
                                   "causal_alignment": "bottom_right"},
                                  {"kv_lens": [29, skv], "causal": True, "align": "bottom_right"}),
        "window": ({"is_causal": True, "causal_alignment": "bottom_right", "window": (9, 0)},
                   {"causal": True, "align": "bottom_right", "window": (9, 0)}),
        "softcap_alibi": ({"softcap": 5.0, "alibi_slopes": slopes.to(DEV)},
                          {"softcap": 5.0, "alibi_slopes": slopes.numpy()}),
        "sinks": ({"sinks": sinks.to(DEV)}, {"sinks": sinks.numpy()}),
        "dropout": ({"dropout_p": 0.2, "seed": 2**64 - 5}, {"dropout_p": 0.2, "seed": 2**64 - 5}),
        "scale": ({"scale": 0.3}, {"scale": 0.3}),
    }


VARIANTS = sorted(variants(4, 8, 4))


@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (33, 20)], ids=lambda d: f"dk{d[0]}dv{d[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", VARIANTS)
def test_sdpa_on_cuda_tensors_matches_fp64_reference(name, dtype, dims):
    sq, skv, hq = 37, 61, 4
    q, k, v = qkv(hash((name, dtype, dims)) % 1000, sq=sq, skv=skv, hq=hq, dk=dims[0], dv=dims[1],
                  dtype=DTYPES[dtype])
    kwargs, ref = variants(sq, skv, hq)[name]
    out, lse = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True, **kwargs)
    assert out.device == q.device and out.dtype == q.dtype and lse.device == q.device and lse.dtype == torch.float32
    torch.cuda.synchronize()
    check_attention(np64(out), np64(lse), dtype, q=np64(q), k=np64(k), v=np64(v), **ref)


@pytest.mark.parametrize("name", ["plain", "causal_bottom_right", "bool_mask", "softcap_alibi", "dropout", "sinks"])
def test_cuda_equals_cpu_engine_on_the_same_inputs(name):
    """The GPU's result and the CPU engine's on the same bf16 inputs, both within the tolerance rule of fp64; with
    dropout the same seed drops the same weights on both (attn's Philox counters)."""
    sq, skv, hq = 19, 45, 4
    q, k, v = qkv(5, sq=sq, skv=skv, hq=hq)
    kwargs, ref = variants(sq, skv, hq)[name]
    cuda = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    cpu_kwargs = {key: (x.cpu() if isinstance(x, torch.Tensor) else x) for key, x in kwargs.items()}
    cpu = attn.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), enable_gqa=True, **cpu_kwargs)
    expected, _ = attention(np64(q), np64(k), np64(v), **ref)
    naive = np64(cpu)
    assert_agrees("cuda vs fp64, the CPU engine as yardstick", np64(cuda), expected, naive,
                  4 * UNIT_ROUNDOFF["bfloat16"] * np.abs(expected).max())


def test_describe_attention_names_a_gpu_path():
    q, k, v = qkv(1)
    d = attn.describe_attention(q, k, v, enable_gqa=True, is_causal=True)
    assert d["backend"] in ("cudnn", "flash") and d["isa"].startswith("sm_") and d["threads"] == 0, d
    assert any(w in d["kernel"] for w in ("cudnn", "flash forward", "split-kv", "exact forward")), d


def test_mixed_devices_are_a_clear_error():
    q, k, v = qkv(2)
    with pytest.raises((ValueError, TypeError), match=r"^key: on cpu; expected q's device, cuda:0"):
        attn.scaled_dot_product_attention(q, k.cpu(), v, enable_gqa=True)
    with pytest.raises((ValueError, TypeError), match=r"^kv_lens: on cpu"):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, kv_lens=torch.tensor([3, 4]))


def _manual(q, k, v, causal_offset=None):
    """Attention written out in torch (GQA by repetition): the fp64 reference in float64, the naive yardstick in the
    inputs' dtype. causal_offset: key j allowed for query i when j <= i + offset (None: no mask)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal_offset is not None:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i + causal_offset, float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_autograd_on_cuda_is_deterministic_and_matches_fp64(dtype, causal):
    sq, skv = 40, 72
    q, k, v = (x.requires_grad_() for x in qkv(11, sq=sq, skv=skv, dtype=DTYPES[dtype]))
    kwargs = {} if causal is None else {"is_causal": True, "causal_alignment": causal}
    offset = None if causal is None else (0 if causal == "top_left" else skv - sq)
    g = rand(torch.Generator().manual_seed(3), 2, 4, sq, 64, dtype=DTYPES[dtype])
    out = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    grads = torch.autograd.grad(out, (q, k, v), g)
    again = torch.autograd.grad(attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs), (q, k, v), g)
    for a, b in zip(grads, again):
        assert torch.equal(a, b), "the backward on CUDA is not deterministic"
    x64 = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    ref = torch.autograd.grad(_manual(*x64, offset), x64, g.double().cpu())
    xn = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    naive = torch.autograd.grad(_manual(*xn, offset), xn, g)
    for name, got, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert got.device == q.device and got.dtype == q.dtype
        r = r.numpy()
        assert_agrees(name, np64(got), r, np64(n), 4 * UNIT_ROUNDOFF[dtype] * np.abs(r).max())


def test_float32_backward_on_cuda_is_refused_clearly():
    q, k, v = (x.requires_grad_() for x in qkv(4, dtype=torch.float32))
    out = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with pytest.raises((TypeError, ValueError), match=r"CUDA|cuda|cuDNN"):
        out.sum().backward()


def test_torch_compile_on_cuda_equals_eager():
    q, k, v = qkv(6)

    def fn(q, k, v):
        return attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True, kv_lens=[61, 30],
                                                 causal_alignment="bottom_right") * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    with torch.no_grad():
        eager = fn(q, k, v)
    got = compiled(q, k, v)
    torch._dynamo.reset()
    assert torch.equal(got, eager)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_attention_paged_on_cuda_matches_fp64(dtype):
    gen = torch.Generator().manual_seed(8)
    b, hq, hkv, sq, d, page = 3, 4, 2, 1, 64, 16
    lens = [50, 3, 33]
    pages = 12
    kp, vp = rand(gen, pages, hkv, page, d, dtype=DTYPES[dtype]), rand(gen, pages, hkv, page, d, dtype=DTYPES[dtype])
    table = [[7, 2, 9, 4], [0, 11, 1, 1], [5, 6, 3, 8]]
    q = rand(gen, b, hq, sq, d, dtype=DTYPES[dtype])
    out, lse = attn.attention_paged(q, kp, vp, table, lens, return_lse=True)
    assert out.device == q.device
    # the same keys gathered contiguously for the reference
    kc = torch.stack([torch.cat([kp[p] for p in row], 1) for row in table])
    vc = torch.stack([torch.cat([vp[p] for p in row], 1) for row in table])
    check_attention(np64(out), np64(lse), dtype, q=np64(q), k=np64(kc), v=np64(vc), kv_lens=lens)


def test_cascade_on_cuda_is_refused_clearly():
    """The cascade runs on the CPU only in this version: CUDA tensors get a clear TypeError naming query (ran on an
    H100: this message), nothing written."""
    gen = torch.Generator().manual_seed(12)
    kp, vp = rand(gen, 10, 2, 16, 64), rand(gen, 10, 2, 16, 64)
    q = rand(gen, 2, 4, 1, 64)
    with pytest.raises(TypeError, match=r"^query: on cuda:0 for attention_paged_cascade; expected CPU tensors"):
        attn.attention_paged_cascade(q, kp, vp, [3, 8], 20, [[1, 2], [4, 5]], [7, 30])


def test_merge_attention_on_cuda():
    q, k, v = qkv(9, dtype=torch.float32)
    a = attn.scaled_dot_product_attention(q, k[:, :, :30], v[:, :, :30], enable_gqa=True, return_lse=True)
    b = attn.scaled_dot_product_attention(q, k[:, :, 30:], v[:, :, 30:], enable_gqa=True, return_lse=True)
    out, lse = attn.merge_attention(a[0], a[1], b[0], b[1])
    assert out.device == q.device
    check_attention(np64(out), np64(lse), "float32", q=np64(q), k=np64(k), v=np64(v))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_on_cuda(causal):
    q, k, v = (x.transpose(1, 2) for x in qkv(13))  # [batch, seqlen, nheads, headdim]
    out, lse, _ = attn.flash_attn_func(q, k, v, causal=causal, softcap=4.0, return_attn_probs=True)
    assert out.device == q.device
    ref = {"causal": causal, "align": "bottom_right", "softcap": 4.0}
    check_attention(np64(out.transpose(1, 2)), None, "bfloat16", q=np64(q.transpose(1, 2)), k=np64(k.transpose(1, 2)),
                    v=np64(v.transpose(1, 2)), **ref)


def test_flash_attn_varlen_on_cuda_equals_per_sequence():
    gen = torch.Generator().manual_seed(14)
    lens = [5, 17, 1]
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32, device=DEV)
    q, k, v = (rand(gen, 23, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    out = attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for i, (s, n) in enumerate(zip([0, 5, 22], lens)):
        one = attn.flash_attn_func(q[None, s:s + n], k[None, s:s + n], v[None, s:s + n], causal=True)
        assert torch.equal(out[s:s + n], one[0]), f"sequence {i}"


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_on_cuda(paged):
    gen = torch.Generator().manual_seed(15)
    batch, heads, hkv, d, cap = 2, 4, 2, 64, 64
    q = rand(gen, batch, 1, heads, d, dtype=torch.bfloat16)
    knew, vnew = rand(gen, batch, 1, hkv, d, dtype=torch.bfloat16), rand(gen, batch, 1, hkv, d, dtype=torch.bfloat16)
    cos = torch.cos(torch.arange(cap, dtype=torch.float32)[:, None] * 0.01 * torch.arange(1, 17)).to(DEV)
    sin = torch.sin(torch.arange(cap, dtype=torch.float32)[:, None] * 0.01 * torch.arange(1, 17)).to(DEV)
    lens = torch.tensor([20, 41], dtype=torch.int32, device=DEV)
    if paged:
        kc = rand(gen, 8, 16, hkv, d, dtype=torch.bfloat16)
        vc = rand(gen, 8, 16, hkv, d, dtype=torch.bfloat16)
        table = torch.tensor([[3, 1, 6, 0], [2, 7, 5, 4]], dtype=torch.int32, device=DEV)
        kwargs = {"block_table": table}
    else:
        kc = rand(gen, batch, cap, hkv, d, dtype=torch.bfloat16)
        vc = rand(gen, batch, cap, hkv, d, dtype=torch.bfloat16)
        kwargs = {}
    out = attn.flash_attn_with_kvcache(q, kc, vc, knew, vnew, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                       causal=True, **kwargs)
    assert out.device == q.device
    # the same call on CPU copies: the CPU engine is the yardstick
    cpu_kwargs = {"block_table": table.cpu()} if paged else {}
    kc2, vc2 = kc.cpu().clone(), vc.cpu().clone()
    want = attn.flash_attn_with_kvcache(q.cpu(), kc2, vc2, knew.cpu(), vnew.cpu(), rotary_cos=cos.cpu(),
                                        rotary_sin=sin.cpu(), cache_seqlens=lens.cpu(), causal=True, **cpu_kwargs)
    assert torch.equal(kc.cpu(), kc2) and torch.equal(vc.cpu(), vc2), "the appended cache differs"
    diff = (out.cpu().float() - want.float()).abs().max().item()
    assert diff <= 2 * UNIT_ROUNDOFF["bfloat16"] * want.float().abs().max().item() * 2, diff


@pytest.mark.parametrize("kind,sliding_window", [("llama", None), ("mistral", 6)])
def test_hugging_face_adapter_on_cuda(kind, sliding_window):
    """test_transformers' decoder check with the model on the GPU: greedy generate with a KV cache and left padding
    gives eager's tokens, and the logits meet the tolerance rule against the model in float64 (transformers' sdpa)."""
    pytest.importorskip("transformers")
    from test_transformers import decoder, generate

    model = decoder(kind, seed=3, sliding_window=sliding_window).to(DEV)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 97, (3, 11), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    ids[mask == 0] = 0
    ids, mask = ids.to(DEV), mask.to(DEV)
    tokens_eager, logits_eager = generate(model, "eager", ids, mask, 14)
    tokens_attn, logits_attn = generate(model, "attn", ids, mask, 14)
    assert torch.equal(tokens_attn, tokens_eager)
    model64 = decoder(kind, seed=3, sliding_window=sliding_window).double().to(DEV)
    _, ref = generate(model64, "sdpa", ids, mask, 14)
    err_attn = (logits_attn.double() - ref).abs().max().item()
    err_eager = (logits_eager.double() - ref).abs().max().item()
    assert err_attn <= 2 * err_eager + 4 * 2.0**-24 * ref.abs().max().item(), (err_attn, err_eager)
