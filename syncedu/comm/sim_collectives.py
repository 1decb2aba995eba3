"""The simulator's built-in collectives, run as message schedules when the last rank joins.

1. check that every rank called the same collective with the same sizes;
2. build rounds of messages (src, dst, bytes, chunk): all_reduce a ring
   reduce-scatter then all-gather (Patarasuk & Yuan 2009), rank r owning chunk
   r in between; broadcast and reduce a chain or a binomial tree (Thakur et al.
   2005); barrier dissemination (Hensgen et al. 1988);
3. move each message as a point-to-point one moves (`Wires.depart`/`arrive`)
   with a copy of the sender's chunk, which the receiver combines or stores;
   count it in both ledgers and trace it.

The messages leave from each rank's clock when it joined (an `async_op=True`
caller computes meanwhile). A ring takes a fast path (sim_fast.py) unless `FAST = False`.
"""

from __future__ import annotations

import numpy as np
import torch

from . import sim_fast
from .sim_fast import chunk_sent, combine
from .sim_handles import flat_view, returned

FAST = True  # use sim_fast.py where it applies (same results; tests compare)


class Call:
    """One rank's part in a built-in collective."""

    __slots__ = ("kind", "rank", "op", "root", "tensor", "parts", "now", "end", "name")

    def __init__(self, kind: str, rank: int, tensor=None, parts=None, op="sum", root=0):
        self.kind, self.rank, self.op, self.root = kind, rank, op, root
        self.tensor = tensor  # all_reduce, broadcast, reduce: in place; reduce_scatter: output
        self.parts = parts  # reduce_scatter: inputs; all_gather: outputs
        self.now = 0.0  # the rank's clock when it joined
        self.end = 0.0  # when the collective is done for this rank
        self.name = kind  # the ledger op its messages are charged to (a comm.scope's name)

    def signature(self) -> tuple:
        """What every rank's call must share: kind, op, root and (numel, dtype, shape)."""
        t = self.tensor
        return (self.kind, self.op, self.root,
                None if t is None else (t.numel(), t.dtype, tuple(t.shape)))


class SimCollectiveWork:
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
        """For a deadlock report: which ranks this collective still waits for, and why."""
        missing = [r for r in range(world.n) if r not in self.pending]
        text = f"{self.call.kind}: waiting for a message from rank {missing[0]}"
        if len(missing) > 1:
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            text += f" (ranks {shown} have not called it)"
        done = [r for r in missing if world.ranks[r].done]
        return text + (returned(world, done[0]) if done else "")


def check(first: Call, call: Call) -> None:
    """Step 1: `call` must match `first` (the first rank to join)."""
    if (call.kind, call.op, call.root) != (first.kind, first.op, first.root):
        raise RuntimeError(f"rank {call.rank} called {_name(call)} but rank {first.rank} called "
                           f"{_name(first)}: every rank must call the same collectives in the "
                           "same order")
    if call.signature() != first.signature():
        mine, theirs = call.signature()[3], first.signature()[3]
        # Same size, other shape: real backends see only bytes and sum silently; refuse it.
        i = 2 if mine[:2] == theirs[:2] else 0
        raise RuntimeError(f"rank {call.rank}'s {call.kind} has {mine[i]} x {mine[1]} where "
                           f"rank {first.rank}'s has {theirs[i]} x {theirs[1]}: every rank must "
                           "pass tensors of the same shape and dtype")


def _name(call: Call) -> str:
    extra = {"broadcast": f"(src={call.root})", "reduce": f"(dst={call.root}, op={call.op!r})",
             "all_reduce": f"(op={call.op!r})", "reduce_scatter": f"(op={call.op!r})"}
    return call.kind + extra.get(call.kind, "")


def resolve(calls: list[Call], wires, ledgers: list, trace) -> None:
    """Steps 2 and 3 for a complete rendezvous (`calls[r]` is rank r's)."""
    kind = calls[0].kind
    clocks = wires.clocks
    live = [c.now for c in clocks]
    for call, c in zip(calls, clocks):
        c.now = call.now  # the messages leave from the clock each rank had when it joined
    mover = Mover(calls, wires, ledgers, trace)
    if kind in ("all_reduce", "reduce_scatter", "all_gather"):
        _ring(mover)
    elif kind == "barrier":
        _barrier(mover)
    else:  # broadcast, reduce
        (_chain if wires.net.builtin_algorithm == "ring" else _binomial)(mover)
    mover.charge()
    for call, c, t in zip(calls, clocks, live):
        call.end, c.now = c.now, t


