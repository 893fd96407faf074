"""attn's functions with PyTorch-compatible signatures, over NumPy arrays and PyTorch tensors (CPU or CUDA):
scaled_dot_product_attention, attention_paged, attention_paged_cascade, describe_attention and merge_attention.

Each function checks what only Python knows (which kind of array came in, PyTorch's rules that the C++
library does not have), allocates the outputs as that same kind, and hands every array to the C++
library by pointer and strides (attn._attn). The attention functions check their arguments in one place
(_check_call) and hand the library one options object (_options -> attn._attn.Options), as the PyTorch
operators of attn.torch_ops do. The library checks everything else; its errors arrive as
ValueError (bad values or shapes), TypeError (bad types) or MemoryError (an allocation failed), with the
C++ message, in which the library's short names q, k, v and mask are replaced by this function's
parameter names.
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
#
# The rule on kinds, for every function of the package: every array argument is of the kind of the first
# one (query, x, q, out_a): all NumPy arrays or all torch tensors. Index-like arguments (kv_lens, seq_lens,
# page_table, ids) may also be Python lists or tuples of ints (converted).


def _torch():
    """The torch module if the caller has imported it (a torch tensor can only come from there)."""
    return sys.modules.get("torch")


def _is_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _kind_label(kind):
    return "numpy.ndarray" if kind == "numpy" else "torch.Tensor"


def _type_label(x):
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _array(name, x, kind=None, like=None, index=False):
    """Checks that x is an array attn can read and returns its kind, 'numpy' or 'torch'. With kind given
    (the kind of parameter `like`), x must be of that kind. NumPy arrays must have whole-element strides
    and aligned data; torch tensors must be dense (strided), on the CPU. index=True only changes the
    message: such arguments may also be lists or tuples (see _ints)."""
    if isinstance(x, np.ndarray):
        found = "numpy"
    elif _is_tensor(x):
        found = "torch"
    else:
        if kind is None:
            expected = "a numpy.ndarray or a torch.Tensor"
        else:
            expected = f"a {_kind_label(kind)} like {like}"
        if index:
            expected += ", or a list or tuple of ints"
        raise TypeError(f"{name}: got {_type_label(x)}; expected {expected}")
    if kind is not None and found != kind:
        alternative = ", or a list or tuple of ints" if index else ""
        raise TypeError(f"{name}: a {_kind_label(found)}; expected a {_kind_label(kind)} like {like}{alternative}")
    if found == "torch":
        _check_torch(name, x)
    else:
        _check_numpy(name, x)
    return found


def _check_torch(name, x):
    torch = _torch()
    if x.layout is torch.strided and (x.is_cpu or x.is_cuda) and not x.is_nested:
        return  # (the common case, read in fewer steps than the errors below take)
    if getattr(x, "is_nested", False):
        raise TypeError(f"{name}: a nested tensor; expected a dense (strided) tensor")
    if x.layout != torch.strided:
        layout = str(x.layout)
        what = "a sparse tensor" if "sparse" in layout else "a tensor of layout"
        raise TypeError(f"{name}: {what} ({layout}); expected a dense (strided) tensor")
    if x.device.type not in ("cpu", "cuda"):  # (CUDA: the library's CUDA backend; docs/cuda.md says what has run)
        raise TypeError(f"{name}: on device {x.device}; expected a CPU or CUDA tensor")


def _check_numpy(name, x):
    size = x.dtype.itemsize
    if size > 1 and x.size > 1:
        for d, (n, stride) in enumerate(zip(x.shape, x.strides)):
            if n > 1 and stride % size:
                raise ValueError(f"{name}: stride of dimension {d} is {stride} bytes, not a multiple of the "
                                 f"element size ({size} bytes); expected strides of whole elements")
    if size > 1 and x.size > 0 and not x.flags.aligned:
        raise ValueError(f"{name}: data not aligned to its {size}-byte elements; expected an aligned array "
                         "(numpy.ascontiguousarray makes one)")


def _dtype_name(x):
    """'float32', 'bfloat16', 'bool', ... for a NumPy array (ml_dtypes included) or a torch tensor; a NumPy
    dtype in non-native byte order keeps its byte-order character ('>f4'), so that it matches no name."""
    dtype = x.dtype
    name = _DTYPE_NAMES.get(dtype)  # (a call asks 6-10 times: str() of a dtype costs half a microsecond)
    if name is None:
        name = str(dtype)
        name = name[len("torch."):] if name.startswith("torch.") else name
        _DTYPE_NAMES[dtype] = name
    return name


_DTYPE_NAMES = {}  # dtype -> _dtype_name's answer (dtypes compare by kind, size and byte order: '>f4' != '<f4')


def _float_dtype(name, x, like=None, like_dtype=None):
    """The dtype name of a float array argument: float32, bfloat16 or float16 (like_dtype: exactly that)."""
    dtype = _dtype_name(x)
    if like_dtype is not None:
        if dtype != like_dtype:
            raise TypeError(f"{name}: dtype {dtype}; expected the dtype of {like} ({like_dtype})")
    elif dtype not in _FLOATS:
        if isinstance(x, np.ndarray) and not x.dtype.isnative:
            raise TypeError(f"{name}: dtype {dtype} ({x.dtype.name} in non-native byte order); expected float32, "
                            "bfloat16 or float16 in the machine's byte order")
        raise TypeError(f"{name}: dtype {dtype}; expected float32, bfloat16 or float16")
    return dtype


# Quantised K/V by their array dtype: int8 (an 8-bit cache, a float32 scale per row) and uint8 read as packed 4-bit
# values (a 4-bit cache: two values per byte, value d of a row in the low nibble of byte d / 2 when d is even, the
# high one when odd, each stored as q + 8 for q in [-8, 7]; a float32 scale per block of 32 values of a row).
_QUANTISED = {"int8": "int8", "uint8": "int4"}


def _kv_quantised(kind, key, value, k_scale, v_scale, names):
    """The quantised type of key and value ("int8", "int4"), or None for values: an 8-bit KV cache's rows (row j of
    head h is k_scale[.., h, j] · key[.., h, j, :], likewise for value) or a 4-bit one's (value d of row j is
    k_scale[.., h, j, d // 32] · its nibble's q); then both must be of that dtype and the scales float32 of the
    call's kind (their shapes are the library's checks). Otherwise no scale may be given. names: the Python names
    of key and value."""
    kn, vn = names
    kd, vd = _dtype_name(key), _dtype_name(value)
    if kd not in _QUANTISED and vd not in _QUANTISED:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None:
                raise TypeError(f"{name}: is set for {kd} {kn}; expected it only with int8 (or packed 4-bit uint8) "
                                f"{kn} and {vn}")
        return None
    if kd != vd:
        name, dtype = (vn, vd) if kd in _QUANTISED else (kn, kd)
        like = kd if name == vn else vd
        raise TypeError(f"{name}: dtype {dtype}; expected {like} like {kn if name == vn else vn} (a "
                        f"{'4' if like == 'uint8' else '8'}-bit KV cache)")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is not None:
            _array(name, s, kind, "query")
            if _dtype_name(s) != "float32":
                raise TypeError(f"{name}: dtype {_dtype_name(s)}; expected float32 (a scale per "
                                f"{'row' if kd == 'int8' else 'block of 32 values of a row'} of {kn})")
    return _QUANTISED[kd]


def _value_dim(v):
    """Dv of value rows: their last dimension, or twice it for packed 4-bit rows (two values per byte)."""
    return v.shape[-1] * (2 if _dtype_name(v) == "uint8" else 1)


def _rank(name, x, ranks, expected):
    """x.ndim must be in ranks; `expected` describes them ("4 ([B, H, S, D])")."""
    if x.ndim not in ranks:
        raise ValueError(f"{name}: rank {x.ndim} (shape {list(x.shape)}); expected {expected}")


def _flag(name, value):
    """A bool argument: True or False (NumPy's bool_ too); anything else is a TypeError."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name}: got {type(value).__name__} {value!r}; expected True or False")


def _int(name, value, low=-2**63, high=2**63, expected=None):
    """An int argument (Python or NumPy int, not bool) in [low, high) (default: one that fits in int64);
    `expected` describes the range in the message of a value outside it."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: got bool {value!r}; expected an int")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: got {type(value).__name__} {value!r}; expected an int") from None
    if not low <= n < high:
        raise ValueError(f"{name}: {n} is out of range; expected "
                         f"{expected or f'an int64 (-2**63 <= {name} < 2**63)'}")
    return n


def _wants_grad(*xs):
    """True when autograd is on and a torch tensor among xs requires grad."""
    torch = _torch()
    return torch is not None and torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _for_binding(x):
    """What the C++ binding reads: the same memory. NumPy bfloat16 (ml_dtypes) goes as its uint16 bits
    (NumPy can export neither bfloat16 nor its buffer format; the binding gets bf16_bits=True); torch
    tensors with autograd, conjugate or negative bits are resolved by torch (no copy in the common case).
    A CPU tensor then goes as its DLPack capsule (torch.utils.dlpack.to_dlpack, 0.4 µs): given the tensor, the
    binding's import calls the tensor's Python-level __dlpack__, 21-35 µs of a one-token decode call's 38-52 µs in
    the binding (four tensors; bench/results_cascadelake_small_decode.md). A capsule is read once: call this
    once per argument of a binding call. CUDA tensors go as they are, through the DLPack protocol, which
    orders the call after the work queued on the tensor's stream (docs/cuda.md)."""
    if isinstance(x, np.ndarray):  # (dtype.kind first: dtype.name costs a microsecond, and this runs per array)
        return x.view(np.uint16) if x.dtype.kind == "V" and x.dtype.name == "bfloat16" else x
    # (each step only where it changes something: detach() and the resolves cost 1.4 µs even when they do not)
    if x.requires_grad:
        x = x.detach()
    if x.is_conj():
        x = x.resolve_conj()
    if x.is_neg():
        x = x.resolve_neg()
    if x.is_cuda:
        return x
    global _to_dlpack
    if _to_dlpack is None:
        from torch.utils.dlpack import to_dlpack as _to_dlpack
    return _to_dlpack(x)


_to_dlpack = None  # torch.utils.dlpack.to_dlpack, looked up on first use (torch stays optional)


def _empty(kind, like, shape, dtype=None):
    """An uninitialised array of the given kind; dtype None means like.dtype, 'float32' means float32."""
    if kind == "numpy":
        return np.empty(shape, dtype=like.dtype if dtype is None else np.float32)
    torch = _torch()
    return torch.empty(shape, dtype=like.dtype if dtype is None else torch.float32, device=like.device)


def _outputs(kind, q, v, want_lse):
    """An attention call's out [B, Hq, Sq, Dv] of q's dtype and, when wanted, its float32 lse [B, Hq, Sq] (else
    None), allocated as q's kind (q 4-D; v: value or the value pages)."""
    b, hq, sq, _ = q.shape
    out = _empty(kind, q, (b, hq, sq, _value_dim(v)))
    return out, _empty(kind, q, (b, hq, sq), "float32") if want_lse else None


def _as_float32(kind, x):
    if kind == "numpy":
        with np.errstate(over="ignore"):  # (values past float32's range: the callers that care check them)
            return x.astype(np.float32)
    return x.to(_torch().float32)


def _lead1(x):
    """[H, S, D] -> [1, H, S, D] as a view (both NumPy and torch accept None indexing)."""
    return x[None]


def _rename_error(e, names, note=""):
    """Renames the parameter at the head of error e's message ("name: ...") by `names` in place, adding `note` once;
    True when it did (the caller re-raises e, its traceback kept)."""
    head, sep, rest = str(e).partition(": ")
    if not sep or head not in names:
        return False
    e.args = (f"{names[head]}: {rest}" + (note if note and not rest.endswith(note) else ""),)
    return True


def _call(fn, *args, names=None):
    """Runs a binding function, renaming the C++ parameter at the head of its error message (names: C++
    name -> Python name; default those of scaled_dot_product_attention)."""
    try:
        return fn(*args)
    except (ValueError, TypeError, MemoryError) as e:
        _rename_error(e, _PY_NAMES if names is None else names)
        raise


# ---- masks and integer arguments --------------------------------------------------------------------


def _mask(attn_mask, kind, like, max_rank):
    """attn_mask as the library takes it: bool as is, float32 as is, other float dtypes as a float32 copy."""
    if attn_mask is None:
        return None
    _array("attn_mask", attn_mask, kind, like)
    if kind == "torch" and _wants_grad(attn_mask):
        raise ValueError("attn_mask: requires grad; expected a mask without grad "
                         "(attn differentiates query, key and value only)")
    mdtype = _dtype_name(attn_mask)
    if isinstance(attn_mask, np.ndarray) and attn_mask.dtype.kind == "f" and not attn_mask.dtype.isnative:
        mdtype = attn_mask.dtype.name
        mask = _as_float32(kind, attn_mask)  # to the machine's byte order
    elif mdtype == "bool" or mdtype == "float32":
        mask = attn_mask
    elif mdtype in ("float16", "bfloat16", "float64"):
        mask = _as_float32(kind, attn_mask)
    else:
        raise TypeError(f"attn_mask: dtype {mdtype}; expected bool (True = keep) or a float dtype (added)")
    if mdtype == "float64":  # a finite value past float32's range would become ±inf: refused, not changed
        _finite_in_float32(kind, attn_mask, mask)
    if mask.ndim < 1 or mask.ndim > max_rank:
        raise ValueError(f"attn_mask: rank {mask.ndim} (shape {list(mask.shape)}); "
                         f"expected 1 to {max_rank} (the rank of {like} at most)")
    return mask


def _finite_in_float32(kind, wide, mask):
    """Raises if a finite value of the float64 mask `wide` became ±inf in its float32 copy `mask` (1e300 read as
    +inf was refused as a value the caller never passed; -1e300 became -inf, hiding keys a finite bias keeps)."""
    if kind == "torch":
        import torch
        if torch.compiler.is_compiling():  # (a data-dependent check: eager calls make it)
            return
        bad = torch.isinf(mask) & torch.isfinite(wide)
        if bool(bad.any()):
            index = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
            raise ValueError(f"attn_mask: element {list(index)} is {float(wide[index])!r}, past float32's range; "
                             "expected finite values within ±3.4e38 (or -inf)")
        return
    with np.errstate(invalid="ignore"):
        bad = np.isinf(mask) & np.isfinite(wide)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"attn_mask: element {list(index)} is {float(wide[index])!r}, past float32's range; "
                         "expected finite values within ±3.4e38 (or -inf)")


