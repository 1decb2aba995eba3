"""Checkers for notebooks/03_data_parallel's exercises: two syncs and two quick checks.

Each sync runs on 2 and 3 simulated ranks; the checker watches every allreduce (when it
started, whether it was waited on inside backward, what it carried) and the ledger, then
the gradients, and names the first mistake.
"""

from __future__ import annotations

import contextlib
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from syncedu.comm import sim
from syncedu.dp.buckets import build_buckets, trainable_parameters
from syncedu.ui.checkers import answered, answered_number, checker, verdict


class CheckerNet(nn.Module):
    """The checkers' model: odd sizes, a frozen layer, and layer `b` applied twice (tied).
    `reordered` adds a layer `d`, defined after `b` but run before it, so backward completes
    the buckets out of their order (Exercise 03.2); `rare` adds a layer that only rank 1's
    forward runs (`forward(x, rank)`), a data-dependent branch (Exercise 03.1). The same seed
    on every rank: no broadcast in these exercises."""

    def __init__(self, seed: int = 0, reordered: bool = False, rare: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(64, 9)
        self.frozen = nn.Linear(9, 9)
        self.frozen.requires_grad_(False)
        self.b = nn.Linear(9, 9)
        self.d = nn.Linear(9, 9, bias=False) if reordered else None  # 81: its own size
        self.rare = nn.Linear(9, 9) if rare else None  # before c: not last in the flat buffer
        self.c = nn.Linear(9, 10)

    def forward(self, x, rank: int = 0):
        """A net with a frozen layer and a weight used twice (and, if built with them, `d` run
        out of definition order, `rare` run by rank 1 only): what the checker's DP must handle."""
        h = torch.tanh(self.frozen(torch.tanh(self.a(x))))
        h = h if self.d is None else torch.tanh(self.d(h))  # d runs before b, defined after
        h = torch.tanh(self.b(torch.tanh(self.b(h))))  # the same weight twice
        h = torch.tanh(self.rare(h)) if self.rare is not None and rank == 1 else h
        return self.c(h)


def _data(rank: int, batch: int):
    g = torch.Generator().manual_seed(1000 + 7 * rank)  # each rank its own data
    return torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)


NO_GRAD = ("p.grad is None: skip it only if it is frozen (requires_grad=False), as DDP "
           "does; a layer this rank's forward skipped (another ran it) must send zeros")


@contextlib.contextmanager
def _hint(errors, *words):
    """Name the p.grad-is-None mistake behind an error of type `errors` saying `words`."""
    try:
        yield
    except errors as e:
        if all(w in str(e) for w in words):
            raise RuntimeError(NO_GRAD) from e
        raise


def _grads_worker(comm, sync, batch=6):
    model = CheckerNet(rare=True)  # same start on every rank; only rank 1 runs `rare`
    x, y = _data(comm.rank, batch)
    F.cross_entropy(model(x, comm.rank), y).backward()
    comm.ledger.reset()
    with _hint((AttributeError, TypeError), "NoneType"), _hint(RuntimeError, "same shape"):
        sync(comm, list(model.parameters()))
    return [p.grad.clone() if p.grad is not None else None for p in model.parameters()], (x, y)


def matches_whole_batch(res, factor: float = 1.0, net: dict | None = None) -> bool:
    """Does every rank's (gradients, (x, y)), times `factor`, equal one `CheckerNet(**net)`'s
    on all data (equal shards: the mean of the ranks' mean losses, rank r's forward each)?"""
    model = CheckerNet(**(net or {}))
    sum(F.cross_entropy(model(x, r), y) for r, (_, (x, y)) in enumerate(res)).backward()
    pairs = [(g, torch.zeros_like(p) if p.grad is None and p.requires_grad else p.grad)
             for grads, _ in res for g, p in zip(grads, model.parameters())]  # unused: zeros
    return all(g is want is None or None not in (g, want) and torch.allclose(  # frozen: None
        g * factor * len(res), want, atol=1e-6) for g, want in pairs)


def _grads_mistake(pairs, n: int, net: dict) -> str | None:
    """What is wrong with the ranks' gradients `pairs` [(grads, (x, y))] on `n` ranks."""
    if matches_whole_batch(pairs, 1, net):
        return None
    if matches_whole_batch(pairs, 1 / n, net):
        return f"the gradients are the sum over the {n} ranks: divide by the world size"
    for wrong in (1, 2, 3, 4, 8):
        if wrong != n and matches_whole_batch(pairs, wrong / n, net):
            return (f"the gradients were divided by {wrong} on {n} ranks: a hard-coded world "
                    f"size; divide by comm.world_size")
    if all(matches_whole_batch([pair], 1, net) for pair in pairs[:1]):
        return ("p.grad still holds each rank's own gradient: wait for every handle, then "
                "copy each averaged slice back into p.grad")
    if any(not torch.equal(g, h) for g, h in zip(pairs[0][0], pairs[-1][0]) if None not in (g, h)):
        return ("the ranks ended with different gradients: their flat buffers were laid out "
                "differently (grad-None parameters moved?): one order on every rank, zeros")
    return "not the average over all ranks, or a frozen parameter got a .grad: leave it None"


