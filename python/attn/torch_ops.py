"""attn as PyTorch operators (torch.library): torch.ops.attn.sdpa, torch.ops.attn.sdpa_backward and
torch.ops.attn.sdpa_paged, with fake (meta) implementations and a registered autograd formula, so that
torch.compile(fullgraph=True) and torch.export trace through attn without graph breaks.

    import attn.torch_ops                        # registers the operators (any attn call on torch tensors does too)
    out, lse = torch.ops.attn.sdpa(q, k, v, None, None, None, "top_left", -1, -1, "top_left", 0.0, None, None, 0.0,
                                   None)

Most users never call these directly: attn.scaled_dot_product_attention, attn.attention_paged and attn.flash_*
route torch tensors through them. In plain eager inference (no grad, not tracing, plain tensors) those functions
call the operators' implementations, sdpa_eager and sdpa_paged_eager, directly: the same code without the
dispatcher's ~50 µs per call, which is most of a small decode step. The operators take the already-checked arguments of the C++ binding (see
functional.scaled_dot_product_attention for their meaning); the library checks shapes and values when the
operator runs, and its error messages name the C++ parameters (q, k, v, mask, ...).

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

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _attn

__all__ = ["sdpa", "sdpa_backward", "sdpa_paged", "sdpa_eager", "sdpa_paged_eager", "seed_tensor", "direct"]


def seed_tensor(seed: int) -> Tensor:
    """attn's seed in [0, 2**64) as the operators' seed argument: int64 [2] = (low, high) 32-bit halves."""
    return torch.tensor([seed & 0xFFFFFFFF, seed >> 32], dtype=torch.int64)


def _seed(seed):
    if seed is None:
        return 0
    lo, hi = seed.tolist()
    return lo | hi << 32


def direct(*tensors) -> bool:
    """True where calling the implementation directly is the operator's result: eager (not compiling or
    exporting), no autograd on any input, and only plain tensors (no fake, functional or other subclass)."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    return all(x is None or (type(x) is Tensor and not (grad and x.requires_grad)) for x in tensors)


def _plain(x):
    """The same memory without autograd, conjugate or negative bits (what the binding reads)."""
    return None if x is None else x.detach().resolve_conj().resolve_neg()


def sdpa_eager(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], kv_lens: Optional[Tensor],
               scale: Optional[float], causal: str, window_left: int, window_right: int, window_align: str,
               softcap: float, alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], dropout_p: float,
               seed: Optional[Tensor], want_lse: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """The implementation of attn::sdpa (want_lse=False, for direct calls only, skips the LSE: lse is None)."""
    b, hq, sq, _ = q.shape
    out = torch.empty((b, hq, sq, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((b, hq, sq), dtype=torch.float32) if want_lse else None
    _attn.attention(_plain(q), _plain(k), _plain(v), out, lse, _plain(mask), _plain(kv_lens), scale, causal,
                    window_left, window_right, window_align, False, softcap, _plain(alibi_slopes), _plain(sinks),
                    dropout_p, _seed(seed))
    return out, lse


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], kv_lens: Optional[Tensor], scale: Optional[float],
          causal: str, window_left: int, window_right: int, window_align: str, softcap: float,
          alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], dropout_p: float,
          seed: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return sdpa_eager(q, k, v, mask, kv_lens, scale, causal, window_left, window_right, window_align, softcap,
                      alibi_slopes, sinks, dropout_p, seed)


sdpa = torch.library.custom_op("attn::sdpa", _sdpa, mutates_args=())


@sdpa.register_fake
def _sdpa_fake(q, k, v, mask, kv_lens, scale, causal, window_left, window_right, window_align, softcap, alibi_slopes,
               sinks, dropout_p, seed):
    b, hq, sq, _ = q.shape
    return q.new_empty((b, hq, sq, v.shape[-1])), q.new_empty((b, hq, sq), dtype=torch.float32)


