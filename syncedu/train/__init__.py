"""The one training harness: `train.run(strategy, world_size, ...)` and what it stands on.

Open in this order: harness.py (`run`, `History`), config.py (`TrainConfig`),
train_rank.py (one rank's loop), strategies.py (the registry topics register
with; this package imports no topic), runner.py (where ranks run), then
data.py, models.py, sampling.py (the data, the seeded models, the global
batches), layer_compute.py (modeled compute) and memory.py (model-state bytes).
"""

from __future__ import annotations

from syncedu.train import data, models, sampling, train_rank
from syncedu.train.harness import MISTAKES, STRATEGIES, History, TrainConfig, run
from syncedu.train.strategies import Parts, register

__all__ = ["run", "History", "TrainConfig", "STRATEGIES", "MISTAKES", "Parts", "register",
           "data", "models", "sampling", "train_rank"]
