"""Lesson 10's checkers (zero/exercises10.py), each at N = 3 and 4: right answers (a padded
ceil(Psi/N) split on the built-ins, the uneven ring split) pass; a root-based "ZeRO"
(built-in or point-to-point), data parallelism, unsharded momentum (also in a list), a
missing /N, data parallelism on a copy (caught by a run with params NaN outside the shard)
fail, each with the reason; the memory checker takes Psi/N and ceil(Psi/N) and rejects
swapped parts. Momentum is counted by the storage it keeps alive (review 09-10 item 9: a
view into a larger tensor)."""

import math

import torch

from syncedu.train import memory
from syncedu.zero.exercises10 import memory_per_rank, zero1_step, zero2_step
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
    layout = Layout(params.numel(), comm.world_size)
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
    layout = Layout(params.numel(), comm.world_size)
    g = grads.clone()
    pieces = layout.pieces(g)
    ring_reduce_scatter_pieces(comm, pieces).div_(comm.world_size)
    ring_all_gather_pieces(comm, pieces)
    params.sub_(lr * _momentum(state, g, m))


def whole_momentum_in_a_list(comm, params, grads, state, lr, m):
    """The whole momentum hidden one level down, as state["v"] = [tensor]."""
    g = grads.clone()
    pieces = Layout(params.numel(), comm.world_size).pieces(g)
    ring_reduce_scatter_pieces(comm, pieces)
    ring_all_gather_pieces(comm, pieces)
    v = state.setdefault("v", [torch.zeros_like(g)])
    params.sub_(lr * v[0].mul_(m).add_(g / comm.world_size))


MOMENTA = {}  # id(state) -> (state, momentum): kept where the checker does not look


def copy_data_parallel(comm, params, grads, state, lr, m):
    """Data parallelism by hand on a copy (the caller's grads untouched), momentum outside state."""
    g = grads.clone()
    pieces = Layout(params.numel(), comm.world_size).pieces(g)
    ring_reduce_scatter_pieces(comm, pieces)
    ring_all_gather_pieces(comm, pieces)
    _, v = MOMENTA.setdefault(id(state), (state, torch.zeros_like(g)))  # holds state: no id reuse
    params.sub_(lr * v.mul_(m).add_(g / comm.world_size))


def no_mean(comm, params, grads, state, lr, m):
    layout = Layout(params.numel(), comm.world_size)
    total = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone()))
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(lr * _momentum(state, total, m))
    ring_all_gather_pieces(comm, pieces)


def _ring_step(comm, params, grads, velocity):
    layout = Layout(params.numel(), comm.world_size)
    mean = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone())).div_(comm.world_size)
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(velocity(mean))
    ring_all_gather_pieces(comm, pieces)


def momentum_reset(comm, params, grads, state, lr, m):
    """Momentum kept nowhere: each step starts from v = 0."""
    _ring_step(comm, params, grads, lambda g: lr * _momentum({}, g, m))


def momentum_ema(comm, params, grads, state, lr, m):
    """v = m v + (1 - m) g, an exponential average instead of torch's v = m v + g."""
    def ema(g):
        state["v"] = g.mul(1 - m) if "v" not in state else state["v"].mul_(m).add_(g, alpha=1 - m)
        return lr * state["v"]
    _ring_step(comm, params, grads, ema)


def momentum_outside_state(comm, params, grads, state, lr, m):
    """Review 09-10: a right ZeRO-1 step whose shard momentum lives in a function attribute
    keyed by run and rank, and a zero decoy in `state` (the memory check alone passed it)."""
    layout = Layout(params.numel(), comm.world_size)
    mean = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone())).div_(comm.world_size)
    state.setdefault("v", torch.zeros(0))
    store = momentum_outside_state.__dict__.setdefault("v", {})
    v = store.setdefault((id(state), comm.rank), (state, torch.zeros_like(mean)))[1]
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(lr * v.mul_(m).add_(mean))
    ring_all_gather_pieces(comm, pieces)


def momentum_view_of_a_larger_tensor(comm, params, grads, state, lr, m):
    """Review 09-10 item 9: a right ZeRO-1 step whose shard momentum is a slice of a tensor
    1000 times the model: `numel` says ceil(Psi/N), the storage it keeps alive says 10,000."""
    layout = Layout(params.numel(), comm.world_size)
    mean = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone())).div_(comm.world_size)
    if "v" not in state:
        lo = layout.start(comm.rank)
        state["v"] = torch.zeros(1000 * params.numel())[lo: lo + mean.numel()]
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(lr * state["v"].mul_(m).add_(mean))
    ring_all_gather_pieces(comm, pieces)


def float64_momentum(comm, params, grads, state, lr, m):
    """A right answer keeping its shard's momentum in float64 (storage counted in elements)."""
    layout = Layout(params.numel(), comm.world_size)
    mean = ring_reduce_scatter_pieces(comm, layout.pieces(grads.clone())).div_(comm.world_size)
    v = state.setdefault("v", torch.zeros(mean.numel(), dtype=torch.float64))
    pieces = layout.pieces(params)
    pieces[comm.rank].sub_(lr * v.mul_(m).add_(mean).float())
    ring_all_gather_pieces(comm, pieces)


def stub(comm, params, grads, state, lr, m):
    raise NotImplementedError


def test_right_answers_pass(capsys):
    assert zero1_step.grade(padded)  # ceil(Psi/N) per rank, zero padding
    assert zero1_step.grade(uneven)
    assert zero1_step.grade(float64_momentum)
    assert capsys.readouterr().out.count("correct") == 3


