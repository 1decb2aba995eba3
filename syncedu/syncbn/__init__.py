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
from syncedu.train import strategies

# "syncbn" trains in float64 too (naive's wire). This flag belongs in its @register line,
# which lesson 06 shows (cell 3): it moves there when that notebook is next re-executed.
strategies.FLOAT64.add("syncbn")

__all__ = ["SyncBatchNorm", "convert", "global_stats", "FORWARD_OP", "BACKWARD_OP", "CHECK_OP"]
