"""How closely emulated networks on real processes follow the model.

Two real ranks on loopback, a slow emulated `Network`; per size, after a barrier:
1. ping: rank 0 sends S bytes to rank 1 and gets 4 back (model: two transfers);
2. all_reduce of S bytes (model: a ring's 2(N-1)(latency + S/(N bandwidth))).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks import bar, table
from syncedu.comm import launch
from syncedu.comm.alphabeta import collective_time
from syncedu.comm.network import Network

SIZES_MB = (1, 4, 16)


def _ping(comm, buf: torch.Tensor) -> None:
    if comm.rank == 0:
        comm.send(buf, dst=1)
        comm.recv(buf[:1], src=1)  # wait for the receiver's acknowledgement
    else:
        comm.recv(buf, src=0)
        comm.send(buf[:1], dst=0)


def _timed(comm, op, nbytes: int, repeat: int) -> list[float]:
    """Seconds of `op(comm, buf)` on an `nbytes` buffer, each round after a barrier."""
    buf = torch.zeros(nbytes // 4)
    times = []
    for _ in range(repeat):
        comm.barrier()
        t0 = time.perf_counter()
        op(comm, buf)
        times.append(time.perf_counter() - t0)
    return times


def measure(network: Network, repeat: int = 3, progress=None) -> list[dict]:
    rows = []
    with launch.Pool(2, network=network, output="quiet") as pool:
        for mb in SIZES_MB:
            nbytes = mb * 2**20
            ping, ar = (statistics.median(pool.run(_timed, (op, nbytes, repeat))[0])
                        for op in (_ping, lambda c, b: c.all_reduce(b)))
            # the acknowledgement is 4 bytes the other way: one more latency
            ping_model = network.transfer_time(nbytes) + network.transfer_time(4)
            ar_model = collective_time("all_reduce", nbytes, 2, network)
            rows.append(dict(mb=mb, ping=ping, ping_model=ping_model, ar=ar, ar_model=ar_model))
            if progress:
                progress()
    return rows


def report(network: Network, rows: list[dict]) -> str:
    rows = [dict(r, ping_ratio=r["ping"] / r["ping_model"], ar_ratio=r["ar"] / r["ar_model"])
            for r in rows]
    return (f"emulated network: latency {network.latency * 1e3:g} ms, bandwidth "
            f"{network.bandwidth / 1e6:g} MB/s, 2 real ranks\n" + table(rows, [
                ("MB", "mb", ">4"), ("send s", "ping", ">9.4f"), ("model s", "ping_model", ">9.4f"),
                ("ratio", "ping_ratio", ">6.2f"), ("allreduce s", "ar", ">12.4f"),
                ("model s", "ar_model", ">9.4f"), ("ratio", "ar_ratio", ">6.2f")]))


def add_arguments(parser) -> None:
    parser.add_argument("--latency", type=float, default=0.002, help="seconds")
    parser.add_argument("--bandwidth", type=float, default=50e6, help="bytes per second")
    parser.add_argument("--repeat", type=int, default=3)


def main(args) -> int:
    network = Network(latency=args.latency, bandwidth=args.bandwidth, name="emulated")
    with bar(len(SIZES_MB), "sizes") as progress:
        rows = measure(network, args.repeat, progress=progress.update)
    print(report(network, rows))
    return 0
