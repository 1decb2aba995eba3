"""Figures for gradient compression: loss curves, bytes vs N, residuals, break-even maps."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap

from syncedu.ui.plots import finish_figure

COLORS = {"fp16": "#4c72b0", "topk": "#dd8452", "signsgd": "#55a868", "powersgd": "#c44e52",
          "fp32": "#8c8c8c", "onebit": "#8172b3"}


def _lines(series: dict, xlabel: str, ylabel: str, title: str, xs=None, log: bool = False,
           **style):
    """One line per `series` entry (label -> ys), at x = 1, 2, ... unless `xs` is given."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, ys in series.items():
        ax.plot(range(1, len(ys) + 1) if xs is None else xs, ys, label=label, **style)
    if log:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return finish_figure(fig, legend_on=ax)


def loss_curves(histories: dict, *, title: str = "training loss (global mean)"):
    """`histories`: label -> object with `.loss` (one value per step)."""
    return _lines({k: h.loss for k, h in histories.items()}, "step", "loss", title)


def bytes_vs_ranks(world_sizes, series: dict, *, title: str = "bytes each rank sends per step"):
    """`series`: label -> bytes per rank for each world size (log-log)."""
    return _lines(series, "ranks N", "bytes sent per rank", title, xs=world_sizes, log=True,
                  marker="o")


def residuals(norms: dict, *, title: str = "error-feedback residual per layer (rank 0)"):
    """`norms`: layer name -> residual norm after each step (the 'bank balance')."""
    return _lines(norms, "step", "||residual||", title)


def side_by_side(histories: dict, sent: dict, *, title: str = ""):
    """Loss curves (left) and bytes per step (right) of the same runs."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    for label, h in histories.items():
        a.plot(range(1, len(h.loss) + 1), h.loss, label=label)
    a.set(xlabel="step", ylabel="loss")
    a.legend(fontsize=8)
    b.bar(list(sent), list(sent.values()), color=["#8c8c8c", "#dd8452"][:len(sent)])
    b.set(yscale="log", ylabel="bytes per rank per step")
    fig.suptitle(title)
    return finish_figure(fig)


def winner_maps(maps: dict, world_sizes, bandwidths_gbit, names, *, title: str = ""):
    """One panel per entry of `maps` (label -> grid of winner names, rows = world sizes)."""
    cmap = ListedColormap([COLORS[n] for n in names])
    fig, axes = plt.subplots(1, len(maps), figsize=(4.6 * len(maps), 3.6), squeeze=False)
    for ax, (label, grid) in zip(axes[0], maps.items()):
        codes = [[names.index(c) for c in row] for row in grid]
        ax.imshow(codes, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto",
                  origin="lower")
        ax.set_xticks(range(len(bandwidths_gbit)), [f"{b:g}" for b in bandwidths_gbit],
                      fontsize=7, rotation=90)
        ax.set_yticks(range(len(world_sizes)), [str(n) for n in world_sizes], fontsize=7)
        ax.set(xlabel="bandwidth (Gbit/s)", ylabel="ranks N")
        ax.set_title(label, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[n]) for n in names]
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8)
    fig.suptitle(title)
    return finish_figure(fig, rect=(0, 0.08, 1, 1))
