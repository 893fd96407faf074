"""attn on PyTorch CPU tensors, against torch.nn.functional.scaled_dot_product_attention and the fp64 reference.

Skipped when torch is not installed: `make test` does not install it (a CUDA build from PyPI, about 5 GB);
`make test-torch` does, and runs these (CI runs both)."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch comparison tests need it")
F = torch.nn.functional

import attn  # noqa: E402
from reference import UNIT_ROUNDOFF, assert_agrees, attention  # noqa: E402



def _torch_has_gqa():
    try:
        F.scaled_dot_product_attention(torch.ones(1, 2, 1, 1), torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1),
                                       enable_gqa=True)
        return True
    except TypeError:
        return False


TORCH_HAS_GQA = _torch_has_gqa()
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def randn(gen, *shape, dtype=torch.float32):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)


def as64(x):
    return x.detach().to(torch.float64).numpy()


def compare_with_torch(args, kwargs, dtype_name, ref_kwargs):
    """attn's result must be as close to the fp64 reference as twice torch's, plus rounding noise; a
    float32 result must also be close to torch's outright."""
    ours = attn.scaled_dot_product_attention(*args, **kwargs)
    theirs = F.scaled_dot_product_attention(*args, **kwargs)
    assert isinstance(ours, torch.Tensor) and ours.dtype == args[0].dtype and ours.shape == theirs.shape
    q, k, v = (as64(x) for x in args[:3])
    if q.ndim == 3:
        q, k, v = q[None], k[None], v[None]
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    mask = None if mask is None else (mask.numpy() if mask.dtype == torch.bool else as64(mask))
    ref, _ = attention(q, k, v, mask=mask, **ref_kwargs)
    u = UNIT_ROUNDOFF[dtype_name]
    got = as64(ours).reshape(ref.shape)
    assert_agrees("out vs fp64, torch as yardstick", got, ref, as64(theirs).reshape(ref.shape),
                  4 * u * max(np.abs(ref).max(), 1e-3))
    if dtype_name == "float32":
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 8, 8), (2, 3, 7, 113, 16, 8), (1, 2, 113, 7, 32, 32),
                                   (2, 4, 113, 113, 64, 64)])
def test_matches_torch(dtype, shape):
    b, h, sq, skv, dk, dv = shape
    gen = torch.Generator().manual_seed(sum(shape))
    q = randn(gen, b, h, sq, dk, dtype=DTYPES[dtype])
    k = randn(gen, b, h, skv, dk, dtype=DTYPES[dtype])
    v = randn(gen, b, h, skv, dv, dtype=DTYPES[dtype])
    compare_with_torch((q, k, v), {}, dtype, {})
    compare_with_torch((q, k, v), {"is_causal": True, "scale": 0.3}, dtype, {"causal": True, "scale": 0.3})


@pytest.mark.parametrize("mask_kind", ["bool_2d", "bool_keys", "bool_4d", "float_4d", "float_rows"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_masks_match_torch(mask_kind, dtype):
    gen = torch.Generator().manual_seed(len(mask_kind))
    b, h, sq, skv = 2, 3, 7, 113
    q, k, v = (randn(gen, b, h, s, 16, dtype=DTYPES[dtype]) for s in (sq, skv, skv))
    mask = {
        "bool_2d": lambda: torch.rand(sq, skv, generator=gen) < 0.7,
        "bool_keys": lambda: torch.rand(1, skv, generator=gen) < 0.6,  # torch wants rank >= 2
        "bool_4d": lambda: torch.rand(b, 1, sq, skv, generator=gen) < 0.5,
        "float_4d": lambda: torch.where(torch.rand(b, h, sq, skv, generator=gen) < 0.2, float("-inf"),
                                        torch.randn(b, h, sq, skv, generator=gen)).to(DTYPES[dtype]),
        "float_rows": lambda: torch.randn(1, sq, 1, generator=gen).to(DTYPES[dtype]),
    }[mask_kind]()
    # Keep key 0 for every query: rows with no key at all are where attn (0) and torch (NaN) differ.
    if mask.dtype == torch.bool:
        mask[..., 0] = True
    elif mask_kind == "float_4d":
        mask[..., 0] = 0
    compare_with_torch((q, k, v, mask), {}, dtype, {})


def test_fully_masked_rows_give_zero():
    q = k = v = torch.ones(1, 1, 2, 4)
    mask = torch.tensor([[True, True], [False, False]])
    out, lse = attn.scaled_dot_product_attention(q, k, v, mask, return_lse=True)
    assert out[0, 0, 1].eq(0).all() and lse[0, 0, 1].item() == float("-inf")


@pytest.mark.skipif(not TORCH_HAS_GQA, reason="this torch has no enable_gqa (added in 2.5)")
@pytest.mark.parametrize("hkv", [1, 2])
def test_gqa_matches_torch(hkv):
    gen = torch.Generator().manual_seed(hkv)
    q, k, v = randn(gen, 2, 8, 7, 16), randn(gen, 2, hkv, 113, 16), randn(gen, 2, hkv, 113, 16)
    compare_with_torch((q, k, v), {"enable_gqa": True, "is_causal": True}, "float32", {"causal": True})


def test_gqa_without_enable_gqa_is_an_error_in_both():
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="^key: 2 heads but query has 4"):
        attn.scaled_dot_product_attention(q, k, k)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, k)


