"""Bad input: a ValueError or TypeError whose message starts with the parameter's name, nothing written."""

import re
import subprocess
import sys
import textwrap

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
    # a float64 mask value past float32's range: refused, not turned into ±inf
    (lambda: sdpa(Q, K, V, attn_mask=np.full((7, 113), 1e300)), ValueError,
     "attn_mask: element [0, 0] is 1e+300, past float32's range"),
    (lambda: sdpa(Q, K, V, attn_mask=np.full((7, 113), -1e300)), ValueError,
     "attn_mask: element [0, 0] is -1e+300, past float32's range"),
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
    # the library's rank checks, found then expected as every message
    (lambda: sdpa(Q, K, V, alibi_slopes=np.ones((1, 2, 4), np.float32)), ValueError,
     "alibi_slopes: rank 3; expected rank 1 ([Hq]) or 2 ([B, Hq])"),
    (lambda: sdpa(Q, K.astype(np.int8), V.astype(np.int8), k_scale=np.ones((2, 4, 113), np.float32),
                  v_scale=np.ones((4, 113), np.float32)), ValueError, "v_scale: rank 2; expected rank 3"),
    # scalars and options
    (lambda: sdpa(Q, K, V, scale=-1.0), ValueError, "scale: is -1; expected a finite value > 0"),
    (lambda: sdpa(Q, K, V, scale=float("nan")), ValueError, "scale: is nan"),
    (lambda: sdpa(Q, K, V, scale="0.1"), TypeError, "scale: got str; expected a float"),
    (lambda: sdpa(Q, K, V, dropout_p=1.0), ValueError, "dropout_p: is 1; expected a probability in [0, 1)"),
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
        _attn.attention(Q, K[..., :7], V, out, None, _attn.Options())
    assert np.isnan(out).all()  # nothing written
    with raises(TypeError, "q: dtype float64 is not one attn handles"):
        _attn.attention(Q.astype(np.float64), K, V, out, None, _attn.Options())
    with raises(ValueError, "out: stride of dimension 0 is 0"):
        zero_stride = np.lib.stride_tricks.as_strided(out, out.shape, (0,) + out.strides[1:], writeable=True)
        _attn.attention(Q, K, V, zero_stride, None, _attn.Options())
    with raises(ValueError, "causal: 'diagonal'; expected 'none'"):
        _attn.attention(Q, K, V, out, None, _attn.Options(causal="diagonal"))
    assert np.isnan(out).all()


def test_poisoned_strided_outputs_are_written_everywhere():
    out = np.full((2, 7, 4, 5 + 3), np.nan, np.float32).transpose(0, 2, 1, 3)[..., :5]  # BSHD, padded rows
    lse = np.full((2, 4, 7 * 2), np.nan, np.float32)[..., ::2]
    _attn.attention(Q, K, V, out, lse, _attn.Options(causal="top_left"))
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_array_equal(out, sdpa(Q, K, V, is_causal=True))


# ---- the rule on kinds, integer arguments, windows and flags (scaled_dot_product_attention) ----------------

def _unaligned(shape):
    """A float32 array whose data starts one byte past an element boundary."""
    n = int(np.prod(shape))
    return np.zeros(n * 4 + 1, np.uint8)[1:].view(np.float32).reshape(shape)


def _field_view(shape):
    """A float32 view with a 5-byte stride (a field of a packed record array)."""
    return np.zeros(shape, dtype=[("a", "<f4"), ("b", "u1")])["a"]


U64 = np.uint64


