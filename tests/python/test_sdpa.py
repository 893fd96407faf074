"""attn.scaled_dot_product_attention and attn.merge_attention on NumPy arrays, against the fp64 reference."""

import zlib

import numpy as np
import pytest

import attn
from attn import _attn
from reference import attention, check_attention, uniform


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


# name: (B, Hq, Hkv, Sq, Skv, Dk, Dv, options)
CASES = {
    "single": (1, 1, 1, 1, 1, 8, 8, {}),
    "ragged_cross": (2, 3, 3, 7, 113, 16, 8, {}),
    "long_queries": (1, 2, 2, 113, 7, 32, 32, {}),
    "causal_top_left": (2, 2, 2, 113, 113, 16, 16, {"is_causal": True}),
    "causal_top_left_wide": (1, 2, 2, 7, 113, 16, 24, {"is_causal": True}),
    "causal_bottom_right_decode": (3, 4, 4, 1, 113, 16, 16, {"is_causal": True, "causal_alignment": "bottom_right"}),
    "causal_bottom_right_empty_rows": (1, 2, 2, 113, 7, 8, 8, {"is_causal": True, "causal_alignment": "bottom_right"}),
    "gqa": (2, 8, 2, 7, 113, 16, 16, {"enable_gqa": True}),
    "mqa_causal": (1, 6, 1, 113, 113, 8, 8, {"enable_gqa": True, "is_causal": True}),
    "scale": (1, 2, 2, 7, 7, 16, 16, {"scale": 0.37}),
    "window_sliding": (1, 2, 2, 113, 113, 16, 16, {"window": (5, 0)}),
    "window_both_bottom_right": (2, 2, 2, 7, 113, 16, 16, {"window": (3, 2), "causal_alignment": "bottom_right"}),
    "window_left_unbounded": (1, 2, 2, 7, 7, 16, 16, {"window": (None, 1)}),
    "kv_lens": (3, 2, 2, 7, 113, 16, 16, {"kv_lens": [0, 113, 50]}),
    "kv_lens_causal_bottom_right": (2, 2, 2, 7, 113, 16, 16,
                                    {"kv_lens": np.array([3, 113], np.int32), "is_causal": True,
                                     "causal_alignment": "bottom-right"}),
}

MASKS = {
    "bool_2d": lambda rng, b, h, sq, skv: rng.random((sq, skv)) < 0.7,
    "bool_keys": lambda rng, b, h, sq, skv: rng.random(skv) < 0.6,
    "bool_per_batch": lambda rng, b, h, sq, skv: rng.random((b, 1, sq, skv)) < 0.5,
    "float_full": lambda rng, b, h, sq, skv: np.where(rng.random((b, h, sq, skv)) < 0.2, -np.inf,
                                                      rng.normal(size=(b, h, sq, skv))).astype(np.float32),
    "float_rows": lambda rng, b, h, sq, skv: rng.normal(size=(1, sq, 1)).astype(np.float32),
    "float64_2d": lambda rng, b, h, sq, skv: rng.normal(size=(sq, skv)),
    "float16_2d": lambda rng, b, h, sq, skv: rng.normal(size=(sq, skv)).astype(np.float16),
}


def make_qkv(rng, b, hq, hkv, sq, skv, dk, dv, dtype=np.float32):
    return (uniform(rng, (b, hq, sq, dk), dtype), uniform(rng, (b, hkv, skv, dk), dtype),
            uniform(rng, (b, hkv, skv, dv), dtype))


