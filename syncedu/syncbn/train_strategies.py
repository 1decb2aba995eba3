"""`train.run("syncbn", ...)`: "naive" data parallelism (one allreduce per gradient) with
every BatchNorm of the model converted to our `SyncBatchNorm` first (statistics over the
global batch; its weight and bias gradients are averaged like any other)."""

from __future__ import annotations

from syncedu.dp.train_strategies import ours
from syncedu.syncbn.sync_batchnorm import convert
from syncedu.train.strategies import Parts, register


@register("syncbn", float64=True)  # trains in float64 too (naive's wire)
def _syncbn(module, comm, cfg) -> Parts:
    return ours(convert(module, comm), comm, cfg, strategy="naive")  # sync: global statistics