@pytest.mark.parametrize("call, exc, message", [
    # window sides out of int64's range, bools and other types
    (lambda: sdpa(Q, K, V, window=(2**70, 1)), ValueError,
     "window: left = 1180591620717411303424 is out of range; expected -1 (unbounded) or 0 <= left < 2**63"),
    (lambda: sdpa(Q, K, V, window=(0, -2**64)), ValueError,
     "window: right = -18446744073709551616 is out of range; expected -1 (unbounded) or 0 <= right < 2**63"),
    (lambda: sdpa(Q, K, V, window=(True, 1)), TypeError, "window: (True, 1); expected a pair of ints"),
    (lambda: sdpa(Q, K, V, window="ab"), TypeError, "window: 'ab'; expected a pair of ints"),
    # kv_lens: any integer dtype, range-checked; bool and float dtypes refused
    (lambda: sdpa(Q, K, V, kv_lens=np.array([3, 2**63], U64)), ValueError,
     "kv_lens: kv_lens[1] = 9223372036854775808 is out of range; expected 0 <= length < 2**63 (an int64)"),
    (lambda: sdpa(Q, K, V, kv_lens=np.array([2**64 - 1, 3], U64)), ValueError,
     "kv_lens: kv_lens[0] = 18446744073709551615 is out of range"),
    (lambda: sdpa(Q, K, V, kv_lens=[3, 2**64]), ValueError, "kv_lens: kv_lens[1] = 18446744073709551616 is out of range"),
    (lambda: sdpa(Q, K, V, kv_lens=[-2**63 - 1, 3]), ValueError, "kv_lens: kv_lens[0] = -9223372036854775809 is out"),
    (lambda: sdpa(Q, K, V, kv_lens=np.array([3, 200], np.uint8)), ValueError,
     "kv_lens: kv_lens[1] = 200; expected 0 <= length <= Skv = 113"),
    (lambda: sdpa(Q, K, V, kv_lens=np.array([3, -1], np.int8)), ValueError, "kv_lens: kv_lens[1] = -1; expected 0 <="),
    (lambda: sdpa(Q, K, V, kv_lens=np.array([True, False])), TypeError, "kv_lens: dtype bool; expected integers"),
    (lambda: sdpa(Q, K, V, kv_lens=np.array([3, 4], np.float32)), TypeError, "kv_lens: dtype float32; expected integers"),
    (lambda: sdpa(Q, K, V, kv_lens=[True, 3]), TypeError, "kv_lens: kv_lens[0] is a bool (True); expected an int"),
    (lambda: sdpa(Q, K, V, kv_lens=["3", 4]), TypeError, "kv_lens: kv_lens[0] is a str ('3'); expected an int"),
    (lambda: sdpa(Q, K, V, kv_lens=3), TypeError,
     "kv_lens: got builtins.int; expected a numpy.ndarray like query, or a list or tuple of ints"),
    (lambda: sdpa(Q, K, V, kv_lens=np.array(3)), ValueError, "kv_lens: rank 0 (shape []); expected 1 ([B])"),
    (lambda: sdpa(Q, K, V, kv_lens=[[3, 4], [5]]), ValueError, "kv_lens: kv_lens[1] has 1 entries where kv_lens[0] has 2"),
    # bool flags, scale and dropout_p
    (lambda: sdpa(Q, K, V, is_causal="bottom_right"), TypeError, "is_causal: got str 'bottom_right'; expected True or False"),
    (lambda: sdpa(Q, K, V, enable_gqa=1), TypeError, "enable_gqa: got int 1; expected True or False"),
    (lambda: sdpa(Q, K, V, return_lse=None), TypeError, "return_lse: got NoneType None; expected True or False"),
    (lambda: sdpa(Q, K, V, scale=10**400), ValueError, "scale: 1000"),
    (lambda: sdpa(Q, K, V, dropout_p=None), TypeError, "dropout_p: got NoneType; expected a float in [0, 1)"),
    # arrays NumPy cannot hand over as they are
    (lambda: sdpa(Q.astype(">f4"), K, V), TypeError, "query: dtype >f4 (float32 in non-native byte order)"),
    (lambda: sdpa(Q, K.astype(">f4"), V), TypeError, "key: dtype >f4; expected the dtype of query (float32)"),
    (lambda: sdpa(_unaligned(Q.shape), K, V), ValueError, "query: data not aligned to its 4-byte elements"),
    (lambda: sdpa(Q, K, _field_view(V.shape)), ValueError,
     "value: stride of dimension 1 is 2825 bytes, not a multiple of the element size (4 bytes)"),
    (lambda: sdpa(Q, K, V, np.array(True)), ValueError, "attn_mask: rank 0 (shape []); expected 1 to 4"),
    # merge_attention
    (lambda: attn.merge_attention(V.tolist(), V[..., 0], V, V[..., 0]), TypeError, "out_a: got builtins.list"),
    (lambda: attn.merge_attention(V, V[..., 0], V, V[..., 0].tolist()), TypeError,
     "lse_b: got builtins.list; expected a numpy.ndarray like out_a"),
])
def test_bad_arguments(call, exc, message):
    with raises(exc, message):
        call()


