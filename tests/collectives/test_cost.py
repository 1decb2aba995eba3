"""The cost model: formula == simulator logical time == ledger bytes; calibration; bench."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import collectives as bench
from syncedu import Network, collectives, cost
from syncedu.comm import sim

NET = Network(latency=1e-3, bandwidth=1e6)


def _allreduce(comm, numel, algorithm):
    collectives.allreduce(comm, torch.ones(numel), algorithm=algorithm)


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 7, 8, 12])
def test_formula_equals_simulated_time(algorithm, world_size):
    numel = 60 * world_size  # N divides the length: every chunk the same size
    res = sim.run(_allreduce, world_size, args=(numel, algorithm), network=NET)
    assert math.isclose(res.seconds, cost.allreduce_time(algorithm, numel * 4, world_size, NET),
                        rel_tol=1e-9)


def test_formula_with_pipeline_segments():
    numel, n, seg = 4000, 4, 1000  # 1000 floats per chunk, 4 segments of 250
    pipelined = collectives.ring_pipelined_allreduce
    res = sim.run(lambda c: pipelined(c, torch.ones(numel), segment_bytes=seg), n, network=NET)
    want = cost.allreduce_time("ring_pipelined", numel * 4, n, NET, segment_bytes=seg)
    assert cost.terms("ring_pipelined", numel * 4, n, segment_bytes=seg)[0] == 2 * (n - 1) * 4
    assert math.isclose(res.seconds, want, rel_tol=1e-9)


@pytest.mark.parametrize("op", cost.COLLECTIVES)
def test_builtin_collective_times(op):
    n, numel = 5, 500

    def worker(comm):
        t = torch.ones(numel)
        if op == "all_reduce":
            comm.all_reduce(t)
        elif op == "broadcast":
            comm.broadcast(t, 0)
        elif op == "reduce":
            comm.reduce(t, 0)
        elif op == "reduce_scatter":
            comm.reduce_scatter(torch.empty(numel // n), list(t.chunk(n)))
        else:
            comm.all_gather(list(torch.empty(numel).chunk(n)), torch.ones(numel // n))

    res = sim.run(worker, n, network=NET)
    assert math.isclose(res.seconds, cost.collective_time(op, numel * 4, n, NET), rel_tol=1e-9)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ring_bytes_formula_time_together(world_size):
    s = 4 * 32 * world_size
    res = sim.run(_allreduce, world_size, args=(s // 4, "ring"), network=NET)
    per_rank = 2 * (world_size - 1) * s // world_size
    assert res.ledger.sent == [per_rank] * world_size
    # time = messages in a row * alpha + bytes in a row * beta, the bytes being the ledger's
    assert math.isclose(res.seconds, 2 * (world_size - 1) * NET.latency + per_rank / NET.bandwidth)


def test_winners_small_vs_large_messages():
    net = Network.preset("ethernet_10g")
    latency_bound = ("tree", "halving_doubling", "recursive_doubling")
    assert cost.best_algorithm(1024, 1024, net) in latency_bound
    assert cost.best_algorithm(1 << 30, 8, net) in ("ring", "halving_doubling")
    assert cost.allreduce_time("naive", 1 << 20, 64, net) > cost.allreduce_time("ring", 1 << 20,
                                                                                64, net)
    assert cost.allreduce_time("ring", 100, 1, net) == 0.0


def test_gamma_and_ps_time():
    net = Network(latency=0.0, bandwidth=1e9)
    base = cost.allreduce_time("ring", 1e6, 4, net)
    assert math.isclose(cost.allreduce_time("ring", 1e6, 4, net, gamma=1e-9), base + 0.75e-3)
    # one server: it receives W full gradients and sends W full models
    assert math.isclose(cost.ps_time(1e6, 4, net), 2 * 4 * 1e-3)
    assert cost.ps_time(1e6, 4, net, servers=4) < cost.ps_time(1e6, 4, net)


def test_bandwidths_follow_nccl_tests():
    assert cost.algbw(1e9, 2.0) == 5e8
    assert cost.busbw("all_reduce", 1e9, 1.0, 4) == 1.5e9
    assert cost.busbw("all_gather", 1e9, 1.0, 4) == 0.75e9
    with pytest.raises(ValueError, match="op="):
        cost.busbw("scan", 1, 1, 2)
    with pytest.raises(ValueError, match="algorithm="):
        cost.allreduce_time("butterfly", 1, 2, NET)


def test_fit_recovers_alpha_beta_and_is_robust():
    gen = torch.Generator().manual_seed(0)
    sizes = [8, 64, 512, 1 << 12, 1 << 16, 1 << 20, 1 << 22] * 5
    noise = (torch.rand(len(sizes), generator=gen) * 0.04 + 0.98).tolist()  # +-2 %
    times = [(20e-6 + s / 2e9) * k for s, k in zip(sizes, noise)]
    times[3] = 1.0  # one wild outlier
    net = cost.fit_network(sizes, times)
    assert net.latency == pytest.approx(20e-6, rel=0.1)
    assert net.bandwidth == pytest.approx(2e9, rel=0.1)
    # pure bandwidth data with a slight dip at small sizes: latency clipped at 0, never < 0
    net0 = cost.fit_network([10, 100, 1e6, 1e7], [0.9e-8, 0.9e-7, 1e-3, 1e-2])
    assert net0.latency == 0.0 and net0.bandwidth == pytest.approx(1e9, rel=1e-6)
    with pytest.raises(ValueError, match="two or more"):
        cost.fit_network([8, 8], [1.0, 1.0])


def test_calibrate_on_simulated_ranks_finds_the_network():
    net = Network(latency=5e-5, bandwidth=1.25e9)
    found = cost.calibrate(lambda fn, args: sim.run(fn, 2, args=args, network=net), repeats=2)
    assert found.latency == pytest.approx(5e-5, rel=1e-6)
    assert found.bandwidth == pytest.approx(1.25e9, rel=1e-6)


def test_bench_worker_and_table_on_simulated_ranks():
    res = sim.run(bench.measure, 4, args=(4096, ("builtin", "ring", "tree"), 3, 1),
                  network=NET)
    assert res[0]["ok"] == {"builtin": True, "ring": True, "tree": True}
    rows = bench.rows([res[0]])
    ring = next(r for r in rows if r["algorithm"] == "ring")
    assert ring["ratio"] == pytest.approx(1.0)  # the simulator times both as the same ring
    assert ring["seconds"] == pytest.approx(cost.allreduce_time("ring", 4096, 4, NET))
    text = bench.table(rows)
    assert "busbw" in text and "ring" in text
    assert "not measured" in bench.target(rows)
