"""Lesson 12's exercise checkers: each runs the answer on simulated ranks and reads the trace.

The answer gets a comm that records what it calls and sends (`Watched`), beside the trace.

1. `check_gossip_round(fn, topology, n)`: `fn(comm, x)` must do one gossip round in place,
   with `isend`/`irecv` written out; rejected, by name: the library's `dc.gossip` (its tag in
   the trace), blocking `send`/`recv`, an allreduce, a message to a non-neighbour, weights
   that do not sum to 1, the self-weight forgotten, weights that are not W's (the average
   drifts only if they are not doubly stochastic: said only when it does).
2. `check_rounds(answer, topology, n, target)`: the smallest t with |lambda_2|^t <= `target`
   (t - 1 accepted for rounding); the measured rounds are printed as the witness that the
   bound is conservative. Rejected, by name: the measurement itself, the spectral-gap
   estimate ln(1/target)/(1 - lambda_2), lambda_2 squared, and any other t.
3. `check_push_sum(fn, keeps)`: `fn(comm, x, w, keep)` runs rounds of push-sum and returns
   the de-biased estimate; the first round's payloads must be push-sum's, share * (x, w)
   with the shares of the `keep` given (plain gossip sends no weight; a keep of one's own
   makes another W).
"""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.decentralized.gossip import (TAG, consensus_distance, gossip, mixing_matrix,
                                          out_peers, push_shares, second_eigenvalue)
from syncedu.ui.checkers import answered, answered_number, checker, verdict


def _start(rank: int) -> torch.Tensor:
    return torch.randn(6, generator=torch.Generator().manual_seed(100 + rank),
                       dtype=torch.float64)


class Watched:
    """The comm an answer gets: the names it looks up (`calls`: send, recv, all_reduce, ...)
    and what each `isend` carried (`sent`: (dst, a copy)), in order."""

    def __init__(self, comm):
        self.comm, self.calls, self.sent = comm, [], []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.comm, name)

    def isend(self, tensor, dst: int, tag: int = 0):
        self.sent.append((dst, tensor.detach().clone()))
        return self.comm.isend(tensor, dst, tag)


def _answer(comm, fn, *args):
    """`fn(Watched(comm), x, *args)` on this rank's start: (what it returns, else x; the comm)."""
    x, watched = _start(comm.rank), Watched(comm)
    out = fn(watched, x, *args)
    return (x if out is None else out), watched


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
    res = answered(name, lambda: sim.run(_answer, n, args=(fn,)))
    w, x0 = mixing_matrix(topology, n), torch.stack([_start(r) for r in range(n)])
    got, calls = torch.stack([x for x, _ in res]), {c for _, wc in res for c in wc.calls}
    if wrong := _p2p_only(res, lambda src, dst: w[dst, src] > 0, f"the {topology} graph"):
        return verdict(name, False, wrong)
    if any(m.tag == TAG for m in res.trace):  # why: dc.gossip sends on its own tag
        return verdict(name, False, f"the trace carries tag {TAG}, dc.gossip's: write the round "
                       "yourself with comm.isend / comm.irecv")
    if blocking := sorted(calls & {"send", "recv"}):
        return verdict(name, False, f"comm.{' and comm.'.join(blocking)} block (on Gloo a send "
                       "waits for its receive): post comm.irecv / comm.isend, then wait")
    if torch.allclose(got, w @ x0, atol=1e-9):
        return verdict(name, True, f"{len(res.trace)} messages, each to a neighbour; W x matched")
    rows = torch.linalg.lstsq(x0.T, got.T).solution.T  # the weights the answer applied
    sums, one = rows.sum(1), torch.ones(n, dtype=rows.dtype)
    return verdict(name, False, next((detail for wrong, detail in (
        (torch.allclose(rows.diagonal(), 0 * one, atol=1e-6), "the self-weight is forgotten: "
         "a rank must keep W[i, i] of its own tensor"),
        (not torch.allclose(sums, one, atol=1e-6), f"each rank's weights sum to {sums[0]:.3f}, "
         "not 1: a constant would not stay constant"),
        # why: only weights that are not doubly stochastic move the average (said only then)
        (abs(float(got.mean() - x0.mean())) > 1e-9, "the weights are not symmetric on an "
         f"undirected graph: the average over the ranks drifts ({x0.mean():.4f} -> "
         f"{got.mean():.4f})"),
        (not torch.allclose(rows, w, atol=1e-6), f"rank 0 applied "
         f"{[round(float(v), 3) for v in rows[0] if abs(v) > 1e-6]}, not the {topology}'s W "
         f"({float(w[0, 0]):.3f} each); the average is kept")) if wrong), "the result is not W x"))


