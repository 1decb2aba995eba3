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

`simulate_step` runs our ZeRO (or "flat" DP, stage 0) through `train.run` on simulated
ranks. Lesson 10 shows where the two part: the model cuts every layer N ways, our flat
shards may put a whole layer on one rank; and the model makes every rank wait out every
collective, which the simulated ranks do not.
"""

from __future__ import annotations

from syncedu.collectives.cost import collective_time
from syncedu.train import harness
from syncedu.train.sampling import check_int

MODES = ("dp", "zero1", "zero2", "zero3", "zero3_prefetch")


def step_time(mode: str, psi: float, layers: int, n: int, network, forward_seconds: float,
              itemsize: int = 2) -> float:
    """Seconds of one step in `mode` (see `MODES` and the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {MODES}")
    f, size = forward_seconds / check_int("layers", layers), psi * itemsize
    if n == 1:
        return 3 * forward_seconds
    ag = collective_time("all_gather", size / layers, n, network, itemsize=itemsize)
    rs = collective_time("reduce_scatter", size / layers, n, network, itemsize=itemsize)
    whole_ag = collective_time("all_gather", size, n, network, itemsize=itemsize)
    if mode in ("dp", "zero1"):  # Step 1
        return (3 * forward_seconds + whole_ag
                + collective_time("reduce_scatter", size, n, network, itemsize=itemsize))
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
    ag = collective_time("all_gather", psi * itemsize / layers, n, network, itemsize=itemsize)
    return ag <= forward_seconds / layers


def simulate_step(stage: int, world_size: int, *, network, depth: int = 4,
                  forward_seconds: float = 1e-3, steps: int = 2) -> float:
    """Logical seconds of one step (the slowest rank's mean) of our ZeRO `stage` (0: "flat"
    DP) in `train.run` on simulated ranks: its MLP as `depth` equal Linear(64, 64) layers (64
    outputs for the 10 digits), each charging forward_seconds / depth after its forward and
    twice that in its backward (after stage 3's all-gather)."""
    history = harness.run("flat" if stage == 0 else f"zero{stage}", world_size, steps=steps,
                          global_batch=4 * world_size, lr=0.01, simulate=True, network=network,
                          model_kwargs={"hidden": 64, "classes": 64, "depth": depth - 1},
                          compute_seconds=3 * forward_seconds)
    return max(sum(seconds) for seconds in history.rank_step_seconds) / steps  # the slowest