def test_big_endian_mask_is_converted():
    # A float mask in non-native byte order is converted (like every float mask that is not float32).
    mask = np.where(RNG.random((7, 113)) < 0.3, -np.inf, 0.0).astype(">f8")
    mask[:, 0] = 0
    np.testing.assert_array_equal(sdpa(Q, K, V, mask), sdpa(Q, K, V, mask.astype(np.float32)))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", ">i8",
                                   "list", "tuple"])
def test_kv_lens_of_any_integer_dtype(dtype):
    expected = sdpa(Q, K, V, kv_lens=np.array([3, 100], np.int64), is_causal=True, causal_alignment="bottom_right")
    if dtype in ("list", "tuple"):
        lens = [3, np.int16(100)] if dtype == "list" else (np.uint64(3), 100)
    else:
        lens = np.array([3, 100], dtype)
    before = np.array(lens, copy=True)
    got = sdpa(Q, K, V, kv_lens=lens, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.array(lens), before)  # the caller's lengths are read, never written


# ---- attention_paged ---------------------------------------------------------------------------------------

PB, PHQ, PHKV, PSQ, PAGE, MAXP, PD, PDV = 2, 4, 2, 3, 4, 3, 8, 5
PQ = uniform(RNG, (PB, PHQ, PSQ, PD))
KP = uniform(RNG, (7, PHKV, PAGE, PD))
VP = uniform(RNG, (7, PHKV, PAGE, PDV))
TABLE = np.array([[6, 0, 2], [1, 4, -1]], np.int32)
LENS = np.array([12, 7], np.int64)
paged = attn.attention_paged


def paged_reference(q, k_pages, v_pages, table, lens, **kwargs):
    """attention_paged's result the long way: the pages gathered into contiguous K/V, through sdpa."""
    k = np.stack([np.concatenate([k_pages[max(p, 0)] for p in row], axis=1) for row in table])
    v = np.stack([np.concatenate([v_pages[max(p, 0)] for p in row], axis=1) for row in table])
    return sdpa(q, k, v, kv_lens=lens, enable_gqa=True, **kwargs)


