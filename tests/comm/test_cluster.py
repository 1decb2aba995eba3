"""Cluster networks: shape checks, where ranks sit, NIC sharing, formulas, and what
practitioners know coming out of the simulator by itself."""

from __future__ import annotations

import math

import pytest
import torch

from syncedu import Network, collectives, cost
from syncedu.comm import sim

ETH = Network.preset("ethernet_10g")


def cluster(nodes, per_node, nics=1, inter="ethernet_10g"):
    return Network.cluster(nodes, per_node, "nvlink4", inter, nics_per_node=nics)


def simulated(name, nbytes, network, world_size):
    numel = nbytes // 4

    def worker(comm):
        collectives.allreduce(comm, torch.ones(numel), algorithm=name)

    return sim.run(worker, world_size, network=network).seconds


# ------------------------------------------------------------------ shape
@pytest.mark.parametrize("kwargs, field", [
    (dict(nodes=0, gpus_per_node=2), "nodes"), (dict(nodes=2, gpus_per_node=-1), "gpus_per_node"),
    (dict(nodes=2, gpus_per_node=2, nics_per_node=0), "nics_per_node"),
    (dict(nodes=2, gpus_per_node=2, nics_per_node=3), "nics_per_node"),
    (dict(nodes=2.5, gpus_per_node=2), "nodes"),
    (dict(nodes=2, gpus_per_node=2, intra="warp_drive"), "intra"),
    (dict(nodes=2, gpus_per_node=2, inter=3), "inter"),
])
def test_bad_shapes_and_presets_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Network.cluster(**kwargs)


def test_a_cluster_that_does_not_match_the_world_size_is_refused():
    with pytest.raises(ValueError, match="nodes=2 x gpus_per_node=4 = 8 ranks"):
        sim.run(lambda comm: None, 6, network=cluster(2, 4))


def test_presets_or_networks_and_the_flat_fields():
    net = Network.cluster(2, 4, Network(latency=1e-6, bandwidth=1e11), "ethernet_10g")
    assert net.inter == ETH and net.latency == ETH.latency and net.bandwidth == ETH.bandwidth
    assert net.world_size == 8 and net.link(0, 3) is net.intra and net.link(3, 4) is net.inter
    assert "2 nodes x 4 ranks" in net.describe()


def test_every_comm_knows_its_node_and_local_rank():
    def where(comm):
        return comm.node, comm.local_rank, comm.local_world_size

    assert list(sim.run(where, 6, network=cluster(3, 2))) == [
        (0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2), (2, 0, 2), (2, 1, 2)]
    assert list(sim.run(where, 3)) == [(0, 0, 3), (0, 1, 3), (0, 2, 3)]  # flat: one node


