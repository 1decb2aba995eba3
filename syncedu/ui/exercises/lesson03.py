"""Checkers for notebooks/03_data_parallel's exercises."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.lab import models

from . import _attempt, _verdict, checker


def _grads_worker(comm, sync, batch=6):
    model = models.make("mlp", seed=0, hidden=9, depth=2)  # same start on every rank
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    F.cross_entropy(model(x), y).backward()
    comm.ledger.reset()
    sync(comm, list(model.parameters()))
    return [p.grad.clone() for p in model.parameters()], (x, y)


def matches_whole_batch(res, atol: float = 1e-6) -> bool:
    """Does every rank hold the gradients of one model on all ranks' data together?

    `res[r]` is (gradients, (x, y)) from a worker built on `models.make("mlp", seed=0,
    hidden=9, depth=2)`, as the lesson 03 and 05 checkers use.
    """
    model = models.make("mlp", seed=0, hidden=9, depth=2)
    x = torch.cat([r[1][0] for r in res])
    y = torch.cat([r[1][1] for r in res])
    F.cross_entropy(model(x), y).backward()
    return all(torch.allclose(g, p.grad, atol=atol)
               for grads, _ in res for g, p in zip(grads, model.parameters()))


@checker
def flat_sync(sync, world_size: int = 3) -> bool:
    """Exercise 03.1: average every gradient with ONE all_reduce of a flat buffer."""
    name = "Exercise 1 (flat buffer)"
    ok, res = _attempt(name, lambda: sim.run(_grads_worker, world_size, args=(sync,)))
    if not ok:
        return False
    if not matches_whole_batch(res):
        return _verdict(name, False, "the gradients are not the average over all ranks")
    calls = res.ledger.ops.get("all_reduce")
    if calls is None or calls.calls != [1] * world_size:
        return _verdict(name, False, "use exactly one comm.all_reduce per rank")
    return _verdict(name, True)


@checker
def scaled_lr(rule) -> bool:
    """Exercise 03.2: the linear scaling rule (Goyal et al. 2017)."""
    name = "Exercise 2 (linear scaling rule)"
    cases = [((0.1, 256, 8192), 3.2), ((0.05, 32, 256), 0.4), ((0.1, 256, 256), 0.1)]
    ok, got = _attempt(name, lambda: [rule(*args) for args, _ in cases])
    if not ok:
        return False
    for (args, want), value in zip(cases, got):
        if not abs(value - want) <= 1e-9 * max(1.0, want):
            return _verdict(name, False, f"rule{args} gave {value!r}, expected {want}")
    return _verdict(name, True)


@checker
def hiding_bandwidth(answer) -> bool:
    """Exercise 03.3: bandwidth (bytes/s) that hides a ring allreduce of S bytes in T seconds."""
    name = "Exercise 3 (bandwidth to hide communication)"
    cases = [(100e6, 64, 0.12), (25e6, 2, 0.05), (4e6, 8, 0.01)]
    ok, got = _attempt(name, lambda: [answer(*c) for c in cases])
    if not ok:
        return False
    for (s, n, t), value in zip(cases, got):
        want = 2 * (n - 1) / n * s / t
        if not abs(value - want) <= 1e-6 * want:
            return _verdict(name, False, f"S={s:g}, N={n}, T={t}: got {value!r}, expected "
                            "about 2(N-1)/N * S / T")
    return _verdict(name, True)
