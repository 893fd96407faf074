"""Bad input: a ValueError or TypeError whose message starts with the parameter's name, nothing written."""

import re

import numpy as np
import pytest

import attn
from attn import _attn
from reference import uniform

sdpa = attn.scaled_dot_product_attention
RNG = np.random.default_rng(7)
Q = uniform(RNG, (2, 4, 7, 8))
K = uniform(RNG, (2, 4, 113, 8))
V = uniform(RNG, (2, 4, 113, 5))


def raises(exc, message):
    return pytest.raises(exc, match="^" + re.escape(message))


@pytest.mark.parametrize("call, exc, message", [
    # kinds and dtypes
    (lambda: sdpa(Q.tolist(), K, V), TypeError, "query: got builtins.list; expected a numpy.ndarray or a torch.Tensor"),
    (lambda: sdpa(Q, K, "v"), TypeError, "value: got builtins.str"),
    (lambda: sdpa(Q.astype(np.float64), K, V), TypeError, "query: dtype float64; expected float32, bfloat16 or float16"),
    (lambda: sdpa(Q.astype(np.int32), K, V), TypeError, "query: dtype int32"),
    (lambda: sdpa(Q, K.astype(np.float16), V), TypeError, "key: dtype float16; expected the dtype of query (float32)"),
    (lambda: sdpa(Q, K, V.astype(np.float16)), TypeError, "value: dtype float16"),
    # ranks and shapes
    (lambda: sdpa(Q[0, 0], K[0, 0], V[0, 0]), ValueError, "query: rank 2 (shape [7, 8]); expected 4"),
    (lambda: sdpa(Q, K[0], V), ValueError, "key: rank 3"),
    (lambda: sdpa(Q, K[..., :7], V), ValueError, "key: head dim 7; expected Dk = 8"),
    (lambda: sdpa(Q, K, V[:, :, :100]), ValueError, "value: shape [2, 4, 100, 5]; expected [2, 4, 113, Dv]"),
    (lambda: sdpa(Q, K[:1], V[:1]), ValueError, "key: batch 1; expected B = 2"),
    # heads: PyTorch's rule (equal unless enable_gqa), then the library's (Hkv divides Hq)
    (lambda: sdpa(Q, K[:, :2], V[:, :2]), ValueError, "key: 2 heads but query has 4; expected the same number"),
    (lambda: sdpa(Q, K[:, :3], V[:, :3], enable_gqa=True), ValueError, "key: Hkv = 3 does not divide Hq = 4"),
    # masks
    (lambda: sdpa(Q, K, V, np.ones((7, 112), bool)), ValueError, "attn_mask: shape [7, 112] does not broadcast"),
    (lambda: sdpa(Q, K, V, np.ones((7, 113), np.int8)), TypeError, "attn_mask: dtype int8; expected bool"),
    (lambda: sdpa(Q, K, V, np.full((7, 113), np.nan, np.float32)), ValueError, "attn_mask: element [0, 0, 0, 0] is NaN"),
    (lambda: sdpa(Q, K, V, np.ones((1, 2, 4, 7, 113), bool)), ValueError, "attn_mask: rank 5"),
    (lambda: sdpa(Q[0], K[0], V[0], np.ones((1, 4, 7, 113), bool)), ValueError, "attn_mask: rank 4"),
    (lambda: sdpa(Q, K, V, [[True]]), TypeError, "attn_mask: got builtins.list"),
    # key lengths
    (lambda: sdpa(Q, K, V, kv_lens=[3, 114]), ValueError, "kv_lens: kv_lens[1] = 114; expected 0 <= length <= Skv = 113"),
    (lambda: sdpa(Q, K, V, kv_lens=[3]), ValueError, "kv_lens: shape [1]; expected [2] (B)"),
    (lambda: sdpa(Q, K, V, kv_lens=[3.0, 4.0]), TypeError, "kv_lens: kv_lens[0] is a float (3.0); expected an int"),
    (lambda: sdpa(Q, K, V, kv_lens=[[3, 4]]), ValueError, "kv_lens: rank 2 (shape [1, 2]); expected 1 ([B])"),
    # scalars and options
    (lambda: sdpa(Q, K, V, scale=-1.0), ValueError, "scale: is -1; expected a finite value > 0"),
    (lambda: sdpa(Q, K, V, scale=float("nan")), ValueError, "scale: is nan"),
    (lambda: sdpa(Q, K, V, scale="0.1"), TypeError, "scale: got str; expected a float"),
    (lambda: sdpa(Q, K, V, dropout_p=0.1), ValueError, "dropout_p: 0.1; expected 0.0"),
    (lambda: sdpa(Q, K, V, causal_alignment="bottom"), ValueError, "causal_alignment: 'bottom'; expected None"),
    (lambda: sdpa(Q, K, V, window=(1, 2, 3)), TypeError, "window: (1, 2, 3); expected a pair of ints"),
    (lambda: sdpa(Q, K, V, window=(1.5, 0)), TypeError, "window: (1.5, 0)"),
    (lambda: sdpa(Q, K, V, window=5), TypeError, "window: 5"),
    (lambda: sdpa(Q, K, V, window=(-2, 0)), ValueError, "window: left = -2 is out of range; expected -1 (unbounded)"),
    # merge_attention
    (lambda: attn.merge_attention(V, Q[..., 0], V, Q[..., 0]), ValueError, "lse_a: dimension 2 is 7; expected 113"),
    (lambda: attn.merge_attention(V, V[..., 0], V.astype(np.float16), V[..., 0]), TypeError, "out_b: dtype float16; expected float32"),
    (lambda: attn.merge_attention(V, V, V, V[..., 0]), ValueError, "lse_a: rank 4; expected 3"),
    (lambda: attn.merge_attention(V[0, 0], V[0, 0, :, 0], V[0, 0], V[0, 0, :, 0]), ValueError, "out_a: rank 2"),
    (lambda: attn.merge_attention(V, V[..., 0], V[:, :3], V[..., 0]), ValueError, "out_b: dimension 1 is 3; expected 4"),
])
def test_bad_input(call, exc, message):
    with raises(exc, message):
        call()


