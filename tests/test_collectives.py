"""Every allreduce from scratch equals the naive one and `comm.all_reduce`; ledgers agree.

Simulated ranks for world sizes 1..16; real ranks (Gloo) for 2, 3 and 4, one warm
pool each for the whole module. Data are small integers, so every summation order
gives exactly the same float16/bfloat16/float32 result and equality can be exact.
"""

from __future__ import annotations

import pytest
import torch

from syncedu import collectives
from syncedu.comm import launch, sim
from syncedu.comm.ledger import ring_allreduce_elements

LENGTHS = (1, 7, 129)


def _data(rank: int, numel: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-4, 5, (numel,), generator=g).to(dtype)


def check_all(comm, algorithm, lengths=LENGTHS, dtypes=collectives.DTYPES):
    """Worker: (length, dtype) pairs where `algorithm` != naive or != built-in."""
    bad = []
    for numel in lengths:
        for dtype in dtypes:
            x = _data(comm.rank, numel, dtype)
            ref, oracle = x.clone(), x.clone()
            comm.all_reduce(ref)
            collectives.naive_allreduce(comm, oracle)
            out = collectives.allreduce(comm, x, algorithm=algorithm)
            if out is not x or not torch.equal(x, ref) or not torch.equal(x, oracle):
                bad.append((numel, str(dtype)))
    return bad


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
@pytest.mark.parametrize("world_size", range(1, 17))
def test_equal_to_naive_and_builtin_sim(algorithm, world_size):
    res = sim.run(check_all, world_size, args=(algorithm,))
    assert list(res) == [[]] * world_size


@pytest.mark.parametrize("world_size", [2, 3, 5, 8, 13])
def test_ring_ledger_equals_builtin_charge(world_size):
    def worker(comm):
        for numel in (1, 5, 97, 1000):
            collectives.ring_allreduce(comm, torch.ones(numel))
            comm.all_reduce(torch.ones(numel))

    ops = sim.run(worker, world_size).ledger.ops
    assert ops["ring_allreduce"].sent == ops["all_reduce"].sent
    assert ops["ring_allreduce"].received == ops["all_reduce"].received


@pytest.mark.parametrize("world_size", [2, 4, 6, 16])
def test_ring_sends_two_n_minus_one_over_n_of_s(world_size):
    numel = 24 * world_size
    s = numel * 4
    res = sim.run(lambda comm: collectives.ring_allreduce(comm, torch.ones(numel)), world_size)
    want = 2 * (world_size - 1) * s // world_size
    assert res.ledger.ops["ring_allreduce"].sent == [want] * world_size
    assert res.ledger.ops["ring_allreduce"].msgs_sent == [2 * (world_size - 1)] * world_size


@pytest.mark.parametrize("segment_bytes", [1, 8, 100, None])
def test_pipelined_ring_any_segment_size(segment_bytes):
    def worker(comm):
        x = _data(comm.rank, 101, torch.float32)
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.ring_allreduce(comm, x, segment_bytes=segment_bytes)
        return torch.equal(x, ref)

    res = sim.run(worker, 5)
    assert all(res)
    want = [ring_allreduce_elements(101, 5, r)[0] * 4 for r in range(5)]
    assert res.ledger.ops["ring_allreduce"].sent == want


def test_reduce_scatter_then_all_gather_is_allreduce():
    def worker(comm):
        x = _data(comm.rank, 23, torch.float32)
        ref = x.clone()
        comm.all_reduce(ref)
        mine = collectives.ring_reduce_scatter(comm, x)
        sizes = [5, 5, 5, 4, 4]
        start = sum(sizes[: comm.rank])
        owned = torch.equal(mine, ref[start:start + sizes[comm.rank]])
        collectives.ring_all_gather(comm, x)
        return owned and torch.equal(x, ref)

    res = sim.run(worker, 5)
    assert all(res)
    ops = res.ledger.ops
    total = [a + b for a, b in zip(ops["ring_reduce_scatter"].sent, ops["ring_all_gather"].sent)]
    assert total == [ring_allreduce_elements(23, 5, r)[0] * 4 for r in range(5)]


def test_each_algorithm_has_its_own_ledger_op():
    def worker(comm):
        for name in collectives.ALGORITHMS:
            collectives.allreduce(comm, torch.ones(8), algorithm=name)

    ops = sim.run(worker, 3).ledger.ops
    for name in ("naive_allreduce", "ring_allreduce", "tree_allreduce",
                 "halving_doubling_allreduce"):
        assert sum(ops[name].sent) > 0
    assert ops["naive_allreduce"].sent == [2 * 8 * 4, 8 * 4, 8 * 4]


