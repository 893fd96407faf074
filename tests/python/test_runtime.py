"""attn's process settings and introspection from Python: set_num_threads, set_isa, info() and
describe_attention(), and the binding's one Options object (attn._attn.Options)."""

import re
import zlib

import numpy as np
import pytest

import attn
from attn import _attn
from reference import check_attention, uniform

LEVELS = ("sse2", "avx2", "avx512", "avx512bf16", "amx")


def raises(exc, message):
    return pytest.raises(exc, match="^" + re.escape(message))


def qkv(name, b=2, hq=4, hkv=2, sq=7, skv=33, d=16):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return (uniform(rng, (b, hq, sq, d)), uniform(rng, (b, hkv, skv, d)), uniform(rng, (b, hkv, skv, d)))


@pytest.fixture
def restore_settings():
    """Every test that changes a process setting gives the defaults back, whatever happens."""
    yield
    attn.set_num_threads(0)
    attn.set_isa(None)


# ---- info() -------------------------------------------------------------------------------------------------------

def test_info_describes_the_machine_and_the_choices():
    i = attn.info()
    assert i["version"] == attn.__version__
    assert tuple(i["isa_levels"]) == LEVELS
    assert i["supported_isa"] and i["supported_isa"][0] == "sse2"  # every x86-64 CPU has the baseline
    assert set(i["supported_isa"]) <= set(LEVELS)
    assert i["best_isa"] == i["supported_isa"][-1]
    assert i["active_isa"] in i["supported_isa"]
    assert isinstance(i["threads"], int) and i["threads"] >= 1
    assert i["threads"] == attn.get_num_threads()
    assert isinstance(i["cpuid"], dict) and i["cpuid"]["sse2"] is True
    for key in ("vendor", "brand", "microarchitecture", "cpu"):
        assert isinstance(i[key], str)
    for key in ("family", "model", "stepping"):
        assert isinstance(i[key], int) and i[key] >= 0
    assert i["family"] > 0  # every x86-64 CPU reports its signature (CPUID leaf 1)
    for key in ("l1d_bytes", "l2_bytes", "l3_bytes", "xcr0"):
        assert isinstance(i[key], int) and i[key] >= 0
    for key in ("osxsave", "os_avx", "os_avx512", "os_amx", "amx_kernel_supports", "amx_permitted_before_request"):
        assert isinstance(i[key], bool)
    assert i["amx_request_ok"] in (None, True, False)


# ---- set_num_threads ----------------------------------------------------------------------------------------------

def test_set_num_threads_sets_the_default_of_later_calls(restore_settings):
    q, k, v = qkv("threads")
    default = attn.get_num_threads()
    expected = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    for n in (1, 3):
        attn.set_num_threads(n)
        assert attn.get_num_threads() == n and attn.info()["threads"] == n
        assert attn.describe_attention(q, k, v, enable_gqa=True)["threads"] == n
        # the thread count changes how the work is split, not the arithmetic of a row
        np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, k, v, enable_gqa=True), expected)
    attn.set_num_threads(0)
    assert attn.get_num_threads() == default
    attn.set_num_threads(2)
    attn.set_num_threads(None)
    assert attn.get_num_threads() == default


@pytest.mark.parametrize("n, exc, message", [
    (-1, ValueError, "n: -1 is not a thread count; expected 1..4096, or 0 for the default"),
    (4097, ValueError, "n: 4097 is not a thread count; expected 1..4096"),
    (2**40, ValueError, "n: 1099511627776 is out of range; expected 1..4096, or 0 for the default"),
    (2.0, TypeError, "n: got float 2.0; expected an int"),
    (True, TypeError, "n: got bool True; expected an int"),
])
def test_set_num_threads_refuses_bad_counts_and_changes_nothing(restore_settings, n, exc, message):
    attn.set_num_threads(3)
    with raises(exc, message):
        attn.set_num_threads(n)
    assert attn.get_num_threads() == 3


# ---- set_isa ------------------------------------------------------------------------------------------------------

def test_set_isa_lowers_the_level_and_results_stay_correct(restore_settings):
    q, k, v = qkv("isa")
    best = attn.info()["best_isa"]
    for level in attn.info()["supported_isa"]:
        attn.set_isa(level)
        assert attn.info()["active_isa"] == level
        if level != "amx":  # amx runs only bf16 prefill; a float32 call takes the vector kernel below it
            assert attn.describe_attention(q, k, v, enable_gqa=True)["isa"] == level
        out, lse = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True, return_lse=True)
        check_attention(out, lse, "float32", q=q, k=k, v=v, causal=True)
    attn.set_isa("")
    assert attn.info()["active_isa"] == best
    attn.set_isa(attn.info()["supported_isa"][0])
    attn.set_isa(None)
    assert attn.info()["active_isa"] == best


