"""Figures for the parameter-server lesson (each returns a Figure and runs nothing): the
architecture, idle time, loss, staleness, traffic."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from syncedu.ps.config import shard_ranges
from syncedu.ui.plots import finish_figure

# Li et al., OSDI 2014 (FACTS.md): 800 workers + 200 servers, idle share vs bounded delay.
OSDI_IDLE = {0: 0.50, 16: 0.017}


def architecture(workers: int = 4, servers: int = 2, numel: int | None = None):
    """Servers on top (each with its flat range), workers below, push/pull arrows."""
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    width = max(workers, servers)
    server_x = [(i + 0.5) * width / servers for i in range(servers)]
    for s, x in enumerate(server_x):
        ax.add_patch(Rectangle((x - 0.4, 2.2), 0.8, 0.6, color="#f4a261"))
        text = f"server {s}\nrank {workers + s}"
        if numel:
            text += "\nparams [{}:{})".format(*shard_ranges(numel, servers)[s])
        ax.text(x, 2.5, text, ha="center", va="center", fontsize=8)
    for w, x in enumerate((i + 0.5) * width / workers for i in range(workers)):
        ax.add_patch(Rectangle((x - 0.4, 0.0), 0.8, 0.6, color="#8ecae6"))
        ax.text(x, 0.3, f"worker {w}\nrank {w}", ha="center", va="center", fontsize=8)
        for sx in server_x:
            ax.add_patch(FancyArrowPatch((x - 0.08, 0.62), (sx - 0.08, 2.18), arrowstyle="->",
                                         color="#e76f51", mutation_scale=8, lw=0.8))
            ax.add_patch(FancyArrowPatch((sx + 0.08, 2.18), (x + 0.08, 0.62), arrowstyle="->",
                                         color="#2a9d8f", mutation_scale=8, lw=0.8))
    ax.text(width + 0.05, 1.6, "push: gradient range", color="#e76f51", fontsize=8)
    ax.text(width + 0.05, 1.2, "pull: parameter range", color="#2a9d8f", fontsize=8)
    ax.set(xlim=(-0.1, width + 1.6), ylim=(-0.2, 3.0))
    ax.axis("off")
    ax.set_title(f"{workers} workers, {servers} servers: each server owns one range")
    return fig


def idle_and_loss_vs_tau(taus, idle, final_loss, seconds):
    """Left: mean worker idle share vs tau, with the OSDI 2014 points. Right: final loss, time."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.3))
    labels = [str(t) for t in taus]
    a.plot(labels, idle, "o-", label="ours (simulated)")
    pub = [(labels.index(str(t)), v) for t, v in OSDI_IDLE.items() if str(t) in labels]
    a.plot([p[0] for p in pub], [p[1] for p in pub], "s", color="#e76f51",
           label="Li et al. OSDI 2014 (1000 machines)")
    a.set(xlabel="staleness bound tau", ylabel="worker idle share")
    a.legend(fontsize=8)
    b.plot(labels, final_loss, "o-", label="loss after all pushes")
    b.set(xlabel="staleness bound tau", ylabel="final loss (whole data set)")
    c = b.twinx()
    c.plot(labels, seconds, "s--", color="#888888", label="run time")
    c.set_ylabel("logical seconds")
    return finish_figure(fig)


def loss_vs_time(histories: dict):
    """Running-mean minibatch loss of each run against (logical) time."""
    fig, ax = plt.subplots(figsize=(6.5, 3.3))
    for label, h in histories.items():
        ax.plot(*h.loss_vs_time(), label=label)
    ax.set(xlabel="seconds (logical on simulated ranks)", ylabel="minibatch loss (running mean)")
    return finish_figure(fig, legend_on=ax)


def run_panels(h, title: str = ""):
    """One run at a glance: loss vs time, idle share per worker, staleness histogram."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(11, 3.0))
    a.plot(*h.loss_vs_time())
    a.set(xlabel="seconds", ylabel="loss (running mean)")
    b.bar(range(len(h.idle_fraction)), h.idle_fraction, color="#8ecae6")
    b.set(ylim=(0, 1), xlabel="worker", ylabel="idle share")
    hist = h.staleness_histogram()
    c.bar(list(hist), list(hist.values()), color="#f4a261")
    c.set(xlabel="staleness (steps)", ylabel="gradients")
    return finish_figure(fig, title, fontsize=10)


def traffic(rows: dict):
    """Bars of bytes per step: `rows` maps a label to bytes received by the busiest rank."""
    fig, ax = plt.subplots(figsize=(6.5, 3.0))
    labels = list(rows)
    ax.barh(labels, [rows[k] / 1e3 for k in labels], color="#2a9d8f")
    ax.set_xlabel("kB received per step by the busiest rank")
    ax.invert_yaxis()
    return finish_figure(fig)
