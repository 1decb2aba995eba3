"""Lesson 10, sharded data parallelism: ZeRO stages 1-3 from scratch, and for real code:
`stages.py` on `shards.py`, `train_strategies.py` (train.run's, torch's own two included),
`sharded_optimizer.py`, `fully_shard.py` (per-parameter, as FSDP2), `hsdp.py`; lesson10.py,
exercises10.py.
"""

from __future__ import annotations

from syncedu.train.optimizers import OPTIMIZERS
from syncedu.zero import hsdp, train_strategies  # noqa: F401  (train.run's "zero1".."fsdp2")
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.hsdp import HybridShard
from syncedu.zero.sharded_optimizer import ShardedOptimizer
from syncedu.zero.shards import MemoryMeter
from syncedu.zero.stages import STAGES, ZeroConfig, ZeroDataParallel

__all__ = ["ZeroConfig", "ZeroDataParallel", "MemoryMeter", "STAGES", "OPTIMIZERS",
           "ShardedOptimizer", "FullyShard", "HybridShard"]
