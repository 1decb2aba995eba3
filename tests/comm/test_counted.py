"""Counted vs modeled ledgers, built-ins as message schedules, the fast path, the wire witness."""

from __future__ import annotations

import pytest
import torch

from syncedu import Network, launch, sim
from syncedu.comm import sim_collectives, wire
from syncedu.comm.ledger import ring_allreduce_elements


def _builtins(comm, numel: int):
    g = torch.Generator().manual_seed(comm.rank)
    t = torch.randn(numel, generator=g)
    comm.all_reduce(t)
    out = torch.zeros(3)
    comm.reduce_scatter(out, [torch.randn(3, generator=g) for _ in range(comm.world_size)])
    parts = [torch.zeros(2) for _ in range(comm.world_size)]
    comm.all_gather(parts, torch.randn(2, generator=g))
    b = torch.full((5,), float(comm.rank))
    comm.broadcast(b, src=1 % comm.world_size)
    r = torch.randn(4, generator=g)
    comm.reduce(r, dst=comm.world_size - 1)
    comm.barrier()
    return t, out, parts, b, r if comm.rank == comm.world_size - 1 else None


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_simulated_ranks_count_everything():
    n, numel = 4, 10
    res = sim.run(_builtins, n, args=(numel,), network=Network(latency=1e-6, bandwidth=1e9))
    led = res.ledger
    assert led.modeled.sent == [0] * n and led.modeled.received == [0] * n
    assert led.counted.sent == led.sent and led.counted.ops.keys() == led.ops.keys()
    for r in range(n):  # the ring's messages, counted, come to the formula's bytes
        sent, recv = ring_allreduce_elements(numel, n, r)
        assert led.counted.ops["all_reduce"].sent[r] == 4 * sent
        assert led.counted.ops["all_reduce"].received[r] == 4 * recv
    assert led.ops["barrier"].msgs_sent == [2] * n  # dissemination: ceil(log2 4) rounds
    assert len(res.trace) == sum(led.msgs_sent) == sum(led.msgs_received)


@pytest.mark.parametrize("model", ["port", "wire"])
@pytest.mark.parametrize("n,numel", [(2, 1), (4, 10), (5, 3), (7, 1000)])
@pytest.mark.parametrize("kind", ["flat", "jitter"])
def test_fast_path_gives_the_messages_results(monkeypatch, n, numel, model, kind):
    net = Network(latency=1e-6, bandwidth=1e9, latency_model=model,
                  jitter=1e-7 if kind == "jitter" else 0.0)
    _compare(monkeypatch, net, n, numel)


@pytest.mark.parametrize("model", ["port", "wire"])
@pytest.mark.parametrize("nodes,gpus,nics", [(2, 2, 1), (3, 2, 2), (2, 4, 1)])
def test_fast_path_on_clusters(monkeypatch, nodes, gpus, nics, model):
    net = Network.cluster(nodes, gpus, nics_per_node=nics, latency_model=model)
    _compare(monkeypatch, net, nodes * gpus, 37)


def _compare(monkeypatch, net, n, numel):
    fast = sim.run(_builtins, n, args=(numel,), network=net)
    monkeypatch.setattr(sim_collectives, "FAST", False)
    slow = sim.run(_builtins, n, args=(numel,), network=net)
    assert _same(list(fast), list(slow))  # bit for bit
    assert fast.seconds == slow.seconds
    assert fast.ledger.rows() == slow.ledger.rows()
    assert sorted(fast.trace) == sorted(slow.trace)


def test_message_path_sums_in_ring_order(monkeypatch):
    """On the message path the sum of chunk k starts at rank k+1 and ends at rank k."""
    monkeypatch.setattr(sim_collectives, "FAST", False)
    vals = [1e16, 1.0, -1e16, 1.0]  # float64: the order decides what survives

    def worker(comm):
        t = torch.tensor([vals[comm.rank]] * 4, dtype=torch.float64)
        comm.all_reduce(t)
        return t.tolist()

    got = sim.run(worker, 4)[0]
    for k in range(4):
        acc = vals[(k + 1) % 4]
        for j in range(2, 5):
            acc = acc + vals[(k + j) % 4]
        assert got[k] == acc


