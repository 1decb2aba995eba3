"""Lesson 10, sharded data parallelism: ZeRO stages 1-3 from scratch, and for real code.

Open in this order:

1. `stages.py`: `ZeroDataParallel(module, comm, stage=1|2|3)`, built on `shards.py`
   (the flat shards, their reduce-scatter and all-gather, the memory meter);
   `train_strategies.py`: `train.run("zero1" | "zero2" | "zero3", ...)`;
2. `timing.py`: a step's modeled and simulated time, with and without prefetch;
   `torch_zero.py`: torch's `ZeroRedundancyOptimizer` and FSDP2, checked equal to DDP;
3. for real training code: `sharded_optimizer.py` (`ShardedOptimizer`: ZeRO-1 over any
   torch optimizer), `fully_shard.py` + `fully_shard_units.py` (`FullyShard`:
   per-parameter ZeRO-3 with mixed precision and a wrap policy, as FSDP2), `hsdp.py`
   (`HybridShard`: shard inside a node, replicate across nodes; accumulation);
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
