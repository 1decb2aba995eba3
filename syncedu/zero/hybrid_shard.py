"""`HybridShard`: FullyShard inside each node, replicas across nodes (HSDP), for training.

PyTorch FSDP's HYBRID_SHARD (FSDP2: `fully_shard` on a 2-D mesh of
replicate x shard; Zhao et al., VLDB 2023). Every parameter is cut along dim 0
over the G = world_size / nodes ranks of one node (FullyShard's units, on the
node's `hsdp.SubComm`); each node holds one replica of the sharded model.

1. forward / backward all-gathers run inside the node (fast links only);
2. backward: the unit's gradients are reduce-scattered inside the node (the
   node's mean), then allreduced across the replicas (the ranks with the same
   local rank; mean over nodes), so each shard gets the global mean;
3. `set_requires_all_reduce(False)` (FSDP2's name) or `no_all_reduce()`:
   the node reduce-scatter still runs but step 2's allreduce is deferred, its
   input added into a shard-sized buffer; the next backward that all-reduces
   sends the sum once (NVIDIA/cosmos-framework#162 measured 39% less step
   time from this on 2 x 8 A100s over Ethernet); `no_sync()` defers both;
4. replicated parameters are allreduced over all ranks, as in FullyShard.

Used in: notebooks/10_sharded_data_parallel; tests/zero/test_hsdp.py.
"""

from __future__ import annotations

import contextlib

import torch

from .fully_shard import FullyShard
from .hsdp import check_nodes, groups, replica_all_reduce


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
        """False: defer the cross-node allreduce (Step 3) until it is True again."""
        if requires not in (True, False):
            raise ValueError(f"requires={requires!r} must be a bool")
        self.require_all_reduce = requires

    @contextlib.contextmanager
    def no_all_reduce(self):
        """Step 3 inside the block (the forward decides, as for no_sync)."""
        old, self.require_all_reduce = self.require_all_reduce, False
        try:
            yield
        finally:
            self.require_all_reduce = old

    def _backward(self, u, grads, sync: bool) -> list:
        mine = super()._backward(u, grads, sync)  # the node's mean, or None (no_sync)
        if mine[0] is None:
            return mine
        flat = torch.cat([g.reshape(-1) for g in mine])
        pending = getattr(u, "pending_replica", None)
        if pending is not None:
            flat.add_(pending)
        if not self._all_reduce_armed:  # Step 3: keep the node's sum for later
            u.pending_replica = flat
            return [None] * len(mine)
        u.pending_replica = None
        replica_all_reduce(self.comm, flat, self.nodes).div_(self.nodes)  # Step 2
        out, a = [], 0
        for g in mine:
            out.append(flat[a: a + g.numel()].view_as(g))
            a += g.numel()
        return out