@pytest.mark.parametrize("call, exc, message", [
    # ranks: checked before the shapes are unpacked
    (lambda: paged(PQ[0], KP, VP, TABLE, LENS), ValueError,
     "query: rank 3 (shape [4, 3, 8]); expected 4 ([B, Hq, Sq, Dk])"),
    (lambda: paged(PQ, KP[0], VP, TABLE, LENS), ValueError,
     "k_pages: rank 3 (shape [2, 4, 8]); expected 4 ([P, Hkv, page_size, Dk])"),
    (lambda: paged(PQ, KP, VP[None], TABLE, LENS), ValueError, "v_pages: rank 5 (shape [1, 7, 2, 4, 5]); expected 4"),
    (lambda: paged(PQ, KP, VP, TABLE[0], LENS), ValueError, "page_table: rank 1 (shape [3]); expected 2 ([B, max_pages])"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS[None]), ValueError, "seq_lens: rank 2 (shape [1, 2]); expected 1 ([B])"),
    # kinds and dtypes
    (lambda: paged(PQ.tolist(), KP, VP, TABLE, LENS), TypeError, "query: got builtins.list"),
    (lambda: paged(PQ, KP.tolist(), VP, TABLE, LENS), TypeError,
     "k_pages: got builtins.list; expected a numpy.ndarray like query"),
    (lambda: paged(PQ.astype(np.int32), KP, VP, TABLE, LENS), TypeError,
     "query: dtype int32; expected float32, bfloat16 or float16"),
    (lambda: paged(PQ, KP.astype(np.float64), VP, TABLE, LENS), TypeError, "k_pages: dtype float64; expected float32"),
    (lambda: paged(PQ, KP, VP.astype(np.float16), TABLE, LENS), TypeError,
     "v_pages: dtype float16; expected the dtype of k_pages (float32)"),
    (lambda: paged(PQ, KP, VP, 7, LENS), TypeError,
     "page_table: got builtins.int; expected a numpy.ndarray like query, or a list or tuple of ints"),
    (lambda: paged(PQ, KP, VP, TABLE.astype(np.float32), LENS), TypeError, "page_table: dtype float32; expected integers"),
    (lambda: paged(PQ, KP, VP, TABLE != 0, LENS), TypeError, "page_table: dtype bool; expected integers"),
    (lambda: paged(PQ, KP, VP, [[6, 0, 2.0], [1, 4, -1]], LENS), TypeError,
     "page_table: page_table[0][2] is a float (2.0); expected an int"),
    (lambda: paged(PQ, KP, VP, [[6, 0, 2], [1, 4]], LENS), ValueError,
     "page_table: page_table[1] has 2 entries where page_table[0] has 3 entries; expected a rectangular nesting"),
    (lambda: paged(PQ, KP, VP, [[6, 0, 2], 1], LENS), ValueError, "page_table: page_table[1] is an int where page_table[0] has 3 entries"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS.astype(np.float64)), TypeError, "seq_lens: dtype float64; expected integers"),
    (lambda: paged(PQ, KP, VP, TABLE, None), TypeError,  # (was an AttributeError from the binding's conversion)
     "seq_lens: got builtins.NoneType; expected a numpy.ndarray like query, or a list or tuple of ints"),
    (lambda: paged(PQ, KP, VP, None, LENS), TypeError,
     "page_table: got builtins.NoneType; expected a numpy.ndarray like query, or a list or tuple of ints"),
    # integer ranges: page indices must fit in int32, lengths in int64
    (lambda: paged(PQ, KP, VP, np.array([[6, 0, 2**33], [1, 4, -1]]), LENS), ValueError,
     "page_table: page_table[0][2] = 8589934592 is out of range; expected a page index that fits in int32 "
     "(-2**31 <= index < 2**31)"),
    (lambda: paged(PQ, KP, VP, np.array([[6, 0, 2], [1, 4, 2**64 - 1]], U64), LENS), ValueError,
     "page_table: page_table[1][2] = 18446744073709551615 is out of range"),
    (lambda: paged(PQ, KP, VP, [[6, 0, 2], [1, -2**31 - 1, 0]], LENS), ValueError,
     "page_table: page_table[1][1] = -2147483649 is out of range"),
    (lambda: paged(PQ, KP, VP, TABLE, np.array([12, 2**63], U64)), ValueError,
     "seq_lens: seq_lens[1] = 9223372036854775808 is out of range; expected 0 <= length < 2**63 (an int64)"),
    # what the library checks, named as in Python
    (lambda: paged(PQ, KP, VP, TABLE, [12, 13]), ValueError, "seq_lens: seq_lens[1] = 13; expected 0 <= length <= Skv = 12"),
    (lambda: paged(PQ, KP, VP, [[6, 0, 2], [1, 9, -1]], LENS), ValueError,
     "page_table: page_table[1][1] = 9; expected a page index in [0, 7)"),
    (lambda: paged(PQ, KP[..., :7], VP, TABLE, LENS), ValueError, "k_pages: head dim 7; expected Dk = 8"),
    (lambda: paged(PQ[:, :3], KP, VP, TABLE, LENS), ValueError, "k_pages: Hkv = 2 does not divide Hq = 3"),
    # options as in scaled_dot_product_attention
    (lambda: paged(PQ, KP, VP, TABLE, LENS, window=(2**70, 1)), ValueError, "window: left = 1180591620717411303424 is"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, is_causal="yes"), TypeError, "is_causal: got str 'yes'"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, return_lse=1), TypeError, "return_lse: got int 1"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, scale="1"), TypeError, "scale: got str; expected a float"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, scale=0.0), ValueError, "scale: is 0; expected a finite value > 0"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, causal_alignment="up"), ValueError, "causal_alignment: 'up'"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, attn_mask=np.ones((3, 12), np.int8)), TypeError,
     "attn_mask: dtype int8; expected bool"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, attn_mask=np.ones((3, 11), bool)), ValueError,
     "attn_mask: shape [3, 11] does not broadcast"),
    (lambda: paged(PQ, KP, VP, TABLE, LENS, attn_mask=[[True]]), TypeError, "attn_mask: got builtins.list"),
])
def test_attention_paged_bad_input(call, exc, message):
    table, lens = TABLE.copy(), LENS.copy()
    with raises(exc, message):
        call()
    np.testing.assert_array_equal(TABLE, table)  # inputs are only read
    np.testing.assert_array_equal(LENS, lens)


