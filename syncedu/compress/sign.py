"""SignSGD with error feedback (EF-SignSGD): one bit per gradient entry plus one scale.

Source: Karimireddy et al. 2019, Algorithm 2; without error feedback signSGD can stall.
Steps of `average_` on one bucket of d elements:

1. p = g + e, this rank's residual added (error feedback);
2. compress: scale = ||p||_1 / d, and the signs of p packed 8 per byte (0 counts as +);
3. keep the error e = p - scale * sign(p) (dropped without error feedback);
4. all-gather every rank's signs and scale: (N-1) (ceil(d/8) + 4) bytes per rank;
5. average the N scaled signs.

Round trip (ibid., Lemma 8, equality): ||x - x'||^2 = (1 - ||x||_1^2 / (d ||x||_2^2)) ||x||^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from syncedu.compress.base import Compressor, check_flags, flatten, unflatten_

_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


@dataclass(frozen=True)
class SignSGD(Compressor):
    """Scaled sign per bucket; `error_feedback=False` is plain (scaled) signSGD."""

    error_feedback: bool = True
    name: ClassVar[str] = "signsgd"

    def __post_init__(self):
        check_flags(self, "error_feedback")

    @staticmethod
    def compress(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(signs of flat `x`, 1 = non-negative, 8 bits per uint8; scale ||x||_1 / d in fp32)."""
        bits = torch.nn.functional.pad((x >= 0).to(torch.uint8), (0, (-x.numel()) % 8))
        packed = (bits.view(-1, 8) * _BITS.to(x.device)).sum(1, dtype=torch.uint8)
        return packed, (x.abs().sum() / x.numel()).reshape(1).float()

    @staticmethod
    def decompress(packed, scale, numel: int) -> torch.Tensor:
        """+-`scale` per element from the packed sign bits (the first `numel` of them)."""
        bits = (packed.unsqueeze(1) & _BITS.to(packed.device)) > 0
        return (bits.view(-1)[:numel].float() * 2 - 1) * scale

    def average_(self, comm, tensors, key="bucket") -> None:
        tensors = list(tensors)
        if not tensors:
            return
        p = flatten(tensors)
        if self.error_feedback:                               # Step 1
            p = p + self._residual_like(comm, key, p)
        packed, scale = self.compress(p)                      # Step 2
        if self.error_feedback:                               # Step 3
            self._state[(key, comm.rank)] = p - self.decompress(packed, scale, p.numel())
        n = comm.world_size                                   # Step 4
        all_packed = [torch.empty_like(packed) for _ in range(n)]
        all_scales = [torch.empty_like(scale) for _ in range(n)]
        comm.all_gather(all_packed, packed)
        comm.all_gather(all_scales, scale)
        out = sum(self.decompress(b, s, p.numel()) for b, s in zip(all_packed, all_scales))
        unflatten_(tensors, out.div_(n).to(p.dtype))          # Step 5