def _other_ops(res) -> str | None:
    """A collective besides all_reduce (e.g. an all_gather doing the work of a dummy allreduce)."""
    others = sorted(set(res.ledger.ops) - {"all_reduce"})
    return (f"{', '.join(others)} used besides all_reduce: the averaging must be done by the "
            f"allreduce of the gradients themselves") if others else None


@checker
def flat_sync(sync, world_sizes=(2, 3)) -> bool:
    """Exercise 03.1: average every gradient with ONE all_reduce of a flat buffer."""
    name = "Exercise 1 (flat buffer)"
    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(_grads_worker, n, args=(sync,)))
        calls = res.ledger.ops["all_reduce"].calls if "all_reduce" in res.ledger.ops else [0] * n
        many = None if calls == [1] * n else (f"{calls[0]} comm.all_reduce calls per rank; use "
                                               f"exactly one, on the flat buffer")
        if why := _grads_mistake(list(res), n, {"rare": True}) or many or _other_ops(res):
            return verdict(name, False, f"with {n} ranks: {why}")
    return verdict(name, True, f"one allreduce, averaged gradients on "
                   f"{' and '.join(map(str, world_sizes))} ranks (frozen layer skipped)")


# ------------------------------------------------------------ build it: bucketed overlap
BUCKET_CAPS = (300, 700)  # bytes: 4 and 2 buckets of the checker's model under DDP's rule
NET2 = {"reordered": True}  # Exercise 03.2's model: layer d runs before b, defined after it


def ready_points(cap: int) -> list[int]:
    """How many gradients backward has produced when each DDP bucket may launch: once it is
    complete and every earlier bucket has launched (in bucket order, the same on every rank).
    The order is the one backward really produces, recorded by hooks, not definition order."""
    model, order = CheckerNet(**NET2), []
    for p in trainable_parameters(model):
        p.register_post_accumulate_grad_hook(lambda p: order.append(id(p)))
    F.cross_entropy(model(_data(0, 5)[0]), _data(0, 5)[1]).backward()
    done = [max(order.index(id(p)) + 1 for p in b.params)
            for b in build_buckets(trainable_parameters(model), cap)]
    return list(accumulate(done, max))


class _Watched:
    """A handle that records in which phase it was waited on."""

    def __init__(self, work, phase, waits):
        self._work, self._phase, self._waits = work, phase, waits

    def wait(self, *args, **kwargs):
        self._waits.append(self._phase[0])
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _overlap_worker(comm, bucketed_sync, cap, batch=5):
    """Two backward passes (a bucket's ready count must reset for the next one): per pass,
    every allreduce (phase, async_op, elements, gradients ready); the phases of the waits."""
    model = CheckerNet(**NET2)
    phase, ready, calls, waits = ["setup"], [0], [], []
    for p in trainable_parameters(model):  # registered first: they run before the learner's
        p.register_post_accumulate_grad_hook(lambda p: ready.__setitem__(0, ready[0] + 1))
    real = comm.all_reduce

    def spy(tensor, *args, **kwargs):
        async_op = bool(kwargs.get("async_op", args[1] if len(args) > 1 else False))
        calls[-1].append((phase[0], async_op, tensor.numel(), ready[0]))
        work = real(tensor, *args, **kwargs)
        return _Watched(work, phase, waits) if async_op else work

    comm.all_reduce = spy
    with _hint(RuntimeError, "require", "grad"):
        finish = bucketed_sync(comm, list(model.parameters()), cap)
    if not callable(finish):
        raise TypeError(f"bucketed_sync must return a function finish(), got {finish!r}")
    x, y = _data(comm.rank, batch)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        phase[0], ready[0] = "backward", 0
        calls.append([])
        F.cross_entropy(model(x), y).backward()
        phase[0] = "finish"
        with _hint((AttributeError, TypeError), "NoneType"):
            finish()
    grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    return grads, (x, y), calls, waits


