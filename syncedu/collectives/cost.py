"""The alpha-beta(-gamma) cost model at work: the formulas of `syncedu/comm/alphabeta.py` as
coefficients of time = a alpha + b beta + c gamma (`terms`; Thakur, Rabenseifner & Gropp,
IJHPCA 2005), the winner per size, and `calibrate`."""

from __future__ import annotations

import math
import statistics

import torch

from syncedu.collectives import ALGORITHMS, SEGMENT_BYTES, ring_segments
from syncedu.comm import alphabeta
from syncedu.comm.network import Network
from syncedu.comm.runs import check_choice

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def _check(nbytes, world_size, algorithm: str = "ring") -> None:
    alphabeta.check(nbytes, world_size)
    check_choice("algorithm", algorithm, list(ALGORITHMS))


def _check_network(network, world_size: int) -> None:
    """A `Network` for `world_size` ranks: a preset's name or a cluster of another size (timed
    silently as its own size before) is refused, as `sim.run` refuses it."""
    if not isinstance(network, Network):
        hint = repr(network) if isinstance(network, str) else "'ethernet_10g'"
        raise ValueError(f"network must be a syncedu.Network, e.g. Network.preset({hint}); "
                         f"got {network!r}")
    if network.is_cluster:  # (a flat network's slowdown list is the runs' business)
        network.check_world_size(world_size)


def _segments(algorithm, nbytes, n, itemsize, segment_bytes) -> int:
    """G, the segments per chunk: the pipelined ring's (`ring_segments`); 1 for the rest."""
    if algorithm != "ring_pipelined":
        return 1
    return ring_segments(int(nbytes // itemsize), n, itemsize, segment_bytes)


def terms(algorithm: str, nbytes: float, world_size: int, *, itemsize: int = 4,
          segment_bytes: int | None = SEGMENT_BYTES) -> tuple[float, float, float]:
    """(a, b, c) with time = a*alpha + b*beta + c*gamma, flat network (alphabeta.py's table)."""
    _check(nbytes, world_size, algorithm)
    n, s = world_size, float(nbytes)
    if n == 1:
        return 0.0, 0.0, 0.0
    if algorithm == "naive":
        return 2 * (n - 1), 2 * (n - 1) * s, (n - 1) * s
    if algorithm in ("ring", "ring_pipelined", "hierarchical"):  # one node: a ring
        g = _segments(algorithm, nbytes, n, itemsize, segment_bytes)
        return 2 * (n - 1) * g, 2 * (n - 1) * s / n, (n - 1) / n * s
    if algorithm == "tree":
        k = math.ceil(math.log2(n))
        return 2 * k, 2 * k * s, k * s
    p = 1 << (n.bit_length() - 1)
    fold = 2 if n != p else 0
    if algorithm == "recursive_doubling":
        k = math.log2(p)
        return k + fold, k * s + fold * s, k * s + fold / 2 * s
    return (2 * math.log2(p) + fold, 2 * (p - 1) / p * s + fold * s,
            (p - 1) / p * s + fold / 2 * s)


def allreduce_time(algorithm: str, nbytes: float, world_size: int, network: Network, *,
                   gamma: float = 0.0, itemsize: int = 4,
                   segment_bytes: int | None = SEGMENT_BYTES) -> float:
    """Predicted seconds of an allreduce of `nbytes` per rank on `network` (flat or cluster);
    `gamma`: seconds per byte reduced (0: arithmetic is free, as in the simulator)."""
    _check(nbytes, world_size, algorithm)
    _check_network(network, world_size)
    g = _segments(algorithm, nbytes, world_size, itemsize, segment_bytes)
    seconds = alphabeta.allreduce_time(algorithm, nbytes, world_size, network, segments=g)
    if gamma:
        seconds += terms(algorithm, nbytes, world_size, itemsize=itemsize)[2] * gamma
    return seconds


def collective_time(op: str, nbytes: float, world_size: int, network: Network, *,
                    itemsize: int = 4) -> float:
    """Seconds of a built-in collective as `Comm` charges and the simulator times it
    (`alphabeta.collective_time`; `nbytes`: the whole tensor of `itemsize`-byte elements)."""
    check_choice("op", op, COLLECTIVES)
    _check_network(network, world_size)
    return alphabeta.collective_time(op, nbytes, world_size, network, itemsize=itemsize)


def ps_time(nbytes: float, workers: int, network: Network, servers: int = 1) -> float:
    """Seconds of one synchronous parameter-server round: push gradients, pull parameters.

    Each of W workers sends S/K bytes to each of K servers and gets as much back; the
    busier port sets the pace: 2 * max(W (alpha + S/K beta), K alpha + S beta).
    """
    _check(nbytes, workers)
    if servers < 1:
        raise ValueError(f"servers={servers!r} must be >= 1")
    a, beta = network.latency, 1 / network.bandwidth
    server = workers * (a + nbytes / servers * beta)
    worker = servers * a + nbytes * beta
    return 2 * max(server, worker)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth S / t in bytes per second (nccl-tests)."""
    return nbytes / seconds


busbw = alphabeta.busbw  # (op, nbytes, seconds, N): algbw times the op's factor (nccl-tests)


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
