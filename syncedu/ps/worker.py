"""The worker side of a parameter server: compute, push gradients, pull parameters.

Steps of `run_worker`, for each of its steps c:

1. start from the initial parameters every rank built from the seed (no pull before the first
   step);
2. compute the loss and gradient of this worker's part of global batch c (`grad_fn`) and charge
   the modeled compute (`comm.compute`; the network's `slowdown` stretches it: a straggler);
3. push: one `isend` per server, its flat range of the gradient plus the loss;
4. pull (not after the last step): one `recv` per server, its range of the parameters; time
   spent waiting (an "ssp" server holds the reply while the worker is too far ahead) is the
   worker's idle time.

Source: Li et al., OSDI 2014 (push/pull, bounded delay).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from syncedu.ps.config import PULL_TAG, PUSH_TAG, PSConfig, shard_ranges


@dataclass
class WorkerLog:
    """What one worker returns: its losses, and when it was busy."""

    losses: list[float] = field(default_factory=list)
    busy: float = 0.0  # seconds computing (Step 2)
    start: float = 0.0
    end: float = 0.0

    @property
    def idle_fraction(self) -> float:
        """Share of this worker's time not spent computing (waiting for the servers)."""
        seconds = self.end - self.start
        return 1.0 - self.busy / seconds if seconds > 0 else 0.0


def run_worker(comm, cfg: PSConfig, params: torch.Tensor, grad_fn, step=None) -> WorkerLog:
    """Run worker `comm.rank`: `grad_fn(c, params) -> (loss, flat gradient)` for each step c;
    `step`: Steps 3-4 (default `push_pull`; Exercise 04.1 passes the learner's)."""
    step = push_pull if step is None else step
    rng = random.Random(cfg.seed * 1_000_003 + 7_919 * comm.rank)
    v = cfg.variability
    log = WorkerLog(start=comm.now())
    steps = cfg.steps[comm.rank]
    for c in range(steps):  # Step 1: `params` are the shared initial ones
        t0 = comm.now()
        loss, grad = grad_fn(c, params)  # Step 2
        comm.compute(cfg.compute_seconds * (1.0 - v + v * rng.expovariate(1.0) if v else 1.0))
        log.busy += comm.now() - t0
        log.losses.append(float(loss))
        step(comm, cfg, grad, float(loss), params, c < steps - 1)  # Steps 3-4
    log.end = comm.now()
    return log


def push_pull(comm, cfg: PSConfig, grad: torch.Tensor, loss: float, params: torch.Tensor,
              pull: bool) -> None:
    """Steps 3-4 of one worker step: push the gradient's ranges, then (if `pull`) pull."""
    ranges = shard_ranges(params.numel(), cfg.servers)
    tail = torch.tensor([loss], dtype=grad.dtype, device=grad.device)
    pending = []  # each message stays alive until its send is done
    with comm.scope("ps_push"):  # Step 3: one message per server
        for s, (lo, hi) in enumerate(ranges):
            msg = torch.cat([grad[lo:hi], tail])
            pending.append((comm.isend(msg, cfg.server_rank(s), PUSH_TAG), msg))
    if pull:
        with comm.scope("ps_pull"):  # Step 4: each server's range, in place
            for s, (lo, hi) in enumerate(ranges):
                comm.recv(params[lo:hi], cfg.server_rank(s), PULL_TAG)
    for work, _msg in pending:
        work.wait()
