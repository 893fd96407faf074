"""Hugging Face transformers: attn as an attention implementation.

    import attn.integrations.transformers
    attn.integrations.transformers.register()          # once per process
    model = AutoModel.from_pretrained(path, attn_implementation="attn")
    # or, on a loaded model: model.set_attn_implementation("attn")

Every model that calls transformers' attention interface (ALL_ATTENTION_FUNCTIONS) then runs its attention
through attn.scaled_dot_product_attention: padding masks, causal, GQA/MQA (no repeat_kv copy), sliding windows,
the KV cache during generate, Gemma 2's softcap, gpt-oss's sinks (s_aux), T5-style position biases and
attention dropout in training. The masks are transformers' own 4-D boolean masks (the "sdpa" mask function,
registered under the same name), so every masking rule a model has (padding, sliding window, chunked, packed
sequences) reaches attn unchanged; when transformers skips the mask (pure causal, no padding), attn applies
causal itself, aligned bottom-right so that it is right with a KV cache too.

An 8-bit KV cache for generate: pass `cache=attn.integrations.transformers.Int8KVCache()` (`past_key_values=` in
transformers versions without generate's `cache` argument; 5.24 still takes it, with a FutureWarning), with
attn_implementation="attn" (other implementations cannot read int8 rows). It stores K and V as int8 with one float32 scale per (batch, head, token), max|x| / 127,
as attn.KVCache(dtype="int8") does, and hands attn the int8 rows and their scales, which its kernels widen in
registers: decode reads half the bytes of a bf16 cache. The prompt's own attention (the first update) runs on the
unquantised states.
"""

from __future__ import annotations

import functools

import torch

from ..functional import scaled_dot_product_attention

__all__ = ["register", "attention_forward", "NAME", "Int8KVCache", "GrowingKVCache"]

NAME = "attn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      softcap=None, sliding_window=None, s_aux=None, position_bias=None, **kwargs):
    """transformers' attention-function signature: query [B, Hq, Sq, D], key/value [B, Hkv, Skv, D], attention_mask
    None, bool (True = attend) or float (added), broadcastable to [B, 1 or Hq, Sq, Skv]. Returns
    (out [B, Sq, Hq, Dv], None): attn computes no attention weights (output_attentions needs "eager")."""
    if kwargs.get("output_attentions", False):
        _warn_once("attn: attn_implementation='attn' computes no attention weights, so output_attentions=True "
                   "returns none; use attn_implementation='eager' for them")
    q_length = query.shape[2]
    if query.shape[0] != key.shape[0]:  # learned queries of batch 1 against a batch of keys (as SDPA broadcasts)
        query = query.expand(key.shape[0], *query.shape[1:])
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and attention_mask is None and q_length > 1
    if position_bias is not None:
        bias = position_bias.to(torch.float32)
        if attention_mask is None and causal:
            attention_mask = torch.ones(q_length, key.shape[2], dtype=torch.bool,
                                        device=query.device).tril(key.shape[2] - q_length)
            causal = False
        if attention_mask is None:
            attention_mask = bias
        elif attention_mask.dtype == torch.bool:
            attention_mask = bias.masked_fill(~attention_mask, float("-inf"))
        else:
            attention_mask = bias + attention_mask
    window = None
    if causal and sliding_window is not None:
        window = (int(sliding_window) - 1, 0)  # transformers: key j seen by query i when i - j < sliding_window
    # transformers hands over [B, S, H, D] projections viewed as [B, H, S, D]. They go to attn as they are: the
    # library gathers scattered K/V rows into contiguous ones itself where several query blocks read them
    # (prefill), and reads them in place where each is read once (decode); measured against copying all three
    # here first by bench/hf_qkv_layout.py (README, "Hugging Face transformers").
    sinks = None
    if s_aux is not None:
        sinks = s_aux if s_aux.dtype == torch.float32 else s_aux.float()
    k_scale = v_scale = None
    if key.dtype == torch.int8:  # rows of an Int8KVCache, their scales beside them
        k_scale, v_scale = key._attn_scale, value._attn_scale
    out = scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=float(dropout) if module.training else 0.0,
        is_causal=causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1], causal_alignment="bottom_right",
        window=window, softcap=float(softcap) if softcap else 0.0, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    return out.transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=None)
def _warn_once(message):
    from transformers.utils import logging
    logging.get_logger(__name__).warning(message)


