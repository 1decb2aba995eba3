"""Checkers for notebooks/06_sync_batchnorm's exercises (simulated ranks: quick, exact)."""

from __future__ import annotations

import torch
from torch import nn

from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements

from . import _attempt, _verdict, checker

_SIZES = (3, 1, 0, 5)  # uneven, with a single-sample rank and an empty one


def _case(channels: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, channels, generator=g, dtype=torch.float64) * 2 + 7 for n in _SIZES]


@checker
def global_mean_var(worker) -> bool:
    """Exercise 06.1: `worker(comm, x)` -> global (mean, biased var), with one all_reduce."""
    name = "Exercise 1 (global statistics)"
    xs = _case()
    ok, res = _attempt(name, lambda: sim.run(lambda comm: worker(comm, xs[comm.rank]),
                                             len(xs)))
    if not ok:
        return False
    var, mean = torch.var_mean(torch.cat(xs), dim=0, correction=0)
    for r, out in enumerate(res):
        if not (isinstance(out, tuple) and len(out) == 2):
            return _verdict(name, False, f"rank {r} returned {type(out).__name__}; "
                            "return a (mean, var) pair")
        got_mean, got_var = (torch.as_tensor(t, dtype=torch.float64) for t in out)
        if not (torch.allclose(got_mean, mean, atol=1e-9) and torch.allclose(got_var, var,
                                                                            atol=1e-9)):
            return _verdict(name, False, f"rank {r} (batch of {_SIZES[r]}) got mean {got_mean} "
                            f"and var {got_var}; expected {mean} and {var}")
    calls = sum(op.calls[0] for op in res.ledger.ops.values())
    if calls != 1:
        return _verdict(name, False, f"rank 0 made {calls} communication calls; pack sum, "
                        "sum of squares and count into ONE all_reduce")
    return _verdict(name, True)


def syncbn_step_bytes(channels=(8, 8), world_size: int = 4, itemsize: int = 8) -> int:
    """Bytes rank 0 sends for SyncBN in one training step (forward + backward, all layers)."""
    total = 0
    for c in channels:
        total += ring_allreduce_elements(2 * c + 1, world_size, 0)[0]  # forward payload
        total += ring_allreduce_elements(2 * c, world_size, 0)[0]      # backward payload
    return total * itemsize


@checker
def step_bytes(answer, channels=(16, 32, 64), world_size: int = 8) -> bool:
    """Exercise 06.2: SyncBN bytes rank 0 sends per step (16, 32, 64 channels; 8 ranks)."""
    name = "Exercise 2 (predict the ledger)"
    ok, value = _attempt(name, answer if callable(answer) else (lambda: answer))
    if not ok:
        return False
    want = syncbn_step_bytes(channels, world_size)
    return _verdict(name, value == want, "" if value == want else
                    f"{value!r} is not it: two all_reduces per layer, of 2C + 1 and 2C float64 "
                    "numbers, each charged as a ring")


def _bn_model(rank: int) -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.BatchNorm1d(4))
    with torch.no_grad():
        for i, m in enumerate(m for m in model if isinstance(m, nn.BatchNorm1d)):
            m.running_mean.copy_(torch.arange(4.0) * (rank + 1) + i)
            m.running_var.copy_(torch.ones(4) * (rank + 2) + i)
    return model


@checker
def average_running_stats(worker, world_size: int = 3) -> bool:
    """Exercise 06.3: `worker(comm, model)` makes every rank's BN running stats the ranks' mean."""
    name = "Exercise 3 (agree on running statistics)"

    def run(comm):
        model = _bn_model(comm.rank)
        worker(comm, model)
        return [b.clone() for n, b in model.named_buffers() if "running" in n]

    ok, res = _attempt(name, lambda: sim.run(run, world_size))
    if not ok:
        return False
    models = [_bn_model(r) for r in range(world_size)]
    want = [torch.stack(bs).mean(0) for bs in zip(*[[b for n, b in m.named_buffers()
                                                     if "running" in n] for m in models])]
    for r, got in enumerate(res):
        if len(got) != len(want) or not all(torch.allclose(a, b) for a, b in zip(got, want)):
            return _verdict(name, False, f"rank {r}'s running statistics are not the average "
                            "over ranks (every BatchNorm layer, mean and var)")
    return _verdict(name, True)
