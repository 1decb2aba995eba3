"""Gradient compression: compressors that average gradients over ranks with fewer bytes.

The protocol is in base.py; the built-ins are `FP16`, `BF16` (cast.py), `TopK`
(topk.py), `SignSGD` and 1-bit Adam's `CompressedAllreduce` (sign.py) and `PowerSGD` (powersgd.py). Registering their
names here is what `compression="name"` means everywhere (train/compression.py).
"""

from __future__ import annotations

from syncedu.compress.base import Compressor
from syncedu.compress.cast import BF16, FP16, Cast, backend_refuses
from syncedu.compress.powersgd import PowerSGD
from syncedu.compress.sign import CompressedAllreduce, SignSGD
from syncedu.compress.topk import TopK
from syncedu.train.compression import COMPRESSORS, resolve

COMPRESSORS.update(fp16=FP16, bf16=BF16, topk=TopK, signsgd=SignSGD, powersgd=PowerSGD,
                   onebit=CompressedAllreduce)

__all__ = ["BF16", "COMPRESSORS", "CompressedAllreduce", "FP16", "Cast", "Compressor", "PowerSGD", "SignSGD", "TopK",
           "backend_refuses", "resolve"]
