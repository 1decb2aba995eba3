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

`Cluster` is defined in network.py, next to `Network` (whose `cluster()` makes
one), so the two modules no longer import each other; this module keeps the
name `syncedu.comm.cluster.Cluster` working.
"""

from .network import Cluster

__all__ = ["Cluster"]
