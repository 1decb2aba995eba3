"""Lesson 10's ZeRO-1 exercise checker (zero/exercises_fsdp.py): right answers (a padded
ceil(Psi/N) split on the built-ins, the uneven ring split) pass; a root-based "ZeRO"
(built-in or point-to-point), data parallelism, unsharded momentum, a missing /N fail."""

import torch

from syncedu.zero.exercises_fsdp import zero1_step
from syncedu.zero.shards import (
    Layout,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
)


def _momentum(state, g, m):
    v = state.get("v")
    state["v"] = g.clone() if v is None else v.mul_(m).add_(g)
    return state["v"]


def padded(comm, params, grads, state, lr, m):
    n, r, numel = comm.world_size, comm.rank, params.numel()
    c = -(-numel // n)
    g = torch.zeros(n * c)
    g[:numel] = grads
    mine = torch.empty(c)
    comm.reduce_scatter(mine, list(g.chunk(n)), op="avg")
    p = torch.zeros(n * c)
    p[:numel] = params
    pieces = list(p.chunk(n))
    pieces[r].sub_(lr * _momentum(state, mine, m))
    comm.all_gather(pieces, pieces[r].clone())
    params.copy_(p[:numel])


def uneven(comm, params, grads, state, lr, m):
    layout = Layout(params.numel(), comm.world_size, "uneven")
    mean = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone())).div_(comm.world_size)
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(lr * _momentum(state, mean, m))
    ring_all_gather_pieces(comm, pieces)


def root_builtin(comm, params, grads, state, lr, m):
    g = grads.clone()
    comm.reduce(g, dst=0, op="avg")
    if comm.rank == 0:
        params.sub_(lr * _momentum(state, g, m))
    comm.broadcast(params, src=0)


def root_p2p(comm, params, grads, state, lr, m):
    n = comm.world_size
    if comm.rank == 0:
        total = grads.clone()
        for src in range(1, n):
            total += comm.recv(torch.empty_like(grads), src)
        params.sub_(lr * _momentum(state, total / n, m))
        for dst in range(1, n):
            comm.send(params, dst)
    else:
        comm.send(grads.clone(), 0)
        comm.recv(params, 0)


def data_parallel(comm, params, grads, state, lr, m):
    g = grads.clone()
    comm.all_reduce(g, op="avg")
    params.sub_(lr * _momentum(state, g, m))


def whole_momentum(comm, params, grads, state, lr, m):
    """Sharded traffic, but every rank keeps (and updates) the whole momentum."""
    layout = Layout(params.numel(), comm.world_size, "uneven")
    g = grads.clone()
    pieces = layout.pieces(g)
    ring_reduce_scatter_pieces(comm, pieces).div_(comm.world_size)
    ring_all_gather_pieces(comm, pieces)
    params.sub_(lr * _momentum(state, g, m))


def no_mean(comm, params, grads, state, lr, m):
    layout = Layout(params.numel(), comm.world_size, "uneven")
    total = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone()))
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(lr * _momentum(state, total, m))
    ring_all_gather_pieces(comm, pieces)


def stub(comm, params, grads, state, lr, m):
    raise NotImplementedError


def test_right_answers_pass(capsys):
    assert zero1_step.grade(padded)  # ceil(Psi/N) per rank, zero padding
    assert zero1_step.grade(uneven)
    assert capsys.readouterr().out.count("correct") == 2


def test_wrong_answers_fail_with_the_reason(capsys):
    for answer, reason in ((root_builtin, "comm.reduce / comm.broadcast"),
                           (root_p2p, "a root"), (data_parallel, "data parallelism"),
                           (whole_momentum, "keeps momentum for 10 elements"),
                           (no_mean, "divide the sum by N")):
        assert not zero1_step.grade(answer), answer.__name__
        assert reason in capsys.readouterr().out, answer.__name__


def test_stub_is_not_attempted(capsys):
    assert not zero1_step.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out
