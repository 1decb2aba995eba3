"""Scaling efficiency from the alpha-beta model, and the tuning advice drawn from it.

Efficiency = compute / step time, the throughput of N ranks over N times that of one
(Horovod's and PyTorch DDP's benchmark convention). The step time is the course's one
step-time model file's `dp.timeline.overlap_step_time`: it computes for `compute_seconds`
(forward, then a backward of `timeline.BACKWARD_SHARE` of it) and ring-allreduces
`model_bytes` of gradients (`cost.allreduce_time`: Thakur, Rabenseifner & Gropp 2005;
Patarasuk & Yuan 2009), whole or in buckets; only the communication the backward cannot
hide (a share `overlap` of it) is exposed.

`recommend` prices the lesson's options with this model and marks one:

1. baseline: fp32 gradients, one allreduce after the backward (no overlap);
2. buckets: the best bucket size, overlapped with the whole backward (exact);
3. fp16 on the wire: half the bytes (lesson 07);
4. PowerSGD: the weakest of `POWERSGD_RATIOS` reaching the target (Vogels et al. 2019);
5. local SGD: the smallest H of `SYNC_EVERY` reaching the target (Lin et al. 2020);
6. asynchronous parameter servers, one shard per worker (`cost.ps_time`);
7. mark the first of 2-6 reaching `target` (exact before lossy, small changes
   before large), else the most efficient.

`accumulation_plan` prices a global batch too large for the GPUs' memory (micro-batches K
and the step time), and `time_to_target` turns measured steps into wall-clock with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncedu.collectives import cost
from syncedu.comm.network import Network
from syncedu.comm.runs import check_int, check_number
from syncedu.dp import timeline

MB = 2 ** 20
# PowerSGD rank r sends (m + n) r numbers instead of m n: r / 128 of the bytes on 256 x 256.
POWERSGD_RATIOS = (4, 8, 16, 32)  # rank 32, 16, 8, 4 on 256 x 256 layers
POWERSGD_SIDE = 256
SYNC_EVERY = (2, 4, 8, 16, 32, 64)


def efficiency(model_bytes: float, compute_seconds: float, world_size: int, network: Network,
               **options) -> float:
    """Scaling efficiency compute / step time (1.0 on one rank); options (`overlap`,
    `bucket_bytes`) as `timeline.overlap_step_time`."""
    return compute_seconds / timeline.overlap_step_time(model_bytes, compute_seconds,
                                                        world_size, network, **options)


def best_bucket(model_bytes: float, compute_seconds: float, world_size: int, network: Network,
                candidates=(2 ** 18, MB, 4 * MB, 25 * MB, 100 * MB),
                **options) -> tuple[float, float]:
    """(bucket_bytes, efficiency) of the best of `candidates` (the smallest on a tie)."""
    effs = [(b, efficiency(model_bytes, compute_seconds, world_size, network, bucket_bytes=b,
                           **options)) for b in candidates]
    return max(effs, key=lambda be: (round(be[1], 12), -be[0]))


@dataclass(frozen=True)
class Option:
    """One tuning option: what to set, the predicted efficiency, and why."""

    name: str
    setting: str
    efficiency: float
    reason: str
    recommended: bool = False

    def line(self) -> str:
        """One printed row: the option, its setting, its modeled efficiency and why."""
        mark = "->" if self.recommended else "  "
        return f"{mark} {self.name:<10} {self.setting:<28} {self.efficiency:6.1%}  {self.reason}"


def local_sgd_every(model_bytes, compute, world_size, network, target=0.9) -> tuple[int, float]:
    """Step 5: (H, efficiency) of the smallest H of SYNC_EVERY reaching `target` (else the last)."""
    t_comm = timeline.comm_seconds(model_bytes, world_size, network)
    effs = [(h, compute / (compute + t_comm / h)) for h in SYNC_EVERY]
    return next(((h, e) for h, e in effs if e >= target), effs[-1])


def accumulation_plan(global_batch: int, world_size: int, max_per_gpu: int,
                      sample_seconds: float, model_bytes: float, network: Network,
                      **options) -> tuple[int, float]:
    """(K, seconds per optimizer step) for `global_batch` samples on `world_size` GPUs whose
    memory holds at most `max_per_gpu` samples of activations at once; `options` (`overlap`,
    `bucket_bytes`) as `timeline.overlap_step_time`:

    1. the per-GPU batch is B / N; if it exceeds `max_per_gpu`, accumulate over
       K = ceil(B / (N max_per_gpu)) micro-batches of B / (N K) samples each (K = 1 if it
       fits; an uneven split is priced at its mean);
    2. one micro-batch computes c = `sample_seconds` x its samples;
    3. under `no_sync` the first K - 1 micro-batches send nothing, and the gradient allreduce
       (the same bytes as without accumulation) runs only in the last one's backward:
       step = (K - 1) c + `overlap_step_time(model_bytes, c, N, network)`.
    What it costs: the same compute per sample, the same bytes per optimizer step, but only
    1/K of the backward left to hide them under. Without `no_sync` every micro-batch would
    pay the allreduce: K of them per step (lesson 05's bug).
    """
    n, m = check_int("world_size", world_size), check_int("max_per_gpu", max_per_gpu)
    k = -(-check_int("global_batch", global_batch, n) // (n * m))  # Step 1: ceil
    c = check_number("sample_seconds", sample_seconds, 1e-9) * global_batch / (n * k)  # Step 2
    return k, (k - 1) * c + timeline.overlap_step_time(model_bytes, c, n, network, **options)


def time_to_target(steps: int, global_batch: int, *plan, **options) -> float:
    """Wall-clock seconds to a target loss: `steps` to reach it (measured; 0: never, inf) x
    the step seconds of `accumulation_plan(global_batch, *plan, **options)` (modeled)."""
    return steps * accumulation_plan(global_batch, *plan, **options)[1] if steps else float("inf")


def recommend(model_bytes: float, compute_seconds: float, world_size: int, network: Network,
              *, target: float = 0.9) -> list[Option]:
    """The options of steps 1-6, the recommended one (step 7) marked."""
    if not 0 < target <= 1:
        raise ValueError(f"target={target!r} must be in (0, 1]")
    s, c, n, net = model_bytes, compute_seconds, world_size, network

    def bucketed(nbytes):  # Steps 2-4: the best bucket, the whole backward overlapping
        return best_bucket(nbytes, c, n, net, overlap=1.0)

    b32, e32 = bucketed(s)
    b16, e16 = bucketed(s / 2)
    tried = [(r, *bucketed(s / r)) for r in POWERSGD_RATIOS]
    ratio, _, ep = next((t for t in tried if t[2] >= target), tried[-1])
    h, eh = local_sgd_every(s, c, n, net, target)
    ps = cost.ps_time(s, n, net, servers=n) if n > 1 else 0.0
    options = [
        Option("baseline", "fp32, no overlap", efficiency(s, c, n, net, overlap=0.0),
               "all gradient traffic after the backward"),
        Option("buckets", f"bucket_cap_mb={b32 / MB:g}", e32,
               "overlap the allreduce with the backward; tiny buckets pay alpha each"),
        Option("fp16", f"fp16, bucket_cap_mb={b16 / MB:g}", e16,
               "half the bytes, same convergence in practice (lesson 07)"),
        Option("powersgd", f"PowerSGD rank {POWERSGD_SIDE // (2 * ratio)}, 1/{ratio} bytes", ep,
               "the weakest ratio reaching the target; lossy: error feedback, warm-up"),
        Option("local_sgd", f"sync_every={h}", eh,
               f"1/{h} of the traffic; the copies drift, so check the loss per step"),
        Option("async_ps", f"async, {n} server shards", c / (c + ps),
               "no barrier (stragglers, jittery links) but the same bytes, stale gradients"),
    ]
    pick = next((o for o in options[1:] if o.efficiency >= target),  # Step 7
                max(options, key=lambda o: o.efficiency))
    return [Option(o.name, o.setting, o.efficiency, o.reason, o is pick) for o in options]
