"""Lesson 04, parameter servers: sync, async and bounded staleness on `Comm`.

Open in this order:

1. `protocol.py`: `ps_rank`, the whole protocol for one rank (worker or
   server); `config.py` (`PSConfig`, the message layout), `worker.py`,
   `server.py`;
2. `training.py`: `ps.run(mode, workers, ...)`, the lessons' model and data
   trained through it (the same as `train.run`'s);
3. the notebook's helpers: `lesson04.py`, `plots.py`, `exercises04.py`
   (import them by name: they need matplotlib and ipywidgets).
"""

from __future__ import annotations

from syncedu.ps.config import MODES, PULL_TAG, PUSH_TAG, PSConfig, shard_ranges
from syncedu.ps.protocol import ps_rank
from syncedu.ps.training import PSHistory, allreduce_baseline, numel, run, stragglers

__all__ = ["run", "PSHistory", "PSConfig", "MODES", "stragglers", "allreduce_baseline", "numel",
           "shard_ranges", "ps_rank", "PUSH_TAG", "PULL_TAG"]
