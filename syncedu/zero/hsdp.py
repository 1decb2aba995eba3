"""HSDP: shard inside a node, replicate across nodes (`HybridShard`); accumulation under it.

Hybrid sharding (PyTorch FSDP's HYBRID_SHARD; FSDP2's 2-D mesh of `replicate` x
`shard`; Zhao et al., VLDB 2023, sec. 3.2) cuts the parameters in G = world_size /
nodes shards, one per rank of a node, and keeps `nodes` replicas of that sharded
model. Consecutive ranks share a node (as torchrun and `Network.cluster` number
them): rank r is shard r mod G of replica r // G. Plain FSDP is nodes=1.

1. `node_reduce_scatter`: ring reduce-scatter among the node's G ranks (a
   `SubComm`; ledger op "node_reduce_scatter"): each rank gets the node's sum of
   its 1/G piece;
2. `replica_all_reduce`: ring allreduce of that piece among the ranks with the
   same local rank, one per node ("replica_*"): the sum over all ranks;
3. `node_all_gather`: the updated shards, inside the node ("node_all_gather").

`HybridShard` trains a model so: `FullyShard`'s units cut over the node, their
gradients reduce-scattered in the node, then allreduced across the replicas.
Under accumulation over M micro-batches (PyTorch pull request 126166 names the
flavours, `MODES`): sync every micro-batch; skip the reduce-scatter (FSDP2's
`set_requires_gradient_sync(False)`, our `no_sync()`: whole gradients kept,
memory Psi); or defer only the cross-replica allreduce
(`set_requires_all_reduce(False)`: gradients stay sharded, the slow inter-node
link is used once). `accumulation_worker` runs one step of each, modeled;
`COSMOS_162` is the measured run that motivated the last.
"""

from __future__ import annotations

import contextlib

import torch

from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.shards import (
    Layout,
    flatten,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
    unflatten,
)

__all__ = ["HybridShard", "SubComm", "check_nodes", "node_reduce_scatter", "replica_all_reduce",
           "node_all_gather", "hsdp_mean", "MODES", "accumulation_worker", "inter_node_bytes",
           "COSMOS_162"]

MODES = ("every", "no_reduce_scatter", "defer_all_reduce")

# NVIDIA/cosmos-framework pull request 162 (and issue 161), measured on 2 nodes of
# 8x A100-80GB joined by Ethernet, HSDP shard=8 x replicate=2, batch 64 per rank.
COSMOS_162 = {
    "url": "https://github.com/NVIDIA/cosmos-framework/pull/162",
    "setup": "2 nodes x 8 A100-80GB, Ethernet between nodes, HSDP shard=8 replicate=2, "
             "batch 64/rank, 4 micro-batches",
    "accum1_s": 22.2, "accum4_every_s": 88.8, "accum4_defer_s": 54.3,
    "compute_s": 10.8, "sync_s": 11.4,  # per micro-batch, their decomposition
}
COSMOS_162["saving"] = 1 - COSMOS_162["accum4_defer_s"] / COSMOS_162["accum4_every_s"]  # 0.39


def check_nodes(world_size: int, nodes: int) -> int:
    """G, the ranks per node; ValueError unless `nodes` divides `world_size`."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes={nodes!r} must be an int >= 1")
    if world_size % nodes:
        raise ValueError(f"world_size={world_size} must be a multiple of nodes={nodes}: "
                         f"HSDP needs the same number of ranks on every node")
    return world_size // nodes


class SubComm:
    """Some of `parent`'s ranks as one ring: point-to-point, and the two collectives
    FullyShard's units call, as rings charged to "{label}_reduce_scatter" and
    "{label}_all_gather"."""

    def __init__(self, parent, ranks, label: str = ""):
        self.parent, self.ranks, self.label = parent, list(ranks), label
        self.rank, self.world_size = self.ranks.index(parent.rank), len(self.ranks)

    def isend(self, tensor, dst: int, tag: int = 0):
        return self.parent.isend(tensor, self.ranks[dst], tag)

    def irecv(self, tensor, src: int, tag: int = 0):
        return self.parent.irecv(tensor, self.ranks[src], tag)

    def scope(self, name: str):
        return self.parent.scope(f"{self.label}_{name.removeprefix('ring_')}"
                                 if self.label else name)

    def all_gather(self, tensor_list: list, tensor: torch.Tensor):
        """`tensor_list[j]` = group rank j's `tensor` (a ring; equal sizes)."""
        tensor_list[self.rank].copy_(tensor)
        ring_all_gather_pieces(self, tensor_list)
        return tensor_list

    def reduce_scatter(self, output: torch.Tensor, input_list: list, op: str = "sum"):
        """`output` = the group's sum (op="avg": mean) of `input_list[rank]`; the
        inputs are used as the ring's buffers (they keep partial sums)."""
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


