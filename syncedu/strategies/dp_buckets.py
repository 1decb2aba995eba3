"""Gradient buckets, and a thread that allreduces them while backward goes on.

PyTorch DDP (Li et al., VLDB 2020, section 3.2.3) does not allreduce each
gradient alone (one latency per tensor) nor all of them at the end (no overlap):
it packs gradients into buckets of about `bucket_cap_mb` (default 25 MB) in
*reverse* registration order, which is roughly the order backward produces
them, and starts a bucket's allreduce as soon as its last gradient is ready.

1. `build_buckets(params, cap_bytes)`: walk the parameters from last to first,
   fill a bucket until it would exceed `cap_bytes` (one parameter alone may
   exceed it), start a new bucket when the dtype or device changes; each bucket
   has one flat buffer and each parameter an offset in it.
2. `CommThread`: one background thread per wrapper that runs the submitted
   `comm.all_reduce` calls one at a time, in submission order. `Comm.all_reduce`
   blocks; running it here lets the main thread go on with backward (Gloo and
   NCCL release the GIL while they move data). Every rank submits the buckets
   in the same order (bucket 0 first, see dp.py), so the collectives match.
3. Each submitted call gives a `ThreadWork`; `wait(timeout)` blocks until the
   call has finished and re-raises its error, if any.

Used in: notebooks/03_data_parallel, 05_gradient_accumulation.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from syncedu.comm.base import ThreadWork, Work

MB = 1024 * 1024


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""

    index: int
    params: list[nn.Parameter]
    offsets: list[int]
    buffer: torch.Tensor
    ready: int = 0  # gradients copied in during this backward
    work: Work | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def views(self):
        """(parameter, its slice of the buffer shaped like the parameter)."""
        for p, off in zip(self.params, self.offsets):
            yield p, self.buffer[off:off + p.numel()].view_as(p)


def build_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[Bucket]:
    """Step 1: group `params` (last to first) into buckets of at most ~`cap_bytes`."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket size must be > 0 bytes, got {cap_bytes}")
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        last = groups[-1][-1] if groups else None
        if (last is None or size + nbytes > cap_bytes or last.dtype != p.dtype
                or last.device != p.device):
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += nbytes
    return [_bucket(i, g) for i, g in enumerate(groups)]


def _bucket(index: int, params: list[nn.Parameter]) -> Bucket:
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += p.numel()
    buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
    return Bucket(index, params, offsets, buffer)


class CommThread:
    """Step 2: runs `comm.all_reduce(tensor, op)` calls in order, off the main thread.

    `events` collects `(start, end, nbytes)` in `time.perf_counter()` seconds for
    every finished call (the timeline of the communication).
    """

    def __init__(self, comm):
        self.comm = comm
        self.events: list[tuple[float, float, int]] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, tensor: torch.Tensor, op: str = "avg") -> ThreadWork:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"syncedu-dp-rank{self.comm.rank}")
            self._thread.start()
        work = ThreadWork("gradient allreduce")
        self._queue.put((tensor, op, work))
        return work

    def _loop(self) -> None:
        if self.comm.device.type == "cuda":  # the current device is per thread
            torch.cuda.set_device(self.comm.device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            tensor, op, work = item
            try:
                t0 = time.perf_counter()
                self.comm.all_reduce(tensor, op=op)
                nbytes = tensor.numel() * tensor.element_size()
                self.events.append((t0, time.perf_counter(), nbytes))
            except BaseException as e:  # surfaced by work.wait() on the main thread
                work.finish(e)
            else:
                work.finish()

    def close(self) -> None:
        """Stop the thread once the calls already submitted are done."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None
