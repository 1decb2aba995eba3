"""Top-k sparsification with error feedback: send only the k largest gradient entries.

Sources: Aji & Heafield 2017; Lin et al. 2018 (DGC); Stich et al. 2018 (the
residual is what makes it converge). Steps of `average_`, k = ceil(ratio * d):

1. a = g + e, this rank's residual added (error feedback);
2. select the k entries of largest |a|: values (fp32) and indices (int32);
3. keep what was not sent as the new residual (dropped without error feedback);
4. all-gather every rank's values and indices (the selections differ: no sum on
   the way): (N-1) k (4 + 4) bytes per rank, growing with N;
5. scatter-add all N selections into zeros and divide by N.

Round trip (a k/d-contraction, Stich et al. 2018): ||x - x'||^2 <= (1 - k/d) ||x||^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from syncedu.compress.base import Compressor, check_flags
from syncedu.dp.buckets import flatten, unflatten_


@dataclass(frozen=True)
class TopK(Compressor):
    """Send the `ratio` share of largest-magnitude entries per bucket (0 < ratio <= 1)."""

    ratio: float = 0.01
    error_feedback: bool = True
    name: ClassVar[str] = "topk"

    def __post_init__(self):
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)) \
                or not 0 < self.ratio <= 1:
            raise ValueError(f"ratio={self.ratio!r} must be a number in (0, 1]")
        check_flags(self, "error_feedback")

    def k(self, numel: int) -> int:
        """How many entries a bucket of `numel` sends (at least one)."""
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def compress(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, int32 indices) of the k largest |x| of flat `x`."""
        idx = x.abs().topk(self.k(x.numel()), sorted=False).indices
        return x[idx], idx.to(torch.int32)

    @staticmethod
    def decompress(values, indices, numel: int) -> torch.Tensor:
        """A dense tensor of `numel` zeros with `values` added at `indices` (duplicates sum)."""
        out = torch.zeros(numel, dtype=values.dtype, device=values.device)
        return out.index_add_(0, indices.long(), values)

    def average_(self, comm, tensors, key="bucket") -> None:
        tensors = list(tensors)
        if not tensors:
            return
        acc = flatten(tensors)
        if self.error_feedback:                               # Step 1
            acc = acc + self._residual_like(comm, key, acc)
        values, idx = self.compress(acc)                      # Step 2
        if self.error_feedback:                               # Step 3
            self._state[(key, comm.rank)] = acc.index_fill(0, idx.long(), 0)
        n = comm.world_size                                   # Step 4
        all_values = [torch.empty_like(values) for _ in range(n)]
        all_idx = [torch.empty_like(idx) for _ in range(n)]
        comm.all_gather(all_values, values)
        comm.all_gather(all_idx, idx)
        out = self.decompress(torch.cat(all_values), torch.cat(all_idx), acc.numel())  # Step 5
        unflatten_(tensors, out.div_(n))
