"""`train.run`'s ZeRO strategies: ours, and torch's own two (real ranks only).

1. "zero1", "zero2", "zero3": `ZeroDataParallel` as model and optimizer; `close` all-gathers
   stage 3's parameters once more (the ledger shows it) for the history;
2. "zero_redundancy": "ddp" with torch's `ZeroRedundancyOptimizer` over the config's
   optimizer: ZeRO-1 by whole tensors, each owner broadcasting its own;
3. "fsdp2": FSDP2's `fully_shard` on every Linear and the root, the config's optimizer on the
   `DTensor` shards: ZeRO-3 by rows; `close` all-gathers whole parameters.

`memory()`: the bytes of model state this rank holds (of a `DTensor`, its local shard:
`train.memory` counts those).
"""

from __future__ import annotations

from dataclasses import fields, replace

from torch import nn

from syncedu.train.memory import model_state_bytes
from syncedu.train.strategies import Parts, build, make_optimizer, register
from syncedu.zero.stages import ZeroConfig, ZeroDataParallel

STAGE_OF = {"zero1": 1, "zero2": 2, "zero3": 3}


@register(*STAGE_OF)
def _zero(module, comm, cfg) -> Parts:  # Step 1
    # The config's optimizer options, each ZeroConfig field but the stage (the strategy's)
    options = {f.name: getattr(cfg, f.name) for f in fields(ZeroConfig) if f.name != "stage"}
    zero = ZeroDataParallel(module, comm, stage=STAGE_OF[cfg.strategy], **options)
    return Parts(zero, zero, no_sync=zero.no_sync, finish=zero.finish_gradient_synchronization,
                 close=zero.close, memory=lambda: dict(zero.memory.peak))


@register("zero_redundancy", real_only=True)
def zero_redundancy(module, comm, cfg) -> Parts:  # Step 2
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = build(module, comm, replace(cfg, strategy="ddp"))  # sync: DDP averages gradients
    # sync: "ddp"'s optimizer (its class, its groups), sharded by whole tensors: state for this
    # rank's tensors only; after its step, each owner broadcasts them
    opt = ZeroRedundancyOptimizer([dict(g) for g in ddp.optimizer.param_groups],
                                  type(ddp.optimizer))
    return replace(ddp, optimizer=opt, memory=lambda: model_state_bytes(module, opt.optim))


@register("fsdp2", real_only=True)
def fsdp2(module, comm, cfg) -> Parts:  # Step 3
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(comm.device.type, (comm.world_size,))
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # sync: one all-gather / reduce-scatter unit per layer
    fully_shard(module, mesh=mesh)
    opt = make_optimizer(module.parameters(), cfg)  # sync: each rank's shards only

    def close():  # whole parameters in the module, until a forward reshards them
        for m in module.modules():
            if hasattr(m, "unshard"):  # each fully_shard-ed module, its own unit
                m.unshard()

    return Parts(module, opt, close=close, memory=lambda: model_state_bytes(module, opt))

