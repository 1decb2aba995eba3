"""Rendezvous at every size by default (Gloo's rule), eager below a named `eager_limit`
(Open MPI's 64 KiB): the unsafe exchange deadlocks, named; a send buffer changed before its
send completes, or a send never waited on, is reported as the mistake it is."""

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


@pytest.mark.parametrize("numel,net", [(16, None), (1 << 20, Network(eager_limit="open_mpi"))])
def test_unsafe_exchange_deadlocks(numel, net):
    """Gloo (the default): 16 floats already deadlock; Open MPI's rule: above 64 KiB."""
    assert Network().eager_limit == 0 and Network(eager_limit="gloo").eager_limit == 0
    with pytest.raises(sim.DeadlockError) as info:
        sim.run(_send_first, 2, args=(numel,), network=net)
    err = info.value
    assert err.ranks == [0, 1] and isinstance(err, syncedu.comm.DeadlockError)
    limit = 0 if net is None else 65536
    for r in (0, 1):
        assert f"send to rank {1 - r}" in err.waiting[r]
        assert f"eager_limit {limit}" in err.waiting[r] and "matching receive" in err.waiting[r]


def test_small_messages_are_eager_under_open_mpi_and_limit_can_be_lifted():
    net = Network(eager_limit="open_mpi")
    assert net.eager_limit == 64 * 1024
    assert sim.run(_send_first, 2, args=(100,), network=net) == [100.0, 100.0]
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
    for bad in (-1, "mpich", [1], True):
        with pytest.raises(ValueError, match="eager_limit"):
            Network(eager_limit=bad)
    with pytest.raises(ValueError, match="builtin_algorithm"):
        Network(builtin_algorithm="tree")
    with pytest.raises(ValueError, match="nics"):
        Network.cluster(2, 4, nics="per_rack")
    net = Network.cluster(2, 4, nics="per_gpu", latency_model="wire", eager_limit=1)
    assert (net.nics_per_node, net.latency_model, net.eager_limit) == (4, "wire", 1)
    assert Network.cluster(2, 4, nics="per_node").nics_per_node == 1


def _reuse(comm, wait):
    """01 Exercise 1's wrong answer: send `cur` and receive into it before the send's wait."""
    cur = torch.full((4,), float(comm.rank))
    work = comm.isend(cur, (comm.rank + 1) % comm.world_size)
    comm.recv(cur, (comm.rank - 1) % comm.world_size)
    if wait:
        work.wait()
    return cur.tolist()


@pytest.mark.parametrize("net", [None, Network(eager_limit=math.inf)])
def test_a_send_buffer_changed_before_wait_is_named(net):
    with pytest.raises(sim.WorkerError, match=r"changed the tensor it isend to rank \d .*before "
                                              "that send's wait"):
        sim.run(_reuse, 3, args=(True,), network=net)


def test_a_send_never_waited_on_is_named():
    def worker(comm):
        x = torch.ones(4)
        if comm.rank == 0:
            comm.isend(x, 1)  # never waited on
        else:
            comm.recv(x, 0)
        return x.sum().item()

    with pytest.raises(sim.WorkerError, match=r"rank 0 returned with 1 isend\(s\) never waited"):
        sim.run(worker, 2)
    with pytest.raises(sim.WorkerError, match="never waited on"):
        sim.run(_reuse, 2, args=(False,), network=Network(eager_limit=math.inf))


def test_sending_and_changing_other_views_of_one_buffer_is_fine():
    """A ring sends one chunk while adding into another of the same tensor: allowed."""
    def worker(comm):
        t = torch.arange(8.0) + comm.rank
        send, mine = t[:4], t[4:]
        work = comm.isend(send, 1 - comm.rank)
        got = comm.recv(torch.empty(4), 1 - comm.rank)
        mine.add_(got)  # moves the version counter `send` shares, not its bytes
        work.wait()
        return t.tolist()

    assert sim.run(worker, 2)[0][4:] == [4.0 + 1, 5.0 + 2, 6.0 + 3, 7.0 + 4]