# ------------------------------------------------------------------ NICs
def _fan_out(comm, nbytes):
    """Node 0's ranks each send `nbytes` to their partner on node 1, all at once."""
    half = comm.world_size // 2
    buf = torch.ones(nbytes // 4)
    if comm.rank < half:
        comm.send(buf, comm.rank + half)
    else:
        comm.recv(buf, comm.rank - half)
    return comm.now()


@pytest.mark.parametrize("nics", [1, 2, 4])
def test_flows_through_one_nic_split_its_bandwidth(nics):
    net, s = cluster(2, 4, nics), 1_000_000
    res = sim.run(_fan_out, 8, args=(s,), network=net)
    per_nic = 4 // nics
    w = s / ETH.bandwidth
    assert math.isclose(res.seconds, ETH.latency + per_nic * w, rel_tol=1e-12)
    assert sorted(res[4:]) == pytest.approx(sorted(ETH.latency + (i // nics + 1) * w
                                                   for i in range(4)))


def test_messages_inside_a_node_take_the_intra_link_and_no_nic():
    net = cluster(1, 8)
    res = sim.run(_fan_out, 8, args=(1_000_000,), network=net)
    assert math.isclose(res.seconds, net.intra.transfer_time(1_000_000), rel_tol=1e-12)


# ---------------------------------------------------------------- formulas
SHAPES = [(2, 2, 1), (2, 4, 1), (4, 4, 2), (8, 2, 1), (3, 2, 1)]


@pytest.mark.parametrize("nodes, per_node, nics", SHAPES)
@pytest.mark.parametrize("name", ["ring", "tree", "naive"])
@pytest.mark.parametrize("nbytes", [4 * 1024, 4 << 20])
def test_cluster_formulas_equal_the_simulator(nodes, per_node, nics, name, nbytes):
    net, n = cluster(nodes, per_node, nics), nodes * per_node
    nbytes = nbytes // (4 * n) * 4 * n  # every chunk the same size
    assert math.isclose(simulated(name, nbytes, net, n), cost.allreduce_time(name, nbytes, n, net),
                        rel_tol=1e-9)


@pytest.mark.parametrize("nodes, per_node, nics", [(2, 2, 1), (2, 4, 1), (4, 4, 2), (8, 2, 1)])
@pytest.mark.parametrize("name", ["halving_doubling", "recursive_doubling", "hierarchical"])
def test_contended_formulas_are_exact_for_small_messages_and_close_for_large(
        nodes, per_node, nics, name):
    net, n = cluster(nodes, per_node, nics), nodes * per_node
    for nbytes, tol in [(4 * 64 * n, 0.1), (4 * 65536 * n, 0.25)]:
        sim_s, formula = simulated(name, nbytes, net, n), cost.allreduce_time(name, nbytes, n, net)
        assert abs(sim_s / formula - 1) <= tol, (nbytes, sim_s, formula)


def test_one_rank_per_node_is_a_flat_network_of_the_inter_link():
    net, n, nbytes = cluster(4, 1), 4, 4 * 4096
    for name in ("ring", "halving_doubling", "recursive_doubling", "tree", "hierarchical"):
        assert math.isclose(simulated(name, nbytes, net, n),
                            cost.allreduce_time(name, nbytes, n, ETH), rel_tol=1e-9)


@pytest.mark.parametrize("op", cost.COLLECTIVES)
def test_builtin_collectives_on_a_cluster_equal_their_formula(op):
    net, n, numel = cluster(2, 4), 8, 8 * 1000

    def worker(comm):
        t = torch.ones(numel)
        if op == "all_reduce":
            comm.all_reduce(t)
        elif op == "broadcast":
            comm.broadcast(t, 0)
        elif op == "reduce":
            comm.reduce(t, 7)
        elif op == "reduce_scatter":
            comm.reduce_scatter(torch.empty(numel // n), list(t.chunk(n)))
        else:
            comm.all_gather(list(torch.empty(numel).chunk(n)), torch.ones(numel // n))
        return t[0].item()

    res = sim.run(worker, n, network=net)
    assert math.isclose(res.seconds, cost.collective_time(op, numel * 4, n, net), rel_tol=1e-9)


# ------------------------------------------------- what practitioners know
def test_large_messages_on_a_cluster_the_ring_beats_flat_halving_doubling():
    net, n, big = cluster(4, 4), 16, 16 << 20
    ring, hd = simulated("ring", big, net, n), simulated("halving_doubling", big, net, n)
    assert ring < 0.6 * hd  # HD's crossing steps put 4 flows through each NIC at once
    flat = Network.preset("ethernet_10g")  # on a flat network of the same links, HD wins
    assert simulated("halving_doubling", big, flat, n) <= simulated("ring", big, flat, n)


def test_small_messages_on_a_cluster_latency_wins():
    net, n, small = cluster(4, 4), 16, 16 * 64
    ring = simulated("ring", small, net, n)
    for name in ("tree", "halving_doubling", "recursive_doubling"):
        assert simulated(name, small, net, n) < 0.3 * ring, name


def test_hierarchical_is_as_fast_as_the_ring_for_large_messages_and_faster_at_scale():
    net = cluster(4, 4, inter="infiniband_ndr")
    big = 16 << 20
    assert simulated("hierarchical", big, net, 16) <= simulated("ring", big, net, 16)
    wide, small = cluster(32, 4, inter="infiniband_ndr"), 128 * 256
    assert simulated("hierarchical", small, wide, 128) < 0.5 * simulated("ring", small, wide, 128)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_on_a_flat_network_the_old_results_hold(n):
    for nbytes in (4 * n, 4 * 1024 * n, 4 << 20):
        times = {name: simulated(name, nbytes, ETH, n) for name in ("ring", "tree",
                                                                    "halving_doubling")}
        assert times["halving_doubling"] <= min(times.values()) * (1 + 1e-12)


def test_placement_puts_rank_r_in_slot_placement_r():
    """Review A2: the rank placement is a parameter; an alternating one makes every ring step
    cross the NIC, and a bad one is refused by name."""
    import pytest
    import torch

    from syncedu import Network, collectives, sim

    alt = Network.cluster(2, 4, placement=[(r % 2) * 4 + r // 2 for r in range(8)])
    assert [alt.node_of(r) for r in range(8)] == [0, 1] * 4
    assert [alt.local_rank_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    res = sim.run(lambda c: collectives.ring_allreduce(c, torch.ones(64)), 8, network=alt)
    assert all(alt.node_of(s) != alt.node_of(d) for s, d in res.trace.pairs())
    for bad in ([0] * 8, list(range(7)), [8, 1, 2, 3, 4, 5, 6, 7]):
        with pytest.raises(ValueError, match="placement"):
            Network.cluster(2, 4, placement=bad)
    with pytest.raises(sim.WorkerError, match="placement=None"):
        sim.run(lambda c: collectives.hierarchical_allreduce(c, torch.ones(8)), 8, network=alt)
