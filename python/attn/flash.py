"""FlashAttention's Python API (flash_attn 2.x) over attn: code written for FlashAttention runs unchanged on torch CPU
tensors, and on CUDA tensors through attn's CUDA backend.

    from attn.flash import flash_attn_func          # instead of: from flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)     # q [batch, seqlen, heads, dim], k, v [batch, seqlen_k, heads_k, dim]

The same argument names, layouts ([batch, seqlen, nheads, headdim]; packed [total, nheads, headdim] with
cu_seqlens for the varlen form; [num_blocks, block_size, nheads_k, headdim] pages with block_table) and
semantics as FlashAttention:
- causal and window_size are aligned bottom-right (query i sits on key i + seqlen_k - seqlen_q); window_size
  (left, right), -1 = unbounded;
- softcap caps the scaled scores (softcap·tanh(s / softcap)); alibi_slopes [nheads] or [batch, nheads] (fp32)
  add -slope·|i + seqlen_k - seqlen_q - j|;
- dropout_p drops softmax weights (attn's Philox stream, seeded from torch's default generator: the same
  distribution as FlashAttention's, not the same mask);
- the LSE is [batch, nheads, seqlen_q] ([nheads, total_q] for varlen), natural log, +inf for a row that sees no
  key (FlashAttention's convention; attn's own functions give -inf), whose output is 0.
Gradients flow through flash_attn_func, the packed forms and flash_attn_varlen_func (attn's deterministic
backward; `deterministic` is accepted and always true). flash_attn_with_kvcache appends k and v to the cache in
place and has no backward, as in FlashAttention.
flash_attn_with_kvcache takes FlashAttention's rotary embedding (rotary_cos / rotary_sin, interleaved or
half-split, rotary_dim <= headdim), cache_batch_idx and cache_leftpad; flash_attn_varlen_func takes block_table
(paged keys and values, forward only). return_attn_probs gives
FlashAttention's S_dmask from flash_attn_func and the packed forms (the softmax weights, negated where dropout
dropped them, so that FlashAttention's tests can read the dropout mask), None from the varlen form.
"""

import re

from .functional import _rename_error, _torch, attention_paged, scaled_dot_product_attention

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "get_mla_metadata", "flash_mla_with_kvcache"]


_SHAPE_NOTE = " (shapes in attn's [batch, nheads, seqlen, headdim] order)"
_SHAPE = re.compile(r"\[\d+(, \d+){2,}\]")  # a shape of three or more sizes in a message


def _flash_names(**names):
    """Errors raised inside a FlashAttention-API function name its own parameters: the head of the message (attn's
    name: query, key, value, scale, k_pages, ...) renamed by `names` (plus query -> q, key -> k, value -> v and
    scale -> softmax_scale unless given), and shapes in it marked as attn's [batch, nheads, seqlen, headdim]
    order, the transpose of the caller's."""
    table = dict(query="q", key="k", value="v", scale="softmax_scale")
    table.update(names)

    def wrap(fn):
        import functools

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (ValueError, TypeError) as e:
                _rename_error(e, table, _SHAPE_NOTE if _SHAPE.search(str(e)) else "")
                raise
        return call
    return wrap


def _tensor(name, x, rank, layout):
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: got {type(x).__name__}; expected a torch.Tensor {layout}")
    if x.dim() != rank:
        raise ValueError(f"{name}: rank {x.dim()} (shape {list(x.shape)}); expected rank {rank} {layout}")
    return x


def _window(window_size):
    if window_size is None:
        return None
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size: {window_size!r}; expected a pair (left, right) of ints, -1 = unbounded") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size: {window_size!r}; expected each side -1 (unbounded) or >= 0")
    return None if left == -1 and right == -1 else (left, right)


def _flash_lse(lse):
    """attn's -inf for a row without keys as FlashAttention's +inf."""
    torch = _torch()
    return torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)


def _attend(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, seed=None, kv_lens=None):
    """[B, S, H, D] inputs through attn.scaled_dot_product_attention; returns (out [B, S, H, D], lse [B, H, S])."""
    out, lse = scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, is_causal=bool(causal),
        scale=softmax_scale, enable_gqa=True, causal_alignment="bottom_right", kv_lens=kv_lens,
        window=_window(window_size), return_lse=True, softcap=softcap, alibi_slopes=alibi_slopes, seed=seed)
    return out.transpose(1, 2).contiguous(), lse


