"""Figures for notebooks 01 and 02: who holds what, bytes per rank, time vs size, winners."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb

from syncedu.ui.plots import finish_figure

ALGO_COLORS = {"naive": "tab:red", "ring": "tab:blue", "ring_pipelined": "tab:cyan",
               "tree": "tab:green", "halving_doubling": "tab:purple",
               "recursive_doubling": "tab:pink", "hierarchical": "tab:orange",
               "builtin": "tab:gray"}


def _cell(mask: int, n: int) -> tuple[str, tuple]:
    """(label, colour) of a slot holding the bitmask `mask` of the ranks summed into it
    (exact in float64 up to 53 ranks); negative: contents the collective leaves undefined."""
    if mask <= 0:
        return ("?", (0.85, 0.85, 0.85)) if mask < 0 else ("", (1.0, 1.0, 1.0))
    ranks = [r for r in range(n) if mask >> r & 1]
    label = "Σ" if len(ranks) == n and n > 2 else "+".join(f"x{r}" for r in ranks)
    if len(ranks) == n and n > 1:
        return label, (0.25, 0.25, 0.3)
    rgb = np.mean([to_rgb(plt.get_cmap("tab10")(r % 10)) for r in ranks], axis=0)
    return label, (tuple(0.35 + 0.65 * rgb) if len(ranks) == 1 else tuple(rgb))


def _grid(ax, masks, n: int, title: str) -> None:
    masks = np.asarray(masks, dtype=np.int64)
    rows, cols = masks.shape
    for (r, c), m in np.ndenumerate(masks):
        label, color = _cell(int(m), n)
        ax.add_patch(plt.Rectangle((c, rows - 1 - r), 0.95, 0.9, color=color, ec="black", lw=0.6))
        dark = m > 0 and bin(m).count("1") > 1
        ax.text(c + 0.475, rows - 1 - r + 0.45, label, ha="center", va="center",
                fontsize=8 if cols <= 6 else 6, color="white" if dark else "black")
    ax.set(xlim=(0, cols), ylim=(0, rows), title=title)
    ax.set_yticks([rows - 1 - r + 0.45 for r in range(rows)], [f"rank {r}" for r in range(rows)])
    ax.set_xticks([c + 0.475 for c in range(cols)], [f"slot {c}" for c in range(cols)])
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)


def holdings(before, after, title: str = ""):
    """Two grids (rank x slot) of contribution bitmasks: before and after a collective."""
    n = np.asarray(before).shape[0]
    cols = max(np.asarray(before).shape[1], np.asarray(after).shape[1])
    fig, axes = plt.subplots(1, 2, figsize=(2.0 + 1.7 * cols, 0.55 * n + 1.2))
    _grid(axes[0], before, n, "before")
    _grid(axes[1], after, n, "after")
    fig.suptitle(title)
    return finish_figure(fig)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, legend: bool = True):
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return finish_figure(fig, legend_on=ax if legend else None)


def bytes_per_rank(sent: dict, formula: float | None = None, title: str = "bytes sent per rank"):
    """Grouped bars: {algorithm: [bytes per rank]}, with an optional horizontal formula line."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    n, width = len(next(iter(sent.values()))), 0.8 / len(sent)
    for i, (name, values) in enumerate(sent.items()):
        ax.bar(np.arange(n) + i * width, values, width, label=name, color=ALGO_COLORS.get(name))
    if formula is not None:
        ax.axhline(formula, color="black", ls="--", lw=1, label="2(N-1)/N · S")
    ax.set_xticks(np.arange(n) + 0.4 - width / 2, [str(r) for r in range(n)])
    return _finish(fig, ax, "rank", "bytes", title)


def time_vs_size(curves: dict, sizes, *, measured: dict | None = None, title: str = "",
                 marker: float | None = None):
    """Log-log time vs message size: {algorithm: [seconds per size]} (+ measured points)."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for name, ys in curves.items():
        ax.plot(sizes, ys, label=name, color=ALGO_COLORS.get(name))
    for name, (xs, ys) in (measured or {}).items():
        ax.plot(xs, ys, "o", label=f"{name} (measured)", color=ALGO_COLORS.get(name), ms=5)
    if marker is not None:
        ax.axvline(marker, color="black", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    return _finish(fig, ax, "message size S (bytes)", "seconds", title)


def time_vs_ranks(times: dict, world_sizes, title: str = ""):
    """Log-log lines: logical time against N, one line per algorithm ({name: [seconds]})."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, ts in times.items():
        ax.loglog(world_sizes, [t * 1e3 for t in ts], marker="o", label=name)
    ax.grid(True, which="both", alpha=0.3)
    return _finish(fig, ax, "ranks N", "simulated time (ms)", title)


def winners(best, sizes, world_sizes, title: str = ""):
    """Heat map: the fastest algorithm per (world size, message size); `best[i][j]` a name."""
    names = list(ALGO_COLORS)
    idx = np.array([[names.index(b) for b in row] for row in best])
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(world_sizes) + 1.6))
    cmap = plt.matplotlib.colors.ListedColormap([ALGO_COLORS[n] for n in names])
    ax.imshow(idx, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto")
    ax.set_xticks(range(len(sizes)), [size_label(s) for s in sizes], rotation=45, fontsize=7)
    ax.set_yticks(range(len(world_sizes)), [str(n) for n in world_sizes])
    used = sorted({b for row in best for b in row}, key=names.index)
    handles = [plt.Rectangle((0, 0), 1, 1, color=ALGO_COLORS[n]) for n in used]
    ax.legend(handles, used, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _finish(fig, ax, "message size", "ranks N", title, legend=False)


def size_label(nbytes: float) -> str:
    """`nbytes` in the largest binary unit it reaches: 1048576 -> "1 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"