def measured_rounds(topology: str, n: int, target: float, limit: int = 2000) -> int | None:
    """The first round after which the consensus distance is <= `target` of its start (None
    if not within `limit` rounds)."""
    def run(comm):
        x = _start(comm.rank)
        return [gossip(comm, x, topology, round=r).clone() for r in range(limit)]

    res, d0 = sim.run(run, n), consensus_distance([_start(r) for r in range(n)])
    return next((t + 1 for t in range(limit)
                 if consensus_distance([res[i][t] for i in range(n)]) <= target * d0), None)


@checker
def check_rounds(answer, topology: str = "ring", n: int = 16, target: float = 1e-3) -> bool:
    """Exercise 2: the smallest t with |lambda_2|^t <= `target`; the measurement printed."""
    name = f"rounds to {target:g} ({topology}, {n} ranks)"
    answer = answered_number(name, answer)  # None: not attempted; a bool or a str: not a number
    if not isinstance(answer, int):
        return verdict(name, False, f"answer {answer!r} must be a whole number of rounds")
    lam = second_eigenvalue(mixing_matrix(topology, n))
    bound = math.ceil(math.log(target) / math.log(lam))
    seen = measured_rounds(topology, n, target, limit=bound + 5)
    if lam ** answer <= target < lam ** (answer - 1):  # the definition itself, not a window
        return verdict(name, True, f"|lambda_2| = {lam:.4f} guarantees {target:g} after {answer}"
                       f" rounds; measured {seen}: the bound is conservative")
    mistakes = {  # why: each a plausible wrong answer, named (tests/decentralized keep them)
        bound - 1: f"|lambda_2|^{bound - 1} = {lam ** (bound - 1):.4e} is still above {target:g}: "
        "the log ratio rounded down (floor) instead of up (ceil)",
        seen: "that is the measured count; the question asks what |lambda_2| guarantees",
        math.ceil(math.log(1 / target) / (1 - lam)): "that is the spectral-gap estimate "
        "ln(1/target)/(1 - lambda_2): it also guarantees the target, but is not the smallest t",
        math.ceil(math.log(target) / math.log(lam ** 2)): "lambda_2 squared contracts the "
        "squared distance; the distance itself shrinks by |lambda_2| per round"}
    left = lam ** answer
    return verdict(name, False, mistakes.get(answer) or (
        f"|lambda_2|^{answer} = {left:.2e} is above {target:g}: too few rounds" if left > target
        else f"|lambda_2|^{answer} = {left:.1e} is below {target:g}, but not the smallest t"))


@checker
def check_push_sum(fn, keeps=(0.9, 0.2, 0.5, 0.3, 0.7, 0.25)) -> bool:
    """Exercise 3: `fn(comm, x, w, keep)` runs push-sum rounds and returns the estimate."""
    name = "push-sum de-biased"
    res = answered(name, lambda: sim.run(lambda c: _answer(
        c, fn, torch.ones(1, dtype=torch.float64), keeps[c.rank]), len(keeps)))
    n = len(keeps)
    if wrong := _p2p_only(res, lambda src, dst: dst in out_peers("exponential", n, src),
                          "the directed exponential graph"):
        return verdict(name, False, wrong)
    for i, (_, watched) in enumerate(res):  # the first round's payloads: share * (x, w)
        shares, sent = push_shares(n, i, keeps[i]), torch.cat([_start(i), torch.ones(1)])
        for dst, got in watched.sent[:len(shares) - 1]:
            if got.shape != sent.shape:  # why: plain gossip passes the graph check, and W x
                return verdict(name, False, f"rank {i} sent {got.numel()} numbers, not "
                               f"{sent.numel()}: push-sum sends the weight w with the values "
                               "(plain gossip sends no weight, and de-biases nothing)")
            if not torch.allclose(got.double(), shares[dst] * sent):  # a keep of one's own
                return verdict(name, False, f"rank {i} sent {float(got[-1]):.3f} of its "
                               f"weight to rank {dst}, not (1 - keep) / d = {shares[dst]:.3f} "
                               f"for its keep {keeps[i]}: use the keep you are given")
    mean = torch.stack([_start(r) for r in range(n)]).mean(0)
    err = max(float((torch.as_tensor(x) - mean).abs().max()) for x, _ in res)
    if err <= 1e-6:
        return verdict(name, True, f"every rank within {err:.1e} of the average")
    return verdict(name, False, f"a rank is {err:.3f} from the average: return x / w "
                   "(the values alone converge to a biased limit on this graph), after "
                   "enough rounds")