class Mover:
    """Moves one collective's messages (Step 3), round by round, and counts them."""

    def __init__(self, calls, wires, ledgers, trace):
        self.calls, self.wires, self.ledgers, self.trace = calls, wires, ledgers, trace
        n = self.n = len(calls)
        self.op = calls[0].op
        self.sent, self.received = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.msgs_sent, self.msgs_received = np.zeros(n, np.int64), np.zeros(n, np.int64)

    def round(self, msgs: list[tuple], bufs=None, reduce: bool = False, op=None) -> None:
        """Move `msgs` (src, dst, nbytes, chunk, slice or None), sent at once: all depart in
        rank order, then arrive in the order given, carrying bufs[src][slice] if any; traced
        as ledger op `op` (None: each sender's call name)."""
        wires, clocks, calls = self.wires, self.wires.clocks, self.calls
        out: list = [None] * len(msgs)
        for i in sorted(range(len(msgs)), key=lambda i: msgs[i][0]):
            src, dst, nb = msgs[i][:3]
            out[i] = (*wires.depart(src, dst, nb), wires.left)
        data = [None if sl is None or bufs is None else bufs[src][sl].clone()
                for src, _, _, _, sl in msgs]
        for (src, dst, nb, chunk, sl), (start, dur, _, left), payload in zip(msgs, out, data):
            t = wires.arrive(dst, src, start, dur, nb)
            clocks[dst].advance(t)
            if payload is not None:
                if reduce:
                    combine(bufs[dst][sl], payload, self.op)
                else:
                    bufs[dst][sl].copy_(payload)
            self.trace.add(src, dst, nb, -1, op or calls[src].name, left, t, chunk)
            self.sent[src] += nb
            self.received[dst] += nb
            self.msgs_sent[src] += 1
            self.msgs_received[dst] += 1
        for (src, *_), (_, _, end, _) in zip(msgs, out):
            clocks[src].advance(end)

    def charge(self) -> None:
        """Each rank's ledger: the bytes and messages it really sent and received."""
        for r, (c, rl) in enumerate(zip(self.calls, self.ledgers)):
            rl.record(c.name, int(self.sent[r]), int(self.received[r]), int(self.msgs_sent[r]),
                      int(self.msgs_received[r]), calls=0, kind="counted")


def _ring(mover: Mover) -> None:
    """Ring reduce-scatter and/or all-gather (Patarasuk & Yuan 2009), rank r owning chunk r."""
    calls, n, kind = mover.calls, mover.n, mover.calls[0].kind
    nbytes, steps, sizes = sim_fast.ring_layout(calls[0], n)
    # The fast path times the ring at once where it can (`timed`); else message by message,
    # below, which also moves the values when not FAST (the fast path computes them at once).
    timed = sim_fast.ring_clock(mover.wires, nbytes, steps) if FAST else None
    bufs = None if FAST else _ring_buffers(calls, kind)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    ranks = np.arange(n)
    for s in steps if timed is None else ():
        sent = chunk_sent(ranks, s, n).tolist()
        msgs = [((r - 1) % n, r, int(nbytes[sent[(r - 1) % n]]), sent[(r - 1) % n],
                 slice(offsets[sent[(r - 1) % n]], offsets[sent[(r - 1) % n] + 1]))
                for r in range(n)]  # in receiver order, as the ports are booked
        mover.round(msgs, bufs, reduce=s < n - 1, op=kind if FAST else None)
    if FAST:
        return _fast(mover, nbytes, steps, sizes, timed)
    _ring_results(calls, kind, bufs, offsets)


