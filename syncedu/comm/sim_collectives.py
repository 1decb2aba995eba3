"""The simulator's built-in collectives, done at once when the last rank joins.

Each rank's `comm.all_reduce(...)` (or broadcast, reduce, reduce_scatter,
all_gather, barrier) joins a rendezvous (sim_world.py). When the last rank
joins, `resolve` does the whole collective in one go:

1. check that every rank called the same collective with the same sizes;
2. compute the values directly from all ranks' tensors, adding in exactly the
   order the ring (or chain) of sim.py's docstring would, so the bits match it;
3. replay the ring's (or chain's, or dissemination barrier's) messages on the
   logical clocks: each rank's completion time, its send port, its receive
   port and, on a cluster, the NICs, exactly as if the messages had been sent.
   On a flat, noiseless network whose receive ports are free, one step of the
   ring is a few vector operations over all ranks (numpy); otherwise messages
   are replayed one by one (`Wires.depart`/`arrive`).

A rank that joined with `async_op=True` went on computing meanwhile: the
replay starts from its clock when it joined, and its handle's `wait()` moves
its clock to max(now, completion).

Used in: notebooks/00_start_here, 01_collectives (through `syncedu.sim`).
"""

from __future__ import annotations

import numpy as np
import torch

from .ledger import ring_chunks
from .sim_messages import flat_view


class Call:
    """One rank's part in a built-in collective."""

    __slots__ = ("kind", "rank", "op", "root", "tensor", "parts", "now", "end")

    def __init__(self, kind: str, rank: int, tensor=None, parts=None, op="sum", root=0):
        self.kind, self.rank, self.op, self.root = kind, rank, op, root
        self.tensor = tensor  # all_reduce, broadcast, reduce: in place; reduce_scatter: output
        self.parts = parts  # reduce_scatter: inputs; all_gather: outputs
        self.now = 0.0  # the rank's clock when it joined
        self.end = 0.0  # when the collective is done for this rank

    def signature(self) -> tuple:
        t = self.tensor
        return (self.kind, self.op, self.root, None if t is None else (t.numel(), t.dtype))


class CollectiveWork:
    """Handle of one rank's part in a built-in collective (made by `World.join`)."""

    __slots__ = ("world", "rank", "call", "pending", "msg")

    def __init__(self, world, rank: int, call: Call, pending: dict):
        self.world, self.rank, self.call, self.pending = world, rank, call, pending
        self.msg = None  # set (True) when the collective is done

    def wait(self, timeout: float | None = None) -> None:
        """Block until every rank has joined; then move the clock to the completion."""
        self.world.wait(self.rank, self)
        self.world.wires.clocks[self.rank].advance(self.call.end)

    def describe(self, world) -> str:
        missing = [r for r in range(world.n) if r not in self.pending]
        text = f"{self.call.kind}: waiting for a message from rank {missing[0]}"
        if len(missing) > 1:
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            text += f" (ranks {shown} have not called it)"
        done = [r for r in missing if world.ranks[r].done]
        if done:
            text += f"; rank {done[0]} has already returned"
        return text


def check(first: Call, call: Call) -> None:
    """Step 1: `call` must match `first` (the first rank to join)."""
    if (call.kind, call.op, call.root) != (first.kind, first.op, first.root):
        raise RuntimeError(f"rank {call.rank} called {_name(call)} but rank {first.rank} called "
                           f"{_name(first)}: every rank must call the same collectives in the "
                           "same order")
    if call.signature() != first.signature():
        mine, theirs = call.signature()[3], first.signature()[3]
        raise RuntimeError(f"rank {call.rank}'s {call.kind} has {mine[0]} x {mine[1]} where "
                           f"rank {first.rank}'s has {theirs[0]} x {theirs[1]}: every rank must "
                           "pass tensors of the same shape and dtype")


def _name(call: Call) -> str:
    extra = {"broadcast": f"(src={call.root})", "reduce": f"(dst={call.root}, op={call.op!r})",
             "all_reduce": f"(op={call.op!r})", "reduce_scatter": f"(op={call.op!r})"}
    return call.kind + extra.get(call.kind, "")