def _overlap_mistake(res, calls, waits, cap: int) -> str | None:
    """What is wrong with one backward pass's allreduces `calls`."""
    points = ready_points(cap)
    buckets = build_buckets(trainable_parameters(CheckerNet(**NET2)), cap)
    sizes, n_params = [b.buffer.numel() for b in buckets], sum(len(b.params) for b in buckets)
    if not calls:
        return "no comm.all_reduce at all: each full bucket needs one"
    if not any(when == "backward" for when, *_ in calls):
        return ("nothing was sent during backward: start each bucket's allreduce from the "
                "hook that fills it, not in finish() (that is the flat buffer, no overlap)")
    if "backward" in waits:
        return ("a handle was waited on inside backward: async_op=True followed at once by "
                ".wait() is a blocking call; keep the handles and wait in finish()")
    if not all(async_op for when, async_op, *_ in calls if when == "backward"):
        return ("a blocking all_reduce inside a hook stalls backward until the bytes arrive: "
                "pass async_op=True and keep the handle for finish() to wait on")
    if len(calls) == n_params != len(points):
        return (f"{len(calls)} allreduces, one per parameter: pack the gradients into buckets "
                f"of about cap_bytes={cap} (expected {len(points)})")
    if len(calls) != len(points):
        return (f"{len(calls)} allreduces for cap_bytes={cap}, expected {len(points)}: walk "
                f"the trainable parameters from last to first (the order backward produces "
                f"them) and close a bucket once it holds cap_bytes or more (DDP's rule)"
                + (", not before the parameter that would overflow it: that one goes in"
                   if len(calls) > len(points) else "") + "; use the cap you are given")
    for i, ((_, _, numel, _), size) in enumerate(zip(calls, sizes)):
        if numel != size and numel in sizes[i + 1:]:
            return (f"bucket {sizes.index(numel)} was launched before bucket {i}: launch in "
                    f"bucket order, a complete bucket waits for the earlier ones (every rank "
                    f"must issue the same collectives in the same order)")
        if numel != size:
            return (f"bucket {i}'s allreduce carried {numel} elements, but its gradients are "
                    f"{size}: send the bucket's flat buffer of gradients")
    if why := _other_ops(res):
        return why
    for i, ((when, _, _, seen), want) in enumerate(zip(calls, points)):
        if when != "backward" or seen > want:
            return (f"bucket {i}'s allreduce started after {seen} gradients were ready, but "
                    f"its own were all ready after {want}: launch it from the hook that "
                    f"completes it (launching every bucket at the end hides nothing)")
        if seen < want:
            return (f"bucket {i}'s allreduce started after {seen} gradients, before {want}: "
                    f"a bucket launches once its last gradient is ready and every earlier "
                    f"bucket has launched")
    return None


@checker
def bucketed_overlap(bucketed_sync, world_sizes=(2, 3), caps=BUCKET_CAPS) -> bool:
    """Exercise 03.2: hooks + async allreduce per bucket; finish() leaves averaged .grad."""
    name = "Exercise 2 (bucketed overlap)"
    for n in world_sizes:
        for cap in caps:
            res = answered(name, lambda n=n, cap=cap: sim.run(
                _overlap_worker, n, args=(bucketed_sync, cap)))
            pairs, (_, _, passes, waits) = [(grads, xy) for grads, xy, _, _ in res], res[0]
            why = [_overlap_mistake(res, calls, waits, cap) for calls in passes]
            why = why[0] or (why[1] and f"in the second backward: {why[1]} (reset each bucket's "
                             f"count of ready gradients once it is launched)")
            if why := why or _grads_mistake(pairs, n, NET2):
                return verdict(name, False, f"with {n} ranks, cap_bytes={cap}: {why}")
    counts = " and ".join(str(len(ready_points(c))) for c in caps)
    return verdict(name, True, f"{counts} buckets (caps {caps[0]} and {caps[1]} bytes), each "
                   f"sent from the hook that completed it; averaged gradients on "
                   f"{' and '.join(map(str, world_sizes))} ranks")


@checker
def quick_scaled_lr(answer) -> bool:
    """Quick check: the linear scaling rule, lr 0.1 at batch 256, batch 8192."""
    name = "Quick check (linear scaling rule)"
    got = answered_number(name, answer)
    if abs(got - 3.2) < 1e-9:
        return verdict(name, True, "0.1 x 8192/256 = 3.2 (Goyal et al. 2017)")
    if abs(got - 0.1 * (8192 / 256) ** 0.5) < 1e-9:
        return verdict(name, False, "that is the square-root rule; Goyal et al.'s rule is linear")
    return verdict(name, False, f"{got!r}: multiply the lr by the factor the batch grew")


@checker
def quick_hiding_bandwidth(answer) -> bool:
    """Quick check: Gbit/s to hide a ring allreduce of 100 MB on 64 ranks in 120 ms."""
    name = "Quick check (bandwidth to hide communication)"
    got = answered_number(name, answer)
    want = 2 * 63 / 64 * 100e6 / 0.120 * 8 / 1e9  # 13.125
    if abs(got - want) <= 0.01 * want:  # 13.1 or 13 accepted; 13.33 (no (N-1)/N) is not
        return verdict(name, True, f"{want:.1f} Gbit/s = 2(N-1)/N * S / T, in bits")
    if abs(got - want / 8) <= 1e-3 * want / 8:
        return verdict(name, False, "that is GB/s; the question asks Gbit/s (x8)")
    if abs(got - 100e6 / 0.120 * 8 / 1e9) <= 0.01 * want:
        return verdict(name, False, "each rank sends 2(N-1)/N * S in a ring, not S")
    return verdict(name, False, f"{got!r}: bytes per rank 2(N-1)/N * S over T seconds, in Gbit/s")
