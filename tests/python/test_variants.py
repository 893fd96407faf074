"""Score variants (softcap, ALiBi slopes, sinks, dropout) through the Python package: NumPy and torch inputs against the
fp64 reference (tests/python/reference.py, written from the definitions), the paged entry point, the autograd
path (gradients for query, key, value and sinks against torch's autograd of the formula in float64), and the
errors that name the argument."""

import numpy as np
import pytest

import attn
from reference import check_attention, dropout_factors, philox4x32_10, uniform


def _inputs(rng, b=2, hq=4, hkv=2, sq=37, skv=53, d=32, dtype=np.float32, amp=1.0):
    q = uniform(rng, (b, hq, sq, d), dtype, amp)
    k = uniform(rng, (b, hkv, skv, d), dtype, amp)
    v = uniform(rng, (b, hkv, skv, d), dtype)
    return q, k, v


VARIANTS = [
    dict(softcap=2.0),
    dict(softcap=30.0),
    dict(alibi_slopes="heads"),
    dict(alibi_slopes="batch"),
    dict(sinks=True),
    dict(softcap=5.0, alibi_slopes="batch", sinks=True),
    dict(dropout_p=0.17),
    dict(dropout_p=0.5, softcap=5.0, alibi_slopes="heads", sinks=True),
]


def _variant_args(rng, variant, b, hq):
    kw = {}
    if "softcap" in variant:
        kw["softcap"] = variant["softcap"]
    if "dropout_p" in variant:
        kw["dropout_p"], kw["seed"] = variant["dropout_p"], 2**63 + 12345
    if variant.get("alibi_slopes") == "heads":
        kw["alibi_slopes"] = (2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)).astype(np.float32)
    elif variant.get("alibi_slopes") == "batch":
        kw["alibi_slopes"] = rng.uniform(0.01, 0.5, size=(b, hq)).astype(np.float32)
    if variant.get("sinks"):
        sinks = rng.uniform(-2, 3, size=hq).astype(np.float32)
        sinks[0] = -np.inf  # no sink for head 0
        kw["sinks"] = sinks
    return kw


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "_".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_numpy_variants_match_fp64(variant, causal, dtype_name):
    rng = np.random.default_rng(7)
    dtype = np.float32
    if dtype_name == "bfloat16":
        import ml_dtypes
        dtype = ml_dtypes.bfloat16
    q, k, v = _inputs(rng, dtype=dtype, amp=2.0)
    kw = _variant_args(rng, variant, 2, 4)
    lens = [53, 20]
    out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=causal, causal_alignment="bottom_right",
                                                 enable_gqa=True, kv_lens=lens, return_lse=True, **kw)
    check_attention(out, lse, dtype_name, q=q, k=k, v=v, causal=causal, align="bottom_right", kv_lens=lens, **kw)


def test_sinks_on_a_row_without_keys_give_zero_and_the_sink():
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, b=1, hq=2, hkv=2, sq=3, skv=5)
    sinks = np.array([1.5, -np.inf], dtype=np.float32)
    out, lse = attn.scaled_dot_product_attention(q, k, v, kv_lens=[0], sinks=sinks, return_lse=True)
    assert np.all(out == 0)
    assert np.all(lse[0, 0] == np.float32(1.5)) and np.all(lse[0, 1] == -np.inf)