def test_unbatched_3d_matches_torch():
    gen = torch.Generator().manual_seed(3)
    q, k, v = randn(gen, 4, 7, 16), randn(gen, 4, 113, 16), randn(gen, 4, 113, 8)
    compare_with_torch((q, k, v), {"is_causal": True}, "float32", {"causal": True})


def test_bshd_views_and_expanded_tensors_without_copies():
    gen = torch.Generator().manual_seed(5)
    x = randn(gen, 2, 113, 4, 16)                        # [B, S, H, D], FlashAttention's layout
    kv = randn(gen, 2, 1, 113, 16).expand(2, 4, 113, 16)  # stride 0 over heads
    q = x.transpose(1, 2)
    assert not q.is_contiguous()
    compare_with_torch((q, kv, kv), {"is_causal": True}, "float32", {"causal": True})


def test_bottom_right_and_kv_lens_match_an_explicit_torch_mask():
    gen = torch.Generator().manual_seed(9)
    b, h, sq, skv = 2, 2, 7, 113
    q, k, v = randn(gen, b, h, sq, 16), randn(gen, b, h, skv, 16), randn(gen, b, h, skv, 16)
    lens = torch.tensor([50, 113])
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right", kv_lens=lens)
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
    mask = torch.stack([(j < n) & (j <= i + n - sq) for n in lens.tolist()])[:, None]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_merge_attention_on_tensors():
    gen = torch.Generator().manual_seed(11)
    q, k, v = randn(gen, 1, 2, 7, 16), randn(gen, 1, 2, 113, 16), randn(gen, 1, 2, 113, 16)
    a = attn.scaled_dot_product_attention(q, k[:, :, :40], v[:, :, :40], return_lse=True)
    b = attn.scaled_dot_product_attention(q, k[:, :, 40:], v[:, :, 40:], return_lse=True)
    out, lse = attn.merge_attention(*a, *b)
    assert isinstance(out, torch.Tensor) and lse.dtype == torch.float32
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-1, -2) / 4, dim=-1), rtol=1e-5, atol=1e-5)


def test_errors_on_tensors():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError, match=re.escape("key: a numpy.ndarray; expected a torch.Tensor like query")):
        attn.scaled_dot_product_attention(q, q.numpy(), q)
    with pytest.raises(TypeError, match="^query: dtype float64; expected float32, bfloat16 or float16"):
        attn.scaled_dot_product_attention(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match="^attn_mask: dtype int64"):
        attn.scaled_dot_product_attention(q, q, q, torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="^key: head dim 4; expected Dk = 8"):
        attn.scaled_dot_product_attention(q, q[..., :4], q)
    with pytest.raises(TypeError, match=re.escape("kv_lens: dtype float32; expected integers (any int or uint dtype)")):
        attn.scaled_dot_product_attention(q, q, q, kv_lens=torch.ones(1))