def test_binding_errors_name_the_library_parameter():
    # Straight from the binding the C++ names stand (q, k, v, out); the attn functions translate them.
    out = np.full((2, 4, 7, 5), np.nan, np.float32)
    with raises(ValueError, "k: head dim 7; expected Dk = 8"):
        _attn.attention(Q, K[..., :7], V, out, None, None, None, None, "none", -1, -1, "top_left")
    assert np.isnan(out).all()  # nothing written
    with raises(TypeError, "q: dtype float64 is not one attn handles"):
        _attn.attention(Q.astype(np.float64), K, V, out, None, None, None, None, "none", -1, -1, "top_left")
    with raises(ValueError, "out: stride of dimension 0 is 0"):
        zero_stride = np.lib.stride_tricks.as_strided(out, out.shape, (0,) + out.strides[1:], writeable=True)
        _attn.attention(Q, K, V, zero_stride, None, None, None, None, "none", -1, -1, "top_left")
    with raises(ValueError, "causal: 'diagonal'; expected 'none'"):
        _attn.attention(Q, K, V, out, None, None, None, None, "diagonal", -1, -1, "top_left")
    assert np.isnan(out).all()


def test_poisoned_strided_outputs_are_written_everywhere():
    out = np.full((2, 7, 4, 5 + 3), np.nan, np.float32).transpose(0, 2, 1, 3)[..., :5]  # BSHD, padded rows
    lse = np.full((2, 4, 7 * 2), np.nan, np.float32)[..., ::2]
    _attn.attention(Q, K, V, out, lse, None, None, None, "top_left", -1, -1, "top_left")
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_array_equal(out, sdpa(Q, K, V, is_causal=True))
