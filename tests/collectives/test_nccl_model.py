"""The port of NCCL 2.30.7's tuning model, against values computed by hand from tuning.cc."""

from __future__ import annotations

import pytest

from syncedu import Network
from syncedu.collectives import nccl_model as m

# 16 Hopper GPUs on 2 nodes (NVLink inside, Intel CPUs), 2 channels of 20 GB/s.
SYS = m.NcclSystem(n_ranks=16, n_nodes=2, bw_intra=20.0, bw_inter=20.0, n_channels=2)


def test_ring_simple_by_hand():
    # latency: base 8.4 + (30 - 2) intra hops x max(NVLink 3.4, net overhead 1.0 x 3)
    #          + 2 inter hops x NET ring Simple 14.0 = 8.4 + 95.2 + 28 = 131.6 us
    assert m.latency(SYS, "ring", "Simple") == pytest.approx(131.6)
    # bandwidth: 2 channels x 20 (bwIntra: <= 2 nodes) = 40 busBw x 16 / 30 = 21.333 GB/s
    assert m.bandwidth(SYS, "ring", "Simple") == pytest.approx(40 * 16 / 30)
    # 1 MiB: 1048576 / (2 x 16) >= 64, so the plateau: 131.6 x 1.4, + 1048576 / (1000 x 21.333)
    assert m.predict(SYS, 1 << 20) == pytest.approx((131.6 * 1.4 + 49.152) * 1e-6)


def test_tree_ll_by_hand():
    # latency: base 6.8 + 2 x ((8 - 1) x NVLink tree LL 0.6 + log2(2) x NET tree LL 5.0) = 25.2
    assert m.latency(SYS, "tree", "LL") == pytest.approx(25.2)
    # bandwidth: min(40 x .92, 2 x 41.4) = 36.8; LL: min(36.8 / 3.8, llMaxBw 39.0); x .5
    assert m.bandwidth(SYS, "tree", "LL") == pytest.approx(36.8 / 3.8 / 2)
    # 1 KiB: log2(1024 >> 6) = 4, correction 0.9
    bw = 36.8 / 3.8 / 2 * 0.9
    assert m.predict(SYS, 1024, "tree", "LL") == pytest.approx((25.2 + 1024 / (1000 * bw)) * 1e-6)


def test_one_node_ring_ll_and_ll128():
    one = m.NcclSystem(n_ranks=8, n_nodes=1, bw_intra=20.0, n_channels=16)
    # LL: min(llMaxBw[hopper][1 node] 141.0, 320 x .5 = 160) = 141 x 8 / 14
    assert m.bandwidth(one, "ring", "LL") == pytest.approx(141.0 * 8 / 14)
    # LL128: min(320 x .92 = 294.4, 16 x 36.7 = 587.2) x 8 / 14
    assert m.bandwidth(one, "ring", "LL128") == pytest.approx(294.4 * 8 / 14)
    # no network: 6.6 + 14 x NVLink ring LL 0.6 = 15.0 us
    assert m.latency(one, "ring", "LL") == pytest.approx(15.0)


def test_small_messages_pick_low_latency_and_large_pick_bandwidth():
    assert m.best(SYS, 1024)[1] == "LL"
    assert m.best(SYS, 1 << 30)[1] != "LL"
    assert set(m.table(SYS, 1 << 20)) == {(a, p) for a in m.ALGORITHMS for p in m.PROTOCOLS}


def test_from_network_nic_presets():
    per_node = m.from_network(Network.cluster(8, 8, nics="per_node"))
    per_gpu = m.from_network(Network.cluster(8, 8, nics="per_gpu"))
    assert (per_node.n_channels, per_gpu.n_channels) == (2, 8)
    assert per_node.bw_inter * per_node.n_channels == pytest.approx(50.0)  # one 50 GB/s NIC
    assert per_gpu.bw_inter * per_gpu.n_channels == pytest.approx(400.0)  # eight of them
    assert m.best(per_gpu, 64 << 20)[2] < m.best(per_node, 64 << 20)[2]


def test_validation():
    with pytest.raises(ValueError, match="n_nodes"):
        m.NcclSystem(n_ranks=16, n_nodes=3)
    with pytest.raises(ValueError, match="out of scope"):
        m.predict(SYS, 1024, "nvls")
    with pytest.raises(ValueError, match="protocol"):
        m.predict(SYS, 1024, "ring", "LL64")
    with pytest.raises(ValueError, match="cluster"):
        m.from_network(Network())
