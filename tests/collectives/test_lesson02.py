"""Lesson 02's explorer: the winner changes with message size and network; bad input is named."""

from __future__ import annotations

import pytest

from syncedu.collectives import lesson02

CLUSTER = "cluster: 8/node, NVLink + 100 GbE"


def test_winner_depends_on_size_and_network():
    explorer = lesson02.AlgorithmExplorer(CLUSTER, world_size=64, nbytes=2**20)
    winners = set()
    for choice, n, nbytes in [("ethernet_100g", 1024, 2**10), ("ethernet_100g", 64, 2**26),
                              (CLUSTER, 64, 2**16), (CLUSTER, 64, 2**26)]:
        explorer.set(network=choice, world_size=n, nbytes=nbytes)
        winners.add(explorer.best)
        assert explorer.best in explorer.text and f"N = {n}" in explorer.text
    assert winners == {"recursive_doubling", "halving_doubling", "tree", "hierarchical"}


def test_network_choices():
    net = lesson02.network(CLUSTER, 64)
    assert (net.nodes, net.gpus_per_node) == (8, 8)
    assert lesson02.network(CLUSTER, 4).gpus_per_node == 4  # fewer ranks than a node: one node
    with pytest.raises(ValueError, match="network='token_ring' is unknown"):
        lesson02.network("token_ring", 8)
    with pytest.raises(ValueError, match="world_size=12 must be a multiple of 8"):
        lesson02.network(CLUSTER, 12)


def test_simulate_runs_the_algorithm_and_counts_its_messages():
    # 16 ranks in 2 nodes: the hierarchical allreduce beats the ring by latency (1 KiB)
    ring = lesson02.simulate("ring", 16, CLUSTER, 1024)
    hier = lesson02.simulate("hierarchical", 16, CLUSTER, 1024)
    assert 0 < hier.seconds < ring.seconds
    assert lesson02.simulate("ring", 16, "ethernet_100g", 1024).seconds > 0
    # the counted ledger against the schedules' step counts
    assert sum(ring.ledger.counted.msgs_sent) == 16 * 2 * 15  # 2(N-1) per rank
    assert sum(hier.ledger.counted.msgs_sent) == 16 * (2 * 7 + 2 * 1)  # 2(L-1) + 2(M-1)
    with pytest.raises(ValueError, match="name='rings' is unknown"):
        lesson02.simulate("rings", 16, CLUSTER, 1024)
    with pytest.raises(ValueError, match="nbytes=6 must be a positive multiple of 4"):
        lesson02.simulate("ring", 16, CLUSTER, 6)
