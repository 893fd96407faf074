"""attn.dist: attention across processes from Python: ring (context-parallel) attention over an mpi4py communicator
or a torch.distributed process group (gloo on the CPU), forward and backward (autograd), and the sequence-layout
helpers.

    import attn.dist
    q_r, k_r, v_r = (attn.dist.scatter_sequence(x, "zigzag", world, rank) for x in (q, k, v))
    out_r = attn.dist.ring_attention(q_r, k_r, v_r, comm=group_or_mpi_comm, causal=True, layout="zigzag")
    out_r.backward(grad_r)                  # q_r.grad, k_r.grad, v_r.grad: this rank's slices of the gradients

The sequence is split over the P ranks: each holds a slice of Q, K and V ([B, H, S_r, D], torch tensors on the CPU)
and gets its slice of the output. The K/V slices travel around the ring (rank r sends to r + 1 and receives from
r - 1, non-blocking, while the current block computes); each rank attends its queries to every block and merges the
partial results with the one log-sum-exp merge (attn.merge_attention's formula, in fp32). The backward keeps dQ on
its rank, and each K/V block's dK/dV accumulators (fp32) travel with it and return home after a full turn: the sums
run in a fixed order, so the gradients are bitwise deterministic for a given number of ranks. The same algorithm as
the C++ attn::dist::ring_attention (attn/dist.h), written here over Python communicators so that it runs under
mpirun and torchrun alike; the local blocks run in attn's kernels (fp32 accumulation: bf16/f16 slices are widened
once per block, and the output and gradients rounded once at the end).

Every rank must call with the same B, heads, head dims, dtype and options, and record autograd (inputs that require
grad, grad mode on) on every rank or on none. Before any compute the ranks agree on all of it (one allgather): a
rank whose arguments are invalid (threads included), or disagree with the others', makes every rank raise the same
error, naming the rank and the parameter; nothing hangs. (Only a `comm` that is no communicator fails on its rank
alone: there is nothing to agree through.)
"""

import numpy as np

from . import _attn

LAYOUTS = ("contiguous", "zigzag")
_TAG_KV, _TAG_GRAD, _TAG_A2A = 7301, 7302, 7303


def _torch():
    import torch
    return torch


# ---- layouts -------------------------------------------------------------------------------------------------------


def _layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r}; expected 'contiguous' or 'zigzag'")
    return layout


def slice_segments(layout, total, ranks, rank):
    """The runs of consecutive global positions [(start, length), ...] that rank `rank` of `ranks` holds of a
    sequence of `total` positions, in its local order. contiguous: the even split, the first total % ranks ranks one
    longer. zigzag: the sequence cut into 2·ranks chunks as even as possible (the first total % (2·ranks) one
    longer), rank r holding chunk r and then chunk 2·ranks - 1 - r (with a causal mask every rank then does the same
    work). The same rule as attn::dist::slice_segments."""
    _layout(layout)
    for name, x, low in (("total", total, 0), ("ranks", ranks, 1)):
        if not isinstance(x, (int, np.integer)) or isinstance(x, bool) or x < low:
            raise ValueError(f"{name}: {x!r}; expected an int >= {low}")
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or not 0 <= rank < ranks:
        raise ValueError(f"rank: {rank!r}; expected an int in [0, {ranks})")
    total, ranks, rank = int(total), int(ranks), int(rank)
    if layout == "contiguous":
        base, extra = divmod(total, ranks)
        return [(rank * base + min(rank, extra), base + (rank < extra))]
    base, extra = divmod(total, 2 * ranks)

    def chunk(c):
        return (c * base + min(c, extra), base + (c < extra))

    return [chunk(rank), chunk(2 * ranks - 1 - rank)]


def _seq_dim(name, x):
    if x.ndim < 2:
        raise ValueError(f"{name}: rank {x.ndim}; expected [..., S, D] (the sequence the second-to-last dimension)")
    return x.ndim - 2


