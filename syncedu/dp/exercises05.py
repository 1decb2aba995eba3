"""Checker for notebooks/05_gradient_accumulation's build-it exercise, `accumulate`: two
steps of the learner's `train_step` on 2 and 3 simulated ranks; it counts `optimizer.step()`
calls, compares the ledger with one sync per step (and where `no_sync()` was active at each
forward and backward), then the parameters with two SGD steps on the whole batches and with
the usual wrong answers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.dp.data_parallel import DataParallel
from syncedu.dp.exercises03 import CheckerNet
from syncedu.ui.checkers import answered, checker, verdict

LR = 0.5
STEPS = 2  # two calls: a forgotten zero_grad shows in the second
LUMPED = ("the K forwards ran before one backward (of their summed losses?): all K graphs and "
          "their activations stay alive, no memory saved; backward each micro-batch first")
ONE_PASS = ("{} forwards and backwards in {} steps of K={}: one pass over the concatenated "
            "micro-batches is no accumulation (no memory saved); one pass per micro-batch")


def _micro_batches(rank: int, k: int, per_micro: int, step: int = 0):
    g = torch.Generator().manual_seed(100 + rank + 1000 * step)
    x = torch.rand(k * per_micro, 64, generator=g)
    y = torch.randint(0, 10, (k * per_micro,), generator=g)
    return list(zip(x.split(per_micro), y.split(per_micro)))


def _spy(wrapped: DataParallel, log: list) -> None:
    """Record, per forward and per backward, whether `no_sync()` was active then."""
    def after_forward(module, args, out):
        if out.requires_grad:
            out.register_hook(lambda g: log.append(("backward", not module.require_sync)))

    wrapped.register_forward_pre_hook(lambda m, args: log.append(("forward", not m.require_sync)))
    wrapped.register_forward_hook(after_forward)


def _wrapped(comm, seed: int = 0):
    """The checker's model (seeded `seed`) and its bucketed `DataParallel` on `comm`."""
    model = CheckerNet(seed=seed)  # odd sizes, a frozen layer, a tied weight
    return model, DataParallel(model, comm, "bucketed", bucket_cap_mb=0.002)


def _worker(comm, train_step, k: int, per_micro: int):
    model, wrapped = _wrapped(comm, seed=comm.rank)  # rank 0's copy is broadcast
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    steps, log = [], []
    real_step = optimizer.step
    optimizer.step = lambda *a, **kw: (steps.append(1), real_step(*a, **kw))[1]
    _spy(wrapped, log)
    comm.ledger.reset()
    for step in range(STEPS):
        train_step(wrapped, optimizer, _micro_batches(comm.rank, k, per_micro, step))
    wrapped.close()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return params, len(steps), log


def _one_sync_bytes(world_size: int) -> list[int]:
    """Ledger bytes per rank of one gradient synchronization of the checker's model."""
    def worker(comm):
        _, wrapped = _wrapped(comm)  # the same buckets as the learner's run
        comm.ledger.reset()
        F.cross_entropy(wrapped(torch.rand(2, 64)), torch.tensor([0, 1])).backward()
        wrapped.finish_gradient_synchronization()
        wrapped.close()
    return sim.run(worker, world_size).ledger.ops["all_reduce"].sent