def test_average_non_contiguous_and_grad_tensors():
    def worker(comm):
        x = torch.arange(12.0).reshape(3, 4).t() * (comm.rank + 1)  # not contiguous
        collectives.allreduce(comm, x, algorithm="halving_doubling", op="avg")
        p = torch.ones(3, requires_grad=True)
        collectives.allreduce(comm, p, algorithm="tree")
        return x, p.detach()

    res = sim.run(worker, 3)
    want = torch.arange(12.0).reshape(3, 4).t() * 2  # (1 + 2 + 3) / 3
    assert all(torch.equal(x, want) and torch.equal(p, torch.full((3,), 3.0)) for x, p in res)


def test_bad_arguments():
    with pytest.raises(ValueError, match="algorithm='butterfly'"):
        collectives.allreduce(None, torch.ones(2), algorithm="butterfly")
    with pytest.raises(ValueError, match="op="):
        collectives.allreduce(None, torch.ones(2), op="max")
    with pytest.raises(ValueError, match="segment_bytes"):
        collectives.ring_segments(10, 2, 4, 0)


# ------------------------------------------------------------------ real ranks
@pytest.fixture(scope="module")
def pools():
    made = {}

    def get(n):
        if n not in made:
            made[n] = launch.Pool(n, backend="gloo", output="quiet", timeout=120)
        return made[n]

    yield get
    for p in made.values():
        p.close()


@pytest.mark.real
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_equal_on_real_ranks(pools, world_size):
    def worker(comm):
        return {name: check_all(comm, name, lengths=(1, 7, 1001)) for name in
                collectives.ALGORITHMS}

    res = pools(world_size).run(worker)
    assert list(res) == [{name: [] for name in collectives.ALGORITHMS}] * world_size


@pytest.mark.real
def test_real_ring_ledger_and_pipelining(pools):
    def worker(comm):
        x = _data(comm.rank, 10_001, torch.float32)
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.ring_allreduce(comm, x, segment_bytes=512)  # ~5 segments per chunk
        return torch.equal(x, ref)

    res = pools(3).run(worker)
    assert all(res)
    assert res.ledger.ops["ring_allreduce"].sent == res.ledger.ops["all_reduce"].sent


# --------------------------------------------------------- notebook checkers
def test_lesson01_and_02_checkers_grade_right_and_wrong(capsys):
    from syncedu.ui.exercises import lesson01 as ex1
    from syncedu.ui.exercises import lesson02 as ex2

    def gather(comm, t):
        out = [torch.empty_like(t) for _ in range(comm.world_size)]
        out[comm.rank].copy_(t)
        for p in range(comm.world_size):
            if p != comm.rank:
                w = comm.isend(t, p)
                comm.recv(out[p], p)
                w.wait()
        return out

    def gather_builtin(comm, t):
        out = [torch.empty_like(t) for _ in range(comm.world_size)]
        comm.all_gather(out, t)
        return out

    def rs_ag(comm, x):
        n = comm.world_size
        mine = torch.empty(x.numel() // n)
        comm.reduce_scatter(mine, list(x.chunk(n)))
        comm.all_gather(list(x.chunk(n)), mine)

    def last_root(comm, x):
        collectives.naive_allreduce(comm, x, root=comm.world_size - 1)

    def stub(*args):
        raise NotImplementedError

    assert ex1.all_gather_from_send_recv.grade(gather)
    assert not ex1.all_gather_from_send_recv.grade(gather_builtin)
    assert not ex1.all_gather_from_send_recv.grade(stub)
    assert ex1.allreduce_from_collectives.grade(rs_ag)
    assert not ex1.allreduce_from_collectives.grade(lambda comm, x: comm.all_reduce(x))
    assert ex1.bus_bandwidth.grade(lambda s, t, n: s / t * 2 * (n - 1) / n)
    assert not ex1.bus_bandwidth.grade(lambda s, t, n: s / t)
    assert ex2.ring_time.grade(lambda n, s, a, b: 2 * (n - 1) * (a + s / n * b))
    assert not ex2.ring_time.grade(lambda n, s, a, b: 2 * (n - 1) * (a + s * b))
    assert ex2.crossover.grade(1 << 20) and not ex2.crossover.grade(1 << 14)
    assert ex2.rotated_naive.grade(last_root)
    assert not ex2.rotated_naive.grade(collectives.naive_allreduce)
    assert not ex2.rotated_naive.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out
