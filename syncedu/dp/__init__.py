"""Lessons 03 and 05, data parallelism and gradient accumulation.

The algorithms first: `data_parallel.py`, `buckets.py`, `ddp_hook.py`, `train_strategies.py`,
`timeline.py`; then the notebooks' helpers `lesson03.py`, `lesson05.py`, `plots.py`,
`exercises03.py`, `exercises05.py` (import them by name: they need matplotlib and ipywidgets).
"""

from __future__ import annotations

from syncedu.dp import train_strategies  # noqa: F401  (train.run's "naive", "flat", "bucketed", "ddp")
from syncedu.dp.buckets import MB, Bucket, build_buckets, trainable_parameters
from syncedu.dp.data_parallel import STRATEGIES, DataParallel, GradSync, sync_paused

__all__ = ["DataParallel", "STRATEGIES", "GradSync", "trainable_parameters", "build_buckets",
           "Bucket", "MB", "sync_paused"]
