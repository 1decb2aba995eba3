"""Per-parameter sharding along dim 0 (FSDP2's layout): one module's unit and its traffic.

FSDP1 (Zhao et al., VLDB 2023) cuts a unit's flat parameters in N, as `shards.Layout`;
FSDP2 (torch's `fully_shard`) gives every rank c = ceil(d0 / N) of each parameter's d0
rows (the last fewer, maybe none), a real tensor. A `RowUnit` pads shards to c rows:

1. `shard(i, full)`: this rank's rows [r c, min(d0, (r+1) c)) of a full tensor;
2. `unshard(comm, dtype)`: copy-in each padded shard (cast to `dtype`, FSDP2's param_dtype),
   one `comm.all_gather` for the whole unit, copy-out into full tensors;
3. `reduce(comm, grads)`: full fp32 gradients cut into the same padded pieces, one
   `comm.reduce_scatter(op="avg")`, and this rank's rows of the mean.
"""

from __future__ import annotations

import torch
from torch import nn


def rows(d0: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank's rows [lo, hi) of a dim-0 size `d0` (c = ceil(d0/N) each; the tail may be short)."""
    c = -(-d0 // world_size)
    return min(d0, rank * c), min(d0, (rank + 1) * c)


class RowUnit:
    """One module's sharded parameters (`names` in `module._parameters`)."""

    def __init__(self, module: nn.Module, names: list[str], shapes: list[torch.Size],
                 world_size: int, rank: int):
        self.module, self.names, self.shapes = module, names, shapes
        self.world_size, self.rank = world_size, rank
        self.rest = [s[1:].numel() for s in shapes]  # elements per row
        self.chunk = [-(-s[0] // world_size) * r for s, r in zip(shapes, self.rest)]
        self.offsets = [sum(self.chunk[:i]) for i in range(len(shapes))]
        self.size = sum(self.chunk)  # one rank's padded piece of the unit, in elements
        self.cache: list[torch.Tensor] | None = None  # re-gathered for backward
        self.accumulated: list[torch.Tensor] | None = None  # no_sync: whole fp32 gradients
        self.held_forward = 0  # bytes of the forward's gathered weights still held

    @property
    def shards(self) -> list[nn.Parameter]:
        return [self.module._parameters[n] for n in self.names]

    def shard(self, i: int, full: torch.Tensor) -> torch.Tensor:
        """Step 1 (a copy)."""
        lo, hi = rows(self.shapes[i][0], self.world_size, self.rank)
        return full[lo:hi].clone()

    def unshard(self, comm, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """Step 2: the unit's full parameters, gathered (and cast to `dtype`) in one collective."""
        shards = [s.detach() for s in self.shards]
        dtype = dtype or shards[0].dtype
        send = shards[0].new_zeros(self.size, dtype=dtype)
        for s, a in zip(shards, self.offsets):
            send[a: a + s.numel()] = s.reshape(-1)  # copy-in (cast), the tail padded with zeros
        outs = [torch.empty_like(send) for _ in range(self.world_size)]
        comm.all_gather(outs, send)
        return [torch.cat([o[a: a + chunk] for o in outs]).view(-1, *shape[1:])[: shape[0]]
                for shape, a, chunk in zip(self.shapes, self.offsets, self.chunk)]  # copy-out

    def reduce(self, comm, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Step 3: the mean over ranks of this rank's rows of `grads` (fp32, shards' shapes)."""
        n = self.world_size
        pieces = [grads[0].new_zeros(self.size, dtype=torch.float32) for _ in range(n)]
        for g, shape, a, rest in zip(grads, self.shapes, self.offsets, self.rest):
            flat = g.detach().to(torch.float32).reshape(-1)
            for j in range(n):
                lo, hi = rows(shape[0], n, j)
                pieces[j][a: a + (hi - lo) * rest] = flat[lo * rest: hi * rest]
        out = pieces[0].new_empty(self.size)
        comm.reduce_scatter(out, pieces, op="avg")
        return [out[a: a + s.numel()].view(s.shape).clone()  # this rank's rows: the shard's shape
                for s, a in zip(self.shards, self.offsets)]

