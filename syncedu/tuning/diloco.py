"""DiLoCo: local AdamW steps, then an outer Nesterov step on the averaged parameter change.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", arXiv 2311.08105, Algorithm 1:

1. Every worker starts the round from the same global parameters theta
   (broadcast from rank 0 at construction).
2. Inner loop: each worker takes H steps of its own inner optimizer (AdamW in
   the paper) on its own shard, with no communication at all.
3. Outer gradient (the "pseudo-gradient"): delta_r = theta - theta_r; one
   allreduce averages it (one model's worth of bytes every H steps).
4. Outer step: Nesterov momentum on delta (SGD with nesterov=True, the paper's
   choice: lr 0.7, momentum 0.9): v = m v + delta; theta -= lr (delta + m v).
5. Every worker restarts its inner loop from the new theta (its AdamW moments
   are kept, as in the paper).

With outer lr 1 and momentum 0 it is local SGD. `wire_dtype=torch.float16` sends the
pseudo-gradient in fp16, as OpenDiLoCo (Jaffe et al. 2024, arXiv 2407.07852) does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from syncedu.comm.runs import check_choice, check_int, check_number
from syncedu.tuning.local_sgd import broadcast_state, copy_flat

_WIRE = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class DiLoCoConfig:
    """Hyperparameters (defaults: the paper's outer optimizer; inner AdamW as in its Table 5)."""

    inner_steps: int = 50  # H
    inner_lr: float = 4e-4
    weight_decay: float = 0.1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    wire_dtype: torch.dtype = torch.float32  # the dtype the pseudo-gradient travels in

    def __post_init__(self) -> None:
        check_int("inner_steps", self.inner_steps)
        for name in ("inner_lr", "outer_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        check_number("weight_decay", self.weight_decay, 0)
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum={self.outer_momentum!r} must be in [0, 1)")
        check_choice("wire_dtype", self.wire_dtype, _WIRE)


def outer_gradient(comm, anchor: torch.Tensor, local: torch.Tensor,
                   wire_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Step 3: mean over the ranks of (anchor - local), by one allreduce in `wire_dtype`."""
    delta = (anchor - local).to(wire_dtype)
    if comm.world_size > 1:
        # Divide before summing: the fp16 sum cannot overflow (pytorch#57410), at the price of
        # underflowing the smallest changes (the trade-off lesson 07 shows).
        delta.div_(comm.world_size)
        comm.all_reduce(delta)
    return delta.to(anchor.dtype)


def nesterov_step(anchor: torch.Tensor, buf: torch.Tensor, delta: torch.Tensor, *,
                  lr: float, momentum: float, nesterov: bool = True) -> None:
    """Step 4, in place: torch.optim.SGD's momentum rule with the pseudo-gradient as gradient."""
    buf.mul_(momentum).add_(delta)  # v = m v + delta
    step = delta.add(buf, alpha=momentum) if nesterov else buf
    anchor.sub_(step, alpha=lr)


class DiLoCo:
    """One worker's DiLoCo state around `module`; call `after_step()` after each `inner.step()`."""

    def __init__(self, module: nn.Module, comm, config: DiLoCoConfig | None = None):
        self.comm = comm
        self.config = cfg = config or DiLoCoConfig()
        self.params = [p for p in module.parameters() if p.requires_grad]
        broadcast_state(comm, module)  # Step 1
        self.inner = torch.optim.AdamW(self.params, lr=cfg.inner_lr,
                                       weight_decay=cfg.weight_decay)
        self.anchor = self._flat().clone()  # theta: the global parameters
        self.buf = torch.zeros_like(self.anchor)  # outer momentum
        self.steps = 0  # inner steps so far
        self.rounds = 0  # outer steps so far

    def _flat(self) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.params).detach()

    def after_step(self) -> bool:
        """Step 2's count: one inner step taken; the outer step when H are done."""
        self.steps += 1
        if self.steps % self.config.inner_steps:
            return False
        self.outer_step()
        return True

    def outer_step(self) -> None:
        """Steps 3-5: average the parameter change, take the Nesterov step, restart from it."""
        cfg = self.config
        delta = outer_gradient(self.comm, self.anchor, self._flat(), cfg.wire_dtype)  # Step 3
        nesterov_step(self.anchor, self.buf, delta, lr=cfg.outer_lr,  # Step 4
                      momentum=cfg.outer_momentum, nesterov=cfg.nesterov)
        copy_flat(self.params, self.anchor)  # Step 5
        self.rounds += 1

    def finish(self) -> None:
        """At the end: close a cut-short round, so every rank ends with the same parameters."""
        if self.steps % self.config.inner_steps:
            self.outer_step()
