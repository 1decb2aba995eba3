"""Notebook helpers for notebooks/11_when_ranks_fail: tables and the goodput figure."""

from __future__ import annotations

import matplotlib.pyplot as plt

from syncedu.ui.plots import finish_figure

from . import goodput

WORLD_SIZES = (256, 1024, 4096, 16_384, 65_536, 131_072)


def ft_table(quorums, log) -> str:
    """One line per iteration: the lighthouse's quorum and what the leader did with the step."""
    done = {t: ("DISCARDED", "committed")[ok] for t, _, ok in log}
    return "\n".join(["iter  quorum     step"] + [f"{t:>4}  {str(members):<9}  {done.get(t, '-')}"
                                                 for t, members in enumerate(quorums)])


def goodput_rows(job: goodput.Job, sizes=WORLD_SIZES) -> list[tuple]:
    """(gpus, job MTBF h, Young interval min, restart steps/h, live steps/h) per world size."""
    jobs = [job.with_gpus(n) for n in sizes]
    return [(j.gpus, j.mtbf / 3600, goodput.young_interval(j.checkpoint, j.mtbf) / 60,
             goodput.goodput(j, "restart"), goodput.goodput(j, "live")) for j in jobs]


def plot_goodput(job: goodput.Job, sizes=WORLD_SIZES):
    """Goodput (useful steps per hour) against world size, both ways of surviving."""
    rows = goodput_rows(job, sizes)
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.plot([r[0] for r in rows], [r[3] for r in rows], "o-", label="checkpoint-restart (Young)")
    ax.plot([r[0] for r in rows], [r[4] for r in rows], "s-", label="live per-step recovery")
    ax.axhline(3600 / job.step, color="grey", lw=0.8, ls=":", label="no failures")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="GPUs", ylabel="useful steps per hour")
    return finish_figure(fig, legend_on=ax)
