"""`train.run("naive" | "flat" | "bucketed" | "ddp", ...)`: this topic's strategies, registered.

1. "naive", "flat", "bucketed": the seeded model wrapped in our `DataParallel`;
2. "ddp": PyTorch's `DistributedDataParallel`, its traffic counted by a comm hook.
"""

from __future__ import annotations

import copy

from syncedu.dp.data_parallel import DataParallel
from syncedu.dp.ddp_hook import wrap_ddp
from syncedu.train.strategies import Parts, make_optimizer, register


@register("flat", "bucketed", compressible=True)
@register("naive", compressible=True, float64=True)  # (applied first: registered first)
def ours(module, comm, cfg, strategy: str | None = None) -> Parts:  # Step 1
    """`train.run("naive" | "flat" | "bucketed")`: our `DataParallel` with the config's
    bucket cap, buffer broadcast and a private copy of its resolved compressor (`strategy`:
    another name's wrapper, as "syncbn" asks for "naive").
    """
    # A private compressor per rank: simulated ranks share `cfg`, error feedback is per rank.
    dp = DataParallel(module, comm, strategy or cfg.strategy, bucket_cap_mb=cfg.bucket_cap_mb,
                      broadcast_buffers=cfg.broadcast_buffers,
                      compression=copy.deepcopy(cfg.compressor))
    return Parts(dp, make_optimizer(module.parameters(), cfg), dp.comm_events,
                 no_sync=dp.no_sync, finish=dp.finish_gradient_synchronization, close=dp.close)


@register("ddp", real_only=True, compressible=True)
def _ddp(module, comm, cfg) -> Parts:  # Step 2
    ddp, events = wrap_ddp(module, comm, cfg.bucket_cap_mb, hook=cfg.ddp_hook,
                           compressor=copy.deepcopy(cfg.compressor),
                           broadcast_buffers=cfg.broadcast_buffers)
    return Parts(ddp, make_optimizer(module.parameters(), cfg), events, no_sync=ddp.no_sync)
