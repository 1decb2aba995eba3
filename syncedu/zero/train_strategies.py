"""`train.run("zero1" | "zero2" | "zero3", ...)`: ZeRO's stages in the training loop.

`ZeroDataParallel` (stages.py) wraps the seeded model and is also the optimizer
(`cfg.optimizer` on this rank's shard only). The loop's hooks: `no_sync` (stage 1
accumulates whole gradients, stages 2-3 reduce-scatter every micro-batch), `finish`
(stage 1's reduce-scatter), `close` (stage 3 all-gathers once more, so the history
gets whole parameters: one all-gather more in the ledger), `memory` (peak bytes).
Stage 3 frees the parameters as it wraps, so the harness's `LayerCompute`, built after
the factory, would find every layer empty and charge no modeled compute: this factory
builds it first (the harness's own then charges zero seconds).
"""

from __future__ import annotations

from syncedu.train.layer_compute import LayerCompute
from syncedu.train.strategies import Parts, register
from syncedu.zero.stages import ZeroDataParallel

STAGE_OF = {"zero1": 1, "zero2": 2, "zero3": 3}


@register(*STAGE_OF)
def _zero(module, comm, cfg) -> Parts:
    if cfg.strategy == "zero3" and cfg.compute_seconds:
        LayerCompute(module, comm, cfg.compute_seconds)  # while the layers have their sizes
    zero = ZeroDataParallel(module, comm, stage=STAGE_OF[cfg.strategy],
                            optimizer=cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum,
                            weight_decay=cfg.weight_decay, betas=cfg.betas, eps=cfg.eps)
    return Parts(zero, zero, no_sync=zero.no_sync, finish=zero.finish_gradient_synchronization,
                 close=zero.close, memory=lambda: dict(zero.memory.peak))
