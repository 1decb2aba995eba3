"""Casting compression: send the gradients in 16 bits (fp16 or bf16), half the bytes.

Source: Horovod's `Compression.fp16`; DDP's `fp16_compress_hook` (default_hooks.py).
Steps of `average_`:

1. divide by N in fp32, *before* the allreduce: a sum of N fp16 values can pass
   65504 and become inf, their average cannot (pytorch#57410);
2. cast to 16 bits (compress);
3. allreduce (sum) in 16 bits: 2 bytes per element on the wire instead of 4;
4. cast back to the gradients' dtype and copy into them (decompress).

Round trip: |x - decompress(compress(x))| <= u |x|, u = 2^-11 (fp16), 2^-8 (bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from syncedu.compress.base import Compressor, check_flags
from syncedu.dp.buckets import flatten, unflatten_


@dataclass(frozen=True)
class Cast(Compressor):
    """Allreduce in a 16-bit dtype. `divide_first=False` shows the overflow (don't use it)."""

    divide_first: bool = True
    dtype: ClassVar[torch.dtype] = torch.float16
    unit_roundoff: ClassVar[float] = 2.0 ** -11

    def __post_init__(self):
        check_flags(self, "divide_first")

    def compress(self, x: torch.Tensor) -> torch.Tensor:
        """The tensor in the wire dtype (fp16 or bf16): half the bytes of fp32."""
        return x.to(self.dtype)

    @staticmethod
    def decompress(payload: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Back to the dtype of `like` (the wire's rounding stays)."""
        return payload.to(like.dtype)

    def check(self, comm) -> None:
        """Raise `RuntimeError` if this backend cannot reduce the wire dtype (Gloo and bf16)."""
        why = backend_refuses(self.dtype, comm)
        if why:
            raise RuntimeError(f"compression={self.name!r} cannot run here: {why}")

    def average_(self, comm, tensors, key="bucket") -> None:
        self.check(comm)  # before any traffic
        tensors = list(tensors)
        if not tensors:
            return
        flat = flatten(tensors)
        n = comm.world_size
        if self.divide_first:
            flat = flat / n                                   # Step 1
        wire = self.compress(flat)                            # Step 2
        comm.all_reduce(wire)                                 # Step 3
        out = self.decompress(wire, flat)                     # Step 4
        if not self.divide_first:
            out = out / n
        unflatten_(tensors, out)


@dataclass(frozen=True)
class FP16(Cast):
    """Gradients on the wire in IEEE half precision (5 exponent bits: overflow above 65504)."""

    name: ClassVar[str] = "fp16"


@dataclass(frozen=True)
class BF16(Cast):
    """Gradients on the wire in bfloat16 (fp32's 8 exponent bits, 8 significant bits)."""

    name: ClassVar[str] = "bf16"
    dtype: ClassVar[torch.dtype] = torch.bfloat16
    unit_roundoff: ClassVar[float] = 2.0 ** -8


def backend_refuses(dtype: torch.dtype, comm) -> str:
    """Why `comm`'s backend cannot allreduce `dtype` ("" when it can; Gloo on CPU can both)."""
    if dtype == torch.bfloat16 and getattr(comm, "backend", "") == "nccl":
        version = torch.cuda.nccl.version() if torch.cuda.is_available() else (0,)
        if tuple(version) < (2, 10):
            return f"NCCL {version} has no bfloat16 allreduce (needs NCCL >= 2.10); use 'fp16'"
    return ""


def fp16_sum_average(values, predivide: float) -> float:
    """Average `values` (one per rank) the way an fp16 allreduce with a predivide does.

    Like Horovod's `gradient_predivide_factor` (FSDP: sqrt(N) before, sqrt(N) after):
    1. each rank casts its value to fp16 and divides it by `predivide`, in fp16;
    2. the values are summed in fp16 (in rank order, as a ring would pass them on);
    3. the sum is divided by N / `predivide`, in fp16.
    """
    if not values:
        raise ValueError("values must hold one number per rank (got none)")
    if not predivide > 0:
        raise ValueError(f"predivide={predivide!r} must be > 0")
    acc = torch.zeros((), dtype=torch.float16)
    for v in values:                                                      # Step 1, 2
        acc = acc + torch.tensor(v, dtype=torch.float16) / predivide
    return (acc / (len(values) / predivide)).item()                       # Step 3
