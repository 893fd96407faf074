"""attn as PyTorch operators (torch.library): torch.ops.attn.sdpa, torch.ops.attn.sdpa_backward,
torch.ops.attn.sdpa_paged and torch.ops.attn.sdpa_paged_cascade, with fake (meta) implementations and a registered
autograd formula (sdpa's), so that torch.compile(fullgraph=True) and torch.export trace through attn without graph
breaks.

    import attn.torch_ops                        # registers the operators (any attn call on torch tensors does too)
    out, lse = torch.ops.attn.sdpa(q, k, v, None, None, None, "top_left", -1, -1, "top_left", 0.0, None, None, 0.0,
                                   None)

Most users never call these directly: attn.scaled_dot_product_attention, attn.attention_paged and attn.flash_*
route torch tensors through them. In plain eager inference (no grad, not tracing, plain tensors; see direct())
those functions call the library as the operators' implementations do, through the same functional._forward and
_forward_paged, without the dispatcher's ~50 µs per call, which is most of a small decode step.

The operators take the already-checked arguments of the C++ binding (see functional.scaled_dot_product_attention
for their meaning), flat as a schema needs them: their names and types are written once (_TYPES below), and every
implementation turns them into the binding's one Options object through functional._options. The library checks
shapes and values when the operator runs, and its error messages name the C++ parameters (q, k, v, mask, ...).

Operator arguments of sdpa (all positional):
    q [B, Hq, Sq, Dk], k [B, Hkv, Skv, Dk], v [B, Hkv, Skv, Dv]  float32, bfloat16 or float16
    mask      None, bool or float32, broadcastable to [B, Hq, Sq, Skv]
    kv_lens   None or int32/int64 [B]
    scale     None (1/sqrt(Dk)) or a float
    causal    "none", "top_left" or "bottom_right"
    window_left, window_right, window_align   -1 = unbounded; align "top_left" or "bottom_right"
    softcap   0.0 = off
    alibi_slopes, sinks   None or float32 [Hq] ([B, Hq] for slopes)
    dropout_p, seed       seed: None (no dropout) or int64 [2], the low and high 32-bit halves of attn's 64-bit
                          seed (a tensor, so that a seed drawn from torch's generator stays in the graph)
Returns (out [B, Hq, Sq, Dv] in q's dtype, lse float32 [B, Hq, Sq]). Gradients flow to q, k, v and sinks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _attn
from .functional import _for_binding, _forward, _forward_paged, _forward_paged_cascade, _options

__all__ = ["sdpa", "sdpa_backward", "sdpa_paged", "sdpa_paged_cascade", "seed_tensor", "direct", "OPTIONS",
           "PAGED_OPTIONS"]

# The operators' options, in their schemas' order, with their schema types: attn::sdpa and attn::sdpa_backward take
# all of them (after q, k, v and after grad_out, q, k, v, out, lse), attn::sdpa_paged those of PAGED_OPTIONS (after
# q, k_pages, v_pages, page_table, seq_lens). The names are functional._options's: the one map from these flat
# arguments to the binding's Options.
_TYPES = {"mask": "Tensor?", "kv_lens": "Tensor?", "scale": "float?", "causal": "str", "window_left": "SymInt",
          "window_right": "SymInt", "window_align": "str", "softcap": "float", "alibi_slopes": "Tensor?",
          "sinks": "Tensor?", "dropout_p": "float", "seed": "Tensor?"}
OPTIONS = tuple(_TYPES)
PAGED_OPTIONS = tuple(n for n in OPTIONS if n not in ("kv_lens", "dropout_p", "seed"))
_SINKS = OPTIONS.index("sinks")  # the one option with a gradient
_IS_TENSOR = tuple(_TYPES[name].startswith("Tensor") for name in OPTIONS)


def _schema(inputs, options, returns):
    args = [f"Tensor {name}" for name in inputs] + [f"{_TYPES[name]} {name}" for name in options]
    return f"({', '.join(args)}) -> ({', '.join(['Tensor'] * returns)})"


def _binding_options(names, values):
    """The binding's Options of an operator's flat options (names: its schema's)."""
    return _options(**dict(zip(names, values)))


def seed_tensor(seed: int) -> Tensor:
    """attn's seed in [0, 2**64) as the operators' seed argument: int64 [2] = (low, high) 32-bit halves."""
    return torch.tensor([seed & 0xFFFFFFFF, seed >> 32], dtype=torch.int64)


def direct(*tensors) -> bool:
    """True where calling the library directly gives the operator's result: eager (not compiling or exporting), no
    autograd on any input, and only plain tensors (no fake, functional or other subclass)."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    return all(x is None or (type(x) is Tensor and not (grad and x.requires_grad)) for x in tensors)


# ---- attn::sdpa: (q, k, v, *OPTIONS) -> (out, lse) ----------------------------------------------------------

def _sdpa(q, k, v, *options):
    return _forward("torch", q, k, v, _binding_options(OPTIONS, options), True, names={})


sdpa = torch.library.custom_op("attn::sdpa", _sdpa, mutates_args=(), schema=_schema(("q", "k", "v"), OPTIONS, 2))


@sdpa.register_fake
def _sdpa_fake(q, k, v, *options):
    b, hq, sq, _ = q.shape
    return q.new_empty((b, hq, sq, v.shape[-1])), q.new_empty((b, hq, sq), dtype=torch.float32)


# ---- attn::sdpa_backward: (grad_out, q, k, v, out, lse, *OPTIONS) -> (grad_q, grad_k, grad_v, grad_sinks) ----------

def _sdpa_backward(grad_out, q, k, v, out, lse, *options):
    """grad_sinks is float32 [Hq], or [0] without sinks."""
    sinks = options[_SINKS]
    grads = [torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)]
    grad_sinks = torch.empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32, device=q.device)
    _attn.attention_backward(*(_for_binding(x) for x in (q, k, v, out, lse, grad_out.to(q.dtype))),
                             *(_for_binding(g) for g in grads), _for_binding(grad_sinks) if sinks is not None else None,
                             _binding_options(OPTIONS, options))
    return (*grads, grad_sinks)


sdpa_backward = torch.library.custom_op("attn::sdpa_backward", _sdpa_backward, mutates_args=(),
                                        schema=_schema(("grad_out", "q", "k", "v", "out", "lse"), OPTIONS, 4))


@sdpa_backward.register_fake
def _sdpa_backward_fake(grad_out, q, k, v, out, lse, *options):
    sinks = options[_SINKS]
    return (*(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)),
            q.new_empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32))


# ---- autograd: sdpa's gradients to q, k, v and sinks, by sdpa_backward with the same options --------------------

def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    out, lse = output
    # the tensor options saved as tensors, the rest as they are; the same seed, so that the backward regenerates
    # the forward's dropout mask
    ctx.save_for_backward(q, k, v, out, lse, *(x for x, t in zip(options, _IS_TENSOR) if t))
    ctx.scalars = tuple(x for x, t in zip(options, _IS_TENSOR) if not t)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, *saved = ctx.saved_tensors
    tensors, scalars = iter(saved), iter(ctx.scalars)
    options = [next(tensors) if t else next(scalars) for t in _IS_TENSOR]
    gq, gk, gv, gs = sdpa_backward(grad_out, q, k, v, out, lse, *options)
    grads = [None] * len(options)
    if options[_SINKS] is not None:
        grads[_SINKS] = gs
    return (gq, gk, gv, *grads)


sdpa.register_autograd(_backward, setup_context=_setup_context)


# ---- attn::sdpa_paged: (q, k_pages, v_pages, page_table, seq_lens, *PAGED_OPTIONS) -> (out, lse); no autograd ------

def _sdpa_paged(q, k_pages, v_pages, page_table, seq_lens, *options):
    return _forward_paged("torch", q, k_pages, v_pages, page_table, seq_lens,
                          _binding_options(PAGED_OPTIONS, options), True, names={})


sdpa_paged = torch.library.custom_op(
    "attn::sdpa_paged", _sdpa_paged, mutates_args=(),
    schema=_schema(("q", "k_pages", "v_pages", "page_table", "seq_lens"), PAGED_OPTIONS, 2))


@sdpa_paged.register_fake
def _sdpa_paged_fake(q, k_pages, v_pages, page_table, seq_lens, *options):
    b, hq, sq, _ = q.shape
    return q.new_empty((b, hq, sq, v_pages.shape[-1])), q.new_empty((b, hq, sq), dtype=torch.float32)


# ---- attn::sdpa_paged_cascade: (q, k_pages, v_pages, prefix_table, prefix_len, page_table, seq_lens,
#      *PAGED_OPTIONS) -> (out, lse); no autograd (attn.attention_paged_cascade: a shared prefix, then each
#      sequence's own keys; masks, windows and ALiBi refused by the library) ------------------------------------

def _sdpa_paged_cascade(q, k_pages, v_pages, prefix_table, prefix_len, page_table, seq_lens, *options):
    return _forward_paged_cascade("torch", q, k_pages, v_pages, prefix_table, prefix_len, page_table, seq_lens,
                                  _binding_options(PAGED_OPTIONS, options), True, names={})


sdpa_paged_cascade = torch.library.custom_op(
    "attn::sdpa_paged_cascade", _sdpa_paged_cascade, mutates_args=(),
    schema="(Tensor q, Tensor k_pages, Tensor v_pages, Tensor prefix_table, SymInt prefix_len, Tensor page_table, "
           "Tensor seq_lens, " + ", ".join(f"{_TYPES[name]} {name}" for name in PAGED_OPTIONS) + ") -> (Tensor, Tensor)")


@sdpa_paged_cascade.register_fake
def _sdpa_paged_cascade_fake(q, k_pages, v_pages, prefix_table, prefix_len, page_table, seq_lens, *options):
    b, hq, sq, _ = q.shape
    return q.new_empty((b, hq, sq, v_pages.shape[-1])), q.new_empty((b, hq, sq), dtype=torch.float32)