@pytest.mark.parametrize("case", ["plain", "causal_gqa", "mask_window_lens", "unbatched"])
def test_autograd_matches_torch(case):
    # Gradients through attn's backward (a torch.autograd.Function) against torch's own autograd in fp64.
    gen = torch.Generator().manual_seed(7)
    hq, hkv, sq, skv, dk, dv = (4, 2, 9, 13, 16, 8) if case != "plain" else (2, 2, 7, 7, 8, 8)
    q, k, v = randn(gen, 2, hq, sq, dk), randn(gen, 2, hkv, skv, dk), randn(gen, 2, hkv, skv, dv)
    kwargs, ref_mask = {}, None
    if case == "causal_gqa":
        kwargs = dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True)
        i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
        ref_mask = j <= i + skv - sq
    elif case == "mask_window_lens":
        keep = torch.rand(sq, skv, generator=gen) > 0.3
        kwargs = dict(attn_mask=keep, window=(5, 2), kv_lens=[skv, 10], enable_gqa=True)
        i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]  # window about the top-left diagonal j = i
        ref_mask = keep & (j >= i - 5) & (j <= i + 2) & (j < torch.tensor([skv, 10])[:, None, None, None])
    if case == "unbatched":
        q, k, v = q[0], k[0], v[0]
        kwargs = dict(enable_gqa=True)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = attn.scaled_dot_product_attention(*leaves, **kwargs)
    g = randn(gen, *out.shape)
    (out * g).sum().backward()

    ref_leaves = [x.double().clone().requires_grad_(True) for x in (q, k, v)]
    rk, rv = ref_leaves[1], ref_leaves[2]
    if hq != hkv:
        rk, rv = (x.repeat_interleave(hq // hkv, dim=-3) for x in (rk, rv))
    scores = ref_leaves[0] @ rk.transpose(-1, -2) / dk ** 0.5
    if ref_mask is not None:
        scores = scores.masked_fill(~ref_mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    ((p @ rv) * g.double()).sum().backward()
    for name, mine, ref in zip("qkv", leaves, ref_leaves):
        torch.testing.assert_close(mine.grad.double(), ref.grad, rtol=1e-4, atol=1e-5, msg=f"d{name}")


def test_mask_requiring_grad_is_refused():
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    with pytest.raises(ValueError, match="^attn_mask: requires grad"):
        attn.scaled_dot_product_attention(q, q, q, torch.zeros(3, 3, requires_grad=True))
    with torch.no_grad():
        out = attn.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["bshd", "expanded"])
def test_tensors_reach_the_library_without_copies(layout):
    # As in test_sdpa.py: the library sees that the output overlaps the input only if it got the
    # tensor's own memory through DLPack, not a copy.
    buf = torch.randn(1, 4, 2, 8)  # [B, S, H, D]
    q = buf.transpose(1, 2) if layout == "bshd" else buf[:, :1].transpose(1, 2).expand(1, 2, 4, 8)
    k = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="^out: memory overlaps input q"):
        attn._attn.attention(q, k, k, buf.view(1, 2, 4, 8), None, attn._attn.Options())


# ---- hardening: layouts, one kind per call, integer dtypes, paged attention and the modules on tensors --------

def raises(exc, message):
    return pytest.raises(exc, match="^" + re.escape(message))


def _qkv(gen, b=2, hq=4, hkv=2, sq=3, skv=10, d=8, dtype=torch.float32):
    return randn(gen, b, hq, sq, d, dtype=dtype), randn(gen, b, hkv, skv, d, dtype=dtype), randn(gen, b, hkv, skv, d,
                                                                                                  dtype=dtype)


def _paged_inputs(gen, dtype=torch.float32):
    q = randn(gen, 2, 4, 3, 8, dtype=dtype)
    k_pages, v_pages = randn(gen, 7, 2, 4, 8, dtype=dtype), randn(gen, 7, 2, 4, 5, dtype=dtype)
    table = torch.tensor([[6, 0, 2], [1, 4, -1]], dtype=torch.int32)
    lens = torch.tensor([12, 7])
    return q, k_pages, v_pages, table, lens


SPARSE_COO = "a sparse tensor (torch.sparse_coo); expected a dense (strided) tensor"


@pytest.mark.parametrize("arg", ["query", "key", "value", "attn_mask", "kv_lens"])
def test_sparse_tensors_are_refused_by_sdpa(arg):
    q, k, v = _qkv(torch.Generator().manual_seed(1), hkv=4)
    args = {"query": q, "key": k, "value": v, "attn_mask": torch.ones(3, 10, dtype=torch.bool),
            "kv_lens": torch.tensor([10, 5])}
    args[arg] = args[arg].to_sparse()
    with raises(TypeError, f"{arg}: {SPARSE_COO}"):
        attn.scaled_dot_product_attention(**args)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's: sparse CSR is beta, strided nested tensors a prototype
def test_other_layouts_are_refused():
    q, k, v = _qkv(torch.Generator().manual_seed(2), hkv=4)
    with raises(TypeError, "query: a sparse tensor (torch.sparse_csr); expected a dense (strided) tensor"):
        attn.scaled_dot_product_attention(q[0, 0].to_sparse_csr(), k[0, 0], v[0, 0])
    with raises(TypeError, "query: on device meta; expected a CPU or CUDA tensor"):
        attn.scaled_dot_product_attention(q.to("meta"), k, v)
    for layout in (torch.strided, torch.jagged):
        nested = torch.nested.nested_tensor([q[0, 0], q[1, 0, :2]], layout=layout)
        with raises(TypeError, "query: a nested tensor; expected a dense (strided) tensor"):
            attn.scaled_dot_product_attention(nested, k[:, 0], v[:, 0])


@pytest.mark.parametrize("arg", ["query", "k_pages", "v_pages", "page_table", "seq_lens", "attn_mask"])
def test_sparse_tensors_are_refused_by_attention_paged(arg):
    q, kp, vp, table, lens = _paged_inputs(torch.Generator().manual_seed(3))
    args = {"query": q, "k_pages": kp, "v_pages": vp, "page_table": table, "seq_lens": lens,
            "attn_mask": torch.ones(3, 12, dtype=torch.bool)}
    args[arg] = args[arg].to_sparse()
    with raises(TypeError, f"{arg}: {SPARSE_COO}"):
        attn.attention_paged(**args)


def test_sparse_tensors_are_refused_by_merge_and_the_modules():
    gen = torch.Generator().manual_seed(4)
    out, lse = randn(gen, 1, 2, 3, 4), randn(gen, 1, 2, 3)
    for i, name in enumerate(("out_a", "lse_a", "out_b", "lse_b")):
        args = [out, lse, out, lse]
        args[i] = args[i].to_sparse()
        with raises(TypeError, f"{name}: {SPARSE_COO}"):
            attn.merge_attention(*args)
    cache = attn.KVCache(2, 8, 8)
    k = randn(gen, 1, 2, 3, 8)
    with raises(TypeError, f"k: {SPARSE_COO}"):
        cache.append(k.to_sparse(), k)
    with raises(TypeError, f"v: {SPARSE_COO}"):
        cache.append(k, k.to_sparse())
    with raises(TypeError, f"q: {SPARSE_COO}"):
        cache.attend(randn(gen, 1, 4, 1, 8).to_sparse())
    m = attn.MultiHeadAttention(16, 2, seed=0)
    x = randn(gen, 1, 3, 16)
    with raises(TypeError, f"x: {SPARSE_COO}"):
        m(x.to_sparse())
    with raises(TypeError, f"x_kv: {SPARSE_COO}"):
        m(x, x.to_sparse())
    with raises(TypeError, f"attn_mask: {SPARSE_COO}"):
        m(x, attn_mask=torch.ones(3, 3, dtype=torch.bool).to_sparse())
    with raises(TypeError, f"w_q: {SPARSE_COO}"):
        m.set_weight("w_q", torch.zeros(16, 16).to_sparse())


def test_one_kind_per_call():
    gen = torch.Generator().manual_seed(5)
    q, k, v = _qkv(gen, hkv=4)
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    with raises(TypeError, "kv_lens: a numpy.ndarray; expected a torch.Tensor like query, or a list or tuple of ints"):
        attn.scaled_dot_product_attention(q, k, v, kv_lens=np.array([10, 5]))
    with raises(TypeError, "kv_lens: a torch.Tensor; expected a numpy.ndarray like query, or a list or tuple of ints"):
        attn.scaled_dot_product_attention(qn, kn, vn, kv_lens=torch.tensor([10, 5]))
    with raises(TypeError, "attn_mask: a numpy.ndarray; expected a torch.Tensor like query"):
        attn.scaled_dot_product_attention(q, k, v, np.ones((3, 10), bool))
    # attention_paged used to take such mixes; now it follows the same rule.
    pq, kp, vp, table, lens = _paged_inputs(gen)
    with raises(TypeError, "k_pages: a numpy.ndarray; expected a torch.Tensor like query"):
        attn.attention_paged(pq, kp.numpy(), vp, table, lens)
    with raises(TypeError, "v_pages: a torch.Tensor; expected a numpy.ndarray like query"):
        attn.attention_paged(pq.numpy(), kp.numpy(), vp, table.numpy(), lens.numpy())
    with raises(TypeError, "page_table: a numpy.ndarray; expected a torch.Tensor like query, or a list or tuple"):
        attn.attention_paged(pq, kp, vp, table.numpy(), lens)
    with raises(TypeError, "seq_lens: a torch.Tensor; expected a numpy.ndarray like query, or a list or tuple"):
        attn.attention_paged(pq.numpy(), kp.numpy(), vp.numpy(), table.numpy(), lens)
    with raises(TypeError, "lse_a: a numpy.ndarray; expected a torch.Tensor like out_a"):
        attn.merge_attention(q, q[..., 0].numpy(), q, q[..., 0])
    with raises(TypeError, "v: a numpy.ndarray; expected a torch.Tensor like k"):
        attn.KVCache(2, 8, 16).append(k[:1, :2], v[:1, :2].numpy())
    m = attn.MultiHeadAttention(16, 2, seed=0)
    x = randn(gen, 2, 3, 16)
    with raises(TypeError, "x_kv: a numpy.ndarray; expected a torch.Tensor like x"):
        m(x, x.numpy())
    with raises(TypeError, "kv_lens: a numpy.ndarray; expected a torch.Tensor like x, or a list or tuple of ints"):
        m(x, kv_lens=np.array([3, 3]))
    # Lists and tuples are fine with either kind.
    out = attn.attention_paged(pq, kp, vp, table.tolist(), tuple(lens.tolist()))
    torch.testing.assert_close(out, attn.attention_paged(pq, kp, vp, table, lens))


UINT = [getattr(torch, f"uint{b}") for b in (16, 32, 64) if hasattr(torch, f"uint{b}")]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8] + UINT,
                         ids=str)
