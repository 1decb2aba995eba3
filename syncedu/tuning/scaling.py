"""Scaling efficiency from the alpha-beta model: one step = compute + exposed communication.

A data-parallel step computes for `compute_seconds` (forward, then backward,
the backward being `BACKWARD_SHARE` of it) and allreduces `model_bytes` of
gradients (`cost.allreduce_time`: Thakur, Rabenseifner & Gropp 2005; Patarasuk
& Yuan 2009). Communication that runs while the backward still computes is
hidden; only the rest is *exposed*. Scaling efficiency is then

    efficiency = compute / (compute + exposed)

the throughput of N ranks over N times that of one (the convention of
Horovod's and PyTorch DDP's benchmarks). Steps of `step_time`:

1. backward time T_b = BACKWARD_SHARE * compute;
2. communication: one allreduce of the whole model, or one per bucket of
   `bucket_bytes` (each bucket pays the latency terms again);
3. exposed time. Without buckets (the fluid limit of many small buckets), a
   fraction `overlap` of the backward hides communication:
   exposed = max(0, T_comm - overlap * T_b). With buckets, bucket i of k is
   ready when the backward has produced it (spread over the last `overlap`
   share of the backward; overlap 0: all at the end), buckets go one at a
   time, and exposed = (when the last one is done) - T_b. So tiny buckets are
   latency-bound and one huge bucket cannot overlap: the shape of Li et al.'s
   bucket-size curve (PyTorch DDP, VLDB 2020).

`published_comparisons()` feeds this model the inputs of published scaling
results (parameter counts, published per-GPU step times, the clusters'
networks) and puts the prediction beside the published efficiency;
`recommend()` ranks tuning options by predicted efficiency.
"""

from __future__ import annotations

import math

from syncedu.collectives import cost
from syncedu.comm.network import Network

# Also `Comparison`, `published_comparisons`, `Option`, `recommend` (loaded on first use).
__all__ = ["BACKWARD_SHARE", "DEFAULT_OVERLAP", "step_time", "efficiency", "relative_efficiency",
           "comm_seconds", "best_bucket"]

# Backward costs about twice the forward (two matrix products per layer instead of one).
BACKWARD_SHARE = 2 / 3
# The share of the backward that hides communication unless a caller says otherwise.
DEFAULT_OVERLAP = 0.5


def _check(model_bytes, compute_seconds, world_size, overlap) -> None:
    if not model_bytes >= 0:
        raise ValueError(f"model_bytes={model_bytes!r} must be >= 0")
    if not compute_seconds > 0:
        raise ValueError(f"compute_seconds={compute_seconds!r} must be > 0")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap={overlap!r} must be in [0, 1]")


def _buckets(model_bytes: float, bucket_bytes: float | None) -> list[float]:
    if bucket_bytes is None:
        return [model_bytes]
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} must be > 0 (or None: one bucket)")
    k = max(1, math.ceil(model_bytes / bucket_bytes))
    return [bucket_bytes] * (k - 1) + [model_bytes - bucket_bytes * (k - 1)]


def comm_seconds(model_bytes: float, world_size: int, network: Network, *,
                 algorithm: str = "ring", bucket_bytes: float | None = None) -> float:
    """Step 2: seconds of all the gradient allreduces of one step, back to back."""
    return sum(cost.allreduce_time(algorithm, b, world_size, network)
               for b in _buckets(model_bytes, bucket_bytes))


def step_time(model_bytes: float, compute_seconds: float, world_size: int, network: Network, *,
              algorithm: str = "ring", overlap: float = DEFAULT_OVERLAP,
              bucket_bytes: float | None = None) -> float:
    """Seconds of one data-parallel step (see the module docstring's steps)."""
    _check(model_bytes, compute_seconds, world_size, overlap)
    if world_size == 1:
        return compute_seconds
    backward = BACKWARD_SHARE * compute_seconds  # Step 1
    if bucket_bytes is None:  # Step 3, fluid limit
        t_comm = comm_seconds(model_bytes, world_size, network, algorithm=algorithm)
        return compute_seconds + max(0.0, t_comm - overlap * backward)
    sizes = _buckets(model_bytes, bucket_bytes)  # Step 2
    k, done = len(sizes), 0.0
    for i, size in enumerate(sizes, start=1):  # Step 3, one bucket at a time
        ready = backward * (1 - overlap) + backward * overlap * i / k
        done = max(done, ready) + cost.allreduce_time(algorithm, size, world_size, network)
    return compute_seconds + max(0.0, done - backward)


def efficiency(model_bytes: float, compute_seconds: float, world_size: int, network: Network, *,
               algorithm: str = "ring", overlap: float = DEFAULT_OVERLAP,
               bucket_bytes: float | None = None) -> float:
    """Scaling efficiency compute / step time (1.0 on one rank)."""
    return compute_seconds / step_time(model_bytes, compute_seconds, world_size, network,
                                       algorithm=algorithm, overlap=overlap,
                                       bucket_bytes=bucket_bytes)


def relative_efficiency(model_bytes: float, compute_seconds: float, base: tuple[int, Network],
                        target: tuple[int, Network], **options) -> float:
    """Efficiency at `target` (world size, network) relative to `base` (e.g. 8 -> 256 GPUs)."""
    return (efficiency(model_bytes, compute_seconds, *target, **options)
            / efficiency(model_bytes, compute_seconds, *base, **options))


def best_bucket(model_bytes: float, compute_seconds: float, world_size: int, network: Network,
                candidates=(2 ** 18, 2 ** 20, 4 * 2 ** 20, 25 * 2 ** 20, 100 * 2 ** 20),
                **options) -> tuple[float, float]:
    """(bucket_bytes, efficiency) of the best of `candidates` (the first on a tie)."""
    effs = [(b, efficiency(model_bytes, compute_seconds, world_size, network, bucket_bytes=b,
                           **options)) for b in candidates]
    return max(effs, key=lambda be: (round(be[1], 12), -be[0]))