def reference_kwargs(options):
    """The reference's spelling of the public options."""
    align = (options.get("causal_alignment") or "top_left").replace("-", "_")
    return dict(causal=options.get("is_causal", False), align=align, scale=options.get("scale"),
                kv_lens=options.get("kv_lens"), window=options.get("window"))


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matches_fp64_reference(name, dtype):
    b, hq, hkv, sq, skv, dk, dv, options = CASES[name]
    q, k, v = make_qkv(rng_for(name + dtype), b, hq, hkv, sq, skv, dk, dv, np.dtype(dtype))
    before = [x.copy() for x in (q, k, v)]
    out, lse = attn.scaled_dot_product_attention(q, k, v, **options, return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert out.dtype == np.dtype(dtype) and out.shape == (b, hq, sq, dv)
    assert lse.dtype == np.float32 and lse.shape == (b, hq, sq)
    check_attention(out, lse, dtype, q=q, k=k, v=v, **reference_kwargs(options))
    for x, y in zip((q, k, v), before):
        np.testing.assert_array_equal(x, y)  # inputs untouched


def test_rows_without_keys_are_zero_with_minus_inf_lse():
    q, k, v = make_qkv(rng_for("empty"), 1, 2, 2, 113, 7, 8, 8)
    out, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                                 return_lse=True)
    assert np.all(out[:, :, :106] == 0) and np.all(lse[:, :, :106] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, 106:]))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("causal", [False, True])
def test_masks_broadcast(mask, causal):
    rng = rng_for(mask + str(causal))
    b, h, sq, skv = 2, 3, 7, 113
    q, k, v = make_qkv(rng, b, h, h, sq, skv, 16, 16)
    m = MASKS[mask](rng, b, h, sq, skv)
    out, lse = attn.scaled_dot_product_attention(q, k, v, m, is_causal=causal, return_lse=True)
    check_attention(out, lse, "float32", q=q, k=k, v=v, mask=m, causal=causal)


def test_positional_arguments_follow_pytorch():
    # (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa), as in PyTorch.
    q, k, v = make_qkv(rng_for("positional"), 1, 4, 2, 7, 7, 8, 8)
    out = attn.scaled_dot_product_attention(q, k, v, None, 0.0, True, 0.5, True)
    check_attention(out, None, "float32", q=q, k=k, v=v, causal=True, scale=0.5)


def test_unbatched_3d_inputs():
    q, k, v = make_qkv(rng_for("3d"), 1, 4, 2, 7, 113, 16, 8)
    m = rng_for("3d mask").random((7, 113)) < 0.8
    out, lse = attn.scaled_dot_product_attention(q[0], k[0], v[0], m, is_causal=True, enable_gqa=True,
                                                 return_lse=True)
    assert out.shape == (4, 7, 8) and lse.shape == (4, 7)
    check_attention(out[None], lse[None], "float32", q=q, k=k, v=v, mask=m, causal=True)


