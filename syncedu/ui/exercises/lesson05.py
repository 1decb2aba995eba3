"""Checkers for notebooks/05_gradient_accumulation's exercises."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.lab import models
from syncedu.strategies.dp import DataParallel

from . import _attempt, _verdict, checker
from .lesson03 import matches_whole_batch


def _accumulate_worker(comm, step, k=4, batch=8):
    model = models.make("mlp", seed=0, hidden=9, depth=2)
    wrapped = DataParallel(model, comm, "bucketed", bucket_cap_mb=0.001)
    comm.ledger.reset()
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    micro = list(zip(x.chunk(k), y.chunk(k)))
    step(wrapped, micro)
    wrapped.close()
    return [p.grad.clone() for p in model.parameters()], (x, y)


@checker
def accumulate(step, world_size: int = 2, k: int = 4) -> bool:
    """Exercise 05.1: K micro-batches, one gradient sync, gradients of the whole batch."""
    name = "Exercise 1 (accumulate with no_sync)"
    ok, res = _attempt(name, lambda: sim.run(_accumulate_worker, world_size, args=(step, k)))
    if not ok:
        return False
    if not matches_whole_batch(res):
        return _verdict(name, False, "the gradients differ from the whole batch's "
                        "(did you divide each micro-batch loss by K?)")
    one = sim.run(_accumulate_worker, world_size, args=(_right, 1)).ledger.ops["all_reduce"].sent
    if res.ledger.ops["all_reduce"].sent != one:
        return _verdict(name, False, "more traffic than one sync: forward AND backward of the "
                        "first K-1 micro-batches belong inside no_sync()")
    return _verdict(name, True)


def _right(model, micro):
    for x, y in micro:
        F.cross_entropy(model(x), y).backward()
    model.finish_gradient_synchronization()


@checker
def saved_fraction(answer) -> bool:
    """Exercise 05.2: the share of gradient bytes `no_sync` saves with K micro-batches."""
    name = "Exercise 2 (bytes saved)"
    ok, got = _attempt(name, lambda: [answer(k) for k in (1, 2, 4, 16)])
    if not ok:
        return False
    want = [(k - 1) / k for k in (1, 2, 4, 16)]
    good = all(abs(a - b) < 1e-12 for a, b in zip(got, want))
    return _verdict(name, good, "" if good else f"got {got}, try K=1 (nothing saved) first")


@checker
def pitfall_bytes(answer) -> bool:
    """Exercise 05.3: bytes per optimizer step when no_sync wraps only backward()."""
    name = "Exercise 3 (the partial no_sync pitfall)"
    cases = [(4, 1000), (8, 35880), (1, 500)]
    ok, got = _attempt(name, lambda: [answer(k, b) for k, b in cases])
    if not ok:
        return False
    good = got == [k * b for k, b in cases]
    return _verdict(name, good, "" if good else "who decides whether a backward syncs: "
                    "the forward or the backward?")
