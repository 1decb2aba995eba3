"""`train.run("zero1" | "zero2" | "zero3", ...)`: `ZeroDataParallel` as model and optimizer;
`close` all-gathers stage 3's parameters once more (the ledger shows it) for the history."""

from __future__ import annotations

from syncedu.train.strategies import Parts, register
from syncedu.zero.stages import ZeroDataParallel

STAGE_OF = {"zero1": 1, "zero2": 2, "zero3": 3}


@register(*STAGE_OF)
def _zero(module, comm, cfg) -> Parts:
    zero = ZeroDataParallel(module, comm, stage=STAGE_OF[cfg.strategy],
                            optimizer=cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum,
                            weight_decay=cfg.weight_decay, betas=cfg.betas, eps=cfg.eps)
    return Parts(zero, zero, no_sync=zero.no_sync, finish=zero.finish_gradient_synchronization,
                 close=zero.close, memory=lambda: dict(zero.memory.peak))
