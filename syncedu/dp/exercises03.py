"""Checkers for notebooks/03_data_parallel's exercises.

The build-it exercise (`bucketed_overlap`): the learner writes
`bucketed_sync(comm, params, cap_bytes) -> finish`, which registers
`register_post_accumulate_grad_hook` hooks that start each bucket's
`comm.all_reduce(buffer, async_op=True)` as soon as backward has filled it, and
returns `finish()`, which waits and leaves averaged gradients in `.grad`. The
checker runs it on 2 and 3 simulated ranks with a model of odd layer sizes and
names the first mistake: no allreduce during backward, blocking calls, the
wrong number of buckets for DDP's rule, gradients summed but not averaged or
never copied back. Then two quick checks (numbers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.dp.buckets import build_buckets
from syncedu.train import models
from syncedu.ui.checkers import attempt, checker, number, verdict


def _model():
    """The checker's model, the same on every rank: an MLP of odd layer sizes."""
    return models.make("mlp", seed=0, hidden=9, depth=2)


def _grads_worker(comm, sync, batch=6):
    model = _model()  # same start on every rank
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    F.cross_entropy(model(x), y).backward()
    comm.ledger.reset()
    sync(comm, list(model.parameters()))
    return [p.grad.clone() for p in model.parameters()], (x, y)


def matches_whole_batch(res, atol: float = 1e-6) -> bool:
    """Does every rank hold the gradients of one model on all ranks' data together?

    `res[r]` is (gradients, (x, y)) from a worker built on `_model()`.
    """
    model = _model()
    x = torch.cat([r[1][0] for r in res])
    y = torch.cat([r[1][1] for r in res])
    F.cross_entropy(model(x), y).backward()
    return all(torch.allclose(g, p.grad, atol=atol)
               for grads, _ in res for g, p in zip(grads, model.parameters()))


@checker
def flat_sync(sync, world_size: int = 3) -> bool:
    """Exercise 03.1: average every gradient with ONE all_reduce of a flat buffer."""
    name = "Exercise 1 (flat buffer)"
    ok, res = attempt(name, lambda: sim.run(_grads_worker, world_size, args=(sync,)))
    if not ok:
        return False
    if not matches_whole_batch(res):
        return verdict(name, False, "the gradients are not the average over all ranks")
    calls = res.ledger.ops.get("all_reduce")
    if calls is None or calls.calls != [1] * world_size:
        return verdict(name, False, "use exactly one comm.all_reduce per rank")
    return verdict(name, True)


# ------------------------------------------------------------ build it: bucketed overlap
BUCKET_CAP = 300  # bytes: the checker's model gets 3 buckets under DDP's rule


