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

`resolve(spec)` (syncedu/train/compression.py, where this package registers
the names) turns what `compression=` accepts (None, "fp16", "bf16", a
registry name, or a compressor object) into a compressor or None.
"""

from __future__ import annotations

from syncedu.compress.base import (
    Compressor,
    HookState,
    bucket_views,
    ddp_comm_hook,
    flatten,
    unflatten_,
)
from syncedu.compress.cast import BF16, FP16, Cast, backend_refuses
from syncedu.compress.powersgd import PowerSGD
from syncedu.compress.sign import SignSGD, pack_signs, unpack_signs
from syncedu.compress.topk import TopK
from syncedu.train.compression import COMPRESSORS, resolve

# Name -> class; `resolve(name)` builds one with its default settings.
REGISTRY: dict[str, type[Compressor]] = {
    "fp16": FP16, "bf16": BF16, "topk": TopK, "signsgd": SignSGD, "powersgd": PowerSGD,
}
COMPRESSORS.update(REGISTRY)  # what `compression="name"` means everywhere


__all__ = ["BF16", "FP16", "REGISTRY", "Cast", "Compressor", "HookState", "PowerSGD",
           "SignSGD", "TopK", "backend_refuses", "bucket_views", "ddp_comm_hook", "flatten",
           "pack_signs", "resolve", "unflatten_", "unpack_signs"]
