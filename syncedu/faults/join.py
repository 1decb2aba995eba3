"""Join from scratch: uneven inputs without a hang, for `dp.DataParallel`.

A rank out of batches stops calling the gradient allreduce its peers still call: they
hang until the timeout (pytorch#33148, #38174). `DistributedDataParallel.join()` and
`torch.distributed.algorithms.Join` (Pei et al., the "Generic Join Context Manager"
tutorial) have a done rank *shadow* its peers' collectives with zeros until every rank
is done. Ours sends one buffer per step, the shadow and the "am I still here" vote
together. On every rank:

1. build the buffer: every gradient flattened (zeros on a rank out of data),
   then one count, 1.0 if this rank trained this step, else 0.0;
2. sum it over all ranks (one `all_reduce`, answered by every rank, done or not);
3. read the count n: the ranks that trained. n == 0 means every rank is done;
   otherwise divide the summed gradients by n (the active ranks, like DDP's
   `join(divide_by_initial_world_size=False)`) and put them in `.grad`;
4. every rank, done or not, takes the same optimizer step, so the copies stay
   equal without DDP's final broadcast.
"""

from __future__ import annotations

import torch

from syncedu import dp


def join_allreduce(comm, params, has_data: bool) -> int:
    """Steps 1-3: the shadow allreduce; returns how many ranks trained this step."""
    grads = [p.grad if (has_data and p.grad is not None) else torch.zeros_like(p)
             for p in params]
    flag = torch.ones(1) if has_data else torch.zeros(1)
    flat = torch.cat([g.reshape(-1) for g in grads] + [flag.to(grads[0].dtype)])  # Step 1
    comm.all_reduce(flat)  # Step 2: op="sum" on every rank, done or not
    active = int(round(flat[-1].item()))  # Step 3
    if active:
        offset = 0
        for p in params:
            p.grad = (flat[offset:offset + p.numel()] / active).view_as(p).clone()
            offset += p.numel()
    return active


def train_joined(model: dp.DataParallel, optimizer, batches, loss_fn) -> int:
    """Train `model` on this rank's `batches` (any length) until no rank is active; the steps."""
    params = dp.trainable_parameters(model.module)
    it, steps = iter(batches), 0
    while True:
        batch = next(it, None)
        optimizer.zero_grad(set_to_none=True)
        if batch is not None:
            with model.no_sync():
                loss_fn(model(batch[0]), batch[1]).backward()
        if join_allreduce(model.comm, params, batch is not None) == 0:
            return steps
        optimizer.step()  # Step 4: joined ranks too, with the same averaged gradient
        steps += 1
