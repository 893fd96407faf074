"""attn.attention_paged_cascade: a shared prefix attended once for the batch, each sequence's own keys separately,
merged by their LSE. Checked against attn.attention_paged over each sequence's concatenated pages (prefix pages,
then its own) and against the fp64 reference of tests/python/reference.py, NumPy float32 and bfloat16."""
import re

import ml_dtypes
import numpy as np
import pytest

import attn
from reference import check_attention


def raises(exc, message):
    return pytest.raises(exc, match="^" + re.escape(message))


def build(rng, dtype, b=5, hq=8, hkv=2, sq=1, d=32, page=8, prefix_pages=3, own=(3, 0, 17, 8, 1)):
    """A pool with the prefix's pages once and each sequence's own pages, shuffled; the per-sequence tables of the
    concatenated keys; and the same keys gathered into contiguous K/V for the reference."""
    own_pages = [(n + page - 1) // page for n in own]
    pages = prefix_pages + sum(own_pages) + 2
    perm = rng.permutation(pages).astype(np.int32)
    prefix_table = perm[:prefix_pages]
    width = max(max(own_pages), 1)
    table = np.full((b, width), perm[-1], np.int32)
    at = prefix_pages
    for s, n in enumerate(own_pages):
        table[s, :n] = perm[at:at + n]
        at += n
    full = np.concatenate([np.tile(prefix_table, (b, 1)), table], axis=1)
    q = rng.uniform(-1, 1, (b, hq, sq, d)).astype(dtype)
    kp = rng.uniform(-1, 1, (pages, hkv, page, d)).astype(dtype)
    vp = rng.uniform(-1, 1, (pages, hkv, page, d)).astype(dtype)
    return q, kp, vp, prefix_table, prefix_pages * page, table, np.array(own, np.int64), full


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_cascade_equals_paged_attention_over_the_concatenated_keys(dtype, causal):
    rng = np.random.default_rng(7)
    sq = 2 if causal else 1
    q, kp, vp, prefix_table, prefix_len, table, own, full = build(rng, dtype, sq=sq, own=(3, 1, 17, 8, 1))
    out, lse = attn.attention_paged_cascade(q, kp, vp, prefix_table, prefix_len, table, own, is_causal=causal,
                                            return_lse=True)
    ref, ref_lse = attn.attention_paged(q, kp, vp, full, own + prefix_len, is_causal=causal,
                                        causal_alignment="bottom_right" if causal else None, return_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape
    tol = 1e-5 if dtype == np.float32 else 2 ** -7
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5, rtol=1e-5)
    # and against the fp64 reference over the gathered keys
    page = kp.shape[2]
    b, hkv, d = q.shape[0], kp.shape[1], q.shape[3]
    longest = int((own + prefix_len).max())
    k = np.zeros((b, hkv, longest, d), np.float32)
    v = np.zeros((b, hkv, longest, d), np.float32)
    for s in range(b):
        for j in range(prefix_len + int(own[s])):
            pg = full[s, j // page]
            k[s, :, j], v[s, :, j] = kp[pg, :, j % page], vp[pg, :, j % page]
    check_attention(out, lse, "float32" if dtype == np.float32 else "bfloat16", q=q, k=k, v=v, causal=causal,
                    align="bottom_right", kv_lens=own + prefix_len)


def test_cascade_refuses_what_depends_on_positions_and_names_it():
    rng = np.random.default_rng(3)
    q, kp, vp, prefix_table, prefix_len, table, own, _ = build(rng, np.float32)
    with raises(ValueError, "prefix_len: = -1; expected >= 0"):
        attn.attention_paged_cascade(q, kp, vp, prefix_table, -1, table, own)
    with raises(ValueError, "prefix_table: of 3 pages; expected at least 4"):
        attn.attention_paged_cascade(q, kp, vp, prefix_table, prefix_len + 1, table, own)
    with raises(TypeError, "prefix_len: got float; expected an int >= 0"):
        attn.attention_paged_cascade(q, kp, vp, prefix_table, 1.5, table, own)
    q2 = np.concatenate([q, q], axis=2)  # Sq = 2: with causal, sequence 1 (no own keys) cannot see the prefix
    with raises(ValueError, "seq_lens: [1] = 0 with causal bottom_right and Sq = 2; expected >= Sq - 1"):
        attn.attention_paged_cascade(q2, kp, vp, prefix_table, prefix_len, table, own, is_causal=True)


def test_paged_results_do_not_require_grad():
    # no backward for attention_paged and its cascade form: their results do not require grad, whatever the inputs
    # (a torch op without an autograd formula gave outputs that did, and a backward that failed inside torch)
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 4, 1, 16, requires_grad=True)
    kp = torch.randn(6, 2, 4, 16, requires_grad=True)
    vp = torch.randn(6, 2, 4, 16)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([10, 7], dtype=torch.int32)
    assert not attn.attention_paged(q, kp, vp, table, lens).requires_grad
    out, lse = attn.attention_paged_cascade(q, kp, vp, torch.tensor([0], dtype=torch.int32), 2, table, lens,
                                            return_lse=True)
    assert not out.requires_grad and not lse.requires_grad
