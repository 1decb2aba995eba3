"""Checkers for notebooks/09_tuning_playbook's exercises."""

from __future__ import annotations

import torch

from syncedu.comm import sim
from syncedu.ui.checkers import attempt, checker, verdict


def _outer_worker(comm, answer, seed):
    """Each rank holds the same anchor and its own local parameters; run 3 outer steps."""
    from syncedu.tuning.diloco import nesterov_step, outer_gradient

    g = torch.Generator().manual_seed(seed)
    anchor = torch.randn(10, generator=g)
    mine, ref = (anchor.clone(), torch.zeros(10)), (anchor.clone(), torch.zeros(10))
    for step in range(3):
        local = ref[0] + 0.1 * (comm.rank + 1 + step) * torch.randn(10, generator=g)
        answer(comm, mine[0], local.clone(), mine[1], 0.7, 0.9)
        delta = outer_gradient(comm, ref[0], local)
        nesterov_step(ref[0], ref[1], delta, lr=0.7, momentum=0.9)
    return (mine[0] - ref[0]).abs().max().item()


@checker
def outer_step(answer) -> bool:
    """Exercise 09.1: `answer(comm, anchor, local, buf, lr, momentum)`: anchor, buf in place."""
    name = "Exercise 1 (DiLoCo's outer step)"
    for n in (2, 3, 4):
        ok, res = attempt(name, lambda n=n: sim.run(_outer_worker, n, args=(answer, n)))
        if not ok:
            return False
        if max(res) > 1e-5:
            return verdict(name, False, f"with {n} ranks the anchor is off by {max(res):.2g}: "
                            "average (anchor - local) over the ranks, then v = m v + delta, "
                            "anchor -= lr (delta + m v)")
    return verdict(name, True, "three outer steps equal DiLoCo's on 2, 3 and 4 ranks")


@checker
def two_batch(answer) -> bool:
    """Exercise 09.2: `answer(small_sq, big_sq, b_small, b_big)` -> (|G|^2, tr(Sigma))."""
    name = "Exercise 2 (the two-batch estimator)"
    for g2, trace, bs, bb in ((1.0, 10.0, 4, 16), (0.3, 50.0, 8, 64), (2.0, 1.0, 1, 2)):
        small, big = g2 + trace / bs, g2 + trace / bb
        ok, got = attempt(name, lambda s=small, b=big, x=bs, y=bb: answer(s, b, x, y))
        if not ok:
            return False
        try:
            good = abs(got[0] - g2) < 1e-6 * max(1, g2) and abs(got[1] - trace) < 1e-6 * trace
        except (TypeError, IndexError):
            good = False
        if not good:
            return verdict(name, False, f"for |G|^2={g2}, tr(Sigma)={trace}, batches {bs} and "
                            f"{bb} you returned {got!r}: solve E|G_B|^2 = |G|^2 + tr(Sigma)/B "
                            "at both batches")
    return verdict(name, True)


@checker
def pick_sync_every(answer) -> bool:
    """Exercise 09.3: `answer(model_bytes, compute_seconds, network, world_size)` -> smallest H."""
    from syncedu.comm.network import Network
    from syncedu.tuning.scaling_advice import SYNC_EVERY, _local_sgd

    name = "Exercise 3 (how often to synchronize)"
    cases = [(100e6, 0.1, Network.preset("wan"), 8), (25e6, 0.2, Network.preset("ethernet_1g"), 16),
             (4e6, 0.05, Network.preset("ethernet_10g"), 64)]
    for s, c, net, n in cases:
        ok, got = attempt(name, lambda s=s, c=c, net=net, n=n: answer(s, c, net, n))
        if not ok:
            return False
        want = _local_sgd(s, c, n, net, 0.9)[0]
        if got != want:
            return verdict(name, False, f"{s / 1e6:g} MB, {c} s compute, {net.name}, N={n}: "
                            f"you said H={got!r}, the smallest H in {SYNC_EVERY} reaching 90% "
                            f"is {want}")
    return verdict(name, True)
