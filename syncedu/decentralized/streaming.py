"""Streaming DiLoCo: DiLoCo with the model in fragments, synchronized one at a time, each
fragment's outer-gradient traffic overlapped with the next inner steps.

Douillard, Donchev, Rush, Kale, Garg, ... & Dean, "Streaming DiLoCo with overlapping
communication", arXiv 2501.18512 (2025), on lesson 09's DiLoCo (tuning/diloco.py). The
schedule and the update are the ones torchft 0.2.0's `torchft.local_sgd.DiLoCo` runs
(local_sgd.py: `_step_post_hook`, `prepare_sync`, `perform_sync`), so the two can be checked
bit for bit (torchft_check.py):

1. At construction every rank takes rank 0's parameters (DiLoCo's start); the model's layers
   (modules owning parameters) are cut into F contiguous fragments; each fragment keeps its
   global copy theta_f and its own outer momentum (one outer optimizer per fragment).
2. Every H/F inner steps one fragment synchronizes, in turn 0, 1, ..., F-1, 0, ...: each
   fragment once every H steps, staggered by H/F (F = 1 is DiLoCo).
3. `delay` (tau) inner steps before that, the fragment's pseudo-gradient
   theta_f - theta_f,local is taken and its allreduce started (asynchronously): the
   network works while the next tau inner steps compute.
4. At the sync step, wait for it; the outer step (Nesterov, as DiLoCo) moves theta_f by the
   averaged pseudo-gradient; theta_f is saved; the parameters become
   lerp(theta_f, local, alpha) = theta_f + alpha (local - theta_f): with alpha = 0 the tau
   local steps taken meanwhile are dropped, alpha > 0 keeps part of them (the paper's mix).
5. `finish()`: complete an allreduce in flight, then sync (alpha 0) every fragment that still
   holds local steps, so every rank ends with the same parameters.

The pseudo-gradient travels in `wire_dtype` (fp16/bf16: a milder stand-in for the paper's
4-bit outer gradients) divided by N before the sum; torchft sums and then
divides, the same bits whenever N is a power of two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from syncedu.comm.runs import check_int
from syncedu.tuning.diloco import _WIRE, nesterov_step
from syncedu.tuning.local_sgd import broadcast_state, copy_flat


@dataclass(frozen=True)
class StreamingConfig:
    """The outer loop's settings (`strategy_config=` of `train.run("streaming_diloco")`)."""

    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    delay: int = 0  # tau: inner steps the allreduce overlaps with
    alpha: float = 0.0  # the share of the local parameters kept at a sync
    wire_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        check_int("delay", self.delay, 0)
        for name, ok, rule in (("outer_lr", self.outer_lr > 0, "> 0"),
                               ("outer_momentum", 0 <= self.outer_momentum < 1, "in [0, 1)"),
                               ("alpha", 0 <= self.alpha <= 1, "in [0, 1]"),
                               ("wire_dtype", self.wire_dtype in _WIRE, f"one of {_WIRE}")):
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} must be {rule}")


def layers(module: nn.Module) -> list[nn.Module]:
    """The modules that own trainable parameters directly, in order: what fragments cut."""
    return [m for m in module.modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def split(mods: list, fragments: int) -> list[list]:
    """Step 1's cut: `fragments` contiguous groups of layers, as even as rounding allows."""
    cut = [round(k * len(mods) / fragments) for k in range(fragments + 1)]
    return [mods[a:b] for a, b in zip(cut, cut[1:])]


def check_schedule(inner_steps, fragments, n_layers: int, delay: int = 0) -> None:
    """ValueError naming the parameter unless H, F and tau make a schedule (Steps 1-3)."""
    check_int("inner_steps", inner_steps)
    check_int("fragments", fragments)
    if fragments > n_layers:
        raise ValueError(f"fragments={fragments} must be <= the model's {n_layers} layers "
                         f"(a fragment is whole layers)")
    if inner_steps % fragments:
        raise ValueError(f"inner_steps={inner_steps} must be a multiple of fragments="
                         f"{fragments} (one fragment syncs every inner_steps/fragments steps)")
    if delay >= inner_steps // fragments:
        raise ValueError(f"delay={delay} must be < inner_steps/fragments = "
                         f"{inner_steps // fragments}: a fragment's allreduce must end before "
                         f"the next one starts")


class StreamingDiLoCo:
    """One rank's streaming DiLoCo around `module`; call `after_step()` after each
    `inner.step()` and `finish()` at the end."""

    def __init__(self, module: nn.Module, comm, inner, *, inner_steps: int, fragments: int = 1,
                 config: StreamingConfig | None = None):
        self.comm, self.inner, self.config = comm, inner, config or StreamingConfig()
        mods = layers(module)
        check_schedule(inner_steps, fragments, len(mods), self.config.delay)
        self.period = inner_steps // fragments
        broadcast_state(comm, module)  # Step 1
        self.fragments = [[p for m in group for p in m.parameters(recurse=False)
                           if p.requires_grad] for group in split(mods, fragments)]
        self.globals = [self._flat(f).clone() for f in range(fragments)]
        self.bufs = [torch.zeros_like(g) for g in self.globals]  # outer momentum per fragment
        self.dirty = [False] * fragments  # local steps since the fragment's last sync
        self.local_step, self.syncs, self.pending = 0, 0, None

    def _flat(self, f: int) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.fragments[f]).detach()

    def after_step(self) -> bool:
        """Steps 2-4 after one inner step; True if a fragment synchronized."""
        self.local_step += 1
        self.dirty = [True] * len(self.fragments)
        if self.local_step == self.period - self.config.delay:
            self.start(self.syncs % len(self.fragments))
        if self.local_step < self.period:
            return False
        self.complete()
        self.local_step = 0
        return True

    def start(self, f: int) -> None:
        """Step 3: fragment f's pseudo-gradient, its allreduce started."""
        delta = (self.globals[f] - self._flat(f)).to(self.config.wire_dtype)
        n = self.comm.world_size
        work = self.comm.all_reduce(delta.div_(n), async_op=True) if n > 1 else None
        self.pending = (f, delta, work)

    def complete(self, alpha: float | None = None) -> None:
        """Step 4: wait, outer step, save theta_f, mix with the local parameters."""
        cfg, (f, delta, work) = self.config, self.pending
        alpha = cfg.alpha if alpha is None else alpha
        if work is not None:
            work.wait()
        local = self._flat(f)
        nesterov_step(self.globals[f], self.bufs[f], delta.to(local.dtype), lr=cfg.outer_lr,
                      momentum=cfg.outer_momentum, nesterov=cfg.nesterov)
        copy_flat(self.fragments[f], torch.lerp(self.globals[f], local, alpha))
        self.dirty[f], self.pending = alpha > 0, None  # alpha 0: exactly theta_f again
        self.syncs += 1

    def finish(self) -> None:
        """Step 5: every rank ends with the same parameters."""
        if self.pending is not None:
            self.complete(alpha=0.0)
        for f in range(len(self.fragments)):
            if self.dirty[f]:
                self.start(f)
                self.complete(alpha=0.0)
