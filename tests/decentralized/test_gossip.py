"""Lesson 12's gossip contracts: mixing matrices, one round over point-to-point only, push-sum."""

import math

import pytest
import torch

from syncedu import decentralized as dc
from syncedu import launch, sim

SIZES = (1, 2, 3, 4, 6, 8, 9, 16)


def _sizes(topology):
    return [n for n in SIZES if topology != "torus" or n in (4, 6, 8, 9, 16)]


@pytest.mark.parametrize("topology", dc.TOPOLOGIES)
def test_mixing_matrix_is_doubly_stochastic(topology):
    for n in _sizes(topology):
        for r in range(4):
            w = dc.mixing_matrix(topology, n, round=r)
            assert w.shape == (n, n) and (w >= 0).all()
            ones = torch.ones(n, dtype=w.dtype)
            assert torch.allclose(w.sum(0), ones) and torch.allclose(w.sum(1), ones)
            assert (w.diagonal() > 0).all()  # every rank keeps part of its own tensor
            if topology in ("ring", "torus", "complete"):
                assert torch.equal(w, w.T)  # undirected: symmetric weights


def test_mixing_matrix_values():
    ring = dc.mixing_matrix("ring", 5)
    assert ring[0, 0] == ring[0, 1] == ring[0, 4] == 1 / 3 and ring[0, 2] == 0
    assert (dc.mixing_matrix("torus", 9) > 0).sum(1).tolist() == [5] * 9  # 3x3: 4 peers + self
    exp = dc.mixing_matrix("exponential", 8)
    assert [j for j in range(8) if exp[0, j] > 0] == [0, 1, 2, 4]  # 0 receives from 2^k
    assert torch.equal(dc.mixing_matrix("complete", 4), torch.full((4, 4), 0.25, dtype=exp.dtype))
    # one-peer exponential on n = 2^k: tau = k consecutive rounds average exactly (Ying et al.)
    for n in (4, 8, 16):
        prod = torch.eye(n, dtype=torch.float64)
        for r in range(int(math.log2(n))):
            prod = dc.mixing_matrix("one_peer_exponential", n, round=r) @ prod
        assert torch.allclose(prod, torch.full((n, n), 1 / n, dtype=torch.float64))


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="topology='star'"):
        dc.mixing_matrix("star", 4)
    for prime in (2, 3, 5, 7, 13):
        with pytest.raises(ValueError, match="topology='torus'.*prime"):
            dc.mixing_matrix("torus", prime)
    with pytest.raises(ValueError, match="n=0"):
        dc.mixing_matrix("ring", 0)
    with pytest.raises(launch.WorkerError, match="ValueError: topology='hypercube'"):
        sim.run(lambda comm: dc.gossip(comm, torch.zeros(2), "hypercube"), 2)


def _start(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(7, generator=g, dtype=torch.float64)


def _one_round(comm, topology, round):
    x = _start(comm.rank)
    dc.gossip(comm, x, topology, round=round)
    return x


def _expect(topology, n, round):
    return dc.mixing_matrix(topology, n, round=round) @ torch.stack([_start(r) for r in range(n)])


@pytest.mark.parametrize("topology", dc.TOPOLOGIES)
def test_gossip_simulated_matches_w_and_sends_to_neighbours_only(topology):
    for n in _sizes(topology):
        for r in (0, 1, 2):
            res = sim.run(_one_round, n, args=(topology, r))
            assert torch.allclose(torch.stack(list(res)), _expect(topology, n, r), atol=1e-12)
            w = dc.mixing_matrix(topology, n, round=r)
            edges = {(m.src, m.dst) for m in res.trace}
            assert all(w[dst, src] > 0 for src, dst in edges)  # no message to a non-neighbour
            want = {(j, i) for i in range(n) for j in range(n) if i != j and w[i, j] > 0}
            assert edges == want  # and every neighbour got one
            assert set(res.ledger.ops) <= {"send", "recv", "isend", "irecv"}  # no collective
            assert res.ledger.sent == [len(dc.out_peers(topology, n, i, r)) * 7 * 8
                                       for i in range(n)]


def test_bytes_per_round_constant_in_n():
    for n in (8, 16, 32):
        res = sim.run(_one_round, n, args=("ring", 0))
        assert set(res.ledger.sent) == {2 * 7 * 8}  # two neighbours, whatever N


def test_gossip_real_ranks(pool4):
    for topology in dc.TOPOLOGIES:
        res = pool4.run(_one_round, args=(topology, 1), timeout=60)
        assert torch.allclose(torch.stack(list(res)), _expect(topology, 4, 1), atol=1e-12)
        w = dc.mixing_matrix(topology, 4, round=1)
        assert all(w[m.dst, m.src] > 0 for m in res.trace) and len(res.trace) > 0


@pytest.mark.parametrize("n, topology", [(2, "ring"), (3, "exponential")])
def test_gossip_real_ranks_small(n, topology):
    res = launch.run(_one_round, n, args=(topology, 0), timeout=60)
    assert torch.allclose(torch.stack(list(res)), _expect(topology, n, 0), atol=1e-12)


def _push(comm, keeps, rounds, debias):
    x, w = _start(comm.rank), torch.ones(1, dtype=torch.float64)
    for _ in range(rounds):
        dc.push_sum(comm, x, w, keeps[comm.rank])
    return x / w if debias else x


def test_push_sum_debiases_a_column_stochastic_graph():
    keeps = [0.9, 0.2, 0.5, 0.3, 0.7, 0.25]
    w = dc.push_matrix(keeps)
    assert torch.allclose(w.sum(0), torch.ones(6, dtype=w.dtype))  # column stochastic
    assert not torch.allclose(w.sum(1), torch.ones(6, dtype=w.dtype))  # not row stochastic
    mean = torch.stack([_start(r) for r in range(6)]).mean(0)
    fixed = sim.run(_push, 6, args=(keeps, 80, True))
    assert all(torch.allclose(x, mean, atol=1e-9) for x in fixed)
    plain = sim.run(_push, 6, args=(keeps, 80, False))
    assert max(float((x - mean).abs().max()) for x in plain) > 0.05  # plain gossip: biased
    # its limit is predicted by W's Perron vector v (W v = v, sum v = 1): x_i -> n v_i mean
    vals, vecs = torch.linalg.eig(w)
    v = vecs[:, vals.real.argmax()].real
    v = v / v.sum()
    for i, x in enumerate(plain):
        assert torch.allclose(x, 6 * v[i] * mean, atol=1e-9)
    assert all(m.dst in dc.out_peers("exponential", 6, m.src) for m in plain.trace)


@pytest.mark.parametrize("topology, n", [("ring", 16), ("torus", 16), ("exponential", 12)])
def test_consensus_decay_follows_lambda2(topology, n):
    lam = dc.second_eigenvalue(dc.mixing_matrix(topology, n))  # predicted before the run

    def run(comm):
        x, out = _start(comm.rank), []
        for r in range(40):
            out.append(x.clone())
            dc.gossip(comm, x, topology, round=r)
        return out

    res = sim.run(run, n)
    dist = [dc.consensus_distance([res[i][t] for i in range(n)]) for t in range(40)]
    assert all(d <= lam ** t * dist[0] * (1 + 1e-9) for t, d in enumerate(dist))  # the bound
    rate = (dist[39] / dist[19]) ** (1 / 20)
    assert abs(rate - lam) <= 0.02 * lam  # the asymptotic rate, within 2%
