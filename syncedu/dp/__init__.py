"""Lessons 03 and 05, data parallelism and gradient accumulation; the notebooks' helpers
(lesson, plots, exercises modules) need matplotlib and ipywidgets: import them by name."""

from __future__ import annotations

from syncedu.dp import train_strategies  # noqa: F401  (train.run's "naive", "flat", "bucketed", "ddp")
from syncedu.dp.buckets import build_buckets, trainable_parameters
from syncedu.dp.data_parallel import STRATEGIES, DataParallel

__all__ = ["DataParallel", "STRATEGIES", "trainable_parameters", "build_buckets"]
