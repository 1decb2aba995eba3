"""Helpers for notebooks/08_horovod_vs_ddp: skip cleanly without Horovod, draw two timelines."""

from __future__ import annotations

import inspect
import textwrap

import matplotlib.pyplot as plt

from syncedu.horovod import launch as horovod_launch
from syncedu.ui.plots import COLORS, finish_figure

PHASES = {"NEGOTIATE_ALLREDUCE": "#bbbbbb", "MEMCPY_IN_FUSION_BUFFER": "#8172b2",
          "GLOO_ALLREDUCE": COLORS["comm"], "MEMCPY_OUT_FUSION_BUFFER": "#55a868"}


def have_horovod() -> bool:
    """True if Horovod loads; else print the reason (recorded by `make setup`) and say False."""
    ok, why = horovod_launch.available()
    if not ok:
        print(f"skipped: {why}")
    return ok


def script(fn, call: str, leave: bool = False) -> str:
    """The source of `fn` (a function defined in a cell) plus a `__main__` that runs `call`;
    `leave`: then exits without the interpreter's teardown (as `leave()` in
    examples/ddp_program.py: a Gloo thread may still be freeing the last allreduce's tensors,
    and abort the rank)."""
    tail = ("    import os, sys\n    sys.stdout.flush(), sys.stderr.flush()\n"
            "    os._exit(0)  # no teardown: leave() in examples/ddp_program.py\n") if leave else ""
    return (textwrap.dedent(inspect.getsource(fn)) + "\n\nif __name__ == \"__main__\":\n"
            f"    {call}\n" + tail)


def timelines(rows: list, ddp_segments: list, *, title: str = ""):
    """Left: Horovod phases per tensor (rows `(tensor, phase, start, end)`); right: DDP's step."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.6))
    tensors = sorted({r[0] for r in rows})
    for tensor, phase, s, e in rows:
        left.barh(tensors.index(tensor), (e - s) * 1e3, left=s * 1e3, color=PHASES[phase],
                  height=0.7)
    left.set_yticks(range(len(tensors)), tensors, fontsize=7)
    left.set_title("Horovod timeline (rank 0), per tensor")
    left.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASES.values()],
                [p.lower().replace("_", " ") for p in PHASES], fontsize=7, loc="lower right")
    lanes = {"compute": 0, "step": 0, "comm": 1}
    for kind, s, e in ddp_segments:
        right.barh(lanes.get(kind, 0), (e - s) * 1e3, left=s * 1e3,
                   color=COLORS.get(kind, "grey"), height=0.7)
    right.set_yticks([0, 1], ["forward+backward, step", "bucket allreduce"], fontsize=8)
    right.set_title("DDP (counting comm hook), rank 0")
    for ax in (left, right):
        ax.set_xlabel("time (ms)")
        ax.invert_yaxis()
    return finish_figure(fig, title)
