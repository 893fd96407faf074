"""attn.flash: FlashAttention's Python API (flash_attn 2.x) on torch CPU tensors, against FlashAttention's
semantics written out in torch float64 (bottom-right causal and windows, softcap, ALiBi, GQA, seqlen_q !=
seqlen_k, rows without keys: out 0 and lse +inf), gradients against torch's autograd of the same, the packed
and varlen forms against the plain one, and the KV-cache form (in-place append, pages) against the plain one."""

import math

import pytest

import attn

torch = pytest.importorskip("torch", reason="torch is not installed; the FlashAttention API tests need it")


def _reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None, dropout_p=0.0,
               keep=None, return_p=False):
    """FlashAttention's attention_ref, float64, [B, S, H, D] in and out; lse [B, H, Sq] (+inf for empty rows).
    keep [B, H, Sq, Sk] bool: dropout's keep mask (the weights it drops are zeroed, the kept ones scaled by
    1 / (1 - dropout_p)); return_p adds the softmax weights [B, H, Sq, Sk] before dropout."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    k = k.repeat_interleave(h // hk, dim=1)
    v = v.repeat_interleave(h // hk, dim=1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + sk - sq
    if alibi is not None:
        slopes = alibi.double().reshape(-1 if alibi.dim() == 2 else 1, h)[:, :, None, None] if alibi.dim() == 2 \
            else alibi.double()[None, :, None, None]
        s = s - slopes * (diag - j).abs()
    hidden = torch.zeros(sq, sk, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        hidden |= j < diag - left
    if right >= 0:
        hidden |= j > diag + right
    s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    dropped = p if keep is None else p.masked_fill(~keep, 0.0) / (1 - dropout_p)
    out = (dropped @ v).transpose(1, 2)
    lse = torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)
    return (out, lse, p) if return_p else (out, lse)


def _qkv(b, sq, sk, h, hk, d, gen, dtype=torch.float32):
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=gen).to(dtype)
    v = torch.randn(b, sk, hk, d, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (17, 0), (5, 9)])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("seqlens", [(113, 203), (128, 217), (203, 113), (1, 239), (108, 256)])
def test_flash_attn_func_matches_flashattention_semantics(causal, window, softcap, alibi, seqlens):
    gen = torch.Generator().manual_seed(hash((causal, window, softcap, alibi, seqlens)) % 2**31)
    sq, sk = seqlens
    b, h, hk, d = 2, 4, 2, 40
    q, k, v = _qkv(b, sq, sk, h, hk, d, gen)
    slopes = torch.rand(b, h, generator=gen) * 0.3 if alibi else None
    out, lse, probs = attn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                           alibi_slopes=slopes, return_attn_probs=True)
    want, want_lse, want_p = _reference(q, k, v, causal, window, softcap, slopes, return_p=True)
    assert out.shape == (b, sq, h, d) and lse.shape == (b, h, sq) and probs.shape == (b, h, sq, sk)
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(probs.double(), want_p, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_gradients(causal):
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(2, 37, 53, 4, 1, 32, gen)
    slopes = torch.tensor([0.1, 0.2, 0.3, 0.4])
    leaves = [x.double().clone().requires_grad_() for x in (q, k, v)]
    want, _ = _reference(*leaves, causal=causal, window=(20, -1), softcap=3.0, alibi=slopes)
    dout = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    want.backward(dout)
    ours = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attn.flash_attn_func(*ours, causal=causal, window_size=(20, -1), softcap=3.0, alibi_slopes=slopes,
                               deterministic=True)
    out.backward(dout.float())
    for name, a, w in zip("qkv", ours, leaves):
        torch.testing.assert_close(a.grad.double(), w.grad, rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


def test_packed_forms_and_bf16():
    gen = torch.Generator().manual_seed(4)
    q, k, v = _qkv(2, 33, 33, 4, 4, 64, gen, torch.bfloat16)
    plain = attn.flash_attn_func(q, k, v, causal=True)
    qkv = torch.stack([q, k, v], dim=2)
    torch.testing.assert_close(attn.flash_attn_qkvpacked_func(qkv, causal=True), plain, rtol=0, atol=0)
    torch.testing.assert_close(attn.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), causal=True), plain,
                               rtol=0, atol=0)
    want, _ = _reference(q, k, v, causal=True)
    torch.testing.assert_close(plain.double(), want, rtol=2e-2, atol=2e-2)


def test_varlen_equals_one_call_per_sequence():
    gen = torch.Generator().manual_seed(5)
    lens_q, lens_k = [5, 0, 17, 1], [9, 4, 17, 30]
    h, hk, d = 4, 2, 16
    q = torch.randn(sum(lens_q), h, d, generator=gen)
    k = torch.randn(sum(lens_k), hk, d, generator=gen)
    v = torch.randn(sum(lens_k), hk, d, generator=gen)
    cu_q = torch.tensor([0, 5, 5, 22, 23], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 13, 30, 60], dtype=torch.int32)
    slopes = torch.rand(4, h, generator=gen)
    out, lse, _ = attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 30, causal=True, softcap=2.0,
                                              alibi_slopes=slopes, return_attn_probs=True)
    assert out.shape == (23, h, d) and lse.shape == (h, 23)
    for b in range(4):
        qs, ks, vs = q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]]
        want, want_lse, _ = attn.flash_attn_func(qs[None], ks[None], vs[None], causal=True, softcap=2.0,
                                                 alibi_slopes=slopes[b], return_attn_probs=True)
        torch.testing.assert_close(out[cu_q[b]:cu_q[b + 1]], want[0], rtol=0, atol=0)
        torch.testing.assert_close(lse[:, cu_q[b]:cu_q[b + 1]], want_lse[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="^cu_seqlens_q: "):
        attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 16, 30)  # a sequence longer than max_seqlen_q


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_over_pages_equals_contiguous(causal):
    """flash_attn_varlen_func with block_table (chunked prefill over a paged cache): each sequence's keys in its
    pages (a shuffled pool), the same result as the packed contiguous keys."""
    gen = torch.Generator().manual_seed(11)
    h, hk, d, block = 4, 2, 32, 8
    lens_q, lens_k = [3, 1, 7], [9, 0, 23]
    cu_q = torch.tensor([0, 3, 4, 11], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 9, 32], dtype=torch.int32)
    q = torch.randn(11, h, d, generator=gen)
    k = torch.randn(32, hk, d, generator=gen)
    v = torch.randn(32, hk, d, generator=gen)
    max_blocks = 3
    pool = len(lens_k) * max_blocks
    table = torch.randperm(pool, generator=gen).reshape(len(lens_k), max_blocks).to(torch.int32)
    k_pages = torch.randn(pool, block, hk, d, generator=gen)  # unused slots hold noise, never read
    v_pages = torch.randn(pool, block, hk, d, generator=gen)
    for b, n in enumerate(lens_k):
        for j in range(n):
            k_pages[table[b, j // block], j % block] = k[cu_k[b] + j]
            v_pages[table[b, j // block], j % block] = v[cu_k[b] + j]
    want, want_lse, _ = attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 23, causal=causal, return_attn_probs=True)
    out, lse, _ = attn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 7, 23, causal=causal,
                                              return_attn_probs=True, block_table=table)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="^cu_seqlens_k: "):
        attn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, torch.tensor([0, 9, 9, 40], dtype=torch.int32), 7, 40,
                                    block_table=table)  # 31 keys in 3 pages of 8
    with pytest.raises(ValueError, match="^dropout_p: "):
        attn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 7, 23, dropout_p=0.1, block_table=table)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_appends_in_place_and_attends(paged):
    gen = torch.Generator().manual_seed(6)
    b, h, hk, d, cap, block = 3, 4, 2, 32, 64, 16
    cache_lens = torch.tensor([10, 0, 40], dtype=torch.int32)
    k_full = torch.randn(b, cap, hk, d, generator=gen)
    v_full = torch.randn(b, cap, hk, d, generator=gen)
    q = torch.randn(b, 2, h, d, generator=gen)
    k_new = torch.randn(b, 2, hk, d, generator=gen)
    v_new = torch.randn(b, 2, hk, d, generator=gen)
    if paged:
        perm = torch.randperm(b * cap // block, generator=gen)
        table = perm.reshape(b, cap // block).to(torch.int32)
        k_cache = torch.empty(b * cap // block, block, hk, d)
        v_cache = torch.empty_like(k_cache)
        for s in range(b):
            for n in range(cap // block):
                k_cache[table[s, n]] = k_full[s, n * block:(n + 1) * block]
                v_cache[table[s, n]] = v_full[s, n * block:(n + 1) * block]
    else:
        table, k_cache, v_cache = None, k_full.clone(), v_full.clone()
    out, lse = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_lens,
                                            block_table=table, causal=True, window_size=(20, -1),
                                            return_softmax_lse=True)
    for s in range(b):
        n = int(cache_lens[s])
        ks = torch.cat([k_full[s, :n], k_new[s]])[None]
        vs = torch.cat([v_full[s, :n], v_new[s]])[None]
        want, want_lse, _ = attn.flash_attn_func(q[s:s + 1], ks, vs, causal=True, window_size=(20, -1),
                                                 return_attn_probs=True)
        torch.testing.assert_close(out[s:s + 1], want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[s:s + 1], want_lse, rtol=1e-5, atol=1e-6)
        # the new keys were written after the cached ones
        for t in range(2):
            pos = n + t
            got = k_cache[table[s, pos // block], pos % block] if paged else k_cache[s, pos]
            torch.testing.assert_close(got, k_new[s, t], rtol=0, atol=0)
    with pytest.raises(ValueError, match="^rotary_cos: "):  # rotary turns the new keys: k and v are needed
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=torch.ones(8, 4), rotary_sin=torch.ones(8, 4),
                                     cache_seqlens=cache_lens, block_table=table)
    with pytest.raises(ValueError, match="^cache_seqlens: "):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cap - 1, block_table=table)


def test_dropout_through_flash_attn_func():
    """dropout_p as FlashAttention's: the output is unbiased (mean over many seeds close to the no-dropout one),
    the lse is dropout's, torch.manual_seed makes it reproducible, and gradients flow."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = _qkv(1, 16, 32, 2, 2, 16, gen)
    plain, plain_lse, _ = attn.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.manual_seed(0)
    outs = [attn.flash_attn_func(q, k, v, dropout_p=0.17) for _ in range(400)]
    mean = torch.stack(outs).mean(0)
    assert (mean - plain).abs().max() < 0.1
    assert not torch.equal(outs[0], outs[1])
    torch.manual_seed(1)
    a, lse, _ = attn.flash_attn_func(q, k, v, dropout_p=0.17, return_attn_probs=True)
    torch.manual_seed(1)
    torch.testing.assert_close(attn.flash_attn_func(q, k, v, dropout_p=0.17), a, rtol=0, atol=0)
    torch.testing.assert_close(lse, plain_lse, rtol=1e-6, atol=1e-6)
    qg = q.clone().requires_grad_()
    attn.flash_attn_func(qg, k, v, dropout_p=0.5).sum().backward()
    assert torch.isfinite(qg.grad).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("seqlens", [(113, 203), (128, 217), (1, 239), (256, 512), (108, 256)])
