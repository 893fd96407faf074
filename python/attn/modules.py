"""The multi-head attention module, KV caches, paged attention and the cost model, over attn's C++ library.

Arrays are float32 NumPy arrays or CPU torch tensors (results come back as the kind that went in); the
C++ library validates shapes and reports errors as ValueError/TypeError naming the parameter.
"""

from __future__ import annotations

import numpy as np

from . import _attn
from .functional import _call, _diagonals, _empty, _for_binding, _kind, _same_kind

_WEIGHTS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def _f32(name, x):
    dtype = str(x.dtype).replace("torch.", "")
    if dtype != "float32":
        raise TypeError(f"{name}: dtype {dtype}; expected float32")
    return _for_binding(x)


def _causal(causal):
    if causal in (False, None):
        return "none"
    if causal is True:
        return "top_left"
    return _diagonals(True, causal, None)[0]


class MultiHeadAttention:
    """Q = x W_Qᵀ + b_Q, K = x_kv W_Kᵀ + b_K, V = x_kv W_Vᵀ + b_V, heads split from the columns,
    Y_h = attention(Q_h, K_g, V_g) with query head h reading KV head g = h // (heads // kv_heads),
    out = concat_h(Y_h) W_Oᵀ + b_O. Weights in torch.nn.Linear's layout ([out_features, in_features]):
    w_q [heads·head_dim, d_model], w_k [kv_heads·head_dim, d_model], w_v [kv_heads·v_head_dim, d_model],
    w_o [d_model, heads·v_head_dim]; biases with bias=True. kv_heads = heads is MHA, 1 is MQA."""

    def __init__(self, d_model, heads, kv_heads=None, head_dim=None, v_head_dim=None, bias=False, seed=None):
        self._m = _attn.MultiHeadAttention(d_model, heads, kv_heads or 0, head_dim or 0, v_head_dim or 0, bias)
        self.d_model, self.heads, self.kv_heads, self.head_dim, self.v_head_dim, self.bias = self._m.config
        if seed is not None:
            self._m.init_random(seed)

    def parameter_count(self):
        """d·(Hq·Dk + Hkv·Dk + Hkv·Dv) + Hq·Dv·d (+ biases): the seeds' d·h·(3·d_k + d_v) for MHA."""
        return self._m.parameter_count()

    def _shape(self, name):
        hq, hkv, dk, dv, d = self.heads, self.kv_heads, self.head_dim, self.v_head_dim, self.d_model
        return {"w_q": (hq * dk, d), "w_k": (hkv * dk, d), "w_v": (hkv * dv, d), "w_o": (d, hq * dv),
                "b_q": (hq * dk,), "b_k": (hkv * dk,), "b_v": (hkv * dv,), "b_o": (d,)}[name]

    def get_weight(self, name):
        """A copy of one weight as a float32 NumPy array (w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)."""
        if name not in _WEIGHTS or (name.startswith("b_") and not self.bias):
            raise ValueError(f"name: {name!r}; expected one of {', '.join(_WEIGHTS[:8 if self.bias else 4])}")
        return np.asarray(self._m.get_weight(name), dtype=np.float32).reshape(self._shape(name))

    def set_weight(self, name, value):
        """Sets one weight from an array of its shape (see the class docstring)."""
        if name not in _WEIGHTS or (name.startswith("b_") and not self.bias):
            raise ValueError(f"name: {name!r}; expected one of {', '.join(_WEIGHTS[:8 if self.bias else 4])}")
        a = np.asarray(value, dtype=np.float32)
        if a.shape != self._shape(name):
            raise ValueError(f"{name}: shape {list(a.shape)}; expected {list(self._shape(name))}")
        self._m.set_weight(name, a.ravel().tolist())

    def __call__(self, x, x_kv=None, *, attn_mask=None, is_causal=False, causal_alignment=None, kv_lens=None):
        """Self-attention of x [B, S, d_model], or cross-attention of x (queries) to x_kv [B, Skv, d_model];
        returns [B, S, d_model] of x's kind."""
        kind = _kind("x", x)
        if x_kv is not None:
            _same_kind("x_kv", x_kv, kind, "x")
        mask = None if attn_mask is None else _for_binding(attn_mask)
        lens = None if kv_lens is None else np.asarray(kv_lens, dtype=np.int64)
        causal = _diagonals(is_causal, causal_alignment, None)[0]
        out = _empty(kind, x, (x.shape[0], x.shape[1], self.d_model))
        xb = _f32("x", x)
        _call(self._m.forward, xb, xb if x_kv is None else _f32("x_kv", x_kv), _for_binding(out), mask, lens, causal,
              x_kv is not None)
        return out

    forward = __call__

    def forward_cached(self, x, cache):
        """A decode step of one sequence: x [1, T, d_model] are the new tokens; their K/V are appended to
        `cache` (a KVCache) and their queries attend to the whole cache (bottom-right causal)."""
        kind = _kind("x", x)
        out = _empty(kind, x, (x.shape[0], x.shape[1], self.d_model))
        _call(self._m.forward_cached, _f32("x", x), cache._c, _for_binding(out))
        return out


