"""Checkers for notebooks/01_collectives' exercises (run on simulated ranks: instant, exact)."""

from __future__ import annotations

import torch

from syncedu.comm import sim
from syncedu.lab import cost

from . import _attempt, _verdict, checker, simulated_allreduces

_P2P = {"send", "recv"}


@checker
def all_gather_from_send_recv(my_all_gather, world_sizes=(2, 3, 5)) -> bool:
    """Exercise 01.1: `my_all_gather(comm, tensor)` returns [rank 0's, rank 1's, ...]."""
    name = "Exercise 1 (all-gather from send/recv)"

    def worker(comm):
        mine = torch.arange(3.0) + 10 * comm.rank
        out = my_all_gather(comm, mine.clone())
        return [t.tolist() for t in out]

    for n in world_sizes:
        ok, res = _attempt(name, lambda n=n: sim.run(worker, n))
        if not ok:
            return False
        want = [[10.0 * r, 10.0 * r + 1, 10.0 * r + 2] for r in range(n)]
        bad = [r for r, got in enumerate(res) if got != want]
        if bad:
            return _verdict(name, False, f"with {n} ranks rank {bad[0]} got {res[bad[0]]}, "
                            f"expected {want}")
        if set(res.ledger.ops) - _P2P:
            return _verdict(name, False, "use only send/recv (or isend/irecv), no built-in "
                            f"collective (saw {sorted(set(res.ledger.ops) - _P2P)})")
    return _verdict(name, True)


@checker
def allreduce_from_collectives(my_allreduce, world_sizes=(2, 4)) -> bool:
    """Exercise 01.2: allreduce from comm.reduce_scatter + comm.all_gather (length % N == 0)."""
    name = "Exercise 2 (allreduce = reduce-scatter + all-gather)"

    runs = simulated_allreduces(name, my_allreduce, world_sizes,
                                lambda r: torch.arange(8.0) * (r + 1))
    if runs is None:
        return False
    for n, res, want in runs:
        if any(got != want for got in res):
            return _verdict(name, False, f"with {n} ranks got {res[0]}, expected {want}")
        used = set(res.ledger.ops)
        if used != {"reduce_scatter", "all_gather"}:
            return _verdict(name, False, f"use comm.reduce_scatter then comm.all_gather "
                            f"(used {sorted(used)})")
    return _verdict(name, True)


@checker
def bus_bandwidth(my_busbw) -> bool:
    """Exercise 01.3: `my_busbw(nbytes, seconds, world_size)` for all_reduce, in bytes/s."""
    name = "Exercise 3 (bus bandwidth)"
    for s, t, n in [(1 << 20, 1e-3, 2), (1 << 26, 0.25, 8), (100, 1e-6, 3)]:
        ok, got = _attempt(name, lambda s=s, t=t, n=n: my_busbw(s, t, n))
        if not ok:
            return False
        want = cost.busbw("all_reduce", s, t, n)
        if got is None or abs(got - want) > 1e-9 * want:
            return _verdict(name, False, f"busbw({s}, {t}, {n}) = {got!r}; expected {want:.6g}")
    return _verdict(name, True)
