"""Checkers for notebooks/11_when_ranks_fail's exercises.

1. `join_shadow`: the learner writes `my_join_allreduce(comm, params, has_data)
   -> int`, Join's shadow allreduce (join.py's `join_allreduce`). The checker
   trains 3 simulated ranks on 2, 4 and 3 batches with it and compares, step by
   step, the active-rank counts it returns and the final parameters with ours;
   a rank out of data that stops answering shows as the simulator's deadlock.
2. `commit_rule`: `should_commit(members, succeeded) -> bool`, ft.py's Step 4:
   commit only if the quorum is not empty and every member's exchange
   succeeded; tried on cases that separate it from "any", "a majority", "as
   many as the members" and "always".
3. `checkpoint_interval`: `interval(checkpoint, mtbf) -> seconds`, Young's
   optimum sqrt(2 C M), tried at several (C, M) against goodput.py's, with the
   usual slips named (missing factor 2, no square root, C / M).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from syncedu import models, sim
from syncedu.ui.checkers import attempt, checker, verdict

from .goodput import young_interval
from .join import join_allreduce
from .uneven import batches

COUNTS = (2, 4, 3)
ACTIVE = [3, 3, 2, 1, 0]  # ranks that trained at each step, then "all done"
_MODEL = dict(seed=0, hidden=9, depth=2)


def _join_worker(comm, fn, counts=COUNTS, lr=0.5):
    model = models.make("mlp", **_MODEL)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    params, data, actives = list(model.parameters()), batches(comm.rank, counts[comm.rank]), []
    for i in range(max(counts) + 2):  # a correct answer stops after max(counts) + 1 calls
        batch = data[i] if i < len(data) else None
        optimizer.zero_grad(set_to_none=True)
        if batch is not None:
            F.cross_entropy(model(batch[0]), batch[1]).backward()
        actives.append(int(fn(comm, params, batch is not None)))
        if actives[-1] == 0:
            break
        optimizer.step()
    return actives, [p.detach().clone() for p in params]


@checker
def join_shadow(my_join_allreduce) -> bool:
    """Exercise 1: the shadow allreduce, on 3 simulated ranks with 2, 4, 3 batches."""
    name = "Join shadow allreduce"
    try:
        ok, res = attempt(name, lambda: sim.run(_join_worker, 3, args=(my_join_allreduce,)))
    except sim.DeadlockError as e:
        return verdict(name, False, "the ranks deadlocked: a rank out of data must still call "
                       f"the same all_reduce as its peers ({str(e).splitlines()[1].strip()})")
    if not ok:
        return False
    want = sim.run(_join_worker, 3, args=(join_allreduce,))
    for r in range(3):
        if res[r][0] != ACTIVE:
            return verdict(name, False, f"rank {r} saw active-rank counts {res[r][0]}, "
                           f"expected {ACTIVE} (the count travels with the gradients)")
    for r in range(3):
        if not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(res[r][1], want[0][1])):
            return verdict(name, False, f"rank {r}'s parameters differ from Join's: divide the "
                           "summed gradients by the ranks that trained, on every rank")
    return verdict(name, True, "counts 3, 3, 2, 1, 0 and the same parameters as Join")


_COMMIT_CASES = [  # (members, succeeded, commit?)
    ([0, 1, 2], {0, 1, 2}, True), ([0, 1, 2], {0, 1}, False), ([0, 2], {0, 2}, True),
    ([0, 1], {0, 3}, False), ([0, 1, 2, 3], {1, 2, 3}, False), ([], set(), False),
    ([1], {1}, True), ([0, 1, 2], {0, 1, 2, 3}, True)]


@checker
def commit_rule(should_commit) -> bool:
    """Exercise 2: commit iff the quorum is not empty and all its members succeeded."""
    name = "commit rule"
    for members, succeeded, want in _COMMIT_CASES:
        ok, got = attempt(name, lambda m=members, s=succeeded: should_commit(list(m), set(s)))
        if not ok:
            return False
        if bool(got) != want:
            return verdict(name, False, f"members={members}, succeeded={sorted(succeeded)}: "
                           f"you said {bool(got)}, the step must be "
                           f"{'committed' if want else 'discarded'}")
    return verdict(name, True, f"all {len(_COMMIT_CASES)} cases")


_SLIPS = {math.sqrt(0.5): "missing the factor 2 under the root",
          math.sqrt(2.0): "an extra factor 2"}


@checker
def checkpoint_interval(interval) -> bool:
    """Exercise 3: Young's optimum, tried at several checkpoint costs and MTBFs (seconds)."""
    name = "optimal checkpoint interval"
    for c, m in ((60.0, 11_000.0), (10.0, 3_600.0), (300.0, 86_400.0), (1.0, 50.0)):
        ok, got = attempt(name, lambda c=c, m=m: interval(c, m))
        if not ok:
            return False
        want = young_interval(c, m)
        if not isinstance(got, (int, float)) or isinstance(got, bool) or got <= 0:
            return verdict(name, False, f"answer with a positive number of seconds, got {got!r}")
        if abs(got / want - 1) > 1e-3:
            slip = next((s for k, s in _SLIPS.items() if abs(got / want - k) < 1e-3),
                        "the interval grows with the square root of C x M")
            return verdict(name, False, f"C={c:g} s, M={m:g} s: you gave {got:.4g} s ({slip})")
    return verdict(name, True, "tau* = sqrt(2 C M) at every (C, M) tried")