class KVCache:
    """One sequence's keys and values, contiguous, for `capacity` tokens: append K/V of new tokens, then
    attend the new queries to everything cached with bottom-right causal alignment."""

    def __init__(self, kv_heads, head_dim, capacity, v_head_dim=None):
        self._c = _attn.KVCache(kv_heads, head_dim, v_head_dim or 0, capacity)
        self.v_head_dim = v_head_dim or head_dim

    def __len__(self):
        return self._c.length

    @property
    def capacity(self):
        return self._c.capacity

    def append(self, k, v):
        """k [1, Hkv, T, Dk], v [1, Hkv, T, Dv] float32; past the capacity is a ValueError, nothing changes."""
        _call(self._c.append, _f32("k", k), _f32("v", v))

    def attend(self, q, return_lse=False):
        """q [1, Hq, T, Dk] -> out [1, Hq, T, Dv] (and the float32 lse [1, Hq, T] with return_lse)."""
        kind = _kind("q", q)
        b, hq, t, _ = q.shape
        out = _empty(kind, q, (b, hq, t, self.v_head_dim))
        lse = _empty(kind, q, (b, hq, t), "float32") if return_lse else None
        _call(self._c.attend, _f32("q", q), _for_binding(out), lse)
        return (out, lse) if return_lse else out

    def truncate(self, length):
        _call(self._c.truncate, length)

    def clear(self):
        self._c.clear()


class PagedKVCache:
    """A pool of `num_pages` pages of `page_size` tokens shared by many sequences (vLLM's PagedAttention
    layout): add_sequence() gives an id, append(id, k, v) grows it page by page, remove_sequence(id)
    returns its pages to the pool, attend(ids, q) decodes a batch of sequences of ragged lengths at once."""

    def __init__(self, kv_heads, head_dim, page_size, num_pages, v_head_dim=None):
        self._c = _attn.PagedKVCache(kv_heads, head_dim, v_head_dim or 0, page_size, num_pages)
        self.v_head_dim = v_head_dim or head_dim

    @property
    def free_pages(self):
        return self._c.free_pages

    def add_sequence(self):
        return self._c.add_sequence()

    def remove_sequence(self, seq_id):
        _call(self._c.remove_sequence, seq_id)

    def length(self, seq_id):
        return _call(self._c.length, seq_id)

    def append(self, seq_id, k, v):
        """k [1, Hkv, T, Dk], v [1, Hkv, T, Dv] float32 for sequence seq_id; an exhausted pool is a ValueError."""
        _call(self._c.append, seq_id, _f32("k", k), _f32("v", v))

    def attend(self, ids, q, return_lse=False):
        """q [B, Hq, T, Dk], row b the new queries of sequence ids[b] -> out [B, Hq, T, Dv] (and lse)."""
        kind = _kind("q", q)
        b, hq, t, _ = q.shape
        out = _empty(kind, q, (b, hq, t, self.v_head_dim))
        lse = _empty(kind, q, (b, hq, t), "float32") if return_lse else None
        _call(self._c.attend, list(ids), _f32("q", q), _for_binding(out), lse)
        return (out, lse) if return_lse else out


def attention_paged(query, k_pages, v_pages, page_table, seq_lens, *, attn_mask=None, is_causal=False,
                    causal_alignment=None, scale=None, window=None, return_lse=False):
    """attn.scaled_dot_product_attention over a paged KV cache: k_pages [P, Hkv, page_size, Dk],
    v_pages [P, Hkv, page_size, Dv], page_table [B, max_pages] int32 (page n of sequence b), seq_lens [B]
    int32/int64; query [B, Hq, Sq, Dk]. Keys j >= seq_lens[b] are ignored."""
    kind = _kind("query", query)
    causal, left, right, align = _diagonals(is_causal, causal_alignment, window)
    b, hq, sq, _ = query.shape
    out = _empty(kind, query, (b, hq, sq, v_pages.shape[-1]))
    lse = _empty(kind, query, (b, hq, sq), "float32") if return_lse else None
    mask = None if attn_mask is None else _for_binding(attn_mask)
    _call(_attn.attention_paged, _for_binding(query), _for_binding(k_pages), _for_binding(v_pages),
          _for_binding(page_table), _for_binding(seq_lens), _for_binding(out), lse, mask,
          None if scale is None else float(scale), causal, left, right, align)
    return (out, lse) if return_lse else out


def attention_cost(seq, d_model, heads, kv_heads=None, head_dim=None, v_head_dim=None, causal=False, batch=1,
                   bytes_per_element=4):
    """FLOPs (2 per multiply-add; 'seed_ops' counts 1 as the seeds do) and bytes of each stage of one layer:
    a dict with 'stages' (name, flops, seed_ops, bytes), totals, 'dominant' and 'crossover_seq'."""
    return _call(_attn.attention_cost, seq, d_model, heads, kv_heads or 0, head_dim or 0, v_head_dim or 0, causal,
                 batch, bytes_per_element)


def parameter_count(d_model, heads, kv_heads=None, head_dim=None, v_head_dim=None, bias=False):
    """Weights of one attention layer: d·h·(3·d_k + d_v) for MHA without bias (512, 8 heads -> 1,048,576)."""
    return _call(_attn.parameter_count, d_model, heads, kv_heads or 0, head_dim or 0, v_head_dim or 0, bias)


def kv_cache_bytes(layers, kv_heads, head_dim, seq, batch=1, dtype="f16"):
    """2 (K and V) · layers · kv_heads · head_dim · seq · batch · bytes per element of dtype."""
    return _call(_attn.kv_cache_bytes, layers, kv_heads, head_dim, seq, batch, dtype)
