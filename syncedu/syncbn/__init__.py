"""Lesson 06, SyncBatchNorm: BatchNorm statistics over the global batch.

Open in this order:

1. `sync_batchnorm.py`: `SyncBatchNorm` (forward and backward from scratch)
   and `convert` (swap every BatchNorm of a model);
2. `experiment.py`: small per-rank batches with and without SyncBN;
3. the notebook's helpers: `lesson06.py`, `plots.py`, `exercises06.py`
   (import them by name: they need matplotlib and ipywidgets).
"""

from __future__ import annotations

from syncedu.syncbn.sync_batchnorm import (
    BACKWARD_OP,
    CHECK_OP,
    FORWARD_OP,
    SyncBatchNorm,
    convert,
    global_stats,
)

__all__ = ["SyncBatchNorm", "convert", "global_stats", "FORWARD_OP", "BACKWARD_OP", "CHECK_OP"]
