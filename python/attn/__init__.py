"""attn: exact scaled dot-product attention for NumPy arrays and PyTorch CPU tensors.

    import attn
    out = attn.scaled_dot_product_attention(query, key, value, is_causal=True)

The work happens in attn's C++ library (attn._attn is a thin binding over it); arrays are passed
by pointer and strides, never copied, and results come back as the kind of array that went in.
"""

from ._attn import __version__
from .functional import merge_attention, scaled_dot_product_attention

__all__ = ["__version__", "merge_attention", "scaled_dot_product_attention"]

# Tensors that require grad go through attn's backward (functional._autograd_function).
# Where the rest goes as it lands in the C++ library (one module each, re-exported here):
#   attn.MultiHeadAttention            the multi-head module (projections + SDPA)     -> modules.py
#   attn.KVCache, attn.decode          KV caches, paged attention and decode          -> cache.py
#   attn.cost                          FLOP / memory calculators                      -> cost.py
# Each one binds its C++ entry point in python/src/bindings.cc the way attention() is bound there.
