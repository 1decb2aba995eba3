"""`TrainConfig`: one training job, validated (frozen and picklable, sent to every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from syncedu.train.compression import resolve
from syncedu.train.optimizers import OPTIMIZERS, check_optimizer_options  # noqa: F401

# Every name train.run accepts; each topic registers its factories (train/strategies.py).
STRATEGIES = ("single", "naive", "flat", "bucketed", "ddp", "local_sgd",
              "zero1", "zero2", "zero3", "horovod")
# Strategies whose gradient traffic a compressor can shrink.
COMPRESSIBLE = ("naive", "flat", "bucketed", "ddp", "horovod")
MISTAKES = (None, "sync_every", "partial_no_sync", "unscaled_loss")
DATASETS = ("digits", "synthetic")
MODELS = ("mlp", "cnn")


def _int(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r} must be an int >= {low}")


@dataclass(frozen=True)
class TrainConfig:
    """A seeded job: model, data, optimizer, strategy, accumulation.

    `optimizer`: "sgd" (with `momentum`), "adam" or "adamw" (optimizers.py).
    `compression`: kept as given (a name or a picklable object), resolved on each
    rank. `compute_seconds`: modeled compute per micro-batch, charged layer by
    layer (layer_compute.py). `lr` is reached after warm-up: with `warmup_steps`
    > 0 it grows linearly from lr / warmup_steps (Goyal et al. 2017).
    """

    strategy: str
    world_size: int
    steps: int
    global_batch: int
    accumulation: int = 1
    lr: float = 0.1
    seed: int = 0
    model: str = "mlp"
    dataset: str = "digits"
    momentum: float = 0.0
    warmup_steps: int = 0
    bucket_cap_mb: float = 25.0
    mistake: str | None = None
    set_epoch: bool = True
    compute_seconds: float = 0.0
    timeline_steps: int = 3
    synthetic_size: int = 2048
    model_kwargs: tuple = ()
    ddp_hook: bool = True  # count DDP's traffic with a comm hook (False: DDP's own C++ path)
    optimizer: str = "sgd"
    sync_every: int = 1  # local_sgd: average the parameters every sync_every optimizer steps
    compression: object = None  # None, "fp16", "bf16", a name or a compress object
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)  # adam / adamw only
    eps: float = 1e-8  # adam / adamw only

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is unknown; choose one of {STRATEGIES}")
        _int("world_size", self.world_size, 1)
        if self.strategy == "single" and self.world_size != 1:
            raise ValueError(f"strategy='single' is the one-process reference: world_size must "
                             f"be 1, got {self.world_size}")
        for name, low in (("steps", 1), ("global_batch", 1), ("accumulation", 1),
                          ("warmup_steps", 0), ("timeline_steps", 0), ("synthetic_size", 2),
                          ("sync_every", 1)):
            _int(name, getattr(self, name), low)
        if self.global_batch % (self.world_size * self.accumulation):
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of "
                             f"world_size * accumulation = {self.world_size * self.accumulation}")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be > 0")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum={self.momentum!r} must be in [0, 1)")
        if not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb={self.bucket_cap_mb!r} must be > 0")
        if not self.compute_seconds >= 0:
            raise ValueError(f"compute_seconds={self.compute_seconds!r} must be >= 0")
        self._check_choices()
        self._check_optimizer()
        self._check_compression()

    def _check_optimizer(self) -> None:
        check_optimizer_options(self)
        if self.optimizer != "sgd" and self.momentum:
            raise ValueError(f"momentum={self.momentum!r} applies to optimizer='sgd' only "
                             f"(Adam keeps its own moments): leave it 0")
        if self.sync_every != 1 and self.strategy != "local_sgd":
            raise ValueError(f"sync_every={self.sync_every} applies to strategy='local_sgd' "
                             f"only; the other strategies synchronize every step")

    def _check_compression(self) -> None:
        if self.compression is None:
            return
        if self.strategy not in COMPRESSIBLE:
            raise ValueError(f"compression={self.compression!r} needs a strategy that sends "
                             f"gradients, one of {COMPRESSIBLE}; got strategy={self.strategy!r}")
        resolve(self.compression)  # raises ValueError naming what is allowed

    def _check_choices(self) -> None:
        if self.mistake not in MISTAKES:
            raise ValueError(f"mistake={self.mistake!r} is unknown; choose one of {MISTAKES}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset={self.dataset!r} is unknown; choose one of {DATASETS}")
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is unknown; choose one of {MODELS}")
        if isinstance(self.model_kwargs, dict):  # accept a dict, store it hashable
            object.__setattr__(self, "model_kwargs", tuple(sorted(self.model_kwargs.items())))
        size = 1797 if self.dataset == "digits" else self.synthetic_size
        if self.global_batch > size:
            raise ValueError(f"global_batch={self.global_batch} must be <= the dataset size {size}")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based), warm-up included."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.lr
