"""The oracle for the Python tests: attention written out in NumPy, materialising the scores, in fp64
(and in fp32 as the yardstick of the tolerance rule), plus random inputs and the agreement check."""

import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al., SC 2011) over arrays: counter = 4 arrays of 32-bit words, key = 2 ints."""
    m32 = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
        lo_hi0 = np.uint64(0xD2511F53) * c0
        lo_hi1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (lo_hi1 >> np.uint64(32)) ^ c1 ^ k0, lo_hi1 & m32, (lo_hi0 >> np.uint64(32)) ^ c3 ^ k1, lo_hi0 & m32
    return c0, c1, c2, c3


def dropout_factors(dropout_p, seed, b, h, sq, skv):
    """attn's dropout mask as factors z [B, H, Sq, Skv] (1 / (1 - p) kept, 0 dropped): pair (b, h, i, j)
    draws word j % 4 of Philox at counter (j // 4, i, h, b), key (seed low 32 bits, high 32 bits), and drops
    when the draw is below round(p · 2^32)."""
    bb, hh, ii, jj = np.meshgrid(np.arange(b), np.arange(h), np.arange(sq), np.arange(skv), indexing="ij")
    words = philox4x32_10((jj // 4, ii, hh, bb), (seed & 0xFFFFFFFF, seed >> 32))
    draw = np.choose(jj % 4, words)
    threshold = max(1, int(np.floor(dropout_p * 2.0**32 + 0.5)))
    return np.where(draw >= threshold, 1.0 / (1.0 - dropout_p), 0.0)


def attention(q, k, v, *, mask=None, causal=False, align="top_left", scale=None, kv_lens=None, window=None,
              softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, seed=0, dtype=np.float64):
    """softmax(scale q kᵀ + mask) v over [B, H, S, D] inputs (any float dtype, read as fp64, computed in
    `dtype`). GQA by repeating key/value heads. Returns (out, lse); a row without keys gets 0 and -inf.
    Score variants as attn defines them: softcap·tanh(x / softcap) of the scaled scores, then
    −slope·|i + Skv_b − Sq − j| (alibi_slopes [H] or [B, H]), then the mask; sinks [H] join each row's
    denominator (a row without keys then gets 0 and lse = sink); dropout_p > 0 multiplies the softmax
    weights by dropout_factors(dropout_p, seed, ...) before they meet v (lse is unchanged)."""
    q, k, v = (np.asarray(x).astype(np.float64).astype(dtype) for x in (q, k, v))
    b, hq, sq, dk = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=1)
    v = np.repeat(v, hq // hkv, axis=1)
    s = (q @ np.swapaxes(k, -1, -2)) * dtype(1.0 / np.sqrt(dk) if scale is None else scale)
    if softcap:
        s = dtype(softcap) * np.tanh(s / dtype(softcap))

    lens = np.full(b, skv) if kv_lens is None else np.asarray(kv_lens)
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = np.broadcast_to(slopes if slopes.ndim == 2 else slopes[None], (b, hq))[:, :, None, None]
        dist = np.stack([np.abs(i + lens[bi] - sq - j) for bi in range(b)])[:, None]  # [B, 1, Sq, Skv]
        s = s - (slopes * dist).astype(dtype)
    allowed = np.ones((b, 1, sq, skv), dtype=bool)
    for bi in range(b):
        diag = i + (lens[bi] - sq if align == "bottom_right" else 0)
        ok = j < lens[bi]
        if causal:
            ok = ok & (j <= diag)
        if window is not None:
            left, right = (-1 if w is None else w for w in window)
            if left >= 0:
                ok = ok & (j >= diag - left)
            if right >= 0:
                ok = ok & (j <= diag + right)
        allowed[bi, 0] = ok
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == bool:
            allowed = allowed & m
        else:
            s = s + m.astype(np.float64).astype(dtype)
    s = np.where(np.broadcast_to(allowed, s.shape), s, -np.inf)

    sink = (np.full(hq, -np.inf) if sinks is None else np.asarray(sinks, dtype=np.float64)).astype(dtype)
    sink = np.broadcast_to(sink[None, :, None, None], (b, hq, sq, 1))
    peak = np.maximum(s.max(axis=-1, keepdims=True), sink)
    peak = np.where(np.isfinite(peak), peak, 0)
    p = np.exp(s - peak)
    total = p.sum(axis=-1, keepdims=True) + np.exp(sink - peak)
    has_keys = total > 0
    if dropout_p > 0:
        p = p * dropout_factors(dropout_p, seed, b, hq, sq, skv).astype(dtype)
    out = np.where(has_keys, (p @ v) / np.where(has_keys, total, 1), 0)
    with np.errstate(divide="ignore"):
        lse = np.where(has_keys[..., 0], peak[..., 0] + np.log(np.where(has_keys[..., 0], total[..., 0], 1)), -np.inf)
    return out.astype(np.float64), lse.astype(np.float64)


def uniform(rng, shape, dtype=np.float32, amp=1.0):
    """Uniform in [-amp, amp], never exactly zero, rounded to dtype."""
    x = rng.uniform(-amp, amp, size=shape)
    x[x == 0] = amp / 3
    return x.astype(dtype)


def assert_agrees(name, got, ref, naive, atol):
    """The project's rule: max|got - ref| <= 2 max|naive - ref| + atol, and where the fp64 reference is
    not finite (an LSE of -inf) the result must equal it exactly; NaN where the reference is finite fails."""
    got = np.asarray(got).astype(np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}; expected {ref.shape}"
    finite = np.isfinite(ref)
    assert np.array_equal(got[~finite], ref[~finite]), f"{name}: non-finite reference values not matched"
    assert np.isfinite(got[finite]).all(), f"{name}: non-finite values where the reference is finite"
    err = np.abs(got[finite] - ref[finite]).max(initial=0.0)
    naive = np.asarray(naive).astype(np.float64)
    usable = finite & np.isfinite(naive)
    naive_err = np.abs(naive[usable] - ref[usable]).max(initial=0.0)
    assert err <= 2 * naive_err + atol, f"{name}: max|got-ref| = {err:.3g} > 2 * {naive_err:.3g} + {atol:.3g}"


def check_attention(out, lse, dtype_name, **kwargs):
    """Checks (out, lse) from attn against the fp64 reference with the fp32 one as the yardstick."""
    ref_out, ref_lse = attention(**kwargs)
    naive_out, naive_lse = attention(**kwargs, dtype=np.float32)
    u = UNIT_ROUNDOFF[dtype_name]
    if dtype_name == "bfloat16":
        import ml_dtypes  # only bfloat16 NumPy arrays need it, and they come from it

        round_to = ml_dtypes.bfloat16
    else:
        round_to = np.dtype(dtype_name)
    naive_out = naive_out.astype(np.float32).astype(round_to)
    # Rounding noise: 2 units in the last place of the largest output, as the C++ tests allow; 4 for
    # float32, where the yardstick is NumPy's fp32 (BLAS products, pairwise sums), more accurate than a
    # naive loop, so its own error under-states what fp32 arithmetic costs.
    ulps = 4 if dtype_name == "float32" else 2
    assert_agrees("out", out, ref_out, naive_out, ulps * u * max(np.abs(ref_out).max(initial=0.0), 1e-3))
    if lse is not None:
        finite = ref_lse[np.isfinite(ref_lse)]
        assert_agrees("lse", lse, ref_lse, naive_lse, 8 * 2.0**-24 * max(np.abs(finite).max(initial=0.0), 1.0))
