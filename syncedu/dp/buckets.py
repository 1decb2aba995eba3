"""Gradient buckets: the unit that travels while backward goes on.

PyTorch DDP (Li et al., VLDB 2020, section 3.2.3) does not allreduce each
gradient alone (one latency per tensor) nor all of them at the end (no overlap):
it packs gradients into buckets of about `bucket_cap_mb` (default 25 MB) in
*reverse* registration order, which is roughly the order backward produces
them, and starts a bucket's allreduce as soon as its last gradient is ready.

1. `build_buckets(params, cap_bytes)`: walk the parameters from last to first,
   add each to the open bucket and close the bucket once it holds `cap_bytes`
   or more (DDP's rule: the cap is crossed, then the bucket closes, so a layer's
   bias and weight stay together); a dtype or device change also starts a new
   bucket. Each bucket has one flat buffer and each parameter an offset in it.
2. during backward, `BucketedSync` (data_parallel.py) copies each gradient into
   its slice and, once a bucket is full, keeps its async allreduce in `bucket.work`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from syncedu.comm.base import Work

MB = 1024 * 1024


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
        return self.buffer.numel() * self.buffer.element_size()

    def views(self):
        """(parameter, its slice of the buffer shaped like the parameter)."""
        for p, off in zip(self.params, self.offsets):
            yield p, self.buffer[off:off + p.numel()].view_as(p)


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that need gradients, each shared parameter once, in module order."""
    seen, out = set(), []
    for p in module.parameters():  # parameters() already skips repeats of a tied tensor
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


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
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += p.numel()
    buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
    return Bucket(index, params, offsets, buffer)
