"""Eager below `eager_limit`, rendezvous above: the unsafe exchange deadlocks, named."""

from __future__ import annotations

import math

import pytest
import torch

import syncedu.comm
from syncedu import Network, collectives, sim


def _send_first(comm, numel):
    peer = 1 - comm.rank
    x, y = torch.ones(numel), torch.empty(numel)
    comm.send(x, peer)  # both send first ...
    comm.recv(y, peer)  # ... then receive
    return y.sum().item()


def test_unsafe_exchange_of_large_messages_deadlocks():
    assert Network().eager_limit == 64 * 1024
    with pytest.raises(sim.DeadlockError) as info:
        sim.run(_send_first, 2, args=(1 << 20,))
    err = info.value
    assert err.ranks == [0, 1] and isinstance(err, syncedu.comm.DeadlockError)
    for r in (0, 1):
        assert f"send to rank {1 - r}" in err.waiting[r]
        assert "eager_limit 65536" in err.waiting[r] and "matching receive" in err.waiting[r]


def test_small_messages_are_eager_and_limit_can_be_lifted():
    assert sim.run(_send_first, 2, args=(100,)) == [100.0, 100.0]
    net = Network(eager_limit=math.inf)
    assert sim.run(_send_first, 2, args=(1 << 20,), network=net) == [2.0 ** 20] * 2


def test_safe_exchange_with_isend_irecv_completes():
    def worker(comm, numel):
        peer = 1 - comm.rank
        x, y = torch.ones(numel), torch.empty(numel)
        works = [comm.isend(x, peer), comm.irecv(y, peer)]
        for w in works:
            w.wait()
        return y.sum().item()

    assert sim.run(worker, 2, args=(1 << 20,)) == [2.0 ** 20] * 2


def test_rendezvous_sender_waits_for_the_receive():
    net = Network(latency=1e-6, bandwidth=1e9, eager_limit=1000)

    def worker(comm, numel):
        x = torch.ones(numel)
        if comm.rank == 0:
            comm.send(x, 1)
        else:
            comm.compute(1e-3)  # posts its receive late
            comm.recv(x, 0)
        return comm.now()

    eager = sim.run(worker, 2, args=(100,), network=net)  # 400 bytes: eager
    rdv = sim.run(worker, 2, args=(1000,), network=net)  # 4000 bytes: rendezvous
    assert eager[0] == pytest.approx(1e-6 + 400 / 1e9)
    assert rdv[0] == pytest.approx(1e-3)  # the sender waited until the receive was posted


@pytest.mark.parametrize("name", ["naive_allreduce", "ring_allreduce", "tree_allreduce",
                                  "halving_doubling_allreduce", "recursive_doubling_allreduce"])
@pytest.mark.parametrize("n", [3, 4, 6])
def test_package_algorithms_do_not_deadlock_with_large_messages(name, n):
    def worker(comm):
        t = torch.full((1 << 16,), float(comm.rank))  # 256 KiB: above the eager limit
        getattr(collectives, name)(comm, t)
        return t[0].item()

    assert sim.run(worker, n, network=Network(eager_limit=1024)) == [n * (n - 1) / 2] * n


def test_network_options_are_validated():
    with pytest.raises(ValueError, match="latency_model"):
        Network(latency_model="hockney")
    with pytest.raises(ValueError, match="eager_limit"):
        Network(eager_limit=-1)
    with pytest.raises(ValueError, match="builtin_algorithm"):
        Network(builtin_algorithm="tree")
    with pytest.raises(ValueError, match="nics"):
        Network.cluster(2, 4, nics="per_rack")
    net = Network.cluster(2, 4, nics="per_gpu", latency_model="wire", eager_limit=1)
    assert (net.nics_per_node, net.latency_model, net.eager_limit) == (4, "wire", 1)
    assert Network.cluster(2, 4, nics="per_node").nics_per_node == 1