@_flash_names()
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [batch, seqlen_q, nheads, headdim], k and v [batch, seqlen_k, nheads_k, headdim] (nheads % nheads_k == 0):
    out [batch, seqlen_q, nheads, headdim]; with return_attn_probs, (out, softmax_lse [batch, nheads, seqlen_q],
    S_dmask [batch, nheads, seqlen_q, seqlen_k]: the weights, negated where dropout dropped them; see
    _attn_probs)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(name, x, 4, "[batch, seqlen, nheads, headdim]")
    seed = None
    if return_attn_probs and dropout_p and dropout_p > 0:  # one seed for the output and the probabilities
        lo, hi = _torch().randint(0, 2**32, (2,), dtype=_torch().int64).tolist()
        seed = lo | hi << 32
    out, lse = _attend(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, seed=seed)
    if not return_attn_probs:
        return out
    probs = _attn_probs(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, seed)
    return out, _flash_lse(lse), probs


def _attn_probs(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, seed):
    """FlashAttention's S_dmask, for testing: [batch, nheads, seqlen_q, seqlen_k] in q's dtype, the softmax
    weights P (normalised), negated where dropout dropped them (FlashAttention's sign convention: S_dmask >= 0 is
    the keep mask, S_dmask.abs() the weights). A dropped weight that is 0 (underflow, e.g. far keys under ALiBi)
    becomes the smallest negative subnormal, so the mask stays exact; a key a row may not see is +0 (kept).
    attn computes them with its own kernel: with V = the identity [seqlen_k, seqlen_k] the output is P, so every
    variant and mask means what it means for the output; the keep mask comes from the same call with q = 0 and
    no score variant (every key the row may see then has a weight > 0, and the mask depends only on the seed and
    the position). Costs O(seqlen_q · seqlen_k²) per head: for tests and small inputs."""
    torch = _torch()
    b, sk, hk = k.shape[0], k.shape[1], k.shape[2]
    if sk == 0:  # no keys: no weights (the identity below would be a V of head dim 0)
        return q.new_zeros((b, q.shape[2], q.shape[1], 0))
    # v[b, j, h, :] = e_j, no copy
    eye = torch.eye(sk, dtype=q.dtype, device=q.device)[None, :, None, :].expand(b, sk, hk, sk)
    with torch.no_grad():
        q, k = q.detach(), k.detach()
        probs, _ = _attend(q, k, eye, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes)
        if dropout_p and dropout_p > 0:
            zero = torch.zeros_like(q)
            seen, _ = _attend(zero, k, eye, 0.0, softmax_scale, causal, window_size, 0.0, None)
            kept, _ = _attend(zero, k, eye, dropout_p, softmax_scale, causal, window_size, 0.0, None, seed=seed)
            info = torch.finfo(q.dtype)
            smallest = info.smallest_normal * info.eps  # the smallest positive subnormal
            probs = torch.where((seen > 0) & (kept == 0), -probs.clamp_min(smallest), probs)
    return probs.transpose(1, 2).contiguous()


@_flash_names(query="qkv", key="qkv", value="qkv", q="qkv", k="qkv", v="qkv")
def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [batch, seqlen, 3, nheads, headdim]."""
    _tensor("qkv", qkv, 5, "[batch, seqlen, 3, nheads, headdim]")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


@_flash_names(key="kv", value="kv", k="kv", v="kv")
def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                             alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [batch, seqlen_q, nheads, headdim], kv [batch, seqlen_k, 2, nheads_k, headdim]."""
    _tensor("kv", kv, 5, "[batch, seqlen_k, 2, nheads_k, headdim]")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def _cu_seqlens(name, cu, max_seqlen, total):
    torch = _torch()
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected a 1-D int32 torch.Tensor [batch + 1] of cumulative sequence lengths")
    starts = [int(x) for x in cu.tolist()]
    if len(starts) < 1 or starts[0] != 0 or starts[-1] != total or any(b < a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"{name}: {starts}; expected non-decreasing offsets from 0 to {total} (the packed length)")
    longest = max((b - a for a, b in zip(starts, starts[1:])), default=0)
    if longest > int(max_seqlen):
        raise ValueError(f"{name}: a sequence of length {longest}; expected at most max_seqlen = {int(max_seqlen)}")
    return starts


