"""Widget for notebooks/05_gradient_accumulation: step time vs K on a network you pick,
with one allreduce per step (`no_sync`) or one per micro-batch (dp/timeline.py)."""

from __future__ import annotations

import ipywidgets as w

from syncedu.comm.network import PRESETS, Network
from syncedu.dp import plots as dplots
from syncedu.dp import timeline
from syncedu.ui.widgets import Explorer

KS = [1, 2, 4, 8, 16, 32]


def _accumulation_view(network: str, grad_mb: float, micro_ms: float, world_size: int):
    net: Network = PRESETS[network]
    nbytes = int(grad_mb * 2**20)
    right, wrong = ([timeline.accumulation_time(k, world_size, net, nbytes, sync_every=every,
                                                micro_compute=micro_ms / 1e3) / k * 1e3
                     for k in KS] for every in (False, True))
    text = (f"per micro-batch: K=1 {right[0]:.1f} ms; K={KS[-1]} with no_sync "
            f"{right[-1]:.1f} ms, syncing every micro-batch {wrong[-1]:.1f} ms")
    fig = dplots.curves(KS, {"no_sync (one sync per step)": right,
                             "sync every micro-batch / partial no_sync": wrong},
                        xlabel="micro-batches per optimizer step (K)",
                        ylabel="ms per micro-batch", logx=True)
    return text, fig, {"right": right, "wrong": wrong}


def accumulation_explorer() -> Explorer:
    """Network preset, gradient size, compute per micro-batch, ranks."""
    controls = {
        "network": w.Dropdown(options=sorted(PRESETS), value="ethernet_10g",
                              description="network"),
        "grad_mb": w.FloatLogSlider(value=100, base=10, min=0, max=3, step=0.25,
                                    description="grads MB", continuous_update=False),
        "micro_ms": w.FloatLogSlider(value=50, base=10, min=0, max=3, step=0.25,
                                     description="ms/micro", continuous_update=False),
        "world_size": w.IntSlider(value=16, min=2, max=256, description="ranks",
                                  continuous_update=False),
    }
    return Explorer(controls, _accumulation_view)