# The integer dtypes index-like arguments are converted to, with their ranges.
_INT_TARGETS = {"int64": (np.int64, -2**63, 2**63 - 1), "int32": (np.int32, -2**31, 2**31 - 1)}


def _element(name, index):
    return name + "".join(f"[{i}]" for i in index)


def _a(obj):
    """'a float', 'an int', ... for the type of obj."""
    kind = type(obj).__name__
    return ("an " if kind[:1].lower() in "aeiou" else "a ") + kind


def _ints(name, x, kind, like, target, rank, shape_doc, expected):
    """An index-like argument (kv_lens, seq_lens: target 'int64'; page_table: 'int32') as an integer array
    the binding reads. x is an array of `kind` with any integer dtype, or a (nested) list or tuple of ints.
    int32/int64 arrays of the target's width or narrower that the C++ library takes (int32 and int64 for
    lengths, int32 for page tables) go as they are; other integer dtypes are converted after a range check:
    a value outside the target's range is a ValueError naming the element and showing its value. bool and
    float dtypes are TypeErrors. `rank` is the rank x must have (shape_doc describes it); `expected` says
    what a value should be, for the message of one out of the target's range."""
    np_target, low, high = _INT_TARGETS[target]
    keep = ("int32", "int64") if target == "int64" else ("int32",)
    if isinstance(x, (list, tuple)):
        shape, values = _nested_ints(name, x)
        _rank_of_shape(name, shape, rank, shape_doc)
        for i, n in enumerate(values):
            if not low <= n <= high:
                index = np.unravel_index(i, shape) if shape else ()
                raise ValueError(f"{name}: {_element(name, index)} = {n} is out of range; expected {expected}")
        return np.array(values, dtype=np_target).reshape(shape)
    _array(name, x, kind, like, index=True)
    _rank_of_shape(name, tuple(x.shape), rank, shape_doc)
    if isinstance(x, np.ndarray):
        return _numpy_ints(name, x, np_target, low, high, keep, expected)
    return _torch_ints(name, x, low, high, keep, target, expected)