@_flash_names(k_pages="k", v_pages="v", page_table="block_table")
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Packed sequences: q [total_q, nheads, headdim], k and v [total_k, nheads_k, headdim]; sequence b is rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of q (and likewise of k, v). out [total_q, nheads, headdim]; with
    return_attn_probs, (out, softmax_lse [nheads, total_q], None). With dropout, sequence b draws its mask from
    the seed (one draw from torch's generator per call) plus b times a fixed odd constant, so sequences differ."""
    torch = _torch()
    if block_table is not None:
        return _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                             causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(name, x, 3, "[total, nheads, headdim]")
    starts_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, max_seqlen_q, q.shape[0])
    starts_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, max_seqlen_k, k.shape[0])
    if len(starts_q) != len(starts_k):
        raise ValueError(f"cu_seqlens_k: {len(starts_k) - 1} sequences but cu_seqlens_q has {len(starts_q) - 1}; "
                         "expected the same batch")
    seed = None
    if dropout_p and dropout_p > 0:
        lo, hi = torch.randint(0, 2**32, (2,), dtype=torch.int64).tolist()
        seed = lo | hi << 32
    outs, lses = [], []
    for b in range(len(starts_q) - 1):
        qs = q[starts_q[b]:starts_q[b + 1]].unsqueeze(0)
        ks = k[starts_k[b]:starts_k[b + 1]].unsqueeze(0)
        vs = v[starts_k[b]:starts_k[b + 1]].unsqueeze(0)
        seed_b = None if seed is None else (seed + b * 0x9E3779B97F4A7C15) % 2**64
        out, lse = _attend(qs, ks, vs, dropout_p, softmax_scale, causal, window_size, softcap,
                           _slopes_of(alibi_slopes, b), seed=seed_b)
        outs.append(out[0])
        lses.append(lse[0])
    return _packed_result(outs, lses, q, v.shape[-1], return_attn_probs)


def _slopes_of(alibi_slopes, b):
    """Sequence b's ALiBi slopes: [nheads] for all, or row b of [batch, nheads]."""
    return alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes


def _packed_result(outs, lses, q, dv, return_attn_probs):
    """The varlen forms' result from each sequence's out [seqlen_q, nheads, dv] and lse [nheads, seqlen_q]:
    out [total_q, nheads, dv] (and, with return_attn_probs, FlashAttention's softmax_lse [nheads, total_q] and
    None for S_dmask)."""
    torch = _torch()
    out = torch.cat(outs, 0) if outs else q.new_empty((0, q.shape[1], dv))
    if not return_attn_probs:
        return out
    lse = torch.cat(lses, 1) if lses else q.new_empty((q.shape[1], 0), dtype=torch.float32)
    return out, _flash_lse(lse), None


def _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, return_attn_probs, block_table):
    """flash_attn_varlen_func with block_table (chunked prefill over a paged cache, as FlashAttention takes it):
    k, v [num_blocks, page_block_size, nheads_k, headdim] pages; block_table [batch, max_blocks] (int32): page n
    of sequence b; cu_seqlens_k the cumulative key counts (each sequence's keys are the first ones of its pages).
    Forward only, no dropout (as in FlashAttention)."""
    torch = _torch()
    _tensor("q", q, 3, "[total_q, nheads, headdim]")
    _tensor("k", k, 4, "[num_blocks, page_block_size, nheads_k, headdim] with block_table")
    _tensor("v", v, 4, "[num_blocks, page_block_size, nheads_k, headdim] with block_table")
    _tensor("block_table", block_table, 2, "[batch, max_blocks_per_seq]")
    if dropout_p and dropout_p > 0:
        raise ValueError(f"dropout_p: {dropout_p} with block_table; expected 0 (the paged form is for inference)")
    starts_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, max_seqlen_q, q.shape[0])
    if (not isinstance(cu_seqlens_k, torch.Tensor) or cu_seqlens_k.dim() != 1
            or cu_seqlens_k.dtype not in (torch.int32, torch.int64)):
        raise TypeError("cu_seqlens_k: expected a 1-D int32 torch.Tensor [batch + 1] of cumulative key counts")
    starts_k = [int(x) for x in cu_seqlens_k.tolist()]
    batch = len(starts_q) - 1
    if len(starts_k) != batch + 1 or starts_k[0] != 0 or any(b < a for a, b in zip(starts_k, starts_k[1:])):
        raise ValueError(f"cu_seqlens_k: {starts_k}; expected {batch + 1} non-decreasing offsets from 0")
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: {block_table.shape[0]} rows; expected batch = {batch}")
    capacity = block_table.shape[1] * k.shape[1]
    outs, lses = [], []
    with torch.no_grad():
        for b in range(batch):
            n = starts_k[b + 1] - starts_k[b]
            if n > capacity or n > int(max_seqlen_k):
                raise ValueError(f"cu_seqlens_k: sequence {b} has {n} keys; expected at most max_seqlen_k = "
                                 f"{int(max_seqlen_k)} and the {capacity} slots of its block_table row")
            qs = q[starts_q[b]:starts_q[b + 1]].unsqueeze(0)
            out, lse = attention_paged(qs.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_table[b:b + 1],
                                       torch.tensor([n], dtype=torch.int64, device=q.device), is_causal=bool(causal),
                                       causal_alignment="bottom_right", scale=softmax_scale,
                                       window=_window(window_size), return_lse=True, softcap=softcap,
                                       alibi_slopes=_slopes_of(alibi_slopes, b))
            outs.append(out.transpose(1, 2)[0])
            lses.append(lse[0])
    return _packed_result(outs, lses, q, v.shape[-1], return_attn_probs)


