"""Figures for lesson 06 from `syncedu.syncbn.experiment` results: loss, accuracy, statistics."""

from __future__ import annotations

import matplotlib.pyplot as plt

from syncedu.ui.plots import finish_figure

COLORS = {"plain": "tab:red", "syncbn": "tab:blue", "single": "black"}
LABELS = {"plain": "plain BN per rank", "syncbn": "SyncBN", "single": "one process"}


def _smooth(values, window: int):
    """Mean of the last `window` values (fewer at the start)."""
    return [sum(values[max(0, i + 1 - window):i + 1]) / min(i + 1, window)
            for i in range(len(values))]


def experiment(results: dict, window: int = 20, layer: str | None = None):
    """Three panels: smoothed training loss, test accuracy per rank, running variance."""
    fig, (ax_loss, ax_acc, ax_var) = plt.subplots(1, 3, figsize=(13, 3.6))
    for mode, res in results.items():
        style = {"color": COLORS[mode], "label": LABELS[mode]}
        ax_loss.plot(_smooth(res.loss, window), ls="--" if mode == "single" else "-", **style)
    ax_loss.set(xlabel="step", ylabel=f"loss (mean of {window})", title="training loss")
    ax_loss.legend()
    _accuracy(ax_acc, results)
    _running_var(ax_var, results, layer)
    return finish_figure(fig)


def _accuracy(ax, results: dict) -> None:
    x = 0
    for mode, res in results.items():
        xs = list(range(x, x + len(res.accuracy)))
        ax.bar(xs, [100 * a for a in res.accuracy], color=COLORS[mode], label=LABELS[mode])
        x += len(res.accuracy) + 1
    low = min(min(r.accuracy) for r in results.values())
    ax.set_ylim(max(0.0, 100 * low - 5), 100)
    ax.set(ylabel="test accuracy (%)", title="eval mode, each rank's own running stats", xticks=[])


def _running_var(ax, results: dict, layer: str | None) -> None:
    layer = layer or list(next(iter(results.values())).running[0])[-1]
    for mode, res in results.items():
        for r, running in enumerate(res.running):
            var = running[layer][1]
            ax.plot(range(len(var)), var, "o" if mode != "single" else "x",
                    color=COLORS[mode], alpha=0.7, ms=5,
                    label=LABELS[mode] if r == 0 else None)
    ax.set(xlabel="channel", ylabel="running variance",
           title=f"running var of {layer}, one marker per rank")
    ax.legend(fontsize=8)


def stat_noise(noise: dict, world_size: int = 4, per_rank_batch: int = 2):
    """Error of one batch's statistics vs batch size (log-log), plain BN and SyncBN marked."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sizes = sorted(noise)
    ax.loglog(sizes, [noise[b][0] for b in sizes], "o-", label="mean error (in stds)")
    ax.loglog(sizes, [noise[b][1] for b in sizes], "s-", label="variance error (relative)")
    for b, what in ((per_rank_batch, "plain BN"), (world_size * per_rank_batch, "SyncBN")):
        if b in noise:
            ax.axvline(b, color="gray", ls=":")
            ax.annotate(what, (b, noise[b][1]), textcoords="offset points", xytext=(5, 8))
    ax.set(xlabel="images in the batch BatchNorm sees", ylabel="RMS error",
           title="how noisy are one batch's statistics?")
    ax.legend()
    return finish_figure(fig)