def test_wrong_answers_fail_with_the_reason(capsys):
    for answer, reason in ((root_builtin, "comm.reduce / comm.broadcast"),
                           (root_p2p, "a root"), (data_parallel, "data parallelism"),
                           (whole_momentum, "keeps momentum for 10 elements"),
                           (whole_momentum_in_a_list, "keeps momentum for 10 elements"),
                           # its momentum outside state is now caught first (the NaN run
                           # is exercise 1's test below)
                           (copy_data_parallel, "ignored the momentum in `state`"),
                           (no_mean, "the sum, not the mean"),
                           (momentum_reset, "the momentum restarts every step"),
                           (momentum_ema, "(1 - m) g is not torch's SGD momentum"),
                           (momentum_outside_state, "ignored the momentum in `state`"),
                           (momentum_view_of_a_larger_tensor,
                            "keeps momentum for 10000 elements (a view of 4 elements into a larger"
                            " tensor keeps all its storage alive)")):
        assert not zero1_step.grade(answer), answer.__name__
        assert reason in capsys.readouterr().out, answer.__name__


def test_stub_is_not_attempted(capsys):
    assert not zero1_step.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out


def test_lesson10_checkers_accept_a_right_answer_and_reject_wrong_ones(capsys):

    def right(comm, params, grads, sizes, lr):
        starts = [sum(sizes[:r]) for r in range(len(sizes))]
        mine = ring_reduce_scatter_pieces(
            comm, [grads[s:s + k] for s, k in zip(starts, sizes)]).div_(comm.world_size)
        params[starts[comm.rank]:starts[comm.rank] + sizes[comm.rank]].sub_(lr * mine)
        ring_all_gather_pieces(comm, [params[s:s + k] for s, k in zip(starts, sizes)])

    def allreduce_and_broadcast(comm, params, grads, sizes, lr):
        comm.all_reduce(grads, op="avg")
        params.sub_(lr * grads)
        comm.broadcast(params)

    def parameter_server(comm, params, grads, sizes, lr):
        g = grads.clone()
        comm.reduce(g, dst=0, op="avg")
        if comm.rank == 0:
            params.sub_(lr * g)
        comm.broadcast(params, src=0)

    def p2p_root(comm, params, grads, sizes, lr):
        n = comm.world_size
        if comm.rank == 0:
            total = grads.clone()
            for src in range(1, n):
                total += comm.recv(torch.empty_like(grads), src)
            params.sub_(lr * total / n)
            for dst in range(1, n):
                comm.send(params, dst)
        else:
            comm.send(grads, 0)
            params.copy_(comm.recv(torch.empty_like(params), 0))

    def ring_allreduce_by_hand(comm, params, grads, sizes, lr):
        # Data parallelism from point-to-point: a ring allreduce (1x the bytes), whole update.
        pieces = Layout(params.numel(), comm.world_size).pieces(grads)
        ring_reduce_scatter_pieces(comm, pieces)
        ring_all_gather_pieces(comm, pieces)
        params.sub_(lr * grads / comm.world_size)

    assert zero2_step.grade(right)
    capsys.readouterr()
    assert not zero2_step.grade(ring_allreduce_by_hand)
    assert "data parallelism" in capsys.readouterr().out
    # The same on a copy: grads stay untouched, so only the NaN run (params NaN outside
    # the rank's shard) shows that every element was updated.
    def ring_allreduce_on_a_copy(comm, params, grads, sizes, lr):
        g = grads.clone()
        pieces = Layout(params.numel(), comm.world_size).pieces(g)
        ring_reduce_scatter_pieces(comm, pieces)
        ring_all_gather_pieces(comm, pieces)
        params.sub_(lr * g / comm.world_size)

    assert not zero2_step.grade(ring_allreduce_on_a_copy)
    assert "NaN outside its own shard" in capsys.readouterr().out
    assert not zero2_step.grade(allreduce_and_broadcast)
    assert not zero2_step.grade(parameter_server)
    assert not zero2_step.grade(p2p_root)
    # Plain data parallelism sends an allreduce's bytes but is not a ZeRO-2 step.
    assert not zero2_step.grade(lambda comm, params, grads, sizes, lr: (
        comm.all_reduce(grads, op="avg"), params.sub_(lr * grads)))


def _parts(psi, n, stage, sharded, ceil=False):
    b = {"params": 2, "grads": 2, "optimizer": 12}
    per = math.ceil(psi / n) if ceil else psi / n
    return {k: b[k] * (per if k in sharded[stage] else psi) for k in b}


RIGHT = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}


def test_memory_checker_accepts_psi_over_n_and_ceil_and_rejects_the_swaps(capsys):
    assert memory_per_rank.grade(lambda p, n, s: {
        k: v for k, v in memory.bytes_per_rank(p, n, s).items() if k != "total"})
    assert memory_per_rank.grade(lambda p, n, s: _parts(p, n, s, RIGHT))
    assert memory_per_rank.grade(lambda p, n, s: _parts(p, n, s, RIGHT, ceil=True))
    capsys.readouterr()
    # Stage 2 sharding the parameters in place of the gradients: the same total.
    swapped = {**RIGHT, 2: ("optimizer", "params")}
    assert not memory_per_rank.grade(lambda p, n, s: _parts(p, n, s, swapped))
    assert "parameters are sharded only at stage 3" in capsys.readouterr().out
    assert not memory_per_rank.grade(lambda p, n, s: memory.bytes_per_rank(p, n, s)["total"])
    assert not memory_per_rank.grade(lambda p, n, s: _parts(p, n, s, {s: () for s in RIGHT}))
    # Rounding the wrong way (floor) is a wrong count of elements.
    def floor(p, n, s):
        parts = _parts(p, n, s, RIGHT)
        if (p, n) != (10, 4):
            return parts
        return {k: (v // 2 * 2 if k != "optimizer" else v) for k, v in parts.items()}

    assert not memory_per_rank.grade(floor)
    assert "round up, not down" in capsys.readouterr().out
