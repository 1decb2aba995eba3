"""The same global batches for every strategy: DistributedSampler's order, made explicit.

`DistributedSampler(shuffle=True, seed=s)` orders an epoch as `torch.randperm(n)` from a
generator seeded with `s + epoch` (`set_epoch`) and gives rank r the positions r, r + N,
... of it; with `DataLoader(batch_size=b, drop_last=True)`, step j of all ranks together
reads positions j*B .. j*B + B - 1 (B = N b). So a run is defined by (dataset size, seed,
global batch) alone, whatever the world size or strategy:

1. each epoch's order is that permutation (`set_epoch=False` reuses epoch 0's: the bug);
2. `global_batches`: consecutive chunks, `n // global_batch` per epoch (the tail dropped);
3. `shard(batch, rank, world_size)`: `batch[r::world_size]`, DistributedSampler's rule;
4. `micro_batches(indices, k)`: k equal consecutive parts, for accumulation.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from syncedu.comm.runs import check_int


def steps_per_epoch(n: int, global_batch: int) -> int:
    """How many whole global batches one epoch of `n` samples holds."""
    if check_int("global_batch", global_batch) > n:
        raise ValueError(f"global_batch={global_batch} must be <= the dataset size {n}")
    return n // global_batch


def global_batches(data, steps: int, global_batch: int, *, seed: int = 0,
                   set_epoch: bool = True) -> Iterator[torch.Tensor]:
    """Yield `steps` index tensors of `global_batch` samples (`data`: a dataset or its size)."""
    n = check_int("n", data) if isinstance(data, int) else len(data)
    check_int("steps", steps)
    per_epoch = steps_per_epoch(n, global_batch)
    for step in range(steps):
        epoch, j = divmod(step, per_epoch)
        if j == 0:  # Step 1: a new epoch, a new order (unless set_epoch was forgotten)
            g = torch.Generator().manual_seed(seed + (epoch if set_epoch else 0))
            order = torch.randperm(n, generator=g)
        yield order[j * global_batch:(j + 1) * global_batch]  # Step 2


def batches(dataset, steps: int, global_batch: int, *, seed: int = 0):
    """Yield `(x, y)` tensors of each global batch of a TensorDataset-like `dataset`."""
    x, y = dataset.tensors
    for idx in global_batches(len(dataset), steps, global_batch, seed=seed):
        yield x[idx], y[idx]


def shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s part of a global batch: every `world_size`-th sample from `rank` on."""
    check_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in 0..{world_size - 1}")
    if len(batch) % world_size:
        raise ValueError(f"a global batch of {len(batch)} does not split evenly over "
                         f"world_size={world_size}")
    return batch[rank::world_size]  # Step 3


def micro_batches(indices: torch.Tensor, k: int) -> list[torch.Tensor]:
    """`k` equal consecutive micro-batches of `indices` (Step 4)."""
    check_int("accumulation", k)
    if len(indices) % k:
        raise ValueError(f"{len(indices)} samples do not split into accumulation={k} "
                         "equal micro-batches")
    return list(indices.view(k, -1))