LAYOUTS = {
    # Each turns a contiguous [B, H, S, D] array into an equal one with other strides.
    "bshd_transposed": lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3),
    "fortran": lambda x: np.asfortranarray(x),
    "reversed_heads": lambda x: np.ascontiguousarray(x[:, ::-1])[:, ::-1],
    "every_other_row": lambda x: np.repeat(x, 2, axis=2)[:, :, ::2],
    "padded_rows": lambda x: np.pad(x, ((0, 0), (0, 0), (0, 0), (0, 5)))[..., : x.shape[-1]],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_any_strides(layout):
    q, k, v = make_qkv(rng_for(layout), 2, 4, 2, 7, 113, 16, 8)
    relaid = [LAYOUTS[layout](x) for x in (q, k, v)]
    for x, y in zip(relaid, (q, k, v)):
        np.testing.assert_array_equal(x, y)
    assert not all(x.flags.c_contiguous for x in relaid)
    out = attn.scaled_dot_product_attention(*relaid, is_causal=True, enable_gqa=True)
    np.testing.assert_array_equal(out, attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    check_attention(out, None, "float32", q=q, k=k, v=v, causal=True)


def test_broadcast_inputs_with_zero_strides():
    rng = rng_for("broadcast")
    q = uniform(rng, (2, 3, 7, 16))
    k = np.broadcast_to(uniform(rng, (1, 3, 113, 16)), (2, 3, 113, 16))  # read-only, stride 0 over batch
    v = np.broadcast_to(uniform(rng, (2, 1, 113, 8)), (2, 3, 113, 8))
    assert not k.flags.writeable
    out = attn.scaled_dot_product_attention(q, k, v)
    check_attention(out, None, "float32", q=q, k=np.array(k), v=np.array(v))


def _overlapping(layout):
    """A view q of `buf` in the given layout, and an output view over the same memory."""
    buf = uniform(rng_for("overlap" + layout), (1, 4, 2, 8))  # [B, S, H, D]
    q = {"bshd": buf.transpose(0, 2, 1, 3),
         "reversed": buf.transpose(0, 2, 1, 3)[:, :, ::-1],
         "broadcast": np.broadcast_to(buf[:, :1].transpose(0, 2, 1, 3), (1, 2, 4, 8))}[layout]
    return q, buf.reshape(1, 2, 4, 8)


@pytest.mark.parametrize("layout", ["bshd", "reversed", "broadcast"])
def test_arrays_reach_the_library_without_copies(layout):
    # The library refuses an output overlapping an input: that it sees the overlap proves that the
    # binding passed the caller's memory itself, not a contiguous copy.
    q, out = _overlapping(layout)
    k = uniform(rng_for("k"), (1, 2, 5, 8))
    with pytest.raises(ValueError, match="^out: memory overlaps input q"):
        _attn.attention(q, k, k, out, None, _attn.Options())


def test_bfloat16_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (NumPy bfloat16) is not installed")
    q, k, v = make_qkv(rng_for("bf16"), 2, 4, 2, 7, 113, 16, 8, ml_dtypes.bfloat16)
    mask = rng_for("bf16 mask").normal(size=(7, 113)).astype(ml_dtypes.bfloat16)
    out, lse = attn.scaled_dot_product_attention(q, k, v, mask, is_causal=True, enable_gqa=True, return_lse=True)
    assert out.dtype == ml_dtypes.bfloat16
    check_attention(out, lse, "bfloat16", q=q, k=k, v=v, mask=mask, causal=True)


def test_empty_sizes():
    q, k, v = make_qkv(rng_for("empty sizes"), 0, 2, 2, 7, 7, 8, 8)
    assert attn.scaled_dot_product_attention(q, k, v).shape == (0, 2, 7, 8)
    q, k, v = make_qkv(rng_for("empty sizes"), 1, 2, 2, 0, 7, 8, 8)
    out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert out.shape == (1, 2, 0, 8) and lse.shape == (1, 2, 0)


def test_merge_attention_equals_attention_over_all_keys():
    rng = rng_for("merge")
    q, k, v = make_qkv(rng, 2, 4, 4, 7, 113, 16, 8)
    split = 50
    out_a, lse_a = attn.scaled_dot_product_attention(q, k[:, :, :split], v[:, :, :split], return_lse=True)
    out_b, lse_b = attn.scaled_dot_product_attention(q, k[:, :, split:], v[:, :, split:], return_lse=True)
    out, lse = attn.merge_attention(out_a, lse_a, out_b, lse_b)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and lse.shape == (2, 4, 7)
    check_attention(out, lse, "float32", q=q, k=k, v=v)
    # Unbatched, and a side without keys (lse = -inf) contributes nothing.
    empty_out, empty_lse = np.zeros_like(out_a[0]), np.full_like(lse_a[0], -np.inf)
    out3, lse3 = attn.merge_attention(out_a[0], lse_a[0], empty_out, empty_lse)
    np.testing.assert_array_equal(out3, out_a[0])
    np.testing.assert_array_equal(lse3, lse_a[0])


def test_version():
    assert isinstance(attn.__version__, str) and attn.__version__.count(".") == 2
    from importlib.metadata import version

    assert version("attn") == attn.__version__


def test_reference_self_check():
    # The seeds' worked example (as in the README's C++ example): the oracle itself is right.
    q = np.array([[[[1, 0], [0, 1]]]], np.float32)
    k = np.array([[[[1, 0], [0, 1], [1, 1]]]], np.float32)
    v = np.array([[[[1, 0], [0, 2], [3, 1]]]], np.float32)
    ref, _ = attention(q, k, v)
    np.testing.assert_allclose(ref[0, 0], [[1.604, 0.797], [1.401, 1.203]], atol=1e-3)
    np.testing.assert_allclose(attn.scaled_dot_product_attention(q, k, v), ref, atol=1e-6)