def node_reduce_scatter(comm, flat: torch.Tensor, nodes: int) -> torch.Tensor:
    """Step 1: the node's sum of this rank's 1/G piece of `flat` (a new tensor)."""
    node, _ = groups(comm, nodes)
    pieces = Layout(flat.numel(), node.world_size, "uneven").pieces(flat.clone())
    return ring_reduce_scatter_pieces(node, pieces).clone()


def replica_all_reduce(comm, piece: torch.Tensor, nodes: int) -> torch.Tensor:
    """Step 2: sum `piece` (in place) over the replicas: a ring allreduce across nodes."""
    _, replicas = groups(comm, nodes)
    if replicas.world_size > 1:
        parts = Layout(piece.numel(), replicas.world_size, "uneven").pieces(piece)
        ring_reduce_scatter_pieces(replicas, parts)  # ledger: replica_reduce_scatter
        ring_all_gather_pieces(replicas, parts)  # and replica_all_gather
    return piece


def node_all_gather(comm, piece: torch.Tensor, numel: int, nodes: int):
    """Step 3: the whole `numel` elements from the node's G pieces (this rank's is `piece`)."""
    node, _ = groups(comm, nodes)
    full = piece.new_zeros(numel)
    pieces = Layout(numel, node.world_size, "uneven").pieces(full)
    pieces[node.rank].copy_(piece)
    ring_all_gather_pieces(node, pieces)
    return full


def hsdp_mean(comm, flat: torch.Tensor, nodes: int) -> torch.Tensor:
    """Steps 1-2: this rank's 1/G piece of the mean of `flat` over all ranks."""
    piece = node_reduce_scatter(comm, flat, nodes)
    return replica_all_reduce(comm, piece, nodes).div_(comm.world_size)


class HybridShard(FullyShard):
    """`FullyShard` over each node's ranks, replicated over `nodes` nodes.

    Args:
        module, comm, compute_dtype, shard, reshard_after_forward: as FullyShard.
        nodes: how many nodes (replicas); None: those of `comm.network`
            (a `Network.cluster`). It must divide the world size.
    """

    def __init__(self, module, comm=None, *, nodes: int | None = None, **kwargs):
        if comm is None:
            from syncedu.comm import TorchComm
            comm = TorchComm()
        if nodes is None:
            net = comm.network
            if net is None or not getattr(net, "is_cluster", False):
                raise ValueError("nodes=None needs comm.network to be a Network.cluster; "
                                 "give nodes= (the number of replicas)")
            nodes = net.nodes
        check_nodes(comm.world_size, nodes)
        self.nodes = nodes
        self.require_all_reduce = self._all_reduce_armed = True
        super().__init__(module, comm, **kwargs)

    def _shard_comm(self, comm):
        return groups(comm, self.nodes)[0]  # Step 1: this rank's node

    def _arm(self, module, args):
        super()._arm(module, args)
        self._all_reduce_armed = self.require_all_reduce

    def set_requires_all_reduce(self, requires: bool) -> None:
        """False: defer the cross-node allreduce (FSDP2's name) until it is True again."""
        if requires not in (True, False):
            raise ValueError(f"requires={requires!r} must be a bool")
        self.require_all_reduce = requires

    @contextlib.contextmanager
    def no_all_reduce(self):
        """`set_requires_all_reduce(False)` inside the block (the forward decides, as no_sync)."""
        old, self.require_all_reduce = self.require_all_reduce, False
        try:
            yield
        finally:
            self.require_all_reduce = old

    def _backward(self, u, grads, sync: bool) -> list:
        mine = super()._backward(u, grads, sync)  # the node's mean, or None (no_sync)
        if mine[0] is None:
            return mine
        flat = flatten(mine)
        pending = getattr(u, "pending_replica", None)
        if pending is not None:
            flat.add_(pending)
        if not self._all_reduce_armed:  # deferred: keep the node's sum for later
            u.pending_replica = flat
            return [None] * len(mine)
        u.pending_replica = None
        replica_all_reduce(self.comm, flat, self.nodes).div_(self.nodes)  # Step 2
        return unflatten(flat, mine)