@functools.lru_cache(maxsize=None)
def _layer_class(int8):
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """One layer's K/V in buffers that grow by doubling (transformers' DynamicLayer concatenates, copying the
        whole cache, on every token); update returns views of the rows so far. int8: rows in 8 bits with a float32
        scale per (batch, head, token), each view carrying its scales (`_attn_scale`) for attention_forward; the
        first update (the prompt) returns its unquantised states."""

        def lazy_initialization(self, key_states, value_states):
            self.device, self.dtype = key_states.device, key_states.dtype
            self._len, self._cap = 0, 0
            self._k = self._v = self._ks = self._vs = None
            self.is_initialized = True

        def _grow(self, need, k, v):
            cap = max(need, 2 * self._cap, 256)
            b, h = k.shape[:2]
            dt = torch.int8 if int8 else self.dtype
            bufs = [torch.empty(b, h, cap, k.shape[3], dtype=dt, device=self.device),
                    torch.empty(b, h, cap, v.shape[3], dtype=dt, device=self.device)]
            if int8:
                bufs += [torch.empty(b, h, cap, dtype=torch.float32, device=self.device) for _ in range(2)]
            if self._len:
                for new, old in zip(bufs, (self._k, self._v, self._ks, self._vs)):
                    new[:, :, :self._len] = old[:, :, :self._len]
            self._k, self._v = bufs[:2]
            if int8:
                self._ks, self._vs = bufs[2:]
            self._cap = cap

        @staticmethod
        def _quantise(x):
            x = x.float()
            scale = x.abs().amax(-1) / 127
            q = torch.round(x / scale.clamp(min=torch.finfo(torch.float32).tiny)[..., None]).clamp(-127, 127)
            return q.to(torch.int8), scale

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            first, n = self._len == 0, key_states.shape[-2]
            if self._len + n > self._cap:
                self._grow(self._len + n, key_states, value_states)
            end = self._len + n
            if int8:
                (self._k[:, :, self._len:end], self._ks[:, :, self._len:end]) = self._quantise(key_states)
                (self._v[:, :, self._len:end], self._vs[:, :, self._len:end]) = self._quantise(value_states)
            else:
                self._k[:, :, self._len:end], self._v[:, :, self._len:end] = key_states, value_states
            self._len = end
            keys, values = self._views()
            return (key_states, value_states) if first and int8 else (keys, values)

        def _views(self):
            """self.keys, self.values: the rows so far (the sequence length transformers reads from them), views of
            the buffers (int8: each carrying its scales)."""
            keys, values = self._k[:, :, :self._len], self._v[:, :, :self._len]
            if int8:
                keys._attn_scale, values._attn_scale = self._ks[:, :, :self._len], self._vs[:, :, :self._len]
            self.keys, self.values = keys, values
            return keys, values

        def _buffers_by_batch(self, fn):
            """Every buffer (K, V and int8 scales) replaced by fn(buffer) along the batch dimension (beam search's
            reordering, batch selection and repetition): the next update writes into the new ones."""
            if not self.is_initialized or self._k is None:
                return
            self._k, self._v = fn(self._k), fn(self._v)
            if int8:
                self._ks, self._vs = fn(self._ks), fn(self._vs)
            self._views()

        def reorder_cache(self, beam_idx):
            self._buffers_by_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

        def batch_select_indices(self, indices):
            self._buffers_by_batch(lambda t: t[indices.to(t.device) if torch.is_tensor(indices) else indices])

        def batch_repeat_interleave(self, repeats):
            self._buffers_by_batch(lambda t: t.repeat_interleave(repeats, dim=0))

        def crop(self, tokens_to_remove):
            """Drops the last -tokens_to_remove tokens (assisted decoding's rejected ones), as DynamicLayer.crop."""
            if tokens_to_remove > 0:
                raise ValueError(f"tokens_to_remove: {tokens_to_remove}; expected a negative number of tokens to "
                                 "remove (or 0)")
            if tokens_to_remove == 0 or not self.is_initialized or self._k is None:
                return
            self._len = max(self._len + tokens_to_remove, 0)
            self._views()

        def offload(self):
            self._buffers_by_batch(lambda t: t.to("cpu", non_blocking=True))

        def prefetch(self):
            if self.is_initialized and self._k is not None and self._k.device != self.device:
                self._buffers_by_batch(lambda t: t.to(self.device, non_blocking=True))

        def reset(self):
            self._len = 0
            self.keys = self.values = None
            self.is_initialized = False

    return GrowingLayer


def Int8KVCache():  # noqa: N802 (a class to its callers: the transformers Cache it returns)
    """A transformers Cache whose layers keep K and V in 8 bits (see the module docstring); attn_implementation must
    be "attn" (other implementations cannot read int8 rows)."""
    from transformers.cache_utils import Cache
    return Cache(layer_class_to_replicate=_layer_class(True))


def GrowingKVCache():  # noqa: N802
    """The same cache in the model's dtype: K and V rows in buffers that grow by doubling, where transformers'
    default DynamicCache concatenates (copies the whole cache) on every token; any attn_implementation reads it.
    Int8KVCache's bf16 counterpart, for comparing the two on equal terms."""
    from transformers.cache_utils import Cache
    return Cache(layer_class_to_replicate=_layer_class(False))


def register(name: str = NAME):
    """Makes attn_implementation=name (default "attn") available to every transformers model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
