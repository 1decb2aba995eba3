"""Lesson 09's interactive what-ifs: sync frequency, async on slow links, the decision helper.

- `SyncExplorer`: H (steps between parameter averages) and a network preset ->
  local SGD on simulated ranks; time to a target loss, bytes, final loss.
- `AsyncExplorer`: one-way latency and a staleness bound -> the bounded-staleness
  parameter server of lesson 04 beside the synchronous one; time to target, accuracy.
- `HelperExplorer`: model size, compute per step, network, N -> `scaling.recommend`.

Every run is simulated (logical time), so a moved control answers in seconds.
"""

from __future__ import annotations

import ipywidgets as w

from syncedu import ps
from syncedu.comm.network import PRESETS, Network
from syncedu.tuning import experiments as tuning
from syncedu.tuning import scaling
from syncedu.tuning.diloco import DiLoCoConfig
from syncedu.ui.widgets import Dashboard, show_text

_STYLE = {"description_width": "initial"}


def _slider(cls, description, **kw):
    return cls(description=description, continuous_update=False, style=_STYLE, **kw)


class _Explorer(Dashboard):
    def _build(self, controls) -> None:
        self.out, self.text = w.Output(), ""
        for c in controls:
            c.observe(lambda change: self.update(), names="value")
        self.widget = w.VBox([w.HBox(controls), self.out])
        self.update()

    def update(self) -> None:
        try:
            self.text = self.run()
        except Exception as e:  # show the failure in the widget, never lose it
            self.text = f"error: {e}"
        show_text(self.out, self.text)


class SyncExplorer(_Explorer):
    """Local SGD (AdamW inside) on `workers` simulated ranks; `.text` holds the last summary."""

    def __init__(self, workers: int = 4, steps: int = 48, global_batch: int = 128,
                 target: float = 0.6, compute_seconds: float = 0.02):
        self.kw = dict(steps=steps, global_batch=global_batch, compute_seconds=compute_seconds)
        self.workers, self.target = workers, target
        self.h = w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64], value=16,
                                   description="H (sync every)", continuous_update=False,
                                   style=_STYLE)
        self.network = w.Dropdown(options=list(PRESETS), value="wan", description="network")
        self._build([self.h, self.network])

    def run(self) -> str:
        cfg = DiLoCoConfig(inner_steps=self.h.value, inner_lr=3e-3, weight_decay=0.0)
        r = tuning.run_diloco("local", self.workers, config=cfg,
                              network=Network.preset(self.network.value), **self.kw)
        return (f"H={self.h.value} on {self.network.value}: time to loss {self.target}: "
                f"{r.time_to(self.target):.2f} logical s; total {r.seconds:.2f} s; "
                f"{r.bytes_sent / 1e6:.2f} MB sent per rank; final loss {r.final_loss:.3f}")


class AsyncExplorer(_Explorer):
    """Sync vs bounded-staleness parameter server as the link's latency grows."""

    def __init__(self, workers: int = 4, steps: int = 40, global_batch: int = 128,
                 target: float = 1.6):
        self.workers, self.steps, self.global_batch, self.target = \
            workers, steps, global_batch, target
        self.latency = _slider(w.FloatLogSlider, "one-way latency (s)", value=0.04, base=10,
                               min=-5, max=-0.5, step=0.25)
        self.tau = _slider(w.IntSlider, "staleness bound tau", value=4, min=0, max=16)
        self._build([self.latency, self.tau])

    def _run(self, mode: str, tau: int):
        net = Network(latency=self.latency.value, bandwidth=125e6, name="custom wan")
        return ps.run(mode, self.workers, staleness=tau, steps=self.steps,
                            global_batch=self.global_batch, lr=0.3, network=net,
                            simulate=True)

    def run(self) -> str:
        lines = []
        for mode, tau in (("sync", 0), ("ssp", self.tau.value)):
            h = self._run(mode, tau)
            i = tuning.steps_to(h.loss, self.target)
            when = f"{h.seconds * i / len(h.loss):.2f}" if i else "never"
            lines.append(f"{mode:<4} tau={tau:<2} {h.seconds:7.2f} logical s, to loss "
                         f"{self.target}: ~{when} s, accuracy {h.accuracy:.3f}")
        return "\n".join(lines)


class HelperExplorer(_Explorer):
    """`scaling.recommend` for a model, a step time, a network preset and N."""

    def __init__(self):
        self.mb = _slider(w.FloatLogSlider, "model (MB)", value=100, base=10, min=0, max=3.5)
        self.ms = _slider(w.FloatLogSlider, "compute (ms/step)", value=100, base=10, min=0,
                          max=3.5)
        self.network = w.Dropdown(options=list(PRESETS), value="ethernet_10g",
                                  description="network")
        self.n = w.SelectionSlider(options=[2, 8, 32, 128, 512, 1024], value=32,
                                   description="N", continuous_update=False)
        self._build([self.mb, self.ms, self.network, self.n])

    def run(self) -> str:
        options = scaling.recommend(self.mb.value * 1e6, self.ms.value / 1e3,
                                           self.n.value, Network.preset(self.network.value))
        return "\n".join(o.line() for o in options)
