"""KV caches stored in bfloat16, float16, int8 (a scale per token and KV head) and int4 (a scale per 32 values of a
row): decode matches fp64 attention over the exact values within what the storage costs, and an int8 or int4 cache
refuses what it cannot hold."""

import numpy as np
import pytest

import attn
from reference import uniform


def causal_last_rows(q, k, v, t):
    """fp64 attention of the last t queries of q [1, H, S, D] over all keys (bottom-right causal), GQA by repeat."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q[:, :, -t:] @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    n = k.shape[2]
    rows = np.arange(n - t, n)[:, None]
    s = np.where(np.arange(n)[None, :] <= rows, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


# max |out - exact| / max |exact| each storage may cost (measured about half of these; f32 is rounding only)
BOUND = {"float32": 1e-5, "bfloat16": 0.01, "float16": 0.002, "int8": 0.02, "int4": 0.3}


@pytest.mark.parametrize("dtype", list(BOUND))
@pytest.mark.parametrize("paged", [False, True])
def test_decode_within_the_storage_error(dtype, paged):
    rng = np.random.default_rng(11)
    hq, hkv, d, n = 8, 2, 64, 45
    q, k, v = uniform(rng, (1, hq, n, d), amp=2.0), uniform(rng, (1, hkv, n, d), amp=2.0), uniform(rng, (1, hkv, n, d))
    if paged:
        cache = attn.PagedKVCache(hkv, d, 4, 16, dtype=dtype)
        seq = cache.add_sequence()
        append = lambda a, b: cache.append(seq, a, b)
        attend = lambda x: cache.attend([seq], x)
    else:
        cache = attn.KVCache(hkv, d, n, dtype=dtype)
        append, attend = cache.append, cache.attend
    assert cache.dtype == {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "i8", "int4": "i4"}[dtype]
    worst = 0.0
    for t0 in range(0, n, 3):
        t1 = min(n, t0 + 3)
        append(k[:, :, t0:t1], v[:, :, t0:t1])
        out = attend(np.ascontiguousarray(q[:, :, t0:t1]))
        exact = causal_last_rows(q[:, :, :t1], k[:, :, :t1], v[:, :, :t1], t1 - t0)
        assert np.isfinite(out).all()
        worst = max(worst, float(np.abs(out - exact).max() / np.abs(exact).max()))
    assert worst <= BOUND[dtype], worst


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantised_cache_refuses_non_finite_values_and_unknown_dtypes(dtype):
    cache = attn.KVCache(2, 8, 4, dtype=dtype)
    k = np.ones((1, 2, 1, 8), np.float32)
    v = k.copy()
    v[0, 1, 0, 3] = np.nan
    with pytest.raises(ValueError, match="^v: value \\[0, 1, 0, 3\\] is not finite"):
        cache.append(k, v)
    assert len(cache) == 0
    with pytest.raises(ValueError, match="^dtype: 'int2'"):
        attn.KVCache(2, 8, 4, dtype="int2")


def test_int4_cache_bytes():
    """Half a byte per value (a row rounded up to whole bytes) and an fp32 scale per 32 values of a row."""
    assert attn.kv_cache_bytes(32, 8, 128, 4096, dtype="int4") == 2 * 32 * 8 * 4096 * (64 + 4 * 4)
    assert attn.kv_cache_bytes(1, 1, 33, 1, dtype="int4") == 2 * (17 + 4 * 2)
    assert attn.kv_cache_bytes(1, 1, 128, 1, dtype="int4") < attn.kv_cache_bytes(1, 1, 128, 1, dtype="int8") / 1.6


# ---- int8 K/V as inputs: scaled_dot_product_attention and attention_paged with k_scale / v_scale ----------------

def quantise(x):
    """Per-row symmetric int8 of x [..., S, D] (the caches' rule): (int8 rows, float32 scales [..., S])."""
    scale = (np.abs(x).max(-1) / 127).astype(np.float32)
    safe = np.where(scale > 0, scale, 1).astype(np.float32)
    return np.clip(np.rint(x / safe[..., None]), -127, 127).astype(np.int8), scale


def exact_attention(q, k, v, causal=False):
    """fp64 attention of q [B, Hq, Sq, D] over k, v [B, Hkv, Skv, D] (GQA by repeat; causal bottom-right)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("sq,causal", [(1, False), (7, True), (113, False)])
def test_sdpa_int8_kv_matches_fp64_on_the_dequantised_values(sq, causal):
    """The 8-bit rows are exact inputs: the result is fp32 attention over scale · int8, to fp32 rounding."""
    rng = np.random.default_rng(sq)
    b, hq, hkv, skv, d = 2, 4, 2, 203, 32
    q = uniform(rng, (b, hq, sq, d), amp=2.0)
    k8, ks = quantise(uniform(rng, (b, hkv, skv, d), amp=2.0))
    v8, vs = quantise(uniform(rng, (b, hkv, skv, d)))
    out = attn.scaled_dot_product_attention(q, k8, v8, is_causal=causal, enable_gqa=True,
                                            causal_alignment="bottom_right", k_scale=ks, v_scale=vs)
    assert out.dtype == np.float32 and out.shape == (b, hq, sq, d)
    exact = exact_attention(q, k8 * ks[..., None].astype(np.float64), v8 * vs[..., None].astype(np.float64), causal)
    assert np.isfinite(out).all()
    assert np.abs(out - exact).max() <= 1e-5 * np.abs(exact).max()


def test_sdpa_int8_kv_unbatched_and_torch_give_the_same_bits():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q = uniform(rng, (4, 9, 16))
    k8, ks = quantise(uniform(rng, (2, 33, 16)))
    v8, vs = quantise(uniform(rng, (2, 33, 16)))
    a = attn.scaled_dot_product_attention(q, k8, v8, enable_gqa=True, k_scale=ks, v_scale=vs)
    t = attn.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k8, v8)), enable_gqa=True,
                                          k_scale=torch.from_numpy(ks), v_scale=torch.from_numpy(vs))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (4, 9, 16)
    assert np.array_equal(t.numpy(), a)
    batched = attn.scaled_dot_product_attention(q[None], k8[None], v8[None], enable_gqa=True, k_scale=ks[None],
                                                v_scale=vs[None])
    assert np.array_equal(batched[0], a)
    # dropout: the same seed drops the same weights for either kind
    a = attn.scaled_dot_product_attention(q, k8, v8, dropout_p=0.3, seed=7, enable_gqa=True, k_scale=ks, v_scale=vs)
    t = attn.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k8, v8)), dropout_p=0.3, seed=7,
                                          enable_gqa=True, k_scale=torch.from_numpy(ks), v_scale=torch.from_numpy(vs))
    assert np.array_equal(t.numpy(), a)


def test_int8_kv_errors_name_the_parameter():
    rng = np.random.default_rng(1)
    q = uniform(rng, (1, 2, 3, 8))
    k8, ks = quantise(uniform(rng, (1, 2, 5, 8)))
    v8, vs = quantise(uniform(rng, (1, 2, 5, 8)))
    sdpa = attn.scaled_dot_product_attention
    with pytest.raises(ValueError, match="^k_scale: is missing"):
        sdpa(q, k8, v8, v_scale=vs)
    with pytest.raises(TypeError, match="^value: dtype float32; expected int8 like key"):
        sdpa(q, k8, v8.astype(np.float32), k_scale=ks, v_scale=vs)
    with pytest.raises(TypeError, match=r"^k_scale: is set for float32 key; expected it only with int8 \(or packed "
                                        r"4-bit uint8\) key and value"):
        sdpa(q, k8.astype(np.float32), v8.astype(np.float32), k_scale=ks)
    with pytest.raises(TypeError, match="^v_scale: dtype float16; expected float32"):
        sdpa(q, k8, v8, k_scale=ks, v_scale=vs.astype(np.float16))
    with pytest.raises(ValueError, match="^k_scale: shape"):
        sdpa(q, k8, v8, k_scale=ks[:, :, :4], v_scale=vs)
    with pytest.raises(TypeError, match="^query: dtype int8"):
        sdpa(k8, k8, v8, k_scale=ks, v_scale=vs)


# ---- 4-bit K/V as inputs: uint8 arrays of packed values, a scale per 32 values of a row -------------------------

def quantise4(x):
    """x [..., S, D] (D even) as the 4-bit caches store it: a scale per block of 32 values of a row (max |x| / 7),
    q = round(x / scale) in [-7, 7], packed two per byte (value 2i in the low nibble of byte i, 2i + 1 in the high
    one, each as q + 8). Returns (uint8 [..., S, D / 2], float32 scales [..., S, ceil(D / 32)], the exact values)."""
    d = x.shape[-1]
    nb = -(-d // 32)
    padded = np.zeros(x.shape[:-1] + (nb * 32,), np.float32)
    padded[..., :d] = x
    blocks = padded.reshape(x.shape[:-1] + (nb, 32))
    scale = (np.abs(blocks).max(-1) / 7).astype(np.float32)
    safe = np.where(scale > 0, scale, 1).astype(np.float32)
    q = np.clip(np.rint(blocks / safe[..., None]), -7, 7).astype(np.int64).reshape(padded.shape)[..., :d]
    nibbles = (q + 8).astype(np.uint8)
    packed = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8)
    exact = q * np.repeat(scale.astype(np.float64), 32, axis=-1)[..., :d]
    return packed, scale, exact


@pytest.mark.parametrize("sq,causal,d", [(1, False, 64), (7, True, 40), (113, False, 80)])
def test_sdpa_int4_kv_matches_fp64_on_the_dequantised_values(sq, causal, d):
    """Packed 4-bit rows (uint8) with their block scales are exact inputs: the result is fp32 attention over
    scale · q, to fp32 rounding; NumPy and torch give the same bits."""
    rng = np.random.default_rng(40 + sq)
    b, hq, hkv, skv = 2, 4, 2, 203
    q = uniform(rng, (b, hq, sq, d), amp=2.0)
    k4, ks, k_exact = quantise4(uniform(rng, (b, hkv, skv, d), amp=2.0))
    v4, vs, v_exact = quantise4(uniform(rng, (b, hkv, skv, d)))
    out = attn.scaled_dot_product_attention(q, k4, v4, is_causal=causal, enable_gqa=True,
                                            causal_alignment="bottom_right", k_scale=ks, v_scale=vs)
    assert out.dtype == np.float32 and out.shape == (b, hq, sq, d)
    exact = exact_attention(q, k_exact, v_exact, causal)
    assert np.isfinite(out).all()
    assert np.abs(out - exact).max() <= 1e-5 * np.abs(exact).max()
    unbatched = attn.scaled_dot_product_attention(q[1], k4[1], v4[1], is_causal=causal, enable_gqa=True,
                                                  causal_alignment="bottom_right", k_scale=ks[1], v_scale=vs[1])
    assert np.array_equal(unbatched, out[1])
    torch = pytest.importorskip("torch")
    t = attn.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k4, v4)), is_causal=causal,
                                          enable_gqa=True, causal_alignment="bottom_right",
                                          k_scale=torch.from_numpy(ks), v_scale=torch.from_numpy(vs))
    assert np.array_equal(t.numpy(), out)


@pytest.mark.parametrize("bits,d", [(8, 16), (4, 48)])
def test_attention_paged_quantised_matches_the_contiguous_call(bits, d):
    """8-bit (int8, a scale per row) and 4-bit (packed uint8, a scale per 32 values) pages: each sequence's result
    is the contiguous call's over its rows gathered from its pages, bit for bit."""
    rng = np.random.default_rng(bits + d)
    quant = quantise if bits == 8 else (lambda x: quantise4(x)[:2])
    hq, hkv, page, pages = 4, 2, 4, 12
    kq, ks = quant(uniform(rng, (pages, hkv, page, d), amp=2.0))
    vq, vs = quant(uniform(rng, (pages, hkv, page, d)))
    table = np.array([[3, 7, 1], [10, 0, 5]], np.int32)
    lens = np.array([11, 9], np.int32)
    q = uniform(rng, (2, hq, 1, d))
    out = attn.attention_paged(q, kq, vq, table, lens, k_scale=ks, v_scale=vs)
    assert out.shape == (2, hq, 1, d)
    for b in range(2):
        rows = lambda x: np.concatenate([x[p].swapaxes(0, 1) for p in table[b]])[:lens[b]].swapaxes(0, 1)[None]
        want = attn.scaled_dot_product_attention(q[b:b + 1], rows(kq), rows(vq), enable_gqa=True, k_scale=rows(ks),
                                                 v_scale=rows(vs))
        assert np.array_equal(out[b:b + 1], want)


def test_int4_kv_errors_name_the_parameter():
    rng = np.random.default_rng(2)
    q = uniform(rng, (1, 2, 3, 64))
    k4, ks, _ = quantise4(uniform(rng, (1, 2, 5, 64)))
    v4, vs, _ = quantise4(uniform(rng, (1, 2, 5, 64)))
    sdpa = attn.scaled_dot_product_attention
    with pytest.raises(TypeError, match="^value: dtype int8; expected uint8 like key"):
        sdpa(q, k4, v4.view(np.int8), k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="^k_scale: "):  # one scale per row is the 8-bit cache's layout
        sdpa(q, k4, v4, k_scale=ks[..., 0], v_scale=vs)
    with pytest.raises(ValueError, match="^key: stride 2 along its last dimension"):
        wide = np.zeros(k4.shape[:-1] + (64,), np.uint8)
        wide[..., ::2] = k4
        sdpa(q, wide[..., ::2], v4, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="^key: "):  # 2 x 16 bytes = 32 values for a query of 64
        sdpa(q, k4[..., :16], v4, k_scale=ks[..., :1], v_scale=vs)
