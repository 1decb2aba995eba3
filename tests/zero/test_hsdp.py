"""zero.hsdp: HSDP (shard in the node, replicate across nodes) gives the global mean,
moves fewer inter-node bytes and less time than FSDP on a cluster; the three
accumulation flavours give the same gradients at their different costs."""

import pytest
import torch

from syncedu.comm import Network, sim
from syncedu.zero import hsdp


def _mean_worker(comm, nodes, numel):
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(comm.rank))
    piece = hsdp.hsdp_mean(comm, flat, nodes)
    return piece, hsdp.node_all_gather(comm, piece, numel, nodes)


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_hsdp_mean_is_the_global_mean(nodes):
    n, numel = 6, 23  # 6 ranks: G = 6, 3, 2 shards of an odd length
    want = torch.stack([torch.randn(numel, generator=torch.Generator().manual_seed(r))
                        for r in range(n)]).mean(0)
    res = sim.run(_mean_worker, n, args=(nodes, numel),
                  network=Network.cluster(3, 2) if nodes == 3 else None)
    for _, full in res:
        torch.testing.assert_close(full, want, atol=1e-6, rtol=0)
    assert sum(p.numel() for p, _ in res) == numel * nodes  # each replica holds it all once


def test_hsdp_against_fsdp_on_clusters():
    rows = hsdp.hsdp_vs_fsdp(nodes=(2, 4), gpus_per_node=2, numel=4096)
    for k in (2, 4):
        fsdp, hyb = [r for r in rows if r["nodes"] == k]
        assert fsdp["layout"] == "fsdp" and hyb["layout"] == "hsdp"
        assert hyb["inter_bytes"] < fsdp["inter_bytes"]  # parameters never leave the node
        assert hyb["seconds"] < fsdp["seconds"]
        assert hyb["shard_elements"] == 4096 // 2 and fsdp["shard_elements"] == 4096 // (2 * k)


def test_accumulation_flavours_same_gradients_different_costs():
    numel, micro = 1000, 3
    net = Network.cluster(2, 2, inter="ethernet_100g")
    out = {mode: sim.run(hsdp.accumulation_worker, 4, network=net,
                         args=(numel, 2, mode, micro, 1e-4)) for mode in hsdp.MODES}
    grads = [torch.randn(numel, generator=torch.Generator().manual_seed(97 * r + m))
             for r in range(4) for m in range(micro)]
    want = torch.stack(grads).mean(0)
    for mode, res in out.items():
        full = torch.cat([res[0]["grad"], res[1]["grad"]])  # node 0's two shards
        torch.testing.assert_close(full, want, atol=1e-6, rtol=0, msg=mode)
    inter = {m: sum(r["inter"] for r in res) for m, res in out.items()}
    assert inter["defer_all_reduce"] * micro == inter["every"]  # the slow link once per step
    assert inter["no_reduce_scatter"] == inter["defer_all_reduce"]
    kept = {m: res[0]["grad_bytes_kept"] for m, res in out.items()}
    assert kept["no_reduce_scatter"] == 4 * numel == 2 * kept["defer_all_reduce"]
    seconds = {m: max(r["seconds"] for r in res) for m, res in out.items()}
    assert seconds["defer_all_reduce"] < seconds["every"]
    assert seconds["no_reduce_scatter"] < seconds["every"]


def test_cosmos_numbers_and_bad_arguments():
    assert round(hsdp.COSMOS_162["saving"], 2) == 0.39
    with pytest.raises(ValueError, match="nodes=3"):
        hsdp.check_nodes(8, 3)
    with pytest.raises(ValueError, match="nodes="):
        hsdp.check_nodes(8, 0)
    with pytest.raises(ValueError, match="mode="):
        hsdp.accumulation_worker(None, 10, 1, "lazy")  # checked before any traffic
