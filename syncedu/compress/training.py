"""Train with a compressor on simulated ranks: loss, bytes and residuals per step.

A plain loop, so the lesson can show every line: each rank computes the
gradient of its share of the global batch, `compressor.average_` averages it
layer by layer (one bucket per parameter, keyed by its name), and SGD steps.
With `compression=None` the gradients are averaged with `comm.all_reduce`:
the uncompressed fp32 reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.compress import resolve
from syncedu.train import data, models


@dataclass
class CompressedHistory:
    """What a run gives back (global mean loss per step, bytes, residual norms)."""

    loss: list[float]
    accuracy: float
    sent_per_step: float  # bytes each rank sent per step, averaged over ranks and steps
    ledger: object
    residual_norm: dict[str, list[float]] = field(default_factory=dict)  # rank 0, per layer


def _batch(x, y, step: int, seed: int, global_batch: int, comm):
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    idx = torch.randint(0, len(x), (global_batch,), generator=g)
    mine = idx.chunk(comm.world_size)[comm.rank]  # sync: this rank's share
    return x[mine], y[mine]


def _worker(comm, compressor, steps, global_batch, lr, seed, hidden):
    x, y = data.digits().tensors
    model = models.make("mlp", seed=seed, hidden=hidden)
    params = dict(model.named_parameters())
    losses, norms = [], {name: [] for name in params}
    for step in range(steps):
        xb, yb = _batch(x, y, step, seed, global_batch, comm)
        loss = F.cross_entropy(model(xb), yb)
        model.zero_grad()
        loss.backward()
        for name, p in params.items():  # sync: one bucket per layer
            if compressor is None:
                comm.all_reduce(p.grad, op="avg")
            else:
                compressor.average_(comm, [p.grad], key=name)
            residual = None if compressor is None else compressor.residual(comm, name)
            norms[name].append(0.0 if residual is None else residual.norm().item())
        with torch.no_grad():
            for p in params.values():
                p.sub_(lr * p.grad)
        losses.append(loss.item())
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    return losses, accuracy, norms


def run(compression=None, world_size: int = 2, *, steps: int = 100, global_batch: int = 64,
        lr: float = 0.1, seed: int = 0, hidden: int = 64, network=None) -> CompressedHistory:
    """Train the digits MLP on `world_size` simulated ranks with `compression`."""
    compressor = resolve(compression)
    if compressor is not None:
        compressor.reset()  # a fresh run starts with empty residuals and no warm start
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} must be a multiple of "
                         f"world_size={world_size}")
    res = sim.run(_worker, world_size, args=(compressor, steps, global_batch, lr, seed, hidden),
                  network=network)
    loss = [sum(r[0][s] for r in res) / world_size for s in range(steps)]
    sent = sum(res.ledger.sent) / world_size / steps
    return CompressedHistory(loss, res[0][1], sent, res.ledger, res[0][2])
