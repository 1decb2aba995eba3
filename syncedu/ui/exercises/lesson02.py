"""Checkers for notebooks/02_allreduce_algorithms' exercises."""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.comm.network import Network
from syncedu.lab import cost
from syncedu.strategies import collectives

from . import _attempt, _verdict, checker, simulated_allreduces


@checker
def ring_time(my_ring_time) -> bool:
    """Exercise 02.1: `my_ring_time(n, nbytes, alpha, beta)`: the ring's alpha-beta time."""
    name = "Exercise 1 (the ring's formula)"
    for n, s, a, b in [(2, 1e6, 1e-5, 1e-9), (8, 4096, 5e-5, 8e-10), (1000, 1e8, 2e-6, 2e-11)]:
        ok, got = _attempt(name, lambda n=n, s=s, a=a, b=b: my_ring_time(n, s, a, b))
        if not ok:
            return False
        net = Network(latency=a, bandwidth=1 / b)
        want = cost.allreduce_time("ring", s, n, net, segment_bytes=None)
        if got is None or not math.isclose(got, want, rel_tol=1e-9):
            return _verdict(name, False, f"N={n}, S={s:g}: got {got!r}, expected {want:.6g}")
    return _verdict(name, True)


@checker
def crossover(answer, world_size: int = 64, network: str = "ethernet_10g") -> bool:
    """Exercise 02.2: the smallest power-of-two size at which the ring beats the tree."""
    name = "Exercise 2 (where the ring overtakes the tree)"
    ok, got = _attempt(name, answer if callable(answer) else (lambda: answer))
    if not ok:
        return False
    net = Network.preset(network)
    want = next(1 << k for k in range(40) if cost.allreduce_time("ring", 1 << k, world_size, net)
                < cost.allreduce_time("tree", 1 << k, world_size, net))
    return _verdict(name, got == want, "" if got == want else
                    f"{got!r} is not it: compare cost.allreduce_time('ring', ...) and 'tree'")


@checker
def rotated_naive(my_allreduce, world_sizes=(2, 3, 6)) -> bool:
    """Exercise 02.3: a naive allreduce whose root is the LAST rank, from send/recv."""
    name = "Exercise 3 (naive allreduce, root = last rank)"

    runs = simulated_allreduces(name, my_allreduce, world_sizes,
                                lambda r: torch.full((5,), float(r + 1)))
    if runs is None:
        return False
    for n, res, want in runs:
        if any(got != want for got in res):
            return _verdict(name, False, f"with {n} ranks rank 0 got {res[0]}")
        sent = res.ledger.sent
        if sent[n - 1] != (n - 1) * 20 or any(sent[r] != 20 for r in range(n - 1)):
            return _verdict(name, False, f"bytes sent per rank {sent}: the last rank should "
                            "send the sum to each other rank, the others one tensor each")
    want = sim.run(lambda c: collectives.naive_allreduce(c, torch.ones(5), root=2), 3).ledger.sent
    return _verdict(name, want == [20, 20, 40])