def test_binomial_rooted_collectives():
    net = Network(latency=1e-6, bandwidth=1e9, builtin_algorithm="binomial")

    def worker(comm):
        b = torch.full((3,), float(comm.rank))
        comm.broadcast(b, src=2)
        r = torch.full((3,), float(comm.rank + 1))
        comm.reduce(r, dst=1)
        return b.tolist(), r.tolist()

    n = 6
    res = sim.run(worker, n, network=net)
    assert all(v[0] == [2.0] * 3 for v in res) and res[1][1] == [21.0] * 3
    assert sum(res.ledger.ops["broadcast"].msgs_sent) == n - 1
    bcast = res.trace.only(op="broadcast")
    assert sorted(zip(bcast.src.tolist(), bcast.dst.tolist())) == [(2, 0), (2, 3), (2, 4),
                                                                   (3, 1), (3, 5)]

    def broadcast_only(comm):
        comm.broadcast(torch.zeros(3), src=2)

    tree = sim.run(broadcast_only, n, network=net).seconds
    chain = sim.run(broadcast_only, n, network=net.replace(builtin_algorithm="ring")).seconds
    assert tree == pytest.approx(3 * 1.012e-6) and chain == pytest.approx(5 * 1.012e-6)


def test_async_builtins_still_overlap():
    net = Network(latency=1e-6, bandwidth=1e9)

    def worker(comm):
        t = torch.ones(1000)
        work = comm.all_reduce(t, async_op=True)
        comm.compute(1e-3)
        work.wait()
        return comm.now(), t[0].item()

    res = sim.run(worker, 4, network=net)
    assert all(v == (pytest.approx(1e-3), 4.0) for v in res)


def test_1024_ranks_all_reduce_is_fast():
    import time

    def worker(comm):
        comm.all_reduce(torch.ones(1000))

    t0 = time.process_time()  # CPU, not wall: a loaded machine must not fail it
    res = sim.run(worker, 1024, network=Network.preset("nvlink4"))
    assert time.process_time() - t0 < 15  # 1-2 s on a quiet core; the bound is 5 s
    assert len(res.trace) == 1024 * 2 * 1023


@pytest.mark.real
def test_real_ranks_model_builtins_and_count_p2p():
    def worker(comm):
        t = torch.ones(1000)
        comm.all_reduce(t)
        x = torch.ones(7)
        if comm.rank == 0:
            comm.send(x, 1, tag=3)
        else:
            comm.recv(x, 0, tag=3)
        return t[0].item()

    n = 2
    res = launch.run(worker, n, output="quiet")
    led = res.ledger
    assert led.counted.ops["all_reduce"].sent == [0] * n
    assert led.modeled.ops["all_reduce"].sent == [4 * ring_allreduce_elements(1000, n, r)[0]
                                                  for r in range(n)]
    assert led.counted.ops["send"].sent == [28, 0] and led.modeled.ops["send"].sent == [0, 0]
    assert [a + b for a, b in zip(led.counted.sent, led.modeled.sent)] == led.sent
    (rec,) = list(res.trace)
    assert (rec.src, rec.dst, rec.nbytes, rec.tag, rec.op) == (0, 1, 28, 3, "send")
    assert rec.end >= rec.start


@pytest.mark.real
@pytest.mark.skipif(not wire.available(), reason="no loopback byte counter (not Linux)")
def test_wire_witness_sees_the_ring_bytes():
    numel = 1 << 20  # 4 MiB of float32

    def worker(comm):
        t = torch.ones(numel)
        return wire.measure(comm, lambda: comm.all_reduce(t), rounds=3)

    n = 2
    res = launch.run(worker, n, output="quiet")
    modeled = sum(res.ledger.modeled.ops["all_reduce"].sent) // 3
    reading = res[0]
    assert reading.rounds == 3 and reading.baseline >= 0
    assert 1.0 <= reading.bytes / modeled < 1.05  # payload plus TCP/IP headers


def test_wire_witness_refuses_simulated_ranks():
    def worker(comm):
        return wire.measure(comm, lambda: None)

    with pytest.raises(sim.WorkerError, match="real ranks"):
        sim.run(worker, 2)
