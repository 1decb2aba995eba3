"""Lesson 04's interactive comparison: a parameter server on simulated ranks, re-run on change.

Each change of a control runs `ps.run(..., simulate=True)` (logical time) and shows
a one-line summary and `plots.run_panels`.
"""

from __future__ import annotations

import ipywidgets as w

from syncedu.comm.network import PRESETS
from syncedu.ps import plots as ps_plots
from syncedu.ps import training as ps_train
from syncedu.ps.config import MODES
from syncedu.ui.widgets import Dashboard, show_figure, show_text


def summary(h) -> str:
    """One line describing a run (fixed digits, so it can be compared)."""
    cfg = h.config
    return (f"{cfg.mode} tau={cfg.bound} servers={cfg.servers}: {h.seconds:.3f} logical s, "
            f"idle {h.mean_idle:.1%}, max staleness {max(h.staleness)}, "
            f"final loss {h.final_loss:.4f}, pushed {h.pushed} = applied {h.applied}")


class PSExplorer(Dashboard):
    """Widgets that re-run a simulated parameter server; `.history` and `.text` hold the last."""

    def __init__(self, workers: int = 8, steps: int = 30, global_batch: int = 64,
                 lr: float = 0.3, plots: bool = True):
        self.workers, self.steps, self.global_batch, self.lr = workers, steps, global_batch, lr
        self.plots = plots
        style = {"description_width": "initial"}
        self.mode = w.Dropdown(options=list(MODES), value="ssp", description="mode")
        self.tau = w.IntSlider(value=2, min=0, max=16, description="tau (ssp)",
                               continuous_update=False, style=style)
        self.servers = w.IntSlider(value=1, min=1, max=4, description="servers",
                                   continuous_update=False)
        self.slowdown = w.FloatSlider(value=1.0, min=1.0, max=4.0, step=0.5,
                                      description="last worker slowdown",
                                      continuous_update=False, style=style)
        self.variability = w.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.1,
                                         description="variability", continuous_update=False)
        self.network = w.Dropdown(options=list(PRESETS), value="ethernet_10g",
                                  description="network")
        self.out = w.Output()
        self.history, self.text = None, ""
        controls = (self.mode, self.tau, self.servers, self.slowdown, self.variability,
                    self.network)
        for c in controls:
            c.observe(lambda change: self.update(), names="value")
        self.widget = w.VBox([w.HBox(controls[:3]), w.HBox(controls[3:]), self.out])
        self.update()

    def run(self):
        slow = {self.workers - 1: self.slowdown.value} if self.slowdown.value != 1 else None
        net = ps_train.stragglers(self.workers, self.servers.value, slow, self.network.value)
        tau = self.tau.value if self.mode.value == "ssp" else 0
        return ps_train.run(self.mode.value, self.workers, servers=self.servers.value,
                            staleness=tau, steps=self.steps, global_batch=self.global_batch,
                            lr=self.lr, network=net, simulate=True,
                            variability=self.variability.value)

    def update(self) -> None:
        try:
            self.history = self.run()
            self.text = summary(self.history)
        except Exception as e:  # show the failure in the widget, never lose it
            self.history, self.text = None, f"error: {e}"
        show_text(self.out, self.text)
        if self.plots and self.history is not None:
            show_figure(self.out, ps_plots.run_panels(self.history, self.text))