def test_dropout_as_flashattention_tests_it(causal, softcap, alibi, seqlens):
    """FlashAttention's test_flash_attn_output with dropout_p = 0.17: the dropout mask read from S_dmask
    (return_attn_probs; >= 0 = kept), the output and gradients against attention_ref with that mask, the
    weights against the reference's, and the dropped fraction (over the positions a row may see) within 0.01
    of dropout_p, FlashAttention's own bound."""
    dropout_p = 0.17
    gen = torch.Generator().manual_seed(hash(("dropout", causal, softcap, alibi, seqlens)) % 2**31)
    sq, sk = seqlens
    b, h, hk, d = 4, 6, 2, 32
    q, k, v = (x.requires_grad_() for x in _qkv(b, sq, sk, h, hk, d, gen))
    slopes = torch.rand(b, h, generator=gen) * 0.3 if alibi else None
    torch.manual_seed(hash(seqlens) % 2**31)
    out, lse, s_dmask = attn.flash_attn_func(q, k, v, dropout_p, causal=causal, softcap=softcap, alibi_slopes=slopes,
                                             return_attn_probs=True)
    keep = s_dmask >= 0
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want, want_lse, want_p = _reference(*leaves, causal=causal, softcap=softcap, alibi=slopes, dropout_p=dropout_p,
                                        keep=keep, return_p=True)
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(s_dmask.abs().double(), want_p, rtol=2e-5, atol=2e-6)
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
    assert keep[:, :, ~visible].all(), "a key a row cannot see is never reported dropped"
    fraction = (~keep).sum().item() / (visible.sum().item() * b * h)
    assert abs(fraction - dropout_p) <= 0.01 or visible.sum().item() * b * h < 2000, fraction
    dout = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), dout.float())
    expected = torch.autograd.grad(want, leaves, dout)
    for name, g, e in zip("qkv", got, expected):
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4, msg=lambda m: f"d{name}: {m}")


