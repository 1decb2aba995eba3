"""Lesson 09, the tuning playbook: how often to synchronize, and how large a batch.

Open `local_sgd.py` and `diloco.py` (the algorithms; `train_strategies.py` registers
"local_sgd" with `train.run`), `noise_scale.py` (the critical batch size), `scaling.py`
(efficiency and the advice, on dp/timeline.py's step-time model; `scaling_published.py`
checks it against published results), `experiments.py`; the notebook's helpers
`lesson09.py`, `exercises09.py`.
"""

from syncedu.tuning import train_strategies  # noqa: F401  (train.run's "local_sgd")
