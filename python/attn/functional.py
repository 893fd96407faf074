"""attn's functions with PyTorch-compatible signatures, over NumPy arrays and PyTorch CPU tensors.

Each function checks what only Python knows (which kind of array came in, PyTorch's rules that the C++
library does not have), allocates the outputs as that same kind, and hands every array to the C++
library by pointer and strides (attn._attn). The library checks everything else; its errors arrive as
ValueError (bad values or shapes) or TypeError (bad types), with the C++ message, in which the
library's short names q, k, v and mask are replaced by this function's parameter names.
"""

from __future__ import annotations

import operator
import sys

import numpy as np

from . import _attn

_FLOATS = ("float32", "bfloat16", "float16")
_ALIGNMENTS = ("top_left", "bottom_right")
# The C++ library's parameter names -> the Python ones (the first word of every C++ message).
_PY_NAMES = {"q": "query", "k": "key", "v": "value", "mask": "attn_mask"}


# ---- arrays: which kind, which dtype, how to allocate ----------------------------------------------


def _torch():
    """The torch module if the caller has imported it (a torch tensor can only come from there)."""
    return sys.modules.get("torch")


def _kind(name, x):
    """'numpy' or 'torch'; anything else is a TypeError naming the parameter."""
    if isinstance(x, np.ndarray):
        return "numpy"
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    raise TypeError(f"{name}: got {type(x).__module__}.{type(x).__qualname__}; "
                    "expected a numpy.ndarray or a torch.Tensor")


