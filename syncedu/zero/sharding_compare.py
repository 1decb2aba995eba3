"""Flat sharding (FSDP1, DeepSpeed ZeRO) against per-parameter sharding (FSDP2), per layer.

Flat: all parameters end to end in one buffer cut in N contiguous shards
(`zero_shards.Layout`, as ZeroDataParallel does; FSDP1 flattens one unit,
DeepSpeed the whole model). A layer is a slice of that buffer, so it lies in
one or two ranks' shards: its all-gather is sent by those ranks alone, the
others idle. Per parameter (`fully_shard_units.rows`): every parameter gives
every rank ceil(d0 / N) rows, so every rank sends about 1/N of every layer.

`spread(module, world_size)`: one row per layer that owns parameters, with
the elements each rank holds of it under both layouts; `max_share` is the
largest rank's fraction of the layer (1/N is perfectly even).

Used in: notebooks/10_sharded_data_parallel; tests/zero/test_fully_shard.py.
"""

from __future__ import annotations

from torch import nn

from syncedu.zero.shards import Layout, layer_units

from .fully_shard_units import rows


def spread(module: nn.Module, world_size: int, split: str = "uneven") -> list[dict]:
    """Per layer: {"layer", "numel", "flat": [elements per rank], "per_param": [...],
    "flat_max_share", "per_param_max_share"} (see the module docstring)."""
    units = layer_units(module, "layer")
    layout = Layout(units[-1].b, world_size, split)
    out = []
    for u in units:
        flat = [hi - lo for lo, hi in layout.ranges(u.a, u.b)]
        per_param = [0] * world_size
        for shape in u.shapes:
            if len(shape) == 0:  # a scalar cannot be cut: every rank keeps it
                per_param = [k + 1 for k in per_param]
                continue
            for r in range(world_size):
                lo, hi = rows(shape[0], world_size, r)
                per_param[r] += (hi - lo) * shape[1:].numel()
        numel = u.b - u.a
        out.append({"layer": u.name, "numel": numel, "flat": flat, "per_param": per_param,
                    "flat_max_share": max(flat) / numel,
                    "per_param_max_share": max(per_param) / numel})
    return out
