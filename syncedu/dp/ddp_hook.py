"""`torch.nn.parallel.DistributedDataParallel` with its gradient traffic in our ledger.

DDP allreduces its buckets itself, bypassing any `Comm`, so a comm hook (the
protocol of torch's `ddp_comm_hooks`) does the allreduce instead and:

1. charges the bucket to `comm.ledger` as a ring would send it, "modeled" (by formula, as
   `Comm.all_reduce` charges a built-in: Gloo and NCCL hide their messages);
2. starts `dist.all_reduce(bucket, async_op=True)` on the comm's process group;
3. when it completes, divides by the world size (DDP averages), records `(start, end,
   bytes)` for the timeline and, if the comm emulates a `Network`, first waits until
   the modeled ring time has passed (buckets queue behind each other on one link).

With a compressor, its own DDP hook averages the bucket through `comm` instead.
"""

from __future__ import annotations

import threading
import time

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from syncedu.comm.alphabeta import collective_time
from syncedu.comm.ledger import ring_allreduce_charge


def charge_ring_allreduce(comm, numel: int, element_size: int) -> None:
    """Charge `comm`'s ledger one ring allreduce by formula, for traffic that bypasses `comm`."""
    comm.ledger.record("all_reduce", kind="modeled",
                       **ring_allreduce_charge(numel, element_size, comm.world_size, comm.rank))


class CountingHookState:
    """What the hooks need: the comm, the event list, the emulated link, a compressor's hook."""

    def __init__(self, comm, inner=None):
        self.comm, self.inner = comm, inner  # inner: (state, hook) of a compressor, or None
        self.events: list[tuple[float, float, int]] = []
        self.link_free, self.lock = 0.0, threading.Lock()

    def due(self, start: float, nbytes: int) -> float:
        """When an emulated transfer started at `start` would end (0 without emulation)."""
        if self.comm.network is None:
            return 0.0
        with self.lock:
            begin = max(start, self.link_free)
            self.link_free = begin + collective_time("all_reduce", nbytes, self.comm.world_size,
                                                     self.comm.network)
            return self.link_free


def counting_hook(state: CountingHookState, bucket):
    """DDP comm hook: allreduce-average the bucket, charged to the ledger (no return
    annotation: DDP checks it, and `from __future__ import annotations` makes it a string)."""
    buf = bucket.buffer()
    charge_ring_allreduce(state.comm, buf.numel(), buf.element_size())  # Step 1
    start, nbytes = time.perf_counter(), buf.numel() * buf.element_size()
    due = state.due(start, nbytes)
    fut = dist.all_reduce(buf, group=getattr(state.comm, "group", None),  # Step 2
                          async_op=True).get_future()

    def done(f):  # Step 3
        time.sleep(max(0.0, due - time.perf_counter()))
        state.events.append((start, time.perf_counter(), nbytes))
        return f.value()[0].div_(state.comm.world_size)

    return fut.then(done)


def compressed_hook(state: CountingHookState, bucket):
    """DDP comm hook: the compressor's own hook (its ledger entries), timed for the timeline."""
    inner_state, inner = state.inner
    start, nbytes = time.perf_counter(), bucket.buffer().numel() * bucket.buffer().element_size()

    def done(f):
        state.events.append((start, time.perf_counter(), nbytes))
        return f.value()

    return inner(inner_state, bucket).then(done)


def wrap_ddp(module, comm, bucket_cap_mb: float = 25.0, hook: bool = True, compressor=None,
             broadcast_buffers: bool = True):
    """DDP around `module` on the comm's group, with the counting hook; returns (ddp, events).
    `hook=False` leaves DDP's own allreduce (faster by a Python call per bucket, but its
    traffic then reaches neither the ledger nor the timeline); `compressor`: a resolved one
    (`TrainConfig.compressor`, this rank's copy), whose own DDP hook then averages."""
    device_ids = [comm.device.index] if comm.device.type == "cuda" else None
    # Why DDP's first step is one bucket: without find_unused_parameters (or with
    # static_graph) it puts every gradient in a single bucket at first, then rebuilds the
    # buckets of `bucket_cap_mb` in the order the gradients became ready in that first
    # backward (torch 2.13, torch/nn/parallel/distributed.py:148-154,
    # BucketCapacityConfig.compute_bucket_size_limits). So a hook sees one big allreduce in
    # step 1 and the cap's buckets from step 2 on; a bucket closes once the cap is crossed.
    # gradient_as_bucket_view stays False (DDP's default): each .grad keeps its own memory
    # and the averaged bucket is copied back into it; True makes .grad a view of the bucket
    # (one copy and one gradient set less) but then .grad aliases what the hook sends.
    ddp = DistributedDataParallel(module, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb,
                                  process_group=getattr(comm, "group", None),
                                  broadcast_buffers=broadcast_buffers)
    state = CountingHookState(comm, None if compressor is None else compressor.ddp_hook(comm))
    if compressor is not None:
        ddp.register_comm_hook(state, compressed_hook)
    elif hook:
        ddp.register_comm_hook(state, counting_hook)
    return ddp, state.events
