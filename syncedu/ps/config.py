"""`PSConfig`: one parameter-server job, validated (frozen and picklable, sent to every rank).

Modes (Li et al., OSDI 2014, section 3; SSP: Ho et al., NeurIPS 2013): "sync" (bulk
synchronous), "async" (no bound), "ssp" (a worker may start step c only once every worker has
pushed step c - staleness - 1). Staleness is counted in steps: a gradient of step c computed on
parameters that held every worker's gradients of steps < k has staleness c - k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from syncedu.comm.runs import check_choice, check_int

MODES = ("sync", "async", "ssp")
PUSH_TAG, PULL_TAG = 41, 42  # message tags: gradients in, parameters out
HEADER = 1  # a push carries [gradient shard..., loss]


def _steps(steps, workers: int) -> tuple[int, ...]:
    """An int (every worker) or one count per worker -> a tuple of per-worker steps."""
    if not isinstance(steps, (list, tuple)):
        return (check_int("steps", steps, 1),) * workers
    counts = tuple(steps)
    if len(counts) != workers:
        raise ValueError(f"steps has {len(counts)} entries for {workers} workers: give an int "
                         "or one count per worker")
    for c in counts:
        check_int("steps[i]", c, 1)
    return counts


@dataclass(frozen=True)
class PSConfig:
    """A parameter-server job. `steps` may be an int or one count per worker. `compute_seconds`:
    modeled compute per gradient, times the rank's `Network.slowdown` and, if `variability` > 0,
    a seeded factor 1 - v + v * Exp(1) of mean 1 (slow steps)."""

    mode: str
    workers: int
    servers: int = 1
    staleness: int = 0
    steps: tuple = (1,)
    lr: float = 0.1
    compute_seconds: float = 0.01
    variability: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        for name, low in (("workers", 1), ("servers", 1), ("staleness", 0), ("seed", -2**62)):
            check_int(name, getattr(self, name), low)
        if self.staleness and self.mode != "ssp":
            raise ValueError(f"staleness={self.staleness} applies to mode='ssp' only (sync is "
                             "staleness 0, async has no bound)")
        object.__setattr__(self, "steps", _steps(self.steps, self.workers))
        if self.mode == "sync" and len(set(self.steps)) > 1:
            raise ValueError(f"steps={list(self.steps)}: mode='sync' needs the same number of "
                             "steps on every worker (use 'ssp' or 'async' for uneven workers)")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < math.inf):
            raise ValueError(f"lr={self.lr!r} must be a finite number > 0")
        if not (isinstance(self.compute_seconds, (int, float))
                and 0 <= self.compute_seconds < math.inf):
            raise ValueError(f"compute_seconds={self.compute_seconds!r} must be seconds >= 0")
        if not (isinstance(self.variability, (int, float)) and 0 <= self.variability <= 1):
            raise ValueError(f"variability={self.variability!r} must be in [0, 1]")

    @property
    def world_size(self) -> int:
        """workers + servers: the ranks the job runs on."""
        return self.workers + self.servers

    @property
    def bound(self) -> float:
        """The staleness bound tau: 0 (sync), `staleness` (ssp), infinity (async)."""
        return {"sync": 0, "ssp": self.staleness}.get(self.mode, math.inf)

    def server_rank(self, s: int) -> int:
        """The rank of server `s` (servers are the last ranks)."""
        return self.workers + s


def shard_ranges(numel: int, servers: int) -> list[tuple[int, int]]:
    """Split `numel` parameters into `servers` flat ranges (the first ones one longer)."""
    check_int("servers", servers, 1)
    if servers > numel:
        raise ValueError(f"servers={servers} is more than the {numel} parameters to shard")
    base, extra = divmod(numel, servers)
    bounds = [s * base + min(s, extra) for s in range(servers + 1)]
    return list(zip(bounds, bounds[1:]))
