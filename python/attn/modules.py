"""The multi-head attention module, the KV caches and the cost model, over attn's C++ library (attention over a
paged KV cache as a function is attn.functional.attention_paged).

Arrays are NumPy arrays or dense CPU torch tensors, every array argument of one call of the same kind as
the first (x, q, k or query); results come back as that kind. Index-like arguments (seq_lens, page_table,
kv_lens, ids) may also be lists or tuples of ints. Bad input raises ValueError (values, shapes),
TypeError (types, dtypes, kinds) or MemoryError (an allocation failed), each message starting with the
parameter's name; the C++ library validates what Python does not and reports it the same way.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from . import _attn
from .functional import (_array, _bound, _call, _diagonals, _dtype_name, _empty, _flag, _for_binding, _int, _ints,
                         _is_tensor, _lengths, _mask, _rank)

_WEIGHTS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")
# C++ parameter names -> the Python ones, per function family.
_ROTARY_NAMES = {"rotary.cos": "rotary_cos", "rotary.sin": "rotary_sin"}
_MHA_NAMES = {"x_q": "x", "mask": "attn_mask", **_ROTARY_NAMES}
_CACHE_NAMES = dict(_ROTARY_NAMES)
_PAGED_CACHE_NAMES = {"sequence": "seq_id", **_ROTARY_NAMES}
_PAGED_ATTEND_NAMES = {"sequence": "ids"}


def _f32(name, x):
    dtype = _dtype_name(x)
    if dtype != "float32":
        raise TypeError(f"{name}: dtype {dtype}; expected float32")
    return _for_binding(x)


def _f32_array(name, x, rank, shape_doc, kind=None, like=None):
    """A float32 array argument of the given rank (and kind, when given); returns its kind."""
    kind = _array(name, x, kind, like)
    _f32(name, x)
    _rank(name, x, (rank,), f"{rank} ({shape_doc})")
    return kind


def _rotary(rotary_cos, rotary_sin, rotary_interleaved, kind, like):
    """The rotary arguments as the bindings take them: (cos, sin, interleaved), or (None, None, False) for none.
    cos, sin [positions, rotary_dim / 2] float32 of the call's kind; the library checks their shapes against the
    head dim and the positions the call turns."""
    if rotary_cos is None and rotary_sin is None:
        return None, None, False
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("rotary_cos: rotary_cos and rotary_sin come together; expected both or neither")
    _f32_array("rotary_cos", rotary_cos, 2, "[positions, rotary_dim / 2]", kind, like)
    _f32_array("rotary_sin", rotary_sin, 2, "[positions, rotary_dim / 2]", kind, like)
    return _for_binding(rotary_cos), _for_binding(rotary_sin), _flag("rotary_interleaved", rotary_interleaved)


def _optional_dim(name, value, default):
    """None -> 0 (the C++ library's "default"); otherwise an int >= 1."""
    if value is None:
        return 0
    n = _int(name, value)
    if n < 1:
        raise ValueError(f"{name}: {n}; expected an int >= 1, or None for {default}")
    return n


def _exact_parameter_count(d_model, heads, kv_heads, head_dim, v_head_dim, bias):
    """The parameter count in Python's unbounded ints, with the C++ library's defaults (0 = default), or None
    where the library will refuse the arguments itself. The library counts in int64, which sizes past 2**63
    would wrap: those are caught here."""
    if d_model < 1 or heads < 1:
        return None
    kv_heads = kv_heads or heads
    if head_dim == 0:
        if d_model % heads:
            return None
        head_dim = d_model // heads
    v_head_dim = v_head_dim or head_dim
    qkv_width = heads * head_dim + kv_heads * head_dim + kv_heads * v_head_dim
    return d_model * qkv_width + heads * v_head_dim * d_model + (qkv_width + d_model if bias else 0)


def _ids(ids, kind):
    """PagedKVCache.attend's sequence ids: a list, tuple or range of ints, or a 1-D integer array of q's kind."""
    if isinstance(ids, range):
        ids = list(ids)
    return [int(i) for i in _ints("ids", ids, kind, "q", "int64", 1, "[B]", "a sequence id (an int64)").tolist()]


class MultiHeadAttention:
    """Q = x W_Qᵀ + b_Q, K = x_kv W_Kᵀ + b_K, V = x_kv W_Vᵀ + b_V, heads split from the columns,
    Y_h = attention(Q_h, K_g, V_g) with query head h reading KV head g = h // (heads // kv_heads),
    out = concat_h(Y_h) W_Oᵀ + b_O. Weights in torch.nn.Linear's layout ([out_features, in_features]):
    w_q [heads·head_dim, d_model], w_k [kv_heads·head_dim, d_model], w_v [kv_heads·v_head_dim, d_model],
    w_o [d_model, heads·v_head_dim]; biases with bias=True. kv_heads = heads is MHA, 1 is MQA.
    kv_heads, head_dim and v_head_dim default (None) to heads, d_model // heads and head_dim."""

    def __init__(self, d_model, heads, kv_heads=None, head_dim=None, v_head_dim=None, bias=False, seed=None):
        args = (_int("d_model", d_model), _int("heads", heads), _optional_dim("kv_heads", kv_heads, "heads"),
                _optional_dim("head_dim", head_dim, "d_model // heads"),
                _optional_dim("v_head_dim", v_head_dim, "head_dim"), _flag("bias", bias))
        if seed is not None:
            seed = _int("seed", seed, 0, 2**64, "0 <= seed < 2**64")
        count = _exact_parameter_count(*args)
        if count is not None and count > 2**63 - 1:
            raise MemoryError(f"d_model: the module would have {count} parameters, more than can be addressed; "
                              "expected a module whose weights fit in memory")
        self._m = _call(_attn.MultiHeadAttention, *args, names={})
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

    def _check_name(self, name):
        if not isinstance(name, str) or name not in _WEIGHTS or (name.startswith("b_") and not self.bias):
            raise ValueError(f"name: {name!r}; expected one of {', '.join(_WEIGHTS[:8 if self.bias else 4])}")

    def get_weight(self, name):
        """A copy of one weight as a float32 NumPy array (w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)."""
        self._check_name(name)
        return np.asarray(self._m.get_weight(name), dtype=np.float32).reshape(self._shape(name))

    def set_weight(self, name, value):
        """Sets one weight from an array of its shape (see the class docstring): a NumPy array, a CPU torch
        tensor or nested lists of numbers (bool, int or float; stored as float32)."""
        self._check_name(name)
        if isinstance(value, np.ndarray) or _is_tensor(value):
            _array(name, value)
            if _is_tensor(value):
                if value.is_complex():
                    raise TypeError(f"{name}: dtype {_dtype_name(value)}; expected real numbers (stored as float32)")
                value = value.detach().tolist()
        try:
            a = np.asarray(value)
        except ValueError:
            raise ValueError(f"{name}: a ragged nested list; expected an array of shape "
                             f"{list(self._shape(name))}") from None
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{name}: dtype {_dtype_name(a) if a.dtype.kind != 'O' else 'object'}; expected numbers "
                            f"(an array of shape {list(self._shape(name))}, stored as float32)")
        a = a.astype(np.float32)
        if a.shape != self._shape(name):
            raise ValueError(f"{name}: shape {list(a.shape)}; expected {list(self._shape(name))}")
        self._m.set_weight(name, a.ravel().tolist())

    def __call__(self, x, x_kv=None, *, attn_mask=None, is_causal=False, causal_alignment=None, kv_lens=None):
        """Self-attention of x [B, S, d_model], or cross-attention of x (queries) to x_kv [B, Skv, d_model];
        returns [B, S, d_model] of x's kind. float32. attn_mask (bool or float, broadcastable to
        [B, heads, S, Skv]) and x_kv are of x's kind; kv_lens ([B] key lengths) is an integer array of x's
        kind or a list or tuple of ints (see scaled_dot_product_attention)."""
        kind = _f32_array("x", x, 3, "[B, S, d_model]")
        if x_kv is not None:
            _f32_array("x_kv", x_kv, 3, "[B, Skv, d_model]", kind, "x")
        is_causal = _flag("is_causal", is_causal)
        mask = _mask(attn_mask, kind, "x", 4)
        lens = _lengths("kv_lens", kv_lens, kind, "x")
        causal = _diagonals(is_causal, causal_alignment, None)[0]
        out = _empty(kind, x, (x.shape[0], x.shape[1], self.d_model))
        _call(self._m.forward, _for_binding(x), _for_binding(x if x_kv is None else x_kv), _for_binding(out),
              _bound(mask), _bound(lens), causal, x_kv is not None, names=_MHA_NAMES)
        return out

    forward = __call__

    def forward_cached(self, x, cache, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
        """A decode step of one sequence: x [1, T, d_model] float32 are the new tokens; their K/V are
        appended to `cache` (a KVCache) and their queries attend to the whole cache (bottom-right causal).
        With rotary_cos, rotary_sin [positions, rotary_dim / 2] float32 (rotary_dim <= head_dim), the new tokens'
        queries and keys are turned by the rotary embedding at their positions len(cache) + t first (the keys as
        the cache stores them): pairs (i, i + rotary_dim / 2), GPT-NeoX's and Llama's, or (2i, 2i + 1) with
        rotary_interleaved=True (GPT-J's); a model's whole decode step is this one call."""
        kind = _f32_array("x", x, 3, "[1, T, d_model]")
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache: got {type(cache).__module__}.{type(cache).__qualname__}; expected an attn.KVCache")
        cos, sin, interleaved = _rotary(rotary_cos, rotary_sin, rotary_interleaved, kind, "x")
        out = _empty(kind, x, (x.shape[0], x.shape[1], self.d_model))
        with cache._lock.write():
            _call(self._m.forward_cached, _for_binding(x), cache._c, _for_binding(out), cos, sin, interleaved,
                  names=_MHA_NAMES)
        return out


_CACHE_DTYPES = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16",
                 "int8": "i8", "i8": "i8", "int4": "i4", "i4": "i4"}