def _rank_of_shape(name, shape, rank, shape_doc):
    if len(shape) != rank:
        raise ValueError(f"{name}: rank {len(shape)} (shape {list(shape)}); expected {rank} ({shape_doc})")


def _nested_ints(name, x):
    """(shape, flat list of Python ints) of a rectangular nested list/tuple of ints."""
    shape = []
    probe = x
    while isinstance(probe, (list, tuple)):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    values = []

    def walk(obj, index):
        depth = len(index)
        if depth == len(shape):
            if isinstance(obj, (list, tuple)):
                raise ValueError(f"{name}: {_element(name, index)} is {_a(obj)} where "
                                 f"{_element(name, (0,) * depth)} is an int; expected a rectangular nesting of ints")
            if isinstance(obj, (bool, np.bool_)):
                raise TypeError(f"{name}: {_element(name, index)} is a bool ({obj!r}); expected an int")
            try:
                values.append(operator.index(obj))
            except TypeError:
                raise TypeError(f"{name}: {_element(name, index)} is {_a(obj)} ({obj!r}); "
                                "expected an int") from None
            return
        if not isinstance(obj, (list, tuple)) or len(obj) != shape[depth]:
            found = (f"has {len(obj)} entries" if isinstance(obj, (list, tuple))
                     else f"is {_a(obj)}")
            raise ValueError(f"{name}: {_element(name, index)} {found} where {_element(name, (0,) * depth)} has "
                             f"{shape[depth]} entries; expected a rectangular nesting of ints (a ragged list)")
        for i, e in enumerate(obj):
            walk(e, index + (i,))

    walk(x, ())
    return tuple(shape), values


def _numpy_ints(name, x, np_target, low, high, keep, expected):
    dtype = x.dtype
    if dtype.kind not in "iu":
        raise TypeError(f"{name}: dtype {_dtype_name(x)}; expected integers (any int or uint dtype)")
    if dtype.isnative and dtype.name in keep:
        return x
    info = np.iinfo(dtype)
    if info.min < low or info.max > high:
        lo, hi = dtype.type(max(info.min, low)), dtype.type(min(info.max, high))
        bad = (x < lo) | (x > hi)
        if bad.any():
            index = np.unravel_index(int(np.argmax(bad)), x.shape)
            raise ValueError(f"{name}: {_element(name, index)} = {int(x[index])} is out of range; expected {expected}")
    return x.astype(np_target)


def _torch_ints(name, x, low, high, keep, target, expected):
    torch = _torch()
    dtype = _dtype_name(x)
    if dtype in keep:
        return x
    unsigned = {getattr(torch, f"uint{b}", None) for b in (16, 32, 64)} - {None}
    if x.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8) and x.dtype not in unsigned:
        raise TypeError(f"{name}: dtype {dtype}; expected integers (any int or uint dtype)")
    wide = x.detach()
    uint64 = dtype == "uint64"
    # int64 holds every value of every integer dtype but uint64, whose bits it holds (values >= 2**63 negative).
    wide = wide.view(torch.int64) if uint64 else wide.to(torch.int64)
    bad = (wide < low) | (wide > high)
    if uint64:
        bad = bad | (wide < 0)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        value = int(wide[index])
        if uint64 and value < 0:
            value += 2**64
        raise ValueError(f"{name}: {_element(name, index)} = {value} is out of range; expected {expected}")
    return wide if target == "int64" else wide.to(torch.int32)


def _on_device(kind, query, x):
    """An index argument given as a list (now a NumPy array) as a torch tensor on a CUDA query's device: every
    tensor of a call lives on one device (a torch tensor given on another is the library's clear error, naming it).
    Anything else as it is."""
    if kind == "torch" and isinstance(x, np.ndarray) and query.device.type != "cpu":
        return _torch().from_numpy(x).to(query.device)
    return x


def _lengths(name, lens, kind, like):
    """kv_lens / seq_lens: [B] key lengths of any integer dtype (or a list or tuple of ints), as int32/int64."""
    if lens is None:
        return None
    return _ints(name, lens, kind, like, "int64", 1, "[B]", "0 <= length < 2**63 (an int64)")


def _scale(scale):
    if scale is None:
        return None
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale: got {type(scale).__name__}; expected a float")
    try:
        return float(scale)
    except OverflowError:
        raise ValueError(f"scale: {scale} is out of range; expected a finite value > 0") from None