def _dtype_name(x):
    """'float32', 'bfloat16', 'bool', ... for a NumPy array (ml_dtypes included) or a torch tensor."""
    name = str(x.dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def _same_kind(name, x, kind, like):
    if _kind(name, x) != kind:
        raise TypeError(f"{name}: a {_kind_label(_kind(name, x))}; expected a {_kind_label(kind)} like {like}")


def _kind_label(kind):
    return "numpy.ndarray" if kind == "numpy" else "torch.Tensor"


def _check_torch(name, x):
    if x.device.type != "cpu":
        raise TypeError(f"{name}: on device {x.device}; expected a CPU tensor")


def _wants_grad(*xs):
    """True when autograd is on and a torch tensor among xs requires grad."""
    torch = _torch()
    return torch is not None and torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _for_binding(x):
    """What the C++ binding reads: the same memory. NumPy bfloat16 (ml_dtypes) goes as its uint16 bits
    (NumPy can export neither bfloat16 nor its buffer format; the binding gets bf16_bits=True); torch
    tensors with autograd, conjugate or negative bits are resolved by torch (no copy in the common case)."""
    if isinstance(x, np.ndarray):
        return x.view(np.uint16) if x.dtype.name == "bfloat16" else x
    return x.detach().resolve_conj().resolve_neg()


def _empty(kind, like, shape, dtype=None):
    """An uninitialised array of the given kind; dtype None means like.dtype, 'float32' means float32."""
    if kind == "numpy":
        return np.empty(shape, dtype=like.dtype if dtype is None else np.float32)
    torch = _torch()
    return torch.empty(shape, dtype=like.dtype if dtype is None else torch.float32, device="cpu")


def _as_float32(kind, x):
    if kind == "numpy":
        return x.astype(np.float32)
    return x.to(_torch().float32)


def _lead1(x):
    """[H, S, D] -> [1, H, S, D] as a view (both NumPy and torch accept None indexing)."""
    return x[None]


def _call(fn, *args):
    """Runs a binding function, renaming the C++ parameter at the head of its error message."""
    try:
        return fn(*args)
    except (ValueError, TypeError) as e:
        head, sep, rest = str(e).partition(": ")
        if sep and head in _PY_NAMES:
            raise type(e)(f"{_PY_NAMES[head]}: {rest}") from None
        raise


# ---- scaled dot-product attention ------------------------------------------------------------------


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, causal_alignment=None, kv_lens=None, window=None,
                                 return_lse=False):
    """softmax(scale · query keyᵀ + mask) value, with torch.nn.functional.scaled_dot_product_attention's
    signature and semantics where the names match.

    query [B, Hq, Sq, Dk], key [B, Hkv, Skv, Dk], value [B, Hkv, Skv, Dv] (or all three without the
    batch dimension: [H, S, D]), float32, bfloat16 or float16, all the same dtype; NumPy arrays
    (bfloat16 through ml_dtypes) or CPU torch tensors, all the same kind. Any strides: nothing is
    copied. Returns out [B, Hq, Sq, Dv] of query's kind and dtype, and with return_lse=True the pair
    (out, lse), lse float32 [B, Hq, Sq]: the natural log of each row's softmax denominator.

    attn_mask   broadcastable to [B, Hq, Sq, Skv]; bool: True = take part, False = masked out;
                float (any float dtype, used as float32): added to the scaled scores (finite or -inf).
    dropout_p   must be 0.0 (accepted so positional calls written for PyTorch keep their meaning).
    is_causal   key j is allowed for query i when j <= i (PyTorch's top-left diagonal), or when
                j <= i + Skv - Sq with causal_alignment='bottom_right' (FlashAttention's; a KV cache's).
                Unlike PyTorch it combines with attn_mask (both apply).
    scale       multiplies query keyᵀ; default 1/sqrt(Dk); must be finite and > 0.
    enable_gqa  allow Hkv < Hq (Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv)).
                Without it Hq != Hkv is an error, as in PyTorch.
    causal_alignment  None or 'top_left' (the default) or 'bottom_right': the diagonal that is_causal
                and window are measured from (for batch b, Skv is kv_lens[b] when given).
    kv_lens     [B] integer key lengths: keys j >= kv_lens[b] are padding and ignored.
    window      (left, right) local attention: key j allowed when diag(i) - left <= j <= diag(i) + right;
                -1 or None on a side means unbounded.
    return_lse  also return the log-sum-exp (for merge_attention).

    A row with no allowed key gets out = 0 and lse = -inf (PyTorch's math path gives NaN or 0).
    """
    kind = _kind("query", query)
    _same_kind("key", key, kind, "query")
    _same_kind("value", value, kind, "query")
    qdtype = _dtype_name(query)
    if qdtype not in _FLOATS:
        raise TypeError(f"query: dtype {qdtype}; expected float32, bfloat16 or float16")
    for name, x in (("key", key), ("value", value)):
        if _dtype_name(x) != qdtype:
            raise TypeError(f"{name}: dtype {_dtype_name(x)}; expected the dtype of query ({qdtype})")
    if query.ndim not in (3, 4):
        raise ValueError(f"query: rank {query.ndim} (shape {list(query.shape)}); "
                         "expected 4 ([B, H, S, D]) or 3 ([H, S, D])")
    for name, x in (("key", key), ("value", value)):
        if x.ndim != query.ndim:
            raise ValueError(f"{name}: rank {x.ndim} (shape {list(x.shape)}); expected rank {query.ndim} like query")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: {dropout_p!r}; expected 0.0 (attn computes attention without dropout)")
    hq, hkv = query.shape[-3], key.shape[-3]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"key: {hkv} heads but query has {hq}; expected the same number of heads "
                         "(or enable_gqa=True for grouped-query attention)")
    if kind == "torch":
        for name, x in (("query", query), ("key", key), ("value", value)):
            _check_torch(name, x)

    mask = None
    if attn_mask is not None:
        _same_kind("attn_mask", attn_mask, kind, "query")
        if kind == "torch":
            _check_torch("attn_mask", attn_mask)
            if _wants_grad(attn_mask):
                raise ValueError("attn_mask: requires grad; expected a mask without grad "
                                 "(attn differentiates query, key and value only)")
        mdtype = _dtype_name(attn_mask)
        if mdtype == "bool" or mdtype == "float32":
            mask = attn_mask
        elif mdtype in ("float16", "bfloat16", "float64"):
            mask = _as_float32(kind, attn_mask)
        else:
            raise TypeError(f"attn_mask: dtype {mdtype}; expected bool (True = keep) or a float dtype (added)")
        if mask.ndim > query.ndim:
            raise ValueError(f"attn_mask: rank {mask.ndim} (shape {list(mask.shape)}); "
                             f"expected at most the rank of query ({query.ndim})")
        mask = _for_binding(mask)

    lens = None if kv_lens is None else _key_lengths(kv_lens)
    causal, left, right, align = _diagonals(is_causal, causal_alignment, window)
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
            raise TypeError(f"scale: got {type(scale).__name__}; expected a float")
        scale = float(scale)

    batched = query.ndim == 4
    q, k, v = (x if batched else _lead1(x) for x in (query, key, value))
    options = (mask, lens, scale, causal, left, right, align)
    if _wants_grad(query, key, value):
        out, lse = _autograd_function().apply(q, k, v, options)
    else:
        out, lse = _forward(kind, q, k, v, options, return_lse, kind == "numpy" and qdtype == "bfloat16")
    if not batched:
        out = out[0]
        lse = None if lse is None else lse[0]
    return (out, lse) if return_lse else out


