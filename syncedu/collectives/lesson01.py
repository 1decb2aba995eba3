"""Notebook 01's helpers: who holds what before and after each collective, and a widget.

Every rank starts with 2^rank in each of N slots, so a summed slot, read as a bitmask,
says whose inputs it holds. A slot the API leaves undefined (a non-root rank's buffer
after `reduce`) is reported as `UNDEFINED` (-1), drawn as "?", and never read.
"""

from __future__ import annotations

import ipywidgets as w
import torch

from syncedu.collectives import plots
from syncedu.comm import sim
from syncedu.comm.runs import check_choice
from syncedu.ui.widgets import Explorer

OPS = ("send_recv", "broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather")
UNDEFINED = -1  # a slot the collective's contract leaves unspecified


def _masks(comm, op: str):
    """Worker: (before, after) contribution bitmasks of this rank's N slots."""
    n, r = comm.world_size, comm.rank
    x = torch.full((n,), float(2 ** r), dtype=torch.float64, device=comm.device)
    if op == "all_gather":
        x = torch.zeros(n, dtype=torch.float64, device=comm.device)
        x[r] = 2 ** r
    before = x.clone()
    if op == "send_recv" and n > 1 and r < 2:
        comm.send(x, 1) if r == 0 else comm.recv(x, 0)
    elif op == "broadcast":
        comm.broadcast(x, src=0)
    elif op == "reduce":
        comm.reduce(x, dst=0)
        if r != 0:  # torch.distributed.reduce: only dst receives the result; the rest is
            x = torch.full_like(x, UNDEFINED)  # unspecified (Gloo may leave partial sums)
    elif op == "all_reduce":
        comm.all_reduce(x)
    elif op == "reduce_scatter":
        out = torch.zeros(1, dtype=torch.float64, device=comm.device)
        comm.reduce_scatter(out, list(x.clone().chunk(n)))
        x = torch.zeros(n, dtype=torch.float64, device=comm.device)
        x[r] = out[0]
    elif op == "all_gather":
        parts = list(torch.zeros(n, dtype=torch.float64, device=comm.device).chunk(n))
        comm.all_gather(parts, before[r:r + 1].clone())
        x = torch.cat(parts)
    return [int(v) for v in before.tolist()], [int(v) for v in x.tolist()]


def holdings_of(op: str, run) -> tuple[list, list]:
    """Run collective `op` with `run(worker, args=...)` (e.g. `pool.run`); (before, after)."""
    check_choice("op", op, OPS)
    res = run(_masks, args=(op,))
    return [b for b, _ in res], [a for _, a in res]


class CollectiveExplorer(Explorer):
    """Pick a collective and a world size; see who holds what (simulated ranks, instant).
    `.before`, `.after` are the last bitmasks; `.image` shows the picture."""

    def __init__(self, op: str = "all_reduce", world_size: int = 4, max_world_size: int = 8):
        self.op = w.Dropdown(options=OPS, value=op, description="collective")
        self.n = w.IntSlider(value=world_size, min=2, max=max_world_size, description="ranks",
                             continuous_update=False)
        super().__init__({"op": self.op, "n": self.n}, self._draw)

    def _draw(self, op: str, n: int):
        self.before, self.after = holdings_of(op, lambda fn, args: sim.run(fn, n, args=args))
        return "", plots.holdings(self.before, self.after, f"{op}, {n} ranks")