def scatter_sequence(full, layout, ranks, rank):
    """Rank `rank`'s slice of `full` ([..., S, D]: a torch tensor or NumPy array, the sequence in the second-to-last
    dimension) under `layout`: its segments (slice_segments) concatenated in order. A copy; local (no messages):
    every rank can call it on the full tensor it has, or a root per rank."""
    dim = _seq_dim("full", full)
    parts = [full[..., s:s + n, :] for s, n in slice_segments(layout, full.shape[dim], ranks, rank)]
    if isinstance(full, np.ndarray):
        return np.concatenate(parts, axis=dim)
    return _torch().cat(parts, dim=dim)


def gather_sequence(slices, layout):
    """The whole sequence from every rank's slice (a list in rank order, as an allgather returns them; torch tensors
    or NumPy arrays, [..., S_r, D]): the inverse of scatter_sequence. The slices' lengths must be the layout's for
    their total."""
    _layout(layout)
    if not slices:
        raise ValueError("slices: empty; expected one slice per rank, in rank order")
    ranks, dim = len(slices), _seq_dim("slices[0]", slices[0])
    total = sum(int(x.shape[dim]) for x in slices)
    pieces = []  # (global start, tensor)
    for r, x in enumerate(slices):
        segs = slice_segments(layout, total, ranks, r)
        if int(x.shape[dim]) != sum(n for _, n in segs):
            raise ValueError(f"slices[{r}]: {x.shape[dim]} positions; expected {sum(n for _, n in segs)} (the "
                             f"{layout} layout of {total} positions over {ranks} ranks)")
        off = 0
        for s, n in segs:
            pieces.append((s, x[..., off:off + n, :]))
            off += n
    pieces.sort(key=lambda p: p[0])
    if isinstance(slices[0], np.ndarray):
        return np.concatenate([p for _, p in pieces], axis=dim)
    return _torch().cat([p for _, p in pieces], dim=dim)


# ---- communicators -------------------------------------------------------------------------------------------------


class _MpiComm:
    """An mpi4py communicator: byte buffers through Isend/Irecv, agreement through allgather."""

    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def exchange(self, send, recv, tag, shift=1):
        """Starts sending `send` to rank r + shift and receiving `recv` from rank r - shift (uint8 tensors)."""
        nxt, prv = (self.rank + shift) % self.size, (self.rank - shift) % self.size
        return [self.comm.Irecv(recv.numpy(), source=prv, tag=tag), self.comm.Isend(send.numpy(), dest=nxt, tag=tag)]

    def wait(self, reqs):
        from mpi4py import MPI
        MPI.Request.Waitall(reqs)