def test_integer_tensors_of_any_dtype(dtype):
    gen = torch.Generator().manual_seed(6)
    q, k, v = _qkv(gen, hkv=4)
    expected = attn.scaled_dot_product_attention(q, k, v, kv_lens=[10, 5])
    lens = torch.tensor([10, 5]).to(dtype)
    torch.testing.assert_close(attn.scaled_dot_product_attention(q, k, v, kv_lens=lens), expected, rtol=0, atol=0)
    pq, kp, vp, table, plens = _paged_inputs(gen)
    expected = attn.attention_paged(pq, kp, vp, table, plens)
    table = torch.where(table < 0, 0, table).to(dtype)  # unsigned dtypes have no -1
    torch.testing.assert_close(attn.attention_paged(pq, kp, vp, table, plens.to(dtype)), expected, rtol=0, atol=0)


def test_integer_tensors_out_of_range_and_of_other_dtypes():
    gen = torch.Generator().manual_seed(7)
    q, k, v = _qkv(gen, hkv=4)
    with raises(TypeError, "kv_lens: dtype bool; expected integers (any int or uint dtype)"):
        attn.scaled_dot_product_attention(q, k, v, kv_lens=torch.tensor([True, False]))
    with raises(TypeError, "kv_lens: dtype float64; expected integers"):
        attn.scaled_dot_product_attention(q, k, v, kv_lens=torch.tensor([10.0, 5.0], dtype=torch.float64))
    if hasattr(torch, "uint64"):
        big = torch.tensor([10, -1]).view(torch.uint64)  # [10, 2**64 - 1]
        with raises(ValueError, "kv_lens: kv_lens[1] = 18446744073709551615 is out of range; "
                                "expected 0 <= length < 2**63 (an int64)"):
            attn.scaled_dot_product_attention(q, k, v, kv_lens=big)
    pq, kp, vp, table, lens = _paged_inputs(gen)
    wide = table.to(torch.int64)
    wide[1, 1] = 2**40
    with raises(ValueError, "page_table: page_table[1][1] = 1099511627776 is out of range; expected a page index "
                            "that fits in int32 (-2**31 <= index < 2**31)"):
        attn.attention_paged(pq, kp, vp, wide, lens)
    with raises(TypeError, "page_table: dtype float32; expected integers"):
        attn.attention_paged(pq, kp, vp, table.float(), lens)
    with raises(TypeError, "seq_lens: dtype bool; expected integers"):
        attn.attention_paged(pq, kp, vp, table, lens > 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_attention_paged_on_tensors_matches_sdpa(dtype):
    gen = torch.Generator().manual_seed(8)
    pq, kp, vp, table, lens = _paged_inputs(gen, DTYPES[dtype])
    out, lse = attn.attention_paged(pq, kp, vp, table, lens, is_causal=True, causal_alignment="bottom_right",
                                    return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == DTYPES[dtype] and lse.dtype == torch.float32
    k = torch.stack([torch.cat([kp[max(p, 0)] for p in row], dim=1) for row in table.tolist()])
    v = torch.stack([torch.cat([vp[max(p, 0)] for p in row], dim=1) for row in table.tolist()])
    ref, ref_lse = attn.scaled_dot_product_attention(pq, k, v, is_causal=True, causal_alignment="bottom_right",
                                                     kv_lens=lens, enable_gqa=True, return_lse=True)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)
    with raises(ValueError, "query: rank 3 (shape [4, 3, 8]); expected 4 ([B, Hq, Sq, Dk])"):
        attn.attention_paged(pq[0], kp, vp, table, lens)


def test_modules_on_tensors_check_ranks_before_unpacking():
    gen = torch.Generator().manual_seed(9)
    cache = attn.KVCache(2, 8, 8)
    with raises(ValueError, "q: rank 3 (shape [4, 1, 8]); expected 4 ([1, Hq, T, Dk])"):
        cache.attend(randn(gen, 4, 1, 8))
    pcache = attn.PagedKVCache(2, 8, 4, 4)
    sid = pcache.add_sequence()
    pcache.append(sid, randn(gen, 1, 2, 3, 8), randn(gen, 1, 2, 3, 8))
    with raises(ValueError, "q: rank 2 (shape [1, 8]); expected 4 ([B, Hq, T, Dk])"):
        pcache.attend([sid], randn(gen, 1, 8))
    out = pcache.attend(torch.tensor([sid]), randn(gen, 1, 4, 1, 8))  # ids as an integer tensor
    assert isinstance(out, torch.Tensor) and out.shape == (1, 4, 1, 8)
    m = attn.MultiHeadAttention(16, 2, seed=0)
    with raises(ValueError, "x: rank 4 (shape [1, 1, 3, 16]); expected 3 ([B, S, d_model])"):
        m(randn(gen, 1, 1, 3, 16))
    with raises(ValueError, "x: rank 2 (shape [3, 16]); expected 3 ([1, T, d_model])"):
        m.forward_cached(randn(gen, 3, 16), attn.KVCache(2, 8, 8))
    y = m(randn(gen, 2, 3, 16), kv_lens=torch.tensor([3, 2], dtype=torch.uint8), is_causal=True)
    assert isinstance(y, torch.Tensor) and y.shape == (2, 3, 16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("peak, alibi", [(5.65, None), (1.0, 8.0)])
def test_backward_of_peaked_16bit_rows_within_the_rule(dtype, peak, alibi):
    # rows that peak while every |scale·q·k| stays below 8 (or that ALiBi peaks): D = dO·O from the bf16/f16 O
    # left dq at 8-16x a naive backward's error (found by an outside check); D now comes from P and dP there
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    S, D = 33, 16
    k = torch.randn(1, 1, S, D, dtype=torch.float64, generator=gen)
    k = k / k.norm(dim=-1, keepdim=True) * peak
    v = torch.rand(1, 1, S, D, dtype=torch.float64, generator=gen) * 2 - 1
    do = torch.rand(1, 1, S, D, dtype=torch.float64, generator=gen) * 2 - 1
    qb, kb, vb, dob = (x.to(dt) for x in (k, k, v, do))
    kw = {} if alibi is None else dict(alibi_slopes=torch.tensor([alibi]))

    def grads(precision):  # the formula in `precision` on the same rounded inputs, dq rounded to dt
        q = qb.to(precision).requires_grad_()
        s = q @ kb.to(precision).transpose(-1, -2) / D ** 0.5
        if alibi is not None:
            i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
            s = s - alibi * (i - j).abs().to(precision)
        (torch.softmax(s, -1) @ vb.to(precision)).backward(dob.to(precision))
        return q.grad

    ref = grads(torch.float64)
    naive = grads(torch.float32).to(dt).double()
    q = qb.clone().requires_grad_()
    attn.scaled_dot_product_attention(q, kb, vb, **kw).backward(dob)
    err, naive_err = (q.grad.double() - ref).abs().max(), (naive - ref).abs().max()
    assert err <= 2 * naive_err + 2 * torch.finfo(dt).eps * 1e-3, (err, naive_err)


# ---- how CPU tensors reach the binding (attn.functional._for_binding: a DLPack capsule each) ----------------------

def test_cpu_tensors_go_as_fresh_capsules():
    from attn.functional import _for_binding
    x = torch.randn(2, 3, requires_grad=True)
    a, b = _for_binding(x), _for_binding(x)
    assert type(a).__name__ == "PyCapsule" and a is not b  # (a capsule is read once: one per argument)


def test_views_reach_the_library_as_views():
    """Transposed, sliced and negated (neg-bit) views, and inputs that require grad, give the bits their
    materialised copies give: the capsule carries the strides, and the bits torch resolves first."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 7, 16, generator=g)
    k = torch.randn(2, 7, 4, 16, generator=g).transpose(1, 2)  # [B, H, S, D] view of a [B, S, H, D] tensor
    v = torch.randn(2, 4, 9, 32, generator=g)[:, :, :7, ::2]    # a slice with stride 2 along D
    ref = attn.scaled_dot_product_attention(q, k.contiguous(), v.contiguous())
    assert torch.equal(attn.scaled_dot_product_attention(q, k, v), ref)
    neg = torch._neg_view(-k)  # the same values, carried as a negative bit
    assert neg.is_neg()
    assert torch.equal(attn.scaled_dot_product_attention(q, neg, v), ref)
    with torch.no_grad():
        assert torch.equal(attn.scaled_dot_product_attention(q.requires_grad_(), k, v), ref)


def test_one_tensor_as_two_arguments():
    """MultiHeadAttention's self-attention passes x as both its query and key/value input: two capsules."""
    m = attn.MultiHeadAttention(32, 4, seed=3)
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(m(x), m(x, x_kv=x))


# ---- the plain call's short path (attn.functional._plain_call) -------------------------------------------------

def _short_equals_general(fn, args, kwargs, monkeypatch):
    """fn's plain call skips _check_call (replaced by a function that fails) and gives the bits, out and lse, of the
    same call through it (window=(-1, -1): unbounded, the same options, but not a plain call); nothing requires grad."""
    import attn.functional as AF
    general = fn(*args, window=(-1, -1), **kwargs)

    def no_checks(*a, **k):
        raise AssertionError("the plain call went through _check_call")
    monkeypatch.setattr(AF, "_check_call", no_checks)
    short = fn(*args, **kwargs)
    pairs = zip(short, general) if kwargs.get("return_lse") else ((short, general),)
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) and not a.requires_grad


def _counted_check_calls(monkeypatch):
    """A list that gains an entry each time a call goes through _check_call (the general path), which still runs."""
    import attn.functional as AF
    calls = []
    real = AF._check_call

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(AF, "_check_call", counting)
    return calls


def _plain_case(name, dtype):
    """(args, kwargs) of a call the short path takes: plain CPU tensors; masks bool or float32, kv_lens int32, int8
    K/V with float32 scales; no ALiBi, sinks, window or dropout."""
    g = torch.Generator().manual_seed(11)
    r = lambda *s: randn(g, *s, dtype=dtype)  # noqa: E731
    if name == "decode_gqa":
        return (r(2, 8, 1, 64), r(2, 2, 37, 64), r(2, 2, 37, 64)), {"enable_gqa": True}
    if name == "prefill_causal":
        return (r(1, 4, 45, 32), r(1, 4, 45, 32), r(1, 4, 45, 32)), {"is_causal": True}
    if name == "cross_bottom_right":
        return (r(1, 4, 7, 32), r(1, 4, 50, 32), r(1, 4, 50, 48)), {"is_causal": True,
                                                                    "causal_alignment": "bottom_right"}
    if name == "int8_cache":  # an 8-bit cache's rows with their float32 scales
        kv = [torch.randint(-127, 128, (2, 2, 21, 32), generator=g, dtype=torch.int8) for _ in range(2)]
        scales = [torch.rand(2, 2, 21, generator=g) / 64 + 1e-3 for _ in range(2)]
        return (r(2, 4, 3, 32), *kv), {"enable_gqa": True, "is_causal": True, "causal_alignment": "bottom_right",
                                        "k_scale": scales[0], "v_scale": scales[1]}
    if name == "kv_lens_int32":  # a cache's rows up to each sequence's length (flash_attn_with_kvcache's call)
        return (r(3, 4, 2, 16), r(3, 2, 30, 16), r(3, 2, 30, 24)), {
            "enable_gqa": True, "is_causal": True, "causal_alignment": "bottom_right", "return_lse": True,
            "kv_lens": torch.tensor([30, 5, 17], dtype=torch.int32)}
    if name == "bool_mask":  # a padding mask [B, 1, Sq, Skv], as the transformers integration passes one
        keep = torch.rand(2, 1, 4, 19, generator=g) > 0.3
        keep[..., 0] = True
        return (r(2, 4, 4, 16), r(2, 2, 19, 16), r(2, 2, 19, 16)), {"enable_gqa": True, "attn_mask": keep}
    if name == "float_mask":  # an additive float32 mask broadcast from [Sq, Skv], -inf where hidden
        bias = torch.rand(5, 23, generator=g) * 2 - 1
        bias[:, 7] = float("-inf")
        return (r(1, 3, 5, 16), r(1, 3, 23, 16), r(1, 3, 23, 8)), {"attn_mask": bias, "is_causal": True,
                                                                  "causal_alignment": "bottom_right"}
    if name == "scale_lse_softcap":
        return (r(2, 3, 9, 16), r(2, 3, 13, 16), r(2, 3, 13, 16)), {"scale": 0.3, "return_lse": True,
                                                                    "softcap": 5.0, "causal_alignment": "top_left"}
    raise AssertionError(name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["decode_gqa", "prefill_causal", "cross_bottom_right", "scale_lse_softcap",
                                  "int8_cache", "kv_lens_int32", "bool_mask", "float_mask"])
def test_plain_calls_take_the_short_path_with_the_general_paths_bits(dtype, case, monkeypatch):
    """A plain call skips _check_call and gives the bits (out and lse) of the same call through it."""
    args, kwargs = _plain_case(case, DTYPES[dtype])
    _short_equals_general(attn.scaled_dot_product_attention, args, kwargs, monkeypatch)


def test_calls_that_are_not_plain_take_the_general_path(monkeypatch):
    """float16 masks, autograd, other ranks, dtypes and flag types, lengths as lists or int16: through _check_call (its
    checks and their messages)."""
    calls = _counted_check_calls(monkeypatch)
    g = torch.Generator().manual_seed(3)
    q, k, v = (randn(g, 1, 2, 5, 8) for _ in range(3))
    cases = [
        lambda: attn.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(5, 5, dtype=torch.float16)),
        lambda: attn.scaled_dot_product_attention(q.clone().requires_grad_(), k, v),
        lambda: attn.scaled_dot_product_attention(q[0], k[0], v[0]),
        lambda: attn.scaled_dot_product_attention(q, k, v, kv_lens=[3]),
        lambda: attn.scaled_dot_product_attention(q, k, v, kv_lens=torch.tensor([3], dtype=torch.int16)),
        lambda: attn.scaled_dot_product_attention(q, k, v, scale=1),
        lambda: attn.scaled_dot_product_attention(q, k, v, dropout_p=0.1, seed=1),
        lambda: attn.scaled_dot_product_attention(q, k, v, causal_alignment="bottom-right"),
        lambda: attn.scaled_dot_product_attention(q, torch._neg_view(-k), v),
        lambda: attn.scaled_dot_product_attention(q, k.to(torch.int8), v.to(torch.int8), v_scale=torch.ones(1, 2, 5),
                                                  k_scale=torch.ones(1, 2, 5, requires_grad=True)),
    ]
    for n, case in enumerate(cases, 1):
        case()
        assert len(calls) == n
    with pytest.raises(ValueError, match=r"^attn_mask: requires grad"):
        attn.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(5, 5, requires_grad=True))
    with pytest.raises(TypeError, match=r"^is_causal: got int 1; expected True or False$"):
        attn.scaled_dot_product_attention(q, k, v, is_causal=1)
    with pytest.raises(TypeError, match=r"^key: dtype float64; expected the dtype of query \(float32\)$"):
        attn.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(TypeError, match=r"^v_scale: dtype float64; expected float32"):
        attn.scaled_dot_product_attention(q, k.to(torch.int8), v.to(torch.int8), k_scale=torch.ones(1, 2, 5),
                                          v_scale=torch.ones(1, 2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^key: 1 heads but query has 2"):
        attn.scaled_dot_product_attention(q, k[:, :1], v[:, :1])


@pytest.mark.parametrize("bad", ["head_dim", "heads", "kv_len", "batch"])
def test_plain_calls_give_the_general_paths_errors(bad):
    """Shapes the library refuses: the same exception and message from the short path as from the general one."""
    g = torch.Generator().manual_seed(4)
    q, k, v = randn(g, 2, 6, 3, 16), randn(g, 2, 3, 9, 16), randn(g, 2, 3, 9, 16)
    if bad == "head_dim":
        k = randn(g, 2, 3, 9, 8)
    elif bad == "heads":
        k, v = randn(g, 2, 4, 9, 16), randn(g, 2, 4, 9, 16)
    elif bad == "kv_len":
        v = randn(g, 2, 3, 8, 16)
    else:
        v = randn(g, 1, 3, 9, 16)
    errors = []
    for window in (None, (-1, -1)):
        with pytest.raises((ValueError, TypeError)) as e:
            attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, window=window)
        errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1]
    assert errors[0][1].split(":")[0] in ("query", "key", "value")


