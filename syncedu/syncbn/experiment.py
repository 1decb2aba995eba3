"""The small-batch BatchNorm experiment: plain BN vs SyncBN vs one process.

Data-parallel `SmallCNN` on the 8x8 digits, `per_rank_batch` samples per rank and step (2-4,
a detector's batch per GPU; MegDet, Peng et al. 2018). Modes: "plain" (each rank's BN on its
own tiny batch and running statistics), "syncbn" (layers converted to `SyncBatchNorm`),
"single" (one process on the global batch, the reference). Each mode is one `train.run`:

1. the model with the same seed on every rank (same initial weights);
2. each step, this rank's shard of the same global batch, drawn from the training split
   (`holdout=test_size` images, seeded, are never trained on);
3. every gradient averaged (strategy "naive": one allreduce per parameter; "syncbn" is
   "naive" after `convert`), then the same SGD step with momentum; the buffers are not
   re-broadcast (`broadcast_buffers=False`, unlike DDP's default): each rank keeps its own;
4. in eval mode, the held-out accuracy with this rank's own running statistics
   (`History.rank_accuracy`, `History.rank_buffers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from syncedu.comm.runs import check_choice, check_int
from syncedu.train import data, harness, models
from syncedu.train.harness import Result

STRATEGY = {"plain": "naive", "syncbn": "syncbn", "single": "single"}  # mode -> train.run's
MODES = tuple(STRATEGY)


@dataclass(frozen=True)
class BNConfig:
    """One run of the experiment (validated here, and lr, momentum and broadcast_buffers by
    `train.run`'s config; picklable for real ranks)."""

    mode: str = "syncbn"
    world_size: int = 4
    per_rank_batch: int = 2
    steps: int = 150
    lr: float = 0.05
    momentum: float = 0.9
    channels: int = 8
    seed: int = 0
    test_size: int = 360
    broadcast_buffers: bool = False  # True: rank 0's buffers re-sent every forward (DDP's default)
    # Plain BN on 2 images amplifies float32's last bits (which change with the thread count
    # and the CPU) into a different test image flipped here and there; float64's are
    # smaller (2**29, about 5e8x), so every machine prints the same table.
    dtype: str = "float64"

    def __post_init__(self):
        check_choice("mode", self.mode, MODES)
        for name in ("world_size", "per_rank_batch", "steps", "channels", "test_size"):
            check_int(name, getattr(self, name), 1)

    @property
    def global_batch(self) -> int:
        """world_size x per_rank_batch samples per step."""
        return self.world_size * self.per_rank_batch


@dataclass
class BNResult(Result):
    """What a run gives: global mean loss per step, and per rank its test accuracy (eval mode)
    and running statistics {layer: (running_mean, running_var)}; `params`: rank 0's final
    parameters and buffers (a state_dict); `seconds`: logical on simulated ranks."""

    accuracy: list[float]
    running: list[dict]

    def spread(self, typical: bool = False) -> dict[str, float]:
        """How far apart two ranks' running statistics lie, channel by channel over every
        layer: the largest range (`typical`: the mean over channels), "mean" absolute,
        "var" relative to the ranks' average variance."""
        means, varis = [], []
        for layer in self.running[0]:
            m, v = (torch.stack([r[layer][i] for r in self.running]) for i in (0, 1))
            means.append(m.max(0).values - m.min(0).values)
            varis.append((v.max(0).values - v.min(0).values) / v.mean(0))
        pick = torch.mean if typical else torch.max
        return {"mean": pick(torch.cat(means)).item(), "var": pick(torch.cat(varis)).item()}


def run(mode: str = "syncbn", world_size: int = 4, *, network=None, simulate: bool = False,
        pool=None, **options) -> BNResult:
    """Steps 1-4: mode `mode` on `world_size` ranks through `train.run`, real (`pool=`) or
    simulated (`simulate=True`; False by default, as in every run function); `options` are
    `BNConfig`'s other fields (`per_rank_batch`, `steps`, `seed`, `broadcast_buffers`, ...)."""
    cfg = BNConfig(mode=mode, world_size=world_size, **options)
    if mode == "single" and (network is not None or pool is not None):
        raise ValueError(f"mode='single' is one process, here: network={network!r} and "
                         f"pool={pool!r} must be None")
    where = {} if mode == "single" else dict(network=network, simulate=simulate, pool=pool)
    h = harness.run(STRATEGY[mode], 1 if mode == "single" else world_size,
                    steps=cfg.steps, global_batch=cfg.global_batch, lr=cfg.lr,
                    momentum=cfg.momentum, seed=cfg.seed, model="cnn",
                    model_kwargs={"channels": cfg.channels}, holdout=cfg.test_size,
                    broadcast_buffers=cfg.broadcast_buffers, dtype=cfg.dtype, progress=False,
                    **where)
    layers = [k[:-len(".running_var")] for k in h.rank_buffers[0] if k.endswith(".running_var")]
    running = [{name: (b[f"{name}.running_mean"], b[f"{name}.running_var"]) for name in layers}
               for b in h.rank_buffers]
    return BNResult(h.rank_accuracy, running, loss=h.loss, params={**h.params, **h.rank_buffers[0]},
                    ledger=h.ledger, seconds=h.seconds)


def compare(world_size: int = 4, *, network=None, simulate: bool = False, **options
            ) -> dict[str, BNResult]:
    """The three modes side by side, same data and initial weights: {mode: result}."""
    return {mode: run(mode, world_size, network=None if mode == "single" else network,
                      simulate=simulate, **options) for mode in MODES}


def stat_noise(batch_sizes=(1, 2, 4, 8, 16, 32), *, params: dict | None = None, layer: int = 1,
               draws: int = 400, seed: int = 0,
               channels: int = 8) -> dict[int, tuple[float, float]]:
    """How far one batch's BatchNorm statistics fall from the whole training set's: at layer
    `layer` (1 or 2) of the SmallCNN (seeded weights, or `params`), for each batch size b,
    {b: RMS over `draws` batches and the channels of (batch mean - mean) / std, and of batch
    var / var - 1}."""
    if layer not in (1, 2):
        raise ValueError(f"layer={layer!r} must be 1 or 2")
    model = models.make("cnn", seed=seed, channels=channels).eval()
    if params is not None:
        model.load_state_dict(params)
    with torch.no_grad():
        train = data.holdout_split(data.digits(images=True), BNConfig.test_size, seed)[0]
        feats = model.features[:3 * layer - 2](train.tensors[0]).double()  # (n, C, 8, 8)
    var, mean = torch.var_mean(feats, dim=(0, 2, 3), correction=0)
    g = torch.Generator().manual_seed(seed + 2)
    out = {}
    for b in batch_sizes:
        pick = torch.stack([torch.randperm(len(feats), generator=g)[:b] for _ in range(draws)])
        sample = feats[pick]  # (draws, b, C, 8, 8)
        bvar, bmean = torch.var_mean(sample, dim=(1, 3, 4), correction=0)
        mean_err = ((bmean - mean) / var.sqrt()).pow(2).mean().sqrt().item()
        var_err = (bvar / var - 1).pow(2).mean().sqrt().item()
        out[b] = (mean_err, var_err)
    return out
