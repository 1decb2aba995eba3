"""The one training harness: `train.run(strategy, world_size, ...)` and what it stands on
(read harness.py, config.py, train_rank.py, then strategies.py: the registry topics
register with, so this package imports no topic).
"""

from __future__ import annotations

from syncedu.train import data, models, sampling, train_rank
from syncedu.train.harness import MISTAKES, STRATEGIES, History, TrainConfig, run
from syncedu.train.strategies import Parts, register

__all__ = ["run", "History", "TrainConfig", "STRATEGIES", "MISTAKES", "Parts", "register",
           "data", "models", "sampling", "train_rank"]