def ddp_bucket_count(sizes_in_order: list[int], cap: int) -> int:
    """Buckets DDP's rule makes for float32 tensors of `sizes_in_order` bytes (last first).

    The rule is the package's own `build_buckets` (dp/buckets.py), which walks
    the parameters from last to first and closes a bucket once it holds >= `cap` bytes.
    """
    params = [torch.empty(size // 4) for size in reversed(sizes_in_order)]
    return len(build_buckets(params, cap))


def _overlap_worker(comm, bucketed_sync, cap, batch=5):
    model = _model()  # 6 tensors of 2304..36 bytes
    calls = []
    real = comm.all_reduce

    def spy(tensor, *args, **kwargs):
        async_op = kwargs.get("async_op", args[1] if len(args) > 1 else False)
        calls.append((phase[0], bool(async_op), tensor.numel()))
        return real(tensor, *args, **kwargs)

    phase = ["setup"]
    comm.all_reduce = spy
    finish = bucketed_sync(comm, list(model.parameters()), cap)
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    phase[0] = "backward"
    F.cross_entropy(model(x), y).backward()
    phase[0] = "finish"
    if not callable(finish):
        raise TypeError(f"bucketed_sync must return a function finish(), got {finish!r}")
    finish()
    return [p.grad.clone() for p in model.parameters()], (x, y), calls


def _overlap_mistake(res, n: int, cap: int) -> str | None:
    calls = res[0][2]
    sizes = [p.numel() * 4 for p in _model().parameters()]
    want = ddp_bucket_count(sizes[::-1], cap)
    if not calls:
        return "no comm.all_reduce at all: each full bucket needs one"
    if not any(when == "backward" for when, _, _ in calls):
        return ("nothing was sent during backward: start each bucket's allreduce from the "
                "hook that fills it, not in finish() (that is the flat buffer, no overlap)")
    if not all(async_op for when, async_op, _ in calls if when == "backward"):
        return ("a blocking all_reduce inside a hook stalls backward until the bytes arrive: "
                "pass async_op=True and keep the handle for finish() to wait on")
    if len(calls) == len(sizes):
        return (f"{len(calls)} allreduces, one per parameter: pack the gradients into buckets "
                f"of about cap_bytes={cap} (expected {want})")
    if len(calls) != want:
        return (f"{len(calls)} allreduces for cap_bytes={cap}, expected {want}: walk the "
                f"parameters from last to first (the order backward produces them) and close "
                f"a bucket once it holds cap_bytes or more (DDP's rule)")
    return None


def _grads_mistake(res, n: int) -> str | None:
    pairs = [(grads, xy) for grads, xy, _ in res]  # drop the calls: (gradients, batch)
    if matches_whole_batch(pairs):
        return None
    if matches_whole_batch([([g / n for g in grads], xy) for grads, xy in pairs]):
        return f"the gradients are the sum over the {n} ranks: divide by the world size"
    if all(matches_whole_batch([pair]) for pair in pairs):
        return ("p.grad still holds each rank's own gradient: in finish(), wait for every "
                "handle, then copy each bucket's averaged slice back into p.grad")
    return "the gradients are not the average over all ranks"


@checker
def bucketed_overlap(bucketed_sync, world_sizes=(2, 3), cap: int = BUCKET_CAP) -> bool:
    """Exercise 03.2: hooks + async allreduce per bucket; finish() leaves averaged .grad."""
    name = "Exercise 2 (bucketed overlap)"
    for n in world_sizes:
        ok, res = attempt(name, lambda n=n: sim.run(_overlap_worker, n,
                                                     args=(bucketed_sync, cap)))
        if not ok:
            return False
        why = _overlap_mistake(res, n, cap) or _grads_mistake(res, n)
        if why:
            return verdict(name, False, f"with {n} ranks: {why}")
    calls = len(res[0][2])
    return verdict(name, True, f"{calls} buckets sent during backward, averaged gradients "
                    f"on {' and '.join(map(str, world_sizes))} ranks")


@checker
def quick_scaled_lr(answer) -> bool:
    """Quick check: the linear scaling rule, lr 0.1 at batch 256, batch 8192."""
    name = "Quick check (linear scaling rule)"
    ok, got = number(name, answer)
    if not ok:
        return False
    if abs(got - 3.2) < 1e-9:
        return verdict(name, True, "0.1 x 8192/256 = 3.2 (Goyal et al. 2017)")
    if abs(got - 0.1 * (8192 / 256) ** 0.5) < 1e-9:
        return verdict(name, False, "that is the square-root rule; Goyal et al.'s rule is linear")
    return verdict(name, False, f"{got!r}: multiply the lr by the factor the batch grew")


@checker
def quick_hiding_bandwidth(answer) -> bool:
    """Quick check: Gbit/s to hide a ring allreduce of 100 MB on 64 ranks in 120 ms."""
    name = "Quick check (bandwidth to hide communication)"
    ok, got = number(name, answer)
    if not ok:
        return False
    want = 2 * 63 / 64 * 100e6 / 0.120 * 8 / 1e9  # 13.125
    if abs(got - want) <= 0.01 * want:  # 13.1 or 13 accepted; 13.33 (no (N-1)/N) is not
        return verdict(name, True, f"{want:.1f} Gbit/s = 2(N-1)/N * S / T, in bits")
    if abs(got - want / 8) <= 1e-3 * want / 8:
        return verdict(name, False, "that is GB/s; the question asks Gbit/s (x8)")
    if abs(got - 100e6 / 0.120 * 8 / 1e9) <= 0.01 * want:
        return verdict(name, False, "each rank sends 2(N-1)/N * S in a ring, not S")
    return verdict(name, False, f"{got!r}: bytes per rank 2(N-1)/N * S over T seconds, in Gbit/s")
