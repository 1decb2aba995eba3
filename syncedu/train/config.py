"""`TrainConfig`: one training job, validated (frozen and picklable, sent to every rank)."""

from __future__ import annotations

from dataclasses import dataclass, field

from syncedu.comm.runs import check_bool, check_choice, check_int
from syncedu.train import strategies
from syncedu.train.compression import resolve
from syncedu.train.optimizers import check_optimizer_options

# Accumulation mistakes: "sync_every" (no `no_sync`), "partial_no_sync" (`no_sync` around
# `backward()` only: the forward already decided to sync), "unscaled_loss" (not divided by K).
MISTAKES = (None, "sync_every", "partial_no_sync", "unscaled_loss")
DATASETS = ("digits", "synthetic")
MODELS = ("mlp", "cnn")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class TrainConfig:
    """A seeded job: model, data, optimizer, strategy, accumulation."""

    strategy: str
    world_size: int
    steps: int
    global_batch: int
    accumulation: int = 1
    lr: float = 0.1
    seed: int = 0
    model: str = "mlp"
    dataset: str = "digits"
    # "float64": strategies registered with float64=True only; CPUs' last bits ~1e9x closer
    dtype: str = "float32"
    momentum: float = 0.0
    warmup_steps: int = 0  # > 0: the rate grows from lr / warmup_steps to lr (Goyal et al. 2017)
    bucket_cap_mb: float = 25.0
    mistake: str | None = None
    set_epoch: bool = True
    compute_seconds: float = 0.0  # modeled compute per micro-batch
    timeline_steps: int = 3
    synthetic_size: int = 2048
    holdout: int = 0  # > 0: that many samples (seeded) never trained on; accuracy is on them
    model_kwargs: tuple = ()
    ddp_hook: bool = True  # count DDP's traffic with a comm hook (False: DDP's own C++ path)
    broadcast_buffers: bool = True  # rank 0's buffers to all at every forward, as DDP's default
    optimizer: str = "sgd"
    sync_every: int = 1  # local_sgd: average the parameters every sync_every optimizer steps
    start_local_at: int = 0  # local_sgd: average every step until then (post-local SGD)
    strategy_config: object = None  # a topic's own settings, e.g. tuning's DiLoCoConfig
    topology: str = "ring"  # dpsgd: the gossip graph (decentralized/gossip.py)
    inner_steps: int = 8  # streaming_diloco: H inner steps between two syncs of a fragment
    fragments: int = 1  # streaming_diloco: F fragments (1: DiLoCo)
    compression: object = None  # None, "fp16", "bf16", a name or a compressor (as given)
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)  # adam / adamw only
    eps: float = 1e-8  # adam / adamw only
    # `compression` resolved once (train/compression.py); each rank's strategy copies it.
    compressor: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_choice("strategy", self.strategy, strategies.names())  # what topics registered
        check_int("world_size", self.world_size, 1)
        if self.strategy == "single" and self.world_size != 1:
            raise ValueError(f"strategy='single' is the one-process reference: world_size must "
                             f"be 1, got {self.world_size}")
        for name, low in (("steps", 1), ("global_batch", 1), ("accumulation", 1),
                          ("warmup_steps", 0), ("timeline_steps", 0), ("synthetic_size", 2),
                          ("sync_every", 1), ("start_local_at", 0)):
            check_int(name, getattr(self, name), low)
        if self.global_batch % (self.world_size * self.accumulation):
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of "
                             f"world_size * accumulation = {self.world_size * self.accumulation}")
        for name, ok, rule in (("bucket_cap_mb", self.bucket_cap_mb > 0, "> 0"),
                               ("compute_seconds", self.compute_seconds >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} must be {rule}")
        self._check_options()

    def _check_options(self) -> None:
        for name, allowed in (("mistake", MISTAKES), ("dataset", DATASETS), ("model", MODELS),
                              ("dtype", DTYPES)):
            check_choice(name, getattr(self, name), allowed)
        if isinstance(self.model_kwargs, dict):  # accept a dict, store it hashable
            object.__setattr__(self, "model_kwargs", tuple(sorted(self.model_kwargs.items())))
        size = 1797 if self.dataset == "digits" else self.synthetic_size
        check_int("holdout", self.holdout, 0)
        check_bool("broadcast_buffers", self.broadcast_buffers)
        if self.global_batch > size - self.holdout:
            raise ValueError(f"global_batch={self.global_batch} must be <= the training set's size "
                             f"{size - self.holdout} (the dataset's {size} less holdout)")
        check_optimizer_options(self)  # optimizer, lr, momentum, weight_decay, betas, eps
        if self.dtype != "float32" and (self.strategy not in strategies.FLOAT64
                                        or self.compression):
            raise ValueError(f"dtype={self.dtype!r} applies to strategy in "
                             f"{strategies.names(strategies.FLOAT64)} without "
                             f"compression only; got strategy={self.strategy!r}, compression="
                             f"{self.compression!r}")
        for name, default in (("sync_every", 1), ("start_local_at", 0)):
            if getattr(self, name) != default and self.strategy != "local_sgd":
                raise ValueError(f"{name}={getattr(self, name)} applies to strategy='local_sgd' "
                                 f"only; the other strategies synchronize every step")
        # Resolved once, here (a ValueError naming what is allowed); `compression` stays as given.
        compressor = resolve(self.compression)
        object.__setattr__(self, "compressor", compressor)
        allowed = (strategies.names(strategies.COMPRESSIBLE) if compressor is None
                   else compressor.strategies)  # torch's PowerSGD: ("ddp",)
        if self.compression is not None and self.strategy not in allowed:
            raise ValueError(f"compression={self.compression!r} needs a strategy that sends "
                             f"gradients through it, one of {allowed}; got "
                             f"strategy={self.strategy!r}")
        if compressor is not None:
            compressor.check_config(self)  # its own rules (torch's PowerSGD: one DDP bucket)
        if self.strategy in strategies.CHECKS:
            strategies.CHECKS[self.strategy](self)  # the topic's own rules
        elif self.strategy_config is not None:
            raise ValueError(f"strategy_config= applies to a strategy that takes one, not "
                             f"strategy={self.strategy!r}")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based), warm-up included."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.lr
