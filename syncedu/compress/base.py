"""The compressor protocol: one object that averages a bucket of gradients over all ranks.

Like Horovod's `Compression` (compress -> payload, decompress) and DDP's comm
hooks (one signature per strategy), each compressor in this package is a small
frozen dataclass with:

- `compress(x, ...)` / `decompress(...)`: the local transform, testable alone
  against its documented error bound;
- `average_(comm, tensors, key)`: the whole round trip on `comm`: compress,
  the collective the payload needs (allreduce for casts and PowerSGD, all-gather
  for top-k and signs), decompress, in place. The `Comm` ledger therefore
  records the bytes actually sent;
- `ddp_hook(comm=None)`: the same `average_` as a
  `DistributedDataParallel.register_comm_hook` hook, so one object runs under
  our bucketed data parallelism and under DDP.

State (error-feedback residuals, PowerSGD's warm-started Q) lives on the
compressor, keyed by `(key, comm.rank)`: simulated ranks are threads in one
process and must never share a buffer (DESIGN, "Traps already met").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One fp32-or-whatever flat copy of `tensors` (a bucket), in order."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy `flat` back into `tensors` (in place), the inverse of `flatten`."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


@dataclass(frozen=True)
class Compressor:
    """Base of every compressor: validation helpers, per-rank state and the DDP hook.

    Subclasses set `name` and implement `average_`.
    """

    name: ClassVar[str] = "compressor"
    # (key, rank) -> whatever the compressor keeps between steps; never module level.
    _state: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def average_(self, comm, tensors: list[torch.Tensor], key: str = "bucket") -> None:
        raise NotImplementedError

    def check(self, comm) -> None:
        """Raise before any traffic if this compressor cannot run on `comm`'s backend."""

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
        """The residual of bucket `key`, or zeros if it is new or changed size.

        DDP rebuilds its buckets after the first step, so a key can come back
        with other contents; a stale residual must not be added to them.
        """
        e = self._state.get((key, comm.rank))
        return e if e is not None and e.shape == like.shape else torch.zeros_like(like)

    def reset(self) -> None:
        """Forget every residual and warm start (e.g. before a new training run)."""
        self._state.clear()

    def ddp_hook(self, comm=None):
        """`(state, hook)` for `ddp.register_comm_hook(state, hook)`.

        `comm` is the `Comm` whose ledger should record the traffic (default: a
        `TorchComm` on the default process group). The hook averages the bucket
        with `average_` before returning a completed future: simpler than
        torch's chained futures, at the price of overlap inside one bucket.
        """
        if comm is None:
            from syncedu.comm.torch_comm import TorchComm
            comm = TorchComm()
        self.check(comm)
        return HookState(self, comm), ddp_comm_hook


@dataclass
class HookState:
    """What `ddp_comm_hook` needs: the compressor and the comm it sends on."""

    compressor: Compressor
    comm: object


def bucket_views(bucket) -> list[torch.Tensor]:
    """Per-parameter views into DDP's flat bucket buffer, shaped like the gradients."""
    buf = bucket.buffer()
    grads = bucket.gradients()
    parts = buf.split([g.numel() for g in grads])
    return [p.view(g.shape) for p, g in zip(parts, grads)]


def ddp_comm_hook(state: HookState, bucket):
    """DDP comm hook: average the bucket with the compressor; a done future of the buffer.

    No return annotation: DDP inspects it, and `from __future__ import
    annotations` would turn it into a string.
    """
    state.compressor.average_(state.comm, bucket_views(bucket), f"ddp{bucket.index()}")
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
