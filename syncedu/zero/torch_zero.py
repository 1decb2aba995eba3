"""The library versions of ZeRO on our model and batches, one worker each (they show
torch's own API, so they keep their own loop): `ddp_worker` (DDP, with torch's optimizer
or `ZeroRedundancyOptimizer`: ZeRO-1 by whole tensors) and `fsdp_worker` (FSDP2's
`fully_shard` on every Linear and the root: ZeRO-3 on `DTensor` shards). Each returns the
final parameters by name and what the lesson shows (optimizer-state elements, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from syncedu.train import models

LR = 0.05


def batch(step: int, rank: int, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s seeded batch for step `step` (64 features, 10 classes)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, 64, generator=g), torch.randint(0, 10, (size,), generator=g)


def model(**kwargs) -> torch.nn.Module:
    """The lesson's small MLP: 64 -> 13 -> 13 -> 10, 1,167 parameters (4 does not divide it)."""
    return models.make("mlp", seed=0, **{"hidden": 13, **kwargs})


def torch_optimizer(params, optimizer: str, zero: bool = False):
    """SGD with momentum 0.9 or Adam, at `LR`; `zero=True`: sharded by ZeroRedundancyOptimizer."""
    cls, kw = ((torch.optim.Adam, {}) if optimizer == "adam" else
               (torch.optim.SGD, {"momentum": 0.9}))
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=LR, **kw)
    return cls(params, lr=LR, **kw)


def _state_elements(opt) -> int:
    """Optimizer-state elements on this rank (ZeroRedundancyOptimizer's shard; DTensors local)."""
    inner = getattr(opt, "optim", opt)
    local = [getattr(t, "to_local", lambda t=t: t)() for s in inner.state.values()
             for t in s.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() for t in local if t.dim() > 0)


def _train(comm, forward, opt, steps: int) -> None:
    for step in range(steps):
        opt.zero_grad()
        x, y = (t.to(comm.device) for t in batch(step, comm.rank))
        F.cross_entropy(forward(x), y).backward()
        opt.step()


def ddp_worker(comm, steps: int = 3, optimizer: str = "sgd", zero: bool = False):
    """DDP with torch's optimizer, or with `ZeroRedundancyOptimizer` (`zero=True`)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = model().to(comm.device)
    ddp = DDP(net)  # sync: broadcasts rank 0's parameters, averages gradients in backward
    opt = torch_optimizer(net.parameters(), optimizer, zero)  # sync: zero -> state sharded
    _train(comm, ddp, opt, steps)
    params = {k: p.detach().cpu().clone() for k, p in net.named_parameters()}
    return params, {"state_elements": _state_elements(opt)}


def fsdp_worker(comm, steps: int = 3, optimizer: str = "sgd"):
    """FSDP2 `fully_shard` on each Linear and on the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = model().to(comm.device)
    mesh = init_device_mesh(comm.device.type, (comm.world_size,))
    for layer in net.modules():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)  # sync: one all-gather / reduce-scatter unit per layer
    fully_shard(net, mesh=mesh)
    opt = torch_optimizer(net.parameters(), optimizer)  # sync: each rank's shards only
    _train(comm, net, opt, steps)
    params = {k: p.full_tensor().detach().cpu().clone() for k, p in net.named_parameters()}
    local = sum(p.to_local().numel() for p in net.parameters())
    return params, {"state_elements": _state_elements(opt), "local_elements": local,
                    "param_type": type(next(net.parameters())).__name__}


def max_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two parameter dicts with the same names."""
    return max((a[k] - b[k]).abs().max().item() for k in a)
