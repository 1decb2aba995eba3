"""Checkers for notebooks/09_tuning_playbook's exercises."""

from __future__ import annotations

import torch

from syncedu.comm import sim
from syncedu.comm.network import Network
from syncedu.tuning.scaling import SYNC_EVERY, local_sgd_every
from syncedu.ui.checkers import answered, checker, refuse, verdict

_LIBRARY_1 = {"outer_gradient", "nesterov_step", "outer_step", "DiLoCo", "after_step"}
_LIBRARY_2 = {"two_batch", "NoiseScale", "noise_scale"}
_LIBRARY_3 = {"local_sgd_every", "recommend"}


def _names(code) -> set[str]:
    """Every global, closure and attribute name a function's code (and nested code) mentions."""
    out = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            out |= _names(const)
    return out


def _refuse_copied(name: str, answer, library) -> None:
    """End the grading (False) if the answer calls the package's own functions (it must build
    them itself)."""
    code = getattr(answer, "__code__", None)
    if copied := (sorted(_names(code) & library) if code else []):
        refuse(name, f"your answer calls the package's {', '.join(copied)}: build it yourself")


def _outer_worker(comm, answer, seed):
    """Same anchor everywhere, each rank its own local parameters; 3 outer steps.

    Every rank computes the reference without communicating: the trace holds the answer's.
    """
    g = torch.Generator().manual_seed(seed)
    n = comm.world_size
    anchor, buf = torch.randn(10, generator=g), torch.zeros(10)
    ref, ref_buf = anchor.clone(), torch.zeros(10)
    for step in range(3):
        z = torch.randn(10, generator=g)
        locals_ = [ref + 0.1 * (r + 1 + step) * z * (-1) ** r for r in range(n)]
        answer(comm, anchor, locals_[comm.rank].clone(), buf, 0.7, 0.9)
        delta = sum(ref - loc for loc in locals_) / n  # Step 3, by hand
        ref_buf.mul_(0.9).add_(delta)  # Step 4: v = m v + delta
        ref.sub_(delta + 0.9 * ref_buf, alpha=0.7)  # anchor -= lr (delta + m v)
    return (anchor - ref).abs().max().item()


def _pattern(res, n: int) -> str:
    """'' if every rank's traffic is one allreduce of one model per step, else what it did.

    Every rank is judged, from the trace and the ledger: no rooted collective, and each rank
    sends and receives about one ring allreduce of the model per step (a ring's chunks differ
    by at most one element). A root that collects the changes and sends the mean back (a
    parameter server, by `send`/`recv` or `reduce`) is what the exercise rules out.
    """
    ops = set(res.trace.op.tolist())
    one_model = 3 * 2 * (n - 1) * 4 * 10 // n  # three ring allreduces of 10 fp32 per rank
    rooted = ops & {"all_gather", "gather", "all_gather_object", "broadcast", "scatter", "reduce"}
    if rooted:  # point-to-point sends are fine (a ring built by hand): the bytes decide
        return (f"with {n} ranks your step used {sorted(rooted)}: gathering or reducing at a "
                "root sends N models through it; one allreduce of (anchor - local) is enough")
    for what, per_rank in (("sent", res.ledger.sent), ("received", res.ledger.received)):
        r, low = max(range(n), key=per_rank.__getitem__), min(per_rank)
        if per_rank[r] > 1.25 * low:
            return (f"with {n} ranks rank {r} {what} {per_rank[r]} bytes in 3 steps, another rank "
                    f"only {low}: a root that collects the changes and sends the mean back is a "
                    "parameter server; in one allreduce every rank sends and receives the same")
        if per_rank[r] > 1.25 * one_model:
            return (f"with {n} ranks rank {r} {what} {per_rank[r]} bytes in 3 steps, "
                    f"{per_rank[r] / one_model:.1f}x one allreduce of the model per step: "
                    "send the change once")
    return ""


@checker
def outer_step(answer) -> bool:
    """Exercise 09.1: `answer(comm, anchor, local, buf, lr, momentum)`: anchor, buf in place."""
    name = "Exercise 1 (DiLoCo's outer step)"
    _refuse_copied(name, answer, _LIBRARY_1)
    for n in (2, 3, 4):
        res = answered(name, lambda n=n: sim.run(_outer_worker, n, args=(answer, 10 + n)))
        if max(res) > 1e-5:
            return verdict(name, False, f"with {n} ranks the anchor is off by {max(res):.2g}: "
                            "average (anchor - local) over the ranks, then v = m v + delta, "
                            "anchor -= lr (delta + m v)")
        if wrong := _pattern(res, n):
            return verdict(name, False, wrong)
    return verdict(name, True, "three outer steps equal DiLoCo's on 2, 3 and 4 ranks, "
                               "one allreduce of the model per step (the trace)")


@checker
def two_batch(answer) -> bool:
    """Exercise 09.2: `answer(small_sq, big_sq, b_small, b_big)` -> (|G|^2, tr(Sigma))."""
    name = "Exercise 2 (the two-batch estimator)"
    _refuse_copied(name, answer, _LIBRARY_2)
    for g2, trace, bs, bb in ((1.0, 10.0, 4, 16), (0.3, 50.0, 8, 64), (2.0, 1.0, 1, 2)):
        small, big = g2 + trace / bs, g2 + trace / bb
        got = answered(name, lambda s=small, b=big, x=bs, y=bb: answer(s, b, x, y))
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
    """Quick check 09.3: `answer(model_bytes, compute_seconds, world_size, network)` -> H."""
    name = "Quick check 3 (how often to synchronize)"
    _refuse_copied(name, answer, _LIBRARY_3)
    # The last case is bandwidth-bound at N = 2, where the ring's (N-1)/N halves the bytes:
    # a ring cost without it, 2(N-1) alpha + 2 S beta, answers 8 there instead of 4.
    cases = [(100e6, 0.1, 8, Network.preset("wan")), (25e6, 0.2, 16, Network.preset("ethernet_1g")),
             (4e6, 0.05, 64, Network.preset("ethernet_10g")), (1e6, 0.5, 4, Network.preset("wan")),
             (10e6, 0.2, 2, Network.preset("ethernet_1g"))]
    for s, c, n, net in cases:
        got = answered(name, lambda s=s, c=c, n=n, net=net: answer(s, c, n, net))
        want = local_sgd_every(s, c, n, net)[0]
        if got != want:
            return verdict(name, False, f"{s / 1e6:g} MB, {c} s compute, N={n}, {net.name}: "
                            f"you said H={got!r}, the smallest H in {SYNC_EVERY} reaching 90% "
                            f"is {want}")
    return verdict(name, True)