# ---- scaled dot-product attention ------------------------------------------------------------------


def _plain_call(query, key, value, is_causal, scale, causal_alignment, return_lse, softcap, k_scale, v_scale, paged,
                lengths=(), table=None, enable_gqa=True, mask=None):
    """The short path of scaled_dot_product_attention (paged=False) and attention_paged (paged=True) for the calls a
    model's or a server's decode step makes: (capsule, options) where the call is plain, else None (the
    general path then takes it). Plain: torch.Tensor (not a subclass) arguments on the CPU, dense, none requiring
    grad or carrying a negative bit, outside torch.compile; query 4-D of a float dtype; key and value (or the pages)
    4-D of query's dtype (pages: of one float dtype) or int8 with float32 k_scale and v_scale; `lengths` (kv_lens or
    seq_lens; kv_lens may be None) 1-D int32 or int64, `table` (a page table) 2-D int32; `mask` None or bool or
    float32 of rank 1 to 4; no ALiBi, sinks, window or dropout (the callers check those); bool flags, scale None or
    a float, softcap a float, causal_alignment None or one of its names as written; enable_gqa a bool, and with it
    False as many key as query heads (scaled_dot_product_attention's check; paged calls have none). Every such call
    passes each check of _check_call and gets the Options _options would give it: the general path's call with its
    checks read in fewer steps (a one-token decode spent most of its time in them:
    bench/results_cascadelake_small_decode.md)."""
    torch = _torch()
    if torch is None or torch.compiler.is_compiling():  # (first: tracing the reads below would break the graph)
        return None
    tensor = torch.Tensor
    if not (query.__class__ is tensor and key.__class__ is tensor and value.__class__ is tensor
            and is_causal.__class__ is bool and return_lse.__class__ is bool and softcap.__class__ is float
            and (scale is None or scale.__class__ is float)
            and (causal_alignment is None or causal_alignment.__class__ is str and causal_alignment in _ALIGNMENTS)
            and query.ndim == 4 and key.ndim == 4 and value.ndim == 4 and query.dtype in _torch_floats(torch)
            and enable_gqa.__class__ is bool and (enable_gqa or query.shape[1] == key.shape[1])):
        return None
    arrays = (query, key, value)
    if k_scale is not None or v_scale is not None:  # an 8-bit cache's rows and their float32 scales
        if not (key.dtype is torch.int8 and value.dtype is torch.int8 and k_scale.__class__ is tensor
                and v_scale.__class__ is tensor and k_scale.dtype is torch.float32 and v_scale.dtype is torch.float32):
            return None
        arrays += (k_scale, v_scale)
    elif not (value.dtype is key.dtype and (key.dtype is query.dtype or paged and key.dtype in _torch_floats(torch))):
        return None
    for x in lengths:
        if x is not None:
            if not (x.__class__ is tensor and x.dtype in (torch.int32, torch.int64) and x.ndim == 1):
                return None
            arrays += (x,)
    if table is not None:
        if not (table.__class__ is tensor and table.dtype is torch.int32 and table.ndim == 2):
            return None
        arrays += (table,)
    if mask is not None:  # (as _mask takes it: bool and float32 masks go as they are)
        if not (mask.__class__ is tensor and mask.dtype in (torch.bool, torch.float32) and 1 <= mask.ndim <= 4):
            return None
        arrays += (mask,)
    for x in arrays:
        if x.requires_grad or not x.is_cpu or x.layout is not torch.strided or x.is_nested or x.is_neg():
            return None
    global _to_dlpack
    if _to_dlpack is None:
        from torch.utils.dlpack import to_dlpack as _to_dlpack
    capsule = _to_dlpack  # (what _for_binding gives these tensors: none needs a detach or a resolve)
    kv_lens = None if paged or not lengths else lengths[0]
    cached = k_scale is None and kv_lens is None and mask is None  # Options holding no array are kept
    key_ = (is_causal, causal_alignment, scale, softcap)
    options = _PLAIN_OPTIONS.get(key_) if cached else None
    if options is None:
        causal, _, _, align = _diagonals(is_causal, causal_alignment, None)
        options = _options(mask=mask, kv_lens=kv_lens, scale=scale, causal=causal, window_align=align, softcap=softcap,
                           k_scale=k_scale, v_scale=v_scale)
        if cached:
            if len(_PLAIN_OPTIONS) >= 64:
                _PLAIN_OPTIONS.clear()
            _PLAIN_OPTIONS[key_] = options
    return capsule, options


_PLAIN_OPTIONS = {}  # (is_causal, causal_alignment, scale, softcap) -> the binding's Options (holding no array)
_TORCH_FLOATS = None


