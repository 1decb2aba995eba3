"""How long it takes to get ranks running: cold `launch.run`, bare spawn, warm `Pool.run`.

The job is a 2-rank all_reduce of one float, written as a notebook cell writes it (a
function of `__main__`, so cloudpickle sends it by value, as it does a cell's). Medians:

1. cold: `launch.run(fn, 2)`: start processes, rendezvous, run, stop;
2. bare: `torch.multiprocessing.spawn` + `init_process_group` doing the same, the
   minimum any launcher pays (alternated with 1, round by round);
3. warm: `Pool.run(fn)` on ranks that are already up: what a widget waits for.

Targets: cold <= 1.3x bare; warm <= 5 ms.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks import bar
from syncedu.comm import launch
from syncedu.comm.launch import free_port

CELL = '''
def trivial(comm):
    t = torch.ones(1)
    comm.all_reduce(t)
    return t.item()
'''


def cell_function():
    """`trivial` as if defined in a notebook cell (its module is `__main__`)."""
    namespace = {"__name__": "__main__", "torch": torch}
    exec(compile(CELL, "<cell>", "exec"), namespace)
    return namespace["trivial"]


def _bare_rank(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(world_size: int = 2, repeat: int = 5, warm_repeat: int = 200,
            progress=None) -> dict:
    """Median seconds of each variant; `progress` is called once per cold round."""
    fn, cold, bare = cell_function(), [], []
    for _ in range(repeat):
        cold.append(_timed(lambda: launch.run(fn, world_size, output="quiet")))
        bare.append(_timed(lambda: mp.spawn(_bare_rank, args=(world_size, free_port()),
                                            nprocs=world_size, join=True)))
        if progress:
            progress()
    with launch.Pool(world_size, output="quiet") as pool:
        pool.run(fn)  # the first run pays one-time imports in the ranks
        warm = [_timed(lambda: pool.run(fn)) for _ in range(warm_repeat)]
    return {"cold": statistics.median(cold) if cold else float("nan"),
            "bare": statistics.median(bare) if bare else float("nan"),
            "warm": statistics.median(warm), "repeat": repeat, "warm_repeat": warm_repeat,
            "world_size": world_size}


def report(m: dict) -> str:
    ratio = m["cold"] / m["bare"]
    return "\n".join([
        f"launch benchmark, world_size={m['world_size']}, medians of {m['repeat']} cold "
        f"rounds and {m['warm_repeat']} warm runs",
        f"  cold launch.run       {m['cold'] * 1e3:9.1f} ms",
        f"  bare mp.spawn + init  {m['bare'] * 1e3:9.1f} ms",
        f"  warm Pool.run         {m['warm'] * 1e3:9.2f} ms",
        f"  cold / bare = {ratio:.2f} (target <= 1.30: {'met' if ratio <= 1.3 else 'MISSED'})",
        f"  warm <= 5 ms: {'met' if m['warm'] <= 0.005 else 'MISSED'}",
    ])


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="cold rounds (0: warm only)")
    parser.add_argument("--warm-repeat", type=int, default=200)


def main(args) -> int:
    with bar(args.repeat, "launch rounds") as progress:
        m = measure(args.world_size, args.repeat, args.warm_repeat, progress=progress.update)
    print(report(m))
    return 0
