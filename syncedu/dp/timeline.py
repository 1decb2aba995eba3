"""Step-time models, in one place: one training step on the alpha-beta model.

The collectives' seconds come from the formulas' one home, `comm/alphabeta.py` (which
`collectives.cost` hands on to the lessons); this file composes them into steps, for four
lessons:

- lesson 03, buckets overlapped with the backward (`schedule`, `step_time`);
- lesson 05, K micro-batches per allreduce (`accumulation_time`);
- lesson 09, scaling efficiency by model size (`overlap_step_time`, `comm_seconds`);
- lesson 10, ZeRO's stages with and without prefetch (`zero_step_time`, `gather_hides`).

The numbers are a lesson's choice, e.g. Goyal et al. 2017's ResNet-50: ~100 MB of
gradients, ~120 ms of backward. One data-parallel step (Li et al., VLDB 2020, Fig. 2):

1. forward takes `forward` seconds;
2. backward produces the gradients bucket by bucket (last layer first), each
   bucket's share of `backward` in proportion to its bytes;
3. a bucket's allreduce starts when its gradients are ready *and* the previous
   bucket's allreduce is done (one link), and lasts `collective_time`: a ring on
   the `Network`, 2(N-1)(alpha + S/(N B)), as in the emulator and the simulator;
4. without overlap all buckets go after backward; the optimizer step starts when
   the last allreduce ends (`step` seconds). An `overlap` share in between: the
   buckets are ready over the backward's last `overlap` share (lesson 09's model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from syncedu.comm.alphabeta import allreduce_time, collective_time
from syncedu.comm.network import Network
from syncedu.comm.runs import check_choice, check_int, check_number

# Backward costs about twice the forward (two matrix products per layer instead of one).
BACKWARD_SHARE = 2 / 3
# The share of the backward that hides communication unless a caller says otherwise.
DEFAULT_OVERLAP = 0.5
ZERO_MODES = ("dp", "zero1", "zero2", "zero3", "zero3_prefetch")


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
             backward: float, step: float = 0.0, overlap: bool | float = True,
             op: str = "all_reduce", itemsize: int = 4) -> Schedule:
    """Step 1-4: the timeline of one step with these bucket sizes (bytes, backward order);
    `overlap`: True (1), False (0) or the share of the backward that hides communication;
    `op`: each bucket's collective (ZeRO-1/2 reduce-scatter instead), of `itemsize` bytes."""
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
        dur = collective_time(op, b, world_size, network, itemsize=itemsize)
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
    one = collective_time("all_reduce", grad_bytes, world_size, network)
    return k * micro_compute + (k if sync_every else 1) * one


# ------------------------------------------------- lesson 09: efficiency by model size
def model_buckets(model_bytes: float, bucket_bytes: float | None) -> list[float]:
    """`model_bytes` in buckets of `bucket_bytes` (None: one bucket), the last one smaller."""
    if bucket_bytes is None:
        return [model_bytes]
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} must be > 0 (or None: one bucket)")
    k = max(1, math.ceil(model_bytes / bucket_bytes))
    return [bucket_bytes] * (k - 1) + [model_bytes - bucket_bytes * (k - 1)]


def comm_seconds(model_bytes: float, world_size: int, network: Network, *,
                 bucket_bytes: float | None = None) -> float:
    """Seconds of all the gradient (ring) allreduces of one step, back to back: one of the
    whole model, or one per bucket (each bucket pays the latency terms again)."""
    return sum(allreduce_time("ring", b, world_size, network)
               for b in model_buckets(model_bytes, bucket_bytes))


