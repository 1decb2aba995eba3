"""What overlapping gradient buckets with backward buys, on the alpha-beta model.

One data-parallel step (Li et al., VLDB 2020, Fig. 2; the numbers are a lesson's
choice, e.g. Goyal et al. 2017's ResNet-50: ~100 MB of gradients, ~120 ms of backward):

1. forward takes `forward` seconds;
2. backward produces the gradients bucket by bucket (last layer first), each
   bucket's share of `backward` in proportion to its bytes;
3. a bucket's allreduce starts when its gradients are ready *and* the previous
   bucket's allreduce is done (one link), and lasts `ring_seconds`: a ring on
   the `Network`, 2(N-1)(alpha + S/(N B)), as in the emulator and the simulator;
4. without overlap all buckets go after backward; the optimizer step starts when
   the last allreduce ends (`step` seconds). An `overlap` share in between: the
   buckets are ready over the backward's last `overlap` share (lesson 09's scaling model).
"""

from __future__ import annotations

from dataclasses import dataclass

from syncedu.comm.emulation import ring_seconds
from syncedu.comm.network import Network


@dataclass(frozen=True)
class Schedule:
    """Segments `(kind, start, end)` (kind: forward, backward, comm, step) and totals."""

    segments: list[tuple[str, float, float]]
    seconds: float
    compute: float
    comm: float

    @property
    def exposed_comm(self) -> float:
        """Step time not covered by compute: the communication nobody hid."""
        return self.seconds - self.compute


def bucket_sizes(total_bytes: int, cap_bytes: int) -> list[int]:
    """Split `total_bytes` into `cap_bytes` buckets (the last one smaller), like `build_buckets`."""
    if total_bytes <= 0 or cap_bytes <= 0:
        raise ValueError(f"total_bytes={total_bytes} and cap_bytes={cap_bytes} must be > 0")
    full, rest = divmod(total_bytes, cap_bytes)
    return [cap_bytes] * full + ([rest] if rest else [])


def schedule(buckets: list[int], world_size: int, network: Network, *, forward: float,
             backward: float, step: float = 0.0, overlap: bool | float = True) -> Schedule:
    """Step 1-4: the timeline of one step with these bucket sizes (bytes, backward order);
    `overlap`: True (1), False (0) or the share of the backward that hides communication."""
    if world_size < 1 or min(forward, backward, step) < 0 or not buckets:
        raise ValueError("world_size must be >= 1, times >= 0, and buckets non-empty")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap={overlap!r} must be True, False or in [0, 1]")
    total = sum(buckets)
    segs = [("forward", 0.0, forward)]
    t, link, comm_total = forward, 0.0, 0.0
    produced = []
    for b in buckets:  # Step 2
        dt = backward * b / total
        segs.append(("backward", t, t + dt))
        t += dt
        produced.append(t)
    end_backward = t
    for b, p in zip(buckets, produced):  # Step 3 (Step 4's share: ready over the last part)
        ready = p if overlap == 1 else end_backward - overlap * (end_backward - p)
        start = max(ready, link)
        dur = ring_seconds("all_reduce", b, world_size, network)
        comm_total += dur
        if dur:
            segs.append(("comm", start, start + dur))
        link = start + dur
    begin = max(end_backward, link)  # Step 4
    segs.append(("step", begin, begin + step))
    return Schedule(segs, begin + step, forward + backward + step, comm_total)


def step_time(buckets: list[int], world_size: int, network: Network, **kwargs) -> float:
    """Seconds of one step (see `schedule`)."""
    return schedule(buckets, world_size, network, **kwargs).seconds


def accumulation_time(k: int, world_size: int, network: Network, grad_bytes: int, *,
                      micro_compute: float, sync_every: bool = False) -> float:
    """Seconds per optimizer step with `k` micro-batches, without overlap: one allreduce per
    step with `no_sync`, one per micro-batch with `sync_every` (or the partial-`no_sync` bug)."""
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    one = ring_seconds("all_reduce", grad_bytes, world_size, network)
    return k * micro_compute + (k if sync_every else 1) * one
