"""Figures for data parallelism and accumulation: timelines, curves, sampler orders."""

from __future__ import annotations

import matplotlib.pyplot as plt

from syncedu.ui.plots import COLORS, finish_figure


def timeline(rows: dict, *, title: str = "one step: compute vs communication"):
    """Gantt chart (ms): `rows` maps a row label to segments `(kind, start, end)` in seconds;
    "comm" goes on a lane below the rest, so overlap shows; a "compute" span is drawn only in
    a row that has no finer forward/backward segments."""
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * len(rows)))
    labels = []
    for i, (name, segs) in enumerate(rows.items()):
        fine = any(kind in ("forward", "backward") for kind, _, _ in segs)
        for kind, s, e in segs:
            if kind == "compute" and fine:
                continue
            lane = 2 * i + (1 if kind == "comm" else 0)
            ax.barh(lane, (e - s) * 1e3, left=s * 1e3, color=COLORS.get(kind, "grey"),
                    edgecolor="white", linewidth=0.5, height=0.8)
        labels += [f"{name}: compute", f"{name}: comm"]
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    kinds = {"forward": "forward", "backward": "backward", "wait": "waiting for gradients",
             "comm": "allreduce in flight", "step": "optimizer step"}
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    ax.legend(handles, list(kinds.values()), loc="lower right", fontsize=8)
    return finish_figure(fig)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str):
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return finish_figure(fig, legend_on=ax)


def curves(x, series: dict, *, xlabel: str, ylabel: str, title: str = "", logx: bool = False):
    """Line plot of several named series over the same `x`."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    return _finish(fig, ax, xlabel, ylabel, title)


def losses(histories: dict, *, title: str = "training loss", x_key=None):
    """Loss per optimizer step of several runs (`x_key(history)` gives the x values)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, h in histories.items():
        x = x_key(h) if x_key else range(1, len(h.loss) + 1)
        ax.plot(list(x), h.loss, label=name)
    return _finish(fig, ax, "samples seen" if x_key else "optimizer step", "loss", title)


def sampler_orders(orders: dict, *, show: int = 24):
    """Rank 0's first `show` sample ids per epoch, one panel per variant."""
    fig, axes = plt.subplots(1, len(orders), figsize=(4.5 * len(orders), 2.6), squeeze=False)
    for ax, (name, epochs) in zip(axes[0], orders.items()):
        grid = [list(e[:show]) for e in epochs]
        ax.imshow(grid, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(grid)), [f"epoch {i}" for i in range(len(grid))])
        ax.set_xlabel("position in rank 0's shard")
        ax.set_title(name)
    return finish_figure(fig)
