"""Notebook 02's interactive comparison: algorithm times vs N, message size and network.

Used in: notebooks/02_allreduce_algorithms.
"""

from __future__ import annotations

import ipywidgets as w

from syncedu.comm.network import PRESETS, Network
from syncedu.lab import cost
from syncedu.strategies.collectives import ALGORITHMS
from syncedu.ui.plots import collectives as plots
from syncedu.ui.widgets import Dashboard, figure_png, show_text

SIZES = [2 ** k for k in range(3, 31)]  # 8 B .. 1 GiB


def describe(times: dict, nbytes: int, world_size: int, network: Network) -> str:
    best = min(times, key=times.get)
    lines = [f"{network.describe()}; N = {world_size}, S = {plots._size(nbytes)}"]
    for name, t in times.items():
        lines.append(f"  {name:<17}{t * 1e3:12.4f} ms{'   <- fastest' if name == best else ''}")
    return "\n".join(lines)


class AlgorithmExplorer(Dashboard):
    """Sliders for N and S, a network preset, algorithm toggles: predicted times and a plot.

    `.times` ({algorithm: seconds}), `.best` and `.text` hold the last result.
    """

    def __init__(self, network: str = "ethernet_10g", world_size: int = 64,
                 nbytes: int = 1 << 20, algorithms=tuple(ALGORITHMS)):
        self.network = w.Dropdown(options=sorted(PRESETS), value=network, description="network")
        self.n = w.SelectionSlider(options=[2 ** k for k in range(1, 11)], value=world_size,
                                   description="ranks N", continuous_update=False)
        self.size = w.SelectionSlider(options=[(plots._size(s), s) for s in SIZES],
                                      value=nbytes, description="size S",
                                      continuous_update=False)
        self.algos = w.SelectMultiple(options=list(ALGORITHMS), value=tuple(algorithms),
                                      description="algorithms", rows=4)
        self.out, self.image = w.Output(), w.Image(format="png")
        for c in (self.network, self.n, self.size, self.algos):
            c.observe(lambda _: self.update(), names="value")
        self.widget = w.VBox([w.HBox([self.network, self.algos]), self.n, self.size,
                              self.out, self.image])
        self.update()

    def update(self) -> None:
        net, n, s = PRESETS[self.network.value], self.n.value, self.size.value
        names = list(self.algos.value) or list(ALGORITHMS)
        self.times = {a: cost.allreduce_time(a, s, n, net) for a in names}
        self.best = min(self.times, key=self.times.get)
        self.text = describe(self.times, s, n, net)
        show_text(self.out, self.text)
        curves = {a: [cost.allreduce_time(a, x, n, net) for x in SIZES] for a in names}
        fig = plots.time_vs_size(curves, SIZES, marker=s, title=f"N = {n}, {net.name}")
        self.image.value = figure_png(fig)