def accumulation_worker(comm, numel: int, nodes: int, mode: str = "every", micro: int = 1,
                        compute_seconds: float = 0.0) -> dict:
    """One optimizer step of M=`micro` micro-batches of sharded training, modeled.

    Per micro-batch: all-gather the parameters in the node (forward), compute
    1/3 of `compute_seconds`, all-gather again (backward, resharded after
    forward), compute 2/3, then the gradients of `mode` (see MODES and the
    module docstring). Gradients are seeded per rank and micro-batch, so the
    result can be checked. Returns seconds, the gradient bytes kept between
    micro-batches, and this rank's gradient shard.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {MODES}")
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ValueError(f"micro={micro!r} must be an int >= 1")
    g = check_nodes(comm.world_size, nodes)
    shard = torch.zeros(Layout(numel, g, "uneven").sizes[comm.rank % g])
    acc_full = acc_shard = None
    for m in range(micro):
        for part in (1 / 3, 2 / 3):  # forward, then backward, each after its all-gather
            node_all_gather(comm, shard, numel, nodes)
            comm.compute(compute_seconds * part)
        grad = torch.randn(numel, generator=torch.Generator().manual_seed(97 * comm.rank + m))
        last = m == micro - 1
        if mode == "no_reduce_scatter":  # whole gradients kept until the last micro-batch
            acc_full = grad if acc_full is None else acc_full.add_(grad)
            if last:
                acc_shard = hsdp_mean(comm, acc_full, nodes).mul_(comm.world_size)
            continue
        piece = node_reduce_scatter(comm, grad, nodes)
        if mode == "every":
            replica_all_reduce(comm, piece, nodes)
        acc_shard = piece if acc_shard is None else acc_shard.add_(piece)
        if mode == "defer_all_reduce" and last:
            replica_all_reduce(comm, acc_shard, nodes)
    kept = (numel if mode == "no_reduce_scatter" else shard.numel()) * 4
    return {"seconds": comm.now(), "grad_bytes_kept": kept,
            "grad": acc_shard.div_(comm.world_size * micro)}


def inter_node_bytes(res, network) -> int:
    """Bytes the trace of `res` shows crossing between nodes of `network` (a cluster)."""
    node = torch.tensor([network.node_of(r) for r in range(len(res))])
    src, dst = torch.from_numpy(res.trace.src), torch.from_numpy(res.trace.dst)
    return int(res.trace.nbytes[(node[src] != node[dst]).numpy()].sum())


def _sim(numel, nodes, gpus_per_node, shard_nodes, mode, micro, compute_seconds, intra, inter):
    from syncedu.comm import Network, sim

    net = Network.cluster(nodes, gpus_per_node, intra=intra, inter=inter)
    res = sim.run(accumulation_worker, nodes * gpus_per_node, network=net, output="quiet",
                  args=(numel, shard_nodes, mode, micro, compute_seconds))
    inter = inter_node_bytes(res, net)
    return {"seconds": res.seconds, "inter_bytes": inter,
            "intra_bytes": sum(res.ledger.sent) - inter,
            "grad_bytes_kept": max(r["grad_bytes_kept"] for r in res),
            "shard_elements": max(r["grad"].numel() for r in res)}


def hsdp_vs_fsdp(nodes=(2, 4, 8), gpus_per_node: int = 4, numel: int = 2 ** 18,
                 compute_seconds: float = 0.0, intra="nvlink4", inter="infiniband_ndr") -> list:
    """One step (one micro-batch) of FSDP (all ranks shard) and HSDP (G ranks shard) per
    node count, on simulated `Network.cluster` ranks: rows of seconds and bytes summed over
    ranks, split by link (intra- or inter-node)."""
    rows = []
    for k in nodes:
        for layout, shard_nodes in (("fsdp", 1), ("hsdp", k)):
            row = _sim(numel, k, gpus_per_node, shard_nodes, "every", 1, compute_seconds,
                       intra, inter)
            rows.append({"nodes": k, "layout": layout, **row})
    return rows


def accumulation_comparison(nodes: int = 2, gpus_per_node: int = 8, micro: int = 4,
                            numel: int = 2 ** 18, compute_seconds: float = 0.0,
                            intra="nvlink4", inter="ethernet_100g") -> list:
    """One optimizer step of `micro` micro-batches under HSDP (shard inside the node), per
    mode in MODES: rows of seconds, bytes by link, and gradient bytes kept per rank;
    `saving` is the step time saved against syncing every micro-batch."""
    rows = [{"mode": mode, **_sim(numel, nodes, gpus_per_node, nodes, mode, micro,
                                  compute_seconds, intra, inter)} for mode in MODES]
    for row in rows:
        row["saving"] = 1 - row["seconds"] / rows[0]["seconds"]
    return rows