def overlap_step_time(model_bytes: float, compute_seconds: float, world_size: int,
                      network: Network, *, overlap: float = DEFAULT_OVERLAP,
                      bucket_bytes: float | None = None) -> float:
    """Seconds of one data-parallel step that computes `compute_seconds` (forward, then a
    backward of `BACKWARD_SHARE` of it) and allreduces `model_bytes` of gradients:

    1. backward time T_b = BACKWARD_SHARE * compute;
    2. without buckets (the fluid limit), a share `overlap` of the backward hides the
       communication: step = compute + max(0, T_comm - overlap * T_b);
    3. with buckets, `schedule`: a bucket is ready when the backward has produced its
       bytes (over its last `overlap` share) and buckets go one at a time, so tiny buckets
       are latency-bound and one huge bucket cannot overlap (Li et al., VLDB 2020)."""
    check_number("model_bytes", model_bytes, 0)
    if not compute_seconds > 0:
        raise ValueError(f"compute_seconds={compute_seconds!r} must be > 0")
    check_int("world_size", world_size)
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap={overlap!r} must be in [0, 1]")
    if world_size == 1:
        return compute_seconds
    backward = BACKWARD_SHARE * compute_seconds  # Step 1
    if bucket_bytes is None:  # Step 2
        t_comm = comm_seconds(model_bytes, world_size, network)
        return compute_seconds + max(0.0, t_comm - overlap * backward)
    return schedule(model_buckets(model_bytes, bucket_bytes), world_size, network,  # Step 3
                    forward=compute_seconds - backward, backward=backward,
                    overlap=overlap).seconds


# ------------------------------------------------------------- lesson 10: ZeRO's stages
def zero_step_time(mode: str, psi: float, layers: int, world_size: int, network,
                   forward_seconds: float, itemsize: int = 2, overlap: bool = False) -> float:
    """Seconds of one step in `mode` (`ZERO_MODES`): L equal layers, Psi parameters of
    `itemsize` bytes, forward compute F per step (backward 2F), N ranks; AG and RS of one
    layer's Psi/L, nothing overlapped unless said:

    1. data parallelism and ZeRO-1: t = 3F + RS(Psi) + AG(Psi); ZeRO-2 reduce-scatters
       layer by layer: t = 3F + L RS + AG(Psi);
    2. ZeRO-3 without prefetch, every layer waits for its all-gather twice:
       t = 3F + L (2 AG + RS);
    3. ZeRO-3 with prefetch (FSDP's): layer l+1's all-gather runs while layer l computes:
       t = AG + (L-1) max(F/L, AG) + F/L + AG + (L-1) max(2F/L, AG + RS) + 2F/L + RS;
    4. `overlap=True` (DP, ZeRO-1/2): what DDP and DeepSpeed's `overlap_comm` do, lesson 03's
       `schedule` with one bucket per layer: each layer's allreduce (DP) or reduce-scatter
       (ZeRO-1/2) starts when its gradients are ready and the previous one is done; ZeRO-1/2
       then all-gather the updated parameters, which nothing hides.
    """
    check_choice("mode", mode, ZERO_MODES)
    f, size, n = forward_seconds / check_int("layers", layers), psi * itemsize, world_size
    if n == 1:
        return 3 * forward_seconds
    ag = collective_time("all_gather", size / layers, n, network, itemsize=itemsize)
    rs = collective_time("reduce_scatter", size / layers, n, network, itemsize=itemsize)
    whole_ag = collective_time("all_gather", size, n, network, itemsize=itemsize)
    if overlap and mode in ("dp", "zero1", "zero2"):  # Step 4
        op = "all_reduce" if mode == "dp" else "reduce_scatter"  # ZeRO-1/2: + whole_ag
        return (op != "all_reduce") * whole_ag + schedule([size / layers] * layers, n, network,
            forward=forward_seconds, backward=2 * forward_seconds, op=op, itemsize=itemsize).seconds
    if mode in ("dp", "zero1"):  # Step 1
        return (3 * forward_seconds + whole_ag
                + collective_time("reduce_scatter", size, n, network, itemsize=itemsize))
    if mode == "zero2":
        return 3 * forward_seconds + layers * rs + whole_ag
    if mode == "zero3":  # Step 2
        return 3 * forward_seconds + layers * (2 * ag + rs)
    forward = ag + (layers - 1) * max(f, ag) + f  # Step 3
    backward = ag + (layers - 1) * max(2 * f, ag + rs) + 2 * f + rs
    return forward + backward


def gather_hides(psi: float, layers: int, world_size: int, network, forward_seconds: float,
                 itemsize: int = 2) -> bool:
    """Does one layer's all-gather fit in one layer's forward compute (prefetch hides it)?"""
    ag = collective_time("all_gather", psi * itemsize / layers, world_size, network,
                         itemsize=itemsize)
    return ag <= forward_seconds / layers
