"""`Cluster`: a hierarchical `Network`, nodes of ranks joined by NICs.

    net = Network.cluster(nodes=4, gpus_per_node=8, intra="nvlink4", inter="infiniband_ndr")

Consecutive ranks share a node (ranks 0..L-1 on node 0, L..2L-1 on node 1, ...),
as `torchrun` numbers them. A message inside a node uses the `intra` link; a
message between nodes uses the `inter` link and also passes through a NIC of
each node: rank r uses NIC (local rank mod `nics_per_node`). A NIC carries one
message's bytes at a time (n / inter bandwidth each; latency is not its to
hold), so flows that leave or enter a node together split its bandwidth: eight
ranks sending S bytes out of one node at once take latency + 8 S / bandwidth
(sim.py books it, alphabeta.py has the formulas).

`intra` and `inter` are `Network`s or preset names (`PRESETS`). The cluster's
own `latency` and `bandwidth` are the inter link's (a rough figure for code that
knows only flat networks); `slowdown`, `jitter`, `loss` and `seed` work as on a
flat network.

Used in: notebooks/02_allreduce_algorithms, 09_tuning_playbook.
"""

from __future__ import annotations

from dataclasses import dataclass

from .network import PRESETS, Network


@dataclass(frozen=True)
class Cluster(Network):
    """`nodes` x `gpus_per_node` ranks; `intra` links inside a node, `inter` between nodes."""

    nodes: int = 1
    gpus_per_node: int = 1
    intra: Network | str = "nvlink4"
    inter: Network | str = "infiniband_ndr"
    nics_per_node: int = 1

    def __post_init__(self) -> None:
        for field in ("nodes", "gpus_per_node", "nics_per_node"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Network.cluster: {field}={value!r} is invalid: must be an "
                                 "int >= 1")
        if self.nics_per_node > self.gpus_per_node:
            raise ValueError(f"Network.cluster: nics_per_node={self.nics_per_node} must be "
                             f"<= gpus_per_node={self.gpus_per_node}")
        for field in ("intra", "inter"):
            object.__setattr__(self, field, _link(field, getattr(self, field)))
        object.__setattr__(self, "latency", self.inter.latency)
        object.__setattr__(self, "bandwidth", self.inter.bandwidth)
        if self.name == "custom":
            object.__setattr__(self, "name", f"cluster {self.nodes}x{self.gpus_per_node} "
                                             f"({self.intra.name} / {self.inter.name})")
        super().__post_init__()

    is_cluster = True

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def local_world_size_of(self, rank: int, world_size: int) -> int:
        return self.gpus_per_node

    def nic_of(self, rank: int) -> int:
        """The NIC (0..nics_per_node-1) this rank's messages between nodes go through."""
        return self.local_rank_of(rank) % self.nics_per_node

    def link(self, src: int, dst: int) -> Network:
        return self.intra if self.node_of(src) == self.node_of(dst) else self.inter

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ValueError(f"Network.cluster has nodes={self.nodes} x gpus_per_node="
                             f"{self.gpus_per_node} = {self.world_size} ranks but world_size="
                             f"{world_size}: nodes * gpus_per_node must equal world_size")
        super().check_world_size(world_size)

    def describe(self) -> str:
        return (f"{self.name}: {self.nodes} nodes x {self.gpus_per_node} ranks, "
                f"{self.nics_per_node} NIC(s) per node; inside {self.intra.describe()}; "
                f"between {self.inter.describe()}")


def _link(field: str, value) -> Network:
    if isinstance(value, str):
        if value not in PRESETS:
            raise ValueError(f"Network.cluster: {field}={value!r} is not a known preset; "
                             f"choose one of {sorted(PRESETS)} or pass a Network")
        return PRESETS[value]
    if isinstance(value, Cluster) or not isinstance(value, Network):
        raise ValueError(f"Network.cluster: {field} must be a flat Network or a preset name "
                         f"({sorted(PRESETS)}), got {value!r}")
    return value