@pytest.mark.parametrize("table_kind", ["int32", "int64", "uint8", "int16", "uint64", ">i4", "list", "tuple"])
def test_attention_paged_page_tables_and_lengths_of_any_integer_kind(table_kind):
    expected = paged_reference(PQ, KP, VP, TABLE, LENS, is_causal=True, causal_alignment="bottom_right")
    if table_kind == "list":
        table, lens = TABLE.tolist(), LENS.tolist()
    elif table_kind == "tuple":
        table, lens = tuple(tuple(int(p) for p in row) for row in TABLE), (np.int8(12), np.uint64(7))
    elif table_kind.startswith("uint"):  # -1 does not fit: an unused entry any valid index can stand for
        table, lens = np.where(TABLE < 0, 0, TABLE).astype(table_kind), LENS.astype(table_kind)
    else:
        table, lens = TABLE.astype(table_kind), LENS.astype(table_kind)
    got = paged(PQ, KP, VP, table, lens, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_attention_paged_bfloat16_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (NumPy bfloat16) is not installed")
    bf = ml_dtypes.bfloat16
    q, kp, vp = PQ.astype(bf), KP.astype(bf), VP.astype(bf)
    out, lse = paged(q, kp, vp, TABLE, LENS, is_causal=True, causal_alignment="bottom_right", return_lse=True)
    assert out.dtype == bf and lse.dtype == np.float32
    # The same bf16 values through scaled_dot_product_attention's bf16 path.
    ref, ref_lse = paged_reference(q, kp, vp, TABLE, LENS, is_causal=True, causal_alignment="bottom_right",
                                   return_lse=True)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=2**-7, atol=2**-7)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    # bf16 pages with a float32 query, and the other way round.
    for qq, kk, vv in ((PQ, kp, vp), (q, KP, VP)):
        got = paged(qq, kk, vv, TABLE, LENS)
        assert got.dtype == qq.dtype
        np.testing.assert_allclose(got.astype(np.float32), paged_reference(PQ, KP, VP, TABLE, LENS), atol=2**-6)
    with raises(TypeError, "v_pages: dtype float32; expected the dtype of k_pages (bfloat16)"):
        paged(q, kp, VP, TABLE, LENS)


def test_attention_paged_binding_takes_bf16_bits_and_writes_nothing_on_error():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (NumPy bfloat16) is not installed")
    bits = lambda x: x.astype(ml_dtypes.bfloat16).view(np.uint16)  # noqa: E731
    out = np.full((PB, PHQ, PSQ, PDV), 0x7FC0, np.uint16)  # bf16 NaN
    args = (bits(PQ), bits(KP), bits(VP), TABLE, LENS, out, None)
    with raises(TypeError, "q: dtype uint16 is not one attn handles"):
        _attn.attention_paged(*args, _attn.Options())  # without the flag uint16 is not bf16
    bad = TABLE.copy()
    bad[0, 0] = 99
    with raises(ValueError, "page_table: page_table[0][0] = 99"):
        _attn.attention_paged(*args[:3], bad, *args[4:], _attn.Options(bf16_bits=True))
    assert (out == 0x7FC0).all()  # nothing written
    _attn.attention_paged(*args, _attn.Options(bf16_bits=True))
    expected = paged_reference(PQ.astype(ml_dtypes.bfloat16), KP.astype(ml_dtypes.bfloat16),
                               VP.astype(ml_dtypes.bfloat16), TABLE, LENS)
    np.testing.assert_array_equal(out.view(ml_dtypes.bfloat16).astype(np.float32), expected.astype(np.float32))


# ---- the modules: caches, multi-head attention, cost model -------------------------------------------------

def _cache():
    c = attn.KVCache(2, 8, 16)
    c.append(uniform(RNG, (1, 2, 5, 8)), uniform(RNG, (1, 2, 5, 8)))
    return c


def _paged_cache():
    c = attn.PagedKVCache(2, 8, 4, 8)
    sid = c.add_sequence()
    c.append(sid, uniform(RNG, (1, 2, 5, 8)), uniform(RNG, (1, 2, 5, 8)))
    return c, sid


MHA = attn.MultiHeadAttention(32, 4, 2, seed=1)
X = uniform(RNG, (2, 5, 32))
Q1 = uniform(RNG, (1, 4, 3, 8))


