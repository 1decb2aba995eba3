"""Figures every lesson shares: a `Ledger` as bars, and the colours of a step's phases
(the same in every lesson's timelines)."""

from __future__ import annotations

import matplotlib.pyplot as plt

COLORS = {"forward": "#4c72b0", "backward": "#55a868", "compute": "#4c72b0",
          "comm": "#dd8452", "step": "#8172b2", "wait": "#c44e52"}


def ledger_bars(ledger, title: str = "bytes sent per rank"):
    """Stacked bars: one bar per rank, one colour per op. Returns the Figure."""
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * ledger.world_size + 2), 3))
    ranks = list(range(ledger.world_size))
    bottom = [0] * ledger.world_size
    for name, op in ledger.ops.items():
        if not any(op.sent):
            continue
        ax.bar(ranks, op.sent, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, op.sent)]
    ax.set(xlabel="rank", ylabel="bytes sent", title=title,
           xticks=ranks if len(ranks) <= 16 else ranks[:: max(1, len(ranks) // 16)])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    return finish_figure(fig)


def finish_figure(fig, title: str = "", *, legend_on=None, rect=None, **title_style):
    """Every figure helper's last step: a small legend on the axes `legend_on` (if given),
    `fig` under `title` (if any, with `title_style`, e.g. fontsize), laid out tight (inside
    `rect`, figure fractions, if given) so that labels do not overlap; returns `fig`."""
    if legend_on is not None:
        legend_on.legend(fontsize=8)
    if title:
        fig.suptitle(title, **title_style)
    fig.tight_layout(rect=rect)
    return fig
