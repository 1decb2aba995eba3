"""Lesson 12's checkers accept the right answers and reject each plausible wrong one by name."""

import math

import pytest
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


def test_gossip_round_checker(capsys):
    assert ex.check_gossip_round.grade(right)
    for wrong, says in ((allreduce, "allreduce"), (far, "not neighbours"),
                        (no_sum_to_one, "not 1"), (no_self, "self-weight"),
                        (asymmetric, "not symmetric")):
        capsys.readouterr()
        assert not ex.check_gossip_round.grade(wrong), wrong.__name__
        assert says in capsys.readouterr().out, wrong.__name__


def test_rounds_checker(capsys):
    lam = dc.second_eigenvalue(dc.mixing_matrix("ring", 16))
    good = math.ceil(math.log(1e-3) / math.log(lam))
    assert ex.check_rounds.grade(good)
    gap = math.ceil(math.log(1e-3) / math.log(1 - lam))  # the gap used as the rate: far too few
    squared = math.ceil(math.log(1e-3) / math.log(lam ** 2))
    for wrong, says in ((gap, "too few"), (squared, "too few"), (good * 3, "more than"),
                        (float(good), "whole number")):
        capsys.readouterr()
        assert not ex.check_rounds.grade(wrong), wrong
        assert says in capsys.readouterr().out
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

    for wrong, says in ((biased, "x / w"), (collective, "collective"),
                        (off_graph, "not neighbours")):
        capsys.readouterr()
        assert not ex.check_push_sum.grade(wrong)
        assert says in capsys.readouterr().out
    assert not ex.check_push_sum.grade(stub)
    assert "not attempted" in capsys.readouterr().out
