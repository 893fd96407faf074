"""attn: exact scaled dot-product attention for NumPy arrays and PyTorch tensors (CPU, or CUDA where built).

    import attn
    out = attn.scaled_dot_product_attention(query, key, value, is_causal=True)

The work happens in attn's C++ library (attn._attn is a thin binding over it); arrays are passed
by pointer and strides, never copied, and results come back as the kind of array that went in.
"""

from ._attn import __version__
from .functional import (attention_paged, attention_paged_cascade, describe_attention, merge_attention,
                         scaled_dot_product_attention)
from .modules import KVCache, MultiHeadAttention, PagedKVCache, attention_cost, kv_cache_bytes, parameter_count
from .runtime import get_num_threads, info, set_isa, set_num_threads
from .flash import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                    flash_attn_with_kvcache, flash_mla_with_kvcache, get_mla_metadata)

__all__ = ["__version__", "merge_attention", "scaled_dot_product_attention", "attention_paged", "attention_paged_cascade",
           "describe_attention",
           "MultiHeadAttention", "KVCache", "PagedKVCache", "attention_cost", "parameter_count", "kv_cache_bytes",
           "set_num_threads", "get_num_threads", "set_isa", "info", "flash_attn_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "flash_mla_with_kvcache", "get_mla_metadata"]

# torch tensors go through the operators of attn.torch_ops (torch.ops.attn.*), imported on first use: autograd,
# torch.compile and torch.export see one operator.