def test_paged_variants_match_contiguous():
    rng = np.random.default_rng(11)
    q, k, v = _inputs(rng, b=2, hq=4, hkv=2, sq=1, skv=40)
    kw = _variant_args(rng, dict(softcap=3.0, alibi_slopes="batch", sinks=True), 2, 4)
    page = 8
    pages = 2 * 40 // page
    perm = rng.permutation(pages)
    k_pages = np.empty((pages, 2, page, 32), np.float32)
    v_pages = np.empty((pages, 2, page, 32), np.float32)
    table = perm.reshape(2, 40 // page).astype(np.int32)
    for b in range(2):
        for n in range(40 // page):
            k_pages[table[b, n]] = k[b, :, n * page:(n + 1) * page]
            v_pages[table[b, n]] = v[b, :, n * page:(n + 1) * page]
    lens = [40, 17]
    got, got_lse = attn.attention_paged(q, k_pages, v_pages, table, lens, return_lse=True, **kw)
    want, want_lse = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, kv_lens=lens, return_lse=True, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_lse, want_lse, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, name", [
    (dict(softcap=-1.0), "softcap"),
    (dict(softcap=float("nan")), "softcap"),
    (dict(alibi_slopes=np.ones(3, np.float32)), "alibi_slopes"),
    (dict(alibi_slopes=np.array([1, np.inf, 1, 1], np.float32)), "alibi_slopes"),
    (dict(sinks=np.ones((4, 1), np.float32)), "sinks"),
    (dict(sinks=np.array([0, np.nan, 0, 0], np.float32)), "sinks"),
])
def test_bad_variants_name_the_argument(kwargs, name):
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, b=1, hq=4, hkv=4, sq=3, skv=5)
    with pytest.raises(ValueError, match=f"^{name}: "):
        attn.scaled_dot_product_attention(q, k, v, **kwargs)


def test_variant_types_are_checked():
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, b=1, hq=2, hkv=2, sq=3, skv=5)
    with pytest.raises(TypeError, match="^softcap: "):
        attn.scaled_dot_product_attention(q, k, v, softcap="2")
    with pytest.raises(TypeError, match="^sinks: "):
        attn.scaled_dot_product_attention(q, k, v, sinks=np.zeros(2, np.int32))


# ---- torch: values and the autograd path -------------------------------------------------------------------


def _torch_formula(torch, q, k, v, softcap, slopes, sinks, causal):
    """The variants written out in torch (float64), gpt-oss style for the sinks (a column in the softmax)."""
    b, hq, sq, d = q.shape
    skv = k.shape[2]
    s = q @ k.transpose(-1, -2) / d ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    if slopes is not None:
        s = s - slopes.reshape(1, hq, 1, 1) * (i + skv - sq - j).abs()
    if causal:
        s = s.masked_fill(j > i + skv - sq, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    if sinks is not None:
        p = p[..., :-1]
    return p @ v


@pytest.mark.parametrize("causal", [False, True])
def test_torch_autograd_with_variants(causal):
    torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch comparison tests need it")
    gen = torch.Generator().manual_seed(0)
    b, hq, sq, skv, d = 2, 3, 19, 23, 16
    q, k, v = (torch.rand(b, hq, s, d, generator=gen, dtype=torch.float64) * 2 - 1 for s in (sq, skv, skv))
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)
    sinks = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    dout = torch.rand(b, hq, sq, d, generator=gen, dtype=torch.float64) - 0.5

    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    want = _torch_formula(torch, *leaves[:3], 4.0, slopes, leaves[3], causal)
    want.backward(dout)

    ours = [x.float().clone().requires_grad_() for x in (q, k, v, sinks)]
    out = attn.scaled_dot_product_attention(ours[0], ours[1], ours[2], is_causal=causal, causal_alignment="bottom_right",
                                            softcap=4.0, alibi_slopes=slopes.float(), sinks=ours[3])
    out.backward(dout.float())
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-5)
    for name, a, w in zip(("query", "key", "value", "sinks"), ours, leaves):
        torch.testing.assert_close(a.grad.double(), w.grad, rtol=1e-4, atol=1e-5, msg=f"grad of {name}")


def test_torch_slopes_that_require_grad_are_refused():
    torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch comparison tests need it")
    q = torch.rand(1, 2, 3, 4)
    with pytest.raises(ValueError, match="^alibi_slopes: requires grad"):
        attn.scaled_dot_product_attention(q, q, q, alibi_slopes=torch.ones(2, requires_grad=True))


