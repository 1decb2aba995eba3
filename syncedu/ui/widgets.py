"""ipywidgets dashboards that re-run real or simulated ranks when a control moves: `Explorer`
is the base of the topics' own and of lesson 00's two."""

from __future__ import annotations

import base64
import io

import ipywidgets as w
import matplotlib.pyplot as plt

from syncedu.comm import launch, sim
from syncedu.comm.network import PRESETS
from syncedu.comm.runs import check_choice


def show_text(out: w.Output, text: str) -> None:
    """Replace what `out` shows with `text`: the widget's state set directly, not printed
    inside `with out:`, so nothing leaks into the cell's output without a browser (nbval)."""
    out.outputs = ({"output_type": "stream", "name": "stdout", "text": text + "\n"},)


def figure_png(fig, dpi: int = 80) -> bytes:
    """The figure as PNG bytes (for an `Image` widget); closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def show_figure(out: w.Output, fig, dpi: int = 80) -> None:
    """Append the figure to what `out` shows (state set directly, as in `show_text`)."""
    png = base64.b64encode(figure_png(fig, dpi)).decode()
    out.outputs += ({"output_type": "display_data", "metadata": {},
                     "data": {"image/png": png, "text/plain": "<figure>"}},)


class Dashboard:
    """Base of every dashboard here: a notebook shows its `.widget`."""

    widget: w.Widget

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


class Explorer(Dashboard):
    """Controls -> `compute(**values)` -> (text, figure[, result]), re-run on every change;
    `.text` and `.result` hold the last update, so a cell can set a control and assert."""

    def __init__(self, controls: dict, compute, image: bool = True):
        self.controls, self.compute = controls, compute
        self.out, self.image = w.Output(), w.Image(format="png")
        self.text, self.result, self._quiet = "", None, False
        for c in controls.values():
            c.observe(lambda change: None if self._quiet else self.update(), names="value")
        self.widget = w.VBox([w.HBox(list(controls.values())[:3]),
                              w.HBox(list(controls.values())[3:]), self.out,
                              *([self.image] if image else [])])
        self.update()

    def values(self) -> dict:
        """The controls' current values by name (what `compute` is called with)."""
        return {k: c.value for k, c in self.controls.items()}

    def set(self, **values) -> None:
        """Move several controls at once (None: leave it as it is) and update once."""
        self._quiet = True
        try:
            for name, value in values.items():
                if value is not None:
                    self.controls[name].value = value
        finally:
            self._quiet = False
        self.update()

    def update(self) -> None:
        """Recompute from the controls and redraw; an error is shown in the widget, not lost."""
        try:
            text, fig, *rest = self.compute(**self.values())
            if fig is not None:
                self.image.value = figure_png(fig)
            self.text, self.result = text, (rest[0] if rest else None)
        except Exception as e:  # show the failure in the widget, never lose it
            self.text, self.result = f"error: {e}", None
        show_text(self.out, self.text)


class WorldSizeExplorer(Explorer):
    """A world-size slider that re-runs `fn(comm)` on warm real ranks; shows `describe(res)`.
    `pools`: {world size: `launch.Pool`} to reuse (others are started and `close()`d here)."""

    def __init__(self, fn, describe, *, value: int = 2, max_world_size: int = 4,
                 pools: dict | None = None):
        if not 1 <= value <= max_world_size:
            raise ValueError(f"value={value} must be in 1..max_world_size={max_world_size}")
        self.pools, self._own = dict(pools or {}), []
        self.slider = w.IntSlider(value=value, min=1, max=max_world_size,
                                  description="world size", continuous_update=False)
        def compute(world_size):
            if world_size not in self.pools:
                self.pools[world_size] = launch.Pool(world_size, output="quiet")
                self._own.append(self.pools[world_size])
            res = self.pools[world_size].run(fn)
            return describe(res), None, res
        super().__init__({"world_size": self.slider}, compute, image=False)

    def close(self) -> None:
        """Close the pools this explorer started, then the widget."""
        for pool in self._own:
            pool.close()
        self.widget.close()


class NetworkExplorer(Explorer):
    """A `Network` preset menu and a rank-count slider: `describe(res, network)` of `sim.run`."""

    def __init__(self, fn, describe, *, preset: str = "ethernet_10g", world_size: int = 64,
                 world_sizes=(2, 4, 8, 16, 32, 64, 128, 256)):
        check_choice("preset", preset, sorted(PRESETS))
        if world_size not in world_sizes:
            raise ValueError(f"world_size={world_size} must be one of {list(world_sizes)}")
        self.menu = w.Dropdown(options=list(PRESETS), value=preset, description="network")
        self.slider = w.SelectionSlider(options=list(world_sizes), value=world_size,
                                        description="ranks", continuous_update=False)
        def compute(network, ranks):
            res = sim.run(fn, ranks, network=PRESETS[network])
            return describe(res, PRESETS[network]), None, res
        super().__init__({"network": self.menu, "ranks": self.slider}, compute, image=False)