def _torch_floats(torch):
    global _TORCH_FLOATS
    if _TORCH_FLOATS is None:
        _TORCH_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
    return _TORCH_FLOATS


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, causal_alignment=None, kv_lens=None, window=None,
                                 return_lse=False, softcap=0.0, alibi_slopes=None, sinks=None, seed=None,
                                 k_scale=None, v_scale=None):
    """softmax(scale · query keyᵀ + mask) value, with torch.nn.functional.scaled_dot_product_attention's
    signature and semantics where the names match.

    query [B, Hq, Sq, Dk], key [B, Hkv, Skv, Dk], value [B, Hkv, Skv, Dv] (or all three without the
    batch dimension: [H, S, D]), float32, bfloat16 or float16, all the same dtype. Any strides: nothing
    is copied. Returns out [B, Hq, Sq, Dv] of query's kind and dtype, and with return_lse=True the pair
    (out, lse), lse float32 [B, Hq, Sq]: the natural log of each row's softmax denominator.

    Kinds: every array argument is of query's kind, all NumPy arrays (bfloat16 through ml_dtypes) or all
    dense torch tensors on one device (CPU, or CUDA: attn's CUDA backend); kv_lens may also be a list or tuple of
    ints.

    attn_mask   broadcastable to [B, Hq, Sq, Skv]; bool: True = take part, False = masked out;
                float (any float dtype, used as float32): added to the scaled scores (finite or -inf).
    dropout_p   attention dropout (PyTorch's and FlashAttention's dropout_p, in [0, 1)): each softmax weight is
                dropped with probability dropout_p and the kept ones scaled by 1 / (1 - dropout_p); lse is
                that of the weights before dropout. Applied whenever dropout_p > 0, as PyTorch does (pass
                0.0 at inference). Which weights drop is a function of seed and the (batch, head, query,
                key) position only (Philox4x32-10; docs/api.md "Score variants"): the same seed gives the same
                mask at any thread count, and the backward regenerates it.
    seed        with dropout_p > 0: the mask's seed, an int in [0, 2**64). None (the default) draws one from
                torch's default generator (torch inputs; torch.manual_seed makes it reproducible) or
                NumPy's global one (np.random.seed).
    is_causal   key j is allowed for query i when j <= i (PyTorch's top-left diagonal), or when
                j <= i + Skv - Sq with causal_alignment='bottom_right' (FlashAttention's; a KV cache's).
                Unlike PyTorch it combines with attn_mask (both apply).
    scale       multiplies query keyᵀ; default 1/sqrt(Dk); must be finite and > 0.
    enable_gqa  allow Hkv < Hq (Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv)).
                Without it Hq != Hkv is an error, as in PyTorch.
    causal_alignment  None or 'top_left' (the default) or 'bottom_right': the diagonal that is_causal
                and window are measured from (for batch b, Skv is kv_lens[b] when given).
    kv_lens     [B] key lengths: keys j >= kv_lens[b] are padding and ignored. Any integer dtype
                (int8 ... int64, uint8 ... uint64; int32 and int64 are read as they are, the others
                converted to int64 after a range check) or a list or tuple of ints; bool and float
                dtypes are refused (TypeError).
    window      (left, right) local attention: key j allowed when diag(i) - left <= j <= diag(i) + right;
                -1 or None on a side means unbounded; each side -1 or 0 <= side < 2**63.
    return_lse  also return the log-sum-exp (for merge_attention).
    softcap     logit soft-capping (Gemma 2), FlashAttention's softcap: with x = scale·q·k the score is
                softcap·tanh(x / softcap), before the mask and ALiBi biases; 0.0 = off.
    alibi_slopes  float [Hq] or [B, Hq] (FlashAttention's alibi_slopes): adds −slope·|i + Skv − Sq − j| to
                the score of query i and key j (bottom-right aligned; Skv = kv_lens[b] when given).
    sinks       float [Hq] (gpt-oss attention sinks): a logit per head that joins every row's softmax
                denominator and carries no value (-inf = none); lse includes it. A torch tensor that
                requires grad gets its gradient through the autograd path.

    k_scale, v_scale  float32 [B, Hkv, Skv] ([Hkv, Skv] unbatched): with key and value of dtype int8 (an 8-bit KV
                cache, as attn.KVCache(dtype="int8") stores it), row j of key head h is k_scale[b, h, j] · key[b, h, j, :]
                and likewise for value; the rows are widened in the kernel's registers (no float copy is made).
                Or key and value of dtype uint8 [.., Skv, D / 2]: packed 4-bit values (a 4-bit KV cache, as
                attn.KVCache(dtype="int4") stores it: value d of a row in the low nibble of byte d // 2 when d
                is even, the high one when odd, each nibble q + 8 for q in [-8, 7]) with scales float32
                [B, Hkv, Skv, ceil(D / 32)]: value d of row j is k_scale[b, h, j, d // 32] · q.
                Inference only: no autograd (a torch query that requires grad gets a result that does not) and
                no torch.compile graph (the call runs eagerly).

    A row with no allowed key gets out = 0 and lse = -inf (lse = the sink with sinks; PyTorch's math
    path gives NaN or 0).

    Errors: ValueError (values, shapes), TypeError (types, dtypes, kinds) or MemoryError (the library
    could not allocate its scratch), each message starting with the parameter's name; nothing is
    computed or returned then.
    """
    if (window is None and alibi_slopes is None and sinks is None and seed is None and dropout_p.__class__ is float
            and dropout_p == 0.0):
        plain = _plain_call(query, key, value, is_causal, scale, causal_alignment, return_lse, softcap, k_scale,
                            v_scale, False, (kv_lens,), enable_gqa=enable_gqa, mask=attn_mask)
        if plain is not None:  # (the general path's _forward, the arguments already checked and converted)
            capsule, options = plain
            out, lse = _outputs("torch", query, value, return_lse)
            _call(_attn.attention, capsule(query), capsule(key), capsule(value), capsule(out),
                  None if lse is None else capsule(lse), options)
            return (out, lse) if return_lse else out
    c = _check_call(query, key, value, attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment,
                    scale=scale, window=window, return_lse=return_lse, softcap=softcap, alibi_slopes=alibi_slopes,
                    sinks=sinks, k_scale=k_scale, v_scale=v_scale, lens=kv_lens, dropout_p=dropout_p, seed=seed,
                    enable_gqa=enable_gqa)
    batched = query.ndim == 4
    q, k, v = (x if batched else _lead1(x) for x in (query, key, value))
    if c.kind == "torch" and not c.quant_kv and not _ops().direct(q, k, v, c.sinks):
        # torch.ops.attn.sdpa: one operator for autograd, torch.compile and torch.export (plain eager inference
        # calls the library directly below: the same code without the dispatcher's cost). int8 K/V always runs
        # eagerly: the operators take float K/V.
        ops = _ops()
        out, lse = _call(ops.sdpa, q, k, v, *c.op_args(ops.OPTIONS))
    else:
        out, lse = _forward(c.kind, q, k, v, c.options(), c.return_lse)
    if not batched:
        out = out[0]
        lse = None if lse is None else lse[0]
    return (out, lse) if c.return_lse else out


def describe_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, *, causal_alignment=None, kv_lens=None, window=None, return_lse=False,
                       softcap=0.0, alibi_slopes=None, sinks=None, seed=None, k_scale=None, v_scale=None):
    """What scaled_dot_product_attention would run for these arguments (the same signature), without running it:
    a dict with 'backend' ('flash' or 'reference'; on CUDA tensors 'cudnn' or 'flash'), 'isa' (the instruction-set
    level whose kernel runs: 'sse2', 'avx2', 'avx512', 'avx512bf16' or 'amx'; '' for the reference; on CUDA the
    device's compute capability, 'sm_90'), 'kernel' ('vector', 'vector (bf16 pairs)', 'amx', 'bf16 dot' or
    'reference'; on CUDA the GPU kernel, e.g. 'cudnn sdpa ...'), 'threads' (0 on CUDA) and 'workspace_bytes' (the
    scratch the call allocates beyond its inputs and outputs; on CUDA, device memory). The arguments are checked as
    scaled_dot_product_attention checks them (the same errors); nothing is computed (an output of the result's size
    is allocated, unwritten, for the library's checks; with dropout and seed=None no seed is drawn, as the seed
    changes nothing of the answer)."""
    c = _check_call(query, key, value, attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment,
                    scale=scale, window=window, return_lse=return_lse, softcap=softcap, alibi_slopes=alibi_slopes,
                    sinks=sinks, k_scale=k_scale, v_scale=v_scale, lens=kv_lens, dropout_p=dropout_p,
                    seed=0 if seed is None else seed, enable_gqa=enable_gqa)
    batched = query.ndim == 4
    q, k, v = (x if batched else _lead1(x) for x in (query, key, value))
    out, lse = _outputs(c.kind, q, v, c.return_lse)
    return _call(_attn.describe_attention, _for_binding(q), _for_binding(k), _for_binding(v), _for_binding(out), lse,
                 c.options())