@pytest.mark.parametrize("call, exc, message", [
    # KVCache
    (lambda: attn.KVCache(None, 8, 16), TypeError, "kv_heads: got NoneType None; expected an int"),
    (lambda: attn.KVCache(2, 8.0, 16), TypeError, "head_dim: got float 8.0; expected an int"),
    (lambda: attn.KVCache(2, 8, 2**70), ValueError, "capacity: 1180591620717411303424 is out of range; expected an int64"),
    (lambda: attn.KVCache(2, 8, 0), ValueError, "capacity: 0; expected >= 1"),
    (lambda: attn.KVCache(2, 8, 2**31), ValueError, "capacity: 2147483648; expected at most 2147483647"),
    (lambda: attn.KVCache(2, 20000, 4), ValueError, "head_dim: 20000; expected at most 16384"),
    (lambda: attn.KVCache(2, 8, 4, v_head_dim=0), ValueError, "v_head_dim: 0; expected an int >= 1, or None"),
    (lambda: _cache().append(uniform(RNG, (2, 5, 8)), uniform(RNG, (2, 5, 8))), ValueError,
     "k: rank 3 (shape [2, 5, 8]); expected 4 ([1, Hkv, T, Dk])"),
    (lambda: _cache().append(uniform(RNG, (1, 2, 5, 8)), uniform(RNG, (2, 5, 8))), ValueError, "v: rank 3"),
    (lambda: _cache().append(np.zeros((1, 2, 1, 8)), np.zeros((1, 2, 1, 8))), TypeError,
     "k: dtype float64; expected float32"),
    (lambda: _cache().append(uniform(RNG, (1, 2, 1, 8)), [[[[0.0] * 8]] * 2]), TypeError,
     "v: got builtins.list; expected a numpy.ndarray like k"),
    (lambda: _cache().append(uniform(RNG, (1, 3, 1, 8)), uniform(RNG, (1, 3, 1, 8))), ValueError,
     "k: heads 3; expected Hkv = 2"),
    (lambda: _cache().attend(Q1[0]), ValueError, "q: rank 3 (shape [4, 3, 8]); expected 4 ([1, Hq, T, Dk])"),
    (lambda: _cache().attend(Q1.tolist()), TypeError, "q: got builtins.list"),
    (lambda: _cache().attend(Q1.astype(np.float16)), TypeError, "q: dtype float16; expected float32"),
    (lambda: _cache().attend(Q1[..., :7]), ValueError, "q: head dim 7; expected Dk = 8 (the cache's head_dim)"),
    (lambda: _cache().attend(Q1[:, :3]), ValueError,
     "q: heads 3; expected a positive multiple of Hkv = 2 (the cache's kv_heads)"),
    (lambda: _cache().attend(np.concatenate([Q1, Q1])), ValueError, "q: batch 2; expected 1 (one sequence)"),
    (lambda: _cache().attend(Q1, return_lse="yes"), TypeError, "return_lse: got str 'yes'"),
    (lambda: _cache().truncate("1"), TypeError, "length: got str '1'; expected an int"),
    (lambda: _cache().truncate(9), ValueError, "length: 9; expected 0 .. 5"),
    # PagedKVCache
    (lambda: attn.PagedKVCache(2, 8, None, 4), TypeError, "page_size: got NoneType None"),
    (lambda: attn.PagedKVCache(2, 8, 4, 0), ValueError, "num_pages: 0; expected >= 1"),
    (lambda: _paged_cache()[0].attend(_paged_cache()[1], Q1), TypeError,
     "ids: got builtins.int; expected a numpy.ndarray like q, or a list or tuple of ints"),
    (lambda: _paged_cache()[0].attend([0.0], Q1), TypeError, "ids: ids[0] is a float (0.0); expected an int"),
    (lambda: _paged_cache()[0].attend([2**64], Q1), ValueError, "ids: ids[0] = 18446744073709551616 is out of range"),
    (lambda: _paged_cache()[0].attend([7], Q1), ValueError, "ids: id 7 does not exist"),
    (lambda: _paged_cache()[0].attend([0], Q1[0]), ValueError, "q: rank 3 (shape [4, 3, 8]); expected 4 ([B, Hq, T, Dk])"),
    (lambda: _paged_cache()[0].attend([0], Q1[..., :7]), ValueError, "q: head dim 7; expected Dk = 8 (the cache's"),
    (lambda: _paged_cache()[0].attend([0, 0], Q1), ValueError, "ids: sequence 0 appears twice"),
    (lambda: _paged_cache()[0].length(99), ValueError, "seq_id: id 99 does not exist"),
    (lambda: _paged_cache()[0].remove_sequence("0"), TypeError, "seq_id: got str '0'; expected an int"),
    (lambda: _paged_cache()[0].append(0, uniform(RNG, (2, 1, 8)), uniform(RNG, (2, 1, 8))), ValueError,
     "k: rank 3 (shape [2, 1, 8]); expected 4 ([1, Hkv, T, Dk])"),
    # MultiHeadAttention
    (lambda: attn.MultiHeadAttention(None, 4), TypeError, "d_model: got NoneType None; expected an int"),
    (lambda: attn.MultiHeadAttention(32, 4, kv_heads=0), ValueError,
     "kv_heads: 0; expected an int >= 1, or None for heads"),
    (lambda: attn.MultiHeadAttention(32, 4, kv_heads=3), ValueError, "kv_heads: 3; expected a divisor of heads = 4"),
    (lambda: attn.MultiHeadAttention(32, 4, bias="yes"), TypeError, "bias: got str 'yes'; expected True or False"),
    (lambda: attn.MultiHeadAttention(32, 4, seed=-1), ValueError, "seed: -1 is out of range; expected 0 <= seed < 2**64"),
    (lambda: attn.MultiHeadAttention(32, 4, seed=1.5), TypeError, "seed: got float 1.5; expected an int"),
    (lambda: MHA(X[0]), ValueError, "x: rank 2 (shape [5, 32]); expected 3 ([B, S, d_model])"),
    (lambda: MHA(X, X[0]), ValueError, "x_kv: rank 2 (shape [5, 32]); expected 3 ([B, Skv, d_model])"),
    (lambda: MHA(X.tolist()), TypeError, "x: got builtins.list"),
    (lambda: MHA(X, X.tolist()), TypeError, "x_kv: got builtins.list; expected a numpy.ndarray like x"),
    (lambda: MHA(X.astype(np.float64)), TypeError, "x: dtype float64; expected float32"),
    (lambda: MHA(X[..., :31]), ValueError, "x: width 31; expected d_model = 32"),
    (lambda: MHA(X, attn_mask=np.ones((5, 5), np.int8)), TypeError, "attn_mask: dtype int8; expected bool"),
    (lambda: MHA(X, attn_mask=np.ones((5, 4), bool)), ValueError, "attn_mask: shape [5, 4] does not broadcast"),
    (lambda: MHA(X, kv_lens=[5, 2**64]), ValueError, "kv_lens: kv_lens[1] = 18446744073709551616 is out of range"),
    (lambda: MHA(X, kv_lens=np.array([5, 5], np.float32)), TypeError, "kv_lens: dtype float32; expected integers"),
    (lambda: MHA(X, kv_lens=[5]), ValueError, "kv_lens: shape [1]; expected [2] (B)"),
    (lambda: MHA(X, is_causal="yes"), TypeError, "is_causal: got str 'yes'"),
    (lambda: MHA.forward_cached(X[:1, :, :], "cache"), TypeError, "cache: got builtins.str; expected an attn.KVCache"),
    (lambda: MHA.forward_cached(X[0], attn.KVCache(2, 8, 8)), ValueError,
     "x: rank 2 (shape [5, 32]); expected 3 ([1, T, d_model])"),
    (lambda: MHA.forward_cached(X, attn.KVCache(2, 8, 8)), ValueError, "x: batch 2; expected 1"),
    (lambda: MHA.forward_cached(X[:1], attn.KVCache(2, 4, 8)), ValueError, "cache: holds 2 heads of 4/4"),
    (lambda: MHA.set_weight("w_q", "abc"), TypeError, "w_q: dtype <U3; expected numbers"),
    (lambda: MHA.set_weight("w_q", [[1.0, 2.0], [3.0]]), ValueError, "w_q: a ragged nested list"),
    (lambda: MHA.set_weight(5, np.zeros((32, 32))), ValueError, "name: 5; expected one of w_q, w_k, w_v, w_o"),
    (lambda: MHA.get_weight(None), ValueError, "name: None; expected one of"),
    # the cost model
    (lambda: attn.attention_cost(None, 512, 8), TypeError, "seq: got NoneType None; expected an int"),
    (lambda: attn.attention_cost(128, 512, 8, causal="yes"), TypeError, "causal: got str 'yes'"),
    (lambda: attn.attention_cost(128, 512, 8, batch=0), ValueError, "batch: 0; expected a batch size >= 1"),
    (lambda: attn.parameter_count(512, 8, bias=None), TypeError, "bias: got NoneType None"),
    (lambda: attn.parameter_count(512, 2**64), ValueError, "heads: 18446744073709551616 is out of range"),
    (lambda: attn.parameter_count(2**40, 2**40), ValueError,
     "d_model: the layer has 4835703278458516698824704 parameters; expected at most 2**63 - 1 (an int64)"),
    (lambda: attn.MultiHeadAttention(2**40, 1), MemoryError,
     "d_model: the module would have 4835703278458516698824704 parameters, more than can be addressed"),
    (lambda: attn.kv_cache_bytes(1, 1, 1, 1, dtype=2), TypeError, "dtype: 2; expected 'f32', 'f16', 'bf16', 'fp8', 'int8' or 'int4'"),
    (lambda: attn.kv_cache_bytes(1, 1, 1, 1, dtype="f64"), ValueError, "dtype: 'f64'; expected 'f32'"),
    (lambda: attn.kv_cache_bytes("1", 1, 1, 1), TypeError, "layers: got str '1'; expected an int"),
])
def test_modules_bad_input(call, exc, message):
    with raises(exc, message):
        call()


