"""The alpha-beta(-gamma) cost model at work, for the lessons: the formulas themselves have one
home, `syncedu/comm/alphabeta.py`, which the simulator's tests and the emulator read too, and
which this module hands on unchanged (`allreduce_time`, `collective_time`, `terms`: time =
a alpha + b beta + c gamma, Thakur, Rabenseifner & Gropp, IJHPCA 2005; `busbw`); here: what
the lessons build on them (the winner per size, the parameter server's round, `calibrate`)."""

from __future__ import annotations

import statistics

import torch

from syncedu.collectives import ALGORITHMS
from syncedu.comm import alphabeta

# The formulas, handed on as they are: `cost.allreduce_time` is `alphabeta.allreduce_time`.
from syncedu.comm.alphabeta import allreduce_time, busbw, collective_time, terms  # noqa: F401
from syncedu.comm.network import Network

# The collectives a lesson times and checks against the simulator (the barrier sends no data).
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def ps_time(nbytes: float, workers: int, network: Network, servers: int = 1) -> float:
    """Seconds of one synchronous parameter-server round: push gradients, pull parameters.

    Each of W workers sends S/K bytes to each of K servers and gets as much back; the
    busier port sets the pace: 2 * max(W (alpha + S/K beta), K alpha + S beta).
    """
    alphabeta.check(nbytes, workers)
    if servers < 1:
        raise ValueError(f"servers={servers!r} must be >= 1")
    a, beta = network.latency, 1 / network.bandwidth
    server = workers * (a + nbytes / servers * beta)
    worker = servers * a + nbytes * beta
    return 2 * max(server, worker)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth S / t in bytes per second (nccl-tests)."""
    return nbytes / seconds


def best_algorithm(nbytes: float, world_size: int, network: Network,
                   algorithms=tuple(ALGORITHMS)) -> str:
    """The fastest of `algorithms` for this size, world size and network."""
    return min(algorithms, key=lambda al: allreduce_time(al, nbytes, world_size, network))


def fit_network(sizes, seconds, name: str = "calibrated") -> Network:
    """A `Network` fitted to one-way point-to-point times t(n) = alpha + n beta, robustly.

    Steps: 1. the median of the trials at each size; 2. beta from the larger half of the
    sizes: a least-squares slope with an intercept, so a constant overhead does not leak
    into the bandwidth; 3. alpha from the smaller half: the median of t - n beta, >= 0.
    """
    trials: dict[float, list[float]] = {}
    for n, t in zip(sizes, seconds):
        trials.setdefault(float(n), []).append(float(t))
    if len(trials) < 2:
        raise ValueError("need measurements at two or more sizes to fit alpha and beta")
    pts = sorted((n, statistics.median(ts)) for n, ts in trials.items())  # Step 1
    half = len(pts) // 2
    big = pts[half:] if len(pts) - half >= 2 else pts
    beta = max(statistics.linear_regression(*zip(*big)).slope, 1e-18)  # Step 2
    alpha = statistics.median(t - n * beta for n, t in pts[: max(1, half)])  # Step 3
    return Network(latency=max(alpha, 0.0), bandwidth=1 / beta, name=name)


def pingpong(comm, sizes, repeats: int = 5, warmup: int = 1) -> dict[int, list[float]]:
    """Worker: {nbytes: [one-way seconds, ...]} of ping-pongs between ranks 0 and 1 (half
    a round trip, `repeats` after `warmup`); the other ranks only join the barriers."""
    out: dict[int, list[float]] = {}
    first, then = (comm.send, comm.recv) if comm.rank == 0 else (comm.recv, comm.send)
    for n in sizes:
        buf = torch.zeros(max(1, int(n)), dtype=torch.uint8, device=comm.device)
        comm.barrier()
        if comm.rank > 1:
            continue
        for i in range(warmup + repeats):
            t0 = comm.now()  # logical time on simulated ranks
            first(buf, 1 - comm.rank)
            then(buf, 1 - comm.rank)
            if i >= warmup:
                out.setdefault(int(buf.numel()), []).append((comm.now() - t0) / 2)
    return out


def calibrate(run, sizes=(8, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22),
              repeats: int = 7) -> Network:
    """Measure ping-pong on real ranks and fit a `Network` (latency, bandwidth); `run` runs
    a worker on two or more ranks (`pool.run`, or `functools.partial(launch.run, ...)`)."""
    times = run(pingpong, args=(tuple(sizes), repeats))[0]
    return fit_network([n for n, ts in times.items() for _ in ts],
                       [t for ts in times.values() for t in ts])
