"""Checkers for notebooks/01_collectives' exercises (run on simulated ranks: instant, exact)."""

from __future__ import annotations

import torch

from syncedu.collectives import cost
from syncedu.comm import sim
from syncedu.ui.checkers import attempt, checker, simulated_allreduces, verdict

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
        ok, res = attempt(name, lambda n=n: sim.run(worker, n))
        if not ok:
            return False
        want = [[10.0 * r, 10.0 * r + 1, 10.0 * r + 2] for r in range(n)]
        bad = [r for r, got in enumerate(res) if got != want]
        if bad:
            return verdict(name, False, f"with {n} ranks rank {bad[0]} got {res[bad[0]]}, "
                            f"expected {want}")
        if set(res.ledger.ops) - _P2P:
            return verdict(name, False, "use only send/recv (or isend/irecv), no built-in "
                            f"collective (saw {sorted(set(res.ledger.ops) - _P2P)})")
    return verdict(name, True)


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
            return verdict(name, False, f"with {n} ranks got {res[0]}, expected {want}")
        used = set(res.ledger.ops)
        if used != {"reduce_scatter", "all_gather"}:
            return verdict(name, False, f"use comm.reduce_scatter then comm.all_gather "
                            f"(used {sorted(used)})")
    return verdict(name, True)


@checker
def quick_busbw(answer) -> bool:
    """Quick check: busbw (bytes/s) of an all-reduce of 64 MiB on 8 ranks that took 0.1 s."""
    name = "Quick check (bus bandwidth)"
    s, t, n = 64 * 2**20, 0.1, 8  # bytes, seconds, ranks: the question's numbers
    ok, got = attempt(name, answer if callable(answer) else lambda: answer)
    if not ok:
        return False
    want = cost.busbw("all_reduce", s, t, n)
    wrong = {cost.algbw(s, t): "that is the algorithm bandwidth S/t; multiply by 2(N-1)/N",
             cost.busbw("all_gather", s, t, n): "(N-1)/N is the factor of reduce-scatter and "
             "all-gather; an all-reduce is both, 2(N-1)/N",
             s / t * 2 * (n - 1) / n / 1e9: "the answer is in bytes per second, not GB/s"}
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return verdict(name, False, f"answer with a number of bytes per second, got {got!r}")
    if abs(got - want) <= 1e-6 * want:
        return verdict(name, True, f"{want / 1e9:.3f} GB/s")
    hint = next((why for value, why in wrong.items() if abs(got - value) <= 1e-6 * value),
                "busbw = S / t * 2(N-1)/N")
    return verdict(name, False, f"{got:.6g} - {hint}")