def _paged_case(name, dtype):
    """(args, kwargs) of an attention_paged call the short path takes: 3 sequences over a pool of 12 pages of 4."""
    g = torch.Generator().manual_seed(12)
    r = lambda *s, dt=dtype: randn(g, *s, dtype=dt)  # noqa: E731
    table = torch.randperm(12, generator=g).to(torch.int32).reshape(3, 4)
    lens = torch.tensor([16, 1, 9], dtype=torch.int32)
    if name == "decode":
        return (r(3, 4, 1, 16), r(12, 2, 4, 16), r(12, 2, 4, 16), table, lens), {}
    if name == "causal_lse_int64_lens":
        return (r(3, 4, 2, 16), r(12, 2, 4, 16), r(12, 2, 4, 24), table, lens.long()), {
            "is_causal": True, "causal_alignment": "bottom_right", "return_lse": True, "scale": 0.2}
    if name == "float32_pages":  # pages of another float dtype than the query
        return (r(3, 4, 1, 16), r(12, 2, 4, 16, dt=torch.float32), r(12, 2, 4, 16, dt=torch.float32), table,
                lens), {"softcap": 3.0}
    if name == "masked":  # a bool mask over the pages' keys, [B, 1, Sq, Skv] with Skv = 4 pages of 4
        keep = torch.rand(3, 1, 1, 16, generator=g) > 0.25
        keep[..., 0] = True
        return (r(3, 4, 1, 16), r(12, 2, 4, 16), r(12, 2, 4, 16), table, lens), {"attn_mask": keep}
    if name == "int8_pages":
        kv = [torch.randint(-127, 128, (12, 2, 4, 16), generator=g, dtype=torch.int8) for _ in range(2)]
        scales = [torch.rand(12, 2, 4, generator=g) / 64 + 1e-3 for _ in range(2)]
        return (r(3, 4, 1, 16), *kv, table, lens), {"k_scale": scales[0], "v_scale": scales[1], "return_lse": True}
    raise AssertionError(name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["decode", "causal_lse_int64_lens", "float32_pages", "int8_pages", "masked"])