def test_set_isa_refuses_an_unknown_level_naming_it(restore_settings):
    attn.set_isa("sse2")
    with raises(ValueError, "level: 'avx3' is not a level; expected one of sse2, avx2, avx512, avx512bf16, amx"):
        attn.set_isa("avx3")
    with raises(TypeError, "level: got int 2; expected a level name (str) or None"):
        attn.set_isa(2)
    assert attn.info()["active_isa"] == "sse2"  # nothing changed


def test_set_isa_refuses_a_level_this_cpu_lacks(restore_settings):
    lacking = [level for level in LEVELS if level not in attn.info()["supported_isa"]]
    if not lacking:
        pytest.skip("this CPU and OS support every level")
    before = attn.info()["active_isa"]
    with raises(ValueError, f"level: '{lacking[0]}' is not supported by this CPU and OS; expected at most "
                            f"{attn.info()['best_isa']}"):
        attn.set_isa(lacking[0])
    assert attn.info()["active_isa"] == before


# ---- describe_attention -------------------------------------------------------------------------------------------

def test_describe_attention_says_what_would_run_and_writes_nothing():
    q, k, v = qkv("describe")
    d = attn.describe_attention(q, k, v, enable_gqa=True, is_causal=True)
    assert set(d) == {"backend", "isa", "kernel", "threads", "workspace_bytes"}
    assert d["backend"] == "flash" and d["kernel"] in ("vector", "vector (bf16 pairs)", "amx", "bf16 dot")
    assert d["isa"] == attn.info()["active_isa"] or d["isa"] in attn.info()["supported_isa"]
    assert d["threads"] == attn.get_num_threads()
    assert isinstance(d["workspace_bytes"], int) and d["workspace_bytes"] >= 0
    # unbatched inputs, and the variants a call can take, are described like the call
    assert attn.describe_attention(q[0], k[0], v[0], enable_gqa=True, return_lse=True)["backend"] == "flash"
    assert attn.describe_attention(q, k, v, enable_gqa=True, dropout_p=0.25, seed=7, softcap=30.0,
                                   window=(3, 0), kv_lens=[5, 33])["backend"] == "flash"


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"enable_gqa": False}, ValueError, "key: 2 heads but query has 4; expected the same number of heads"),
    ({"enable_gqa": True, "scale": -1.0}, ValueError, "scale: is -1; expected a finite value > 0"),
    ({"enable_gqa": True, "kv_lens": [1, 99]}, ValueError, "kv_lens: kv_lens[1] = 99"),
    ({"enable_gqa": True, "attn_mask": np.zeros((7, 5), np.float32)}, ValueError, "attn_mask: shape [7, 5] does not"),
    ({"enable_gqa": True, "window": 5}, TypeError, "window: 5"),
])
def test_describe_attention_refuses_what_the_call_refuses(kwargs, exc, message):
    q, k, v = qkv("describe-errors")
    with pytest.raises(exc) as call_error:
        attn.scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(exc) as describe_error:
        attn.describe_attention(q, k, v, **kwargs)
    assert str(describe_error.value) == str(call_error.value)
    assert str(call_error.value).startswith(message)


# ---- the binding's Options: one object for every entry point ------------------------------------------------------

def test_options_hold_every_field_with_the_library_defaults():
    o = _attn.Options()
    assert (o.mask, o.kv_lens, o.scale, o.alibi_slopes, o.sinks, o.k_scale, o.v_scale) == (None,) * 7
    assert (o.causal, o.window_left, o.window_right, o.window_align) == ("none", -1, -1, "top_left")
    assert (o.softcap, o.dropout_p, o.seed, o.bf16_bits, o.threads, o.backend) == (0.0, 0.0, 0, False, 0, "auto")
    o.scale, o.causal, o.threads, o.backend = 0.5, "top_left", 3, "reference"
    assert (o.scale, o.causal, o.threads, o.backend) == (0.5, "top_left", 3, "reference")
    o.scale = None
    assert o.scale is None


def test_options_threads_and_backend_reach_the_library():
    q, k, v = qkv("options")
    out = np.empty((2, 4, 7, 16), np.float32)
    d = _attn.describe_attention(q, k, v, out, None, _attn.Options(threads=5))
    assert d["backend"] == "flash" and d["threads"] == 5
    d = _attn.describe_attention(q, k, v, out, None, _attn.Options(backend="reference"))
    assert d == {"backend": "reference", "isa": "", "kernel": "reference", "threads": 1,
                 "workspace_bytes": d["workspace_bytes"]}
    lse = np.empty((2, 4, 7), np.float32)
    _attn.attention(q, k, v, out, lse, _attn.Options(backend="reference", causal="bottom_right"))
    check_attention(out, lse, "float32", q=q, k=k, v=v, causal=True, align="bottom_right")
    with raises(ValueError, "backend: 'fast'; expected 'auto', 'flash', 'reference' or 'cudnn'"):
        _attn.attention(q, k, v, out, None, _attn.Options(backend="fast"))
    with raises(TypeError, "backend: cudnn with tensors on the CPU; expected automatic, reference or flash"):
        _attn.attention(q, k, v, out, None, _attn.Options(backend="cudnn"))
