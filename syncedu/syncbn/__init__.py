"""Lesson 06, SyncBatchNorm: BatchNorm statistics over the global batch; the notebook's
helpers (`lesson06`, `plots`, `exercises06`) need matplotlib and ipywidgets."""

from __future__ import annotations

from syncedu.syncbn import train_strategies  # noqa: F401  (train.run's "syncbn")
from syncedu.syncbn.sync_batchnorm import (
    BACKWARD_OP,
    CHECK_OP,
    FORWARD_OP,
    SyncBatchNorm,
    convert,
    global_stats,
)

__all__ = ["SyncBatchNorm", "convert", "global_stats", "FORWARD_OP", "BACKWARD_OP", "CHECK_OP"]
