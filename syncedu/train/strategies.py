"""The strategies `train.run` knows: a registry from name to a factory.

A factory `(module, comm, cfg) -> Parts` gets the seeded model on `comm.device`, this
rank's `Comm` and the `TrainConfig`, and returns what one rank's loop needs:

1. `model`: what forward calls (a wrapper such as `DataParallel`, or the module);
2. `optimizer`: anything with `step()`, `zero_grad(set_to_none=...)` and `param_groups`;
3. optional hooks: `no_sync()`, `finish()` after the last backward (wait for the gradient
   traffic), `after_step()`, `close()` after the last step (it may communicate: every rank
   must end with the same parameters); `events`, the `(start, end, bytes)` of each transfer;
4. `memory()`: peak bytes of model state if the strategy measures it (ZeRO), else None;
   `report()`: a dict of what else it measured, returned as `History.extra`.

Topics register theirs with `@register("name", ...)`, the one list of what `train.run`
accepts (`TrainConfig` validates against it); only "single" lives here. For example,
`@register("dpsgd", check=check_dpsgd)` above a factory is all a new strategy needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from syncedu.train.optimizers import make_optimizer

FACTORIES: dict[str, Callable] = {}  # every strategy train.run accepts, in registration order
CHECKS: dict[str, Callable] = {}  # name -> check(cfg), raising ValueError
REAL_ONLY: set[str] = set()  # strategies that need torch.distributed: never simulated
COMPRESSIBLE: set[str] = set()  # whose gradient traffic a compressor can shrink
FLOAT64: set[str] = set()  # that train in float64 too (the others' wire is fp32)


def names(flagged=None) -> tuple[str, ...]:
    """The registered strategies (those in `flagged`, if given), in registration order."""
    return tuple(n for n in FACTORIES if flagged is None or n in flagged)
# Strategies that start their own ranks -> fn(cfg, *, pool, network, timeout) -> results.
LAUNCHERS: dict[str, Callable] = {}


@dataclass
class Parts:
    """What one rank's training loop drives (Steps 1-4 above)."""

    model: nn.Module
    optimizer: object
    events: list = field(default_factory=list)
    no_sync: Callable = contextlib.nullcontext
    finish: Callable[[], None] = lambda: None
    after_step: Callable[[], object] = lambda: None
    close: Callable[[], None] = lambda: None
    memory: Callable[[], dict | None] = lambda: None
    report: Callable[[], dict] = dict


def register(*names: str, check: Callable | None = None, real_only: bool = False,
             compressible: bool = False, float64: bool = False):
    """Decorator: make `factory(module, comm, cfg) -> Parts` the strategy `names`.

    Args:
        names: the strategy names `train.run` accepts for this factory.
        check: `check(cfg)` raising `ValueError`, run in the caller by `TrainConfig` before
            any rank starts (default None: the config's common checks only).
        real_only: a library's own strategy on torch.distributed, which `simulate=True`
            refuses (default False).
        compressible: its gradients travel through `compression=` (default False).
        float64: it trains in `dtype="float64"` too (default False: float32 only).
    """
    def add(factory):
        for name in names:
            FACTORIES[name] = factory
            if check is not None:
                CHECKS[name] = check
            for flagged, wanted in ((REAL_ONLY, real_only), (COMPRESSIBLE, compressible),
                                    (FLOAT64, float64)):
                if wanted:
                    flagged.add(name)
        return factory
    return add


def register_launcher(name: str, launch_ranks: Callable) -> None:
    """Make `launch_ranks(cfg, *, pool, network, timeout)` start strategy `name`'s ranks."""
    LAUNCHERS[name] = launch_ranks


def build(module: nn.Module, comm, cfg) -> Parts:
    """The `Parts` of `cfg.strategy` on this rank."""
    if cfg.strategy not in FACTORIES:
        raise ValueError(f"strategy={cfg.strategy!r} has no factory; registered: "
                         f"{sorted(FACTORIES)} (import syncedu registers every topic's)")
    return FACTORIES[cfg.strategy](module, comm, cfg)


@register("single", float64=True)
def _single(module, comm, cfg) -> Parts:
    return Parts(module, make_optimizer(module.parameters(), cfg))