def _rotary_reference(x, cos, sin, positions, interleaved):
    """Rotary embedding written independently of attn.flash._rotary: each pair (a, b) of dims turned by the angle
    whose cosine and sine sit at the token's position, in float64, element by element."""
    out = x.double().clone()
    half = cos.shape[1]
    for bb in range(x.shape[0]):
        for t in range(x.shape[1]):
            p = int(positions[bb][t])
            for i in range(half):
                a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                c, s_ = float(cos[p, i]), float(sin[p, i])
                xa, xb = x[bb, t, :, a].double(), x[bb, t, :, b].double()
                out[bb, t, :, a] = xa * c - xb * s_
                out[bb, t, :, b] = xa * s_ + xb * c
    return out.to(x.dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rotary_fraction", [0.5, 1.0])
def test_kvcache_rotary_batch_idx_and_leftpad(interleaved, causal, rotary_fraction):
    """FlashAttention's rotary_cos/rotary_sin, cache_batch_idx and cache_leftpad: the new keys are turned at
    positions cache_seqlens + t and written to row cache_batch_idx[b] from cache_seqlens[b]; the queries are turned
    at cache_seqlens + t (causal) or all at cache_seqlens (not causal); each sequence attends its row's keys
    [cache_leftpad, cache_seqlens + seqlen_new), causal aligned to those."""
    gen = torch.Generator().manual_seed(21)
    b, h, hk, d, cap, sq, new = 3, 4, 2, 32, 40, 2, 2
    rotary_dim = int(d * rotary_fraction)
    angles = torch.rand(cap + 4, rotary_dim // 2, generator=gen, dtype=torch.float64) * 6.3
    cos, sin = angles.cos().float(), angles.sin().float()
    cache_lens = torch.tensor([10, 3, 25], dtype=torch.int32)
    leftpad = torch.tensor([4, 0, 25], dtype=torch.int32)  # the last sequence: only its new keys
    rows = torch.tensor([2, 0, 4], dtype=torch.int32)  # a cache of 5 rows, sequences in rows 2, 0, 4
    k_full = torch.randn(5, cap, hk, d, generator=gen)
    v_full = torch.randn(5, cap, hk, d, generator=gen)
    q = torch.randn(b, sq, h, d, generator=gen)
    k_new = torch.randn(b, new, hk, d, generator=gen)
    v_new = torch.randn(b, new, hk, d, generator=gen)
    k_cache, v_cache = k_full.clone(), v_full.clone()
    out, lse = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                            cache_seqlens=cache_lens, cache_batch_idx=rows, cache_leftpad=leftpad,
                                            causal=causal, rotary_interleaved=interleaved, return_softmax_lse=True)
    at = [[int(cache_lens[s]) + t for t in range(new)] for s in range(b)]
    k_ro = _rotary_reference(k_new, cos, sin, at, interleaved)
    q_at = [[int(cache_lens[s]) + (t if causal else 0) for t in range(sq)] for s in range(b)]
    q_ro = _rotary_reference(q, cos, sin, q_at, interleaved)
    for s in range(b):
        r, n, a = int(rows[s]), int(cache_lens[s]), int(leftpad[s])
        ks = torch.cat([k_full[r, a:n], k_ro[s]])[None]
        vs = torch.cat([v_full[r, a:n], v_new[s]])[None]
        want, want_lse, _ = attn.flash_attn_func(q_ro[s:s + 1], ks, vs, causal=causal, return_attn_probs=True)
        torch.testing.assert_close(out[s:s + 1], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse[s:s + 1], want_lse, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_cache[r, n:n + new], k_ro[s], rtol=1e-6, atol=1e-6)  # written turned
        torch.testing.assert_close(v_cache[r, n:n + new], v_new[s], rtol=0, atol=0)
    untouched = [i for i in range(5) if i not in rows.tolist()]
    torch.testing.assert_close(k_cache[untouched], k_full[untouched], rtol=0, atol=0)


def test_kvcache_options_refused_clearly():
    gen = torch.Generator().manual_seed(22)
    q = torch.randn(2, 1, 2, 16, generator=gen)
    k_cache = torch.randn(2, 8, 2, 16, generator=gen)
    v_cache = torch.randn(2, 8, 2, 16, generator=gen)
    k_new = torch.randn(2, 1, 2, 16, generator=gen)
    cos = torch.ones(8, 4)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    call = attn.flash_attn_with_kvcache
    with pytest.raises(ValueError, match="^rotary_cos: "):  # only one of the pair
        call(q, k_cache, v_cache, k_new, k_new, rotary_cos=cos, cache_seqlens=lens)
    with pytest.raises(ValueError, match="^rotary_cos: "):  # rotary_dim 24 > headdim 16
        call(q, k_cache, v_cache, k_new, k_new, rotary_cos=torch.ones(8, 12), rotary_sin=torch.ones(8, 12),
             cache_seqlens=lens)
    with pytest.raises(ValueError, match="^rotary_cos: "):  # position 5 needs 6 rows
        call(q, k_cache, v_cache, k_new, k_new, rotary_cos=cos[:5], rotary_sin=cos[:5], cache_seqlens=lens)
    with pytest.raises(TypeError, match="^rotary_cos: torch.complex64"):  # (the imaginary part would be dropped)
        call(q, k_cache, v_cache, k_new, k_new, rotary_cos=cos.to(torch.complex64), rotary_sin=cos, cache_seqlens=lens)
    with pytest.raises(TypeError, match="^rotary_sin: torch.int64"):
        call(q, k_cache, v_cache, k_new, k_new, rotary_cos=cos, rotary_sin=cos.long(), cache_seqlens=lens)
    with pytest.raises(TypeError, match="^rotary_interleaved: "):
        call(q, k_cache, v_cache, k_new, k_new, rotary_cos=cos, rotary_sin=cos, rotary_interleaved="no",
             cache_seqlens=lens)
    with pytest.raises(ValueError, match="^cache_batch_idx: "):
        call(q, k_cache, v_cache, cache_seqlens=lens, cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="^cache_leftpad: "):
        call(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=torch.tensor([4, 0], dtype=torch.int32))
    with pytest.raises(TypeError, match="^cache_leftpad: "):
        call(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=[0, 0])


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_bad_input_writes_nothing(paged):
    """k and v checked against the cache before the append (no broadcast, no cast), the pages a sequence appends
    to checked against the pool, and a call that an argument only the attention checks makes fail leaves the caches
    as they were: the rows it appended are put back."""
    gen = torch.Generator().manual_seed(23)
    q = torch.randn(2, 1, 4, 16, generator=gen)
    if paged:
        k_cache, v_cache = torch.randn(6, 8, 2, 16, generator=gen), torch.randn(6, 8, 2, 16, generator=gen)
        table = dict(block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    else:
        k_cache, v_cache = torch.randn(2, 16, 2, 16, generator=gen), torch.randn(2, 16, 2, 16, generator=gen)
        table = {}
    k_new, v_new = torch.randn(2, 1, 2, 16, generator=gen), torch.randn(2, 1, 2, 16, generator=gen)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    k0, v0 = k_cache.clone(), v_cache.clone()
    call = attn.flash_attn_with_kvcache
    bad = [
        (ValueError, "^k: ", dict(k=k_new[:, :, :1], v=v_new)),  # one head, would broadcast to both
        (ValueError, "^k: ", dict(k=k_new[..., :1], v=v_new)),  # head dim 1, would broadcast
        (ValueError, "^v: ", dict(k=k_new, v=torch.randn(3, 1, 2, 16, generator=gen))),  # batch 3 for 2
        (TypeError, "^k: ", dict(k=k_new.double(), v=v_new)),  # would be cast
        (TypeError, "^cache_seqlens: ", dict(k=k_new, v=v_new, cache_seqlens=lens.float())),
        (TypeError, "^cache_seqlens: ", dict(k=k_new, v=v_new, cache_seqlens=True)),
        # refused by the attention, after the append: the appended rows are put back
        (ValueError, "^alibi_slopes: ", dict(k=k_new, v=v_new, alibi_slopes=torch.rand(3))),
        (ValueError, "^softcap: ", dict(k=k_new, v=v_new, softcap=-1.0)),
    ]
    if not paged:  # (attention_paged takes a bf16 q over an fp32 cache)
        bad.append((TypeError, "^k_cache: ", dict(q=q.bfloat16(), k=k_new, v=v_new)))
    if paged:
        for page in (-1, 6):  # sequence 1 appends at key 9: its page 1
            bad.append((ValueError, "^block_table: ", dict(k=k_new, v=v_new, block_table=torch.tensor(
                [[0, 1], [2, page]], dtype=torch.int32))))
    for error, match, args in bad:
        args = {"q": q, "cache_seqlens": lens, **table, **args}
        with pytest.raises(error, match=match):
            call(args.pop("q"), k_cache, v_cache, **args)
        assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0), f"{match}: the cache changed"
    call(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, **table)  # and a good call still appends
    for b, n in enumerate(lens.tolist()):  # at slot n of sequence b, and nowhere else
        where = (int(table["block_table"][b, n // 8]), n % 8) if paged else (b, n)
        assert torch.equal(k_cache[where], k_new[b, 0]) and torch.equal(v_cache[where], v_new[b, 0])
        k0[where], v0[where] = k_new[b, 0], v_new[b, 0]
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


def test_attn_probs_without_keys():
    """return_attn_probs with seqlen_k = 0: out 0, lse +inf and an empty S_dmask [batch, nheads, seqlen_q, 0]."""
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 0, 2, 8)
    out, lse, probs = attn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(q)) and torch.isinf(lse).all() and (lse > 0).all()
    assert probs.shape == (1, 2, 3, 0)


def test_errors_name_the_flash_parameters():
    # attn's own names (query, key, scale, k_pages) become the FlashAttention function's, and shapes in a message
    # are marked as attn's [batch, nheads, seqlen, headdim] order
    q, k, v = (torch.randn(2, 10, 4, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"^k: head dim 8; .*\[batch, nheads, seqlen, headdim\] order\)$"):
        attn.flash.flash_attn_func(q, k[..., :8], v)
    with pytest.raises(ValueError, match=r"^softmax_scale: "):
        attn.flash.flash_attn_func(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ValueError, match=r"^k_cache: head dim 16"):
        attn.flash.flash_attn_with_kvcache(q[:, :1, :, :8], torch.randn(2, 20, 4, 16), torch.randn(2, 20, 4, 16),
                                           cache_seqlens=5)
    with pytest.raises(TypeError, match=r"^qkv: "):
        attn.flash.flash_attn_qkvpacked_func(torch.randn(2, 10, 3, 4, 16, dtype=torch.float64))


@pytest.mark.parametrize("layout", ["rows", "batch_idx", "pages", "shared_page"])
def test_kvcache_append_writes_each_slot_as_in_order(layout):
    """The append of seqlen_new = 3 keys per sequence: each new row at its slot, nothing else changed, as writing them
    one by one in batch order does (shared_page: two sequences' block tables name one page, so their slots repeat
    and the later sequence's rows stand); a call the attention refuses puts every slot back."""
    gen = torch.Generator().manual_seed(31)
    b, new, hk, d = 3, 3, 2, 8
    q = torch.randn(b, 2, 4, d, generator=gen)
    k_new, v_new = torch.randn(b, new, hk, d, generator=gen), torch.randn(b, new, hk, d, generator=gen)
    lens = torch.tensor([0, 5, 2], dtype=torch.int32)
    extra = {}
    if layout in ("pages", "shared_page"):
        k_cache, v_cache = torch.randn(7, 4, hk, d, generator=gen), torch.randn(7, 4, hk, d, generator=gen)
        table = [[6, 0], [3, 1], [2, 5]] if layout == "pages" else [[6, 0], [3, 1], [6, 5]]
        extra["block_table"] = torch.tensor(table, dtype=torch.int32)
        slot = lambda s, n: (table[s][n // 4], n % 4)  # noqa: E731
    else:
        n_rows = b if layout == "rows" else 4  # (without cache_batch_idx, one cache row per sequence)
        k_cache, v_cache = (torch.randn(n_rows, 12, hk, d, generator=gen) for _ in range(2))
        rows = [0, 1, 2] if layout == "rows" else [3, 0, 2]
        if layout == "batch_idx":
            extra["cache_batch_idx"] = torch.tensor(rows, dtype=torch.int32)
        slot = lambda s, n: (rows[s], n)  # noqa: E731
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for s in range(b):
        for t in range(new):
            want_k[slot(s, int(lens[s]) + t)] = k_new[s, t]
            want_v[slot(s, int(lens[s]) + t)] = v_new[s, t]
    k0, v0 = k_cache.clone(), v_cache.clone()
    with pytest.raises(ValueError, match="^alibi_slopes: "):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True,
                                     alibi_slopes=torch.rand(5), **extra)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)
    attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True, **extra)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
