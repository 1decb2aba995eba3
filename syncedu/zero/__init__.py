"""Lesson 10, sharded data parallelism: ZeRO stages 1-3 from scratch.

Open in this order:

1. `stages.py`: `ZeroDataParallel(module, comm, stage=1|2|3)`: shard the
   optimizer state, + gradients, + parameters;
2. `shards.py`: the flat layout of the shards, the reduce-scatter and
   all-gather of each step, the memory meter;
3. `train_strategies.py`: `train.run("zero1" | "zero2" | "zero3", ...)`;
4. `timing.py` (a step's modeled time, overlap and prefetch) and
   `torch_zero.py` (torch's `ZeroRedundancyOptimizer` and FSDP, checked equal
   to DDP);
5. for real training code: `sharded_optimizer.py` (`ShardedOptimizer`, ZeRO-1
   over any torch optimizer, like torch's `ZeroRedundancyOptimizer`),
   `fully_shard.py` + `fully_shard_units.py` (`FullyShard`, per-parameter
   ZeRO-3 with mixed precision and a wrap policy, like FSDP2's `fully_shard`),
   `hybrid_shard.py` + `hsdp.py` (`HybridShard`: shard inside a node,
   replicate across nodes; accumulation under sharding), `sharding_compare.py`
   (flat vs per-parameter shards);
6. the notebook's helpers: `lesson10.py`, `exercises10.py`, `exercises_fsdp.py`
   (import them by name).
"""

from __future__ import annotations

from syncedu.zero import (  # noqa: F401
           hsdp,
           sharding_compare,
           train_strategies,  # noqa: F401  (train.run's "zero1".."zero3")
)
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.hybrid_shard import HybridShard
from syncedu.zero.sharded_optimizer import ShardedOptimizer
from syncedu.zero.shards import MemoryMeter
from syncedu.zero.stages import OPTIMIZERS, STAGES, UNITS, ZeroConfig, ZeroDataParallel

__all__ = ["ZeroConfig", "ZeroDataParallel", "MemoryMeter", "STAGES", "OPTIMIZERS", "UNITS",
           "ShardedOptimizer", "FullyShard", "HybridShard"]
