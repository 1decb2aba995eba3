"""`train.run("zero1" | "zero2" | "zero3", ...)`: ZeRO's stages plugged into the training loop.

The factory wraps the seeded model in `ZeroDataParallel` (zero/stages.py),
which is also the optimizer: `cfg.optimizer` ("sgd" with `cfg.momentum`,
"adam" or "adamw", with `weight_decay`, `betas`, `eps`) runs on this rank's
shard only. The loop's hooks:

1. `no_sync`: stage 1 accumulates whole gradients; stages 2-3 reduce-scatter
   every micro-batch (they hold no whole gradients to accumulate);
2. `finish`: stage 1's reduce-scatter after the last backward (stages 2-3 did
   theirs during backward);
3. `close`: stage 3 all-gathers the parameters once more, so the history gets
   whole parameters (charged to the run's ledger: one all-gather more);
4. `memory`: this rank's peak bytes of model state (`MemoryMeter.peak`).
"""

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
