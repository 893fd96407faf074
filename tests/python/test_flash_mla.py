"""attn.flash.flash_mla_with_kvcache (FlashMLA's API): multi-head latent attention over a paged latent cache, V
the first head_dim_v columns of the cached rows, many query heads on one latent head. Against an fp64 reference
over each sequence's rows gathered from its pages; decode and multi-token decode (causal), bf16 and fp32."""
import math

import pytest

from attn.flash import flash_mla_with_kvcache, get_mla_metadata

torch = pytest.importorskip("torch", reason="torch is not installed; the FlashMLA API tests need it")


def reference(q, k_cache, block_table, lens, dv, scale, causal):
    b, sq, hq, d = q.shape
    page = k_cache.shape[1]
    out = torch.zeros(b, sq, hq, dv, dtype=torch.float64)
    lse = torch.full((b, hq, sq), math.inf, dtype=torch.float64)
    for s in range(b):
        n = int(lens[s])
        rows = torch.stack([k_cache[int(block_table[s, j // page]), j % page, 0] for j in range(n)]).double()
        scores = torch.einsum("qhd,kd->hqk", q[s].double(), rows) * scale
        if causal:
            i = torch.arange(sq)[:, None]
            j = torch.arange(n)[None, :]
            scores = scores.masked_fill(j > i + n - sq, -math.inf)
        lse[s] = torch.logsumexp(scores, dim=-1)
        out[s] = torch.einsum("hqk,kd->qhd", torch.softmax(scores, dim=-1), rows[:, :dv])
    return out, lse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sq,causal", [(1, False), (1, True), (3, True)])
def test_flash_mla_matches_fp64_over_the_gathered_latent_rows(dtype, sq, causal):
    g = torch.Generator().manual_seed(5)
    b, hq, d, dv, page = 3, 16, 72, 64, 16
    lens = torch.tensor([37, 5, 64], dtype=torch.int32)
    blocks = 4
    pool = b * blocks + 2
    k_cache = (torch.rand(pool, page, 1, d, generator=g) * 2 - 1).to(dtype)
    block_table = torch.randperm(pool, generator=g)[: b * blocks].reshape(b, blocks).to(torch.int32)
    q = (torch.rand(b, sq, hq, d, generator=g) * 2 - 1).to(dtype)
    meta, splits = get_mla_metadata(lens, sq * hq, 1)
    scale = 192 ** -0.5
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, lens, dv, meta, splits, softmax_scale=scale,
                                      causal=causal)
    assert out.shape == (b, sq, hq, dv) and out.dtype == dtype and lse.shape == (b, hq, sq)
    ref, ref_lse = reference(q, k_cache, block_table, lens, dv, scale, causal)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert (out.double() - ref).abs().max().item() <= tol * max(ref.abs().max().item(), 1)
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-4


def test_flash_mla_refuses_a_bad_head_dim_v():
    q = torch.zeros(1, 1, 4, 16)
    k_cache = torch.zeros(2, 8, 1, 16)
    table = torch.zeros(1, 2, dtype=torch.int32)
    lens = torch.tensor([3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^head_dim_v: 17; expected 1 <= head_dim_v <= head_dim \(16\)"):
        flash_mla_with_kvcache(q, k_cache, table, lens, 17)


def test_flash_mla_names_its_own_parameters():
    """The block table, the lengths and the cache are refused under flash_mla_with_kvcache's names (not those of the
    attention_paged call it makes)."""
    gen = torch.Generator().manual_seed(3)
    q, k_cache = torch.randn(2, 1, 4, 72, generator=gen), torch.randn(6, 8, 1, 72, generator=gen)
    table, lens = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32), torch.tensor([10, 20], dtype=torch.int32)
    bad = [
        (ValueError, "^cache_seqlens: 30 for batch 1", dict(cache_seqlens=torch.tensor([10, 30], dtype=torch.int32))),
        (ValueError, "^cache_seqlens: 1 lengths", dict(cache_seqlens=lens[:1])),
        (TypeError, "^cache_seqlens: ", dict(cache_seqlens=lens.float())),
        (TypeError, "^block_table: ", dict(block_table=table.float())),
        (ValueError, "^block_table: page 9 in row 1", dict(block_table=torch.tensor([[0, 1, 2], [3, 4, 9]],
                                                                                     dtype=torch.int32))),
        (ValueError, "^block_table: 1 rows", dict(block_table=table[:1])),
        (TypeError, "^k_cache: torch.int8", dict(k_cache=k_cache.to(torch.int8))),
    ]
    for error, match, change in bad:
        args = {**dict(q=q, k_cache=k_cache, block_table=table, cache_seqlens=lens, head_dim_v=64), **change}
        with pytest.raises(error, match=match):
            flash_mla_with_kvcache(**args)


def test_flash_mla_takes_flashmla_current_signature():
    """FlashMLA's current interface: get_mla_metadata() without arguments (its older three-argument form too), and
    the sparse/FP8 parameters accepted at their defaults (the same bits as leaving them out), refused by name when
    set; from the package's top level as from attn.flash."""
    import attn
    assert attn.flash_mla_with_kvcache is flash_mla_with_kvcache and attn.get_mla_metadata is get_mla_metadata
    assert get_mla_metadata() == (None, None)
    gen = torch.Generator().manual_seed(4)
    q, k_cache = torch.randn(2, 2, 8, 40, generator=gen), torch.randn(6, 8, 1, 40, generator=gen)
    table, lens = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32), torch.tensor([10, 20], dtype=torch.int32)
    meta, splits = get_mla_metadata()
    out, lse = flash_mla_with_kvcache(q, k_cache, table, lens, 32, meta, splits, causal=True)
    defaults = dict(is_fp8_kvcache=False, indices=None, attn_sink=None, extra_k_cache=None,
                    extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None)
    out2, lse2 = flash_mla_with_kvcache(q, k_cache, table, lens, 32, meta, splits, causal=True, **defaults)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    for name in defaults:
        value = True if name == "is_fp8_kvcache" else torch.zeros(2, dtype=torch.int32)
        with pytest.raises(NotImplementedError, match=f"^{name}: "):
            flash_mla_with_kvcache(q, k_cache, table, lens, 32, meta, splits, **{name: value})


def test_flash_mla_marks_shapes_in_errors_as_attns_order():
    """A shape in an error is attn's [batch, heads, seq, dim] order, the transpose of the caller's: the message says
    so."""
    q, k_cache = torch.randn(3, 4, 16, 40), torch.randn(6, 8, 1, 40)
    table, lens = torch.zeros(3, 2, dtype=torch.int32), torch.tensor([3, 3, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\[3, 0, 4, 40\].*shapes in attn's \[batch, nheads, seqlen, headdim\] order"):
        flash_mla_with_kvcache(q[:, :, :0], k_cache, table, lens, 32)
