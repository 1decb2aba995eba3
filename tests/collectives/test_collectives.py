"""Every allreduce from scratch equals the naive one and `comm.all_reduce`; ledgers agree.

Simulated ranks for N = 1..9, 12 and 16; real ranks (Gloo) for 2 and 3, one warm
pool each for the whole module. The equality tests use small integers, so every
summation order gives exactly the same float32/float16/bfloat16 result and
equality can be exact; `test_random_values_within_tolerance` uses normal values
and a bound that grows with N and the dtype's epsilon.
"""

from __future__ import annotations

import math

import pytest
import torch

from syncedu import Network, collectives
from syncedu.comm import launch, sim
from syncedu.comm.ledger import ring_allreduce_elements

LENGTHS = (1, 7, 129, 1001)
WORLD_SIZES = [*range(1, 10), 12, 16]


def _data(rank: int, numel: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-4, 5, (numel,), generator=g).to(dtype)


class Nodes:
    """`comm` seen as nodes of `per_node` consecutive ranks (the last may be smaller).

    Stands in for a cluster network's `local_rank`, `local_world_size` and `node`.
    """

    def __init__(self, comm, per_node: int):
        self._comm = comm
        self.node, self.local_rank = divmod(comm.rank, per_node)
        self.local_world_size = min(per_node, comm.world_size - self.node * per_node)

    def __getattr__(self, name):
        return getattr(self._comm, name)


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
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_equal_to_naive_and_builtin_sim(algorithm, world_size):
    res = sim.run(check_all, world_size, args=(algorithm,))
    assert list(res) == [[]] * world_size


@pytest.mark.parametrize("dtype, eps", [(torch.float32, 2 ** -23), (torch.float16, 2 ** -10),
                                        (torch.bfloat16, 2 ** -7)])
@pytest.mark.parametrize("world_size", [3, 8, 12])
def test_random_values_within_tolerance(dtype, eps, world_size):
    def worker(comm, name):
        g = torch.Generator().manual_seed(comm.rank)
        x = torch.randn(1001, generator=g).to(dtype)
        collectives.allreduce(comm, x, algorithm=name)
        return x

    want = sum(torch.randn(1001, generator=torch.Generator().manual_seed(r)).to(dtype).double()
               for r in range(world_size))
    bound = 4 * world_size * eps * max(1.0, want.abs().max().item())  # N roundings of <= 1 ulp
    for name in collectives.ALGORITHMS:
        res = sim.run(worker, world_size, args=(name,))
        assert all(torch.equal(x, res[0]) for x in res), f"{name}: ranks disagree"
        assert (res[0].double() - want).abs().max().item() <= bound, name


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_hierarchical_any_node_shape(world_size):
    def worker(comm, per_node):
        x = _data(comm.rank, 23, torch.float32)
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.hierarchical_allreduce(Nodes(comm, per_node), x)
        return torch.equal(x, ref)

    for per_node in range(1, world_size + 2):  # uneven last nodes, one node, more than N
        assert all(sim.run(worker, world_size, args=(per_node,))), f"{per_node} per node"


@pytest.mark.skipif(not hasattr(Network, "cluster"), reason="needs Network.cluster")
@pytest.mark.parametrize("nodes, per_node", [(1, 4), (4, 1), (2, 4), (3, 3), (2, 5)])
def test_hierarchical_on_cluster_networks(nodes, per_node):
    net = Network.cluster(nodes, per_node, "nvlink4", "ethernet_100g")
    res = sim.run(check_all, nodes * per_node, args=("hierarchical", (1, 7, 129)), network=net)
    assert list(res) == [[]] * (nodes * per_node)


@pytest.mark.parametrize("world_size, per_node", [(8, 4), (8, 2), (12, 4), (9, 3)])
def test_hierarchical_crosses_nodes_2_m_minus_1_times(world_size, per_node):
    nodes, numel = world_size // per_node, 24 * world_size
    res = sim.run(lambda c: collectives.hierarchical_allreduce(Nodes(c, per_node),
                                                               torch.ones(numel)), world_size)
    op = res.ledger.ops["hierarchical_allreduce"]
    # ring inside the node twice (L-1 messages each), ring across nodes (2(M-1))
    assert op.msgs_sent == [2 * (per_node - 1) + 2 * (nodes - 1)] * world_size
    s = numel * 4  # bytes: (L-1)/L S twice inside, 2(M-1)/M of the S/L shard across
    want = 2 * (per_node - 1) * s // per_node + 2 * (nodes - 1) * s // (nodes * per_node)
    assert op.sent == [want] * world_size


@pytest.mark.parametrize("world_size", [2, 5, 8, 13])
@pytest.mark.parametrize("name", ["ring", "ring_pipelined"])
def test_ring_ledger_equals_builtin_charge(world_size, name):
    def worker(comm):
        for numel in (1, 5, 97, 1000):
            collectives.ALGORITHMS[name](comm, torch.ones(numel))
            comm.all_reduce(torch.ones(numel))

    ops = sim.run(worker, world_size).ledger.ops
    assert ops[f"{name}_allreduce"].sent == ops["all_reduce"].sent
    assert ops[f"{name}_allreduce"].received == ops["all_reduce"].received


