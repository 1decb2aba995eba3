"""Lessons 03 and 05, data parallelism and gradient accumulation.

Open in this order:

1. `data_parallel.py`: `DataParallel(module, comm, strategy=...)`, naive,
   flat and bucketed gradient averaging, `no_sync()` for accumulation;
2. `buckets.py`: how parameters are grouped into buckets (DDP's order);
3. `ddp_hook.py`: PyTorch's `DistributedDataParallel`, its traffic counted
   into the ledger by a comm hook;
4. `train_strategies.py`: the strategies `train.run` gets from here ("naive",
   "flat", "bucketed", "ddp");
5. `timeline.py`: the modeled timeline of a step (compute vs communication);
6. the notebooks' helpers: `lesson03.py`, `lesson05.py`, `plots.py`,
   `exercises03.py`, `exercises05.py` (import them by name: they need
   matplotlib and ipywidgets).
"""

from __future__ import annotations

from syncedu.dp import train_strategies  # noqa: F401  (train.run's "naive", "flat", "bucketed", "ddp")
from syncedu.dp.buckets import MB, Bucket, build_buckets
from syncedu.dp.data_parallel import (
    STRATEGIES,
    BucketedSync,
    DataParallel,
    FlatSync,
    GradSync,
    NaiveSync,
    sync_paused,
    trainable_parameters,
)

__all__ = ["DataParallel", "STRATEGIES", "GradSync", "NaiveSync", "FlatSync", "BucketedSync",
           "trainable_parameters", "build_buckets", "Bucket", "MB", "sync_paused"]