def _ring_buffers(calls, kind: str) -> list[torch.Tensor]:
    if kind == "all_reduce":
        return [flat_view(c.tensor) for c in calls]  # in place, as the ranks' own buffers
    if kind == "reduce_scatter":
        return [torch.cat([flat_view(p) for p in c.parts]) for c in calls]  # inputs stay
    bufs = [torch.cat([flat_view(p) for p in c.parts]) for c in calls]
    k = calls[0].tensor.numel()
    for r, (c, b) in enumerate(zip(calls, bufs)):
        b[r * k:(r + 1) * k] = flat_view(c.tensor)
    return bufs


def _ring_results(calls, kind: str, bufs, offsets) -> None:
    if kind == "reduce_scatter":
        for r, c in enumerate(calls):
            flat_view(c.tensor).copy_(bufs[r][offsets[r]:offsets[r + 1]])
    elif kind == "all_gather":
        for c, b in zip(calls, bufs):
            for k, p in enumerate(c.parts):
                flat_view(p).copy_(b[offsets[k]:offsets[k + 1]])


def _fast(mover: Mover, nbytes, steps, sizes, timed) -> None:
    """The ring's values at once (sim_fast.py); its clock too (`timed`: `ring_clock`'s
    arrays), else it was timed, counted and traced message by message (`_ring`)."""
    calls, n = mover.calls, mover.n
    kind = calls[0].kind
    if kind == "all_gather":
        sources = [flat_view(c.tensor) for c in calls]
        for c in calls:  # N^2 copies: one C++ loop per rank
            torch._foreach_copy_([flat_view(p) for p in c.parts], sources)
    else:  # all_reduce: every rank gets the total; reduce_scatter: rank r gets its chunk r
        total = sim_fast.ring_values(torch.stack(_ring_buffers(calls, kind)), mover.op, sizes)
        for r, c in enumerate(calls):
            flat_view(c.tensor).copy_(total if kind == "all_reduce" else total.view(n, -1)[r])
    if timed is None:
        return
    deps, ends, chunks = timed
    sent, received, count = sim_fast.ring_counts(nbytes, steps, n)
    mover.sent += sent
    mover.received += received
    mover.msgs_sent += count
    mover.msgs_received += count
    dst = np.broadcast_to(np.arange(n), np.shape(deps))
    mover.trace.add_block((dst - 1) % n, dst, nbytes[chunks], -1, kind, deps, ends, chunks)


def _chain(mover: Mover) -> None:
    """broadcast: src -> src+1 -> ... ; reduce: dst+1 -> ... -> dst. One whole message a hop."""
    n, root, bcast, nb, bufs = _rooted(mover)
    first, whole = (root if bcast else (root + 1) % n), slice(None)
    for i in range(n - 1):
        r, nxt = (first + i) % n, (first + i + 1) % n
        mover.round([(r, nxt, nb, -1, whole)], bufs, reduce=not bcast)


def _binomial(mover: Mover) -> None:
    """Binomial tree: broadcast doubles the ranks that have it each round; reduce halves."""
    n, root, bcast, nb, bufs = _rooted(mover)
    whole = slice(None)
    for mask in [1 << k for k in range((n - 1).bit_length())]:
        pairs = [(v, v + mask) for v in range(0, n, 2 * mask) if v + mask < n] if not bcast \
            else [(v, v + mask) for v in range(mask) if v + mask < n]
        msgs = [((root + (a if bcast else b)) % n, (root + (b if bcast else a)) % n, nb, -1, whole)
                for a, b in pairs]
        mover.round(msgs, bufs, reduce=not bcast)


def _rooted(mover: Mover):
    """(n, root, is broadcast, bytes, buffers: own tensors, for a reduce copies but at dst)."""
    calls, n = mover.calls, mover.n
    root, bcast = calls[0].root, calls[0].kind == "broadcast"
    bufs = [flat_view(c.tensor) if bcast or r == root else flat_view(c.tensor).clone()
            for r, c in enumerate(calls)]
    return n, root, bcast, calls[0].tensor.nbytes, bufs


def _barrier(mover: Mover) -> None:
    """Dissemination (Hensgen et al. 1988): rounds of empty messages to r + 2^k."""
    n, dist = mover.n, 1
    while dist < n:
        mover.round([((r - dist) % n, r, 0, -1, None) for r in range(n)])
        dist *= 2
