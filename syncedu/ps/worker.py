"""The worker side of a parameter server: compute, push gradients, pull parameters.

A worker is written against `Comm` point-to-point messages only (no
`torch.distributed.rpc`): one `isend` per server to push, one `recv` per server
to pull. Steps of `run_worker`, for each of its steps c:

1. start from the initial parameters every rank built from the seed (no pull
   before the first step: they are already equal);
2. compute the loss and gradient of this worker's part of global batch c
   (`grad_fn`), and charge the modeled compute (`comm.compute`, which the
   network's `slowdown` stretches: a straggler);
3. push: each server gets its flat range of the gradient plus the loss;
4. pull (not after the last step): each server's range of its current
   parameters. In "ssp" mode a server holds this reply while the worker is
   more than `staleness` steps ahead of the slowest one; that wait, and every
   other moment not spent computing, is the worker's idle time.

Source: Li et al., "Scaling Distributed Machine Learning with the Parameter
Server", OSDI 2014 (push/pull, bounded delay).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from syncedu.ps.config import PULL_TAG, PUSH_TAG, PSConfig, shard_ranges


@dataclass
class WorkerLog:
    """What one worker returns: its losses, and when it was busy."""

    rank: int
    losses: list[float] = field(default_factory=list)
    busy: float = 0.0  # seconds computing (Step 2)
    start: float = 0.0
    end: float = 0.0

    @property
    def pushed(self) -> int:
        return len(self.losses)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def idle_fraction(self) -> float:
        """Share of this worker's time not spent computing (waiting for the servers)."""
        return 1.0 - self.busy / self.seconds if self.seconds > 0 else 0.0


def compute_factor(rng: random.Random, variability: float) -> float:
    """A random factor of mean 1: 1 - v + v * Exp(1) (v = 0: always 1)."""
    return 1.0 - variability + variability * rng.expovariate(1.0) if variability else 1.0


def run_worker(comm, cfg: PSConfig, params: torch.Tensor, grad_fn, step=None) -> WorkerLog:
    """Run worker `comm.rank`: `grad_fn(c, params) -> (loss, flat gradient)` for each step c.

    `step`: the push/pull of Steps 3-4 (default `push_pull`; Exercise 04.1 passes the
    learner's, same signature).
    """
    step = push_pull if step is None else step
    rng = random.Random(cfg.seed * 1_000_003 + 7_919 * comm.rank)
    log = WorkerLog(comm.rank, start=comm.now())
    steps = cfg.steps[comm.rank]
    for c in range(steps):  # Step 1: `params` are the shared initial ones
        t0 = comm.now()
        loss, grad = grad_fn(c, params)  # Step 2
        comm.compute(cfg.compute_seconds * compute_factor(rng, cfg.variability))
        log.busy += comm.now() - t0
        log.losses.append(float(loss))
        step(comm, cfg, grad, float(loss), params, c < steps - 1)  # Steps 3-4
    log.end = comm.now()
    return log


def push_pull(comm, cfg: PSConfig, grad: torch.Tensor, loss: float, params: torch.Tensor,
              pull: bool) -> None:
    """Steps 3-4 of one worker step: push the gradient's ranges, then (if `pull`) pull."""
    ranges = shard_ranges(params.numel(), cfg.servers)
    pending = _push(comm, cfg, ranges, grad, loss)  # Step 3
    if pull:
        _pull(comm, cfg, ranges, params)  # Step 4
    for work, _msg in pending:  # each message stays alive until its send is done
        work.wait()


def _push(comm, cfg: PSConfig, ranges, grad: torch.Tensor, loss: float) -> list:
    """Step 3: one message per server, its gradient range followed by the loss."""
    works = []
    tail = torch.tensor([loss], dtype=grad.dtype, device=grad.device)
    with comm.scope("ps_push"):
        for s, (lo, hi) in enumerate(ranges):
            msg = torch.cat([grad[lo:hi], tail])
            works.append((comm.isend(msg, cfg.server_rank(s), PUSH_TAG), msg))
    return works


def _pull(comm, cfg: PSConfig, ranges, params: torch.Tensor) -> None:
    """Step 4: receive each server's range of the parameters in place."""
    with comm.scope("ps_pull"):
        for s, (lo, hi) in enumerate(ranges):
            comm.recv(params[lo:hi], cfg.server_rank(s), PULL_TAG)