def attention_paged(query, k_pages, v_pages, page_table, seq_lens, *, attn_mask=None, is_causal=False,
                    causal_alignment=None, scale=None, window=None, return_lse=False, softcap=0.0, alibi_slopes=None,
                    sinks=None, k_scale=None, v_scale=None):
    """attn.scaled_dot_product_attention over a paged KV cache (vLLM's and FlashInfer's layout):
    query [B, Hq, Sq, Dk], k_pages [P, Hkv, page_size, Dk], v_pages [P, Hkv, page_size, Dv],
    page_table [B, max_pages] (page n of sequence b), seq_lens [B] (keys j >= seq_lens[b] are ignored).
    Returns out [B, Hq, Sq, Dv] of query's kind and dtype (and the float32 lse [B, Hq, Sq] with
    return_lse=True).

    query, k_pages and v_pages are float32, bfloat16 (NumPy: ml_dtypes.bfloat16) or float16; k_pages
    and v_pages share a dtype. Kinds: every array argument is of query's kind, all NumPy arrays or all
    dense torch tensors on one device (CPU or CUDA); page_table and seq_lens may also be (nested) lists or tuples
    of ints.
    page_table: any integer dtype, converted to int32 when every value fits (else a ValueError naming the
    element); seq_lens: any integer dtype (int32 and int64 as they are, the others converted to int64
    after a range check). bool and float dtypes are TypeErrors. attn_mask, is_causal, causal_alignment,
    scale, window, softcap, alibi_slopes and sinks mean what they mean for scaled_dot_product_attention,
    with Skv = max_pages · page_size. No autograd: the result does not require grad.

    k_pages and v_pages may instead be int8 with k_scale and v_scale, float32 [P, Hkv, page_size]: an 8-bit
    paged cache (attn.PagedKVCache(dtype="int8")), row s of page p being k_scale[p, h, s] · k_pages[p, h, s, :];
    or packed 4-bit uint8 [P, Hkv, page_size, D / 2] with scales [P, Hkv, page_size, ceil(D / 32)] (as
    scaled_dot_product_attention's k_scale describes); the rows are widened in registers, and the call runs eagerly
    for torch tensors.
    """
    if window is None and alibi_slopes is None and sinks is None and seq_lens is not None:
        plain = _plain_call(query, k_pages, v_pages, is_causal, scale, causal_alignment, return_lse, softcap, k_scale,
                            v_scale, True, (seq_lens,), page_table, mask=attn_mask)
        if plain is not None:  # (the general path's _forward_paged, the arguments already checked and converted)
            capsule, options = plain
            out, lse = _outputs("torch", query, v_pages, return_lse)
            _call(_attn.attention_paged, capsule(query), capsule(k_pages), capsule(v_pages), capsule(page_table),
                  capsule(seq_lens), capsule(out), None if lse is None else capsule(lse), options, names=_PAGED_NAMES)
            return (out, lse) if return_lse else out
    c = _check_call(query, k_pages, v_pages, paged=True, attn_mask=attn_mask, is_causal=is_causal,
                    causal_alignment=causal_alignment, scale=scale, window=window, return_lse=return_lse,
                    softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                    lens=seq_lens, page_table=page_table)
    with _no_autograd(c.kind):  # (no backward: the result does not require grad, whatever its inputs do)
        if c.kind == "torch" and not c.quant_kv and not _ops().direct(query, k_pages, v_pages):
            # torch.ops.attn.sdpa_paged, traceable by torch.compile and torch.export
            ops = _ops()
            out, lse = _call(ops.sdpa_paged, query, k_pages, v_pages, *c.op_args(("page_table", "seq_lens")),
                             *c.op_args(ops.PAGED_OPTIONS), names=_PAGED_NAMES)
        else:
            out, lse = _forward_paged(c.kind, query, k_pages, v_pages, c.page_table, c.seq_lens, c.options(),
                                      c.return_lse)
    return (out, lse) if c.return_lse else out


def _no_autograd(kind):
    """torch.no_grad() for torch calls of the functions without a backward (paged, cascade), else nothing."""
    if kind == "torch":
        import torch
        return torch.no_grad()
    import contextlib
    return contextlib.nullcontext()


def attention_paged_cascade(query, k_pages, v_pages, prefix_table, prefix_len, page_table, seq_lens, *,
                            is_causal=False, scale=None, return_lse=False, softcap=0.0, sinks=None, k_scale=None,
                            v_scale=None):
    """Shared-prefix (cascade) batch decode over a paged KV cache, as FlashInfer's cascade attention: sequence b's
    keys are the shared prefix's prefix_len keys (pages prefix_table[0], [1], ... of the pool) followed by its own
    seq_lens[b] keys (pages page_table[b]). The prefix is attended once for all queries of the batch, each
    sequence's own keys separately, and the two merged by their LSE: the result is attention_paged over the
    concatenated keys (to fp32 rounding of the merge), without re-reading the prefix once per sequence.

    query [B, Hq, Sq, Dk], k_pages / v_pages [P, Hkv, page_size, D], prefix_table [n] (int32 page indices),
    prefix_len >= 0, page_table [B, max_pages], seq_lens [B]: as attention_paged's (same kinds and dtypes).
    is_causal: the last query of each sequence on its last key (bottom-right); every query must see the whole
    prefix (seq_lens[b] >= Sq - 1). scale, softcap, sinks, k_scale, v_scale: as attention_paged's. Windows, masks,
    ALiBi and dropout are refused (they depend on a key's position in its sequence). Returns out [B, Hq, Sq, Dv]
    (and the float32 lse [B, Hq, Sq] with return_lse=True). No autograd: the result does not require grad; torch tensors (but 8- or 4-bit pages) go through
    torch.ops.attn.sdpa_paged_cascade, so torch.compile and torch.export trace the call."""
    c = _check_call(query, k_pages, v_pages, paged=True, attn_mask=None, is_causal=is_causal,
                    causal_alignment="bottom_right" if is_causal else None, scale=scale, window=None,
                    return_lse=return_lse, softcap=softcap, alibi_slopes=None, sinks=sinks, k_scale=k_scale,
                    v_scale=v_scale, lens=seq_lens, page_table=page_table)
    table = _ints("prefix_table", prefix_table, c.kind, "query", "int32", 1, "[n]",
                  "a page index that fits in int32 (-2**31 <= index < 2**31)")
    table = _on_device(c.kind, query, table)
    if isinstance(prefix_len, (bool, np.bool_)) or not isinstance(prefix_len, (int, np.integer)):
        raise TypeError(f"prefix_len: got {type(prefix_len).__name__}; expected an int >= 0")
    with _no_autograd(c.kind):  # (no backward: the result does not require grad)
        if c.kind == "torch" and not c.quant_kv and not _ops().direct(query, k_pages, v_pages):
            ops = _ops()  # torch.ops.attn.sdpa_paged_cascade, traceable by torch.compile and torch.export
            out, lse = _call(ops.sdpa_paged_cascade, query, k_pages, v_pages, _as_tensor(table), int(prefix_len),
                             *c.op_args(("page_table", "seq_lens")), *c.op_args(ops.PAGED_OPTIONS),
                             names=_PAGED_NAMES)
        else:
            out, lse = _forward_paged_cascade(c.kind, query, k_pages, v_pages, table, int(prefix_len), c.page_table,
                                              c.seq_lens, c.options(), c.return_lse)
    return (out, lse) if c.return_lse else out