# ---- dropout ------------------------------------------------------------------------------------------------


def test_reference_philox_matches_the_published_vectors():
    """The tests' own Philox (a third implementation, after the library's and the C++ reference's)."""
    kats = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
            ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
            ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
             (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in kats:
        assert tuple(int(w) for w in philox4x32_10(counter, key)) == want


def test_dropout_keeps_the_lse_and_drops_what_the_seed_says():
    rng = np.random.default_rng(21)
    q, k, v = _inputs(rng, b=2, hq=4, hkv=2, sq=17, skv=40)
    plain, plain_lse = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)
    out, lse = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True, return_lse=True, seed=99)
    np.testing.assert_allclose(lse, plain_lse, rtol=1e-6)  # (the dropout path rounds the scores its own way)
    again = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True, seed=99)
    np.testing.assert_array_equal(out, again)
    other = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True, seed=100)
    assert not np.array_equal(out, other)
    # seed=None draws from NumPy's global generator: np.random.seed makes it reproducible
    np.random.seed(5)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    np.random.seed(5)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(dropout_p=1.0), ValueError, "dropout_p"),
    (dict(dropout_p=-0.5), ValueError, "dropout_p"),
    (dict(dropout_p=float("nan")), ValueError, "dropout_p"),
    (dict(dropout_p="0.1"), TypeError, "dropout_p"),
    (dict(dropout_p=True), TypeError, "dropout_p"),
    (dict(dropout_p=0.1, seed=-1), ValueError, "seed"),
    (dict(dropout_p=0.1, seed=2**64), ValueError, "seed"),
    (dict(dropout_p=0.1, seed=1.5), TypeError, "seed"),
])
def test_bad_dropout_names_the_argument(kwargs, error, name):
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, b=1, hq=2, hkv=2, sq=3, skv=5)
    with pytest.raises(error, match=f"^{name}: "):
        attn.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_autograd_with_dropout(causal):
    """Gradients through the dropped weights: torch's autograd of the formula (float64) with the same mask."""
    torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch comparison tests need it")
    gen = torch.Generator().manual_seed(1)
    b, hq, sq, skv, d, p, seed = 2, 3, 19, 23, 16, 0.25, 31337
    q, k, v = (torch.rand(b, hq, s, d, generator=gen, dtype=torch.float64) * 2 - 1 for s in (sq, skv, skv))
    sinks = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    dout = torch.rand(b, hq, sq, d, generator=gen, dtype=torch.float64) - 0.5
    z = torch.from_numpy(dropout_factors(p, seed, b, hq, sq, skv))

    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    s = leaves[0] @ leaves[1].transpose(-1, -2) / d ** 0.5
    if causal:
        i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
        s = s.masked_fill(j > i + skv - sq, float("-inf"))
    s = torch.cat([s, leaves[3].reshape(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    want = (torch.softmax(s, dim=-1)[..., :-1] * z) @ leaves[2]
    want.backward(dout)

    ours = [x.float().clone().requires_grad_() for x in (q, k, v, sinks)]
    out = attn.scaled_dot_product_attention(ours[0], ours[1], ours[2], dropout_p=p, is_causal=causal,
                                            causal_alignment="bottom_right", sinks=ours[3], seed=seed)
    out.backward(dout.float())
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-5)
    for name, a, w in zip(("query", "key", "value", "sinks"), ours, leaves):
        torch.testing.assert_close(a.grad.double(), w.grad, rtol=1e-4, atol=1e-5, msg=f"grad of {name}")
    # seed=None draws from torch's default generator: torch.manual_seed makes it reproducible
    torch.manual_seed(3)
    a = attn.scaled_dot_product_attention(ours[0], ours[1], ours[2], dropout_p=p)
    torch.manual_seed(3)
    b = attn.scaled_dot_product_attention(ours[0], ours[1], ours[2], dropout_p=p)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
