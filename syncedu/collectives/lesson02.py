"""Notebook 02's interactive comparison: which allreduce wins, by N, message size and network.

Times are `cost.allreduce_time`: the simulator's clock exactly on flat networks, a lockstep
approximation of it on the clusters of 8-rank nodes.
"""

from __future__ import annotations

import ipywidgets as w
import torch

from syncedu.collectives import ALGORITHMS, cost, plots
from syncedu.comm import sim
from syncedu.comm.network import PRESETS, Network
from syncedu.comm.runs import check_choice
from syncedu.ui.widgets import Explorer

SIZES = [2 ** k for k in range(3, 31)]  # 8 B .. 1 GiB
GPUS_PER_NODE = 8
CLUSTERS = {  # name -> (inside a node, between nodes)
    "cluster: 8/node, NVLink + 100 GbE": ("nvlink4", "ethernet_100g"),
    "cluster: 8/node, NVLink + InfiniBand NDR": ("nvlink4", "infiniband_ndr"),
}
NETWORKS = (*CLUSTERS, *sorted(PRESETS))


def network(choice: str, world_size: int) -> Network:
    """The network `choice` names: a flat preset, or a cluster of 8-rank nodes for N ranks."""
    if choice in PRESETS:
        return PRESETS[choice]
    if choice not in CLUSTERS:
        raise ValueError(f"network={choice!r} is unknown; choose one of {list(NETWORKS)}")
    per_node = min(GPUS_PER_NODE, world_size)
    if world_size % per_node:
        raise ValueError(f"world_size={world_size} must be a multiple of {per_node} "
                         "(whole 8-rank nodes) on a cluster network")
    return Network.cluster(world_size // per_node, per_node, *CLUSTERS[choice])


def simulate(name: str, world_size: int, choice: str, nbytes: int, progress=None):
    """The `RunResult` of one `name` allreduce of `nbytes` of float32 ones per rank, on
    simulated ranks of network `choice` (`progress`: `sim.run`'s tqdm bar of messages)."""
    check_choice("name", name, list(ALGORITHMS))
    if nbytes < 4 or nbytes % 4:
        raise ValueError(f"nbytes={nbytes!r} must be a positive multiple of 4 (float32)")
    return sim.run(lambda c: ALGORITHMS[name](c, torch.ones(nbytes // 4)), world_size,
                   network=network(choice, world_size), progress=progress, output="quiet")


class AlgorithmExplorer(Explorer):
    """Sliders for N and S, a network, algorithm toggles: predicted times and a plot;
    `.times` ({algorithm: seconds}), `.best` and `.text` hold the last result."""

    def __init__(self, network: str = "ethernet_10g", world_size: int = 64,
                 nbytes: int = 1 << 20, algorithms=tuple(ALGORITHMS)):
        super().__init__({
            "network": w.Dropdown(options=NETWORKS, value=network, description="network",
                                  layout=w.Layout(width="420px")),
            "algorithms": w.SelectMultiple(options=list(ALGORITHMS), value=tuple(algorithms),
                                           description="algorithms", rows=len(ALGORITHMS)),
            "world_size": w.SelectionSlider(options=[2 ** k for k in range(1, 11)],
                                            value=world_size, description="ranks N",
                                            continuous_update=False),
            "nbytes": w.SelectionSlider(options=[(plots.size_label(s), s) for s in SIZES],
                                        value=nbytes, description="size S",
                                        continuous_update=False)}, self._compare)

    def _compare(self, **v):
        n, s, net = v["world_size"], v["nbytes"], network(v["network"], v["world_size"])
        names = list(v["algorithms"]) or list(ALGORITHMS)
        self.times = {a: cost.allreduce_time(a, s, n, net) for a in names}
        self.best = min(self.times, key=self.times.get)
        text = "\n".join([f"{net.describe()}; N = {n}, S = {plots.size_label(s)}"] + [
            f"  {a:<19}{t * 1e3:12.4f} ms{'   <- fastest' if a == self.best else ''}"
            for a, t in self.times.items()])
        curves = {a: [cost.allreduce_time(a, x, n, net) for x in SIZES] for a in names}
        return text, plots.time_vs_size(curves, SIZES, marker=s, title=f"N = {n}, {net.name}")
