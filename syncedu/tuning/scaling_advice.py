"""A decision helper: which synchronization setting to try first, with predicted efficiency.

`recommend(model_bytes, compute_seconds, world_size, network)` prices each
tuning option of lesson 09 with the step-time model of scaling.py and returns
them as `Option`s (name, setting, predicted efficiency, one-line reason), the
recommended one marked. Steps:

1. baseline: fp32 gradients, one allreduce after the backward (no overlap);
2. buckets: the best `bucket_cap_mb` with the allreduce overlapped with the
   backward (exact: same result as the baseline);
3. fp16 on the wire: half the bytes (lesson 07: divide before summing);
4. PowerSGD: an m x n layer sends (m + n) r numbers instead of m n, so on
   256 x 256 layers rank r sends r/128 of the bytes (rank 4: 1/32, the
   strongest considered, `POWERSGD_RATIO`). The helper takes the *weakest*
   compression in `POWERSGD_RATIOS` (the highest rank: the least lossy) that
   reaches the target, not always 1/32; lossy, needs error feedback (Vogels
   et al. 2019);
5. local SGD: the smallest H in `SYNC_EVERY` that reaches the target; 1/H of
   the traffic (Lin et al. 2020, post-local SGD); changes the optimization;
6. asynchronous parameter servers, one shard per worker (lesson 04's model,
   `cost.ps_time`): no barrier, the same bytes, stale gradients;
7. recommend the first of steps 2-6, in that order (exact before lossy, small
   changes before large ones), that reaches `target`; else the fastest.

The same advice as Google's tuning playbook and lesson 09: measure the
bottleneck first, then change as little as possible.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncedu.collectives import cost
from syncedu.comm.network import Network
from syncedu.tuning import scaling

MB = 2 ** 20
POWERSGD_RATIO = 32
POWERSGD_RATIOS = (4, 8, 16, 32)  # rank 32, 16, 8, 4 on 256 x 256 layers
POWERSGD_SIDE = 256
SYNC_EVERY = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Option:
    """One tuning option: what to set, the predicted efficiency, and why."""

    name: str
    setting: str
    efficiency: float
    reason: str
    recommended: bool = False

    def line(self) -> str:
        mark = "->" if self.recommended else "  "
        return f"{mark} {self.name:<10} {self.setting:<22} {self.efficiency:6.1%}  {self.reason}"


def _bucketed(model_bytes, compute, n, net) -> tuple[float, float]:
    return scaling.best_bucket(model_bytes, compute, n, net, overlap=1.0)


def _powersgd(model_bytes, compute, n, net, target) -> tuple[int, float, float]:
    """(ratio, bucket_bytes, efficiency): the weakest compression reaching `target` (else 1/32)."""
    tried = [(r, *_bucketed(model_bytes / r, compute, n, net)) for r in POWERSGD_RATIOS]
    return next((t for t in tried if t[2] >= target), tried[-1])


def _local_sgd(model_bytes, compute, n, net, target) -> tuple[int, float]:
    t_comm = scaling.comm_seconds(model_bytes, n, net)
    effs = [(h, compute / (compute + t_comm / h)) for h in SYNC_EVERY]
    return next(((h, e) for h, e in effs if e >= target), effs[-1])


def recommend(model_bytes: float, compute_seconds: float, world_size: int, network: Network,
              *, target: float = 0.9) -> list[Option]:
    """The options of steps 1-6, the recommended one (step 7) marked."""
    if not 0 < target <= 1:
        raise ValueError(f"target={target!r} must be in (0, 1]")
    s, c, n, net = model_bytes, compute_seconds, world_size, network
    base = scaling.efficiency(s, c, n, net, overlap=0.0)  # Step 1
    b32, e32 = _bucketed(s, c, n, net)  # Step 2
    b16, e16 = _bucketed(s / 2, c, n, net)  # Step 3
    ratio, bp, ep = _powersgd(s, c, n, net, target)  # Step 4
    rank = POWERSGD_SIDE // (2 * ratio)  # (m + n) r / (m n) = 1 / ratio
    h, eh = _local_sgd(s, c, n, net, target)  # Step 5
    ps = cost.ps_time(s, n, net, servers=n) if n > 1 else 0.0  # Step 6
    options = [
        Option("baseline", "fp32, no overlap", base, "all gradient traffic after the backward"),
        Option("buckets", f"bucket_cap_mb={b32 / MB:g}", e32,
               "overlap the allreduce with the backward; tiny buckets pay alpha each"),
        Option("fp16", f"fp16, bucket_cap_mb={b16 / MB:g}", e16,
               "half the bytes, same convergence in practice (divide before summing)"),
        Option("powersgd", f"PowerSGD rank {rank}, 1/{ratio} bytes", ep,
               f"the weakest of 1/{POWERSGD_RATIOS[0]}..1/{POWERSGD_RATIOS[-1]} reaching "
               "the target; lossy: needs error feedback and warm-up"),
        Option("local_sgd", f"sync_every={h}", eh,
               f"1/{h} of the traffic; the copies drift, so check the loss per step"),
        Option("async_ps", f"async, {n} server shards", c / (c + ps),
               "no barrier (stragglers, jittery links) but the same bytes and stale gradients"),
    ]
    pick = next((o for o in options[1:] if o.efficiency >= target),  # Step 7
                max(options, key=lambda o: o.efficiency))
    return [Option(o.name, o.setting, o.efficiency, o.reason, o is pick) for o in options]
