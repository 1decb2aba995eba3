"""Checkers for notebooks/11_when_ranks_fail's exercises, each naming the plausible slips."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from syncedu import models, sim
from syncedu.ui.checkers import answered, checker, verdict

from .goodput import daly_interval, young_interval
from .join import join_allreduce
from .uneven import batches

WORLDS = ((2, 4, 3), (3, 1, 4, 2))  # batches per rank: a hard-coded world size fails one
_MODEL = dict(seed=0, hidden=9, depth=2)


def _active(counts) -> list[int]:
    """The ranks with a batch at each step, then 0 ("all done"): what a right answer returns."""
    return [sum(c > i for c in counts) for i in range(max(counts))] + [0]


def _join_worker(comm, fn, counts, lr=0.5):
    """Train with the learner's `fn` (plain SGD by hand: no optimizer object to hide a bug)."""
    model = models.make("mlp", **_MODEL)
    params, data, actives = list(model.parameters()), batches(comm.rank, counts[comm.rank]), []
    for i in range(max(counts) + 2):  # a correct answer stops after max(counts) + 1 calls
        batch = data[i] if i < len(data) else None
        for p in params:
            p.grad = None
        if batch is not None:
            F.cross_entropy(model(batch[0]), batch[1]).backward()
        actives.append(int(fn(comm, params, batch is not None)))
        if actives[-1] == 0:
            break
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= lr * p.grad
    return actives, [p.detach().clone() for p in params]


def _scaled(factor):
    """A known slip: ours, then every gradient times `factor(comm, active)`."""
    def fn(comm, params, has_data):
        n = join_allreduce(comm, params, has_data)
        for p in params:
            if n and p.grad is not None:
                p.grad *= factor(comm, n)
        return n
    return fn


_JOIN_SLIPS = {"divided by the world size, not by the ranks that trained":
               _scaled(lambda comm, n: n / comm.world_size),
               "summed without dividing by the ranks that trained": _scaled(lambda comm, n: n)}


def _same(a, b) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))


@checker
def join_shadow(my_join_allreduce) -> bool:
    """Exercise 1: the shadow allreduce, on simulated ranks at two world sizes."""
    name = "Join shadow allreduce"
    for counts in WORLDS:
        n = len(counts)
        res = answered(name, lambda c=counts: sim.run(_join_worker, len(c), args=(
            my_join_allreduce, c)), deadlock="A rank out of data must still call the same "
            "all_reduce as its peers")
        want = sim.run(_join_worker, n, args=(join_allreduce, counts))
        for r in range(n):
            if res[r][0] != _active(counts):
                return verdict(name, False, f"{n} ranks with {counts} batches: rank {r} saw "
                               f"active-rank counts {res[r][0]}, expected {_active(counts)} "
                               "(the count travels with the gradients; use comm.world_size)")
        for r in range(n):
            if not _same(res[r][1], want[0][1]):
                slip = next((s for s, fn in _JOIN_SLIPS.items() if _same(
                    res[r][1], sim.run(_join_worker, n, args=(fn, counts))[r][1])),
                    "divide the summed gradients by the ranks that trained and put them in "
                    ".grad on every rank, done or not")
                return verdict(name, False, f"{n} ranks: rank {r}'s parameters differ from "
                               f"Join's: {slip}")
    return verdict(name, True, "at 3 and 4 ranks: the active counts and the same parameters "
                   "as Join")


_COMMIT_CASES = [  # (members, succeeded, commit?, why)
    ([0, 1, 2], {0, 1, 2}, True, "every member succeeded"),
    ([0, 1, 2], {0, 1}, False, "replica 2 failed: one failed member discards the step"),
    ([0, 2], {0, 2}, True, "replica 1 is not in this quorum, so the step does not wait for it"),
    ([0, 1, 2, 3], {1, 2, 3}, False, "a majority is not enough: replica 0 failed"),
    ([0, 1], {1}, False, "replica 0 failed"),
    ([], set(), False, "an empty quorum commits nothing"),
    ([1], {1}, True, "a quorum of one that succeeded commits"),
    ([0, 2], {0, 1, 2}, True, "replica 1 was just dropped from the quorum: its success does not count"),
    ([0, 2], {1, 2}, False, "replica 0 failed; replica 1, not a member, cannot stand in for it")]


@checker
def commit_rule(should_commit) -> bool:
    """Exercise 2: commit iff the quorum is not empty and all its members succeeded."""
    name = "commit rule"
    for members, succeeded, want, why in _COMMIT_CASES:
        got = answered(name, lambda m=members, s=succeeded: should_commit(list(m), set(s)))
        if bool(got) != want:
            return verdict(name, False, f"members={members}, succeeded={sorted(succeeded)}: "
                           f"you said {bool(got)}, the step must be "
                           f"{'committed' if want else 'discarded'} ({why})")
    return verdict(name, True, f"all {len(_COMMIT_CASES)} cases")


_SLIPS = {math.sqrt(0.5): "missing the factor 2 under the root",
          math.sqrt(2.0): "an extra factor 2", 1 / 60: "minutes, not seconds"}


@checker
def checkpoint_interval(interval) -> bool:
    """Exercise 3: Young's optimum, tried at several checkpoint costs and MTBFs (seconds)."""
    name = "optimal checkpoint interval"
    for c, m in ((60.0, 11_000.0), (10.0, 3_600.0), (300.0, 86_400.0), (1.0, 50.0)):
        got = answered(name, lambda c=c, m=m: interval(c, m))
        want, x = young_interval(c, m), -1.0
        with contextlib.suppress(TypeError, ValueError, RuntimeError):  # any real: np.float32, 0-d
            x = -1.0 if isinstance(got, (bool, str, bytes)) else float(got)
        if not x > 0:  # NaN too
            return verdict(name, False, f"answer with a positive number of seconds, got {got!r}")
        if abs(x / want - 1) > 1e-3:
            slip = next((s for k, s in _SLIPS.items() if abs(x / want - k) < 1e-3),
                        "the interval grows with the square root of C x M")
            if abs(x / daly_interval(c, m) - 1) < 1e-3:
                slip = "that is Daly's higher-order interval; the first-order one is asked"
            return verdict(name, False, f"C={c:g} s, M={m:g} s: you gave {x:.4g} s ({slip})")
    return verdict(name, True, "tau* = sqrt(2 C M) at every (C, M) tried")
