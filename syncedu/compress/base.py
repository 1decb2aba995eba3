"""The compressor protocol: one object that averages a bucket of gradients over all ranks.

Like Horovod's `Compression` and DDP's comm hooks: `compress`/`decompress` (the
local transform), `average_(comm, tensors, key)` (the round trip on `comm`, so
its ledger records the bytes sent) and `ddp_hook()` (the same under DDP). State
is keyed by `(key, comm.rank)`: simulated ranks are threads of one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from syncedu.comm.runs import check_bool
from syncedu.train.compression import GradientCompressor


def check_flags(obj, *names: str) -> None:
    """Raise unless each attribute `names` of `obj` is a bool."""
    for name in names:
        check_bool(name, getattr(obj, name))


@dataclass(frozen=True)
class Compressor(GradientCompressor):
    """Base of every compressor: the protocol's defaults (train/compression.py), per-rank state,
    the DDP hook; subclasses implement `average_`."""

    name: ClassVar[str] = "compressor"
    # (key, rank) -> whatever the compressor keeps between steps; never module level.
    _state: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def state(self, comm, key: str, make):
        """This rank's state for bucket `key`, created by `make()` the first time."""
        k = (key, comm.rank)
        if k not in self._state:
            self._state[k] = make()
        return self._state[k]

    def residual(self, comm, key: str = "bucket") -> torch.Tensor | None:
        """This rank's error-feedback residual ("bank balance") for bucket `key`, if any."""
        return self._state.get((key, comm.rank))

    def _residual_like(self, comm, key: str, like: torch.Tensor) -> torch.Tensor:
        """The residual of bucket `key`, or zeros if new or resized (DDP rebuilds buckets)."""
        e = self._state.get((key, comm.rank))
        return e if e is not None and e.shape == like.shape else torch.zeros_like(like)

    def reset(self) -> None:
        """Forget every residual and warm start (e.g. before a new training run)."""
        self._state.clear()

    def ddp_hook(self, comm=None):
        """`(state, hook)` for `ddp.register_comm_hook`; `comm` (default `TorchComm()`) sends."""
        if comm is None:
            from syncedu.comm.torch_comm import TorchComm
            comm = TorchComm()
        self.check(comm)
        return (self, comm), ddp_comm_hook


def ddp_comm_hook(state, bucket):
    """DDP comm hook on `state` = (compressor, comm): average the bucket, return a done future.

    It averages views of DDP's bucket buffer; a done future is simpler than torch's chained
    ones, less overlap in a bucket. No return annotation: DDP inspects it (a string here).
    """
    compressor, comm = state
    grads = bucket.gradients()
    parts = bucket.buffer().split([g.numel() for g in grads])
    compressor.average_(comm, [p.view(g.shape) for p, g in zip(parts, grads)],
                        f"ddp{bucket.index()}")
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
