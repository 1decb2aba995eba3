"""Lesson 09's interactive what-ifs, each re-run in logical time when a control moves."""

from __future__ import annotations

import ipywidgets as w

from syncedu import ps
from syncedu.comm.network import PRESETS, Network
from syncedu.tuning import experiments as tuning
from syncedu.tuning import scaling
from syncedu.tuning.diloco import DiLoCoConfig
from syncedu.ui.widgets import Explorer

_STYLE = {"description_width": "initial"}


def _slider(cls, description, **kw):
    return cls(description=description, continuous_update=False, style=_STYLE, **kw)


class SyncExplorer(Explorer):
    """Local SGD (AdamW inside) on `workers` simulated ranks; `.text` holds the last summary."""

    def __init__(self, workers: int = 4, steps: int = 48, global_batch: int = 128,
                 target: float = 0.6, compute_seconds: float = 0.02):
        self.kw = dict(steps=steps, global_batch=global_batch, compute_seconds=compute_seconds)
        self.workers, self.target = workers, target
        self.h = _slider(w.SelectionSlider, "H (sync every)", options=[1, 2, 4, 8, 16, 32, 64],
                         value=16)
        self.network = w.Dropdown(options=list(PRESETS), value="wan", description="network")
        super().__init__({"h": self.h, "network": self.network}, self.run, image=False)

    def run(self, h: int, network: str):
        """DiLoCo with H inner steps on `network`: time to the target loss and bytes sent."""
        cfg = DiLoCoConfig(inner_steps=h, inner_lr=3e-3, weight_decay=0.0)
        r = tuning.run_diloco("local", self.workers, config=cfg,
                              network=Network.preset(network), simulate=True, **self.kw)
        return (f"H={h} on {network}: time to loss {self.target}: "
                f"{r.time_to(self.target):.2f} logical s; total {r.seconds:.2f} s; "
                f"{r.bytes_sent / 1e6:.2f} MB sent per rank; final loss {r.final_loss:.3f}"), None


class AsyncExplorer(Explorer):
    """Lesson 04's sync vs bounded-staleness parameter server as the link's latency grows."""

    def __init__(self, workers: int = 4, steps: int = 40, global_batch: int = 128,
                 target: float = 1.6):
        self.workers, self.steps, self.global_batch, self.target = \
            workers, steps, global_batch, target
        self.latency = _slider(w.FloatLogSlider, "one-way latency (s)", value=0.04, base=10,
                               min=-5, max=-0.5, step=0.25)
        self.tau = _slider(w.IntSlider, "staleness bound tau", value=4, min=0, max=16)
        super().__init__({"latency": self.latency, "tau": self.tau}, self.run, image=False)

    def run(self, latency: float, tau: int):
        """Sync vs bounded staleness `tau` on a link of `latency` seconds: time to the target."""
        net = Network(latency=latency, bandwidth=125e6, name="custom wan")
        lines = []
        for mode, bound in (("sync", 0), ("ssp", tau)):
            h = ps.run(mode, self.workers, staleness=bound, steps=self.steps,
                       global_batch=self.global_batch, lr=0.3, network=net, simulate=True)
            i = tuning.steps_to(h.loss, self.target)
            when = f"{h.seconds * i / len(h.loss):.2f}" if i else "never"
            lines.append(f"{mode:<4} tau={bound:<2} {h.seconds:7.2f} logical s, to loss "
                         f"{self.target}: ~{when} s, accuracy {h.accuracy:.3f}")
        return "\n".join(lines), None


class HelperExplorer(Explorer):
    """`scaling.recommend` for a model, a step time, a network preset and N."""

    def __init__(self):
        self.mb = _slider(w.FloatLogSlider, "model (MB)", value=100, base=10, min=0, max=3.5)
        self.ms = _slider(w.FloatLogSlider, "compute (ms/step)", value=100, base=10, min=0, max=3.5)
        self.network = w.Dropdown(options=list(PRESETS), value="ethernet_10g",
                                  description="network")
        self.n = _slider(w.SelectionSlider, "N", options=[2, 8, 32, 128, 512, 1024], value=32)
        super().__init__({"mb": self.mb, "ms": self.ms, "network": self.network, "n": self.n},
                         self.run, image=False)

    def run(self, mb: float, ms: float, network: str, n: int):
        """`scaling.recommend` for a model of `mb` MB, `ms` ms of compute, N ranks, `network`."""
        options = scaling.recommend(mb * 1e6, ms / 1e3, n, Network.preset(network))
        return "\n".join(o.line() for o in options), None
