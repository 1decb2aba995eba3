"""How long a ZeRO step takes on a network: the alpha-beta model with and without stage
3's prefetch, and the simulator that checks the modes without it (ours does not prefetch).

L equal layers, Psi parameters of `itemsize` bytes, forward compute F per step (backward
2F), N ranks; AG and RS of one layer's Psi/L (`step_time`):

1. data parallelism and ZeRO-1: t = 3F + RS(Psi) + AG(Psi); ZeRO-2 reduce-scatters layer
   by layer: t = 3F + L RS + AG(Psi);
2. ZeRO-3 without prefetch, every layer waits for its all-gather twice: t = 3F + L (2 AG + RS);
3. ZeRO-3 with prefetch (FSDP's): layer l+1's all-gather runs while layer l computes:
   t = AG + (L-1) max(F/L, AG) + F/L + AG + (L-1) max(2F/L, AG + RS) + 2F/L + RS.
   The gather hides when AG <= F/L (`hides`).

`simulate_step` runs our ZeRO (or "flat" DP, stage 0) on simulated ranks. The model cuts
every layer N ways (as `FullyShard`); our flat shards can put a whole layer on one rank,
whose ring gather passes it across N-1 links in turn, so on a bandwidth-bound link the
model is low by more than 2x (lesson 10 shows it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from syncedu.collectives.cost import collective_time
from syncedu.comm import sim
from syncedu.dp.data_parallel import DataParallel
from syncedu.train.sampling import check_int
from syncedu.zero.stages import ZeroDataParallel

MODES = ("dp", "zero1", "zero2", "zero3", "zero3_prefetch")


def step_time(mode: str, psi: float, layers: int, n: int, network, forward_seconds: float,
              itemsize: int = 2) -> float:
    """Seconds of one step in `mode` (see `MODES` and the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {MODES}")
    f, size = forward_seconds / check_int("layers", layers), psi * itemsize
    if n == 1:
        return 3 * forward_seconds
    ag = collective_time("all_gather", size / layers, n, network)
    rs = collective_time("reduce_scatter", size / layers, n, network)
    whole_ag = collective_time("all_gather", size, n, network)
    if mode in ("dp", "zero1"):  # Step 1
        return 3 * forward_seconds + collective_time("reduce_scatter", size, n, network) + whole_ag
    if mode == "zero2":
        return 3 * forward_seconds + layers * rs + whole_ag
    if mode == "zero3":  # Step 2
        return 3 * forward_seconds + layers * (2 * ag + rs)
    forward = ag + (layers - 1) * max(f, ag) + f  # Step 3
    backward = ag + (layers - 1) * max(2 * f, ag + rs) + 2 * f + rs
    return forward + backward


def hides(psi: float, layers: int, n: int, network, forward_seconds: float,
          itemsize: int = 2) -> bool:
    """Does one layer's all-gather fit in one layer's forward compute (prefetch hides it)?"""
    ag = collective_time("all_gather", psi * itemsize / layers, n, network)
    return ag <= forward_seconds / layers


def _charge(comm, seconds: float):
    """A forward hook: 1/3 of `seconds` after the layer's forward, 2/3 as its backward starts."""
    def hook(_m, _inputs, out):
        comm.compute(seconds / 3)
        if out.requires_grad:
            out.register_hook(lambda g: comm.compute(seconds * 2 / 3))
    return hook


def _worker(comm, stage: int, hidden: int, depth: int, seconds: float, steps: int):
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(depth)])
    wrapped = (DataParallel(net, comm, "flat") if stage == 0 else
               ZeroDataParallel(net, comm, stage=stage, lr=0.01))
    opt = wrapped if stage else torch.optim.SGD(net.parameters(), lr=0.01)
    # Charged after the wrapper's hooks, equal per layer (train's LayerCompute weighs
    # layers by their parameters, which stage 3 has freed by then).
    for layer in net:
        layer.register_forward_hook(_charge(comm, seconds / depth))
    comm.barrier()
    start = comm.now()
    for step in range(steps):
        opt.zero_grad()
        x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(step))
        F.mse_loss(wrapped(x), x).backward()
        wrapped.finish_gradient_synchronization()
        opt.step()
    return (comm.now() - start) / steps


def simulate_step(stage: int, world_size: int, *, network, hidden: int = 32, depth: int = 4,
                  forward_seconds: float = 1e-3, steps: int = 2) -> float:
    """Logical seconds of one step of our ZeRO `stage` (0: "flat" DP) on simulated ranks,
    `depth` Linear(hidden, hidden) layers each charging forward_seconds / depth (x2 back)."""
    res = sim.run(_worker, world_size, network=network,
                  args=(stage, hidden, depth, 3 * forward_seconds, steps))
    return max(res)
