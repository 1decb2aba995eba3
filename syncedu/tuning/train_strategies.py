"""`train.run("local_sgd", ..., sync_every=H)`: local SGD (local_sgd.py), registered."""

from __future__ import annotations

from syncedu.train.strategies import Parts, make_optimizer, register
from syncedu.tuning.local_sgd import LocalSGD


@register("local_sgd")
def _local_sgd(module, comm, cfg) -> Parts:
    local = LocalSGD(module, comm, cfg.sync_every)
    return Parts(module, make_optimizer(module.parameters(), cfg), after_step=local.after_step,
                 close=local.finish)
