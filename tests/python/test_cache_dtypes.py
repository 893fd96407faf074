"""KV caches stored in bfloat16, float16 and int8 (a scale per token and KV head): decode matches fp64 attention
over the exact values within what the storage costs, and an int8 cache refuses what it cannot hold."""

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
BOUND = {"float32": 1e-5, "bfloat16": 0.01, "float16": 0.002, "int8": 0.02}


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
    assert cache.dtype == {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "i8"}[dtype]
    worst = 0.0
    for t0 in range(0, n, 3):
        t1 = min(n, t0 + 3)
        append(k[:, :, t0:t1], v[:, :, t0:t1])
        out = attend(np.ascontiguousarray(q[:, :, t0:t1]))
        exact = causal_last_rows(q[:, :, :t1], k[:, :, :t1], v[:, :, :t1], t1 - t0)
        assert np.isfinite(out).all()
        worst = max(worst, float(np.abs(out - exact).max() / np.abs(exact).max()))
    assert worst <= BOUND[dtype], worst


def test_int8_cache_refuses_non_finite_values_and_unknown_dtypes():
    cache = attn.KVCache(2, 8, 4, dtype="int8")
    k = np.ones((1, 2, 1, 8), np.float32)
    v = k.copy()
    v[0, 1, 0, 3] = np.nan
    with pytest.raises(ValueError, match="^v: value \\[0, 1, 0, 3\\] is not finite"):
        cache.append(k, v)
    assert len(cache) == 0
    with pytest.raises(ValueError, match="^dtype: 'int4'"):
        attn.KVCache(2, 8, 4, dtype="int4")