class _TorchComm:
    """A torch.distributed process group: byte tensors through isend/irecv, agreement through all_gather_object."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.peers = [dist.get_global_rank(group, r) for r in range(self.size)]

    def allgather(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def exchange(self, send, recv, tag, shift=1):
        d = self.dist
        nxt, prv = self.peers[(self.rank + shift) % self.size], self.peers[(self.rank - shift) % self.size]
        return d.batch_isend_irecv([d.P2POp(d.irecv, recv, prv, self.group, tag),
                                    d.P2POp(d.isend, send, nxt, self.group, tag)])

    def wait(self, reqs):
        for r in reqs:
            r.wait()


def _comm(comm):
    """The wrapper for `comm`: an mpi4py communicator, a torch.distributed ProcessGroup, or None (torch.distributed's
    default group when it is initialised, else mpi4py's COMM_WORLD)."""
    if comm is None:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return _TorchComm(dist.group.WORLD)
        except ImportError:
            pass
        try:
            from mpi4py import MPI
        except ImportError:
            raise ValueError("comm: None, and neither torch.distributed is initialised nor mpi4py importable; "
                             "expected an mpi4py communicator or a torch.distributed process group") from None
        return _MpiComm(MPI.COMM_WORLD)
    if type(comm).__module__.startswith("mpi4py"):
        return _MpiComm(comm)
    try:
        import torch.distributed as dist
        if isinstance(comm, dist.ProcessGroup):
            return _TorchComm(comm)
    except ImportError:
        pass
    raise TypeError(f"comm: {type(comm).__module__}.{type(comm).__name__}; expected an mpi4py communicator or a "
                    "torch.distributed ProcessGroup (None: the default one)")


# ---- the plan every rank agrees on ---------------------------------------------------------------------------------


class _Plan:
    """What every rank knows after the agreement: shapes, options, and every rank's segments."""

    def __init__(self, comm, q, k, v, causal, scale, layout, threads):
        torch = _torch()
        desc, error = {}, None
        try:
            _layout(layout)
            if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
                raise ValueError(f"threads: {threads!r}; expected an int >= 0")
            for name, x in (("q", q), ("k", k), ("v", v)):
                if not isinstance(x, torch.Tensor):
                    raise TypeError(f"{name}: {type(x).__name__}; expected a torch tensor")
                if x.device.type != "cpu":
                    raise ValueError(f"{name}: on {x.device}; expected a CPU tensor (attn.dist runs on the CPU)")
                if x.ndim != 4:
                    raise ValueError(f"{name}: rank {x.ndim}; expected 4 ([B, H, S_r, D])")
                if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise TypeError(f"{name}: dtype {x.dtype}; expected float32, bfloat16 or float16")
            if k.dtype != q.dtype or v.dtype != q.dtype:
                raise TypeError(f"k, v: dtypes {k.dtype}, {v.dtype}; expected q's ({q.dtype})")
            if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
                raise ValueError(f"k, v: shapes {tuple(k.shape)}, {tuple(v.shape)}; expected [B, Hkv, S_r, Dk] and "
                                 f"[B, Hkv, S_r, Dv] with q's B and Dk (q {tuple(q.shape)})")
            if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
                raise ValueError(f"k: {k.shape[1]} heads; expected a divisor of q's {q.shape[1]} (GQA)")
            if causal and q.shape[2] != k.shape[2]:
                raise ValueError(f"q: {q.shape[2]} positions and k {k.shape[2]}; causal ring attention needs "
                                 "self-attention slices (the same positions)")
            if scale is not None and not (isinstance(scale, (int, float)) and np.isfinite(scale) and scale > 0):
                raise ValueError(f"scale: {scale!r}; expected a finite float > 0 or None")
            # grad: whether this call records autograd (every rank must: the ring backward is collective)
            grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
            desc = dict(B=int(q.shape[0]), Hq=int(q.shape[1]), Hkv=int(k.shape[1]), Dk=int(q.shape[3]),
                        Dv=int(v.shape[3]), dtype=str(q.dtype), causal=bool(causal), layout=layout,
                        scale=None if scale is None else float(scale), autograd=grad)
        except (TypeError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"
        mine = dict(desc=desc, sq=int(q.shape[2]) if error is None else 0, skv=int(k.shape[2]) if error is None else 0,
                    error=error)
        every = comm.allgather(mine)
        for r, a in enumerate(every):
            if a["error"]:
                kind, _, msg = a["error"].partition(": ")
                raise (TypeError if kind == "TypeError" else ValueError)(f"rank {r}: {msg}")
        for r, a in enumerate(every):
            for key, value in every[0]["desc"].items():
                if a["desc"][key] != value:
                    raise ValueError(f"rank {r}: {key} = {a['desc'][key]!r}; rank 0 has {value!r} (every rank must "
                                     "call with the same shapes and options)")
        self.__dict__.update(every[0]["desc"])
        self.threads = threads
        self.ranks, self.rank = comm.size, comm.rank
        sq, skv = [a["sq"] for a in every], [a["skv"] for a in every]
        self.sq, self.skv, self.total_q, self.total_kv = sq, skv, sum(sq), sum(skv)
        if layout == "zigzag":
            for name, lens, total in (("q", sq, self.total_q), ("k", skv, self.total_kv)):
                want = [sum(m for _, m in slice_segments(layout, total, self.ranks, r)) for r in range(self.ranks)]
                if lens != want:  # (the total is the ranks' sum, so no one rank is the wrong one: all are named)
                    raise ValueError(f"{name}: the ranks hold {lens} positions; the zigzag layout of their {total} over "
                                     f"{self.ranks} ranks gives {want} (attn.dist.scatter_sequence makes the slices)")
            self.qsegs = [slice_segments(layout, self.total_q, self.ranks, r) for r in range(self.ranks)]
            self.ksegs = [slice_segments(layout, self.total_kv, self.ranks, r) for r in range(self.ranks)]
        else:  # contiguous: slices in rank order, any lengths
            self.qsegs = [[(sum(sq[:r]), sq[r])] for r in range(self.ranks)]
            self.ksegs = [[(sum(skv[:r]), skv[r])] for r in range(self.ranks)]

    def pairs(self, blk):
        """The (query rows, key rows, window right side or None) of this rank's queries against block blk: each
        query segment against each key segment, under the global causal rule j <= i (a top-left window whose right
        side is delta = q_start - k_start; rows with no key left get out = 0 and lse = -inf)."""
        out, qoff = [], 0
        for qs, qn in self.qsegs[self.rank]:
            koff = 0
            for ks, kn in self.ksegs[blk]:
                if qn and kn:
                    delta = qs - ks
                    if not self.causal or delta >= kn - 1:
                        out.append((slice(qoff, qoff + qn), slice(koff, koff + kn), None))
                    elif delta + qn - 1 >= 0:
                        out.append((slice(qoff, qoff + qn), slice(koff, koff + kn), delta))
                koff += kn
            qoff += qn
        return out

    def options(self, right, from_forward=False):
        """The binding's Options of one (query segment, key segment) call, made where every call's are
        (attn.functional._options): the window's right side, this rank's threads, the backward's statistics."""
        from .functional import _options
        o = _options(scale=self.scale, window_right=-1 if right is None else right)
        o.threads = self.threads
        if from_forward:
            o.backward_statistics = "from_forward"
        return o


def _bytes(x):
    return x.contiguous().reshape(-1).view(_torch().uint8)


def _kv_bytes(plan, blk, dtype):
    torch = _torch()
    es = torch.empty((), dtype=dtype).element_size()
    return plan.B * plan.Hkv * plan.skv[blk] * (plan.Dk + plan.Dv) * es


def _unpack_kv(plan, blk, buf, dtype):
    n = plan.skv[blk]
    nk = plan.B * plan.Hkv * n * plan.Dk
    flat = buf.view(dtype)
    return (flat[:nk].view(plan.B, plan.Hkv, n, plan.Dk), flat[nk:].view(plan.B, plan.Hkv, n, plan.Dv))


# ---- forward and backward ------------------------------------------------------------------------------------------


def _ring_forward(plan, comm, q, k, v):
    """(out fp32, lse fp32) of this rank's queries over every block."""
    torch = _torch()
    f32 = torch.float32
    q32 = q.to(f32).contiguous()
    out = torch.zeros(plan.B, plan.Hq, plan.sq[plan.rank], plan.Dv, dtype=f32)
    lse = torch.full((plan.B, plan.Hq, plan.sq[plan.rank]), -float("inf"), dtype=f32)
    cur = torch.cat([_bytes(k), _bytes(v)])
    for s in range(plan.ranks):
        blk = (plan.rank - s) % plan.ranks
        reqs, nxt = None, None
        if s + 1 < plan.ranks:
            nxt = torch.empty(_kv_bytes(plan, (blk - 1) % plan.ranks, q.dtype), dtype=torch.uint8)
            reqs = comm.exchange(cur, nxt, _TAG_KV)
        kb, vb = _unpack_kv(plan, blk, cur, q.dtype)
        kb, vb = kb.to(f32), vb.to(f32)
        for rows, keys, right in plan.pairs(blk):
            po = torch.empty(plan.B, plan.Hq, rows.stop - rows.start, plan.Dv, dtype=f32)
            pl = torch.empty(plan.B, plan.Hq, rows.stop - rows.start, dtype=f32)
            _attn.attention(q32[:, :, rows], kb[:, :, keys], vb[:, :, keys], po, pl, plan.options(right))
            mo, ml = torch.empty_like(po), torch.empty_like(pl)
            _attn.merge_attention(out[:, :, rows], lse[:, :, rows], po, pl, mo, ml)
            out[:, :, rows], lse[:, :, rows] = mo, ml
        if reqs is not None:
            comm.wait(reqs)
            cur = nxt
    return out, lse


def _ring_backward(plan, comm, q, k, v, out32, lse, dout):
    """(dq, dk, dv) of this rank's slices: dQ here, each block's dK/dV travelling with it and coming home."""
    torch = _torch()
    f32 = torch.float32
    q32, do32 = q.to(f32).contiguous(), dout.to(f32).contiguous()
    dq = torch.zeros_like(q32)
    kv = torch.cat([_bytes(k), _bytes(v)])
    grads = torch.zeros(plan.B * plan.Hkv * plan.skv[plan.rank] * (plan.Dk + plan.Dv), dtype=f32)
    for s in range(plan.ranks):
        blk = (plan.rank - s) % plan.ranks
        prev_blk = (blk - 1) % plan.ranks
        reqs, kv_next = None, None
        if s + 1 < plan.ranks:
            kv_next = torch.empty(_kv_bytes(plan, prev_blk, q.dtype), dtype=torch.uint8)
            reqs = comm.exchange(kv, kv_next, _TAG_KV)
        kb, vb = _unpack_kv(plan, blk, kv, q.dtype)
        kb, vb = kb.to(f32), vb.to(f32)
        n = plan.skv[blk]
        dk = grads[:plan.B * plan.Hkv * n * plan.Dk].view(plan.B, plan.Hkv, n, plan.Dk)
        dv = grads[plan.B * plan.Hkv * n * plan.Dk:].view(plan.B, plan.Hkv, n, plan.Dv)
        for rows, keys, right in plan.pairs(blk):
            qr, kr, vr = q32[:, :, rows], kb[:, :, keys], vb[:, :, keys]
            gq, gk, gv = (torch.empty(x.shape, dtype=f32) for x in (qr, kr, vr))
            _attn.attention_backward(qr, kr, vr, out32[:, :, rows], lse[:, :, rows], do32[:, :, rows], gq, gk, gv,
                                     None, plan.options(right, from_forward=True))
            dq[:, :, rows] += gq
            dk[:, :, keys] += gk
            dv[:, :, keys] += gv
        # the block's accumulators move on with it (after the last step: home, one hop on; one rank: home already)
        if plan.ranks > 1:
            grads_next = torch.empty(plan.B * plan.Hkv * plan.skv[prev_blk] * (plan.Dk + plan.Dv), dtype=f32)
            comm.wait(comm.exchange(grads.view(torch.uint8), grads_next.view(torch.uint8), _TAG_GRAD))
            grads = grads_next
        if reqs is not None:
            comm.wait(reqs)
            kv = kv_next
    n = plan.skv[plan.rank]
    dk = grads[:plan.B * plan.Hkv * n * plan.Dk].view(plan.B, plan.Hkv, n, plan.Dk)
    dv = grads[plan.B * plan.Hkv * n * plan.Dk:].view(plan.B, plan.Hkv, n, plan.Dv)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _function():
    torch = _torch()
    global _RingFunction
    if "_RingFunction" in globals():
        return _RingFunction

    class _RingFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, plan, comm):
            out32, lse = _ring_forward(plan, comm, q, k, v)
            ctx.plan, ctx.comm = plan, comm
            ctx.save_for_backward(q, k, v, out32, lse)
            ctx.mark_non_differentiable(lse)
            return out32.to(q.dtype), lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out32, lse = ctx.saved_tensors
            dq, dk, dv = _ring_backward(ctx.plan, ctx.comm, q, k, v, out32, lse, dout)
            return dq, dk, dv, None, None

    globals()["_RingFunction"] = _RingFunction
    return _RingFunction


def ring_attention(q, k, v, comm=None, *, causal=False, scale=None, layout="zigzag", return_lse=False, threads=0):
    """Ring attention: this rank's rows of softmax(scale · Q Kᵀ) V over the whole sequence's keys.

    q [B, Hq, S_r, Dk], k [B, Hkv, S_r', Dk], v [B, Hkv, S_r', Dv]: this rank's slices (torch CPU tensors, float32,
    bfloat16 or float16, one dtype; GQA when Hkv divides Hq), laid out over the ranks as `layout` says: 'zigzag'
    (the default; the slices attn.dist.scatter_sequence makes) or 'contiguous' (slices in rank order, any lengths).
    comm: an mpi4py communicator or a torch.distributed process group (None: torch.distributed's default group when
    it is initialised, else mpi4py's COMM_WORLD). causal: key j allowed for query i when j <= i over global
    positions (needs self-attention slices: q and k of the same positions). scale: default 1/sqrt(Dk). threads: per
    rank for the local kernels (0: attn's default).

    Returns out [B, Hq, S_r, Dv] in q's dtype (and with return_lse=True also lse float32 [B, Hq, S_r]). When q, k or
    v requires grad, the result carries autograd: its backward runs the ring backward (the gradients of this rank's
    slices). Every rank must call it, with the same shapes apart from the sequence and the same options.
    """
    c = _comm(comm)
    plan = _Plan(c, q, k, v, causal, scale, layout, threads)
    if plan.autograd:
        out, lse = _function().apply(q, k, v, plan, c)
    else:
        out32, lse = _ring_forward(plan, c, q, k, v)
        out = out32.to(q.dtype)
    return (out, lse) if return_lse else out


# ---- head-parallel (Ulysses) attention -----------------------------------------------------------------------------


def _head_ranges(hq, hkv, ranks):
    """Per rank d: its query heads [lo, hi) (Hq / P each) and the key/value heads [lo, hi) they read (GQA): split when
    P divides Hkv, replicated (several ranks read the same KV head) when Hkv divides P."""
    g, per = hq // hkv, hq // ranks
    q = [(d * per, (d + 1) * per) for d in range(ranks)]
    return q, [(lo // g, (hi - 1) // g + 1) for lo, hi in q]


def _all_to_all(comm, pieces, shapes, dtype):
    """pieces[d]: the tensor for rank d (contiguous); shapes[s]: the shape of what rank s sends here. Returns the
    received tensors in source order (this rank's own piece passed through), by P - 1 pairwise shifts."""
    torch = _torch()
    got = [None] * comm.size
    got[comm.rank] = pieces[comm.rank]
    for shift in range(1, comm.size):
        dst, src = (comm.rank + shift) % comm.size, (comm.rank - shift) % comm.size
        recv = torch.empty(shapes[src], dtype=dtype)
        comm.wait(comm.exchange(_bytes(pieces[dst]), recv.view(-1).view(torch.uint8), _TAG_A2A, shift))
        got[src] = recv
    return got


class _UlyssesPlan:
    """The agreed plan (the ring's checks and agreement) plus the head split Ulysses needs."""

    def __init__(self, comm, q, k, v, causal, scale, layout, threads):
        self.base = _Plan(comm, q, k, v, causal, scale, layout, threads)
        b = self.base
        if b.Hq % b.ranks:
            raise ValueError(f"q: {b.Hq} heads over {b.ranks} ranks; Ulysses attention splits the query heads, "
                             "expected a multiple of the rank count (ring_attention takes any)")
        if b.Hkv % b.ranks and b.ranks % b.Hkv:
            raise ValueError(f"k: {b.Hkv} key/value heads over {b.ranks} ranks; expected a multiple of the rank "
                             "count (split) or a divisor of it (replicated)")
        if b.layout == "contiguous":  # the whole sequence is reassembled by the layout's rule: the even split
            for name, lens in (("q", b.sq), ("k", b.skv)):
                for r, n in enumerate(lens):
                    want = slice_segments("contiguous", sum(lens), b.ranks, r)[0][1]
                    if n != want:
                        raise ValueError(f"rank {r}: {name} holds {n} positions; Ulysses attention takes the even "
                                         f"contiguous split ({want} here; attn.dist.scatter_sequence makes it)")
        self.qheads, self.kvheads = _head_ranges(b.Hq, b.Hkv, b.ranks)


def _ulysses_functions():
    torch = _torch()
    if "_SeqToHeads" in globals():
        return globals()["_SeqToHeads"], globals()["_HeadsToSeq"]

    def seq_to_heads(comm, plan, x, heads, lens):
        """[B, H, S_r, D] (this rank's positions, every head) -> [B, h_d, S, D] (every position, this rank's heads)."""
        b = plan.base
        pieces = [x[:, lo:hi].contiguous() for lo, hi in heads]
        lo, hi = heads[comm.rank]
        shapes = [(b.B, hi - lo, lens[s], x.shape[3]) for s in range(comm.size)]
        return gather_sequence(_all_to_all(comm, pieces, shapes, x.dtype), b.layout)

    def heads_to_seq(comm, plan, y, heads, lens, total_heads):
        """The inverse: [B, h_d, S, D] -> [B, H, S_r, D]; a head that several ranks hold (replicated KV heads) sums
        their values (the gradient of a replicated input)."""
        b = plan.base
        pieces = [scatter_sequence(y, b.layout, comm.size, s).contiguous() for s in range(comm.size)]
        shapes = [(b.B, heads[s][1] - heads[s][0], lens[comm.rank], y.shape[3]) for s in range(comm.size)]
        got = _all_to_all(comm, pieces, shapes, y.dtype)
        out = torch.zeros(b.B, total_heads, lens[comm.rank], y.shape[3], dtype=torch.float32)
        for (lo, hi), g in zip(heads, got):
            out[:, lo:hi] += g.float()
        return out.to(y.dtype)

    class _SeqToHeads(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm, plan, heads, lens):
            ctx.args = (comm, plan, heads, lens, x.shape[1])
            return seq_to_heads(comm, plan, x, heads, lens)

        @staticmethod
        def backward(ctx, g):
            comm, plan, heads, lens, total = ctx.args
            return heads_to_seq(comm, plan, g.contiguous(), heads, lens, total), None, None, None, None

    class _HeadsToSeq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, comm, plan, heads, lens, total):
            ctx.args = (comm, plan, heads, lens)
            return heads_to_seq(comm, plan, y, heads, lens, total)

        @staticmethod
        def backward(ctx, g):
            comm, plan, heads, lens = ctx.args
            return seq_to_heads(comm, plan, g.contiguous(), heads, lens), None, None, None, None, None

    globals()["_SeqToHeads"], globals()["_HeadsToSeq"] = _SeqToHeads, _HeadsToSeq
    return _SeqToHeads, _HeadsToSeq


def ulysses_attention(q, k, v, comm=None, *, causal=False, scale=None, layout="zigzag", threads=0):
    """Head-parallel (DeepSpeed-Ulysses) attention: the same result as ring_attention, by another route. An
    all-to-all trades each rank's sequence slice of every head for the whole sequence of Hq / P query heads (and the
    key/value heads they read: split over the ranks when P divides Hkv, replicated when Hkv divides P), attention
    runs on whole sequences (attn.scaled_dot_product_attention, in the inputs' dtype), and a second all-to-all
    brings each rank its positions back. Arguments, layouts and errors as ring_attention's; Hq must be a multiple
    of the rank count. Autograd: the all-to-alls' backward is the reverse all-to-all (the gradients of replicated
    KV heads summed over the ranks that read them), attention's is attn's own backward. Moves Q, K, V and O over the
    network once each instead of K and V P - 1 times: attn ring-plan says which is faster for a given link."""
    from .functional import scaled_dot_product_attention
    c = _comm(comm)
    plan = _UlyssesPlan(c, q, k, v, causal, scale, layout, threads)
    b = plan.base
    to_heads, to_seq = _ulysses_functions()
    qh = to_heads.apply(q, c, plan, plan.qheads, b.sq)
    kh = to_heads.apply(k, c, plan, plan.kvheads, b.skv)
    vh = to_heads.apply(v, c, plan, plan.kvheads, b.skv)
    oh = scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale, enable_gqa=True)
    return to_seq.apply(oh, c, plan, plan.qheads, b.sq, b.Hq)


__all__ = ["LAYOUTS", "slice_segments", "scatter_sequence", "gather_sequence", "ring_attention", "ulysses_attention"]
