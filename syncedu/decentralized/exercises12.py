"""Lesson 12's exercise checkers: each runs the answer on simulated ranks and reads the trace.

1. `check_gossip_round(fn, topology, n)`: `fn(comm, x)` must do one gossip round in place;
   rejected, by name: an allreduce, a message to a non-neighbour, weights that do not sum to
   1, the self-weight forgotten, asymmetric weights on an undirected graph.
2. `check_rounds(answer, topology, n, target)`: the rounds until the consensus distance is
   at most `target` times its start, predicted from |lambda_2| (it must cover the
   measurement and not overshoot the bound's own prediction).
3. `check_push_sum(fn, keeps)`: `fn(comm, x, w, keep)` runs rounds of push-sum and returns
   the de-biased estimate.
"""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.decentralized.gossip import (consensus_distance, gossip, mixing_matrix, out_peers,
                                          second_eigenvalue)
from syncedu.ui.checkers import attempt, checker, verdict


def _start(rank: int) -> torch.Tensor:
    return torch.randn(6, generator=torch.Generator().manual_seed(100 + rank),
                       dtype=torch.float64)


def _run_round(comm, fn):
    x = _start(comm.rank)
    fn(comm, x)
    return x


def _p2p_only(res, edge, graph: str) -> str | None:
    """What is wrong with the run's traffic (a collective, a message off `graph`), or None."""
    if any(op not in ("send", "recv") for op in res.ledger.ops):
        return (f"the ledger shows {sorted(res.ledger.ops)}: that is a collective (an "
                f"allreduce); send to neighbours only, point-to-point")
    far = sorted({(m.src, m.dst) for m in res.trace if not edge(m.src, m.dst)})
    return f"messages {far[:3]} go to ranks that are not neighbours in {graph}" if far else None


@checker
def check_gossip_round(fn, topology: str = "ring", n: int = 6) -> bool:
    """Exercise 1: one gossip round of `topology` on `n` ranks, point-to-point."""
    name = f"gossip round ({topology}, {n} ranks)"
    ok, res = attempt(name, lambda: sim.run(_run_round, n, args=(fn,)))
    if not ok:
        return False
    w = mixing_matrix(topology, n)
    x0 = torch.stack([_start(r) for r in range(n)])
    got = torch.stack(list(res))
    if wrong := _p2p_only(res, lambda src, dst: w[dst, src] > 0, f"the {topology} graph"):
        return verdict(name, False, wrong)
    if torch.allclose(got, w @ x0, atol=1e-9):
        return verdict(name, True, f"{len(res.trace)} messages, each to a neighbour; W x matched")
    rows = torch.linalg.lstsq(x0.T, got.T).solution.T  # the weights the answer applied
    detail = "the result is not W x"
    if torch.allclose(got, (w - torch.diag(w.diagonal())) @ x0, atol=1e-9):
        detail = "the self-weight is forgotten: a rank must keep W[i, i] of its own tensor"
    elif not torch.allclose(rows.sum(1), torch.ones(n, dtype=rows.dtype), atol=1e-6):
        detail = (f"each rank's weights sum to {rows.sum(1)[0]:.3f}, not 1: a constant would "
                  "not stay constant")
    elif not torch.allclose(rows, rows.T, atol=1e-6):
        detail = ("the weights are not symmetric on an undirected graph: the average over the "
                  f"ranks drifts ({x0.mean():.4f} -> {got.mean():.4f})")
    return verdict(name, False, detail)


def measured_rounds(topology: str, n: int, target: float, limit: int = 2000) -> int:
    """The first round after which the consensus distance is <= `target` of its start."""
    def run(comm):
        x, out = _start(comm.rank), []
        for r in range(limit):
            gossip(comm, x, topology, round=r)
            out.append(x.clone())
        return out

    res = sim.run(run, n)
    d0 = consensus_distance([_start(r) for r in range(n)])
    for t in range(limit):
        if consensus_distance([res[i][t] for i in range(n)]) <= target * d0:
            return t + 1
    raise ValueError(f"target={target} not reached in {limit} rounds")


@checker
def check_rounds(answer, topology: str = "ring", n: int = 16, target: float = 1e-3) -> bool:
    """Exercise 2: rounds until the spread is `target` of its start, from |lambda_2|."""
    name = f"rounds to {target:g} ({topology}, {n} ranks)"
    if answer is None:
        print(f"{name}: not attempted yet - write your answer and re-run this cell")
        return False
    lam = second_eigenvalue(mixing_matrix(topology, n))
    bound = math.ceil(math.log(target) / math.log(lam))
    seen = measured_rounds(topology, n, target, limit=bound + 5)
    if not isinstance(answer, int):
        return verdict(name, False, f"answer {answer!r} must be a whole number of rounds")
    if answer < seen:
        return verdict(name, False, f"{answer} rounds is too few: the measured spread first "
                       f"reached {target:g} after {seen} (did you use the spectral gap "
                       f"1 - lambda_2 = {1 - lam:.3f} as the rate, or lambda_2 squared?)")
    if answer > bound:
        return verdict(name, False, f"{answer} rounds is more than log(target)/log(lambda_2) "
                       f"= {bound} (lambda_2 = {lam:.4f}); measured {seen}")
    return verdict(name, True, f"lambda_2 = {lam:.4f} predicts {bound}; measured {seen}")


def _push_run(comm, fn, keeps):
    x, w = _start(comm.rank), torch.ones(1, dtype=torch.float64)
    return fn(comm, x, w, keeps[comm.rank])


@checker
def check_push_sum(fn, keeps=(0.9, 0.2, 0.5, 0.3, 0.7, 0.25)) -> bool:
    """Exercise 3: `fn(comm, x, w, keep)` runs push-sum rounds and returns the estimate."""
    name = "push-sum de-biased"
    ok, res = attempt(name, lambda: sim.run(_push_run, len(keeps), args=(fn, list(keeps))))
    if not ok:
        return False
    n = len(keeps)
    if wrong := _p2p_only(res, lambda src, dst: dst in out_peers("exponential", n, src),
                          "the directed exponential graph"):
        return verdict(name, False, wrong)
    mean = torch.stack([_start(r) for r in range(n)]).mean(0)
    err = max(float((torch.as_tensor(x) - mean).abs().max()) for x in res)
    if err <= 1e-6:
        return verdict(name, True, f"every rank within {err:.1e} of the average")
    return verdict(name, False, f"a rank is {err:.3f} from the average: return x / w "
                   "(the values alone converge to a biased limit on this graph), after "
                   "enough rounds")
