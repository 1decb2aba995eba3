"""Which line of the Horovod recipe does what: each one left out in turn, on real Horovod ranks.

The articles this course answers label `hvd.broadcast_parameters` "gradient compression"
and call `hvd.DistributedOptimizer` optional. In a Horovod rank, `without_each` trains
the digits MLP a few steps in four variants, each rank's model seeded by its rank (as
an unseeded model would be), and returns {variant: this rank's parameters}:

1. the recipe: `broadcast_parameters` (the initial state sync) + `DistributedOptimizer`
   (the gradient averaging, mandatory) with `compression=Compression.none`;
2. without the broadcast: the ranks start apart, and averaged gradients keep them apart;
3. without the wrapper: nothing is averaged, each rank trains on its own shard;
4. Horovod's AMP pattern (horovod/docs/pytorch.rst, "mixed precision"): `GradScaler`,
   `opt.synchronize()`, `unscale_`, clipping, then `step` inside `opt.skip_synchronize()`.

Compression is the wrapper's `compression=` argument, nothing else (Horovod 0.28.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from syncedu.train import data, models
from syncedu.train.runner import max_param_diff

VARIANTS = ("recipe", "no broadcast", "no DistributedOptimizer", "amp pattern")


def without_each(steps: int = 8, lr: float = 0.1) -> dict:
    """Inside a Horovod rank: train `steps` steps with each line of the recipe left out in
    turn; the final parameters of each variant (so a cell shows what each line does).
    """
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    x, y = data.digits().tensors
    out = {}
    for i, variant in enumerate(VARIANTS):
        model = models.make("mlp", seed=hvd.rank())  # each rank its own initial weights
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        if variant != "no DistributedOptimizer":
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           compression=hvd.Compression.none, op=hvd.Average,
                                           backward_passes_per_step=1)
        if variant != "no broadcast":
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if variant == "amp pattern" \
            else None
        for step in range(steps):
            lo = (step * hvd.size() + hvd.rank()) * 16  # this rank's 16 samples of the step
            opt.zero_grad()
            loss = F.cross_entropy(model(x[lo:lo + 16]), y[lo:lo + 16])
            if scaler is None:
                loss.backward()
                opt.step()
                continue
            scaler.scale(loss).backward()
            opt.synchronize()                       # the allreduces finish here
            scaler.unscale_(opt)                    # on the averaged gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            with opt.skip_synchronize():            # step() must not synchronize again
                scaler.step(opt)
            scaler.update()
        out[variant] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        del opt  # a new DistributedOptimizer per variant: its hooks go with the model
        hvd.allreduce(torch.zeros(1), name=f"variant.{i}")  # the ranks finish a variant together
    return out  # no hvd.shutdown(): Horovod shuts down at exit, or the caller's job does


def mismatched_names(wait: float = 4.0) -> str:
    """Submit an allreduce named after this rank, so the ranks never match; report after `wait` s.

    Horovod matches collectives by name, so `grad.rank0` and `grad.rank1` wait for
    each other forever. The rank's own watchdog (a timeout of its own, measured after
    `hvd.init()`) polls the handle for `wait` seconds and returns "still waiting",
    or "finished" / "aborted: ..." if Horovod ended the wait (as its stall shutdown
    would). Run it last in a job: the pending tensor stays until `hvd.shutdown()`.
    """
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    handle = hvd.allreduce_async(torch.ones(3), name=f"grad.rank{hvd.rank()}")  # differ
    start = time.monotonic()
    while time.monotonic() - start < wait:
        try:
            if hvd.poll(handle):
                hvd.synchronize(handle)
                return "finished"
        except Exception as e:  # Horovod aborted the wait (shut down)
            return f"aborted: {type(e).__name__}"
        time.sleep(0.05)
    return "still waiting"


def rank_gap(res: list[dict], variant: str) -> float:
    """Largest |rank 0 - rank r| over the parameters of `variant` (0: the ranks agree)."""
    return max(max_param_diff(r[variant], res[0][variant]) for r in res[1:])


def reference(steps: int = 8, lr: float = 0.1, world_size: int = 2) -> dict:
    """One process, rank 0's initial weights, the global batch of each step (16 per rank)."""
    x, y = data.digits().tensors
    model = models.make("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        lo, hi = step * world_size * 16, (step + 1) * world_size * 16
        opt.zero_grad()
        F.cross_entropy(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
