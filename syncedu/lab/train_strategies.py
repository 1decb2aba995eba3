"""The strategies `train.run` knows: a registry from name to a factory.

A factory takes `(module, comm, cfg)` (the seeded model on `comm.device`,
this rank's `Comm`, the `TrainConfig`) and returns the `Parts` one rank's
loop needs:

1. `model`: what forward calls (a wrapper such as `DataParallel`, or the
   module itself);
2. `optimizer`: anything with `step()`, `zero_grad(set_to_none=...)` and
   `param_groups` (a torch optimizer, or a sharded one);
3. hooks the loop calls, each optional: `no_sync()` around micro-batches
   that must not synchronize, `finish()` after the last backward (wait for the
   gradient traffic), `after_step()` after the optimizer step (e.g. local
   SGD's parameter average), `close()` after the last step (it may still
   communicate: every rank must end with the same parameters); and `events`, the
   `(start, end, bytes)` of each gradient transfer, for the timeline;
4. `memory()`: the rank's peak bytes of model state {"params", "grads",
   "optimizer", "total"} if the strategy measures it (ZeRO), else None (the loop
   then measures what the module and optimizer hold at the end).

A new strategy plugs in with `@register("name")` on its factory. Names that
other modules provide are listed in `PLUGINS`: the first run with such a name
imports that module, whose `register` calls fill the registry.

Used in: notebooks/03_data_parallel, 05_gradient_accumulation, 09_tuning_playbook
(through train.run).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from syncedu.strategies.dp import DataParallel
from syncedu.strategies.local_sgd import LocalSGD
from syncedu.zero.optimizers import make_optimizer

from .ddp_hook import wrap_ddp

__all__ = ["Parts", "FACTORIES", "PLUGINS", "register", "build", "make_optimizer",
           "resolve_compression"]

FACTORIES: dict[str, Callable] = {}
# Reserved names -> the module that registers them (written by their owners).
PLUGINS = {"zero1": "syncedu.lab.train_zero", "zero2": "syncedu.lab.train_zero",
           "zero3": "syncedu.lab.train_zero", "horovod": "syncedu.lab.horovod_train"}


def _nothing(*_args) -> None:
    return None


@dataclass
class Parts:
    """What one rank's training loop drives (see the module docstring)."""

    model: nn.Module
    optimizer: object
    events: list = field(default_factory=list)
    no_sync: Callable = contextlib.nullcontext
    finish: Callable[[], None] = _nothing
    after_step: Callable[[], object] = _nothing
    close: Callable[[], None] = _nothing
    memory: Callable[[], dict | None] = _nothing


def register(*names: str):
    """Decorator: make `factory(module, comm, cfg) -> Parts` the strategy `names`."""
    def add(factory):
        for name in names:
            FACTORIES[name] = factory
        return factory
    return add


def build(module: nn.Module, comm, cfg) -> Parts:
    """The `Parts` of `cfg.strategy` (importing its plugin module the first time)."""
    name = cfg.strategy
    if name not in FACTORIES and name in PLUGINS:
        try:
            importlib.import_module(PLUGINS[name])
        except ModuleNotFoundError as e:
            raise NotImplementedError(f"strategy={name!r} is reserved, but its module "
                                      f"{PLUGINS[name]} does not exist yet") from e
    if name not in FACTORIES:
        raise ValueError(f"strategy={name!r} has no factory; registered: {sorted(FACTORIES)}")
    return FACTORIES[name](module, comm, cfg)


def resolve_compression(cfg):
    """This rank's own compressor (or None): a private copy, since simulated ranks share `cfg`."""
    if cfg.compression is None:
        return None
    from syncedu.strategies import compress
    return compress.resolve(copy.deepcopy(cfg.compression))


# ------------------------------------------------------------------ built-ins
@register("single")
def _single(module, comm, cfg) -> Parts:
    return Parts(module, make_optimizer(module.parameters(), cfg))


@register("naive", "flat", "bucketed")
def _ours(module, comm, cfg) -> Parts:
    extra = {"compression": resolve_compression(cfg)} if cfg.compression is not None else {}
    dp = DataParallel(module, comm, cfg.strategy, bucket_cap_mb=cfg.bucket_cap_mb, **extra)
    return Parts(dp, make_optimizer(module.parameters(), cfg), dp.comm_events,
                 no_sync=dp.no_sync, finish=dp.finish_gradient_synchronization, close=dp.close)


@register("ddp")
def _ddp(module, comm, cfg) -> Parts:
    extra = {"compression": resolve_compression(cfg)} if cfg.compression is not None else {}
    ddp, events = wrap_ddp(module, comm, cfg.bucket_cap_mb, hook=cfg.ddp_hook, **extra)
    return Parts(ddp, make_optimizer(module.parameters(), cfg), events, no_sync=ddp.no_sync)


@register("local_sgd")
def _local_sgd(module, comm, cfg) -> Parts:
    local = LocalSGD(module, comm, cfg.sync_every)
    return Parts(module, make_optimizer(module.parameters(), cfg), after_step=local.after_step,
                 close=local.finish)