# ---- one call's arguments: checked once, handed to the library as one Options object -------------------------

# The options of a call, in the order of the binding's Options(...) and of _options's parameters. The torch.ops.attn
# operators take those of them that their schemas name (attn.torch_ops.OPTIONS), under the same names.
_OPTION_NAMES = ("mask", "kv_lens", "scale", "causal", "window_left", "window_right", "window_align", "softcap",
                 "alibi_slopes", "sinks", "dropout_p", "seed", "k_scale", "v_scale", "bf16_bits")
# The C++ names -> the Python ones, for attention_paged.
_PAGED_NAMES = {"q": "query", "mask": "attn_mask"}


class _Call:
    """One attention call after its checks (_check_call): its kind, K/V's quantised type (None, "int8" or "int4"),
    whether the LSE is wanted, a paged call's page table and sequence lengths, and its options under their binding
    names (_OPTION_NAMES).
    Arrays are of the call's kind (index arguments given as lists are NumPy arrays), and torch tensors stay in
    autograd's graph (sinks may require grad); options() makes the binding's view of them."""

    __slots__ = ("kind", "quant_kv", "return_lse", "page_table", "seq_lens") + _OPTION_NAMES

    def options(self):
        """The binding's Options for this call (its fields spelled out: this runs on every call)."""
        return _options(self.mask, self.kv_lens, self.scale, self.causal, self.window_left, self.window_right,
                        self.window_align, self.softcap, self.alibi_slopes, self.sinks, self.dropout_p, self.seed,
                        self.k_scale, self.v_scale, self.bf16_bits)

    def op_args(self, names):
        """The arguments a torch.ops.attn operator takes (names: its schema's, in order), all tensors (an index
        argument given as a list was converted to a NumPy array)."""
        return tuple(_as_tensor(getattr(self, name)) for name in names)


def _options(mask=None, kv_lens=None, scale=None, causal="none", window_left=-1, window_right=-1,
             window_align="top_left", softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, seed=None,
             k_scale=None, v_scale=None, bf16_bits=False):
    """The binding's Options object: the one place where one is made, for every entry point (the functions here,
    and attn.torch_ops' operators from their flat arguments, which are these by name). Arrays go as the binding
    reads them (_for_binding); seed is an int, None (0) or the operators' int64 [2] tensor of 32-bit halves.
    Options.threads and Options.backend keep their defaults here (the process's thread count, the automatic
    backend): no Python function takes them per call."""
    return _attn.Options(_bound(mask), _bound(kv_lens), scale, causal, window_left, window_right, window_align,
                         softcap, _bound(alibi_slopes), _bound(sinks), dropout_p, _seed_int(seed), _bound(k_scale),
                         _bound(v_scale), bf16_bits)


def _bound(x):
    return None if x is None else _for_binding(x)


def _seed_int(seed):
    """A dropout seed as the binding's int: an int as it is, None as 0, the operators' [2] tensor joined."""
    if seed is None:
        return 0
    if isinstance(seed, int):
        return seed
    lo, hi = seed.tolist()
    return lo | hi << 32


def _check_call(query, key, value, *, paged=False, attn_mask, is_causal, causal_alignment, scale, window, return_lse,
                softcap, alibi_slopes, sinks, k_scale, v_scale, lens, page_table=None, dropout_p=0.0, seed=None,
                enable_gqa=False):
    """Every check and conversion of scaled_dot_product_attention's arguments (paged=False; key, value and lens are
    key, value and kv_lens) or attention_paged's (paged=True: k_pages, v_pages, seq_lens and page_table), in the
    order their errors are reported: kinds, dtypes, ranks, flags, dropout, heads, then each option. Returns a
    _Call."""
    kn, vn = ("k_pages", "v_pages") if paged else ("key", "value")
    kind = _array("query", query)
    _array(kn, key, kind, "query")
    _array(vn, value, kind, "query")
    qdtype = _float_dtype("query", query)
    quant_kv = _kv_quantised(kind, key, value, k_scale, v_scale, (kn, vn))
    if quant_kv:
        kdtype = quant_kv
    elif paged:  # the pages may be of another float dtype than the query
        kdtype = _float_dtype(kn, key)
        _float_dtype(vn, value, kn, kdtype)
    else:
        kdtype = _float_dtype(kn, key, "query", qdtype)
        _float_dtype(vn, value, "query", qdtype)
    if paged:
        _rank("query", query, (4,), "4 ([B, Hq, Sq, Dk])")
        _rank(kn, key, (4,), "4 ([P, Hkv, page_size, Dk])")
        _rank(vn, value, (4,), "4 ([P, Hkv, page_size, Dv])")
    else:
        _rank("query", query, (3, 4), "4 ([B, H, S, D]) or 3 ([H, S, D])")
        for name, x in ((kn, key), (vn, value)):
            _rank(name, x, (query.ndim,), f"rank {query.ndim} like query")
    c = _Call()
    c.kind, c.quant_kv = kind, quant_kv
    is_causal = _flag("is_causal", is_causal)
    if not paged:
        enable_gqa = _flag("enable_gqa", enable_gqa)
    c.return_lse = _flag("return_lse", return_lse)
    c.dropout_p, c.seed = _dropout(dropout_p, seed, kind) if not paged else (0.0, None)
    hq, hkv = query.shape[-3], key.shape[-3]
    if not paged and hq != hkv and not enable_gqa:
        raise ValueError(f"key: {hkv} heads but query has {hq}; expected the same number of heads "
                         "(or enable_gqa=True for grouped-query attention)")
    c.mask = _mask(attn_mask, kind, "query", query.ndim)
    c.page_table = c.seq_lens = c.kv_lens = None
    if paged:
        c.page_table = _ints("page_table", page_table, kind, "query", "int32", 2, "[B, max_pages]",
                             "a page index that fits in int32 (-2**31 <= index < 2**31)")
        c.seq_lens = _ints("seq_lens", lens, kind, "query", "int64", 1, "[B]",  # (required: None is a TypeError)
                           "0 <= length < 2**63 (an int64)")
    else:
        c.kv_lens = _lengths("kv_lens", lens, kind, "query")
    c.page_table, c.seq_lens, c.kv_lens = (_on_device(kind, query, x) for x in (c.page_table, c.seq_lens, c.kv_lens))
    c.causal, c.window_left, c.window_right, c.window_align = _diagonals(is_causal, causal_alignment, window)
    c.scale = _scale(scale)
    c.softcap = _softcap(softcap)
    c.alibi_slopes = _per_head("alibi_slopes", alibi_slopes, kind, grad_ok=False)
    c.sinks = _per_head("sinks", sinks, kind, grad_ok=not paged)
    # unbatched scales ([Hkv, Skv], 4-bit [Hkv, Skv, blocks]) go with the unbatched K/V, given a batch of 1
    batched, unbatched_rank = query.ndim == 4, 3 if quant_kv == "int4" else 2
    c.k_scale, c.v_scale = (s if s is None or batched or s.ndim != unbatched_rank else _lead1(s)
                            for s in (k_scale, v_scale))
    c.bf16_bits = kind == "numpy" and "bfloat16" in (qdtype, kdtype)
    return c


