"""`train.run("naive" | "flat" | "bucketed" | "ddp", ...)`: this topic's strategies, registered.

1. "naive", "flat", "bucketed": the seeded model wrapped in our
   `DataParallel` (data_parallel.py), the strategy's name as its `strategy`;
2. "ddp": PyTorch's `DistributedDataParallel`, its traffic counted into the
   ledger by a comm hook (ddp_hook.py).

Each rank gets a private copy of `cfg.compression` (simulated ranks share
`cfg`, and a compressor keeps per-rank state such as error feedback).
"""

from __future__ import annotations

import copy

from syncedu.dp.data_parallel import DataParallel
from syncedu.dp.ddp_hook import wrap_ddp
from syncedu.train.compression import resolve
from syncedu.train.strategies import Parts, make_optimizer, register


def _compression(cfg) -> dict:
    """`compression=` for this rank's wrapper: a private compressor, or nothing."""
    if cfg.compression is None:
        return {}
    return {"compression": resolve(copy.deepcopy(cfg.compression))}


@register("naive", "flat", "bucketed")
def _ours(module, comm, cfg) -> Parts:  # Step 1
    dp = DataParallel(module, comm, cfg.strategy, bucket_cap_mb=cfg.bucket_cap_mb,
                      **_compression(cfg))
    return Parts(dp, make_optimizer(module.parameters(), cfg), dp.comm_events,
                 no_sync=dp.no_sync, finish=dp.finish_gradient_synchronization, close=dp.close)


@register("ddp")
def _ddp(module, comm, cfg) -> Parts:  # Step 2
    ddp, events = wrap_ddp(module, comm, cfg.bucket_cap_mb, hook=cfg.ddp_hook,
                           **_compression(cfg))
    return Parts(ddp, make_optimizer(module.parameters(), cfg), events, no_sync=ddp.no_sync)