@torch.library.custom_op("attn::sdpa_backward", mutates_args=())
def sdpa_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, mask: Optional[Tensor],
                  kv_lens: Optional[Tensor], scale: Optional[float], causal: str, window_left: int, window_right: int,
                  window_align: str, softcap: float, alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
                  dropout_p: float, seed: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(grad_q, grad_k, grad_v, grad_sinks); grad_sinks is float32 [Hq], or [0] without sinks."""
    grads = [torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)]
    grad_sinks = torch.empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32)
    _attn.attention_backward(_plain(q), _plain(k), _plain(v), _plain(out), _plain(lse), _plain(grad_out.to(q.dtype)),
                             *grads, _plain(mask), _plain(kv_lens), scale, causal, window_left, window_right,
                             window_align, softcap, _plain(alibi_slopes), _plain(sinks),
                             grad_sinks if sinks is not None else None, dropout_p, _seed(seed))
    return (*grads, grad_sinks)


@sdpa_backward.register_fake
def _sdpa_backward_fake(grad_out, q, k, v, out, lse, mask, kv_lens, scale, causal, window_left, window_right,
                        window_align, softcap, alibi_slopes, sinks, dropout_p, seed):
    sinks_shape = sinks.shape if sinks is not None else (0,)
    return (*(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)),
            q.new_empty(sinks_shape, dtype=torch.float32))


_OPTIONS = ("mask", "kv_lens", "scale", "causal", "window_left", "window_right", "window_align", "softcap",
            "alibi_slopes", "sinks", "dropout_p", "seed")


def _setup_context(ctx, inputs, output):
    q, k, v, mask, kv_lens, scale, causal, left, right, align, softcap, slopes, sinks, dropout_p, seed = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, kv_lens, slopes, sinks, seed)
    # the same seed: the backward regenerates the forward's dropout mask
    ctx.scalars = (scale, causal, left, right, align, softcap, dropout_p)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, mask, kv_lens, slopes, sinks, seed = ctx.saved_tensors
    scale, causal, left, right, align, softcap, dropout_p = ctx.scalars
    gq, gk, gv, gs = sdpa_backward(grad_out, q, k, v, out, lse, mask, kv_lens, scale, causal, left, right, align,
                                   softcap, slopes, sinks, dropout_p, seed)
    return gq, gk, gv, None, None, None, None, None, None, None, None, None, gs if sinks is not None else None, None, \
        None


sdpa.register_autograd(_backward, setup_context=_setup_context)


def sdpa_paged_eager(q: Tensor, k_pages: Tensor, v_pages: Tensor, page_table: Tensor, seq_lens: Tensor,
                     mask: Optional[Tensor], scale: Optional[float], causal: str, window_left: int,
                     window_right: int, window_align: str, softcap: float, alibi_slopes: Optional[Tensor],
                     sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Attention over a paged KV cache (attn.attention_paged); no autograd."""
    b, hq, sq, _ = q.shape
    out = torch.empty((b, hq, sq, v_pages.shape[-1]), dtype=q.dtype)
    lse = torch.empty((b, hq, sq), dtype=torch.float32)
    _attn.attention_paged(_plain(q), _plain(k_pages), _plain(v_pages), _plain(page_table), _plain(seq_lens), out, lse,
                          _plain(mask), scale, causal, window_left, window_right, window_align, False, softcap,
                          _plain(alibi_slopes), _plain(sinks))
    return out, lse


sdpa_paged = torch.library.custom_op("attn::sdpa_paged", sdpa_paged_eager, mutates_args=())


@sdpa_paged.register_fake
def _sdpa_paged_fake(q, k_pages, v_pages, page_table, seq_lens, mask, scale, causal, window_left, window_right,
                     window_align, softcap, alibi_slopes, sinks):
    b, hq, sq, _ = q.shape
    return q.new_empty((b, hq, sq, v_pages.shape[-1])), q.new_empty((b, hq, sq), dtype=torch.float32)
