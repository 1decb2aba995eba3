"""Figures and the widget for notebooks/10_sharded_data_parallel: model state per rank
(`memory_bars`), one rank's bytes through a step (`memory_trace`), `zero_explorer()`."""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from syncedu.comm.network import PRESETS
from syncedu.dp import timeline
from syncedu.train import memory
from syncedu.ui.widgets import Explorer

COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#dd8452"}


def memory_bars(rows: dict, *, unit: float = 1.0, unit_name: str = "bytes", title: str = ""):
    """Stacked bars: `rows` maps a label (e.g. "ZeRO-2") to {"params", "grads", "optimizer"}."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels, bottom = list(rows), [0.0] * len(rows)
    for kind in memory.KINDS:
        vals = [rows[k][kind] / unit for k in labels]
        ax.bar(labels, vals, bottom=bottom, color=COLORS[kind], label=kind)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel=f"per rank ({unit_name})", title=title or "model state per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_trace(traces: dict, *, title: str = "model state held during one step"):
    """Lines: `traces` maps a label to `MemoryMeter.samples` (where, params, grads, optim)."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for label, samples in traces.items():
        ax.plot([p + g + o for _, p, g, o in samples], marker=".", label=label)
    ax.set(xlabel="sample (after each gather / reduction / step)", ylabel="bytes held", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


FLOPS = 100e12  # the explorer's device: 100 TFLOP/s (a round figure, not a datasheet's)


def _view(params_b: float, world_size: int, stage: int, network: str, layers: int, tokens: int):
    # Forward compute from the inputs: 2 Psi FLOPs per token (Kaplan et al. 2020, sec. 2.1).
    psi, net = params_b * 1e9, PRESETS[network]
    fwd, mem = 2 * psi * tokens / FLOPS, memory.bytes_per_rank(psi, world_size, stage)
    times = {m: timeline.zero_step_time(m, psi, layers, world_size, net, fwd, overlap=True)
             for m in timeline.ZERO_MODES}
    hide = timeline.gather_hides(psi, layers, world_size, net, fwd)
    working = memory.working_set_bytes(psi, layers, stage) / memory.GB
    gb = {k: f"{v / memory.GB:.2f}" for k, v in mem.items()}
    text = (f"ZeRO-{stage} on {world_size} ranks: {gb['total']} GB of model state per rank "
            f"(params {gb['params']}, grads {gb['grads']}, optimizer {gb['optimizer']}) + "
            f"{working:.2f} GB working set, activations not counted\n"
            f"step (compute {3 * fwd:.3f} s): DP as DDP, allreduce under the backward "
            f"{times['dp']:.3f} s; ZeRO-1 {times['zero1']:.3f} s, ZeRO-2 {times['zero2']:.3f} s "
            f"(reduce-scatter under the backward); ZeRO-3 {times['zero3']:.3f} s without "
            f"prefetch, {times['zero3_prefetch']:.3f} s with it (the all-gather "
            f"{'hides' if hide else 'does not hide'} behind a layer's compute)")
    rows = {f"ZeRO-{s}" if s else "DP": memory.bytes_per_rank(psi, world_size, s)
            for s in memory.STAGES}
    fig = memory_bars(rows, unit=memory.GB, unit_name="GB",
                      title=f"{params_b:g}B parameters, mixed-precision Adam, N={world_size}")
    return text, fig, {"memory": mem, "times": times, "hides": hide, "working_gb": working}


def zero_explorer() -> Explorer:
    """Model size (billions), ranks, stage, network, layers, tokens per rank per step (on a
    `FLOPS` device: the forward takes 2 Psi tokens / FLOPS)."""
    slow = {"continuous_update": False}  # sliders recompute when released
    controls = {
        "params_b": w.FloatLogSlider(value=7.5, base=10, min=-1, max=3, step=0.125,
                                     description="params (B)", **slow),
        "world_size": w.IntSlider(value=64, min=1, max=1024, description="ranks", **slow),
        "stage": w.Dropdown(options=[0, 1, 2, 3], value=3, description="stage"),
        "network": w.Dropdown(options=sorted(PRESETS), value="infiniband_ndr",
                              description="network"),
        "layers": w.IntSlider(value=32, min=1, max=128, description="layers", **slow),
        "tokens": w.IntSlider(value=4096, min=256, max=65536, step=256, description="tokens/rank",
                              **slow),
    }
    return Explorer(controls, _view)
