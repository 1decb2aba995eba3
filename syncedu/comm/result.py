"""`RunResult`: what `launch.run`, `Pool.run` and `sim.run` return."""

from __future__ import annotations

from .ledger import Ledger


class RunResult(list):
    """Per-rank return values in rank order (`res[r]`), plus the run's record.

    - `.ledger`: a `Ledger` of the bytes and messages each rank sent through its comm;
    - `.seconds`: how long `fn` ran: wall-clock seconds of the slowest rank on real
      ranks, logical seconds (the network model's clock) on simulated ones.
    """

    def __init__(self, values, ledger: Ledger, seconds: float):
        super().__init__(values)
        self.ledger = ledger
        self.seconds = float(seconds)

    @property
    def world_size(self) -> int:
        return len(self)