def _rotary(x, cos, sin, positions, interleaved):
    """FlashAttention's rotary embedding of x [batch, seqlen, nheads, headdim] at positions [batch, seqlen] (rows
    of cos/sin [seqlen_ro, rotary_dim / 2]): the first rotary_dim dims turned in pairs, (0, 1), (2, 3), ... when
    interleaved (GPT-J), (i, i + rotary_dim / 2) otherwise (GPT-NeoX); the other dims unchanged. In float32,
    rounded once to x's dtype, as FlashAttention's kernel does."""
    torch = _torch()
    half = cos.shape[1]
    c = cos[positions].float().unsqueeze(2)  # [batch, seqlen, 1, half]
    s = sin[positions].float().unsqueeze(2)
    xr = x[..., :2 * half].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        turned = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        turned = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((turned.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _index_list(name, t, batch, what):
    torch = _torch()
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected a 1-D int32 torch.Tensor [batch] ({what})")
    if t.shape[0] != batch:
        raise ValueError(f"{name}: {t.shape[0]} entries; expected batch = {batch}")
    return [int(x) for x in t.tolist()]


@_flash_names(key="k_cache", value="v_cache", k_pages="k_cache", v_pages="v_cache",
               page_table="block_table", seq_lens="cache_seqlens", kv_lens="cache_seqlens")
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Decode (and chunked prefill) against a KV cache. q [batch, seqlen_q, nheads, headdim]; the cache is
    k_cache, v_cache [batch, seqlen_cache, nheads_k, headdim], or pages [num_blocks, block_size, nheads_k, headdim]
    with block_table [batch, max_blocks] (int32). cache_seqlens (int or [batch] int32): where each sequence's
    cached keys end (None: the whole cache). k, v [batch, seqlen_new, nheads_k, headdim], when given, are written
    into the cache in place from there, and attention runs over the keys [cache_leftpad, cache_seqlens +
    seqlen_new) of the sequence's cache row. cache_batch_idx [batch] (int32): the cache row of each sequence
    (None: row b; not with block_table). cache_leftpad [batch] (int32): where each row's keys start (None: 0;
    causal and windows are aligned to the keys that remain). rotary_cos, rotary_sin [seqlen_ro, rotary_dim / 2]
    (needs k and v): k is turned at positions cache_seqlens + t before it is written; q at cache_seqlens + t when
    causal or windowed, else every query at cache_seqlens (FlashAttention's meaning); rotary_interleaved picks
    the pairing (_rotary). num_splits is ignored (attn chooses its own split-KV). Returns out [batch, seqlen_q,
    nheads, headdim] (and softmax_lse [batch, nheads, seqlen_q] with return_softmax_lse). k and v must have the
    cache's heads, head dim, dtype and device (nothing is broadcast or cast into it), and a call that raises leaves
    the cache as it was. No autograd."""
    torch = _torch()
    _tensor("q", q, 4, "[batch, seqlen_q, nheads, headdim]")
    _tensor("k_cache", k_cache, 4, "[batch, seqlen_cache, nheads_k, headdim] or [num_blocks, block_size, nheads_k, headdim]")
    _tensor("v_cache", v_cache, 4, "like k_cache")
    batch = q.shape[0]
    paged = block_table is not None
    if paged:
        _tensor("block_table", block_table, 2, "[batch, max_blocks_per_seq]")
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table: {block_table.shape[0]} rows; expected batch = {batch}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        capacity = k_cache.shape[1]
    # Under torch.compile the lengths (a [batch] tensor, or an int) become a tensor (traced): no value is read on the
    # host, so the checks of values below (lengths against the capacity, pages against the pool, rotary positions)
    # are left to the indexing and to the attention, and a failing call is not undone. Eager calls check all first.
    traced = (torch.compiler.is_compiling() and cache_seqlens is not None and not isinstance(cache_seqlens, bool)
              and cache_batch_idx is None and cache_leftpad is None)
    seqlens = None
    if cache_seqlens is None:
        lens = [0 if k is not None else capacity] * batch
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        lens = [cache_seqlens] * batch
        if traced:
            seqlens, lens = torch.full((batch,), cache_seqlens, dtype=torch.int64, device=k_cache.device), None
    else:
        seqlens = torch.as_tensor(cache_seqlens)
        if seqlens.dtype not in (torch.int32, torch.int64) or seqlens.dim() > 1:
            raise TypeError(f"cache_seqlens: {seqlens.dtype} of shape {list(seqlens.shape)}; expected an int or a "
                            "1-D int32 tensor [batch]")
        seqlens = seqlens.reshape(-1)
        if seqlens.shape[0] != batch:
            raise ValueError(f"cache_seqlens: {seqlens.shape[0]} lengths; expected batch = {batch}")
        lens = None if traced else [int(x) for x in seqlens.tolist()]
    new = 0
    if (k is None) != (v is None):
        raise ValueError("k: k and v are appended together; expected both or neither")
    if k is not None:
        # checked in full before anything is written: a shape torch would broadcast, or a dtype it would cast,
        # must not reach the cache
        _tensor("k", k, 4, "[batch, seqlen_new, nheads_k, headdim]")
        _tensor("v", v, 4, "[batch, seqlen_new, nheads_k, headdim]")
        new = k.shape[1]
        for name, x, cache in (("k", k, k_cache), ("v", v, v_cache)):
            want = [batch, new, cache.shape[2], cache.shape[3]]
            if list(x.shape) != want:
                raise ValueError(f"{name}: shape {list(x.shape)}; expected {want} ([batch, seqlen_new, nheads_k, "
                                 f"headdim] of q's batch, k's seqlen_new and {name}_cache's heads and headdim)")
            if x.dtype != cache.dtype or x.device != cache.device:
                raise TypeError(f"{name}: {x.dtype} on {x.device}; expected {name}_cache's {cache.dtype} on "
                                f"{cache.device} (the new rows are written into it as they are)")
    for b, n in enumerate(lens or []):
        if n < 0 or n + new > capacity:
            raise ValueError(f"cache_seqlens: {n} (+ {new} new keys) for batch {b}; expected 0 <= length and "
                             f"length + seqlen_new <= the cache's {capacity} slots")
    total = None if traced else [n + new for n in lens]
    if paged:  # every page a sequence reads or appends to must be one of the pool's (checked before the append)
        if block_table.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"block_table: {block_table.dtype}; expected int32")
        for b in range(0 if traced else batch):
            used = block_table[b, :(total[b] + k_cache.shape[1] - 1) // k_cache.shape[1]].tolist()
            bad = [x for x in used if not 0 <= x < k_cache.shape[0]]
            if bad:
                raise ValueError(f"block_table: page {bad[0]} in row {b}; expected a page in [0, {k_cache.shape[0]}) "
                                 f"for each of the row's first {len(used)} entries (its {total[b]} keys)")
    rows = list(range(batch))
    if cache_batch_idx is not None:
        if paged:
            raise ValueError("cache_batch_idx: not with block_table (the block table already maps each sequence)")
        rows = _index_list("cache_batch_idx", cache_batch_idx, batch, "each sequence's row of the cache")
        for b, r in enumerate(rows):
            if not 0 <= r < k_cache.shape[0]:
                raise ValueError(f"cache_batch_idx: {r} for batch {b}; expected a row in [0, {k_cache.shape[0]})")
    elif not paged and k_cache.shape[0] != batch:
        raise ValueError(f"k_cache: batch {k_cache.shape[0]}; expected q's batch {batch}")
    starts = [0] * batch
    if cache_leftpad is not None:
        if paged:
            raise ValueError("cache_leftpad: not with block_table (give each sequence's pages from its first key)")
        starts = _index_list("cache_leftpad", cache_leftpad, batch, "where each row's keys start")
        for b, (a, n) in enumerate(zip(starts, lens)):
            if not 0 <= a <= n:
                raise ValueError(f"cache_leftpad: {a} for batch {b}; expected 0 <= leftpad <= cache_seqlens ({n})")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos: rotary_cos and rotary_sin come together; expected both or neither")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos: the rotary embedding turns the new keys; expected k and v to be given")
        _tensor("rotary_cos", rotary_cos, 2, "[seqlen_ro, rotary_dim / 2]")
        _tensor("rotary_sin", rotary_sin, 2, "[seqlen_ro, rotary_dim / 2]")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name}: {t.dtype}; expected a real floating-point tensor (float32, bfloat16, ...)")
        if not isinstance(rotary_interleaved, bool):
            raise TypeError(f"rotary_interleaved: got {type(rotary_interleaved).__name__}; expected a bool")
        if rotary_sin.shape != rotary_cos.shape:
            raise ValueError(f"rotary_sin: shape {list(rotary_sin.shape)}; expected rotary_cos's "
                             f"{list(rotary_cos.shape)}")
        if not 0 < 2 * rotary_cos.shape[1] <= q.shape[3]:
            raise ValueError(f"rotary_cos: rotary_dim {2 * rotary_cos.shape[1]}; expected 0 < rotary_dim <= headdim "
                             f"({q.shape[3]})")
        last = -1 if traced else max(lens) + max(new, q.shape[1]) - 1
        if last >= rotary_cos.shape[0]:
            raise ValueError(f"rotary_cos: {rotary_cos.shape[0]} positions; expected more than {last} (the last "
                             "position turned: cache_seqlens + seqlen_new - 1)")
    with torch.no_grad():
        if rotary_cos is not None:
            at = (seqlens.to(device=rotary_cos.device, dtype=torch.int64) if traced
                  else torch.tensor(lens, dtype=torch.int64, device=rotary_cos.device))[:, None]
            k = _rotary(k, rotary_cos, rotary_sin, at + torch.arange(new, device=at.device), rotary_interleaved)
            per_token = bool(causal) or _window(window_size) is not None
            q_pos = at + (torch.arange(q.shape[1], device=at.device) if per_token
                          else torch.zeros(q.shape[1], dtype=torch.int64, device=at.device))
            q = _rotary(q, rotary_cos, rotary_sin, q_pos, rotary_interleaved)
        if traced:  # the append as one indexed write per cache; the lengths as a tensor
            lens_t = seqlens.to(device=k_cache.device, dtype=torch.int64)
            if k is not None:
                pos = lens_t[:, None] + torch.arange(new, device=k_cache.device)  # [batch, seqlen_new]
                if paged:
                    page = k_cache.shape[1]
                    pages = torch.gather(block_table.to(device=k_cache.device, dtype=torch.int64), 1, pos // page)
                    where = (pages, pos % page)
                else:
                    where = (torch.arange(batch, device=k_cache.device)[:, None].expand(batch, new), pos)
                k_cache.index_put_(where, k)
                v_cache.index_put_(where, v)
            out, lse = _kvcache_attend(q, k_cache, v_cache, None, None, lens_t + new, paged, block_table,
                                       softmax_scale, causal, window_size, softcap, alibi_slopes, False)
            return (out, _flash_lse(lse)) if return_softmax_lse else out
        # The append, in place; the slots' old rows are kept so that a call that fails after it (an argument
        # only the attention checks) leaves the caches as they were. Distinct slots (every well-formed call) are
        # read, written and restored by one indexed copy per cache (a Python step per slot took 3.7 ms of a
        # 64-sequence decode step); slots that repeat (two sequences appending to one page) are written one by one
        # in batch order, the last write standing.
        seqs = [b for b in range(batch) for _ in range(new)]
        steps = [t for _ in range(batch) for t in range(new)]
        where = [lens[b] + t for b, t in zip(seqs, steps)]
        if paged and where:
            page = k_cache.shape[1]
            at = torch.tensor([[b, w // page] for b, w in zip(seqs, where)], device=block_table.device)
            slots = list(zip(block_table[at[:, 0], at[:, 1]].tolist(), [w % page for w in where]))
        else:
            slots = [(rows[b], w) for b, w in zip(seqs, where)]
        if not slots:
            def restore():
                pass
        elif len(set(slots)) == len(slots):
            index = tuple(torch.tensor(x, dtype=torch.int64, device=k_cache.device) for x in zip(*slots))
            source = tuple(torch.tensor(x, dtype=torch.int64, device=k.device) for x in (seqs, steps))
            kept = (k_cache[index], v_cache[index])  # (copies: indexing by tensors)
            k_cache[index] = k[source]
            v_cache[index] = v[source]

            def restore():
                k_cache[index] = kept[0]
                v_cache[index] = kept[1]
        else:
            kept = [(k_cache[i, j].clone(), v_cache[i, j].clone()) for i, j in slots]
            for (i, j), b, t in zip(slots, seqs, steps):
                k_cache[i, j] = k[b, t]
                v_cache[i, j] = v[b, t]

            def restore():
                for (i, j), (ko, vo) in zip(reversed(slots), reversed(kept)):
                    k_cache[i, j] = ko
                    v_cache[i, j] = vo
        try:
            out, lse = _kvcache_attend(q, k_cache, v_cache, rows, starts, total, paged, block_table, softmax_scale,
                                       causal, window_size, softcap, alibi_slopes, cache_batch_idx is not None)
        except BaseException:
            restore()
            raise
    return (out, _flash_lse(lse)) if return_softmax_lse else out


def _kvcache_attend(q, k_cache, v_cache, rows, starts, total, paged, block_table, softmax_scale, causal, window_size,
                    softcap, alibi_slopes, batch_index):
    """flash_attn_with_kvcache's attention over the keys [starts[b], total[b]) of each sequence's cache row (or
    pages; total: a list, or a tensor when traced, with rows and starts None): returns (out [batch, seqlen_q,
    nheads, headdim], lse [batch, nheads, seqlen_q])."""
    torch = _torch()
    batch = q.shape[0]
    if not paged and (batch_index or any(starts or [])):
        # each sequence over its own row's keys [leftpad, end): views of the cache, no copy
        outs, lses = [], []
        for b in range(batch):
            ks = k_cache[rows[b], starts[b]:total[b]].unsqueeze(0)
            vs = v_cache[rows[b], starts[b]:total[b]].unsqueeze(0)
            out, lse = _attend(q[b:b + 1], ks, vs, 0.0, softmax_scale, causal, window_size, softcap,
                               _slopes_of(alibi_slopes, b))
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, 0), torch.cat(lses, 0)
    seq = total.to(q.device) if isinstance(total, torch.Tensor) else torch.tensor(total, dtype=torch.int64,
                                                                                   device=q.device)
    if paged:
        out, lse = attention_paged(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                   block_table, seq, is_causal=bool(causal), causal_alignment="bottom_right",
                                   scale=softmax_scale, window=_window(window_size), return_lse=True,
                                   softcap=softcap, alibi_slopes=alibi_slopes)
        return out.transpose(1, 2).contiguous(), lse
    return _attend(q, k_cache, v_cache, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, kv_lens=seq)


# ---- FlashMLA's decode API (multi-head latent attention, DeepSeek-V2/V3) ----------------------------------------


def get_mla_metadata(*args, **kwargs):
    """FlashMLA's scheduling metadata, kept for call compatibility with both of its forms (the older one took
    cache_seqlens, num_heads_per_head_k, num_heads_k; the current one takes no arguments): attn splits the keys
    itself from the problem's shape, so this returns (None, None) whatever it is given, which
    flash_mla_with_kvcache accepts as its tile_scheduler_metadata and num_splits."""
    return None, None


# FlashMLA's sparse and FP8 modes: parameters its signature has, refused by name unless at their defaults.
_MLA_UNSUPPORTED = (
    ("is_fp8_kvcache", "FlashMLA's FP8 latent cache layout (656 bytes per token) is not implemented; an 8-bit "
                       "latent cache goes through attn.attention_paged with k_scale"),
    ("indices", "FlashMLA's sparse attention (top-k indices into the cache) is not implemented; dense decode takes "
                "block_table and cache_seqlens"),
    ("attn_sink", "FlashMLA takes it in sparse attention only, which is not implemented (attn.attention_paged "
                  "takes per-head sinks)"),
    ("extra_k_cache", "FlashMLA's sparse attention is not implemented"),
    ("extra_indices_in_kvcache", "FlashMLA's sparse attention is not implemented"),
    ("topk_length", "FlashMLA's sparse attention is not implemented"),
    ("extra_topk_length", "FlashMLA's sparse attention is not implemented"),
)


@_flash_names(key="k_cache", value="k_cache", k_pages="k_cache", v_pages="k_cache",
               page_table="block_table", seq_lens="cache_seqlens")
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata=None,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """FlashMLA's flash_mla_with_kvcache on attn: decode (and speculative multi-token decode) of multi-head latent
    attention in its absorbed form over a paged latent cache. q [batch, seq_len_q, num_heads_q, head_dim] (576 for
    DeepSeek-V3: 512 latent + 64 rotary), k_cache [num_blocks, page_block_size, num_heads_k, head_dim] (the latent
    rows; V is their first head_dim_v columns, read in place), block_table [batch, max_blocks] int32,
    cache_seqlens [batch] int32. softmax_scale defaults to head_dim ** -0.5 (FlashMLA's default; DeepSeek passes
    the unabsorbed head's 192 ** -0.5); causal aligns each sequence's last query on its last key.
    tile_scheduler_metadata and num_splits (get_mla_metadata's) are ignored. FlashMLA's sparse and FP8 parameters
    (is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    are accepted at their defaults and refused by name otherwise (NotImplementedError). Returns (out [batch,
    seq_len_q, num_heads_q, head_dim_v], softmax_lse [batch, num_heads_q, seq_len_q] float32, natural log, +inf for
    a row that sees no key as in attn.flash). No autograd."""
    torch = _torch()
    given = dict(is_fp8_kvcache=is_fp8_kvcache, indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
                 extra_indices_in_kvcache=extra_indices_in_kvcache, topk_length=topk_length,
                 extra_topk_length=extra_topk_length)
    for name, why in _MLA_UNSUPPORTED:
        value = given[name]
        if bool(value) if name == "is_fp8_kvcache" else value is not None:
            raise NotImplementedError(f"{name}: {why}")
    _tensor("q", q, 4, "[batch, seq_len_q, num_heads_q, head_dim]")
    _tensor("k_cache", k_cache, 4, "[num_blocks, page_block_size, num_heads_k, head_dim]")
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int):
        raise TypeError(f"head_dim_v: got {type(head_dim_v).__name__}; expected an int")
    if not 0 < head_dim_v <= k_cache.shape[3]:
        raise ValueError(f"head_dim_v: {head_dim_v}; expected 1 <= head_dim_v <= head_dim ({k_cache.shape[3]})")
    if q.shape[3] != k_cache.shape[3]:
        raise ValueError(f"q: head_dim {q.shape[3]}; expected k_cache's {k_cache.shape[3]}")
    if k_cache.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"k_cache: {k_cache.dtype}; expected bfloat16, float16 or float32 (this interface carries no "
                        "scales: an 8-bit latent cache goes through attn.attention_paged with k_scale)")
    # the block table and the lengths under their names here (attention_paged checks them again, as its own)
    _tensor("block_table", block_table, 2, "[batch, max_blocks_per_seq]")
    if block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_table: {block_table.dtype}; expected int32")
    if block_table.shape[0] != q.shape[0]:
        raise ValueError(f"block_table: {block_table.shape[0]} rows; expected batch = {q.shape[0]}")
    if (not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1
            or cache_seqlens.dtype not in (torch.int32, torch.int64)):
        raise TypeError("cache_seqlens: expected a 1-D int32 torch.Tensor [batch]")
    if cache_seqlens.shape[0] != q.shape[0]:
        raise ValueError(f"cache_seqlens: {cache_seqlens.shape[0]} lengths; expected batch = {q.shape[0]}")
    if not torch.compiler.is_compiling():  # (values: read on the host only when not tracing)
        page = k_cache.shape[1]
        for b, n in enumerate(cache_seqlens.tolist()):
            if not 0 <= n <= block_table.shape[1] * page:
                raise ValueError(f"cache_seqlens: {n} for batch {b}; expected 0 <= length <= the "
                                 f"{block_table.shape[1] * page} slots of its block_table row")
            bad = [x for x in block_table[b, :(n + page - 1) // page].tolist() if not 0 <= x < k_cache.shape[0]]
            if bad:
                raise ValueError(f"block_table: page {bad[0]} in row {b}; expected a page in [0, {k_cache.shape[0]})")
    scale = softmax_scale if softmax_scale is not None else q.shape[3] ** -0.5
    with torch.no_grad():
        v_cache = k_cache[..., :head_dim_v]  # a view: the same rows, no copy
        out, lse = attention_paged(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), block_table,
                                   cache_seqlens, is_causal=bool(causal), causal_alignment="bottom_right",
                                   scale=scale, return_lse=True)
    return out.transpose(1, 2).contiguous(), _flash_lse(lse)