def _cache_dtype(dtype):
    """A cache's storage dtype name as the binding takes it."""
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    if name not in _CACHE_DTYPES:
        raise ValueError(f"dtype: {dtype!r}; expected float32, bfloat16, float16, int8 or int4")
    return _CACHE_DTYPES[name]


class _CacheLock:
    """A cache object's calls from several Python threads: attends (const) together, each call that changes the
    cache alone. append and attend run without the GIL, and a sequence added or removed meanwhile changed the table an
    attend read (spurious "id does not exist" errors, a data race in C++). A waiting change goes before new attends."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = self._writers_waiting = 0
        self._writer = False

    @contextlib.contextmanager
    def read(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self):
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class KVCache:
    """One sequence's keys and values, contiguous, for `capacity` tokens: append K/V of new tokens, then
    attend the new queries to everything cached with bottom-right causal alignment. Stored as `dtype`: float32
    (default), bfloat16, float16, int8 (a float32 scale per token and KV head; the kernels read the 8-bit rows) or
    int4 (two values per byte, a float32 scale per 32 values of a row: 5 bits per value).
    Appended K/V and the queries are float32 whatever the storage."""

    def __init__(self, kv_heads, head_dim, capacity, v_head_dim=None, dtype="float32"):
        head_dim, v_head_dim = _int("head_dim", head_dim), _optional_dim("v_head_dim", v_head_dim, "head_dim")
        self._c = _call(_attn.KVCache, _int("kv_heads", kv_heads), head_dim, v_head_dim, _int("capacity", capacity),
                        _cache_dtype(dtype), names=_CACHE_NAMES)
        self.v_head_dim = v_head_dim or head_dim
        self._lock = _CacheLock()

    def __len__(self):
        with self._lock.read():
            return self._c.length

    @property
    def dtype(self):
        """The storage: "f32", "bf16", "f16", "i8" or "i4"."""
        return self._c.dtype

    @property
    def capacity(self):
        return self._c.capacity

    def append(self, k, v, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
        """k [1, Hkv, T, Dk], v [1, Hkv, T, Dv] float32 (v of k's kind); past the capacity is a ValueError,
        nothing changes. With rotary_cos, rotary_sin [positions, rotary_dim / 2] float32, the keys are turned by the
        rotary embedding as they are written, token t at position len(self) + t (pairs as in
        MultiHeadAttention.forward_cached); the values as given."""
        kind = _f32_array("k", k, 4, "[1, Hkv, T, Dk]")
        _f32_array("v", v, 4, "[1, Hkv, T, Dv]", kind, "k")
        cos, sin, interleaved = _rotary(rotary_cos, rotary_sin, rotary_interleaved, kind, "k")
        with self._lock.write():
            _call(self._c.append, _for_binding(k), _for_binding(v), cos, sin, interleaved, names=_CACHE_NAMES)

    def attend(self, q, return_lse=False):
        """q [1, Hq, T, Dk] float32 -> out [1, Hq, T, Dv] (and the float32 lse [1, Hq, T] with return_lse)."""
        kind = _f32_array("q", q, 4, "[1, Hq, T, Dk]")
        return_lse = _flag("return_lse", return_lse)
        b, hq, t, _ = q.shape
        out = _empty(kind, q, (b, hq, t, self.v_head_dim))
        lse = _empty(kind, q, (b, hq, t), "float32") if return_lse else None
        with self._lock.read():
            _call(self._c.attend, _for_binding(q), _for_binding(out), _bound(lse), names=_CACHE_NAMES)
        return (out, lse) if return_lse else out

    def truncate(self, length):
        """Keeps the first `length` tokens (0 <= length <= len(self))."""
        length = _int("length", length)
        with self._lock.write():
            _call(self._c.truncate, length, names=_CACHE_NAMES)

    def clear(self):
        with self._lock.write():
            self._c.clear()


class PagedKVCache:
    """A pool of `num_pages` pages of `page_size` tokens shared by many sequences (vLLM's PagedAttention
    layout): add_sequence() gives an id, append(id, k, v) grows it page by page, remove_sequence(id)
    returns its pages to the pool, attend(ids, q) decodes a batch of sequences of ragged lengths at once.
    Stored as `dtype` (float32, bfloat16, float16, int8 or int4, as KVCache); K/V and queries are float32."""

    def __init__(self, kv_heads, head_dim, page_size, num_pages, v_head_dim=None, dtype="float32"):
        head_dim, v_head_dim = _int("head_dim", head_dim), _optional_dim("v_head_dim", v_head_dim, "head_dim")
        self._c = _call(_attn.PagedKVCache, _int("kv_heads", kv_heads), head_dim, v_head_dim,
                        _int("page_size", page_size), _int("num_pages", num_pages), _cache_dtype(dtype),
                        names=_CACHE_NAMES)
        self.v_head_dim = v_head_dim or head_dim
        self._lock = _CacheLock()

    @property
    def free_pages(self):
        with self._lock.read():
            return self._c.free_pages

    @property
    def dtype(self):
        """The storage: "f32", "bf16", "f16", "i8" or "i4"."""
        return self._c.dtype

    def add_sequence(self):
        with self._lock.write():
            return self._c.add_sequence()

    def remove_sequence(self, seq_id):
        seq_id = _int("seq_id", seq_id)
        with self._lock.write():
            _call(self._c.remove_sequence, seq_id, names=_PAGED_CACHE_NAMES)

    def length(self, seq_id):
        seq_id = _int("seq_id", seq_id)
        with self._lock.read():
            return _call(self._c.length, seq_id, names=_PAGED_CACHE_NAMES)

    def append(self, seq_id, k, v, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
        """k [1, Hkv, T, Dk], v [1, Hkv, T, Dv] float32 (v of k's kind) for sequence seq_id; an exhausted
        pool is a ValueError and nothing changes. rotary_cos, rotary_sin: as KVCache.append, token t at the
        sequence's position length(seq_id) + t."""
        seq_id = _int("seq_id", seq_id)
        kind = _f32_array("k", k, 4, "[1, Hkv, T, Dk]")
        _f32_array("v", v, 4, "[1, Hkv, T, Dv]", kind, "k")
        cos, sin, interleaved = _rotary(rotary_cos, rotary_sin, rotary_interleaved, kind, "k")
        with self._lock.write():
            _call(self._c.append, seq_id, _for_binding(k), _for_binding(v), cos, sin, interleaved,
                  names=_PAGED_CACHE_NAMES)

    def attend(self, ids, q, return_lse=False):
        """q [B, Hq, T, Dk] float32, row b the new queries of sequence ids[b] -> out [B, Hq, T, Dv] (and lse).
        ids: a list, tuple or range of ints, or a 1-D integer array of q's kind."""
        kind = _f32_array("q", q, 4, "[B, Hq, T, Dk]")
        ids = _ids(ids, kind)
        return_lse = _flag("return_lse", return_lse)
        b, hq, t, _ = q.shape
        out = _empty(kind, q, (b, hq, t, self.v_head_dim))
        lse = _empty(kind, q, (b, hq, t), "float32") if return_lse else None
        with self._lock.read():
            _call(self._c.attend, ids, _for_binding(q), _for_binding(out), _bound(lse), names=_PAGED_ATTEND_NAMES)
        return (out, lse) if return_lse else out


def attention_cost(seq, d_model, heads, kv_heads=None, head_dim=None, v_head_dim=None, causal=False, batch=1,
                   bytes_per_element=4):
    """FLOPs (2 per multiply-add; 'seed_ops' counts 1 as the seeds do) and bytes of each stage of one layer:
    a dict with 'stages' (name, flops, seed_ops, bytes), totals, 'dominant' and 'crossover_seq'."""
    return _call(_attn.attention_cost, _int("seq", seq), _int("d_model", d_model), _int("heads", heads),
                 _optional_dim("kv_heads", kv_heads, "heads"), _optional_dim("head_dim", head_dim, "d_model // heads"),
                 _optional_dim("v_head_dim", v_head_dim, "head_dim"), _flag("causal", causal), _int("batch", batch),
                 _int("bytes_per_element", bytes_per_element), names={})


def parameter_count(d_model, heads, kv_heads=None, head_dim=None, v_head_dim=None, bias=False):
    """Weights of one attention layer: d·h·(3·d_k + d_v) for MHA without bias (512, 8 heads -> 1,048,576)."""
    args = (_int("d_model", d_model), _int("heads", heads), _optional_dim("kv_heads", kv_heads, "heads"),
            _optional_dim("head_dim", head_dim, "d_model // heads"), _optional_dim("v_head_dim", v_head_dim, "head_dim"),
            _flag("bias", bias))
    exact = _exact_parameter_count(*args)
    if exact is not None and exact > 2**63 - 1:  # the library counts in int64
        raise ValueError(f"d_model: the layer has {exact} parameters; expected at most 2**63 - 1 (an int64)")
    return _call(_attn.parameter_count, *args, names={})


_KV_DTYPES = ("f32", "f16", "bf16", "fp8", "int8", "int4")


def kv_cache_bytes(layers, kv_heads, head_dim, seq, batch=1, dtype="f16"):
    """2 (K and V) · layers · kv_heads · seq · batch · (head_dim · bytes per element of dtype + scale bytes):
    dtype 'f32', 'f16', 'bf16', 'fp8', 'int8' (attn's 8-bit cache, KVCache(dtype="int8"): 1 byte per element and
    an fp32 scale per token and KV head) or 'int4' (its 4-bit cache: half a byte per element, rows rounded up to whole
    bytes, and an fp32 scale per 32 values of a row)."""
    if not isinstance(dtype, str) or dtype not in _KV_DTYPES:
        raise (ValueError if isinstance(dtype, str) else TypeError)(
            f"dtype: {dtype!r}; expected 'f32', 'f16', 'bf16', 'fp8', 'int8' or 'int4'")
    return _call(_attn.kv_cache_bytes, _int("layers", layers), _int("kv_heads", kv_heads), _int("head_dim", head_dim),
                 _int("seq", seq), _int("batch", batch), dtype, names={})