@pytest.mark.parametrize("world_size", [2, 4, 6, 16])
def test_ring_sends_two_n_minus_one_over_n_of_s(world_size):
    numel = 24 * world_size
    s = numel * 4
    res = sim.run(lambda comm: collectives.ring_allreduce(comm, torch.ones(numel)), world_size)
    want = 2 * (world_size - 1) * s // world_size
    assert res.ledger.ops["ring_allreduce"].sent == [want] * world_size
    assert res.ledger.ops["ring_allreduce"].received == [want] * world_size
    assert res.ledger.ops["ring_allreduce"].msgs_sent == [2 * (world_size - 1)] * world_size


@pytest.mark.parametrize("world_size", [2, 4, 8, 5, 6])
def test_recursive_doubling_sends_the_whole_vector_log2_p_times(world_size):
    numel = 10
    res = sim.run(lambda c: collectives.recursive_doubling_allreduce(c, torch.ones(numel)),
                  world_size)
    p = 1 << (world_size.bit_length() - 1)
    rounds = int(math.log2(p))
    folded = 2 * (world_size - p)
    sent = res.ledger.ops["recursive_doubling_allreduce"].msgs_sent
    assert sent[:folded] == [1 if r % 2 == 0 else rounds + 1 for r in range(folded)]
    assert sent[folded:] == [rounds] * (world_size - folded)


@pytest.mark.parametrize("segment_bytes", [1, 8, 100, None])
def test_pipelined_ring_any_segment_size(segment_bytes):
    def worker(comm):
        x = _data(comm.rank, 101, torch.float32)
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.ring_pipelined_allreduce(comm, x, segment_bytes=segment_bytes)
        return torch.equal(x, ref) and not any("buf" in k for k in vars(comm))

    res = sim.run(worker, 5)
    assert all(res)
    want = [ring_allreduce_elements(101, 5, r)[0] * 4 for r in range(5)]
    assert res.ledger.ops["ring_pipelined_allreduce"].sent == want


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
    for name in collectives.ALGORITHMS:
        assert sum(ops[f"{name}_allreduce"].sent) > 0, name
    assert ops["naive_allreduce"].sent == [2 * 8 * 4, 8 * 4, 8 * 4]
    assert set(ops) == {f"{name}_allreduce" for name in collectives.ALGORITHMS}


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
    with pytest.raises(TypeError, match="torch.Tensor"):
        collectives.allreduce(None, [1.0, 2.0])
    with pytest.raises(ValueError, match="contiguous"):
        collectives.ring_allreduce(None, torch.ones(3, 4).t())


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
@pytest.mark.parametrize("world_size", [2, 3])
def test_equal_on_real_ranks(pools, world_size):
    def worker(comm):
        out = {name: check_all(comm, name, lengths=(1, 7, 1001)) for name in
               collectives.ALGORITHMS}
        x = _data(comm.rank, 1001, torch.float32)  # two nodes of 2 and 1 (or 1 and 1) ranks
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.hierarchical_allreduce(Nodes(comm, 2), x)
        out["hierarchical on 2-rank nodes"] = [] if torch.equal(x, ref) else ["differs"]
        return out

    res = pools(world_size).run(worker)
    names = [*collectives.ALGORITHMS, "hierarchical on 2-rank nodes"]
    assert list(res) == [{name: [] for name in names}] * world_size


@pytest.mark.real
def test_real_pipelined_ring_ledger(pools):
    def worker(comm):
        x = _data(comm.rank, 10_001, torch.float32)
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.ring_pipelined_allreduce(comm, x, segment_bytes=512)  # ~5 segments a chunk
        return torch.equal(x, ref)

    res = pools(3).run(worker)
    assert all(res)
    assert res.ledger.ops["ring_pipelined_allreduce"].sent == res.ledger.ops["all_reduce"].sent


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16])
def test_halving_doubling_in_either_order_equals_the_builtin(n):
    """Review A2: the step order is a parameter; both orders sum exactly, send the same bytes,
    (in all: uneven chunks differ per rank) and a bad order is refused by name."""
    def worker(comm, order):
        x = torch.randint(-5, 6, (37,), generator=torch.Generator().manual_seed(comm.rank)).float()
        ref = x.clone()
        comm.all_reduce(ref)
        collectives.halving_doubling_allreduce(comm, x, order=order)
        return torch.equal(x, ref)

    runs = [sim.run(worker, n, args=(o,)) for o in ("far_first", "near_first")]
    assert all(all(r) for r in runs) and sum(runs[0].ledger.sent) == sum(runs[1].ledger.sent)
    with pytest.raises(sim.WorkerError, match="order="):
        sim.run(worker, n, args=("nearest",))
