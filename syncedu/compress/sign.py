"""SignSGD with error feedback (EF-SignSGD): one bit per gradient entry plus one scale.

Sources: Karimireddy et al. 2019 ("Error Feedback Fixes SignSGD and other
Gradient Compression Schemes", Algorithm 2: the scaled sign ||p||_1/d sign(p)
with the error kept locally). Bernstein et al. 2018 (signSGD) aggregate by
majority vote instead; without error feedback plain signSGD can stall or
diverge, which the lesson shows.

Steps of `average_` on one bucket of d elements:

1. add this rank's residual: p = g + e (error feedback);
2. compress: scale = ||p||_1 / d, and the signs of p packed 8 per byte
   (a zero counts as +);
3. keep the error: e = p - scale * sign(p) (dropped without error feedback);
4. all-gather every rank's packed signs and scale: (N-1) (ceil(d/8) + 4) bytes
   sent per rank in a ring, about 1/32 of fp32 per peer, growing with N;
5. average the N scaled signs.

Error bound of one round trip (Karimireddy et al. 2019, Lemma 8; equality here):
||x - decompress(compress(x))||^2 = (1 - ||x||_1^2 / (d ||x||_2^2)) ||x||^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from syncedu.compress.base import Compressor, flatten, unflatten_

_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Signs of flat `x` as bits (1 = non-negative), 8 per uint8, zero-padded."""
    bits = (x >= 0).to(torch.uint8)
    bits = torch.nn.functional.pad(bits, (0, (-bits.numel()) % 8))
    return (bits.view(-1, 8) * _BITS.to(x.device)).sum(1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """+1.0 / -1.0 for each of the first `numel` packed bits."""
    bits = (packed.unsqueeze(1) & _BITS.to(packed.device)) > 0
    return bits.view(-1)[:numel].float() * 2 - 1


@dataclass(frozen=True)
class SignSGD(Compressor):
    """Scaled sign per bucket; `error_feedback=False` is plain (scaled) signSGD."""

    error_feedback: bool = True
    name: ClassVar[str] = "signsgd"

    def __post_init__(self):
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback={self.error_feedback!r} must be True or False")

    @staticmethod
    def compress(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed signs, scale ||x||_1 / d as a 1-element fp32 tensor)."""
        return pack_signs(x), (x.abs().sum() / x.numel()).reshape(1).float()

    @staticmethod
    def decompress(packed, scale, numel: int) -> torch.Tensor:
        return unpack_signs(packed, numel) * scale

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