def test_failed_cache_calls_leave_the_cache_as_it_was():
    cache = _cache()
    q = uniform(RNG, (1, 4, 1, 8))
    before = cache.attend(q)
    with raises(ValueError, "k: appending 12 tokens to a cache holding 5 of 16; expected at most 11"):
        cache.append(uniform(RNG, (1, 2, 12, 8)), uniform(RNG, (1, 2, 12, 8)))
    with raises(ValueError, "q: head dim 4"):
        cache.attend(q[..., :4])
    assert len(cache) == 5
    np.testing.assert_array_equal(cache.attend(q), before)


def test_cache_errors_never_name_attention_paged_arguments():
    # KVCache.attend and PagedKVCache.attend run attention_paged over the cache; its parameter names
    # (k_pages, v_pages, page_table, seq_lens) are not the caller's and must not appear.
    cache, sid = _paged_cache()
    calls = [lambda: _cache().attend(Q1[..., :7]), lambda: _cache().attend(Q1[:, :3]),
             lambda: cache.attend([sid], Q1[..., :5]), lambda: cache.attend([sid], Q1[:, :1]),
             lambda: cache.attend([sid, 99], np.concatenate([Q1, Q1]))]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        for name in ("k_pages", "v_pages", "page_table", "seq_lens"):
            assert name not in str(info.value), str(info.value)


