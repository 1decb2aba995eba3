"""Gradient compression: compressors that average gradients over ranks with fewer bytes.

One protocol (base.py): `compress`/`decompress` for the local transform and
`average_(comm, tensors, key)` for the round trip on a `Comm` (so the ledger
records the bytes actually sent), plus `ddp_hook()` to run the same object
under `DistributedDataParallel`. The built-ins, each in its own file:

- `FP16`, `BF16` (cast.py): 16 bits on the wire, divide before the allreduce;
- `TopK(ratio, error_feedback=True)` (topk.py): values + indices by all-gather;
- `SignSGD(error_feedback=True)` (sign.py): EF-SignSGD, 1 bit per entry;
- `PowerSGD(rank, start_iter=..., error_feedback=True, warm_start=True)`
  (powersgd.py): rank-r factors of each matrix.

`resolve(spec)` turns what `compression=` accepts (None, "fp16", "bf16", a
registry name, or a compressor object) into a compressor or None.

Used in: notebooks/07_compression_and_precision.
"""

from __future__ import annotations

from .base import Compressor, HookState, bucket_views, ddp_comm_hook, flatten, unflatten_
from .cast import BF16, FP16, Cast, backend_refuses
from .powersgd import PowerSGD
from .sign import SignSGD, pack_signs, unpack_signs
from .topk import TopK

# Name -> class; `resolve(name)` builds one with its default settings.
REGISTRY: dict[str, type[Compressor]] = {
    "fp16": FP16, "bf16": BF16, "topk": TopK, "signsgd": SignSGD, "powersgd": PowerSGD,
}


def resolve(spec) -> Compressor | None:
    """None or "none" -> None; a registry name -> a fresh compressor; a compressor -> itself."""
    if spec is None or spec == "none":
        return None
    if isinstance(spec, Compressor):
        return spec
    if isinstance(spec, str) and spec in REGISTRY:
        return REGISTRY[spec]()
    raise ValueError(f"compression={spec!r} is not supported; use None, one of "
                     f"{sorted(REGISTRY)}, or a Compressor from syncedu.compress")


__all__ = ["BF16", "FP16", "REGISTRY", "Cast", "Compressor", "HookState", "PowerSGD",
           "SignSGD", "TopK", "backend_refuses", "bucket_views", "ddp_comm_hook", "flatten",
           "pack_signs", "resolve", "unflatten_", "unpack_signs"]
