"""HSDP: shard inside a node, replicate across nodes (`HybridShard`); accumulation under it.

Hybrid sharding (PyTorch FSDP's HYBRID_SHARD; FSDP2's 2-D mesh of `replicate` x
`shard`; Zhao et al., VLDB 2023, sec. 3.2) cuts the parameters in G = world_size /
nodes shards, one per rank of a node, and keeps `nodes` replicas of that sharded
model. Consecutive ranks share a node (as torchrun and `Network.cluster` number
them): rank r is shard r mod G of replica r // G. Plain FSDP is nodes=1.

`HybridShard` is `FullyShard` with its units cut over the node's `SubComm`:

1. backward: a unit's gradients ring-reduce-scattered among the node's G ranks
   (ledger op "node_reduce_scatter"): each rank gets the node's mean of its 1/G piece;
2. `replica_all_reduce`: that piece ring-allreduced among the ranks with the same
   local rank, one per node ("replica_*"): the mean over all ranks;
3. forward (and backward, resharded): the shards all-gathered inside the node
   ("node_all_gather"), so parameters never cross the slow link.

Under accumulation over M micro-batches (PyTorch pull request 126166 names the
flavours, `MODES`): sync every micro-batch; skip the reduce-scatter (FSDP2's
`set_requires_gradient_sync(False)`, our `no_sync()`: whole gradients kept,
memory Psi); or defer only the cross-replica allreduce
(`set_requires_all_reduce(False)`: gradients stay sharded, the slow inter-node
link is used once). `accumulation_worker` trains one step of each with `HybridShard`
and modeled compute; `COSMOS_162` is the measured run that motivated the last (step times measured).
"""

from __future__ import annotations

import contextlib
import math

import torch

from syncedu.train.layer_compute import LayerCompute
from syncedu.train.memory import held_bytes
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.shards import (
    Layout,
    flatten,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
    unflatten,
)

__all__ = ["HybridShard", "SubComm", "check_nodes", "replica_all_reduce", "MODES",
           "accumulation_worker", "inter_node_bytes", "COSMOS_162"]

MODES = ("every", "no_reduce_scatter", "defer_all_reduce")

# NVIDIA/cosmos-framework pull request 162 (and issue 161), measured on 2 nodes of
# 8x A100-80GB joined by Ethernet, HSDP shard=8 x replicate=2, batch 64 per rank.
COSMOS_162 = {
    "url": "https://github.com/NVIDIA/cosmos-framework/pull/162",
    "setup": "2 nodes x 8 A100-80GB, Ethernet between nodes, HSDP shard=8 replicate=2, "
             "batch 64/rank, 4 micro-batches",
    "accum1_s": 22.2, "accum4_every_s": 88.8, "accum4_defer_s": 54.3,
    # Per micro-batch, DERIVED not measured: the PR splits 22.2 s by assuming deferring
    # removes 3 whole syncs (4 x 10.8 + 11.4 = 54.6 s ~ 54.3 s), so a bound built on it is circular.
    "compute_s": 10.8, "sync_s": 11.4,
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


def replica_all_reduce(comm, piece: torch.Tensor, nodes: int) -> torch.Tensor:
    """Step 2: sum `piece` (in place) over the replicas: a ring allreduce across nodes (its
    two halves, charged to "replica_reduce_scatter" and "replica_all_gather")."""
    _, replicas = groups(comm, nodes)
    if replicas.world_size > 1:
        parts = Layout(piece.numel(), replicas.world_size, "uneven").pieces(piece)
        ring_reduce_scatter_pieces(replicas, parts)
        ring_all_gather_pieces(replicas, parts)
    return piece


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
    """One optimizer step's gradients over M=`micro` micro-batches, by `HybridShard` (nodes=1:
    FSDP over all ranks) on a d x d linear layer (d^2 = `numel`), gradients by `mode` (MODES).

    `compute_seconds` per micro-batch is modeled (train.layer_compute: 1/3 forward, 2/3
    backward). Returns the logical seconds from a common start (`start`), the gradient
    bytes kept between micro-batches (measured), and this rank's gradient shard.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {MODES}")
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ValueError(f"micro={micro!r} must be an int >= 1")
    d = math.isqrt(numel)
    if d * d != numel:
        raise ValueError(f"numel={numel!r} must be a square (a d x d layer)")
    torch.manual_seed(0)
    layer = torch.nn.Linear(d, d, bias=False)
    hs = HybridShard(layer, comm, nodes=nodes)
    LayerCompute(layer, comm, compute_seconds)
    x = torch.randn(micro, 2, d, generator=torch.Generator().manual_seed(comm.rank))
    x.requires_grad_(True)  # a layer inside a network: its backward needs the weights again
    comm.barrier()
    start, kept = comm.now(), 0
    for m in range(micro):
        defer = {"no_reduce_scatter": hs.no_sync, "defer_all_reduce": hs.no_all_reduce}
        later = m < micro - 1 and mode in defer
        with defer[mode]() if later else contextlib.nullcontext():
            (hs(x[m]).square().mean() / micro).backward()
        if m < micro - 1:  # what this rank holds until the next micro-batch
            u = hs.units[0]
            kept = held_bytes([layer.weight.grad, u.accumulated and u.accumulated[0],
                               getattr(u, "pending_replica", None)])
    hs.finish_gradient_synchronization()
    return {"seconds": comm.now() - start, "start": start, "grad_bytes_kept": kept,
            "grad": layer.weight.grad}


def inter_node_bytes(res, network, since: float = 0.0) -> int:
    """Bytes the trace of `res` shows crossing between nodes of `network` (a cluster),
    of the messages sent at or after logical time `since`."""
    node = torch.tensor([network.node_of(r) for r in range(len(res))])
    src, dst = torch.from_numpy(res.trace.src), torch.from_numpy(res.trace.dst)
    mask = (node[src] != node[dst]).numpy() & (res.trace.start >= since)
    return int(res.trace.nbytes[mask].sum())


def _sim(numel, nodes, gpus_per_node, shard_nodes, mode, micro, compute_seconds, intra, inter):
    from syncedu.comm import Network, sim

    net = Network.cluster(nodes, gpus_per_node, intra=intra, inter=inter)
    res = sim.run(accumulation_worker, nodes * gpus_per_node, network=net, output="quiet",
                  args=(numel, shard_nodes, mode, micro, compute_seconds))
    since = min(r["start"] for r in res)
    sent = int(res.trace.nbytes[res.trace.start >= since].sum())
    inter = inter_node_bytes(res, net, since)
    return {"seconds": max(r["seconds"] for r in res), "inter_bytes": inter,
            "intra_bytes": sent - inter,
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
