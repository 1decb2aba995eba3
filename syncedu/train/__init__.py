"""The one training harness: `train.run(strategy, world_size, ...)` and what it stands on.

Open in this order:

1. `harness.py`: `run` and its `History` (the entry point);
2. `config.py`: `TrainConfig`, every option validated;
3. `train_rank.py`: one rank's loop (forward, backward layer by layer, step);
4. `strategies.py`: the registry of strategies; topics register theirs
   (`@register("bucketed")` in `syncedu/dp/train_strategies.py`, ...), this package
   imports no topic;
5. `runner.py`: where ranks run (this process, fresh processes, a pool, or
   simulated);
6. `data.py`, `models.py`, `sampling.py`: the data set, the seeded models and
   the global batches every strategy sees; `layer_compute.py` (modeled compute
   on simulated ranks) and `memory.py` (bytes of model state).
"""

from __future__ import annotations

from syncedu.train import data, models, sampling, train_rank
from syncedu.train.harness import MISTAKES, STRATEGIES, History, TrainConfig, run
from syncedu.train.strategies import Parts, register

__all__ = ["run", "History", "TrainConfig", "STRATEGIES", "MISTAKES", "Parts", "register",
           "data", "models", "sampling", "train_rank"]
