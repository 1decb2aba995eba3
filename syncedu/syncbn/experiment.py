"""The small-batch BatchNorm experiment: plain BN vs SyncBN vs one process.

Data-parallel `SmallCNN` on the 8x8 digits, `per_rank_batch` samples per rank and step (2-4,
a detector's batch per GPU; MegDet, Peng et al. 2018). Modes: "plain" (each rank's BN on its
own tiny batch and running statistics), "syncbn" (layers converted to `SyncBatchNorm`),
"single" (one process on the global batch, the reference). Steps on every rank:

1. build the model with the same seed on every rank (same initial weights);
2. for each step take this rank's slice of the global batch, forward, backward;
3. average every gradient (ledger op "gradients"), then the same SGD step;
4. in eval mode, the test accuracy with this rank's running statistics.

Not `train.run`'s loop: it reports only rank 0, and this needs every rank's own running
statistics and accuracy on held-out images.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from syncedu.comm.ledger import Ledger
from syncedu.syncbn import sync_batchnorm as syncbn
from syncedu.train import data, models, runner
from syncedu.train.sampling import check_int

MODES = ("plain", "syncbn", "single")


@dataclass(frozen=True)
class BNConfig:
    """One run of the experiment (validated; picklable for real ranks)."""

    mode: str = "syncbn"
    world_size: int = 4
    per_rank_batch: int = 2
    steps: int = 150
    lr: float = 0.05
    momentum: float = 0.9
    channels: int = 8
    seed: int = 0
    test_size: int = 360

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {MODES}")
        for name in ("world_size", "per_rank_batch", "steps", "channels", "test_size"):
            check_int(name, getattr(self, name), 1)
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"lr={self.lr} must be > 0 and momentum={self.momentum} in [0, 1)")

    @property
    def global_batch(self) -> int:
        return self.world_size * self.per_rank_batch


@dataclass(frozen=True)
class BNResult:
    """What a run gives: global mean loss per step, and per rank its test accuracy (eval mode)
    and running statistics {layer: (running_mean, running_var)}."""

    loss: list[float]
    accuracy: list[float]
    running: list[dict]
    params: dict               # rank 0's final parameters
    ledger: Ledger
    seconds: float             # logical seconds of the run (simulated ranks)

    def spread(self) -> dict[str, float]:
        """Largest difference between two ranks' running statistics (any layer, channel):
        "mean" absolute, "var" relative to the ranks' average variance."""
        out = {"mean": 0.0, "var": 0.0}
        for layer in self.running[0]:
            means, varis = (torch.stack([r[layer][i] for r in self.running]) for i in (0, 1))
            rng = lambda t: t.max(0).values - t.min(0).values  # noqa: E731
            out["mean"] = max(out["mean"], rng(means).max().item())
            out["var"] = max(out["var"], (rng(varis) / varis.mean(0)).max().item())
        return out


@functools.cache
def split(seed: int = 0, test_size: int = 360):
    """(train_x, train_y, test_x, test_y) of the digits by a seeded permutation (read-only)."""
    x, y = data.digits(images=True).tensors
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, train = perm[:test_size], perm[test_size:]
    return x[train], y[train], x[test], y[test]


def batches(cfg: BNConfig, n_train: int) -> torch.Tensor:
    """(steps, global_batch) sample indices, the same for every mode with this seed."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    per_epoch = n_train // cfg.global_batch
    epochs = -(-cfg.steps // per_epoch)
    rows = [torch.randperm(n_train, generator=g)[:per_epoch * cfg.global_batch]
            .view(per_epoch, cfg.global_batch) for _ in range(epochs)]
    return torch.cat(rows)[:cfg.steps]


def worker(comm, cfg: BNConfig, tensors, idx):
    """Steps 1-4 on one rank; returns (losses, accuracy, running stats, parameters)."""
    train_x, train_y, test_x, test_y = tensors
    # Step 1: same seed, same weights everywhere.
    model = models.make("cnn", seed=cfg.seed, channels=cfg.channels)
    if cfg.mode == "syncbn":
        model = syncbn.convert(model, comm)  # sync: BatchNorm over the global batch
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    b = idx.shape[1] // comm.world_size
    losses = []
    for step in range(cfg.steps):
        # Step 2: this rank's slice of the global batch.
        mine = idx[step, comm.rank * b:(comm.rank + 1) * b]
        loss = F.cross_entropy(model(train_x[mine]), train_y[mine])
        opt.zero_grad()
        loss.backward()
        # Step 3: average the gradients (BN weight/bias too), then step.
        with comm.scope("gradients"):
            for p in model.parameters():
                comm.all_reduce(p.grad, op="avg")  # sync: data-parallel gradients
        opt.step()
        losses.append(loss.item())
    # Step 4: evaluate with this rank's running statistics.
    model.eval()
    with torch.no_grad():
        acc = (model(test_x).argmax(1) == test_y).double().mean().item()
    running = {name: (m.running_mean.clone(), m.running_var.clone())
               for name, m in model.named_modules() if hasattr(m, "running_var")}
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, acc, running, params


def run(cfg: BNConfig, *, network=None, simulate: bool = True, pool=None) -> BNResult:
    """Run one configuration on simulated ranks (or real ones: `simulate=False`, `pool=`)."""
    tensors = split(cfg.seed, cfg.test_size)
    idx = batches(cfg, len(tensors[1]))
    ranks = 1 if cfg.mode == "single" else cfg.world_size
    res = runner.run(worker, ranks, (cfg, tensors, idx), network=network, simulate=simulate,
                     pool=pool, job=f"mode={cfg.mode!r}")
    loss = [sum(r[0][s] for r in res) / len(res) for s in range(cfg.steps)]
    return BNResult(loss, [r[1] for r in res], [r[2] for r in res], res[0][3], res.ledger,
                    res.seconds)


def compare(per_rank_batch: int = 2, world_size: int = 4, steps: int = 150,
            seed: int = 0, *, network=None, simulate: bool = True, **kwargs
            ) -> dict[str, BNResult]:
    """The three modes side by side, same data and initial weights: {mode: result}."""
    return {mode: run(BNConfig(mode=mode, world_size=world_size, per_rank_batch=per_rank_batch,
                               steps=steps, seed=seed, **kwargs), network=network,
                      simulate=simulate) for mode in MODES}


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
        feats = model.features[:3 * layer - 2](split(seed)[0]).double()  # (n, C, 8, 8)
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
