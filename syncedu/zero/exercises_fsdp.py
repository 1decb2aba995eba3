"""Checker for lesson 10's ZeRO-1 exercise: shard the optimizer state, not the work onto rank 0.

Exercise 10.3: write `step(comm, params, grads, state, lr, momentum)`, one
step of SGD with momentum (torch's rule: v = m v + g; p -= lr v) in which
each rank keeps the momentum of its own ceil(Psi / N) elements (or the uneven
ring split) in `state`, a dict kept on that rank between steps. `params` are
the same on every rank, `grads` this rank's own; afterwards `params` must be
the same on every rank, as if one process had stepped the mean gradient.

The checker runs it on simulated ranks (exact) at N = 3 and 4 with Psi = 10
(neither divides it) for two steps and asks, in this order:

1. did it run, and are `params` right on every rank (1e-6)?
2. is it data parallelism (`comm.all_reduce`) or "ZeRO" around a root
   (`comm.reduce` then `comm.broadcast`: rank 0 updates everything)?
3. does any rank send or receive more than a padded ring reduce-scatter plus
   all-gather, 2 (N-1) ceil(Psi/N) elements (a root built from send/recv
   does: rank 0 receives (N-1) Psi)?
4. does any rank keep momentum for more than ceil(Psi/N) elements?

Used in: notebooks/10_sharded_data_parallel; tests/zero/test_exercises_fsdp.py.
"""

from __future__ import annotations

import torch

from syncedu.comm import sim
from syncedu.ui.checkers import attempt, checker, verdict

LR, MOMENTUM, STEPS = 0.1, 0.9, 2


def _grads(rank: int, step: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 * step + rank))


def _worker(comm, step_fn, numel: int):
    params, state = torch.linspace(-1.0, 1.0, numel), {}
    for step in range(STEPS):
        step_fn(comm, params, _grads(comm.rank, step, numel), state, LR, MOMENTUM)
    held = sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor))
    return (params.tolist(), set(comm.ledger.ops), comm.ledger.sent, comm.ledger.received,
            held)


def _reference(n: int, numel: int) -> list[float]:
    params, velocity = torch.linspace(-1.0, 1.0, numel), torch.zeros(numel)
    for step in range(STEPS):
        mean = sum(_grads(r, step, numel) for r in range(n)) / n
        velocity = MOMENTUM * velocity + mean
        params -= LR * velocity
    return params.tolist()


def _judge(n: int, numel: int, res) -> str | None:
    """Steps 1-4: what is wrong at world size n (None: nothing)."""
    want, ceil = _reference(n, numel), -(-numel // n)
    for r, (got, *_) in enumerate(res):
        if len(got) != numel or any(abs(a - b) > 1e-6 for a, b in zip(got, want)):
            return (f"N={n}: rank {r}'s parameters are not those of momentum SGD on the "
                    "mean gradient (divide the sum by N? all-gather every rank's shard?)")
    ops = set().union(*(o for _, o, *_ in res))
    if "all_reduce" in ops:
        return (f"N={n}: you called comm.all_reduce: that is data parallelism - "
                "reduce-scatter, update your shard, all-gather")
    if {"reduce", "broadcast"} & ops:
        return (f"N={n}: you used comm.reduce / comm.broadcast: rank 0 does all the updating "
                "and holds all the state, so nothing is sharded - each rank must update only "
                "its own ceil(Psi/N) elements")
    bound = STEPS * 2 * (n - 1) * ceil * 4
    for r, (_, _, sent, received, _) in enumerate(res):
        if max(sent, received) > bound:
            return (f"N={n}: rank {r} sent {sent} and received {received} bytes; a "
                    f"reduce-scatter plus an all-gather moves at most {bound} - is one rank "
                    "(a root) collecting everything?")
    for r, (*_, held) in enumerate(res):
        if held > ceil:
            return (f"N={n}: rank {r} keeps momentum for {held} elements; its shard is at "
                    f"most ceil(Psi/N) = {ceil}")
    return None


@checker
def zero1_step(step, world_sizes=(3, 4), numel: int = 10) -> bool:
    """Exercise 10.3: `step(comm, params, grads, state, lr, momentum)`, one ZeRO-1 step."""
    name = "Exercise 3 (ZeRO-1 with momentum)"
    for n in world_sizes:
        ok, res = attempt(name, lambda n=n: sim.run(_worker, n, args=(step, numel),
                                                     output="quiet"))
        if not ok:
            return False
        wrong = _judge(n, numel, res)
        if wrong:
            return verdict(name, False, wrong)
    return verdict(name, True, f"world sizes {list(world_sizes)}, Psi={numel}: momentum "
                    "for ceil(Psi/N) elements per rank, one allreduce's bytes")
