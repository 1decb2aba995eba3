"""Uneven inputs on real ranks (3 ranks with 4, 7 and 5 batches): the hang and its fixes.

1. `hang`: plain DDP. Once rank 0 runs out, ranks 1 and 2 wait in `backward()`'s
   allreduce for a peer that never comes, until the group's (short) timeout;
2. `joined`: `Join([model])` (`divide_by_initial_world_size=False`; DDP's `model.join()`
   returns that same `Join([self], ...)`), our `train_joined`, and
   `throw_on_early_termination=True` (all stop when one runs out); `join_gradient_norms`:
   what `divide_by_initial_world_size` changes;
3. `shards`: equal `DistributedSampler` shards, by dropping the tail (`drop_last=True`)
   or padding with repeated samples.

Sources: pytorch#33148 and #38174 (the hang); the DDP `join` docs and the "Distributed
Training with Uneven Inputs Using the Join Context Manager" tutorial.
"""

from __future__ import annotations

import datetime
import re
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from syncedu import data, dp, models

from .join import train_joined

COUNTS = (4, 7, 5)  # batches per rank: rank 0 runs out first


def batches(rank: int, count: int, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank `rank`'s `count` batches of `size` digits (the harness's), the same on every run."""
    x, y = data.digits().tensors
    g = torch.Generator().manual_seed(1000 + rank)
    return [(x[pick], y[pick]) for pick in torch.randint(0, len(y), (count, size), generator=g)]


def _ddp_steps(model, optimizer, data) -> int:
    for x, y in data:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return len(data)


def hang(comm, counts=COUNTS, group_timeout: float = 2.0) -> dict:
    """Step 1: plain DDP on uneven data; a rank with more batches fails after `group_timeout` s.

    Returns `what` happened, `said` (Gloo's first line, no source path) and `waited` (s);
    caught in the rank, so a `launch.Pool`'s ranks live on (only this group breaks).
    """
    group = dist.new_group(timeout=datetime.timedelta(seconds=group_timeout))
    module, data = models.make("mlp", seed=0), batches(comm.rank, counts[comm.rank])
    # The same seeded module on every rank: DDP's construction-time sync (a shape check and a
    # broadcast) is skipped, as a rank slowed by load once lagged past the 2 s timeout in it.
    # The barrier (default group, long timeout) starts the steps together.
    model = DDP(module, process_group=group, init_sync=False)
    dist.barrier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, batch in enumerate(data):
        t0 = time.perf_counter()
        try:
            _ddp_steps(model, optimizer, [batch])
        except RuntimeError as e:
            said = re.sub(r"^\[[^\]]*\]\s*", "", str(e).strip().splitlines()[0])
            short = re.search(r"Timed out waiting \d+ms", said)
            return dict(what=f"backward() of batch {i + 1} failed: "
                             f"{short.group(0) if short else said[:60]}",
                        said=said, waited=time.perf_counter() - t0)
    return dict(what=f"finished its {len(data)} batches", said="", waited=0.0)


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def joined(comm, counts=COUNTS, lr: float = 0.1) -> dict:
    """Step 2: DDP's Join, ours, and throw_on_early_termination."""
    data = batches(comm.rank, counts[comm.rank])
    out = {"init": _params(models.make("mlp", seed=0))}  # where every copy starts
    model = DDP(models.make("mlp", seed=0))  # model.join(...) is this Join([model], ...)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with Join([model], divide_by_initial_world_size=False):
        _ddp_steps(model, optimizer, data)
    out["Join"] = _params(model.module)
    ours = dp.DataParallel(models.make("mlp", seed=0), comm, strategy="flat")
    optimizer = torch.optim.SGD(ours.parameters(), lr=lr)
    out["steps"] = train_joined(ours, optimizer, data, F.cross_entropy)
    out["ours"] = _params(ours.module)
    out["thrown"] = _thrown(comm, data, lr)
    return out


def join_gradient_norms(comm, initial: bool, counts=COUNTS) -> list[float]:
    """Step 2b: this rank's gradient norm at each of its steps under `Join([model],
    divide_by_initial_world_size=initial)`, with no optimizer step (the weights never move,
    so two runs differ only by the divisor: the initial world size, or the ranks still in)."""
    model, norms = DDP(models.make("mlp", seed=0)), []
    with Join([model], divide_by_initial_world_size=initial):
        for x, y in batches(comm.rank, counts[comm.rank]):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            norms.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item())
    return norms


def _thrown(comm, data, lr) -> str:
    """How many batches this rank ran before `throw_on_early_termination` stopped it."""
    model = DDP(models.make("mlp", seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    done = 0
    try:
        with Join([model], throw_on_early_termination=True):
            for batch in data:
                done += _ddp_steps(model, optimizer, [batch])
    except RuntimeError as e:
        return f"stopped after {done} batches: {type(e).__name__}: {str(e).splitlines()[0]}"
    return f"finished its {done} batches"


def shards(n: int, world_size: int, drop_last: bool) -> list[list[int]]:
    """Step 3: each rank's sample indices under `DistributedSampler` (no shuffle)."""
    return [list(DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=False,
                                    drop_last=drop_last)) for r in range(world_size)]
