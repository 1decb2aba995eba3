"""ipywidgets dashboards that re-run real or simulated ranks when a control moves.

Shared pieces: `show_text` / `show_figure` (fill an Output widget without
printing), `figure_png`, `Dashboard` (the display hook), `Explorer` (controls ->
text and figure).
"""

from __future__ import annotations

import base64
import io

import ipywidgets as w
import matplotlib.pyplot as plt

from syncedu.comm import launch


def show_text(out: w.Output, text: str) -> None:
    """Replace what `out` shows with `text`.

    Sets the widget's state directly instead of printing inside `with out:`, so
    nothing leaks into the cell's own output when no browser is attached (nbval).
    """
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


class PoolCache:
    """One warm `launch.Pool` per world size, started on first use, closed together."""

    def __init__(self, **pool_kwargs):
        self.pool_kwargs = pool_kwargs
        self._pools: dict[int, launch.Pool] = {}

    def get(self, world_size: int) -> launch.Pool:
        if world_size not in self._pools:
            self._pools[world_size] = launch.Pool(world_size, **self.pool_kwargs)
        return self._pools[world_size]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


class WorldSizeExplorer(Dashboard):
    """A world-size slider that re-runs `fn` on a warm pool and shows `describe(res)`.

    `fn(comm)` runs on every rank; `describe(res)` turns the `RunResult` into the
    text shown under the slider. `.result` is the last result, `.text` its text.
    """

    def __init__(self, fn, describe, *, value: int = 2, max_world_size: int = 4,
                 pools: PoolCache | None = None):
        if not 1 <= value <= max_world_size:
            raise ValueError(f"value={value} must be in 1..max_world_size={max_world_size}")
        self.fn, self.describe = fn, describe
        self.pools = pools or PoolCache(output="quiet")
        self.slider = w.IntSlider(value=value, min=1, max=max_world_size,
                                  description="world size", continuous_update=False)
        self.out = w.Output()
        self.result, self.text = None, ""
        self.slider.observe(lambda change: self.update(change["new"]), names="value")
        self.widget = w.VBox([self.slider, self.out])
        self.update(value)

    def update(self, world_size: int) -> None:
        try:
            self.result = self.pools.get(world_size).run(self.fn)
            self.text = self.describe(self.result)
        except Exception as e:  # show the failure in the widget, never lose it
            self.result, self.text = None, f"error: {e}"
        show_text(self.out, self.text)

    def close(self) -> None:
        self.pools.close()
        self.widget.close()


class NetworkExplorer(Dashboard):
    """A network preset menu and a rank-count slider driving simulated ranks.

    Runs `fn(comm)` with `syncedu.sim.run` on the chosen `Network` preset and
    shows `describe(res, network)`. `.result` / `.text` hold the last run.
    """

    def __init__(self, fn, describe, *, preset: str = "ethernet_10g", world_size: int = 64,
                 world_sizes=(2, 4, 8, 16, 32, 64, 128, 256)):
        from syncedu.comm import sim
        from syncedu.comm.network import PRESETS

        if preset not in PRESETS:
            raise ValueError(f"preset={preset!r} must be one of {sorted(PRESETS)}")
        if world_size not in world_sizes:
            raise ValueError(f"world_size={world_size} must be one of {list(world_sizes)}")
        self._sim, self._presets = sim, PRESETS
        self.fn, self.describe = fn, describe
        self.menu = w.Dropdown(options=list(PRESETS), value=preset, description="network")
        self.slider = w.SelectionSlider(options=list(world_sizes), value=world_size,
                                        description="ranks", continuous_update=False)
        self.out = w.Output()
        self.result, self.text = None, ""
        for control in (self.menu, self.slider):
            control.observe(lambda change: self.update(), names="value")
        self.widget = w.VBox([w.HBox([self.menu, self.slider]), self.out])
        self.update()

    def update(self) -> None:
        network = self._presets[self.menu.value]
        try:
            self.result = self._sim.run(self.fn, self.slider.value, network=network)
            self.text = self.describe(self.result, network)
        except Exception as e:
            self.result, self.text = None, f"error: {e}"
        show_text(self.out, self.text)


class Explorer(Dashboard):
    """Controls -> `compute(**values)` -> (text, figure), re-run on every change.

    `.text` and `.result` (whatever `compute` returned third, if anything) hold
    the last update, so a notebook cell can set a control and assert on them.
    """

    def __init__(self, controls: dict, compute):
        self.controls, self.compute = controls, compute
        self.out = w.Output()
        self.image = w.Image(format="png")
        self.text, self.result = "", None
        for c in controls.values():
            c.observe(lambda change: self.update(), names="value")
        self.widget = w.VBox([w.HBox(list(controls.values())[:3]),
                              w.HBox(list(controls.values())[3:]), self.out, self.image])
        self.update()

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def update(self) -> None:
        try:
            text, fig, *rest = self.compute(**self.values())
            self.image.value = figure_png(fig)
            self.text, self.result = text, (rest[0] if rest else None)
        except Exception as e:  # show the failure in the widget, never lose it
            self.text, self.result = f"error: {e}", None
        show_text(self.out, self.text)