def resolve(calls: list[Call], wires) -> None:
    """Steps 2 and 3 for a complete rendezvous (`calls[r]` is rank r's)."""
    kind, n = calls[0].kind, len(calls)
    _VALUES[kind](calls)
    clocks = wires.clocks
    live = [c.now for c in clocks]
    for call, c in zip(calls, clocks):
        c.now = call.now  # replay from the clock each rank had when it joined
    if kind == "barrier":
        _barrier(wires, n)
    elif kind in ("broadcast", "reduce"):
        nbytes = calls[0].tensor.numel() * calls[0].tensor.element_size()
        first = calls[0].root if kind == "broadcast" else (calls[0].root + 1) % n
        _chain(wires, first, n, nbytes)
    else:
        _ring(wires, calls)
    for call, c, t in zip(calls, clocks, live):
        call.end, c.now = c.now, t


# ---------------------------------------------------------------- values
def _combine(acc: torch.Tensor, data: torch.Tensor, op: str) -> None:
    """acc = acc (op) data, in place and in acc's dtype."""
    if op == "sum":
        acc.add_(data)
    elif op == "prod":
        acc.mul_(data)
    elif op == "max":
        torch.maximum(acc, data, out=acc)
    else:
        torch.minimum(acc, data, out=acc)


def _ring_sum(rows: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce rows (one per rank) as the ring does: chunk k from rank k+1 on, rank k last."""
    n, length = rows.shape
    sizes = torch.tensor(ring_chunks(length, n))
    chunk_of = torch.repeat_interleave(torch.arange(n), sizes)
    cols = torch.arange(length)
    acc = rows[(chunk_of + 1) % n, cols].clone()
    for j in range(2, n + 1):
        _combine(acc, rows[(chunk_of + j) % n, cols], op)
    return acc


def _all_reduce(calls) -> None:
    flats = [flat_view(c.tensor) for c in calls]
    total = _ring_sum(torch.stack(flats), calls[0].op)
    for f in flats:
        f.copy_(total)


def _reduce_scatter(calls) -> None:
    rows = torch.stack([torch.cat([flat_view(p) for p in c.parts]) for c in calls])
    total = _ring_sum(rows, calls[0].op).view(len(calls), -1)
    for k, c in enumerate(calls):
        flat_view(c.tensor).copy_(total[k])


def _all_gather(calls) -> None:
    sources = [flat_view(c.tensor) for c in calls]
    for c in calls:  # N^2 copies: one C++ loop per rank
        torch._foreach_copy_([flat_view(p) for p in c.parts], sources)


def _broadcast(calls) -> None:
    src = flat_view(calls[calls[0].root].tensor)
    for c in calls:
        if c.rank != calls[0].root:
            flat_view(c.tensor).copy_(src)


def _reduce(calls) -> None:
    n, dst = len(calls), calls[0].root
    acc = flat_view(calls[(dst + 1) % n].tensor).clone()  # the chain dst+1 -> ... -> dst
    for j in range(2, n):
        _combine(acc, flat_view(calls[(dst + j) % n].tensor), calls[0].op)
    _combine(flat_view(calls[dst].tensor), acc, calls[0].op)


_VALUES = {"all_reduce": _all_reduce, "reduce_scatter": _reduce_scatter,
           "all_gather": _all_gather, "broadcast": _broadcast, "reduce": _reduce,
           "barrier": lambda calls: None}


# ------------------------------------------------------------------ time
def _ring_bytes(calls) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(bytes of chunk k, [(first step, steps) of each phase]) of a ring collective."""
    c, n = calls[0], len(calls)
    if c.kind == "all_reduce":
        es = c.tensor.element_size()
        return np.array(ring_chunks(c.tensor.numel(), n)) * es, [(0, n - 1), (n - 1, n - 1)]
    part = c.tensor if c.kind == "reduce_scatter" else c.parts[0]
    nbytes = np.full(n, part.numel() * part.element_size())
    return nbytes, [(0, n - 1)] if c.kind == "reduce_scatter" else [(n - 1, n - 1)]


def _chunk_sent(ranks: np.ndarray, s: int, n: int) -> np.ndarray:
    """Step s of the ring (0..n-2 reduce-scatter, n-1.. all-gather): chunk rank r sends."""
    return (ranks - 1 - s) % n if s < n - 1 else (ranks - (s - n + 1)) % n


def _ring(wires, calls) -> None:
    n = len(calls)
    nbytes, phases = _ring_bytes(calls)
    steps = [s for first, count in phases for s in range(first, first + count)]
    if not _fast_ring(wires, nbytes, steps):
        ranks = np.arange(n)
        for s in steps:
            _round(wires, 1, nbytes[_chunk_sent(ranks, s, n)].tolist())


def _round(wires, dist: int, sizes: list[int]) -> None:
    """Every rank r sends sizes[r] bytes to r + dist and receives from r - dist."""
    n = len(sizes)
    out = [wires.depart(r, (r + dist) % n, sizes[r]) for r in range(n)]
    for r in range(n):
        src = (r - dist) % n
        start, dur, _ = out[src]
        arrival = wires.arrive(r, src, start, dur, sizes[src])
        wires.clocks[r].advance(arrival)
        wires.clocks[r].advance(out[r][2])


def _fast_ring(wires, nbytes: np.ndarray, steps: list[int]) -> bool:
    """The ring on all ranks at once (flat, noiseless, free ports); False if it does not apply."""
    net, clocks, n = wires.net, wires.clocks, len(wires.clocks)
    if wires.cluster or not net.deterministic:
        return False
    durs = net.latency + nbytes / net.bandwidth  # per chunk, as the messages would have
    if (durs <= 0).any() and not (durs <= 0).all():
        return False
    now = np.array([c.now for c in clocks])
    free = np.array([c.send_free for c in clocks])
    first_in = np.roll(np.maximum(now, free), 1)  # step 0's message into each port
    if any(c.port.busy_until() > t for c, t in zip(clocks, first_in.tolist())):
        return False
    ranks = np.arange(n)
    starts, ends = np.empty((len(steps), n)), np.empty((len(steps), n))
    for i, s in enumerate(steps):
        d = durs[_chunk_sent(ranks, s, n)]
        start = np.maximum(now, free)
        free = start + d
        arrival = np.roll(free, 1)  # from r - 1, its port being free: start + d
        now = np.maximum(np.maximum(now, arrival), free)
        starts[i], ends[i] = np.roll(start, 1), arrival
    for c, t, f in zip(clocks, now.tolist(), free.tolist()):
        c.now, c.send_free = t, f
    if durs[0] > 0:
        _book(clocks, starts, ends)
    return True


def _book(clocks, starts: np.ndarray, ends: np.ndarray) -> None:
    """Book each rank's receive port with its column of intervals, merging touching ones."""
    breaks = starts[1:] != ends[:-1]
    for r, c in enumerate(clocks):
        cut = np.flatnonzero(breaks[:, r]).tolist()
        lo = 0
        for i in cut + [len(starts) - 1]:
            c.port.append(float(starts[lo, r]), float(ends[i, r]))
            lo = i + 1


def _chain(wires, first: int, n: int, nbytes: int) -> None:
    """first -> first+1 -> ... : N-1 whole messages, each after the previous arrived."""
    for i in range(n - 1):
        r, nxt = (first + i) % n, (first + i + 1) % n
        start, dur, end = wires.depart(r, nxt, nbytes)
        wires.clocks[nxt].advance(wires.arrive(nxt, r, start, dur, nbytes))
        wires.clocks[r].advance(end)


def _barrier(wires, n: int) -> None:
    """Dissemination (Hensgen et al. 1988): rounds of empty messages to r + 2^k."""
    dist = 1
    while dist < n:
        _round(wires, dist, [0] * n)
        dist *= 2
