"""HSDP: shard inside a node, replicate across nodes (`HybridShard`).

PyTorch FSDP's HYBRID_SHARD (FSDP2: a 2-D mesh of `replicate` x `shard`; Zhao et al., VLDB
2023, sec. 3.2): G = world_size / nodes shards, one per rank of a node, and `nodes`
replicas (nodes=1: plain FSDP). Consecutive ranks share a node (as torchrun and
`Network.cluster` number them): rank r is shard r mod G of replica r // G.
`HybridShard` is `FullyShard` with its units cut over the node's `SubComm`:

1. backward: a unit's gradients ring-reduce-scattered among the node's G ranks
   ("node_reduce_scatter"): each rank gets the node's mean of its 1/G piece;
2. `replica_all_reduce`: that piece ring-allreduced among the ranks with the same local
   rank, one per node ("replica_*"): the mean over all ranks;
3. forward (and backward, resharded): shards all-gathered inside the node
   ("node_all_gather"), so parameters never cross the slow link.
"""

from __future__ import annotations

import torch

from syncedu.comm.torch_comm import TorchComm
from syncedu.compress.base import flatten
from syncedu.train.sampling import check_int
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.shards import (
    Layout,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
    unflatten,
)


def check_nodes(world_size: int, nodes: int) -> int:
    """G, the ranks per node; ValueError unless `nodes` divides `world_size`."""
    if world_size % check_int("nodes", nodes):
        raise ValueError(f"world_size={world_size} must be a multiple of nodes={nodes}: "
                         f"HSDP needs the same number of ranks on every node")
    return world_size // nodes


class SubComm:
    """Some of `parent`'s ranks as one ring: the two collectives FullyShard's units call."""

    def __init__(self, parent, ranks, label: str):
        self.parent, self.ranks, self.label = parent, list(ranks), label
        self.rank, self.world_size = self.ranks.index(parent.rank), len(self.ranks)

    def isend(self, tensor, dst: int, tag: int = 0):
        return self.parent.isend(tensor, self.ranks[dst], tag)

    def irecv(self, tensor, src: int, tag: int = 0):
        return self.parent.irecv(tensor, self.ranks[src], tag)

    def scope(self, name: str):
        return self.parent.scope(f"{self.label}_{name.removeprefix('ring_')}")

    def all_gather(self, tensor_list: list, tensor: torch.Tensor):
        """`tensor_list[j]` = group rank j's `tensor` (a ring; equal sizes)."""
        tensor_list[self.rank].copy_(tensor)
        ring_all_gather_pieces(self, tensor_list)
        return tensor_list

    def reduce_scatter(self, output: torch.Tensor, input_list: list, op: str = "sum"):
        """`output` = the group's sum (op="avg": mean) of `input_list[rank]` (the ring's
        buffers: they keep partial sums)."""
        if op not in ("sum", "avg"):
            raise ValueError(f"op={op!r} is not supported here; choose 'sum' or 'avg'")
        output.copy_(ring_reduce_scatter_pieces(self, input_list))
        return output.div_(self.world_size) if op == "avg" else output


def groups(comm, nodes: int) -> tuple[SubComm, SubComm]:
    """(this rank's node, this rank's replica group): consecutive ranks share a node."""
    g = check_nodes(comm.world_size, nodes)
    node, local = divmod(comm.rank, g)
    return (SubComm(comm, range(node * g, node * g + g), "node"),
            SubComm(comm, range(local, comm.world_size, g), "replica"))


def replica_all_reduce(comm, piece: torch.Tensor, nodes: int) -> torch.Tensor:
    """Step 2: sum `piece` (in place) over the replicas: a ring allreduce across nodes (its
    two halves, charged to "replica_reduce_scatter" and "replica_all_gather")."""
    _, replicas = groups(comm, nodes)
    if replicas.world_size > 1:
        parts = Layout(piece.numel(), replicas.world_size).pieces(piece)
        ring_reduce_scatter_pieces(replicas, parts)
        ring_all_gather_pieces(replicas, parts)
    return piece


class HybridShard(FullyShard):
    """`FullyShard` over each node's ranks, replicated over `nodes` (None: `comm.network`'s)."""

    def __init__(self, module, comm=None, *, nodes: int | None = None, **kwargs):
        comm = TorchComm() if comm is None else comm
        if nodes is None:
            if not getattr(comm.network, "is_cluster", False):
                raise ValueError("nodes=None needs comm.network to be a Network.cluster; "
                                 "give nodes= (the number of replicas)")
            nodes = comm.network.nodes
        check_nodes(comm.world_size, nodes)
        self.nodes = nodes
        super().__init__(module, comm, **kwargs)

    def _shard_comm(self, comm):
        return groups(comm, self.nodes)[0]  # Step 1: this rank's node

    def unit_backward(self, u, grads, sync: bool) -> list:
        mine = super().unit_backward(u, grads, sync)  # the node's mean, or None (no_sync)
        if mine[0] is None:
            return mine
        flat = flatten(mine)
        replica_all_reduce(self.comm, flat, self.nodes).div_(self.nodes)  # Step 2
        return unflatten(flat, mine)


def _one_step(comm, numel: int, nodes: int) -> dict:
    """One backward of a d x d linear layer (d^2 = `numel`) under `HybridShard`."""
    d = int(numel ** 0.5)
    torch.manual_seed(0)
    layer = torch.nn.Linear(d, d, bias=False)
    hs = HybridShard(layer, comm, nodes=nodes)
    x = torch.randn(2, d, generator=torch.Generator().manual_seed(comm.rank))
    x.requires_grad_(True)  # a layer inside a network: its backward needs the weights again
    comm.barrier()
    start = comm.now()
    hs(x).square().mean().backward()
    hs.finish_gradient_synchronization()
    return {"seconds": comm.now() - start, "start": start, "grad": layer.weight.grad}


def hsdp_vs_fsdp(nodes=(2, 4, 8), gpus_per_node: int = 4, numel: int = 2 ** 18,
                 intra="nvlink4", inter="infiniband_ndr") -> list:
    """One FSDP and one HSDP step per node count on simulated `Network.cluster` ranks:
    seconds, and bytes crossing between nodes (trace)."""
    from syncedu.comm import Network, sim

    rows = []
    for k in nodes:
        net = Network.cluster(k, gpus_per_node, intra=intra, inter=inter)
        node = torch.tensor([net.node_of(r) for r in range(k * gpus_per_node)])
        for layout, shard_nodes in (("fsdp", 1), ("hsdp", k)):
            res = sim.run(_one_step, k * gpus_per_node, network=net, output="quiet",
                          args=(numel, shard_nodes))
            t = res.trace
            crosses = (node[torch.from_numpy(t.src)] != node[torch.from_numpy(t.dst)]).numpy()
            since = t.start >= min(r["start"] for r in res)
            rows.append({"nodes": k, "layout": layout,
                         "seconds": max(r["seconds"] for r in res),
                         "inter_bytes": int(t.nbytes[crosses & since].sum()),
                         "shard_elements": max(r["grad"].numel() for r in res)})
    return rows
