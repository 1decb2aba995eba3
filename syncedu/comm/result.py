"""`RunResult`: what `launch.run`, `Pool.run` and `sim.run` return."""

from __future__ import annotations

from .ledger import Ledger
from .trace import Trace


class RunResult(list):
    """Per-rank return values in rank order (`res[r]`), plus the run's record.

    - `.ledger`: a `Ledger` of the bytes and messages each rank sent through its comm;
    - `.seconds`: how long `fn` ran: wall-clock seconds of the slowest rank on real
      ranks, logical seconds (the network model's clock) on simulated ones;
    - `.trace`: a `Trace`, one record per message (every message on simulated
      ranks; the point-to-point ones on real ranks): src, dst, nbytes, tag, op,
      start, end.
    """

    def __init__(self, values, ledger: Ledger, seconds: float, trace: Trace | None = None):
        super().__init__(values)
        self.ledger = ledger
        self.seconds = float(seconds)
        self.trace = trace if trace is not None else Trace()

    @property
    def world_size(self) -> int:
        return len(self)
