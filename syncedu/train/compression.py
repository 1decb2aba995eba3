"""What `compression=` accepts: None, a name `syncedu.compress` registers, or an object that
implements the declared `GradientCompressor` protocol (`syncedu.compress.Compressor` does, with
real defaults), resolved without importing that topic.

`TrainConfig` resolves it once (`resolve`, into `cfg.compressor`) and the strategies hand a
per-rank copy of that one object to `DataParallel`, DDP's hook and Horovod alike (in DDP the
same job is one hop: `register_comm_hook(state, hook)`); nothing probes for optional members.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from syncedu.train import strategies

COMPRESSORS: dict[str, type] = {}  # name -> class, filled by syncedu.compress


@runtime_checkable
class GradientCompressor(Protocol):
    """The compressor protocol: what `TrainConfig`, `DataParallel` and DDP's hook call, with
    real defaults (`syncedu.compress.Compressor` extends it; any object with these members
    also passes). `name`: how it prints.
    """

    name: ClassVar[str]

    def average_(self, comm, tensors, key: str = "bucket") -> None:
        """Average `tensors` over every rank of `comm` in place, compressed on the wire.

        `key` names the bucket (a compressor with state, such as error feedback, keeps it per key).
        """
        raise NotImplementedError

    def check(self, comm) -> None:
        """Raise before any traffic if this compressor cannot run on `comm`'s backend."""

    @property
    def strategies(self) -> tuple[str, ...]:
        """The `train.run` strategies that send gradients through it: the registry's
        compressible ones (a compressor may narrow them, as torch's PowerSGD does to "ddp")."""
        return strategies.names(strategies.COMPRESSIBLE)

    def check_config(self, cfg) -> None:
        """Raise on a training job it cannot run (none by default; torch's PowerSGD: more
        than one DDP bucket)."""

    def ddp_hook(self, comm=None):
        """`(state, hook)` for `DistributedDataParallel.register_comm_hook`."""
        raise NotImplementedError


def resolve(spec) -> GradientCompressor | None:
    """None or "none" -> None; a registered name -> a fresh compressor; a compressor -> itself."""
    if spec is None or spec == "none":
        return None
    if isinstance(spec, GradientCompressor):
        return spec
    if isinstance(spec, str) and spec in COMPRESSORS:
        return COMPRESSORS[spec]()
    raise ValueError(f"compression={spec!r} is not supported; use None, one of "
                     f"{sorted(COMPRESSORS)}, or a Compressor from syncedu.compress")
