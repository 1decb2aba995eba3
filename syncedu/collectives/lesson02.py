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
from syncedu.ui.widgets import Dashboard, figure_png, show_text

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
    if name not in ALGORITHMS:
        raise ValueError(f"name={name!r} is unknown; choose one of {list(ALGORITHMS)}")
    if nbytes < 4 or nbytes % 4:
        raise ValueError(f"nbytes={nbytes!r} must be a positive multiple of 4 (float32)")
    return sim.run(lambda c: ALGORITHMS[name](c, torch.ones(nbytes // 4)), world_size,
                   network=network(choice, world_size), progress=progress, output="quiet")


class AlgorithmExplorer(Dashboard):
    """Sliders for N and S, a network, algorithm toggles: predicted times and a plot;
    `.times` ({algorithm: seconds}), `.best` and `.text` hold the last result."""

    def __init__(self, network: str = "ethernet_10g", world_size: int = 64,
                 nbytes: int = 1 << 20, algorithms=tuple(ALGORITHMS)):
        self.network = w.Dropdown(options=NETWORKS, value=network, description="network",
                                  layout=w.Layout(width="420px"))
        self.n = w.SelectionSlider(options=[2 ** k for k in range(1, 11)], value=world_size,
                                   description="ranks N", continuous_update=False)
        self.size = w.SelectionSlider(options=[(plots.size_label(s), s) for s in SIZES],
                                      value=nbytes, description="size S",
                                      continuous_update=False)
        self.algos = w.SelectMultiple(options=list(ALGORITHMS), value=tuple(algorithms),
                                      description="algorithms", rows=len(ALGORITHMS))
        self.out, self.image = w.Output(), w.Image(format="png")
        self._quiet = False
        for c in (self.network, self.n, self.size, self.algos):
            c.observe(lambda _: None if self._quiet else self.update(), names="value")
        self.widget = w.VBox([w.HBox([self.network, self.algos]), self.n, self.size,
                              self.out, self.image])
        self.update()

    def set(self, network: str | None = None, world_size: int | None = None,
            nbytes: int | None = None) -> None:
        """Move several controls at once and update once (as a learner would, one by one)."""
        self._quiet = True
        try:
            for control, value in ((self.network, network), (self.n, world_size),
                                   (self.size, nbytes)):
                if value is not None:
                    control.value = value
        finally:
            self._quiet = False
        self.update()

    def update(self) -> None:
        n, s = self.n.value, self.size.value
        net = network(self.network.value, n)
        names = list(self.algos.value) or list(ALGORITHMS)
        self.times = {a: cost.allreduce_time(a, s, n, net) for a in names}
        self.best = min(self.times, key=self.times.get)
        self.text = "\n".join([f"{net.describe()}; N = {n}, S = {plots.size_label(s)}"] + [
            f"  {a:<19}{t * 1e3:12.4f} ms{'   <- fastest' if a == self.best else ''}"
            for a, t in self.times.items()])
        show_text(self.out, self.text)
        curves = {a: [cost.allreduce_time(a, x, n, net) for x in SIZES] for a in names}
        fig = plots.time_vs_size(curves, SIZES, marker=s, title=f"N = {n}, {net.name}")
        self.image.value = figure_png(fig)
