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
    inter = {m: hsdp.inter_node_bytes(res, net) for m, res in out.items()}
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


# ------------------------------------------------------------ HybridShard: HSDP training
class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)
        self.scale = torch.nn.Parameter(torch.ones(()))  # a scalar: replicated

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.scale


def _data(step, rank, size=4):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def _one_process(n, steps=3):
    net = _Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        xs, ys = zip(*[_data(step, r) for r in range(n)])
        torch.nn.functional.cross_entropy(net(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return {k: p.detach() for k, p in net.named_parameters()}


def _hybrid_worker(comm, micro=1, defer=False, steps=3):
    from syncedu.zero.hsdp import HybridShard

    hs = HybridShard(_Net(), comm)  # nodes from the cluster network
    opt = torch.optim.SGD(hs.module.parameters(), lr=0.1)
    comm.ledger.reset()
    for step in range(steps):
        opt.zero_grad()
        x, y = _data(step, comm.rank)
        for k, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            later = defer and k < micro - 1
            with hs.no_all_reduce() if later else torch.enable_grad():
                (torch.nn.functional.cross_entropy(hs(xm), ym) / micro).backward()
        hs.finish_gradient_synchronization()
        opt.step()
    shapes = {k: tuple(p.shape) for k, p in hs.module.named_parameters()}
    return hs.full_parameters(), shapes, {k: v.sent for k, v in comm.ledger.ops.items()}


def test_hybrid_shard_trains_like_one_process():
    net = Network.cluster(2, 2)
    want = _one_process(4)
    every = sim.run(_hybrid_worker, 4, network=net)
    for params, *_ in every:
        for k in want:
            torch.testing.assert_close(params[k], want[k], atol=1e-6, rtol=0, msg=k)
    assert every[0][1]["fc1.weight"] == (3, 6) and every[1][1]["fc1.weight"] == (2, 6)  # G=2
    assert every[2][1] == every[0][1]  # node 1 holds the same shards as node 0
    ops = every[0][2]
    assert {"node_all_gather", "node_reduce_scatter", "replica_reduce_scatter",
            "replica_all_gather", "all_reduce"} <= set(ops)
    deferred = sim.run(_hybrid_worker, 4, network=net, kwargs={"micro": 2, "defer": True})
    for k in want:
        torch.testing.assert_close(deferred[0][0][k], want[k], atol=1e-6, rtol=0, msg=k)
    plain = sim.run(_hybrid_worker, 4, network=net, kwargs={"micro": 2})[0][2]
    d = deferred[0][2]
    assert d["replica_reduce_scatter"] * 2 == plain["replica_reduce_scatter"]  # once a step
    assert d["node_reduce_scatter"] == plain["node_reduce_scatter"]  # still every micro-batch


def test_hybrid_shard_needs_nodes_that_divide_the_world():
    from syncedu.zero.hsdp import HybridShard

    def worker(comm, nodes):
        HybridShard(_Net(), comm, nodes=nodes)
    for nodes, match in ((3, "nodes=3"), (None, "nodes=None")):
        with pytest.raises(Exception, match=match):
            sim.run(worker, 4, args=(nodes,))
