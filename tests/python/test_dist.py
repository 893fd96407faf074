"""attn.dist: ring attention from Python across processes, under both launchers (mpirun with mpi4py, torchrun with a
gloo process group) at 2, 3 and 4 ranks (oversubscribed on small machines), forward and backward against single-
process attention by the tolerance rule (tests/python/dist_worker.py); and the layout helpers in one process."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attn.dist as ad

WORKER = Path(__file__).with_name("dist_worker.py")


def _have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def _run(cmd, env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", ATTN_NUM_THREADS="1", **env_extra)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}\n{p.stdout}\n{p.stderr[-4000:]}"
    assert "all cases passed" in p.stdout, p.stdout


@pytest.mark.skipif(not (_have("torch") and _have("mpi4py") and shutil.which("mpirun")),
                    reason="needs torch, mpi4py and mpirun")
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ring_under_mpirun(ranks):
    _run(["mpirun", "-np", str(ranks), sys.executable, str(WORKER), "mpi"],
         {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
          "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})


@pytest.mark.skipif(not _have("torch"), reason="needs torch")
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ring_under_torchrun(ranks):
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(WORKER),
          "torch"], {})


@pytest.mark.skipif(not _have("torch"), reason="needs torch")
def test_one_process_group_equals_single_process():
    """A ring of one (a gloo group of one process): the plain attention, forward and backward."""
    import torch
    import torch.distributed as dist
    import attn
    if dist.is_initialized():
        pytest.skip("a process group exists already")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.rand(1, h, 21, 16, generator=g).requires_grad_() for h in (4, 2, 2))
        out = ad.ring_attention(q, k, v, dist.group.WORLD, causal=True)
        out.backward(torch.ones_like(out))
        ref_in = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        ref = attn.scaled_dot_product_attention(*ref_in, is_causal=True, enable_gqa=True)
        ref.backward(torch.ones_like(ref))
        for a, b in zip((out, q.grad, k.grad, v.grad), (ref, *(x.grad for x in ref_in))):
            assert (a - b).abs().max().item() <= 1e-5
        outu = ad.ulysses_attention(*(x.detach() for x in (q, k, v)), dist.group.WORLD, causal=True)
        assert (outu - ref).abs().max().item() <= 1e-5
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("total,ranks", [(0, 1), (1, 3), (7, 2), (113, 4), (203, 3)])
def test_layout_round_trip(layout, total, ranks):
    full = np.arange(2 * total * 3, dtype=np.float32).reshape(2, total, 3)
    slices = [ad.scatter_sequence(full, layout, ranks, r) for r in range(ranks)]
    covered = sorted(s + i for r in range(ranks) for s, n in ad.slice_segments(layout, total, ranks, r)
                     for i in range(n))
    assert covered == list(range(total))
    assert np.array_equal(ad.gather_sequence(slices, layout), full)


def test_zigzag_balances_a_causal_mask():
    # rank r holds chunks r and 2P-1-r: the causal pairs each rank's queries see are the same for every rank
    work = [sum(s + i + 1 for s, n in ad.slice_segments("zigzag", 64, 4, r) for i in range(n)) for r in range(4)]
    assert len(set(work)) == 1


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="layout"):
        ad.slice_segments("striped", 8, 2, 0)
    with pytest.raises(ValueError, match="rank"):
        ad.slice_segments("zigzag", 8, 2, 2)
    with pytest.raises(ValueError, match="slices\\[0\\]"):
        ad.gather_sequence([np.zeros((3, 2)), np.zeros((1, 2))], "contiguous")
    with pytest.raises(TypeError, match="comm"):
        ad._comm(object())
