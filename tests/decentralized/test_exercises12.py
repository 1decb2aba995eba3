"""Lesson 12's checkers accept the right answers and reject each plausible wrong one by name."""

import math

import torch

from syncedu import decentralized as dc
from syncedu.decentralized import exercises12 as ex


def _neighbour_sum(comm, x, peers, scale, self_weight):
    bufs = [torch.empty_like(x) for _ in peers]
    works = [comm.irecv(b, src=j) for j, b in zip(peers, bufs)]
    works += [comm.isend(x, dst=j) for j in peers]
    for w in works:
        w.wait()
    acc = self_weight * x + sum(scale * b for b in bufs)
    x.copy_(acc)


def right(comm, x):
    n, i = comm.world_size, comm.rank
    _neighbour_sum(comm, x, [(i - 1) % n, (i + 1) % n], 1 / 3, 1 / 3)


def allreduce(comm, x):
    comm.all_reduce(x)
    x.div_(comm.world_size)


def far(comm, x):
    n, i = comm.world_size, comm.rank
    _neighbour_sum(comm, x, [(i - 2) % n, (i + 2) % n], 1 / 3, 1 / 3)


def no_sum_to_one(comm, x):
    n, i = comm.world_size, comm.rank
    _neighbour_sum(comm, x, [(i - 1) % n, (i + 1) % n], 1 / 2, 1 / 2)


def no_self(comm, x):
    n, i = comm.world_size, comm.rank
    _neighbour_sum(comm, x, [(i - 1) % n, (i + 1) % n], 1 / 3, 0.0)


def asymmetric(comm, x):  # rows sum to 1, but rank 0 weighs its neighbours unlike the others
    n, i = comm.world_size, comm.rank
    if i == 0:
        _neighbour_sum(comm, x, [(i - 1) % n, (i + 1) % n], 0.1, 0.8)
    else:
        right(comm, x)


def weighted(self_weight, left, right):  # rows sum to 1 when the three do: a circulant W
    def answer(comm, x):
        n, i = comm.world_size, comm.rank
        bufs = [torch.empty_like(x), torch.empty_like(x)]
        works = [comm.irecv(bufs[0], src=(i - 1) % n), comm.irecv(bufs[1], src=(i + 1) % n)]
        works += [comm.isend(x, dst=(i - 1) % n), comm.isend(x, dst=(i + 1) % n)]
        for w in works:
            w.wait()
        x.copy_(self_weight * x + left * bufs[0] + right * bufs[1])
    return answer


def library(comm, x):  # the call cell 3 shows, not a round written out
    dc.gossip(comm, x, "ring")


def blocking(comm, x):  # ordered so that it does not deadlock, but blocking all the same
    n, i = comm.world_size, comm.rank
    left, right = torch.empty_like(x), torch.empty_like(x)
    if i % 2 == 0:
        comm.send(x, (i + 1) % n), comm.send(x, (i - 1) % n)
        comm.recv(right, (i + 1) % n), comm.recv(left, (i - 1) % n)
    else:
        comm.recv(left, (i - 1) % n), comm.recv(right, (i + 1) % n)
        comm.send(x, (i - 1) % n), comm.send(x, (i + 1) % n)
    x.copy_((x + left + right) / 3)


def overwrite_before_wait(comm, x):  # x changed while its sends are in flight
    n, i = comm.world_size, comm.rank
    left, right = torch.empty_like(x), torch.empty_like(x)
    sends = [comm.isend(x, (i - 1) % n), comm.isend(x, (i + 1) % n)]
    for w in [comm.irecv(left, (i - 1) % n), comm.irecv(right, (i + 1) % n)]:
        w.wait()
    x.copy_((x + left + right) / 3)
    for w in sends:
        w.wait()


