"""The multi-head module, KV caches, paged attention and the cost model from Python, against fp64 NumPy."""

import numpy as np
import pytest

import attn
from reference import attention as ref_attention


def rand(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def ref_mha(m, x, x_kv=None, causal=False):
    """The module's formula in fp64, from its own weights."""
    x_kv = x if x_kv is None else x_kv
    w = {n: m.get_weight(n).astype(np.float64) for n in ("w_q", "w_k", "w_v", "w_o")}
    b, s, _ = x.shape
    skv = x_kv.shape[1]
    q = (x @ w["w_q"].T).reshape(b, s, m.heads, m.head_dim).transpose(0, 2, 1, 3)
    k = (x_kv @ w["w_k"].T).reshape(b, skv, m.kv_heads, m.head_dim).transpose(0, 2, 1, 3)
    v = (x_kv @ w["w_v"].T).reshape(b, skv, m.kv_heads, m.v_head_dim).transpose(0, 2, 1, 3)
    y, _ = ref_attention(q, k, v, causal=causal)
    return y.transpose(0, 2, 1, 3).reshape(b, s, m.heads * m.v_head_dim) @ w["w_o"].T


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_multi_head_attention_matches_fp64(heads, kv_heads):
    rng = np.random.default_rng(heads * 10 + kv_heads)
    m = attn.MultiHeadAttention(64, heads, kv_heads, seed=3)
    x, x_kv = rand(rng, 2, 7, 64), rand(rng, 2, 13, 64)
    np.testing.assert_allclose(m(x, is_causal=True), ref_mha(m, x, causal=True), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m(x, x_kv), ref_mha(m, x, x_kv), rtol=1e-4, atol=1e-5)
    assert m.parameter_count() == sum(m.get_weight(n).size for n in ("w_q", "w_k", "w_v", "w_o"))


def test_weights_round_trip_and_errors():
    m = attn.MultiHeadAttention(32, 4, bias=True)
    w = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    m.set_weight("w_q", w)
    np.testing.assert_array_equal(m.get_weight("w_q"), w)
    with pytest.raises(ValueError, match="^w_k: shape"):
        m.set_weight("w_k", w[:3])
    with pytest.raises(ValueError, match="^name"):
        m.get_weight("w_x")
    with pytest.raises(ValueError):
        attn.MultiHeadAttention(30, 4)  # d_model not divisible by heads, no head_dim given


def test_cost_model_numbers_of_the_seeds():
    assert attn.parameter_count(512, 8) == 1_048_576
    assert attn.kv_cache_bytes(80, 64, 128, 64000, dtype="f16") == 167_772_160_000
    assert round(attn.kv_cache_bytes(80, 8, 128, 64000, dtype="f16") / 1e9, 2) == 20.97
    # the 8-bit cache: a byte per element and an fp32 scale per token and KV head, for K and for V
    assert attn.kv_cache_bytes(2, 8, 128, 1000, batch=3, dtype="int8") == 2 * 2 * 8 * 1000 * 3 * (128 + 4)
    c = attn.attention_cost(4096, 8192, 64)
    assert c["dominant"] == "QKV projections"
    assert c["crossover_seq"] == pytest.approx(2 * 8192)
    qk = next(s for s in c["stages"] if s["name"] == "Q K^T")
    assert qk["flops"] == 2 * 4096 * 4096 * 8192 and qk["seed_ops"] == 4096 * 4096 * 8192
    with pytest.raises(ValueError, match="^dtype"):
        attn.kv_cache_bytes(1, 1, 1, 1, dtype="f64")


def test_kv_cache_decode_equals_recompute():
    rng = np.random.default_rng(1)
    hq, hkv, d, steps = 4, 2, 16, 9
    cache = attn.KVCache(hkv, d, capacity=steps)
    ks, vs = rand(rng, 1, hkv, steps, d), rand(rng, 1, hkv, steps, d)
    for t in range(steps):
        cache.append(ks[:, :, t:t + 1], vs[:, :, t:t + 1])
        q = rand(rng, 1, hq, 1, d)
        out = cache.attend(q)
        ref, _ = ref_attention(q, ks[:, :, :t + 1], vs[:, :, :t + 1], causal=True, align="bottom_right")
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert len(cache) == steps
    with pytest.raises(ValueError):
        cache.append(ks[:, :, :1], vs[:, :, :1])  # past the capacity


def test_paged_cache_batched_decode_and_page_reuse():
    rng = np.random.default_rng(2)
    hq, hkv, d, page = 4, 1, 8, 3
    cache = attn.PagedKVCache(hkv, d, page_size=page, num_pages=20)
    lengths = [5, 11, 1]
    ids, data = [], []
    for n in lengths:
        sid = cache.add_sequence()
        k, v = rand(rng, 1, hkv, n, d), rand(rng, 1, hkv, n, d)
        cache.append(sid, k, v)
        ids.append(sid)
        data.append((k, v))
    q = rand(rng, len(ids), hq, 1, d)
    out = cache.attend(ids, q)
    for b, (k, v) in enumerate(data):
        ref, _ = ref_attention(q[b:b + 1], k, v, causal=True, align="bottom_right")
        np.testing.assert_allclose(out[b:b + 1], ref, rtol=1e-5, atol=1e-6)
    free = cache.free_pages
    cache.remove_sequence(ids[1])
    assert cache.free_pages == free + 4
    with pytest.raises(ValueError):
        cache.length(ids[1])


def test_attention_paged_matches_contiguous():
    rng = np.random.default_rng(3)
    b, hq, hkv, d, page, maxp = 2, 4, 2, 8, 4, 3
    k, v = rand(rng, b, hkv, page * maxp, d), rand(rng, b, hkv, page * maxp, d)
    table = np.array([[5, 0, 2], [1, 4, 3]], dtype=np.int32)
    k_pages, v_pages = np.full((6, hkv, page, d), np.nan, np.float32), np.full((6, hkv, page, d), np.nan, np.float32)
    for bi in range(b):
        for n in range(maxp):
            k_pages[table[bi, n]] = k[bi, :, n * page:(n + 1) * page]
            v_pages[table[bi, n]] = v[bi, :, n * page:(n + 1) * page]
    lens = np.array([12, 7], dtype=np.int64)
    q = rand(rng, b, hq, 2, d)
    out = attn.attention_paged(q, k_pages, v_pages, table, lens, is_causal=True, causal_alignment="bottom_right")
    ref, _ = ref_attention(q, k, v, causal=True, align="bottom_right", kv_lens=lens)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    bad = table.copy()
    bad[1, 1] = 9
    with pytest.raises(ValueError, match="^page_table"):
        attn.attention_paged(q, k_pages, v_pages, bad, lens)
