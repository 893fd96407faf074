"""attn on PyTorch CPU tensors, against torch.nn.functional.scaled_dot_product_attention and the fp64 reference.

Skipped when torch is not installed (`make test` does not install it; `pip install torch` in the venv
to run these)."""

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
    with pytest.raises(TypeError, match="^kv_lens: dtype float32; expected int32 or int64"):
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
        attn._attn.attention(q, k, k, buf.view(1, 2, 4, 8), None, None, None, None, "none", -1, -1, "top_left")