def test_gossip_round_checker(capsys):
    assert ex.check_gossip_round.grade(right)
    assert ex.check_gossip_round.grade(weighted(1 / 3, 1 / 3, 1 / 3))
    for wrong, says in ((allreduce, "allreduce"), (far, "not neighbours"),
                        (no_sum_to_one, "not 1"), (no_self, "self-weight"),
                        (weighted(0, 1 / 2, 1 / 2), "self-weight"),
                        (asymmetric, "drifts"), (library, "dc.gossip"),
                        (blocking, "comm.recv and comm.send block"),
                        (overwrite_before_wait, "raised"),
                        (weighted(0.5, 0.3, 0.2), "not the ring's W"),
                        (weighted(0.5, 0.25, 0.25), "not the ring's W")):
        capsys.readouterr()
        assert not ex.check_gossip_round.grade(wrong), wrong.__name__
        out = capsys.readouterr().out
        assert says in out, (wrong.__name__, out)
        assert says == "drifts" or "drifts" not in out  # the average moves only if it does


def test_rounds_checker(capsys):
    lam = dc.second_eigenvalue(dc.mixing_matrix("ring", 16))
    good = math.ceil(math.log(1e-3) / math.log(lam))  # the smallest t with lam^t <= 1e-3
    assert good == 133 and ex.check_rounds.grade(good)
    assert "measured 111" in capsys.readouterr().out  # the witness: the bound is conservative
    wrongs = {111: "measured count",  # the measurement itself, not the bound
              good - 1: "rounded down",  # floor, not ceil: lam^132 = 1.03e-3 > 1e-3
              math.ceil(math.log(1e3) / (1 - lam)): "spectral-gap estimate",  # 137
              math.ceil(math.log(1e-3) / math.log(lam ** 2)): "squared",  # 67
              math.ceil(math.log(1e-3) / math.log(1 - lam)): "too few",  # the gap as the rate
              120: "too few",  # a guess inside the old window 111..133
              math.ceil(math.log(1e-6) / math.log(lam)): "not the smallest",  # target squared
              good * 3: "not the smallest", float(good): "whole number", True: "number"}
    assert 137 in wrongs and 67 in wrongs
    for wrong, says in wrongs.items():
        capsys.readouterr()
        assert not ex.check_rounds.grade(wrong), wrong
        assert says in capsys.readouterr().out, wrong
    assert not ex.check_rounds.grade(None)


def solution(comm, x, w, keep):
    for _ in range(80):
        dc.push_sum(comm, x, w, keep)
    return x / w


def test_push_sum_checker(capsys):
    assert ex.check_push_sum.grade(solution)

    def biased(comm, x, w, keep):
        for _ in range(80):
            dc.push_sum(comm, x, w, keep)
        return x

    def stub(comm, x, w, keep):
        raise NotImplementedError

    def collective(comm, x, w, keep):
        comm.all_reduce(x)
        return x / comm.world_size

    def off_graph(comm, x, w, keep):  # also sends to i + 1: not an out-neighbour (i - 2^k)
        n, i = comm.world_size, comm.rank
        works = [comm.irecv(torch.empty_like(x), src=(i - 1) % n), comm.isend(x, dst=(i + 1) % n)]
        for work in works:
            work.wait()
        return solution(comm, x, w, keep)

    def plain_gossip(comm, x, w, keep):  # doubly stochastic on the same out-edges: no bias
        for _ in range(80):
            dc.gossip(comm, x, "exponential")
        return x

    def own_keep(comm, x, w, keep):  # 0.25 for every rank: W uniform and circulant for n = 6
        for _ in range(80):
            dc.push_sum(comm, x, w, 0.25)
        return x / w

    for wrong, says in ((biased, "x / w"), (collective, "collective"),
                        (off_graph, "not neighbours"), (plain_gossip, "sends the weight w"),
                        (own_keep, "use the keep you are given")):
        capsys.readouterr()
        assert not ex.check_push_sum.grade(wrong)
        assert says in capsys.readouterr().out
    assert not ex.check_push_sum.grade(stub)
    assert "not attempted" in capsys.readouterr().out