# ---- MemoryError: StatusCode::out_of_memory ------------------------------------------------------------------

def test_caches_too_large_to_address_are_memory_errors():
    # The size overflows 64 bits: the library says out_of_memory without trying to allocate.
    with raises(MemoryError, "capacity: the cache would need "):
        attn.KVCache(2**31 - 1, 16384, 2**31 - 1)
    with raises(MemoryError, "num_pages: the pool's 2147483647 pages of 2147483647 x 2147483647 tokens are more than"):
        attn.PagedKVCache(2**31 - 1, 16384, 2**31 - 1, 2**31 - 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS as Linux applies it to malloc")
def test_a_failed_allocation_is_a_memory_error():
    # A real allocation failure: the address space of a child process is capped just above what it uses,
    # then a cache of 8 GiB is asked for. std::bad_alloc -> StatusCode::out_of_memory -> MemoryError.
    script = textwrap.dedent("""
        import resource, attn
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        cap = used + (256 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        try:
            attn.KVCache(1, 1024, 1 << 20)   # K and V: 4 GiB each
        except MemoryError as e:
            print("MemoryError:", e)
        else:
            print("no error")
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("MemoryError: capacity: could not allocate the cache's 8 GiB of keys and values; "
                                 "expected a cache that fits in memory"), run.stdout
