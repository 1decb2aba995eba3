"""Gradient buckets, DDP's unit of overlap (Li et al., VLDB 2020, section 3.2.3).

1. `build_buckets(params, cap_bytes)`: walk the parameters from last to first (roughly
   the order backward produces their gradients), add each to the open bucket and close
   it once it holds `cap_bytes` or more (DDP's rule: the cap is crossed, then the bucket
   closes, so a layer's bias and weight stay together); a dtype or device change also
   starts a new bucket. Each bucket has one flat buffer, each parameter an offset in it.
2. during backward, `BucketedSync` (data_parallel.py) fills the slices and starts a full
   bucket's allreduce, kept in `bucket.work`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch
from torch import nn

from syncedu.comm.base import Work

MB = 1024 * 1024


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One flat copy of `tensors` (a bucket), in order: lesson 03's flat buffer, which
    `FlatSync`, the compressors, ZeRO and local SGD all fill the same way."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy `flat` back into `tensors` (in place), the inverse of `flatten`."""
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""

    index: int
    params: list[nn.Parameter]
    offsets: list[int]
    buffer: torch.Tensor
    ready: int = 0  # gradients copied in during this backward
    work: Work | None = field(default=None, repr=False)  # the allreduce in flight
    started: float = 0.0  # perf_counter() when it was launched

    @property
    def nbytes(self) -> int:
        """Bytes of the bucket's flat gradient buffer (what one allreduce sends)."""
        return self.buffer.numel() * self.buffer.element_size()

    def views(self):
        """(parameter, its slice of the buffer shaped like the parameter)."""
        for p, off in zip(self.params, self.offsets):
            yield p, self.buffer[off:off + p.numel()].view_as(p)


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that need gradients, each shared parameter once, in module order."""
    return [p for p in module.parameters() if p.requires_grad]  # parameters() skips repeats


def build_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[Bucket]:
    """Step 1: group `params` (last to first) into buckets closed once they reach `cap_bytes`."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket size must be > 0 bytes, got {cap_bytes}")
    groups: list[list[nn.Parameter]] = []
    size, closed = 0, True
    for p in reversed(params):
        last = groups[-1][-1] if groups else None
        if closed or last.dtype != p.dtype or last.device != p.device:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.numel() * p.element_size()
        closed = size >= cap_bytes
    return [_bucket(i, g) for i, g in enumerate(groups)]


def _bucket(index: int, params: list[nn.Parameter]) -> Bucket:
    offsets = [0, *accumulate(p.numel() for p in params)]
    buffer = torch.zeros(offsets[-1], dtype=params[0].dtype, device=params[0].device)
    return Bucket(index, params, offsets[:-1], buffer)