def test_plain_paged_calls_take_the_short_path_with_the_general_paths_bits(dtype, case, monkeypatch):
    """attention_paged's plain calls skip _check_call and give the bits of the same call through it."""
    args, kwargs = _paged_case(case, DTYPES[dtype])
    _short_equals_general(attn.attention_paged, args, kwargs, monkeypatch)


def test_paged_calls_that_are_not_plain_take_the_general_path(monkeypatch):
    """An int64 page table (converted), lengths as a list, a query that requires grad: through _check_call, with the
    short path's bits; a missing seq_lens is its error."""
    args, _ = _paged_case("decode", torch.float32)
    q, kp, vp, table, lens = args
    want = attn.attention_paged(*args)
    calls = _counted_check_calls(monkeypatch)
    cases = [lambda: attn.attention_paged(q, kp, vp, table.long(), lens),
             lambda: attn.attention_paged(q, kp, vp, table, lens.tolist()),
             lambda: attn.attention_paged(q.clone().requires_grad_(), kp, vp, table, lens)]
    for n, case in enumerate(cases, 1):
        got = case()
        assert len(calls) == n and torch.equal(got, want) and not got.requires_grad
    with pytest.raises((TypeError, ValueError), match=r"^seq_lens: "):
        attn.attention_paged(q, kp, vp, table, None)


def test_py_call_overhead_script_runs():
    """bench/py_call_overhead.py (docs/benchmarks.md) at a tiny size: its table, a row per dtype and key count."""
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "py_call_overhead.py"
    run = subprocess.run([sys.executable, str(script), "--rounds", "1", "--calls", "1", "--heads", "4", "--kv-heads",
                          "2", "--head-dim", "16", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| bfloat16") or line.startswith("| float32")]
    assert len(rows) == 6 and all(len(r.split("|")) == 10 for r in rows), run.stdout
    bad = subprocess.run([sys.executable, str(script), "--kv-heads", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--kv-heads: 3 does not divide --heads 32" in bad.stderr