def _after_steps(world_size: int, k: int, per_micro: int, which: str) -> torch.Tensor:
    """Parameters after STEPS SGD steps with the gradient `which` describes (one process)."""
    model = CheckerNet(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scale = {"right": 1.0, "unscaled": float(k), "last only": 1.0 / k, "no zero_grad": 1.0}
    for step in range(STEPS):
        if which != "no zero_grad":
            optimizer.zero_grad()
        batches = [_micro_batches(r, k, per_micro, step) for r in range(world_size)]
        if which == "last only":  # zero_grad inside the loop: only the last micro-batch, / K
            batches = [b[-1:] for b in batches]
        x, y = (torch.cat(t) for t in zip(*[xy for b in batches for xy in b]))
        (F.cross_entropy(model(x), y) * scale[which]).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _traffic_mistake(res, one: list[int], k: int, n: int) -> str | None:
    sent = res.ledger.ops["all_reduce"].sent if "all_reduce" in res.ledger.ops else [0] * n
    one = [STEPS * b for b in one]  # one synchronization per optimizer step
    if sent == one:
        return None
    log = res[0][2]
    fwd, bwd = ([quiet for kind, quiet in log if kind == k] for k in ("forward", "backward"))
    if sum(sent) == 0:
        return ("no gradient was synchronized: the last micro-batch must run outside "
                "no_sync() (each rank stepped with its own gradients)")
    if sent == [k * b for b in one] and not any(fwd) and any(bwd):
        return (f"no_sync() wraps only backward(): the forward outside it already armed the "
                f"sync, so every micro-batch synchronized ({k}x the bytes of one sync); put "
                f"the forward inside no_sync() too")
    if sent == [k * b for b in one] and not any(fwd):
        return (f"every micro-batch synchronizes ({k}x the bytes of one sync): run the "
                f"forward and backward of the first K-1 micro-batches inside model.no_sync()")
    return (f"rank 0 sent {sent[0]:,} gradient bytes, one synchronization is {one[0]:,}: "
            f"only the last micro-batch's forward and backward may run outside no_sync()")


def _params_mistake(res, n: int, k: int, per_micro: int) -> str | None:
    got = [r[0] for r in res]
    if any(not torch.allclose(g, got[0], atol=1e-6) for g in got[1:]):
        if any(quiet for _, quiet in res[0][2][2 * k - 1::2 * k]):  # a step's last backward
            return ("the micro-batch outside no_sync() must be the last: the gradients of the "
                    "backwards after the synchronized one stayed on their rank")
        return ("the ranks ended with different parameters: call "
                "model.finish_gradient_synchronization() after the last backward, before "
                "optimizer.step() (our wrapper leaves the averaged gradients in .grad then)")
    close = {which: torch.allclose(got[0], _after_steps(n, k, per_micro, which), atol=1e-5)
             for which in ("right", "unscaled", "last only", "no zero_grad")}
    if close["right"]:
        return None
    if close["unscaled"]:
        return (f"the gradient is {k}x the whole batch's: divide each micro-batch loss by "
                f"K={k} (the batch loss is the mean of the micro-batch means)")
    if close["no zero_grad"]:
        return ("the first step's gradient was still in .grad during the second: call "
                "optimizer.zero_grad() once per optimizer step, before its first micro-batch")
    if close["last only"]:
        return ("only the last micro-batch's gradient was kept: call optimizer.zero_grad() "
                "once, before the loop, not for every micro-batch")
    return "the step differs from one SGD step on the whole global batch"


@checker
def accumulate(train_step, world_sizes=(2, 3), k: int = 3, per_micro: int = 3) -> bool:
    """Exercise 05.1: one optimizer step from K micro-batches with one gradient sync."""
    name = "Exercise 1 (accumulate with no_sync)"
    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(_worker, n, args=(train_step, k, per_micro)))
        if (steps := res[0][1]) != STEPS:
            return verdict(name, False, f"with {n} ranks optimizer.step() ran {steps} times "
                            f"in {STEPS} calls of K={k} micro-batches: step once per call, after "
                            f"the last backward (stepping each micro-batch takes {k} small "
                            f"steps, not one step on the large batch)")
        kinds = [kind for kind, _ in res[0][2]]  # forwards and backwards, in order
        if why := ((kinds != ["forward", "backward"] * (len(kinds) // 2) and LUMPED)
                   or (len(kinds) != 2 * k * STEPS and ONE_PASS.format(len(kinds) // 2, STEPS, k))
                   or _traffic_mistake(res, _one_sync_bytes(n), k, n)
                   or _params_mistake(res, n, k, per_micro)):
            return verdict(name, False, f"with {n} ranks: {why}")
    return verdict(name, True, f"one sync per step on {' and '.join(map(str, world_sizes))} "
                    "ranks, parameters equal two steps on the whole batches (ranks seeded "
                    "differently, a frozen layer and a tied weight)")
