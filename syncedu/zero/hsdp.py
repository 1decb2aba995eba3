"""HSDP: shard inside a node, replicate across nodes (`HybridShard`).

PyTorch FSDP's HYBRID_SHARD (FSDP2: a 2-D mesh of `replicate` x `shard`; Zhao et al., VLDB
2023, sec. 3.2): G = world_size / nodes shards, one per rank of a node, and `nodes`
replicas (nodes=1: plain FSDP). Consecutive ranks share a node (as torchrun and
`Network.cluster` number them): rank r is shard r mod G of replica r // G.
`HybridShard` is `FullyShard` with its units cut over the node's `SubComm`:

1. backward: a unit's gradients ring-reduce-scattered among the node's G ranks
   ("node_reduce_scatter"): each rank gets the node's mean of its 1/G piece;
2. that piece ring-allreduced among the ranks with the same local rank, one per node (the
   replicas' `SubComm.all_reduce_mean`, "replica_*"): the mean over all ranks;
3. forward (and backward, resharded): shards all-gathered inside the node
   ("node_all_gather"), so parameters never cross the slow link.

Accumulating over micro-batches, two choices (as FSDP2's): `no_sync()` skips steps 1 and 2
and keeps whole fp32 gradients (a unit's full size), while `set_requires_all_reduce(False)`
skips only step 2: every micro-batch still reduce-scatters inside the node, the node's mean
shards (1/G of a unit) add up, and the next backward with it True allreduces the sum across
the nodes once (FSDP2's `set_requires_all_reduce`: the slow link is crossed once a step).
"""

from __future__ import annotations

import torch

from syncedu.comm.runs import check_bool, check_choice, check_int
from syncedu.comm.torch_comm import TorchComm
from syncedu.comm.work import CollectiveWork
from syncedu.dp.buckets import flatten, unflatten_
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.shards import Layout, ring_all_gather_pieces, ring_reduce_scatter_pieces


def check_nodes(world_size: int, nodes: int) -> int:
    """G, the ranks per node; ValueError unless `nodes` divides `world_size`."""
    if world_size % check_int("nodes", nodes):
        raise ValueError(f"world_size={world_size} must be a multiple of nodes={nodes}: "
                         f"HSDP needs the same number of ranks on every node")
    return world_size // nodes


class SubComm:
    """Some of `parent`'s ranks as one ring, for lesson 02's ring collectives (charged to
    "<label>_all_gather" and so on)."""

    def __init__(self, parent, ranks, label: str):
        self.parent, self.ranks, self.label = parent, list(ranks), label
        self.rank, self.world_size = self.ranks.index(parent.rank), len(self.ranks)

    def isend(self, tensor, dst: int, tag: int = 0):
        """`isend` to the subgroup's rank `dst` (its rank in the parent comm)."""
        return self.parent.isend(tensor, self.ranks[dst], tag)

    def irecv(self, tensor, src: int, tag: int = 0):
        """`irecv` from the subgroup's rank `src` (its rank in the parent comm)."""
        return self.parent.irecv(tensor, self.ranks[src], tag)

    def scope(self, name: str):
        """The parent's ledger scope, labelled with this subgroup (e.g. "shard_reduce_scatter")."""
        return self.parent.scope(f"{self.label}_{name.removeprefix('ring_')}")

    def all_gather(self, tensor_list: list, tensor: torch.Tensor, async_op: bool = True):
        """`tensor_list[j]` = group rank j's `tensor` (a ring; equal sizes). Only `RowUnit`
        calls it, with `async_op=True`: it returns a handle with nothing to wait for, done
        already (the ring's sends block)."""
        tensor_list[self.rank].copy_(tensor)
        ring_all_gather_pieces(self, tensor_list)
        return CollectiveWork(None)

    def reduce_scatter(self, output, input_list: list, op: str = "sum", async_op: bool = True):
        """`output` = the group's sum (op="avg": mean, divided by the handle's `wait()`, as an
        asynchronous built-in's) of `input_list[rank]` (the ring's buffers: they keep partial
        sums); a handle, as `all_gather`'s."""
        check_choice("op", op, ("sum", "avg"))
        output.copy_(ring_reduce_scatter_pieces(self, input_list))
        return CollectiveWork(None, lambda: output.div_(self.world_size if op == "avg" else 1))

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Step 2: `tensor` averaged in place over the group, a ring allreduce (its two halves
        charged to "<label>_reduce_scatter" and "<label>_all_gather")."""
        parts = Layout(tensor.numel(), self.world_size).pieces(tensor)
        ring_reduce_scatter_pieces(self, parts)
        ring_all_gather_pieces(self, parts)
        return tensor.div_(self.world_size)


def groups(comm, nodes: int) -> tuple[SubComm, SubComm]:
    """(this rank's node, this rank's replica group): consecutive ranks share a node."""
    g = check_nodes(comm.world_size, nodes)
    node, local = divmod(comm.rank, g)
    return (SubComm(comm, range(node * g, node * g + g), "node"),
            SubComm(comm, range(local, comm.world_size, g), "replica"))


class HybridShard(FullyShard):
    """`FullyShard` over each node's ranks, replicated over `nodes` (None: `comm.network`'s)."""

    def __init__(self, module, comm=None, *, nodes: int | None = None, **kwargs):
        comm = TorchComm() if comm is None else comm
        if nodes is None:
            if not getattr(comm.network, "is_cluster", False):
                raise ValueError("nodes=None needs comm.network to be a Network.cluster; "
                                 "give nodes= (the number of replicas)")
            nodes = comm.network.nodes
        self.nodes, self.requires_all_reduce = nodes, True
        super().__init__(module, comm, **kwargs)

    def set_requires_all_reduce(self, requires_all_reduce: bool) -> None:
        """False: defer step 2 (the replicas' allreduce), adding up the node's mean shards."""
        self.requires_all_reduce = check_bool("requires_all_reduce", requires_all_reduce)

    def _shard_comm(self, comm):
        node, self.replicas = groups(comm, self.nodes)  # Step 1: this rank's node, its replicas
        return node

    def reduced(self, u, done) -> list:
        """Steps 1-2 (`FullyShard.reduced`'s place, with or without prefetch): the node's mean
        (`done`: SubComm's ring has finished), then the replicas' allreduce, or deferred."""
        mine = done()  # Step 1: the node's mean of this rank's rows
        if u.pending is not None:  # the node's means of the deferred micro-batches
            mine = [g if g is None else g.add_(d) for g, d in zip(mine, u.pending)]
        u.pending = None if self.requires_all_reduce else mine
        if u.pending is not None:
            return [None] * len(mine)
        kept = [g for g in mine if g is not None]  # frozen parameters have none
        self.replicas.all_reduce_mean(flat := flatten(kept))  # Step 2: the mean over the nodes
        unflatten_(kept, flat)
        return mine
