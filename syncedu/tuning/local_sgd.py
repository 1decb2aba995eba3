"""Local SGD: every rank steps on its own, the parameters are averaged every H steps.

Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019: 1/H of data
parallelism's traffic, at the price of copies that drift apart between averages.
Post-local SGD (Lin, Stich, Patel & Jaggi, "Don't Use Large Mini-Batches, Use Local
SGD", ICLR 2020) averages every step during the first `start_local_at` steps.

1. At construction, broadcast rank 0's parameters and buffers (as `DataParallel`).
2. Backward and the optimizer step are purely local (no gradient hooks).
3. After optimizer step t (1-based), if t <= `start_local_at` or t is a
   multiple of `sync_every`: allreduce the flat trainable parameters, averaged.

H = 1 trains like "flat" with plain SGD and with momentum (both updates are linear
in the gradients), but not with Adam, whose update divides by sqrt(v_r).
"""

from __future__ import annotations

import torch
from torch import nn

from syncedu.comm.runs import check_int
from syncedu.dp.buckets import unflatten_


def broadcast_state(comm, module: nn.Module) -> None:
    """Step 1: every rank takes rank 0's parameters and buffers."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.numel():
                comm.broadcast(t.data, src=0)


def copy_flat(params, flat: torch.Tensor) -> None:
    """Copy one flat vector back into `params`, in order."""
    with torch.no_grad():
        unflatten_(list(params), flat)


def average_parameters(comm, params: list[nn.Parameter]) -> None:
    """Step 3: replace every parameter by its mean over the ranks (one allreduce)."""
    if params:
        flat = torch.nn.utils.parameters_to_vector(params).detach()
        comm.all_reduce(flat, op="avg")
        copy_flat(params, flat)


class LocalSGD:
    """Average `module`'s trainable parameters every `sync_every` optimizer steps."""

    def __init__(self, module: nn.Module, comm, sync_every: int = 1, *,
                 start_local_at: int = 0):
        check_int("sync_every", sync_every)
        check_int("start_local_at", start_local_at, low=0)
        self.comm, self.sync_every, self.start_local_at = comm, sync_every, start_local_at
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.steps = 0  # optimizer steps taken so far
        self.averages = 0  # parameter averages done so far
        self._last = 0  # the step of the last average
        broadcast_state(comm, module)  # Step 1

    def after_step(self) -> bool:
        """Count one optimizer step; average the parameters if due (Step 3). Returns whether."""
        self.steps += 1
        due = self.steps <= self.start_local_at or self.steps % self.sync_every == 0
        if self.comm.world_size == 1 or not due:
            return False
        self.average()
        return True

    def average(self) -> None:
        """Average the parameters now (Step 3)."""
        average_parameters(self.comm, self.params)
        self.averages += 1
        self._last = self.steps

    def finish(self) -> None:
        """At the end of training: average once more if steps were taken since the last one."""
        if self.comm.world_size > 1 and self.steps > self._last:
            self.average()
