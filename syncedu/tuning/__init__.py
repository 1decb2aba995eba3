"""Lesson 09, the tuning playbook: how often to synchronize, and how large a batch.

Open in this order:

1. `local_sgd.py` (average parameters every H steps) and `diloco.py` (DiLoCo's
   outer Nesterov step), the algorithms; `train_strategies.py` registers
   "local_sgd" with `train.run`;
2. `noise_scale.py`: the gradient noise scale (the critical batch size);
3. `scaling.py`: the one time model (step time on a network) and the advice
   drawn from it; `scaling_published.py`: published results predicted by it;
4. `experiments.py`: the lesson's measured runs;
5. the notebook's helpers: `lesson09.py`, `exercises09.py` (import them by name).
"""

from __future__ import annotations

from syncedu.tuning import train_strategies  # noqa: F401  (train.run's "local_sgd")
from syncedu.tuning.diloco import DiLoCo, DiLoCoConfig, nesterov_step, outer_gradient
from syncedu.tuning.local_sgd import LocalSGD, average_parameters

__all__ = ["LocalSGD", "average_parameters", "DiLoCo", "DiLoCoConfig", "nesterov_step",
           "outer_gradient"]