def _forward(kind, q, k, v, options, want_lse, names=None):
    """out (and lse when wanted, else None) of 4-D q, k, v with the binding's Options, allocated as q's kind."""
    out, lse = _outputs(kind, q, v, want_lse)
    _call(_attn.attention, _for_binding(q), _for_binding(k), _for_binding(v), _for_binding(out), _bound(lse), options,
          names=names)
    return out, lse


def _forward_paged(kind, q, k_pages, v_pages, page_table, seq_lens, options, want_lse, names=_PAGED_NAMES):
    """attention_paged's out (and lse when wanted, else None) with the binding's Options, allocated as q's kind."""
    out, lse = _outputs(kind, q, v_pages, want_lse)
    _call(_attn.attention_paged, _for_binding(q), _for_binding(k_pages), _for_binding(v_pages),
          _for_binding(page_table), _for_binding(seq_lens), _for_binding(out), _bound(lse), options, names=names)
    return out, lse


def _forward_paged_cascade(kind, q, k_pages, v_pages, prefix_table, prefix_len, page_table, seq_lens, options,
                           want_lse, names=_PAGED_NAMES):
    """attention_paged_cascade's out (and lse when wanted, else None), allocated as q's kind."""
    out, lse = _outputs(kind, q, v_pages, want_lse)
    _call(_attn.attention_paged_cascade, _for_binding(q), _for_binding(k_pages), _for_binding(v_pages),
          _for_binding(prefix_table), prefix_len, _for_binding(page_table), _for_binding(seq_lens),
          _for_binding(out), _bound(lse), options, names=names)
    return out, lse


def _ops():
    """attn.torch_ops (imported on first use, so that torch stays optional): registers torch.ops.attn.*."""
    from . import torch_ops
    return torch_ops


def _as_tensor(x):
    """An index-like argument converted from a list (a NumPy array) as a torch tensor; the rest as they are."""
    return _torch().from_numpy(x) if isinstance(x, np.ndarray) else x


def _dropout(dropout_p, seed, kind):
    """(dropout_p, seed): seed an int for the binding (NumPy inputs), or the operators' int64 [2] seed tensor (torch
    inputs; None without dropout). The range of dropout_p is checked by the library."""
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"dropout_p: got {type(dropout_p).__name__}; expected a float in [0, 1)")
    dropout_p = float(dropout_p)
    if seed is not None:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: got {type(seed).__name__}; expected an int in [0, 2**64) or None")
        if not 0 <= int(seed) < 2**64:
            raise ValueError(f"seed: {int(seed)} is out of range; expected an int in [0, 2**64)")
        if kind == "torch":
            return dropout_p, _ops().seed_tensor(int(seed)) if dropout_p > 0 else None
        return dropout_p, int(seed)
    if not dropout_p > 0:
        return dropout_p, None if kind == "torch" else 0
    if kind == "torch":
        # the operators' seed tensor (low, high halves), drawn within the graph under torch.compile
        return dropout_p, _torch().randint(0, 2**32, (2,), dtype=_torch().int64)
    else:
        lo, hi = (int(x) for x in np.random.randint(0, 2**32, size=2, dtype=np.uint64))
    return dropout_p, lo | hi << 32


def _softcap(softcap):
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.floating, np.integer)):
        raise TypeError(f"softcap: got {type(softcap).__name__}; expected a float (0.0 = off)")
    return float(softcap)


def _per_head(name, x, kind, grad_ok):
    """alibi_slopes / sinks as the library takes them: float32 (other float dtypes as a float32 copy), of
    query's kind (a torch tensor that requires grad stays in the graph); shapes and values are checked by the
    library."""
    if x is None:
        return None
    _array(name, x, kind, "query")
    if not grad_ok and kind == "torch" and _wants_grad(x):
        raise ValueError(f"{name}: requires grad; expected a tensor without grad (attn treats {name} as constants)")
    dtype = _dtype_name(x)
    if dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise TypeError(f"{name}: dtype {dtype}; expected a float dtype (used as float32)")
    if isinstance(x, np.ndarray) and not x.dtype.isnative:
        return x.astype(np.float32)
    return x if dtype == "float32" else _as_float32(kind, x)


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
        sides = None
        if isinstance(window, (tuple, list)) and len(window) == 2 or (
                isinstance(window, np.ndarray) and window.shape == (2,)):
            try:
                sides = [-1 if w is None else _window_side(w) for w in window]
            except TypeError:
                sides = None
        if sides is None:
            raise TypeError(f"window: {window!r}; expected a pair of ints (left, right), -1 or None = unbounded")
        for side, w in zip(("left", "right"), sides):
            if not -1 <= w < 2**63:
                raise ValueError(f"window: {side} = {w} is out of range; expected -1 (unbounded) or "
                                 f"0 <= {side} < 2**63")
        left, right = sides
    return causal, left, right, align


def _window_side(w):
    if isinstance(w, (bool, np.bool_)):
        raise TypeError("bool")
    return operator.index(w)


# ---- merging partial results -----------------------------------------------------------------------


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Combines two attention results over disjoint key sets of the same queries (split-KV, cascade,
    distributed attention) into the result over both: returns (out, lse), as if the keys had been
    attended together. out_* [B, H, S, Dv] and lse_* [B, H, S] float32, as returned by
    scaled_dot_product_attention(..., return_lse=True) (or [H, S, Dv] and [H, S]); all four of out_a's
    kind (NumPy arrays or dense torch tensors, CPU or CUDA). A side with lse = -inf contributes nothing (attn's
    convention for a row with no keys; attn.flash_attn_*'s softmax_lse reports such a row as +inf, FlashAttention's
    convention, which would make the merged row NaN: turn it into -inf first). NaN in gives NaN out.
    """
    kind = _array("out_a", out_a)
    args = (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b))
    for name, x in args:
        _array(name, x, kind, "out_a")
        if _dtype_name(x) != "float32":
            raise TypeError(f"{name}: dtype {_dtype_name(x)}; expected float32")
    _rank("out_a", out_a, (3, 4), "4 ([B, H, S, Dv]) or 3 ([H, S, Dv])")
    for name, x in args[1:]:
        expected = out_a.ndim - (name.startswith("lse"))
        if x.ndim != expected:
            raise ValueError(f"{name}: rank {x.ndim}; expected {expected} (out_a has rank {out_a.ndim})")
    batched = out_a.ndim == 4
    oa, la, ob, lb = (x if batched else _lead1(x) for _, x in args)
    out = _empty(kind, out_a, tuple(oa.shape))
    lse = _empty(kind, out_a, tuple(oa.shape[:3]))
    _call(_attn.merge_attention, _for_binding(oa), _for_binding(la), _for_binding(ob), _for_binding(lb),
          _for_binding(out), _for_binding(lse))
    return (out[0], lse[0]) if not batched else (out, lse)
