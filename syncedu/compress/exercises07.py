"""Checkers for notebooks/07_compression_and_precision's exercises (simulated ranks)."""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.compress import PowerSGD, TopK
from syncedu.ui.checkers import answered, checker, verdict


def _rounds(comm, compressor, rounds: int = 3):
    """Every step's averaged tensors, 3 steps of two buckets of 37 entries ("a", "b").

    Same-sized buckets: a residual kept per rank, not per bucket, gives wrong values.
    """
    out = []
    for step in range(rounds):
        g = torch.Generator().manual_seed(100 * comm.rank + step)
        a = [torch.randn(6, 5, generator=g), torch.randn(7, generator=g)]
        b = [3.0 * torch.randn(37, generator=g)]
        compressor.average_(comm, a, "a")
        compressor.average_(comm, b, "b")
        out.append([t.clone() for t in a + b])
    return out


def _odd_buckets(comm, compressor):
    """One step of two buckets where ratio 0.1 x d is 3.2 and 2.0: ceil differs from round(),
    from int() + 1 and from the k of the buckets of 37 (4)."""
    g = torch.Generator().manual_seed(7 + comm.rank)
    out = [torch.randn(32, generator=g), torch.randn(20, generator=g)]
    for key, t in zip("cd", out):
        compressor.average_(comm, [t], key)
    return out


def _same_everywhere(comm, compressor):
    """One bucket equal on every rank: all ranks pick the same k indices, whose values must sum."""
    t = torch.arange(37.0) - 18
    compressor.average_(comm, [t], "same")
    return t


def _close(got, want) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(got, want))


def _first_miss(res, want, n: int):
    """(rank, step) of the first result that differs from the reference, or None."""
    return next(((rank, step) for step in range(3) for rank in range(n)
                 if not _close(res[rank][step], want[rank][step])), None)


@checker
def topk_compressor(make, ratio: float = 0.1, world_sizes=(2, 3)) -> bool:
    """Exercise 07.1: `make()` returns a top-k compressor with error feedback (ratio 0.1)."""
    name = "Exercise 1 (top-k with error feedback)"
    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(_rounds, n, args=(make(),)))
        want = sim.run(_rounds, n, args=(TopK(ratio),))
        miss = _first_miss(res, want, n)
        if miss is not None:
            rank, step = miss
            if all(_close(res[0][s], want[0][s]) for s in range(3)):
                hint = (f"rank 0 is right but rank {rank} is not: every rank must write the "
                        "average back into its own tensors")
            elif _close(res[rank][0][:2], want[rank][0][:2]) and not _close(*(
                    sim.run(_same_everywhere, n, args=(c,))[0] for c in (make(), TopK(ratio)))):
                hint = "sum the values ranks sent for one index (index_add_); out[i] = v keeps one"
            elif not step and _close(res[rank][0][:2], want[rank][0][:2]):
                hint = ("bucket 'a' is right, then bucket 'b' is not: keep one residual per "
                        "rank and per bucket (key), not one per rank")
            elif step:
                hint = ("the first step is right: keep the residual (what you did not send) "
                        "and add it next step, one residual per rank and per bucket (key)")
            else:
                hint = ("even the first step differs: k = ceil(ratio * d) largest |g| of the "
                        "whole bucket, every rank's selection summed, divided by N")
            return verdict(name, False, f"{n} ranks, rank {rank}, step {step + 1}: {hint}")
        if max(res.ledger.sent) > 2 * max(want.ledger.sent):
            return verdict(name, False, f"right values, but {max(res.ledger.sent)} bytes per "
                            f"rank: send only values and indices (about {max(want.ledger.sent)})")
    res = answered(name, lambda: sim.run(_odd_buckets, 2, args=(make(),)))
    if not _close(res[0], sim.run(_odd_buckets, 2, args=(TopK(ratio),))[0]):
        return verdict(name, False, "the buckets of 37 are right, those of 32 and 20 entries "
                       "(ratio x d = 3.2 and 2.0) are not: k = ceil(ratio * d), 4 and 2, not "
                       "round(), int() + 1 or a fixed k")
    return verdict(name, True)


@checker
def topk_bytes(answer) -> bool:
    """Exercise 07.2: bytes one rank sends for top-k over an all-gather ring."""
    name = "Exercise 2 (top-k bytes grow with N)"
    cases = [(2, 1000, 0.01), (8, 1000, 0.01), (64, 25_557_032, 0.001), (4, 10, 0.5)]
    got = answered(name, lambda: [answer(n, d, r) for n, d, r in cases])
    want = [(n - 1) * math.ceil(r * d) * (4 + 4) for n, d, r in cases]
    good = got == want
    return verdict(name, good, "" if good else f"got {got}; each rank forwards N-1 "
                    "payloads of k fp32 values and k int32 indices")


@checker
def powersgd_elements(answer) -> bool:
    """Exercise 07.3: elements PowerSGD sends for one tensor of `shape` at rank r."""
    name = "Exercise 3 (what PowerSGD sends)"
    cases = [((64, 64), 1), ((10, 64), 2), ((64,), 4), ((8, 3, 3, 3), 2), ((4, 4), 2),
             ((10, 3), 2), ((4, 4), 1),  # not worth it; the 2nd on 2r(n+m) == nm (torch: strict <)
             ((3, 400), 5)]  # r > min(n, m): still plain (2 min(n,m) (n+m) > n m always)
    got = answered(name, lambda: [answer(s, r) for s, r in cases])
    want = [PowerSGD(r).wire_elements([s]) for s, r in cases]
    good = got == want
    edge = "" if good or got[:6] + got[7:] != want[:6] + want[7:] else " (<, not <=: = is plain)"
    return verdict(name, good, "" if good else f"got {got}, expected {want}: view (n, ...) as "
                    f"n x m; compress only if 2 r (n + m) < n m; else send all n m{edge}")
