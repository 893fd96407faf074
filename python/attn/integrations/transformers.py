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
"""

from __future__ import annotations

import torch

from ..functional import scaled_dot_product_attention

__all__ = ["register", "attention_forward", "NAME"]

NAME = "attn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      softcap=None, sliding_window=None, s_aux=None, position_bias=None, **kwargs):
    """transformers' attention-function signature: query [B, Hq, Sq, D], key/value [B, Hkv, Skv, D], attention_mask
    None, bool (True = attend) or float (added), broadcastable to [B, 1 or Hq, Sq, Skv]. Returns
    (out [B, Sq, Hq, Dv], None): attn computes no attention weights (output_attentions needs "eager")."""
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
    out = scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=float(dropout) if module.training else 0.0,
        is_causal=causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1], causal_alignment="bottom_right",
        window=window, softcap=float(softcap) if softcap else 0.0, sinks=sinks)
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME):
    """Makes attn_implementation=name (default "attn") available to every transformers model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