def _forward(kind, q, k, v, options, return_lse, bf16_bits=False):
    """out (and lse when asked, else None) of 4-D q, k, v, allocated as q's kind."""
    b, hq, sq, _ = q.shape
    out = _empty(kind, q, (b, hq, sq, v.shape[-1]))
    lse = _empty(kind, q, (b, hq, sq), "float32") if return_lse else None
    _call(_attn.attention, _for_binding(q), _for_binding(k), _for_binding(v), _for_binding(out), lse, *options,
          bf16_bits)
    return out, lse


_AUTOGRAD = None


def _autograd_function():
    """attn as a torch.autograd.Function (made on first use, so that torch stays optional): the forward
    saves O and the log-sum-exp, the backward is attn's deterministic FlashAttention-style backward.
    Gradients flow to query, key and value through out; lse is returned as non-differentiable."""
    global _AUTOGRAD
    if _AUTOGRAD is None:
        torch = _torch()

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, options):
                q, k, v = (_for_binding(x) for x in (q, k, v))
                out, lse = _forward("torch", q, k, v, options, True)
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.options = options
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            def backward(ctx, grad_out, _grad_lse):
                q, k, v, out, lse = ctx.saved_tensors
                grads = [torch.empty(x.shape, dtype=x.dtype) for x in (q, k, v)]
                _call(_attn.attention_backward, q, k, v, out, lse, _for_binding(grad_out.to(q.dtype)), *grads,
                      *ctx.options)
                return (*grads, None)

        _AUTOGRAD = Attention
    return _AUTOGRAD


def _key_lengths(kv_lens):
    """kv_lens as an int32/int64 array (NumPy or torch, passed as is) or a NumPy int64 copy of a sequence."""
    torch = _torch()
    if torch is not None and isinstance(kv_lens, torch.Tensor):
        if kv_lens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"kv_lens: dtype {_dtype_name(kv_lens)}; expected int32 or int64")
        if kv_lens.device.type != "cpu":
            raise TypeError(f"kv_lens: on device {kv_lens.device}; expected a CPU tensor")
        return kv_lens
    lens = np.asarray(kv_lens)
    if lens.dtype.kind not in "iu":
        raise TypeError(f"kv_lens: dtype {lens.dtype}; expected integers (int32 or int64)")
    if lens.dtype not in (np.int32, np.int64):
        lens = lens.astype(np.int64)
    return lens


def _diagonals(is_causal, causal_alignment, window):
    """(causal, window_left, window_right, window_align) for the binding."""
    if causal_alignment is None:
        align = "top_left"
    elif isinstance(causal_alignment, str) and causal_alignment.replace("-", "_") in _ALIGNMENTS:
        align = causal_alignment.replace("-", "_")
    else:
        raise ValueError(f"causal_alignment: {causal_alignment!r}; expected None, 'top_left' or 'bottom_right'")
    causal = align if is_causal else "none"
    left = right = -1
    if window is not None:
        try:
            left, right = (-1 if w is None else operator.index(w) for w in window)
        except (TypeError, ValueError):
            raise TypeError(f"window: {window!r}; expected a pair of ints (left, right), -1 or None = unbounded") \
                from None
    return causal, left, right, align


# ---- merging partial results -----------------------------------------------------------------------


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Combines two attention results over disjoint key sets of the same queries (split-KV, cascade,
    distributed attention) into the result over both: returns (out, lse), as if the keys had been
    attended together. out_* [B, H, S, Dv] and lse_* [B, H, S] float32, as returned by
    scaled_dot_product_attention(..., return_lse=True) (or [H, S, Dv] and [H, S]); NumPy or torch.
    A side with lse = -inf contributes nothing.
    """
    kind = _kind("out_a", out_a)
    args = (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b))
    for name, x in args:
        _same_kind(name, x, kind, "out_a")
        if _dtype_name(x) != "float32":
            raise TypeError(f"{name}: dtype {_dtype_name(x)}; expected float32")
        if kind == "torch":
            _check_torch(name, x)
    if out_a.ndim not in (3, 4):
        raise ValueError(f"out_a: rank {out_a.ndim}; expected 4 ([B, H, S, Dv]) or 3 ([H, S, Dv])")
    for name, x in args[1:]:
        expected = out_a.ndim - (name.startswith("lse"))
        if x.ndim != expected:
            raise ValueError(f"{name}: rank {x.ndim}; expected {expected} (out_a has rank {out_a.ndim})")
    batched = out_a.ndim == 4
    oa, la, ob, lb = (x if batched else _lead1(x) for _, x in args)
    out = _empty(kind, out_a, tuple(oa.shape))
    lse = _empty(kind, out_a, tuple(oa.shape[:3]))
    _call(_attn.merge_attention, _for_binding(oa), _for_binding(la), _for_binding(ob), _for_binding(lb), out, lse)
    return (out[0], lse[0]) if not batched else (out, lse)
