"""Lesson 04's interactive comparison: each change of a control re-runs `ps.run(...,
simulate=True)` (logical time) and shows a one-line summary and `plots.run_panels`."""

from __future__ import annotations

import ipywidgets as w

from syncedu.comm.network import PRESETS
from syncedu.ps import plots as ps_plots
from syncedu.ps import training as ps_train
from syncedu.ps.config import MODES
from syncedu.ui.widgets import Explorer


def summary(h) -> str:
    """One line describing a run (fixed digits, so it can be compared)."""
    cfg = h.config
    return (f"{cfg.mode} tau={cfg.bound} servers={cfg.servers}: {h.seconds:.3f} logical s, "
            f"idle {h.mean_idle:.1%}, max staleness {max(h.staleness)}, "
            f"final loss {h.final_loss:.4f}, pushed {h.pushed} = applied {h.applied}")


class PSExplorer(Explorer):
    """Widgets that re-run a simulated parameter server; `.history` and `.text` hold the last."""

    def __init__(self, workers: int = 8, steps: int = 30, global_batch: int = 64,
                 lr: float = 0.3, plots: bool = True):
        self.workers, self.steps, self.global_batch, self.lr = workers, steps, global_batch, lr
        self.plots = plots
        style = {"description_width": "initial"}
        controls = {
            "mode": w.Dropdown(options=list(MODES), value="ssp", description="mode"),
            "tau": w.IntSlider(value=2, min=0, max=16, description="tau (ssp)",
                               continuous_update=False, style=style),
            "servers": w.IntSlider(value=1, min=1, max=4, description="servers",
                                   continuous_update=False),
            "slowdown": w.FloatSlider(value=1.0, min=1.0, max=4.0, step=0.5,
                                      description="last worker slowdown",
                                      continuous_update=False, style=style),
            "variability": w.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.1,
                                         description="variability", continuous_update=False),
            "network": w.Dropdown(options=list(PRESETS), value="ethernet_10g",
                                  description="network"),
        }
        self.mode, self.tau, self.servers, self.slowdown, self.variability, self.network = \
            controls.values()
        super().__init__(controls, self._view)

    @property
    def history(self):
        """The last run's `PSHistory`."""
        return self.result

    def _view(self, mode, tau, servers, slowdown, variability, network):
        slow = {self.workers - 1: slowdown} if slowdown != 1 else None
        net = ps_train.stragglers(self.workers, servers, slow, network)
        h = ps_train.run(mode, self.workers, servers=servers,
                         staleness=tau if mode == "ssp" else 0, steps=self.steps,
                         global_batch=self.global_batch, lr=self.lr, network=net,
                         simulate=True, variability=variability)
        text = summary(h)
        return text, ps_plots.run_panels(h, text) if self.plots else None, h
