"""attn as PyTorch operators (attn.torch_ops): torch.compile(fullgraph=True) and torch.export trace through
attn.scaled_dot_product_attention, attn.attention_paged and attn.flash_attn_func with no graph break, and the
compiled or exported function gives eager's outputs and gradients bit for bit (the same kernels run).

Skipped without torch (make test-torch installs it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the torch.compile tests need it")

import attn  # noqa: E402
import attn.torch_ops  # noqa: E402,F401  registers torch.ops.attn.*
from reference import check_attention  # noqa: E402


def make(seed, b=2, hq=4, hkv=2, sq=33, skv=40, dk=16, dv=8, dtype=torch.float32, grad=True):
    gen = torch.Generator().manual_seed(seed)
    xs = [(torch.rand(*s, generator=gen) * 2 - 1).to(dtype) for s in
          ((b, hq, sq, dk), (b, hkv, skv, dk), (b, hkv, skv, dv))]
    return [x.requires_grad_(grad) for x in xs]


SLOPES = torch.tensor([0.1, 0.2, 0.3, 0.4])
CASES = {
    "causal_gqa": lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    "kv_lens_list": lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, kv_lens=[40, 17]),
    "bool_mask": lambda q, k, v: attn.scaled_dot_product_attention(
        q, k, v, enable_gqa=True, attn_mask=torch.ones(33, 40, dtype=torch.bool).tril(diagonal=3)),
    "window_bottom_right": lambda q, k, v: attn.scaled_dot_product_attention(
        q, k, v, enable_gqa=True, is_causal=True, causal_alignment="bottom_right", window=(9, 0)),
    "softcap_alibi": lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=5.0,
                                                                       alibi_slopes=SLOPES),
    "dropout_seed": lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, dropout_p=0.2,
                                                                      seed=2**64 - 5),
    "lse": lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)[0],
    "bf16": lambda q, k, v: attn.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                              enable_gqa=True).float(),
    "flash_attn_func": lambda q, k, v: attn.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            causal=True, softcap=3.0).transpose(1, 2),
}


def graph_breaks(fn, *args):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return explained.graph_break_count, [str(r.reason)[:300] for r in explained.break_reasons]


def grads(out, inputs, seed=7):
    g = torch.rand(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_equals_eager_with_no_graph_break(name):
    fn = CASES[name]
    q, k, v = make(1)
    breaks, reasons = graph_breaks(fn, q, k, v)
    assert breaks == 0, reasons
    # aot_eager: dynamo + AOTAutograd with the fake implementations and the registered backward, no codegen
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out_c, out_e = compiled(q, k, v), fn(q, k, v)
    assert torch.equal(out_c, out_e)
    for gc, ge in zip(grads(out_c, (q, k, v)), grads(out_e, (q, k, v))):
        assert torch.equal(gc, ge)
    torch._dynamo.reset()


def test_inductor_module_outputs_and_gradients():
    """A small attention block compiled by Inductor (the default backend): outputs and gradients of every
    parameter as eager's, attn's operator in the graph."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, d=32, heads=4):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.out = torch.nn.Linear(d, d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            o = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(o.transpose(1, 2).reshape(b, s, d))

    block = Block()
    x = torch.randn(2, 19, 32)
    eager = block(x)
    g = torch.randn(eager.shape)
    eager.backward(g)
    eager_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x)
    out.backward(g)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    for p, ge in zip(block.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, ge, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_sinks_gradient_through_compile():
    q, k, v = make(2)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)

    def fn(q, k, v, s):
        return attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=s)

    breaks, reasons = graph_breaks(fn, q, k, v, sinks)
    assert breaks == 0, reasons
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out_c, out_e = compiled(q, k, v, sinks), fn(q, k, v, sinks)
    gc, ge = grads(out_c, (q, k, v, sinks)), grads(out_e, (q, k, v, sinks))
    for a, b in zip(gc, ge):
        assert torch.equal(a, b)
    torch._dynamo.reset()


def test_dropout_without_seed_stays_in_the_graph():
    """seed=None draws the seed with torch.randint inside the graph (no .item(), no break); under
    aot_eager the draw uses torch's generator, so manual_seed reproduces eager's mask."""
    q, k, v = make(3)

    def fn(q, k, v):
        return attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, dropout_p=0.3)

    breaks, reasons = graph_breaks(fn, q, k, v)
    assert breaks == 0, reasons
    torch.manual_seed(11)
    eager = fn(q, k, v)
    torch.manual_seed(11)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.equal(compiled, eager)
    torch._dynamo.reset()


