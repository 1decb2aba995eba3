"""Lesson 06's widget: plain BN vs SyncBN vs one process at a chosen per-rank batch and N."""

from __future__ import annotations

import ipywidgets as w

from syncedu.syncbn import experiment as bx
from syncedu.syncbn import plots as syncbn_plots
from syncedu.ui.widgets import Dashboard, show_figure, show_text


def summary(results: dict) -> str:
    """A fixed-digit table: accuracy (mean, min, max over ranks), final loss, stats spread."""
    lines = [f"{'mode':<8}{'acc mean':>9}{'min':>7}{'max':>7}{'loss(last 20)':>15}"
             f"{'var spread':>12}"]
    for mode, res in results.items():
        acc = res.accuracy
        lines.append(f"{mode:<8}{100 * sum(acc) / len(acc):>8.1f}%{100 * min(acc):>6.1f}%"
                     f"{100 * max(acc):>6.1f}%{sum(res.loss[-20:]) / 20:>15.3f}"
                     f"{100 * res.spread()['var']:>11.1f}%")
    return "\n".join(lines)


class SmallBatchExplorer(Dashboard):
    """Per-rank batch slider and world-size menu; `.results` / `.text` hold the last run."""

    def __init__(self, *, per_rank_batch: int = 2, world_size: int = 4, steps: int = 100,
                 initial: dict | None = None):
        self.steps = steps
        self.batch = w.IntSlider(value=per_rank_batch, min=1, max=8, description="batch/rank",
                                 continuous_update=False)
        self.ranks = w.Dropdown(options=[2, 4, 8], value=world_size, description="ranks")
        self.out = w.Output()
        self.results, self.text = None, ""
        for control in (self.batch, self.ranks):
            control.observe(lambda change: self.update(), names="value")
        self.widget = w.VBox([w.HBox([self.batch, self.ranks]), self.out])
        self.update(initial)

    def update(self, results: dict | None = None) -> None:
        """Rerun the comparison for the sliders' batch and ranks (or show `results`), then
        redraw; an error is shown in the widget, not lost.
        """
        try:
            self.results = results or bx.compare(per_rank_batch=self.batch.value,
                                                 world_size=self.ranks.value, steps=self.steps,
                                                 simulate=True)
            self.text = summary(self.results)
        except Exception as e:  # show the failure in the widget, never lose it
            self.results, self.text = None, f"error: {e}"
        show_text(self.out, self.text)
        if self.results is not None:
            show_figure(self.out, syncbn_plots.experiment(self.results), dpi=72)
