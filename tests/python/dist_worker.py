"""One rank of attn.dist's multi-process test (tests/python/test_dist.py starts it under mpirun or torchrun).

usage: python dist_worker.py mpi|torch

Every rank builds the same full Q, K, V from a seed, takes its slice (attn.dist.scatter_sequence), runs
attn.dist.ring_attention forward and backward through autograd, and the slices of the output and of the gradients
are gathered on every rank. Rank 0 judges them against the fp64 reference by the tolerance rule, with
single-process attn (attn.scaled_dot_product_attention and its autograd backward, same dtype) as the yardstick:
error(ring vs fp64) <= 2 x error(single-process vs fp64) + atol. Then a call where one rank's arguments are wrong
must raise the same error, naming that rank, on every rank. Exit status 0 when every case passed.
"""
import math
import os
import sys

import torch

import attn
import attn.dist as ad

ATOL = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 1e-4}


def setup(launcher):
    if launcher == "mpi":
        from mpi4py import MPI
        return MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    import torch.distributed as dist
    dist.init_process_group("gloo")
    return dist.group.WORLD, dist.get_rank(), dist.get_world_size()


def allgather(comm, launcher, obj):
    if launcher == "mpi":
        return comm.allgather(obj)
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def reference(q, k, v, causal, scale, dout):
    """fp64 out and grads (plain math: GQA by repeating heads)."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("bhid,bhjd->bhij", q, kk) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, skv, dtype=torch.bool).triu(1), -math.inf)
    out = torch.einsum("bhij,bhjd->bhid", s.softmax(-1), vv)
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


def single(q, k, v, causal, scale, dout):
    """Single-process attn, same dtype: the yardstick."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def run_case(comm, launcher, rank, world, case, fn=ad.ring_attention):
    B, Hq, Hkv, S, Dk, Dv, dtype, causal, layout = case
    g = torch.Generator().manual_seed(1000 + S + 7 * Hq + Dk)
    q, k, v = (torch.rand(B, h, S, d, generator=g).mul(2).sub(1).to(dtype)
               for h, d in ((Hq, Dk), (Hkv, Dk), (Hkv, Dv)))
    dout = torch.rand(B, Hq, S, Dv, generator=g).mul(2).sub(1).to(dtype)
    scale = 1 / math.sqrt(Dk)
    qs, ks, vs = (ad.scatter_sequence(x, layout, world, rank).requires_grad_() for x in (q, k, v))
    out = fn(qs, ks, vs, comm, causal=causal, layout=layout)
    out.backward(ad.scatter_sequence(dout, layout, world, rank))
    every = allgather(comm, launcher, [x.detach() for x in (out, qs.grad, ks.grad, vs.grad)])
    ring = [ad.gather_sequence([e[i] for e in every], layout) for i in range(4)]
    if rank != 0:
        return []
    ref = reference(q, k, v, causal, scale, dout)
    yard = single(q, k, v, causal, scale, dout)
    bad = []
    for name, r, f, y in zip(("out", "dq", "dk", "dv"), ring, ref, yard):
        if r.dtype != dtype or tuple(r.shape) != tuple(f.shape):
            bad.append(f"{name}: {r.dtype} {tuple(r.shape)}; expected {dtype} {tuple(f.shape)}")
            continue
        e, bound = err(r, f), 2 * err(y, f) + ATOL[dtype]
        if not math.isfinite(e) or e > bound:
            bad.append(f"{name}: error {e:.3g} > bound {bound:.3g}")
    print(f"rank 0 of {world} ({launcher}), {fn.__name__}: {case}: {'FAILED ' + '; '.join(bad) if bad else 'ok'}",
          flush=True)
    return bad


def check_disagreement(comm, rank, world):
    """Rank 1 passes a different head dimension, a bad thread count, or inputs that require grad where the others'
    do not: every rank raises a ValueError naming rank 1 (none waits forever for it)."""
    bad = []
    for what in ("head dim", "threads", "autograd"):
        q = torch.rand(1, 2, 8, 16)
        k = torch.rand(1, 2, 8, 24 if rank == 1 and what == "head dim" else 16)
        if what == "autograd" and rank == 1:
            q.requires_grad_()
        try:
            ad.ring_attention(q, k, k, comm, layout="contiguous", threads=-1 if rank == 1 and what == "threads" else 0)
            bad.append(f"disagreement ({what}): rank {rank} raised nothing")
        except ValueError as e:
            if "rank 1" not in str(e):
                bad.append(f"disagreement ({what}): rank {rank} raised {e!r}; expected it to name rank 1")
    return bad


def main():
    launcher = sys.argv[1]
    comm, rank, world = setup(launcher)
    torch.set_num_threads(1)
    attn.set_num_threads(1)
    cases = [
        # B, Hq, Hkv, S, Dk, Dv, dtype, causal, layout
        (1, 4, 2, 37, 16, 16, torch.float32, True, "zigzag"),
        (2, 2, 2, 29, 24, 16, torch.float32, False, "zigzag"),
        (1, 4, 1, 41, 32, 32, torch.float32, True, "contiguous"),
        (1, 4, 2, 44, 32, 32, torch.bfloat16, True, "zigzag"),
        (1, 2, 2, 23, 16, 24, torch.bfloat16, False, "contiguous"),
        (1, 12, 12, 31, 16, 16, torch.float32, True, "zigzag"),
        (2, 12, 4, 36, 16, 24, torch.bfloat16, True, "contiguous"),
    ]
    bad = []
    for case in cases:
        bad += run_case(comm, launcher, rank, world, case)
        Hq, Hkv, S, layout = case[1], case[2], case[3], case[8]
        even = layout == "zigzag" or S % world == 0
        if Hq % world == 0 and (Hkv % world == 0 or world % Hkv == 0) and even:
            bad += run_case(comm, launcher, rank, world, case, ad.ulysses_attention)
    if world == 3:  # 4 query heads over 3 ranks: refused on every rank, naming q
        try:
            ad.ulysses_attention(*(torch.rand(1, 4, 4, 8) for _ in range(3)), comm)
            bad.append(f"ulysses: rank {rank} accepted 4 heads over 3 ranks")
        except ValueError as e:
            if not str(e).startswith("q:"):
                bad.append(f"ulysses: rank {rank} raised {e!r}; expected it to name q")
    if world > 1:
        bad += check_disagreement(comm, rank, world)
    every = allgather(comm, launcher, bad)
    failures = [f for fs in every for f in fs]
    if rank == 0:
        print("\n".join(failures) if failures else f"all cases passed on {world} ranks ({launcher})", flush=True)
    if launcher == "torch":
        import torch.distributed as dist
        dist.barrier()  # every rank done with its messages before any tears its process group down
        dist.destroy_process_group()
        # Past this point every case has been judged. Under torch 2.15 about one torchrun run in ten still aborted
        # after main() returned ("terminate called without an active exception" with no Python frame left: a
        # static object of torch's joined no thread during the interpreter's exit, after destroy_process_group),
        # so the worker leaves without the exit-time destructors, its output flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failures else 0)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