def test_paged_decode_compiles():
    gen = torch.Generator().manual_seed(4)
    k_pages, v_pages = torch.randn(6, 2, 8, 16, generator=gen), torch.randn(6, 2, 8, 8, generator=gen)
    table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32)
    lens = torch.tensor([20, 13])
    q = torch.randn(2, 4, 1, 16, generator=gen)

    def fn(q):
        return attn.attention_paged(q, k_pages, v_pages, table, lens)

    breaks, reasons = graph_breaks(fn, q)
    assert breaks == 0, reasons
    assert torch.equal(torch.compile(fn, fullgraph=True, backend="aot_eager")(q), fn(q))
    torch._dynamo.reset()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_kvcache_decode_loop_compiles(paged, rotary):
    """flash_attn_with_kvcache as a model's decode step: cache_seqlens a tensor input, k and v appended, one graph
    (fullgraph) for every step, the same outputs and cache contents as eager, step after step."""
    gen = torch.Generator().manual_seed(5)
    b, h, hk, d, steps = 2, 4, 2, 16, 4
    if paged:  # pages of 4 keys, scattered
        k_cache, v_cache = torch.randn(8, 4, hk, d, generator=gen), torch.randn(8, 4, hk, d, generator=gen)
        table = dict(block_table=torch.tensor([[5, 0, 2, 7], [1, 6, 3, 4]], dtype=torch.int32))
    else:
        k_cache, v_cache = torch.randn(b, 16, hk, d, generator=gen), torch.randn(b, 16, hk, d, generator=gen)
        table = {}
    rot = {}
    if rotary:
        angles = torch.arange(32.0)[:, None] * torch.rand(d // 4, generator=gen)  # rotary_dim = d / 2
        rot = dict(rotary_cos=torch.cos(angles), rotary_sin=torch.sin(angles), rotary_interleaved=False)

    def step(q, k, v, k_cache, v_cache, lens):
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True, **rot,
                                            **table)

    torch._dynamo.reset()
    inputs = [(torch.randn(b, 1, h, d, generator=gen), torch.randn(b, 1, hk, d, generator=gen),
               torch.randn(b, 1, hk, d, generator=gen)) for _ in range(steps)]
    breaks, reasons = graph_breaks(step, *inputs[0], k_cache.clone(), v_cache.clone(),
                                   torch.tensor([3, 7], dtype=torch.int32))
    assert breaks == 0, reasons
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_caches, compiled_caches = (k_cache.clone(), v_cache.clone()), (k_cache.clone(), v_cache.clone())
    lens = torch.tensor([3, 7], dtype=torch.int32)
    for q, k, v in inputs:
        expected = step(q, k, v, *eager_caches, lens)
        got = compiled(q, k, v, *compiled_caches, lens)
        assert torch.equal(got, expected)
        assert torch.equal(compiled_caches[0], eager_caches[0]) and torch.equal(compiled_caches[1], eager_caches[1])
        lens = lens + 1
    torch._dynamo.reset()


def test_cascade_decode_compiles():
    """attention_paged_cascade through torch.ops.attn.sdpa_paged_cascade: one graph, the eager numbers, and
    opcheck's agreement of schema, fake implementation and dispatch."""
    gen = torch.Generator().manual_seed(6)
    k_pages, v_pages = torch.randn(9, 2, 4, 16, generator=gen), torch.randn(9, 2, 4, 8, generator=gen)
    prefix = torch.tensor([7, 2, 5], dtype=torch.int32)  # 10 shared keys: a partial last page
    table = torch.tensor([[0, 3], [8, 1], [4, 6]], dtype=torch.int32)
    lens = torch.tensor([5, 0, 8], dtype=torch.int32)
    q = torch.randn(3, 4, 1, 16, generator=gen)

    def fn(q):
        return attn.attention_paged_cascade(q, k_pages, v_pages, prefix, 10, table, lens, is_causal=True,
                                            return_lse=True)

    breaks, reasons = graph_breaks(fn, q)
    assert breaks == 0, reasons
    out, lse = torch.compile(fn, fullgraph=True, backend="aot_eager")(q)
    expected, expected_lse = fn(q)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    torch._dynamo.reset()
    torch.library.opcheck(torch.ops.attn.sdpa_paged_cascade.default,
                          (q, k_pages, v_pages, prefix, 10, table, lens, None, None, "bottom_right", -1, -1,
                           "top_left", 0.0, None, None))


def test_export_holds_the_operator():
    q, k, v = (x.detach() for x in make(5))

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    exported = torch.export.export(M(), (q, k, v))
    assert "torch.ops.attn.sdpa" in exported.graph_module.code
    assert torch.equal(exported.module()(q, k, v), M()(q, k, v))


def test_operator_against_fp64_reference():
    """torch.ops.attn.sdpa called directly, against the independent fp64 oracle."""
    q, k, v = (x.detach() for x in make(6, hkv=4))
    out, lse = torch.ops.attn.sdpa(q, k, v, None, None, None, "top_left", -1, -1, "top_left", 0.0, None, None, 0.0,
                                   None)
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    check_attention(out.numpy(), lse.numpy(), "float32", q=q.numpy(), k=k.numpy(), v=v.numpy(), causal=True)


def test_opcheck():
    """torch.library.opcheck: schema, fake implementation, autograd registration and dispatch all agree."""
    q, k, v = make(8, hkv=4, sq=7, skv=9)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    mask = torch.ones(7, 9, dtype=torch.bool).tril(1)
    args = (q, k, v, mask, torch.tensor([9, 5]), 0.3, "bottom_right", -1, -1, "bottom_right", 0.0, None, sinks,
            0.0, None)
    torch.library.opcheck(torch.ops.attn.sdpa.default, args)
    torch.library.opcheck(torch.ops.attn.sdpa.default,
                          (q, k, v, None, None, None, "none", -1, -1, "top_left", 0.0, None, None, 0.25,
                           attn.torch_ops.seed_tensor(123)))


def test_direct_and_operator_paths_agree():
    """Eager inference calls the operator's implementation directly (no dispatcher); autograd goes through
    the operator: the same result."""
    q, k, v = make(9)
    with torch.no_grad():
        direct = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=2.0)
    through_op = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=2.0)
    assert through_op.requires_grad and torch.equal(direct, through_op.detach())


def test_errors_keep_their_names_through_the_operator():
    q, k, v = make(10)
    with pytest.raises(ValueError, match="^key:"):
        attn.scaled_dot_product_attention(q, k[:, :, :, :8], v, enable_gqa=True)
    with pytest.raises(ValueError, match="^dropout_p:"):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, dropout_p=1.5, seed=1)
    assert np.isfinite(attn.scaled_dot_product_attention(q, k, v, enable_gqa=True).detach().numpy()).all()
