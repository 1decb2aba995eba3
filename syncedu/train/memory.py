"""Where a rank's memory goes: model state measured on a real module, activations,
and the ZeRO paper's formulas to extrapolate.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, Section 3.1 and Figure 1: mixed-precision Adam keeps
2 bytes of fp16 parameters, 2 of fp16 gradients and K = 12 of optimizer state
per parameter. Per rank, with N ranks and Psi parameters (`bytes_per_rank`):

| stage          | parameters | gradients | optimizer state |
|----------------|------------|-----------|-----------------|
| 0 (plain DP)   | 2 Psi      | 2 Psi     | K Psi           |
| 1 (P_os)       | 2 Psi      | 2 Psi     | K Psi / N       |
| 2 (P_os+g)     | 2 Psi      | 2 Psi / N | K Psi / N       |
| 3 (P_os+g+p)   | 2 Psi / N  | 2 Psi / N | K Psi / N       |
"""

from __future__ import annotations

import torch
from torch import nn

from syncedu.comm.runs import check_int, check_number

GB = 1e9  # the paper's GB: 7.5e9 parameters x 16 bytes = 120 GB
MIXED_ADAM = {"params": 2, "grads": 2, "optimizer": 12}  # bytes per parameter, K = 12
FP32 = {"sgd": {"params": 4, "grads": 4, "optimizer": 4},  # this course: momentum buffer
        "adam": {"params": 4, "grads": 4, "optimizer": 8}}  # exp_avg, exp_avg_sq
# Table 1 of Rajbhandari et al. 2020 (the case Figure 1 draws), per GPU.
PAPER = {"psi": 7.5e9, "n": 64, "bytes_per_param": 16, "baseline_gb": 120.0,
         "figure1_gb": {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.88}}
STAGES = (0, 1, 2, 3)
KINDS = ("params", "grads", "optimizer")  # the three parts of model state


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (None and empty count 0)."""
    seen: dict[int, int] = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard
        if t is None or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def state_bytes(optimizer) -> int:
    """Bytes of the tensors in `optimizer.state` (moments, momenta, step counters)."""
    return held_bytes(t for s in optimizer.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor))


def model_state_bytes(module: nn.Module, optimizer=None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state held now, and their total."""
    params = list(module.parameters())
    out = {"params": held_bytes(p.data for p in params),
           "grads": held_bytes(p.grad for p in params),
           "optimizer": 0 if optimizer is None else state_bytes(optimizer)}
    out["total"] = sum(out.values())
    return out


def activation_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves during `module(x)` (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:  # weights are model state, not activations
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(saved.values())


def bytes_per_rank(psi: float, n: int, stage: int, per_param: dict | None = None) -> dict:
    """Model-state bytes per rank for `psi` parameters on `n` ranks at `stage` (0-3);
    `per_param` defaults to the paper's `MIXED_ADAM`."""
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is unknown; choose one of {STAGES} (0: plain DP)")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be an int >= 1")
    check_number("psi", psi, 0)
    b = per_param or MIXED_ADAM
    sharded = {"optimizer": stage >= 1, "grads": stage >= 2, "params": stage >= 3}
    out = {k: psi * b[k] / (n if sharded[k] else 1) for k in KINDS}
    out["total"] = sum(out.values())
    return out


def working_set_bytes(psi: float, layers: int, stage: int, per_param: dict | None = None,
                      prefetch: bool = True) -> float:
    """Bytes a rank holds beyond its shards while one of `layers` equal layers computes its
    backward at `stage` (stages 0-1 hold everything anyway: 0): the layer's gradient (stages
    2-3), its gathered parameters and, with `prefetch`, the next layer's (stage 3)."""
    b, layer = per_param or MIXED_ADAM, psi / check_int("layers", layers)
    return layer * ((stage >= 2) * b["grads"] + (stage == 3) * (1 + prefetch) * b["params"])


def table(psi: float, world_sizes, per_param: dict | None = None) -> list[dict]:
    """`bytes_per_rank` totals in GB for every stage and world size, one row per size."""
    return [{"n": n, **{f"stage{s}": bytes_per_rank(psi, n, s, per_param)["total"] / GB
                        for s in STAGES}} for n in world_sizes]
