"""How fast the simulator runs large worlds: ranks x operation -> wall seconds.

One `sim.run` per world size and operation on an ethernet_10g network: "ring" (the
from-scratch `collectives.ALGORITHMS["ring"]`), the built-ins, and "p2p" (20 rounds of
isend/irecv/wait of 4 floats around the ring: the simulator's own cost per message).
Events are the messages the model charges. Above 1024 ranks only the barrier and p2p run
(the ring's tensor work grows as N^2).
"""

from __future__ import annotations

import math
import time

import torch

from benchmarks import table as text_table
from syncedu.collectives import ALGORITHMS
from syncedu.comm import sim
from syncedu.comm.network import Network

OPS = ("ring", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "p2p")
P2P_STEPS = 20


def _worker(comm, op: str, numel: int) -> None:
    n, r = comm.world_size, comm.rank
    if op == "ring":
        ALGORITHMS["ring"](comm, torch.ones(numel))
    elif op == "all_reduce":
        comm.all_reduce(torch.ones(numel))
    elif op == "broadcast":
        comm.broadcast(torch.ones(numel), 0)
    elif op == "all_gather":
        comm.all_gather([torch.empty(numel // n or 1) for _ in range(n)],
                        torch.ones(numel // n or 1))
    elif op == "reduce_scatter":
        comm.reduce_scatter(torch.empty(numel // n or 1),
                            [torch.ones(numel // n or 1) for _ in range(n)])
    elif op == "barrier":
        comm.barrier()
    else:
        out, got = torch.ones(4), torch.empty(4)
        for _ in range(P2P_STEPS):
            work = comm.irecv(got, (r - 1) % n)
            comm.isend(out, (r + 1) % n).wait()
            work.wait()


def events(op: str, n: int) -> int:
    """Messages the model charges for one call of `op` on `n` ranks."""
    if op in ("ring", "all_reduce"):
        return 2 * (n - 1) * n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * n
    if op == "broadcast":
        return n - 1
    if op == "barrier":
        return math.ceil(math.log2(n)) * n
    return P2P_STEPS * n


def measure(n: int, op: str, numel: int) -> dict:
    """One timed `sim.run` of `op` on `n` ranks: wall seconds, events/s, us per event."""
    net = Network.preset("ethernet_10g")
    t0, c0 = time.perf_counter(), time.process_time()
    sim.run(_worker, n, args=(op, numel), network=net, output="quiet")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ev = events(op, n)
    return dict(ranks=n, op=op, wall=wall, cpu=cpu, events=ev, rate=ev / wall,
                us=cpu / ev * 1e6)


def table(rows: list[dict]) -> str:
    """Wall and CPU seconds (they differ on a busy machine), events/s, CPU us per event."""
    return text_table(rows, [("ranks", "ranks", ">6"), ("operation", "op", "<15"),
                             ("wall s", "wall", ">8.2f"), ("cpu s", "cpu", ">8.2f"),
                             ("events", "events", ">10,"), ("events/s", "rate", ">10,.0f"),
                             ("cpu us/event", "us", ">13.1f")])


def add_arguments(parser) -> None:
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--numel", type=int, default=1000, help="floats per rank")


def main(args) -> int:
    rows = []
    for n in args.ranks:
        for op in args.ops:
            if n > 1024 and op not in ("barrier", "p2p"):
                continue
            rows.append(measure(n, op, args.numel))
            print(table(rows[-1:]).splitlines()[1], flush=True)
    print("\n" + table(rows))
    return 0
