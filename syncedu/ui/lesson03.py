"""Widgets for notebooks/03_data_parallel: what overlap and bucket size buy, on a network you pick.

`Explorer` is a small generic dashboard: controls, a function of their values
returning `(text, figure)`, and the two shown under the controls (the figure as
a PNG in an `Image` widget, the text through `show_text`, so nothing leaks into
a cell's output when no browser is attached). `bucket_explorer()` builds the
one for this lesson on the alpha-beta timeline model (lab/timeline.py).

Used in: notebooks/03_data_parallel (and lesson05 reuses `Explorer`).
"""

from __future__ import annotations

import io

import ipywidgets as w
import matplotlib.pyplot as plt

from syncedu.comm.network import Network
from syncedu.lab import timeline
from syncedu.ui.plots import dp as dplots
from syncedu.ui.widgets import show_text

MB = 2**20


class Explorer:
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
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=80)
            plt.close(fig)
            self.image.value = buf.getvalue()
            self.text, self.result = text, (rest[0] if rest else None)
        except Exception as e:  # show the failure in the widget, never lose it
            self.text, self.result = f"error: {e}", None
        show_text(self.out, self.text)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def _bucket_view(gbit: float, bucket_mb: float, world_size: int, overlap: bool,
                 grad_mb: float = 100.0, backward_ms: float = 120.0, forward_ms: float = 60.0,
                 latency_us: float = 20.0):
    net = Network(latency=latency_us * 1e-6, bandwidth=gbit * 1e9 / 8)
    buckets = timeline.bucket_sizes(int(grad_mb * MB), int(bucket_mb * MB))
    s = timeline.schedule(buckets, world_size, net, forward=forward_ms / 1e3,
                          backward=backward_ms / 1e3, overlap=overlap)
    text = (f"{len(buckets)} bucket(s), step {s.seconds * 1e3:.1f} ms = compute "
            f"{s.compute * 1e3:.1f} ms + exposed communication {s.exposed_comm * 1e3:.1f} ms "
            f"(allreduce busy {s.comm * 1e3:.1f} ms)")
    fig = dplots.timeline({f"{world_size} ranks, {gbit:g} Gbit/s": s.segments},
                          title="one step on the model")
    return text, fig, s


def bucket_explorer(**fixed) -> Explorer:
    """Bandwidth, bucket size, world size and overlap on/off for a ResNet-50-like step."""
    controls = {
        "gbit": w.FloatLogSlider(value=10, base=10, min=0, max=2.5, step=0.1,
                                 description="Gbit/s", continuous_update=False),
        "bucket_mb": w.FloatLogSlider(value=25, base=2, min=-2, max=7, step=1,
                                      description="bucket MB", continuous_update=False),
        "world_size": w.IntSlider(value=8, min=2, max=256, description="ranks",
                                  continuous_update=False),
        "overlap": w.Checkbox(value=True, description="overlap with backward"),
    }
    return Explorer(controls, lambda **v: _bucket_view(**v, **fixed))
