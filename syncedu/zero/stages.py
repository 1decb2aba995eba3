"""ZeRO stages 1-3 from scratch: sharded data parallelism on `Comm`.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020: stage 1 shards the optimizer state, 2 also the gradients (both send
2 Psi per step, as an allreduce), 3 also the parameters (3 Psi). The trainable
parameters make one flat buffer of N contiguous shards (`shards.Layout`); stages 2-3
move it one layer (`shards.Unit`) at a time. A step:

1. forward; stage 3 all-gathers a layer's parameters just before it runs, frees them after;
2. backward; stage 3 all-gathers the layer again; stages 2-3 reduce-scatter a layer's
   gradients once complete and free them; stage 1 reduce-scatters the whole gradients
   after backward (`finish_gradient_synchronization`);
3. `step()`: torch's SGD, Adam or AdamW on this rank's shard only;
4. stages 1 and 2 all-gather the updated shards; stage 3 leaves them sharded.

Under `no_sync()` stage 1 accumulates whole gradients; stages 2-3 hold none, so they
reduce-scatter every micro-batch and add up the shards. `memory.peak`: the most bytes held.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from syncedu.train.optimizers import check_optimizer_options, make_optimizer
from syncedu.zero.shards import (
    Layout,
    MemoryMeter,
    Synced,
    Unit,
    broadcast_params,
    layer_units,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
)

STAGES = (1, 2, 3)


@dataclass(frozen=True)
class ZeroConfig:
    """A ZeRO stage and its optimizer (validated; errors name the parameter)."""

    stage: int = 1
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0  # SGD only
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)  # adam / adamw only
    eps: float = 1e-8  # adam / adamw only

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage={self.stage!r} is unknown; choose one of {STAGES}")
        check_optimizer_options(self)  # optimizer, lr, momentum, weight_decay, betas, eps


class ZeroDataParallel(Synced):
    """Wrap `module` for ZeRO stage `stage`; also the optimizer (`step`, `zero_grad`).

    Rajbhandari et al., SC 2020: one flat buffer of the parameters cut into N shards; rank r
    keeps the optimizer state of shard r (stage 1), also only its gradients (2: reduce-
    scattered layer by layer during backward), also only its parameters (3: all-gathered
    just in time for each layer's forward and backward).

    Args:
        module: the model; its parameters are broadcast from rank 0 first.
        comm: this rank's `Comm`.
        **fields: `ZeroConfig` fields: `stage` (1, 2 or 3; default 1), `optimizer` ("sgd",
            "adam" or "adamw"; default "sgd"), `lr` (0.1), `momentum` (0.0, SGD),
            `weight_decay` (0.0), `betas` ((0.9, 0.999)) and `eps` (1e-8) for Adam/AdamW.
    """

    def __init__(self, module: nn.Module, comm, **fields):
        cfg = ZeroConfig(**fields)
        super().__init__(module, comm)
        self.config, self.stage = cfg, cfg.stage
        self.units = layer_units(module)
        self.params = [p for u in self.units for p in u.params]
        self.layout = Layout(self.units[-1].b, comm.world_size)
        self.shard = nn.Parameter(self._shard_from(broadcast_params(comm, self.params)))
        self.opt = make_optimizer([self.shard], cfg)  # Step 3's optimizer, on the shard only
        # Stage 1 keeps whole gradients, views of one buffer (stages 2-3: None)
        self.flat_grad = self.shard.new_zeros(self.layout.numel) if self.stage == 1 else None
        for u in self.units if self.stage == 1 else ():
            u.attach(self.flat_grad[u.a: u.b], "grad")
        self.memory = MemoryMeter(self)
        self._hooks = self._install_hooks() if self.stage > 1 else []
        self.memory.sample("start")

    def _shard_from(self, flat: torch.Tensor) -> torch.Tensor:
        mine = self.layout.pieces(flat)[self.comm.rank]
        # Stages 1-2: the shard is a view, so the optimizer updates the buffer in place. Stage 3
        # keeps only its own shard, and each layer's buffer with its storage freed until gathered.
        self.flat = flat if self.stage < 3 else None
        for u in self.units:
            u.flat = flat[u.a: u.b].clone() if self.stage == 3 else None
            u.attach(flat[u.a: u.b] if u.flat is None else u.flat)
            if u.flat is not None:
                u.free()
        return mine if self.stage < 3 else mine.clone()

    # ------------------------------------------------------------- hooks
    def _install_hooks(self) -> list:
        """Each layer's hooks, each method below bound to its unit `u` with `partial`."""
        hooks = []
        for u in self.units:
            if self.stage == 3:
                hooks.append(u.module.register_forward_pre_hook(partial(self.pre_forward, u)))
            hooks.append(u.module.register_forward_hook(partial(self.post_forward, u)))
            hooks += [p.register_post_accumulate_grad_hook(partial(self._on_grad, u))
                      for p in u.params]
        return hooks

    def pre_forward(self, u: Unit, _module, _inputs) -> None:
        self.gather(u)  # Step 1: the layer's whole parameters, just in time
        self.memory.sample(f"gather {u.name}")

    def post_forward(self, u: Unit, _module, _inputs, output) -> None:
        if self.stage == 3:
            u.free()  # Step 1: ... and gone again (backward gathers them anew)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            # The gradient of the layer's output arrives just before its backward runs.
            output.register_hook(partial(self.pre_backward, u))

    def pre_backward(self, u: Unit, _grad) -> None:
        if self.stage == 3:
            self.gather(u)  # Step 2: backward needs the weights again
        if u.flat_grad is None:
            u.flat_grad = self.shard.new_zeros(u.b - u.a)
            u.attach(u.flat_grad, "grad")
        u.ready = 0
        self.memory.sample(f"backward {u.name}")

    def _on_grad(self, u: Unit, _p) -> None:
        u.ready += 1
        if u.ready == len(u.params):  # Step 2: the layer's gradients are complete
            self.memory.sample(f"grads {u.name}")
            self.reduce(u)
            if self.stage == 3:
                u.free()
            self.memory.sample(f"reduced {u.name}")

    # ------------------------------------------------ one layer's traffic
    def gather(self, u: Unit) -> None:
        """Stage 3: all-gather the layer's slice from the shards (unless it is here), into
        the storage its parameters and autograd's saved tensors share."""
        if not u.gathered:
            u.flat.untyped_storage().resize_(u.flat.numel() * u.flat.element_size())
            pieces = self.layout.pieces(u.flat, u.a)
            lo, hi = self.layout.within_shard(u.a, u.b, self.comm.rank)
            pieces[self.comm.rank].copy_(self.shard.detach()[lo:hi])
            ring_all_gather_pieces(self.comm, pieces)

    def reduce(self, u: Unit) -> None:
        """Stages 2-3: reduce-scatter the layer's gradients; keep (add up) this rank's piece."""
        pieces = self.layout.pieces(u.flat_grad, u.a)
        mean = ring_reduce_scatter_pieces(self.comm, pieces).div_(self.comm.world_size)
        if self.shard.grad is None:
            self.shard.grad = torch.zeros_like(self.shard)
        lo, hi = self.layout.within_shard(u.a, u.b, self.comm.rank)
        self.shard.grad[lo:hi].add_(mean)  # adds up over micro-batches
        u.flat_grad = None
        for p in u.params:
            p.grad = None

    # ------------------------------------------------------- the wrapper
    def finish_gradient_synchronization(self) -> None:
        """Stage 1, Step 2: reduce-scatter the whole gradients (stages 2-3 did it in backward)."""
        if self.stage == 1 and self._armed:
            self._armed = False
            # The mean lands in this rank's part of the whole gradients.
            mine = ring_reduce_scatter_pieces(self.comm, self.layout.pieces(self.flat_grad))
            self.shard.grad = mine.div_(self.comm.world_size)
            self.memory.sample("reduced")

    # ------------------------------------------------------ the optimizer
    @property
    def param_groups(self) -> list[dict]:
        """The local optimizer's parameter groups (over this rank's shard), as torch's."""
        return self.opt.param_groups

    @torch.no_grad()
    def step(self) -> None:
        """Steps 3-4: update this rank's shard, then (stages 1-2) all-gather the buffer."""
        self.opt.step()
        self.memory.sample("step")
        if self.stage < 3:
            ring_all_gather_pieces(self.comm, self.layout.pieces(self.flat))
            self.memory.sample("gathered")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the shard's gradient (None, or zeroed); stage 1 zeroes its whole buffer."""
        grad = self.shard.grad
        self.shard.grad = None if set_to_none or grad is None else grad.zero_()
        if self.flat_grad is not None:
            self.flat_grad.zero_()

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The whole parameters by the module's names (stage 3 gathers them: traffic)."""
        out = {}
        for u in self.units:
            if was_free := self.stage == 3 and not u.gathered:
                self.gather(u)
            out.update({id(p): p.detach().clone() for p in u.params})
            if was_free:
                u.free()
        return {name: out[id(p)] for name, p in self.module.named_parameters() if id(p) in out}

    @torch.no_grad()
    def close(self) -> None:
        """Remove the hooks and leave whole parameters in the module (it stays usable)."""
        for h in [self._arm_hook, *self._hooks]:
            h.remove()
        self._hooks = []
        for u in self.units if self.stage == 3 else []:
            self.gather(u)
