"""Lesson 10, sharded data parallelism: ZeRO stages 1-3 from scratch, and for real code.

1. `stages.py` (`ZeroDataParallel`, stage 1|2|3) on `shards.py`; `train_strategies.py`;
2. `timing.py` (a step's time on a network); `torch_zero.py` (torch's own, against DDP);
3. `sharded_optimizer.py` (ZeRO-1 over any torch optimizer), `fully_shard.py` on
   `fully_shard_units.py` (per-parameter ZeRO-3, as FSDP2), `hsdp.py` (HSDP);
4. the notebook's helpers: `lesson10.py` (figures, widget), `exercises10.py` (checkers).
"""

from __future__ import annotations

from syncedu.zero import hsdp, train_strategies  # noqa: F401  (train.run's "zero1".."zero3")
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.hsdp import HybridShard
from syncedu.zero.sharded_optimizer import ShardedOptimizer
from syncedu.zero.shards import MemoryMeter
from syncedu.zero.stages import OPTIMIZERS, STAGES, ZeroConfig, ZeroDataParallel

__all__ = ["ZeroConfig", "ZeroDataParallel", "MemoryMeter", "STAGES", "OPTIMIZERS",
           "ShardedOptimizer", "FullyShard", "HybridShard"]
